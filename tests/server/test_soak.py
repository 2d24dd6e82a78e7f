"""A soak: three minutes in CI, ten under ``--soak-seconds 600`` (docs/TESTING.md), of mixed traffic against a
server on the default model, configured as
`kestrel serve` is (engine restarts on): short streamed chats, long prompts, n=2 samples, streams dropped
mid-way, clients that give up waiting, hostile and malformed requests, and the side routes. Nothing may fail
with a 5xx, and at the end the engine is back to idle: no request, KV block, stream or task left, and its
resident memory within 5% of what it was after the warm-up (the KV cache filled once, then the first part of
the same traffic).

Marked slow; nothing deselects it, so CI (installer/run-tests.sh) runs it with everything else, for the default
``--soak-seconds`` (180, tests/conftest.py); before a release, or after a change to the server, the client or the
engine's memory, run the ten minutes: ``pytest tests/server/test_soak.py --soak-seconds 600``."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time

import httpx
import psutil
import pytest

from engine.frontend.client import RestartPolicy
from tests.server.conftest import MODEL, make_server
from tests.server.test_hostile import BAD_INPUTS, CHAT, COMPLETION
from tests.server.test_load import WORDS

pytestmark = [pytest.mark.slow(seconds=190), pytest.mark.timeout(1800)]  # 190 s: its group starts first (docs/TESTING.md)

WORKERS = 8
BAD = [b for b in BAD_INPUTS if b[1].get("prompt") != [1] * 300]  # (that one is bad for the stand-in's context only)
KINDS = {"chat_stream": 30, "long_prompt": 8, "n2": 8, "drop_stream": 18, "give_up": 4, "bad": 20, "side": 12}


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Traffic:
    def __init__(self, url: str):
        self.url = url
        self.counts: collections.Counter = collections.Counter()
        self.statuses: collections.Counter = collections.Counter()
        self.server_errors: list[str] = []

    def note(self, kind: str, status: int, text: str = "") -> None:
        self.counts[kind] += 1
        self.statuses[status] += 1
        if status >= 500:
            self.server_errors.append(f"{kind}: {status} {text[:300]}")

    async def one(self, c: httpx.AsyncClient, rng: random.Random) -> None:
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        if kind == "chat_stream":
            body = {**CHAT, "messages": [{"role": "user", "content": words(rng, rng.randint(3, 30))}],
                    "max_tokens": rng.randint(4, 24), "temperature": rng.random(), "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]
            ok = r.status_code == 200 and len(lines) >= 2 and lines[-1] == "data: [DONE]" \
                and '"finish_reason":"' in lines[-2]
            self.note(kind, r.status_code if ok or r.status_code != 200 else 500, lines[-2] if lines else "")
        elif kind == "long_prompt":
            body = {**COMPLETION, "prompt": words(rng, rng.randint(300, 900)), "max_tokens": 2}
            r = await c.post("/v1/completions", json=body)
            self.note(kind, r.status_code, r.text)
        elif kind == "n2":
            body = {**CHAT, "messages": [{"role": "user", "content": words(rng, 8)}], "n": 2, "max_tokens": 6,
                    "seed": rng.randint(0, 1000)}
            r = await c.post("/v1/chat/completions", json=body)
            self.note(kind, r.status_code, r.text)
            if r.status_code == 200:
                assert len(r.json()["choices"]) == 2
        elif kind == "drop_stream":
            body = {**COMPLETION, "prompt": words(rng, rng.randint(2, 12)), "max_tokens": 500, "stream": True,
                    "ignore_eos": True}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                seen, want = 0, rng.randint(1, 4)
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= want:
                        break
            self.note(kind, r.status_code)
        elif kind == "give_up":  # a client that stops waiting for a whole response
            body = {**COMPLETION, "prompt": words(rng, 6), "max_tokens": 400, "ignore_eos": True}
            try:
                r = await c.post("/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
                self.note(kind, r.status_code, r.text)
            except httpx.ReadTimeout:
                self.note(kind, 499)
        elif kind == "bad":
            pick = rng.randrange(len(BAD) + 4)
            if pick < len(BAD):
                route, extra, _, _ = BAD[pick]
                base = CHAT if route == "/v1/chat/completions" else COMPLETION if route == "/v1/completions" else {}
                r = await c.post(route, json={**base, **extra})
            elif pick == len(BAD):  # 1 MB of text: refused by its length, before tokenizing
                r = await c.post("/v1/chat/completions",
                                 json={**CHAT, "messages": [{"role": "user", "content": "ab " * 350_000}]})
            elif pick == len(BAD) + 1:
                r = await c.post("/v1/completions", content=b'{"prompt": "x", ', headers={"Content-Type": "application/json"})
            elif pick == len(BAD) + 2:
                r = await c.get("/v1/models", headers={"Host": "attacker.example"})
            else:
                r = await c.post("/v1/chat/completions", json={**CHAT, "model": "gpt-5"})
            self.note(kind, r.status_code, r.text)
            assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
        else:
            route = rng.choice(["/tokenize", "/detokenize", "/v1/models", "/health", "/metrics", f"/v1/models/{MODEL}"])
            if route == "/tokenize":
                r = await c.post(route, json={"prompt": words(rng, 20)})
            elif route == "/detokenize":
                r = await c.post(route, json={"tokens": [rng.randrange(49152) for _ in range(20)]})
            else:
                r = await c.get(route)
            self.note(kind, r.status_code, r.text)

    async def run(self, seconds: float, seed: int) -> None:
        deadline = time.monotonic() + seconds

        async def worker(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            async with httpx.AsyncClient(base_url=self.url, timeout=300) as c:
                while time.monotonic() < deadline:
                    await self.one(c, rng)

        await asyncio.gather(*(worker(i) for i in range(WORKERS)))


def idle(srv, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        s = srv.call(srv.client.stats())
        if (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, s.num_kv_blocks) or time.monotonic() > deadline:
            time.sleep(0.5)  # the engine trims its heap when it goes idle
            return srv.call(srv.client.stats())
        time.sleep(0.1)


async def count_tasks() -> int:
    return len(asyncio.all_tasks())


async def fill_kv_cache(url: str, blocks: int, block_size: int) -> None:
    """Distinct long prompts at once, using nearly every KV block: the cache's memory is allocated up front but
    its pages are only resident once written, so the engine's RSS grows as the prefix cache fills (it keeps
    freed blocks for reuse and takes never-used ones first). Touching them all before the baseline leaves the
    soak's measure to what could leak."""
    rng = random.Random(7)
    n_words = 950  # about as many tokens
    count = -(-blocks * block_size * 5 // 4 // n_words)  # a quarter more than fits: every block gets written
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        rs = await asyncio.gather(*(c.post("/v1/completions", json={**COMPLETION, "prompt": words(rng, n_words),
                                                                       "max_tokens": 1}) for _ in range(count)))
    assert all(r.status_code == 200 for r in rs), [r.text[:200] for r in rs if r.status_code != 200]


@pytest.fixture
def soak_seconds(request) -> tuple[float, float]:
    """(whole soak, warm-up) in seconds: ``--soak-seconds`` (180 by default, as CI runs it); the warm-up a fifth of it,
    at most 90 s."""
    soak = float(request.config.getoption("soak_seconds"))
    return soak, min(90.0, soak / 5)


def test_soak_mixed_traffic_returns_to_idle(soak_seconds):
    soak_s, warmup_s = soak_seconds
    # a KV cache of 768 blocks (12k tokens), small enough to be filled (every page resident) before the baseline
    srv = make_server(restart=RestartPolicy(), engine={"num_kv_blocks": 768})
    try:
        engine = psutil.Process(srv.client.engine_pid)
        rss_start = engine.memory_info().rss
        traffic = Traffic(srv.url)
        t0 = time.monotonic()
        asyncio.run(fill_kv_cache(srv.url, srv.client.info.num_kv_blocks, srv.client.info.block_size))
        asyncio.run(traffic.run(max(warmup_s - (time.monotonic() - t0), 10.0), seed=1))
        s = idle(srv)
        assert (s.num_running, s.num_free_blocks) == (0, s.num_kv_blocks)
        rss_base = engine.memory_info().rss
        tasks_base = srv.call(count_tasks())
        asyncio.run(traffic.run(soak_s - (time.monotonic() - t0), seed=2))
        soaked = time.monotonic() - t0
        s = idle(srv)
        rss_end = engine.memory_info().rss
        figures = {
            "seconds": round(soaked), "requests": sum(traffic.counts.values()), "by_kind": dict(traffic.counts),
            "statuses": {str(k): v for k, v in sorted(traffic.statuses.items())},
            "engine_rss_mib": {"start": rss_start >> 20, "after_warmup": rss_base >> 20, "end": rss_end >> 20},
            "kv_blocks_free": f"{s.num_free_blocks}/{s.num_kv_blocks}", "preemptions": s.num_preemptions,
            "engine_restarts": srv.client.restarts, "tasks": [tasks_base, srv.call(count_tasks())],
        }
        print("soak:", json.dumps(figures))
        assert not traffic.server_errors, traffic.server_errors[:5]
        assert soaked >= soak_s
        assert srv.client.restarts == 0 and srv.client.engine_pid == engine.pid
        assert (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, s.num_kv_blocks)
        assert not srv.client._requests.active and not srv.client._calls.waiting
        assert figures["tasks"][1] <= tasks_base
        assert rss_end < rss_base * 1.05, figures["engine_rss_mib"]
    finally:
        srv.stop()
