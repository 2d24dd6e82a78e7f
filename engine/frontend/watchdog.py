"""The client's watchdog over the engine process: the process's heartbeats (wire.Heartbeat, sent by the thread of
engine.core.heartbeat about once a second, also during a step) arrive through the client's reader; a task on
the client's loop checks them every ``check_s`` seconds and calls ``on_hang(reason)`` once when

- no heartbeat came for ``silence_s`` seconds and the process uses no CPU now (``cpu``, the process's CPU seconds
  as the system counts them, compared with the previous check's: what it used just after its last beat, before
  it stopped, does not count): it stopped (SIGSTOP, a frozen machine). A silent process that computes (a native
  call holding the GIL, a machine so loaded that the heartbeat thread gets no turn) is given up to ``stall_s``
  seconds; or
- the loop has been inside one pass (a step, a call) for ``stall_s`` seconds during which the process used
  almost no CPU: stuck (a deadlock). A long step that computes (a 30 s prefill on the CPU) uses CPU all along
  and is not a hang.

The client then kills the process and restarts it as it does for a crash (engine.frontend.client). A check that
runs late (this loop itself was starved, so the beats may be waiting unread) decides nothing that round.
No torch, no Qt here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from engine import wire

__all__ = ["Watchdog", "WatchdogPolicy", "process_cpu"]

log = logging.getLogger(__name__)

STALL_CPU_SHARE = 0.02  # a pass using less CPU than this share of its time makes no progress
CPU_PROGRESS_S = 0.05  # CPU seconds that count as progress (the heartbeat thread's own use is far less)


def process_cpu(pid: int) -> Callable[[], float | None]:
    """The process's CPU seconds so far (user + system, all threads, and its children waited for), or None where
    they cannot be read."""
    try:
        import psutil

        proc = psutil.Process(pid)
    except Exception:  # noqa: BLE001 - no psutil, or the process is gone: silence alone decides
        return lambda: None

    def read() -> float | None:
        try:
            t = proc.cpu_times()
        except Exception:  # noqa: BLE001 - exited meanwhile
            return None
        return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)

    return read


@dataclasses.dataclass(frozen=True)
class WatchdogPolicy:
    """When the client takes its engine process for hung (see the module's docstring)."""

    silence_s: float = 5.0
    stall_s: float = 30.0
    check_s: float = 1.0


class Watchdog:
    """One engine process's heartbeats and the task that judges them. ``beat`` is called by the client's
    reader; ``start`` runs the checks on the running loop until ``stop`` or the one ``on_hang`` call."""

    def __init__(self, policy: WatchdogPolicy, on_hang: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, cpu: Callable[[], float | None] = lambda: None) -> None:
        self.policy = policy
        self.on_hang = on_hang
        self.clock = clock
        self.cpu = cpu
        self.last_beat = clock()  # received (this process's clock); the start counts as one
        self._cpu_sample = (self.last_beat, cpu())  # (when, CPU seconds) at the last beat or check
        self.beats = 0
        self._ref: tuple[int, float, float] | None = None  # (pass, engine time, cpu) progress was last seen at
        self._stalled_for = 0.0
        self._task: asyncio.Task | None = None

    def beat(self, hb: wire.Heartbeat) -> None:
        self.last_beat = self.clock()
        self._cpu_sample = (self.last_beat, self.cpu())
        self.beats += 1
        ref = self._ref
        if (ref is None or hb.busy_for == 0.0 or hb.passes != ref[0]
                or hb.cpu_s - ref[2] >= max(CPU_PROGRESS_S, STALL_CPU_SHARE * (hb.sent - ref[1]))):
            self._ref = (hb.passes, hb.sent, hb.cpu_s)
            self._stalled_for = 0.0
        else:
            self._stalled_for = hb.sent - ref[1]

    def verdict(self, now: float) -> str | None:
        """Why the engine is taken for hung at ``now`` (None: it is not)."""
        silent = now - self.last_beat
        (then, before), cpu = self._cpu_sample, self.cpu()
        self._cpu_sample = (now, cpu)
        if silent >= self.policy.silence_s:
            # computing: CPU used since the previous check (or the last beat), at the stall share of that time
            working = (before is not None and cpu is not None
                       and cpu - before >= max(STALL_CPU_SHARE * (now - then), 0.01))
            if not working or silent >= self.policy.stall_s:
                return f"no heartbeat for {silent:.1f} s"
        if self._stalled_for >= self.policy.stall_s:
            return f"its loop made no progress for {self._stalled_for:.1f} s, using no CPU"
        return None

    def start(self) -> None:
        self.last_beat = self.clock()
        self._cpu_sample = (self.last_beat, self.cpu())
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-watchdog")

    def stop(self) -> None:
        """Cancel the checks (from the loop's thread; at interpreter exit, with the loop closed, a no-op)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            try:
                task.cancel()
            except RuntimeError:  # the loop is closed
                pass

    async def _run(self) -> None:
        check = self.policy.check_s
        last = self.clock()
        while True:
            await asyncio.sleep(check)
            now = self.clock()
            late = now - last > 2 * check + 0.5
            last = now
            if late:  # this loop was starved: the beats may be waiting unread
                continue
            reason = self.verdict(now)
            if reason is not None:
                log.error("the engine process stopped answering: %s", reason)
                self._task = None
                self.on_hang(reason)
                return
