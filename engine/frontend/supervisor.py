"""EngineSupervisor: the engine process seen from the client's side. It starts ``python -m
engine.core.process BOOTSTRAP_JSON`` with the two sockets to it, watches it and takes it down again;
engine.frontend.client.EngineClient speaks the engine.wire protocol over those sockets and owns everything about
requests. No server or Qt imports here, and no torch.

- spawn(): binds a PUSH socket (client -> engine, sends never wait) and a PULL socket (engine -> client) on
  ipc:// endpoints in a fresh private directory (mode 0700: only this user can connect; tcp://127.0.0.1 where
  ipc is not available), then starts the engine in a fresh interpreter with its bootstrap (config, addresses,
  core factory, log level). Its stdin is a pipe from here: the engine exits when that pipe closes, however this
  process dies.
- wait_ready(): the engine's start-up reports (Progress) until its Ready (the ModelInfo) or LoadFailed (raised).
- watching: one thread blocks on the process and reports its exit to the event loop at once (``exited`` and
  the ``on_exit`` callback; no polling); another copies the engine's stderr to ours (at most RELAY_BURST lines
  per RELAY_INTERVAL_S, the rest counted), keeping its last lines for error messages (``last_output``).
- answering: watch_answers() starts a watchdog (engine.frontend.watchdog) over the heartbeats the client's reader
  hands to heartbeat(); a process that stops answering (SIGSTOP, a deadlock) is killed and ``on_hang(why)`` runs.
- stop(): terminate (then kill) the process and wait for it; close(): join the threads, close the sockets
  and remove their directory. At interpreter exit every engine process still running is killed.
- restarts: RestartPolicy says how an engine that died is started again (back-off, at most so many times
  within a window); Restarter counts the restarts made under it and runs the back-off / attempt loop, with
  the client's own ways of replacing the engine and of reporting "restarting" and "dead".
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from engine import wire
from engine.config import EngineConfig
from engine.errors import EngineDeadError
from engine.frontend.watchdog import Watchdog, WatchdogPolicy, process_cpu

__all__ = ["EngineSupervisor", "RestartPolicy", "Restarter", "describe_exit"]

log = logging.getLogger(__name__)

RELAY_BURST = 200  # engine stderr lines copied per interval
RELAY_INTERVAL_S = 10.0


def describe_exit(returncode: int | None) -> str:
    """A process's return code in words: "exit code 1", "killed by signal SIGKILL", "still running"."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class EngineSupervisor:
    """One engine process and the two sockets to it. Create it on the event loop that will use the sockets,
    then call spawn(); ``on_exit(returncode)`` runs on that loop as soon as the process exits, however it
    exits (after ``exited`` has its result)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[int], None] | None = None) -> None:
        self.loop = loop
        self.proc: subprocess.Popen | None = None
        self.ctx: zmq.Context | None = None
        self.input: zmq.Socket | None = None  # plain socket: sends never wait
        self.output: zmq.asyncio.Socket | None = None
        self.ipc_dir: str | None = None
        self.exited: asyncio.Future[int] | None = None  # the return code, once the process has exited
        self.closed = False
        self._on_exit_cb = on_exit
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=30)
        self._threads: list[threading.Thread] = []
        self._watchdog: Watchdog | None = None
        self.hung: str | None = None  # why the watchdog killed the process

    # ------------------------------------------------------------------------------------------------
    # start

    def spawn(self, config: EngineConfig, core_factory: str | None = None, log_level: int | None = None) -> None:
        """Bind the sockets and start the engine process (returns at once; the engine then loads its model
        and reports over ``output``). ``core_factory`` ("module:callable") replaces EngineCore, for tests."""
        self.ctx = zmq.Context(1)
        actx = zmq.asyncio.Context(self.ctx)  # shadows the same context
        self.input = self.ctx.socket(zmq.PUSH)
        self.input.setsockopt(zmq.LINGER, 0)
        self.input.setsockopt(zmq.SNDHWM, 0)
        self.output = actx.socket(zmq.PULL)
        self.output.setsockopt(zmq.LINGER, 0)
        self.output.setsockopt(zmq.RCVHWM, 0)
        if zmq.has("ipc") and os.name == "posix":
            self.ipc_dir = tempfile.mkdtemp(prefix="kestrel-")  # mode 0700: only this user can connect
            in_addr = f"ipc://{self.ipc_dir}/in"
            out_addr = f"ipc://{self.ipc_dir}/out"
            self.input.bind(in_addr)
            self.output.bind(out_addr)
        else:
            in_addr = f"tcp://127.0.0.1:{self.input.bind_to_random_port('tcp://127.0.0.1')}"
            out_addr = f"tcp://127.0.0.1:{self.output.bind_to_random_port('tcp://127.0.0.1')}"
        boot = {
            "config": dataclasses.asdict(config),
            "input": in_addr,
            "output": out_addr,
            "ipc_dir": self.ipc_dir,
            "core_factory": core_factory,
            "log_level": log_level if log_level is not None else logging.getLogger().getEffectiveLevel(),
        }
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root, *sys.path[1:], env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.core.process", json.dumps(boot)],
            stdin=subprocess.PIPE, stdout=None, stderr=subprocess.PIPE, env=env, close_fds=True)
        self.exited = self.loop.create_future()
        for target, name in ((self._watch_process, "engine-watch"), (self._relay_stderr, "engine-stderr")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        _live.add(self)

    # ------------------------------------------------------------------------------------------------
    # state

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The return code once the process has exited (None while it runs or before spawn())."""
        return None if self.proc is None else self.proc.poll()

    def last_output(self, n: int = 30) -> list[str]:
        """The last ``n`` lines the engine wrote to stderr (at most 30 are kept)."""
        return list(self._stderr_tail)[-n:]

    # ------------------------------------------------------------------------------------------------
    # the watching threads

    def _watch_process(self) -> None:
        """Block until the engine process exits, then tell the loop (at once: no polling)."""
        proc, loop = self.proc, self.loop
        code = proc.wait()
        try:
            loop.call_soon_threadsafe(self._on_exit, code)
        except RuntimeError:  # the loop is closed
            pass

    def _relay_stderr(self) -> None:
        """Copy the engine's stderr to ours, keeping its last lines for error messages. At most
        RELAY_BURST lines per RELAY_INTERVAL_S are copied (the rest counted, then reported in one line): an
        engine that floods its log cannot flood ours."""
        stream = self.proc.stderr
        window, passed, dropped = time.monotonic(), 0, 0
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            self._stderr_tail.append(line.rstrip("\n")[:2000])
            now = time.monotonic()
            if now - window >= RELAY_INTERVAL_S:
                window, passed = now, 0
            if passed >= RELAY_BURST:
                dropped += 1
                continue
            passed += 1
            if dropped:
                line = f"[engine: {dropped} lines of output suppressed]\n{line}"
                dropped = 0
            try:
                sys.stderr.write(line)
            except Exception:  # our stderr is closed (e.g. a GUI without a console)
                pass
        if dropped:
            try:
                sys.stderr.write(f"[engine: {dropped} lines of output suppressed]\n")
            except Exception:
                pass
        stream.close()

    def watch_answers(self, policy: WatchdogPolicy | None, on_hang: Callable[[str], None]) -> None:
        """Once the engine is ready: kill it and call ``on_hang(why)`` (on the loop) when it stops answering
        (engine.frontend.watchdog under ``policy``; None: no watchdog)."""
        if policy is not None and self.running:
            self._watchdog = Watchdog(policy, lambda why: self._hang(why, on_hang), cpu=process_cpu(self.pid))
            self._watchdog.start()

    def heartbeat(self, hb: wire.Heartbeat) -> None:
        if self._watchdog is not None:
            self._watchdog.beat(hb)

    def heartbeat_age(self) -> float | None:
        """Seconds since the last heartbeat came (None: no watchdog)."""
        w = self._watchdog
        return None if w is None else max(w.clock() - w.last_beat, 0.0)

    def _hang(self, why: str, on_hang: Callable[[str], None]) -> None:
        self._watchdog = None
        if not self.running:
            return  # it exited meanwhile: the exit is reported as such
        self.hung = why
        self.proc.kill()  # SIGKILL ends a stopped process too
        on_hang(why)

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stop()

    def _on_exit(self, code: int) -> None:
        self._stop_watchdog()
        if self.exited is not None and not self.exited.done():
            self.exited.set_result(code)
        if self._on_exit_cb is not None:
            self._on_exit_cb(code)

    # ------------------------------------------------------------------------------------------------
    # stop

    async def wait_ready(self, on_progress: Callable[[str, str], None] | None) -> wire.ModelInfo:
        """Wait for the engine's Ready (its ModelInfo), passing its Progress reports to ``on_progress``. A load
        failure raises its typed error; a process that exits first raises EngineDeadError with the end of its
        error output."""
        dec = wire.client_decoder()
        while True:
            recv = asyncio.ensure_future(self.output.recv(copy=False))
            try:
                done, _ = await asyncio.wait({recv, self.exited}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                recv.cancel()
                raise
            if recv not in done:
                recv.cancel()
                await asyncio.sleep(0.2)  # let the stderr relay catch the last lines
                tail = "\n".join(self.last_output(12))
                raise EngineDeadError(
                    f"The engine process exited while loading the model ({describe_exit(self.exited.result())})."
                    + (f"\n{tail}" if tail else ""))
            msg = dec.decode(recv.result().buffer)
            if isinstance(msg, wire.Progress):
                if on_progress is not None:
                    on_progress(msg.stage, msg.detail)
            elif isinstance(msg, wire.Ready):
                return msg.info
            elif isinstance(msg, wire.LoadFailed):
                raise wire.error_from_info(msg.error)

    async def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit by itself; True once it has."""
        if self.exited is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def stop(self, kill: bool = True) -> None:
        """Terminate the process (``kill``; SIGKILL if it is still there after 2.5 s), close its stdin (which
        alone makes the engine exit) and wait until it is gone."""
        self._stop_watchdog()
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None and kill:
            proc.terminate()
            for _ in range(50):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        while proc.poll() is None:
            await asyncio.sleep(0.02)

    def close(self, join_timeout: float = 2.0) -> None:
        """Join the watching threads, then release everything (see release())."""
        for t in self._threads:
            t.join(timeout=join_timeout)
        self.release()

    def release(self) -> None:
        """Release sockets and files; kill the process if it still runs (also the atexit path). Safe to call
        twice."""
        if self.closed:
            return
        self.closed = True
        self._stop_watchdog()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None and proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for sock in (self.input, self.output):
            if sock is not None:
                sock.close(linger=0)
        if self.ctx is not None:
            self.ctx.term()
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
        _live.discard(self)


# ------------------------------------------------------------------------------------------------------------
# restarts


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """How EngineClient restarts an engine process that died: after ``delay_s`` (doubled for every restart
    already made within ``window_s``, at most ``max_delay_s``), with the same model and options, at most
    ``max_restarts`` times within ``window_s`` seconds (a failed attempt counts); then it gives up and the
    client stays dead. ``load_timeout_s`` bounds each reload."""

    max_restarts: int = 5
    window_s: float = 600.0
    delay_s: float = 1.0
    max_delay_s: float = 30.0
    load_timeout_s: float | None = 900.0

    def delay(self, recent: int) -> float:
        return min(self.delay_s * (2 ** max(recent, 0)), self.max_delay_s)


class Restarter:
    """The restarts of one client's engine under a RestartPolicy (None: never restart): the attempts made
    within the policy's window, whether one more is allowed, and the loop that makes them."""

    def __init__(self, policy: RestartPolicy | None) -> None:
        self.policy = policy
        self.times: collections.deque[float] = collections.deque()  # when each attempt started (monotonic)

    def recent(self) -> int:
        """Attempts made within the policy's window (older ones are forgotten)."""
        now = time.monotonic()
        while self.times and self.times[0] < now - self.policy.window_s:
            self.times.popleft()
        return len(self.times)

    def allowed(self) -> bool:
        policy = self.policy
        return policy is not None and policy.max_restarts > 0 and self.recent() < policy.max_restarts

    def limit_note(self) -> str:
        """Why no restart follows, for the dead engine's message ("" without a policy)."""
        policy = self.policy
        if policy is None or policy.max_restarts <= 0:
            return ""
        return f". It was restarted {self.recent()} times in {policy.window_s / 60:g} min, the most allowed"

    async def run(self, reason: str, *, dispose: Callable[[], Awaitable[None]],
                  launch: Callable[[], Awaitable[None]], on_restarting: Callable[[str, str], None],
                  on_dead: Callable[[str], None]) -> str | None:
        """Start the engine again after a back-off, until it loads or the policy's limit is reached. Before
        each attempt ``on_restarting(error_message, detail)``; then ``dispose()`` releases the old process and
        ``launch()`` starts a new one (within ``load_timeout_s``; a failure is counted and retried). Returns
        the reason of the last death once an engine runs again, or None after ``on_dead(message)``: the
        limit is reached."""
        policy = self.policy
        while True:
            recent = self.recent()
            if recent >= policy.max_restarts:
                mins = policy.window_s / 60
                message = (f"{reason}. It was restarted {recent} times in {mins:g} min, the most allowed; "
                           "reload the model to continue.")
                log.error("%s", message)
                on_dead(message)
                return None
            delay = policy.delay(recent)
            detail = (f"{reason}. Restarting the engine in {delay:g} s (restart {recent + 1} of at most "
                      f"{policy.max_restarts} in {policy.window_s / 60:g} min).")
            log.warning("%s", detail)
            on_restarting(f"{reason}. It is being restarted; retry shortly.", detail)
            await asyncio.sleep(delay)
            self.times.append(time.monotonic())
            await dispose()
            try:
                await asyncio.wait_for(launch(), policy.load_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - counted; the next attempt (or giving up) follows
                reason = f"The engine could not be restarted ({type(e).__name__}: {e})"
                log.error("%s", reason)
                continue
            return reason


_live: weakref.WeakSet[EngineSupervisor] = weakref.WeakSet()


@atexit.register
def _kill_engines_at_exit() -> None:
    for sup in list(_live):
        try:
            sup.release()
        except Exception:  # at exit, nothing more to do
            pass
