"""128 concurrent streaming requests all finish, and their greedy outputs equal serial runs'.

The 128 requests use 32 distinct prompts, 4 times each (so the batch also shares prefixes through the prefix
cache); each output is compared with a serial, solo run of its prompt through the offline API. Serial decoding
is the slow part on a 2-core CPU (~1.5 s per request), hence 32 distinct prompts rather than 128."""

from __future__ import annotations

import asyncio
import random

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
