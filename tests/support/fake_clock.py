"""A fake clock, and the engine process's loop (EngineServer) around a stand-in core whose steps take a fixed
time on that clock: rates and timings tested without sleeps (tests/unit/test_token_rate.py,
tests/app/test_performance.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from engine.wire import EngineStats


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class SteppedCore:
    """A stand-in core whose steps take ``step_s`` on a fake clock; each running request gets one token per
    step, and the first step of a request also computes its prompt (10 tokens)."""

    def __init__(self, clock: Clock, step_s: float):
        self.clock, self.step_s = clock, step_s
        self.blocks = None  # no KV cache: the stats call reads no prefix-cache counts
        self.left: dict[str, int] = {}
        self.fresh: list[str] = []
        self.prompt_tokens_total = self.generation_tokens_total = 0

    def add(self, rid: str, tokens: int) -> None:
        self.left[rid] = tokens
        self.fresh.append(rid)

    def has_unfinished(self) -> bool:
        return bool(self.left)

    def step(self) -> list:
        self.clock.advance(self.step_s)
        self.prompt_tokens_total += 10 * len(self.fresh)
        self.fresh.clear()
        for rid in list(self.left):
            self.generation_tokens_total += 1
            self.left[rid] -= 1
            if not self.left[rid]:
                del self.left[rid]
        return []

    def stats(self, recent: int = 32):
        return EngineStats()  # the core's own type: the engine process copies its fields (msgspec.structs.asdict)


@contextlib.contextmanager
def engine_server_on_fake_clock(step_s: float) -> Iterator:
    """An EngineServer (sockets unused) around a SteppedCore; ``srv.clock`` is the fake Clock."""
    import zmq

    from engine.core.process import EngineServer

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    clock = Clock()
    srv = EngineServer(SteppedCore(clock, step_s), pull, push)
    srv.clock = clock
    try:
        yield srv
    finally:
        pull.close(0)
        push.close(0)
        ctx.term()
