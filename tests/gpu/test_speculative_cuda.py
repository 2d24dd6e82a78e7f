"""Speculative decoding on the GPU (engine/spec, engine/runner/speculative.py): a verify pass's k+1 rows are decode
rows, so a step of verify and plain rows replays the decode CUDA graph of its bucket. Greedy output equals plain
decoding in float32 with graphs and with --enforce-eager, for n-gram lookup and for a draft model (the target as
its own draft: every proposal accepted, which also exercises the draft's KV rollback on the GPU), and a sampled
seeded run repeats itself."""

from __future__ import annotations

import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine.llm import LLM
from engine.sampling_params import SamplingParams

# Prompts whose continuation repeats them (a tiny random model loops): lookup finds matches, verify rows run.
PROMPTS = [[1, 17, 18, 19, 17, 18, 19, 17, 18], [1, 450, 4995, 338, 263, 7, 8, 9], list(range(100, 160)),
           [1, 5, 6, 5, 6, 5, 6, 5, 6, 5, 6], [1, 2000, 2001, 2002]]
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                    "prompt_lookup_min": 1})
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module", params=["graphs", "eager"])
def llm(request, tiny_model_dir):
    with LLM(str(tiny_model_dir("llama")), dtype="float32", device="cuda", enable_prefix_caching=False,
             max_num_seqs=8, kv_cache_memory_gib=0.25, enforce_eager=request.param == "eager") as model:
        assert (model.core.runner.graphs is None) == (request.param == "eager")
        yield model


def _tokens(llm, params):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


def _speculating(llm, config, params):
    llm.core.set_speculative(config)
    try:
        return _tokens(llm, params), llm.core.spec.counts
    finally:
        llm.core.set_speculative(None)


def test_ngram_greedy_equals_plain_decoding(llm):
    plain = _tokens(llm, GREEDY)
    got, counts = _speculating(llm, NGRAM, GREEDY)
    assert got == plain
    assert counts.proposed > 0 and counts.accepted > 0  # verify rows really ran


def test_the_target_as_its_own_draft_accepts_everything(llm, tiny_model_dir):
    plain = _tokens(llm, GREEDY)
    spec = json.dumps({"model": str(tiny_model_dir("llama")), "num_speculative_tokens": 3})
    got, counts = _speculating(llm, spec, GREEDY)
    assert got == plain
    assert counts.proposed > 0 and counts.accepted == counts.proposed and counts.tokens_per_step > 3


def test_seeded_sampling_repeats(llm):
    p = SamplingParams(temperature=0.8, top_k=20, seed=11, max_tokens=24, ignore_eos=True)
    first, _ = _speculating(llm, NGRAM, p)
    again, _ = _speculating(llm, NGRAM, p)
    assert first == again
