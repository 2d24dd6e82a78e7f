"""Prompt logprobs (SamplingParams.prompt_logprobs, what /v1/completions' echo returns): each prompt token's logprob
under the logits of the position before it, and the best tokens there, held to transformers' log-softmax over the
same prompt: live on a tiny random model (in prefill chunks, with a prefix already cached, beside another request),
and on the embedded SmolLM2 against the golden files (transformers' logits, docs/TESTING.md)."""

from __future__ import annotations

import math

import pytest
import torch

from engine import LLM, SamplingParams
from tests.support import make_golden

TOP = 4


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, hf_reference):
    """A tiny llama whose steps take at most 16 tokens (a 45-token prompt runs in three chunks), and transformers."""
    path = tiny_model_dir("llama")
    return LLM(str(path), dtype="float32", kv_cache_memory_gib=0.05, max_num_batched_tokens=16), hf_reference(path)


def _reference(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def _check(plps, ids: list[int], ref: torch.Tensor, top: int, atol: float) -> None:
    assert len(plps) == len(ids)
    assert plps[0].token_id == ids[0] and math.isnan(plps[0].logprob) and plps[0].top == []
    for p in range(1, len(ids)):
        lp = plps[p]
        assert lp.token_id == ids[p]
        assert lp.logprob == pytest.approx(ref[p - 1, ids[p]].item(), abs=atol), p
        values, best = torch.topk(ref[p - 1], top)
        assert len(lp.top) == top
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=atol), p
        # ids at ties may swap; each named id has the value transformers gives it
        assert [ref[p - 1, t].item() for t, _ in lp.top] == pytest.approx(values.tolist(), abs=atol), p


def test_prompt_logprobs_match_transformers_in_chunks(tiny):
    llm, hf = tiny
    ids = torch.randint(3, 49152, (45,), generator=torch.Generator().manual_seed(3)).tolist()
    out = llm.generate([ids], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=TOP))[0]
    _check(out.outputs[0].prompt_logprobs, ids, _reference(hf, ids), TOP, 1e-4)
    assert out.outputs[0].token_ids  # it also generated


def test_prompt_logprobs_with_a_cached_prefix_and_a_neighbour(tiny):
    """A prefix cached by an earlier request is computed again (its positions' logits are needed), and another
    request in the same steps changes nothing."""
    llm, hf = tiny
    ids = torch.randint(3, 49152, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    llm.generate([ids], SamplingParams(max_tokens=1, temperature=0))  # caches the prefix
    other = torch.randint(3, 49152, (23,), generator=torch.Generator().manual_seed(5)).tolist()
    outs = llm.generate([other, ids], [SamplingParams(max_tokens=6, temperature=0),
                                       SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)])
    assert outs[1].num_cached_tokens == 0
    assert outs[0].outputs[0].prompt_logprobs is None  # only asked for by the second
    _check(outs[1].outputs[0].prompt_logprobs, ids, _reference(hf, ids), 0, 1e-4)


def test_smollm2_prompt_logprobs_match_golden(smollm2_fp32, smollm2_gguf):
    """The embedded model against transformers' logits kept in tests/engine/golden/ (log-softmax of hidden @ head)."""
    meta, hidden = make_golden.load("smollm2")
    head = make_golden.gguf_lm_head(smollm2_gguf)
    hidden = torch.from_numpy(hidden)
    prompts = [p["ids"] for p in meta["prompts"]]
    outs = smollm2_fp32.generate(prompts, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2))
    at = 0
    for ids, out in zip(prompts, outs):
        ref = torch.log_softmax(hidden[at:at + len(ids)] @ head.T, dim=-1)
        at += len(ids)
        _check(out.outputs[0].prompt_logprobs, ids, ref, 2, 3e-3)


def test_prompt_logprobs_bounds():
    with pytest.raises(Exception, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
