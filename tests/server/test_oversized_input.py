"""Oversized text on every route that tokenizes it (chat, completions, /tokenize, embeddings), just under the size
its bytes alone refuse: the 400 names the model's context length, the prompt is counted in chunks only until
the count passes the bound (the "at least N" it reports is just past the bound, not the text's ~100,000
tokens), and the server's memory after 15 of them is within 50 MB of before.

Reproduction of the report: a chat prompt up to ~660 KB was tokenized whole before its refusal, /tokenize took
~5 MB (+480 MB RSS), the 2-thread tokenizer pool stayed busy with abandoned requests."""

from __future__ import annotations

import gc
import os
import random
import re

import psutil

from tests.server.conftest import MODEL

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "some", "more", "words"]


def oversized_text(n_chars: int = 600_000) -> str:
    rng = random.Random(47)
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(WORDS) + (" " if rng.random() < 0.9 else "\n")
        out.append(w)
        size += len(w)
    return "".join(out)


def at_least(message: str) -> int:
    return int(re.search(r"at least (\d+) tokens", message).group(1))


def requests_for(text: str) -> list[tuple[str, dict]]:
    return [("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}],
                                      "max_tokens": 1}),
            ("/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}),
            ("/tokenize", {"model": MODEL, "prompt": text}),
            ("/v1/embeddings", {"model": MODEL, "input": text})]


def test_oversized_text_is_refused_after_bounded_work_naming_the_context(server, http, tok):
    ctx = server.client.info.max_model_len
    text = oversized_text()
    assert server.client.prompt_lower_bound(text) < ctx  # its bytes alone do not decide: it must be counted
    real = len(tok(text, add_special_tokens=False)["input_ids"])
    for path, body in requests_for(text):
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text[:300])
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded", (path, err)
        assert f"maximum context length is {ctx} tokens" in err["message"] or \
            f"this model's context is {ctx} tokens" in err["message"], (path, err["message"])
        bound = 8 * ctx if path == "/tokenize" else ctx
        n = at_least(err["message"])
        assert bound <= n < bound + 2 * 4096, (path, n)  # counted until just past the bound ...
        assert n * 1.5 < real  # ... not the whole text
    # a text that fits is tokenized as before (exactly transformers' ids)
    fits = text[:20000]
    r = http.post("/tokenize", json={"model": MODEL, "prompt": fits, "add_special_tokens": False})
    assert r.status_code == 200 and r.json()["tokens"] == tok(fits, add_special_tokens=False)["input_ids"]


def test_memory_after_15_oversized_requests_stays_within_50_mb(server, http):
    """The server runs in this process (BackgroundServer): its RSS, from /proc, before and after."""
    text = oversized_text()
    reqs = requests_for(text)
    for path, body in reqs:  # warm: allocator arenas, the tokenizer's caches
        assert http.post(path, json=body).status_code == 400
    gc.collect()
    me = psutil.Process(os.getpid())
    before = me.memory_info().rss
    for i in range(15):
        path, body = reqs[i % len(reqs)]
        assert http.post(path, json=body).status_code == 400
    gc.collect()
    after = me.memory_info().rss
    print(f"server RSS before 15 oversized (600 KB) requests: {before / 2**20:.0f} MiB, after: "
          f"{after / 2**20:.0f} MiB ({(after - before) / 2**20:+.1f} MiB)")
    assert after - before < 50 * 2**20
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                                "max_tokens": 2})
    assert r.status_code == 200
