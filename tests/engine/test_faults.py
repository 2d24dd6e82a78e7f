"""Faults under the EngineClient, on the default model: the engine process killed mid-stream (the stream fails
at once, the engine is restarted with the same model and options, the next request works and gives the
same greedy text), a tensor-parallel worker killed (CPU, TP=3: the engine dies with a plain reason and comes
back), a KV cache too small for the load (preemption by recompute, no error, every block back), and corrupt or
truncated checkpoints (a typed CheckpointError naming the file, across the process boundary)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import psutil
import pytest

from engine.frontend.client import EngineClient, RestartPolicy
from engine.config import EngineConfig
from engine.errors import CheckpointError, EngineDeadError, EngineRestartingError
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(600)

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=4000, temperature=0, ignore_eos=True)


def run(coro, timeout: float = 300):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def text_of(client: EngineClient, prompt: str, params: SamplingParams = GREEDY) -> str:
    return "".join([d.text async for d in client.generate(prompt, params)])


async def wait_ready(client: EngineClient, timeout: float = 120) -> float:
    t0 = time.monotonic()
    while not (client.state == "ready" and client.is_alive):
        assert client.state != "dead", client.dead_reason
        assert time.monotonic() - t0 < timeout, "the engine did not come back"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_engine_killed_mid_stream_comes_back():
    async def main():
        states: list[str] = []
        client = await EngineClient.start(EngineConfig(dtype="float32"), restart=RestartPolicy(delay_s=0.2))
        client.add_state_listener(lambda state, detail: states.append(state))
        try:
            before = await text_of(client, "The capital of France is")
            first_pid = client.engine_pid
            stream = await client.add_request("Once upon a time", LONG)
            await stream.next_batch()
            os.kill(first_pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(EngineRestartingError, match="SIGKILL"):
                while await asyncio.wait_for(stream.next_batch(), 5):
                    pass
            failed = time.monotonic() - t0
            assert failed < 2
            with pytest.raises(EngineRestartingError):  # while it restarts: 503-type errors, at once
                await client.add_request("hi", GREEDY)
            took = await wait_ready(client)
            assert client.engine_pid != first_pid and not alive(first_pid) and client.restarts == 1
            assert states == ["restarting", "ready"]
            assert await text_of(client, "The capital of France is") == before
            s = await client.stats()
            assert (s.num_running, s.num_free_blocks) == (0, s.num_kv_blocks)
            print(f"engine killed mid-stream: the stream failed in {failed:.2f} s; back in {took:.1f} s")
        finally:
            await client.shutdown()
        assert not alive(client.engine_pid)

    run(main())


def test_tp_worker_killed_the_engine_restarts():
    """TP=3 on the CPU (SmolLM2: 9 heads, 3 KV heads): a worker killed mid-stream takes the engine down with
    a reason naming it; the engine comes back with three fresh ranks and the same greedy text."""

    async def main():
        config = EngineConfig(dtype="float32", tensor_parallel_size=3, comm_strategy="host")
        client = await EngineClient.start(config, restart=RestartPolicy(delay_s=0.2))
        try:
            before = await text_of(client, "The capital of France is")
            workers = [p for p in psutil.Process(client.engine_pid).children(recursive=True)
                       if "engine.executor.worker" in " ".join(p.cmdline())]
            assert len(workers) == 2
            stream = await client.add_request("Once upon a time", LONG)
            await stream.next_batch()
            os.kill(workers[0].pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(EngineDeadError) as err:
                while await asyncio.wait_for(stream.next_batch(), 30):
                    pass
            assert "worker rank" in str(err.value) and "SIGKILL" in str(err.value), err.value
            assert time.monotonic() - t0 < 10
            took = await wait_ready(client, 300)
            assert client.restarts == 1
            assert await text_of(client, "The capital of France is") == before
            for w in workers:
                deadline = time.monotonic() + 10
                while alive(w.pid) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert not alive(w.pid)
            print(f"TP worker killed: noticed in {time.monotonic() - t0 - took:.2f} s, engine back in {took:.1f} s")
        finally:
            await client.shutdown()

    run(main())


def test_full_kv_cache_preempts_without_error():
    """Six KV blocks (96 tokens) and five requests that need two each: the scheduler preempts (recompute)
    instead of failing; every request finishes with the text it gives alone; all blocks return."""
    prompts = [f"Write a list of {w}:" for w in ("fruits", "rivers", "colours", "birds", "trees")]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)

    async def main():
        # float weights (the GGUF blocks' kernels round activations per block: a recomputed prefill may then differ)
        client = await EngineClient.start(EngineConfig(dtype="float32", num_kv_blocks=6, quantization="none"))
        try:
            solo = [await text_of(client, p, params) for p in prompts]

            async def one(p: str):
                out = [d async for d in client.generate(p, params)]
                return "".join(d.text for d in out), out[-1].finish_reason, out[-1].num_output_tokens

            together = await asyncio.gather(*(one(p) for p in prompts))
            s = await client.stats()
            return solo, together, s
        finally:
            await client.shutdown()

    solo, together, s = run(main())
    assert [t[1:] for t in together] == [("length", 20)] * len(prompts)
    assert [t[0] for t in together] == solo
    assert s.num_preemptions > 0, "the cache was big enough: no preemption tested"
    assert (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, s.num_kv_blocks)
    print(f"full KV cache: {s.num_preemptions} preemptions, no error")


@pytest.fixture
def broken_checkpoints(tmp_path, smollm2_gguf, tiny_model_dir):
    data = smollm2_gguf.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: 4 << 20])  # header intact, tensor data cut off: an interrupted download
    corrupt = tmp_path / "corrupt.gguf"
    b = bytearray(data[: 8 << 20])
    b[100:400] = bytes((i * 37 + 11) % 256 for i in range(300))  # garbage in the metadata
    corrupt.write_bytes(bytes(b))
    st_dir = tmp_path / "truncated-safetensors"
    shutil.copytree(tiny_model_dir("llama"), st_dir)
    st = st_dir / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    bad_dir = tmp_path / "corrupt-safetensors"
    shutil.copytree(tiny_model_dir("llama"), bad_dir)
    bad = bytearray((bad_dir / "model.safetensors").read_bytes())
    bad[8:60] = b"#" * 52  # the JSON header
    (bad_dir / "model.safetensors").write_bytes(bytes(bad))
    return [(truncated, truncated, "truncated"), (corrupt, corrupt, "not a valid GGUF"),
            (st_dir, st, "truncated or corrupt"), (bad_dir, bad_dir / "model.safetensors", "not a valid safetensors")]


def test_corrupt_and_truncated_checkpoints_are_typed_errors_naming_the_file(broken_checkpoints):
    async def main():
        for model, file, words in broken_checkpoints:
            with pytest.raises(CheckpointError) as err:
                await EngineClient.start(EngineConfig(model=str(model), dtype="float32"), startup_timeout=120)
            msg = str(err.value)
            assert err.value.path == str(file) and str(file) in msg and words in msg, msg
            assert "Traceback" not in msg and err.value.status_code == 400

    run(main())
