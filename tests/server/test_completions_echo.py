"""/v1/completions' ``echo`` with prompt logprobs (issue 47), through the official openai client on the shared
server: what evaluation harnesses send (``echo=True, logprobs=k, max_tokens=0`` or 1) returns the prompt's text and
each prompt token's logprob in OpenAI's legacy format (None for the first token), equal to the offline engine's
prompt logprobs (held to transformers in tests/engine/test_prompt_logprobs.py) and to its log-softmax over the
prompt (``score``)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.server.conftest import MODEL

PROMPT = "The capital of France is Paris, and the capital of Italy is Rome."


@pytest.fixture(scope="module")
def reference(offline):
    """The prompt's ids and the offline engine's log-softmax at every position."""
    ids = offline.tokenizer.encode(PROMPT)
    return ids, torch.log_softmax(offline.core.score(ids), dim=-1)


def _check_prompt_part(lp, ids, ref, top: int) -> None:
    n = len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, n):
        assert lp.token_logprobs[p] == pytest.approx(ref[p - 1, ids[p]].item(), abs=1e-4), p
        assert len(lp.top_logprobs[p]) >= top  # the prompt's own token is added where not among the best
        best = torch.topk(ref[p - 1], top).values.tolist()
        assert sorted(lp.top_logprobs[p].values(), reverse=True)[:top] == pytest.approx(best, abs=1e-4)
    assert lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))


def test_echo_max_tokens_0_scores_the_prompt(api, reference):
    ids, ref = reference
    r = api.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=3, max_tokens=0, temperature=0)
    c = r.choices[0]
    assert c.text == PROMPT
    assert len(c.logprobs.tokens) == len(ids)
    assert "".join(c.logprobs.tokens) == PROMPT
    _check_prompt_part(c.logprobs, ids, ref, 3)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0


def test_echo_with_a_completion(api, reference, offline):
    ids, ref = reference
    r = api.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=0, max_tokens=5, temperature=0)
    c = r.choices[0]
    from engine import SamplingParams

    want = offline.generate([ids], SamplingParams(max_tokens=5, temperature=0))[0].outputs[0]
    assert c.text == PROMPT + want.text
    assert len(c.logprobs.tokens) == len(ids) + 5
    _check_prompt_part(c.logprobs, ids, ref, 0)
    assert c.logprobs.text_offset[len(ids)] == len(PROMPT)  # the completion's offsets follow the echoed text
    assert all(v is not None for v in c.logprobs.token_logprobs[1:])
    assert r.usage.completion_tokens == 5


def test_echo_streamed_and_token_prompt(api, reference):
    ids, ref = reference
    chunks = list(api.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=1, max_tokens=0,
                                         temperature=0, stream=True))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    first = next(ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].logprobs)
    assert text == PROMPT  # token ids decoded
    assert first.text == PROMPT
    _check_prompt_part(first.logprobs, ids, ref, 1)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_echo_without_logprobs_and_two_prompts(api):
    r = api.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], echo=True, max_tokens=2, temperature=0)
    assert r.choices[0].text.startswith(PROMPT) and r.choices[1].text.startswith("Hello")
    assert r.choices[0].logprobs is None
    assert not math.isnan(r.usage.total_tokens)


def test_max_tokens_0_without_echo_is_refused(api):
    import openai

    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
