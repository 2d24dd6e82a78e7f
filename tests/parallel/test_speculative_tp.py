"""Speculative decoding under tensor parallelism on the CPU (issue 49: "TP unchanged"): rank 0 in this process
proposes (n-gram prompt lookup) and verifies, the worker processes run the same k+1-token verify steps' forward
passes; greedy tokens equal to plain decoding at TP=1, in a batch of verifying and plainly decoding requests.

- the embedded SmolLM2-135M (9 heads, 3 KV heads: TP=3 is its smallest split) in float32, started with
  ``speculative_config`` as `kestrel serve --speculative-config` starts it, against the session's TP=1 engine;
- a tiny random Llama at TP=2 (4 heads), against its own TP=1 engine: the size the issue names.

One TP engine per process at a time (they use torch.distributed's default group): each test builds and shuts its
own."""

from __future__ import annotations

import json

import pytest

from engine.llm import LLM
from engine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow(seconds=90), pytest.mark.timeout(900)]  # 55-100 s of TP engines on 2 cores

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
CONVERSATIONS = [
    [{"role": "user", "content": "Repeat this list exactly, one item per line: apple, banana, cherry, date, "
                                 "elderberry, fig, grape, honeydew, kiwi, lemon, mango."}],
    [{"role": "user", "content": "Copy this function, but rename total to result:\n\ndef add_all(values):\n"
                                 "    total = 0\n    for v in values:\n        total = total + v\n    return total\n"}],
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
]


def _chat_tokens(llm, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.chat(CONVERSATIONS, params)]


def test_embedded_model_tp3_ngram_equals_tp1_plain(smollm2_fp32):
    params = SamplingParams(temperature=0, max_tokens=32)
    assert smollm2_fp32.core.spec is None  # the reference decodes plainly
    ref = _chat_tokens(smollm2_fp32, params)
    llm = LLM(dtype="float32", quantization="none", tensor_parallel_size=3, comm_strategy="host",
              speculative_config=NGRAM)
    try:
        assert len(llm.core.executor.worker_pids) == 2 and llm.core.runner.tp.size == 3
        spec = llm.core.spec
        assert spec is not None
        got = _chat_tokens(llm, params)
        c = spec.counts
        assert c.accepted > 10 and c.tokens_per_step > 1.5, c  # the workers ran verify passes
        assert got == ref
        assert llm.core.blocks.num_free_blocks == llm.core.blocks.num_blocks
    finally:
        llm.core.shutdown()


def test_tiny_llama_tp2_ngram_equals_tp1_plain(tiny_model_dir):
    path = str(tiny_model_dir("llama"))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(path, dtype="float32", num_threads=1)
    try:
        # random weights rarely repeat a token of their own: the prompts hold a continuation of the model's (a
        # prompt, its greedy tokens, the prompt again), so the lookup has something to propose from the start
        heads = [plain.core.tokenizer.encode(t) for t in ("Hello, my name is", "The capital of France is a city")]
        first = [o.outputs[0].token_ids for o in plain.generate(heads, params)]
        prompts = [h + list(f) + h for h, f in zip(heads, first)] + heads  # verifying and plain requests at once
        ref = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    finally:
        plain.core.shutdown()
    llm = LLM(path, dtype="float32", tensor_parallel_size=2, comm_strategy="host", speculative_config=NGRAM)
    try:
        assert len(llm.core.executor.worker_pids) == 1
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        c = llm.core.spec.counts
        assert c.verify_steps >= 2 and c.accepted > 0, c  # proposals verified on both ranks, some kept
        assert got == ref
    finally:
        llm.core.shutdown()
