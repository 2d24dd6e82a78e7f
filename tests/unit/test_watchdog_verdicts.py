"""The watchdog's verdicts (engine.frontend.watchdog.Watchdog) on heartbeats as the engine process sends them
(wire.Heartbeat), on a clock of the test's: silence is a hang unless the process computes meanwhile (then up
to stall_s), a loop pass that lasts without CPU is a stuck loop, a long pass that computes (a 30 s prefill on
the CPU) or a sleeping idle engine is neither. The checking task itself, on a real loop: one on_hang call."""

from __future__ import annotations

import asyncio

from engine import wire
from engine.frontend.watchdog import Watchdog, WatchdogPolicy

POLICY = WatchdogPolicy(silence_s=5.0, stall_s=30.0, check_s=1.0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.cpu = 50.0  # the engine process's CPU seconds as the system counts them

    def __call__(self) -> float:
        return self.t


def watchdog(clock: Clock) -> Watchdog:
    return Watchdog(POLICY, lambda why: None, clock=clock, cpu=lambda: clock.cpu)


def beat(w: Watchdog, clock: Clock, passes: int, busy_for: float) -> None:
    w.beat(wire.Heartbeat(clock.t, passes, busy_for, clock.cpu))


def test_silence_of_a_stopped_process_is_a_hang_after_silence_s():
    clock = Clock()
    w = watchdog(clock)
    beat(w, clock, 1, 0.0)
    clock.t += 4.9
    assert w.verdict(clock.t) is None
    clock.t += 0.2
    assert "no heartbeat for 5.1 s" in w.verdict(clock.t)


def test_a_process_stopped_after_computing_past_its_last_beat_is_a_hang_after_silence_s():
    # CI (2 xdist workers): the engine computed ~0.4 CPU s after its last beat, then SIGSTOP; judged against the
    # CPU since that beat, the stop was taken for work until 0.02 x silence passed 0.4 s (detected after 18 s)
    clock = Clock()
    w = watchdog(clock)
    beat(w, clock, 1, 0.5)
    clock.t += 1.0
    clock.cpu += 0.4  # the step went on after the beat, then the process stopped
    assert w.verdict(clock.t) is None
    for _ in range(3):
        clock.t += 1.0
        assert w.verdict(clock.t) is None
    clock.t += 1.5
    assert "no heartbeat for 5.5 s" in w.verdict(clock.t)


def test_silence_while_the_process_computes_waits_until_stall_s():
    clock = Clock()
    w = watchdog(clock)
    beat(w, clock, 1, 0.5)
    for _ in range(29):  # the heartbeat thread gets no turn, the CPU works on
        clock.t += 1.0
        clock.cpu += 1.0
        assert w.verdict(clock.t) is None
    clock.t += 1.0
    clock.cpu += 1.0
    assert "no heartbeat for 30.0 s" in w.verdict(clock.t)


def test_a_long_step_that_computes_is_not_a_hang():
    clock = Clock()
    w = watchdog(clock)
    beat(w, clock, 7, 0.0)
    for s in range(1, 61):  # one 60 s pass (prefill on the CPU), heartbeats coming, the CPU busy
        clock.t += 1.0
        clock.cpu += 0.9
        beat(w, clock, 8, float(s))
        assert w.verdict(clock.t) is None


def test_a_pass_without_cpu_is_a_stuck_loop_after_stall_s():
    clock = Clock()
    w = watchdog(clock)
    beat(w, clock, 3, 0.1)
    for s in range(1, 30):  # heartbeats come (their thread runs), the loop waits on a lock: no CPU
        clock.t += 1.0
        clock.cpu += 0.0005
        beat(w, clock, 3, 0.1 + s)
        assert w.verdict(clock.t) is None, s
    clock.t += 1.0
    beat(w, clock, 3, 30.1)
    assert "made no progress for 30.0 s" in w.verdict(clock.t)


def test_an_idle_or_slow_stepping_engine_without_cpu_is_not_stuck():
    clock = Clock()
    w = watchdog(clock)
    for s in range(100):  # idle, or a new pass each beat (a stand-in core sleeping in its steps)
        clock.t += 1.0
        beat(w, clock, s if s % 2 else 0, 0.0 if s % 2 == 0 else 0.3)
        assert w.verdict(clock.t) is None


def test_the_checking_task_calls_on_hang_once_and_ends():
    calls = []

    async def run():
        w = Watchdog(WatchdogPolicy(silence_s=0.2, stall_s=30.0, check_s=0.05), calls.append)
        w.start()
        task = w._task
        await asyncio.wait_for(task, 30)
        w.stop()  # after the verdict: nothing left to stop

    asyncio.run(run())
    assert len(calls) == 1 and calls[0].startswith("no heartbeat for ")
