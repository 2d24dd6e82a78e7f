"""Load on the default model: 128 concurrent streaming requests whose greedy outputs equal serial runs', 256
concurrent streams with none failing, and 1,000 clients dropped mid-stream with nothing left behind.

The 128 requests use 32 distinct prompts, 4 times each (so the batch also shares prefixes through the prefix
cache); each output is compared with a serial, solo run of its prompt through the offline API. Serial decoding
is the slow part on a 2-core CPU (~1.5 s per request), hence 32 distinct prompts rather than 128."""

from __future__ import annotations

import asyncio
import random
import time

from engine.sampling_params import SamplingParams
from tests.server.conftest import MODEL, engine_stats

N = 128
DISTINCT = 32
MAX_TOKENS = 16
WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "seven", "quick", "foxes", "jumped", "over", "lazy", "dogs", "near", "blue", "rivers", "under", "tall", "green", "trees", "and", "old", "stone", "bridges"]


def prompts(n: int = N, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))) for _ in range(n)]


def test_128_concurrent_streams_equal_serial_runs(server, offline):
    from openai import AsyncOpenAI

    distinct = prompts(DISTINCT)
    ps = [distinct[i % DISTINCT] for i in range(N)]

    async def one(api, p: str):
        text, reason, usage = "", None, None
        stream = await api.completions.create(model=MODEL, prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                              stream=True, stream_options={"include_usage": True})
        async for ch in stream:
            for c in ch.choices:
                text += c.text
                reason = c.finish_reason or reason
            usage = ch.usage or usage
        return text, reason, usage

    async def main():
        api = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=1800)
        try:
            return await asyncio.gather(*(one(api, p) for p in ps))
        finally:
            await api.close()

    results = asyncio.run(main())
    solo = [offline.generate([p], SamplingParams(max_tokens=MAX_TOKENS, temperature=0))[0].outputs[0]
            for p in distinct]
    serial = [solo[i % DISTINCT] for i in range(N)]
    assert len(results) == N and all(r[1] in ("stop", "length") for r in results)
    mismatches = [i for i, (r, s) in enumerate(zip(results, serial)) if r[0] != s.text]
    assert not mismatches, f"{len(mismatches)} of {N} differ, e.g. {results[mismatches[0]][0]!r} != " \
                           f"{serial[mismatches[0]].text!r}"
    assert [r[1] for r in results] == [s.finish_reason for s in serial]
    assert [r[2].completion_tokens for r in results] == [len(s.token_ids) for s in serial]
    s = engine_stats(server)
    assert s.num_running == 0 and s.num_free_blocks == s.num_kv_blocks


def test_256_concurrent_streams(server):
    """256 streaming requests at once through the official client: every one streams to its end, none
    fails, and the engine is idle afterwards."""
    from openai import AsyncOpenAI

    n = 256
    ps = prompts(n, seed=1)

    async def one(api, i: int, p: str):
        chunks, reason = 0, None
        stream = await api.completions.create(model=MODEL, prompt=" ".join(p.split()[:6]), max_tokens=6,
                                              temperature=0.7, seed=i, stream=True)
        async for ch in stream:
            for c in ch.choices:
                chunks += bool(c.text)
                reason = c.finish_reason or reason
        return chunks, reason

    async def main():
        api = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=1800)
        try:
            t0 = time.monotonic()
            out = await asyncio.gather(*(one(api, i, p) for i, p in enumerate(ps)), return_exceptions=True)
            return out, time.monotonic() - t0
        finally:
            await api.close()

    results, took = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of {n} failed, e.g. {errors[0]!r}"
    assert all(reason in ("stop", "length") and chunks >= 1 for chunks, reason in results)
    s = engine_stats(server)
    assert (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, s.num_kv_blocks)
    print(f"{n} concurrent streams: 0 errors in {took:.1f} s")


def test_1000_dropped_clients_leave_nothing_behind(server):
    """1,000 clients, 100 at a time, each dropping its connection at the first token of a long stream: no
    request, KV block, stream, call or task is left, and the engine's memory is back where it was."""
    import httpx
    import psutil

    n, at_once = 1000, 100
    engine = psutil.Process(server.client.engine_pid)
    body = {"model": MODEL, "max_tokens": 1000, "temperature": 0.8, "ignore_eos": True, "stream": True}

    async def count_tasks() -> int:
        return len(asyncio.all_tasks())

    async def drop(c, sem, i: int) -> int:
        async with sem:
            req = {**body, "prompt": [1000 + i]}  # one token: the prefill costs little, the stream is long
            async with c.stream("POST", "/v1/completions", json=req) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        return 1  # leaving the block closes the connection mid-stream
            return 0

    async def wave(count: int, offset: int) -> list:
        sem = asyncio.Semaphore(at_once)
        limits = httpx.Limits(max_connections=at_once, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as c:
            return await asyncio.gather(*(drop(c, sem, offset + i) for i in range(count)), return_exceptions=True)

    def settled():
        deadline = time.monotonic() + 30
        while True:
            s = engine_stats(server)
            if (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, s.num_kv_blocks) or \
                    time.monotonic() > deadline:
                time.sleep(0.3)  # the engine trims its heap when it goes idle
                return engine_stats(server)
            time.sleep(0.1)

    asyncio.run(wave(at_once, 0))  # warm up: the shapes of a full batch
    settled()
    tasks_before = server.call(count_tasks())
    rss_before = engine.memory_info().rss
    t0 = time.monotonic()
    results = asyncio.run(wave(n, at_once))
    took = time.monotonic() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of {n} failed, e.g. {errors[0]!r}"
    assert sum(results) == n
    s = settled()
    assert (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, s.num_kv_blocks)
    assert not server.client._requests.active and not server.client._calls.waiting
    assert server.call(count_tasks()) <= tasks_before
    rss_after = engine.memory_info().rss
    print(f"{n} clients dropped mid-stream in {took:.1f} s: engine RSS {rss_before / 2**20:.0f} -> "
          f"{rss_after / 2**20:.0f} MiB, {s.num_free_blocks}/{s.num_kv_blocks} KV blocks free")
    assert rss_after < rss_before * 1.05
