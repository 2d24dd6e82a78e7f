"""Bounded, chunked tokenizing (engine.frontend.tokenizer.LocalTokenizer.encode_bounded / count_at_least) with
the embedded model's own tokenizer (SmolLM2, from its GGUF, as the server rebuilds it): the ids of a text that
fits are exactly one whole encode's, the chunked count never exceeds the true count (so no prompt that fits is
refused), a text far over the bound is refused after a few chunks, and a cancelled request (its client gone)
stops tokenizing at the chunk in progress."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from engine.frontend.tokenizer import LocalTokenizer, chunk_ends

WORDS = ["the", "cat", "Über", "naïve", "東京", "🙂", "x" * 40, "don't", "I'm", "3.14159", "2026", "<|im_start|>",
         "<|im_end|>", "def", "f(x):", "return", "{\"a\": [1, 2]}", "##", "--", "...", "😀😀", "ﬁ", "\t", "é"]
SEPARATORS = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n ", "", "   \n"]


def random_text(rng: random.Random, n_chars: int) -> str:
    parts, size = [], 0
    while size < n_chars:
        if rng.random() < 0.01:  # a long run without whitespace: cut hard
            piece = "".join(rng.choice("ab1-_.") for _ in range(rng.randint(100, 3000)))
        else:
            piece = rng.choice(WORDS) + rng.choice(SEPARATORS)
        parts.append(piece)
        size += len(piece)
    return "".join(parts)


@pytest.fixture(scope="module")
def local(smollm2_gguf):
    from engine.loader.gguf_file import GGUFFile
    from engine.tokenizer import Tokenizer

    lt = LocalTokenizer(Tokenizer.from_gguf(GGUFFile(smollm2_gguf)), None)
    lt.CHUNK_CHARS = 2048  # many boundaries per text
    yield lt
    lt.close()


def test_chunk_ends_cut_before_whitespace_after_a_word():
    rng = random.Random(1)
    for _ in range(50):
        text = random_text(rng, rng.randint(1, 20000))
        ends = chunk_ends(text, 1000)
        assert ends[-1] == len(text) and ends == sorted(set(ends))
        start = 0
        for end in ends[:-1]:
            assert 500 < end - start <= 1000
            clean = text[end].isspace() and not text[end - 1].isspace()
            window = text[start + 501:start + 1001]
            # a hard cut only where the chunk's second half has no word end at all
            assert clean or not any(window[i].isspace() and not window[i - 1].isspace()
                                    for i in range(1, len(window)))
            start = end


@pytest.mark.parametrize("special", [False, True])
def test_bounded_ids_equal_one_whole_encode_on_random_texts(local, special):
    rng = random.Random(47 + special)
    backend = local.tok.backend

    async def check():
        for _ in range(12):
            text = random_text(rng, rng.randint(3000, 40000))
            whole = backend.encode(text, add_special_tokens=special).ids
            assert await local.encode_bounded(text, special, len(whole)) == whole
            body = len(backend.encode(text, add_special_tokens=False).ids)
            assert await local.count_at_least(text, body) == 0  # what fits is never refused
            for most in (body // 5, body // 2, body - 200):
                counted = await local.count_at_least(text, most)
                assert counted == 0 or most < counted <= body  # a lower bound past the bound, or no verdict
            too_few = len(whole) // 5
            refused = await local.encode_bounded(text, special, too_few)
            # refused before the end by its count, or (crossing in the last chunk) counted exactly by the caller
            assert (isinstance(refused, int) and too_few < refused <= body) or refused == whole

    asyncio.run(check())


def test_a_text_far_over_the_bound_is_refused_after_a_few_chunks(local):
    text = random_text(random.Random(5), 600_000)  # ~300 chunks of 2048 characters
    calls = []
    original = local._count

    def counting(*args):
        calls.append(args[1:])
        return original(*args)

    local._count = counting
    try:
        refused = asyncio.run(local.encode_bounded(text, False, 1000))
    finally:
        del local._count
    assert isinstance(refused, int) and refused > 1000
    assert len(calls) < 10, f"{len(calls)} chunks tokenized to refuse a text at 1000 tokens"


def test_a_cancelled_request_stops_at_the_chunk_in_progress(local):
    text = random_text(random.Random(6), 200_000)
    started, gate = threading.Event(), threading.Event()
    calls = []
    original = local._count

    def held(*args):
        calls.append(args[1:])
        started.set()
        gate.wait(30)
        return original(*args)

    async def run():
        task = asyncio.ensure_future(local.encode_bounded(text, False, 10**9))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        task.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(4):  # the pool drained: whatever was queued has run
            await asyncio.get_running_loop().run_in_executor(local.pool, int)

    local._count = held
    try:
        asyncio.run(run())
    finally:
        del local._count
    assert len(calls) == 1
