"""What EngineClient does when its engine process is lost: it exited (a crash, a kill, the OOM killer), it stopped
answering (the supervisor's watchdog killed it: engine.frontend.watchdog) or the connection to it broke. Every
pending request and call then fails at once (EngineDeadError; EngineRestartingError while a restart is under way),
and the engine is started again with the same model and options when the client's RestartPolicy allows it
(supervisor.Restarter: back-off, a limit per time window).

CrashRecovery is a base class of engine.frontend.client.EngineClient and works on the client's state, listed
below; the request API, the reader and shutdown are the client's. No torch, no Qt here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from engine import wire
from engine.errors import EngineDeadError, EngineRestartingError
from engine.frontend.pending import CallTable, StreamTable
from engine.frontend.supervisor import EngineSupervisor, Restarter, describe_exit

__all__ = ["CrashRecovery", "cancel_task"]

log = logging.getLogger(__name__)


class CrashRecovery:
    """The engine's loss and its restart, for EngineClient (which sets these attributes and defines
    ``_set_state``, ``_launch`` and ``engine_pid``)."""

    loop: asyncio.AbstractEventLoop | None
    _engine: EngineSupervisor | None
    _requests: StreamTable
    _calls: CallTable
    _dead: EngineDeadError | None
    _closing: bool
    _fatal: wire.ErrorInfo | None
    _reader: asyncio.Task | None
    _token_bytes: list[bytes] | None
    _on_progress: Callable[[str, str], None] | None
    _restarter: Restarter
    _restart_task: asyncio.Task | None
    restarts: int  # restarts that succeeded
    hangs: int  # engine processes killed for not answering

    def _on_exit(self, code: int) -> None:
        """The supervisor's news that the engine process exited (on the loop)."""
        if self._closing or self._dead is not None:
            return  # asked to stop, already dead, or a restart's own attempt (which handles its failure)
        reason = f"The engine process exited unexpectedly ({describe_exit(code)})"
        if self._fatal is not None:
            reason += f": {self._fatal.type}: {self._fatal.message}"
        else:
            tail = [ln for ln in self._engine.last_output() if ln.strip()]
            if tail:
                reason += f"; its last output: {tail[-1]}"
        self._lost(reason)

    def _on_hang(self, why: str) -> None:
        """The supervisor killed the engine process: it stopped answering (its watchdog). As after a crash."""
        if not self._closing and self._dead is None:
            self.hangs += 1
            self._lost(f"The engine process stopped answering ({why}) and was stopped")

    def _lost(self, reason: str) -> None:
        """The engine is gone (``reason``, in words): every request and call fails; restart it if allowed."""
        if self._restarter.allowed():
            self._mark_dead(EngineRestartingError(reason + ". It is being restarted; retry shortly."))
            self._restart_task = self.loop.create_task(self._restart(reason), name="engine-restart")
            return
        self._mark_dead(EngineDeadError(reason + self._restarter.limit_note() + ". Reload the model to continue."))
        self._set_state("dead", str(self._dead))

    def _mark_dead(self, err: EngineDeadError) -> None:
        if self._dead is None:
            self._dead = err
            log.error("%s", err)
        self._fail_all(err)

    def _fail_all(self, err: BaseException) -> None:
        self._requests.fail_all(err)
        self._calls.fail_all(err)

    async def _restart(self, reason: str) -> None:
        """Start the engine again (same model and options) after a back-off, until it loads or the policy's
        limit is reached (supervisor.Restarter); requests meanwhile get EngineRestartingError."""
        reason = await self._restarter.run(reason, dispose=self._dispose_engine,
                                           launch=lambda: self._launch(self._on_progress),
                                           on_restarting=self._on_restarting, on_dead=self._on_restarts_spent)
        if reason is None:
            return
        self._dead = None
        self._fatal = None
        self._token_bytes = None
        self.restarts += 1
        log.warning("the engine was restarted (pid %s)", self.engine_pid)
        self._set_state("ready", f"The engine was restarted after: {reason}.")

    def _on_restarting(self, message: str, detail: str) -> None:
        self._dead = EngineRestartingError(message)
        self._set_state("restarting", detail)

    def _on_restarts_spent(self, message: str) -> None:
        err = EngineDeadError(message)
        self._dead = err
        self._fail_all(err)
        self._set_state("dead", message)

    async def _dispose_engine(self) -> None:
        """Stop reading from the current engine process and release it and its sockets."""
        reader, self._reader = self._reader, None
        await cancel_task(reader)
        engine = self._engine
        if engine is not None:
            await engine.stop(kill=True)
            engine.close(join_timeout=1.0)
        self._fail_all(self._dead or EngineDeadError("The engine process was replaced."))


async def cancel_task(task: asyncio.Task | None) -> None:
    """Cancel a task (if any; a no-op when done) and wait until it has ended, whatever it raised."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
