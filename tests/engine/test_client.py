"""EngineClient and the engine process: the protocol, typed errors across the process boundary, a dead
engine noticed at once, and nothing left behind. Most tests drive a stand-in core (tests/server/fake_engine.py,
no model) so they take seconds; one runs the real default model."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from engine.frontend.client import EngineClient
from engine.config import EngineConfig
from engine.errors import (
    CheckpointError,
    EngineDeadError,
    EngineShuttingDownError,
    InvalidRequestError,
    KestrelError,
    ModelNotFoundError,
    PromptTooLongError,
)
from engine.sampling_params import SamplingParams

FAKE = "tests.server.fake_engine:FakeCore"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def start_fake(**kw) -> EngineClient:
    return await EngineClient.start(EngineConfig(**kw), core_factory=FAKE)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is as good as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def test_generate_streams_deltas_of_every_sample():
    async def main():
        client = await start_fake()
        try:
            got = {0: "", 1: ""}
            finished = {}
            times = []
            async for d in client.generate("abc", SamplingParams(max_tokens=5, n=2)):
                got[d.index] += d.text
                times.append(d.time)
                if d.finished:
                    finished[d.index] = (d.finish_reason, d.num_output_tokens, d.num_prompt_tokens, d.metrics)
            assert got == {0: "defgh", 1: "defgh"}
            assert times == sorted(times)
            for reason, n_out, n_prompt, metrics in finished.values():
                assert (reason, n_out, n_prompt) == ("length", 5, 3)
                assert metrics is not None and metrics.e2e >= 0
            rec = client.recent_requests()[-1]
            assert rec.num_output_tokens == 5 and rec.ttft is not None and rec.ttft >= 0
            assert len(rec.itl) == 4 and rec.tpot is not None
        finally:
            await client.shutdown()

    run(main())


def test_accepted_and_typed_refusals():
    async def main():
        client = await start_fake(max_model_len=64)
        try:
            stream = await client.add_request("hello", SamplingParams(max_tokens=2))
            assert await stream.accepted() == 5
            assert "".join([d.text async for d in stream]) == "pq"
            stream = await client.add_request("x" * 100, SamplingParams())
            with pytest.raises(PromptTooLongError, match="64 tokens, but the prompt has 100"):
                await stream.accepted()
            with pytest.raises(InvalidRequestError, match="prompt"):
                await client.add_request(None, SamplingParams())
            # the engine stays usable after refusals
            assert [d.text async for d in client.generate([104, 105], SamplingParams(max_tokens=1))] == ["j"]
        finally:
            await client.shutdown()

    run(main())


def test_calls_stats_tokenize():
    async def main():
        client = await start_fake()
        try:
            assert client.info.max_model_len == 128 and client.info.has_chat_template
            assert client.info.engine_pid == client.engine_pid
            assert await client.tokenize("hi") == [104, 105]
            assert await client.detokenize([104, 105]) == "hi"
            ids = await client.tokenize(messages=[{"role": "user", "content": "x"}])
            assert await client.detokenize(ids) == "<user>x<assistant>"
            assert await client.apply_chat_template([{"role": "user", "content": "x"}]) == "<user>x<assistant>"
            assert (await client.token_bytes())[104] == b"h"
            with pytest.raises(InvalidRequestError, match="out of the vocabulary"):
                await client.detokenize([100000])
            async for _ in client.generate("ab", SamplingParams(max_tokens=3)):
                pass
            s = await client.stats()
            assert (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, s.num_kv_blocks)
            assert s.prompt_tokens_total == 2 and s.generation_tokens_total == 3
            assert await client.ping() >= 0
        finally:
            await client.shutdown()

    run(main())


def test_leaving_the_loop_aborts_the_request(monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")

    async def main():
        client = await start_fake()
        try:
            async with contextlib.aclosing(client.generate("a", SamplingParams(max_tokens=1000))) as gen:
                async for d in gen:
                    break
            s = await client.stats()  # the abort is ahead of this call on the same pipe
            assert s.num_running == 0 and s.num_free_blocks == s.num_kv_blocks
            # without aclosing, the generator is closed (and the request aborted) by asyncio soon after
            async for d in client.generate("a", SamplingParams(max_tokens=1000)):
                break
            await asyncio.sleep(0.1)
            s = await client.stats()
            assert s.num_running == 0 and s.num_free_blocks == s.num_kv_blocks
            stream = await client.add_request("a", SamplingParams(max_tokens=1000, n=3))
            await stream.next_batch()
            stream.abort()
            assert await stream.next_batch() == []
            s = await client.stats()
            assert s.num_running == 0 and s.num_free_blocks == s.num_kv_blocks
        finally:
            await client.shutdown()

    run(main())


def test_every_request_gives_one_record_stopped_or_failed_too(monkeypatch):
    """Issue 14 item 5: a stream aborted here, one the engine refused and one cut by the engine's death each
    give their listeners exactly one RequestRecord ("abort" / "error", with the timings they have)."""
    monkeypatch.setenv("KESTREL_FAKE", "slow")

    async def main():
        client = await start_fake(max_model_len=64)
        records = []
        client.add_listener(records.append)
        try:
            done = await client.add_request("a", SamplingParams(max_tokens=2))
            assert [d.finish_reason async for d in done][-1] == "length"
            stream = await client.add_request("a", SamplingParams(max_tokens=1000, n=2))
            while sum(len(d.token_ids) for d in await stream.next_batch()) < 1:
                pass
            stream.abort()
            stream.abort()  # twice, and the engine's own final "abort" deltas: no more records
            s = await client.stats()
            assert s.num_running == 0
            refused = await client.add_request("x" * 100, SamplingParams())
            with pytest.raises(PromptTooLongError):
                await refused.accepted()
            dying = await client.add_request("b", SamplingParams(max_tokens=100000))
            await dying.next_batch()
            os.kill(client.engine_pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(dying.next_batch(), 5)
            await asyncio.sleep(0.1)
        finally:
            await client.shutdown()
        by_id = {}
        for rec in records:
            assert rec.request_id not in by_id, f"two records for {rec.request_id}"
            by_id[rec.request_id] = rec
        assert len(records) == 5 and client.recent_requests()[-5:] == records
        assert by_id[done.request_id].finish_reason == "length"
        aborted = [by_id[cid] for cid in stream.child_ids]
        assert [r.finish_reason for r in aborted] == ["abort", "abort"]
        assert [r.index for r in aborted] == [0, 1]
        for r in aborted:
            assert r.finished is not None and r.e2e > 0 and r.num_prompt_tokens == 1
        assert any(r.first_token is not None and r.ttft >= 0 for r in aborted)
        rec = by_id[refused.request_id]
        assert rec.finish_reason == "error" and rec.first_token is None and rec.ttft is None and rec.tpot is None
        rec = by_id[dying.request_id]
        assert rec.finish_reason == "error" and rec.first_token is not None and rec.num_output_tokens >= 1

    run(main())


def test_many_concurrent_requests():
    async def main():
        client = await start_fake()
        try:
            async def one(i: int) -> str:
                return "".join([d.text async for d in client.generate(chr(97 + i % 26), SamplingParams(max_tokens=8))])

            outs = await asyncio.gather(*(one(i) for i in range(64)))
            for i, out in enumerate(outs):
                start = (i % 26 + 1) % 26
                assert out == "".join(chr(97 + (start + k) % 26) for k in range(8))
        finally:
            await client.shutdown()

    run(main())


def test_load_failure_is_typed(monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "load_error")
    with pytest.raises(CheckpointError, match="broken.gguf: truncated") as e:
        run(start_fake())
    assert e.value.path == "/models/broken.gguf"
    assert e.value.status_code == 400


def test_real_loader_failure_is_typed(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such file"):
        run(EngineClient.start(EngineConfig(model=str(tmp_path / "missing.gguf"))))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 5)
    with pytest.raises(CheckpointError, match="bad.gguf"):
        run(EngineClient.start(EngineConfig(model=str(bad))))


def test_unknown_core_factory_fails_fast():
    with pytest.raises(KestrelError, match="ModuleNotFoundError"):
        run(EngineClient.start(EngineConfig(), core_factory="no_such_module:Core"))


def test_crash_in_step_fails_pending_and_new_requests(monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "crash_step")

    async def main():
        client = await start_fake()
        try:
            stream = await client.add_request("a", SamplingParams(max_tokens=4))
            with pytest.raises(EngineDeadError, match="simulated kernel failure"):
                await asyncio.wait_for(stream.next_batch(), 5)
            assert not client.is_alive and "simulated kernel failure" in client.dead_reason
            with pytest.raises(EngineDeadError):
                await client.add_request("a", SamplingParams())
            with pytest.raises(EngineDeadError):
                await client.stats()
            with pytest.raises(EngineDeadError):
                await client.health()
        finally:
            await client.shutdown()

    run(main())


def test_killed_engine_is_noticed_within_two_seconds(monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")

    async def main():
        client = await start_fake()
        try:
            stream = await client.add_request("a", SamplingParams(max_tokens=100000))
            await stream.next_batch()
            call = asyncio.ensure_future(client.stats())
            os.kill(client.engine_pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(EngineDeadError, match="SIGKILL"):
                await asyncio.wait_for(stream.next_batch(), 2)
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(call, 2)
            assert time.monotonic() - t0 < 2
            with pytest.raises(EngineDeadError, match="SIGKILL"):
                await client.health()
        finally:
            await client.shutdown()

    run(main())


def test_shutdown_leaves_nothing_behind(monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")

    async def main():
        client = await start_fake()
        pid, ipc_dir = client.engine_pid, client._ipc_dir
        assert os.path.isdir(ipc_dir)
        stream = await client.add_request("a", SamplingParams(max_tokens=100000))
        await client.shutdown()
        with pytest.raises(EngineShuttingDownError):
            await stream.next_batch()
        with pytest.raises(EngineShuttingDownError):
            await client.add_request("a", SamplingParams())
        await client.shutdown()  # twice is fine
        return pid, ipc_dir

    before = engine_children()  # other tests' servers may be running in this process
    shm_before = shm_files()
    pid, ipc_dir = run(main())
    assert not pid_alive(pid)
    assert not os.path.exists(ipc_dir)
    assert shm_files() <= shm_before
    assert engine_children() <= before


def engine_children() -> set[int]:
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "engine.core.process" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def shm_files() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_engine_exits_when_its_parent_dies(tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from engine.frontend.client import EngineClient
        from engine.config import EngineConfig
        async def main():
            c = await EngineClient.start(EngineConfig(), core_factory={FAKE!r})
            print(c.engine_pid, c._ipc_dir, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid_s, ipc_dir = parent.stdout.readline().split()
        pid = int(pid_s)
        assert pid_alive(pid)
        parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
        parent.wait()
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(pid)
        assert not os.path.exists(ipc_dir)
    finally:
        parent.kill()


def test_real_model_through_the_client():
    """The default model behind the client gives the offline API's greedy tokens."""

    async def main():
        client = await EngineClient.start(EngineConfig(dtype="float32"))
        try:
            info = client.info
            assert info.max_model_len > 0 and info.vocab_size == 49152 and info.has_chat_template
            assert info.dtype == "float32" and info.num_kv_blocks > 0
            params = SamplingParams(max_tokens=8, temperature=0, logprobs=2)
            deltas = [d async for d in client.generate("The capital of France is", params)]
            ids = [t for d in deltas for t in d.token_ids]
            assert len(ids) == 8 and deltas[-1].finish_reason == "length"
            assert all(len(lp.top) == 2 and lp.top[0][0] == t for d in deltas for lp, t in zip(d.logprobs, d.token_ids))
            text = "".join(d.text for d in deltas)
            assert text == await client.detokenize(ids)
            stats = await client.stats()
            assert stats.num_free_blocks == stats.num_kv_blocks and stats.generation_tokens_total >= 8
            return ids
        finally:
            await client.shutdown()

    ids = run(main())
    from engine import LLM

    llm = LLM(dtype="float32")
    ref = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    assert ref[0].outputs[0].token_ids == ids


def test_health_right_after_a_death_says_what_the_watcher_will_say():
    """The process has exited but the watcher's news has not reached the loop yet (here: the loop is held
    while the process is reaped): health() already gives the final answer, restarting or dead with the
    restart limit, never a third message of its own (a race that failed CI once)."""
    from engine.frontend.client import RestartPolicy
    from engine.errors import EngineRestartingError

    async def main():
        client = await EngineClient.start(EngineConfig(), core_factory=FAKE,
                                          restart=RestartPolicy(max_restarts=1, delay_s=0.2))
        try:
            for expected in (EngineRestartingError, EngineDeadError):
                if expected is EngineDeadError:
                    while client.restarts < 1 or client.state != "ready":
                        await asyncio.sleep(0.05)
                proc = client._engine.proc
                proc.kill()
                proc.wait()  # blocks the loop: the watcher's call_soon_threadsafe waits behind us
                with pytest.raises(expected) as err:
                    await client.health()
                assert type(err.value) is expected and "SIGKILL" in str(err.value)
                if expected is EngineDeadError:
                    assert "the most allowed" in str(err.value) and client.state == "dead"
        finally:
            await client.shutdown()

    run(main())
