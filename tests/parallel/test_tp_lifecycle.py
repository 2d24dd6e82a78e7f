"""Tensor-parallel processes live and die with the engine:

- a worker killed between or during steps surfaces as EngineDeadError with a plain message, quickly,
  for the host strategy and for gloo (never a hang), and the engine stays dead;
- shutdown leaves no process and no /dev/shm segment behind (the segment never has a name after start-up);
- workers exit on their own when rank 0 dies (kill -9), within seconds;
- the step channel (the segment's mailbox) costs little next to a decode step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from engine.errors import EngineDeadError
from engine.llm import LLM
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(600)

P = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _shm_segments() -> set[str]:
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith("kestrel-tp")}
    except FileNotFoundError:
        return set()


def _wait_gone(pids, timeout=10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("strategy", ["host", "nccl"])
def test_killed_worker_is_engine_dead(strategy, tiny_model_dir):
    shm_before = _shm_segments()
    llm = LLM(str(tiny_model_dir("llama")), dtype="float32", tensor_parallel_size=2, comm_strategy=strategy)
    pids = llm.core.executor.worker_pids
    try:
        assert _shm_segments() == shm_before, "the segment must have no name once the group exists"
        assert len(llm.generate(["Hello there"], P)[0].outputs[0].token_ids) == 6
        os.kill(pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError) as err:
            for _ in range(50):
                llm.generate(["Hello again, after the crash"], P)
        elapsed = time.monotonic() - t0
        msg = str(err.value)
        assert elapsed < 10, f"took {elapsed:.1f} s to notice"
        assert "worker rank 1" in msg and "SIGKILL" in msg and "restart" in msg, msg
        with pytest.raises(EngineDeadError):  # and it stays dead, at once
            llm.generate(["still there?"], P)
    finally:
        t1 = time.monotonic()
        llm.core.shutdown()
        assert time.monotonic() - t1 < 10
    assert _wait_gone(pids) == []
    assert _shm_segments() == shm_before


def test_worker_killed_in_the_middle_of_a_step(tiny_model_dir):
    """A long prefill is running when the worker dies: the all-reduce wait gives up (abort flag)."""
    llm = LLM(str(tiny_model_dir("llama")), dtype="float32", tensor_parallel_size=2, comm_strategy="host",
              max_num_batched_tokens=2048)
    pid = llm.core.executor.worker_pids[0]
    try:
        long_prompt = list(range(100, 1900))
        killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError, match="worker rank 1"):
            for _ in range(200):
                llm.generate([long_prompt], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        assert time.monotonic() - t0 < 15
        killer.join()
    finally:
        llm.core.shutdown()
    assert _wait_gone([pid]) == []


def test_clean_shutdown_leaves_nothing(tiny_model_dir):
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    shm_before = _shm_segments()
    llm = LLM(str(tiny_model_dir("mistral")), dtype="float32", tensor_parallel_size=2, comm_strategy="auto")
    pids = llm.core.executor.worker_pids
    assert len(pids) == 1 and all(_alive(p) for p in pids)
    llm.generate(["Hi"], P)
    llm.core.shutdown()
    llm.core.shutdown()  # idempotent
    assert _wait_gone(pids, 5) == []
    after = {p.pid for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert after <= before, f"left behind: {after - before}"
    assert _shm_segments() == shm_before
    with pytest.raises(EngineDeadError):
        llm.generate(["after shutdown"], P)


def test_workers_exit_when_rank0_dies(tiny_model_dir, tmp_path):
    script = tmp_path / "rank0.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from engine.llm import LLM
        llm = LLM({str(tiny_model_dir("llama"))!r}, dtype="float32", tensor_parallel_size=2, comm_strategy="host")
        print(" ".join(map(str, llm.core.executor.worker_pids)), flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = [int(x) for x in line.split()]
        assert pids and all(_alive(p) for p in pids)
        proc.kill()
        proc.wait()
        assert _wait_gone(pids, 10) == [], "workers outlived rank 0"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_step_channel_is_cheap(tiny_model_dir):
    """The mailbox round trip (rank 0 pickles + publishes a message, workers wake, copy and answer through a
    barrier) is small next to a decode step of even the tiny model."""
    llm = LLM(str(tiny_model_dir("llama")), dtype="float32", tensor_parallel_size=2, comm_strategy="host")
    try:
        llm.generate(["warm up"], P)
        ping = llm.core.executor.ping(200)["round_trip_us"]
        llm.generate(["Hello world, how are you"], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
        steps = llm.core.stats().recent_steps[-10:]
        step_us = sorted(s.duration for s in steps)[len(steps) // 2] * 1e6
        ex = llm.core.executor
        send_us = ex.send_seconds / ex.steps_sent * 1e6
        print(f"\nstep channel: round trip {ping:.1f} us, rank-0 send {send_us:.1f} us/step, "
              f"{ex.step_bytes / ex.steps_sent:.0f} B/step; tiny-model decode step {step_us:.0f} us")
        assert send_us < 0.25 * step_us
        assert ping < 5000
    finally:
        llm.core.shutdown()
