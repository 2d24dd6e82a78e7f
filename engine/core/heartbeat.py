"""The engine process's heartbeat: a thread that tells the client, about once a second, that the process still
runs and where its loop is (wire.Heartbeat). It has its own PUSH socket to the client's output address (zmq
sockets are not shared between threads) and runs on while the loop is inside a step: the native kernels and
torch's operators release the GIL, so even a 30 s prefill leaves it its turns.

The loop (EngineServer.run) marks each pass in a LoopProgress: when it started (None while it waits for
messages) and how many passes there have been. From that and the process's CPU time, the client's watchdog
(engine.frontend.watchdog) tells a long step (the CPU keeps working) from a stuck one (a deadlock: no CPU); no
heartbeat at all means the whole process stopped (SIGSTOP, a frozen machine) or never gets the GIL back.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import zmq

from engine import wire

__all__ = ["HEARTBEAT_INTERVAL_S", "Heartbeat", "LoopProgress"]

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0


class LoopProgress:
    """Where the engine's loop is; written by the loop (two stores per pass), read by the heartbeat thread."""

    __slots__ = ("busy_since", "passes")

    def __init__(self) -> None:
        self.busy_since: float | None = None  # time.monotonic() the current pass began; None: idle
        self.passes = 0

    def begin(self) -> None:
        self.passes += 1
        self.busy_since = time.monotonic()

    def idle(self) -> None:
        self.busy_since = None


class Heartbeat:
    """The thread sending wire.Heartbeat every ``interval`` seconds (the first at once) until stop()."""

    def __init__(self, ctx: zmq.Context, address: str, progress: LoopProgress,
                 interval: float = HEARTBEAT_INTERVAL_S) -> None:
        self.ctx, self.address, self.progress, self.interval = ctx, address, progress, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join the thread (its socket is closed before the context may be terminated)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def beat(self) -> wire.Heartbeat:
        p = self.progress
        now = time.monotonic()
        since = p.busy_since
        t = os.times()  # the children's too (those waited for: a compiler run by a JIT, for instance)
        cpu = t.user + t.system + t.children_user + t.children_system
        return wire.Heartbeat(now, p.passes, 0.0 if since is None else max(now - since, 0.0), cpu)

    def _run(self) -> None:
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)  # a client that does not read gets no backlog of old beats
        sock.connect(self.address)
        enc = wire.encoder()
        try:
            while True:
                try:
                    sock.send(enc.encode(self.beat()), zmq.NOBLOCK)
                except zmq.Again:
                    pass
                if self._stop.wait(self.interval):
                    return
        except Exception:  # noqa: BLE001 - the context is going away: the process is ending
            log.debug("heartbeat ended", exc_info=True)
        finally:
            sock.close(linger=0)
