"""Continuous batching, prefix caching and preemption change nothing in greedy outputs, and every
block comes back."""

import random

import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=12, min_tokens=12, temperature=0)


def mixed_prompts(llm, n=32, seed=0):
    rng = random.Random(seed)
    words = "the cat sat on a mat while seven quick foxes jumped over lazy dogs near blue rivers".split()
    return [llm.tokenizer.encode(" ".join(rng.choice(words) for _ in range(rng.randint(2, 60)))) for _ in range(n)]


@pytest.fixture(scope="module")
def solo_outputs(smollm2_fp32):
    prompts = mixed_prompts(smollm2_fp32)
    return prompts, [smollm2_fp32.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]


def assert_idle(llm):
    core = llm.core
    assert not core.has_unfinished()
    assert core.blocks.num_free_blocks == core.blocks.num_blocks
    assert all(b.ref_count == 0 for b in core.blocks.blocks)


def test_continuous_batching_equals_solo(smollm2_fp32, solo_outputs):
    prompts, solo = solo_outputs
    llm = smollm2_fp32
    llm.config.max_num_batched_tokens = llm.core.scheduler.max_num_batched_tokens = 256  # force chunked prefill
    try:
        outs = llm.generate(prompts, GREEDY)
    finally:
        llm.core.scheduler.max_num_batched_tokens = 2048
    assert [o.outputs[0].token_ids for o in outs] == solo
    assert_idle(llm)


def test_prefix_cache_hits_give_same_outputs(smollm2_fp32):
    llm = smollm2_fp32
    system = llm.tokenizer.encode("You are a careful assistant who answers in one short sentence. " * 4)
    prompts = [system + llm.tokenizer.encode(q) for q in (" Why is the sky blue?", " Name a prime number.")]
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    hits_before = llm.core.blocks.prefix_hits
    again = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == first
    assert all(o.num_cached_tokens >= 48 for o in again)
    assert llm.core.blocks.prefix_hits > hits_before
    assert_idle(llm)


def test_preemption_gives_same_outputs(solo_outputs):
    prompts, solo = solo_outputs
    # 40 blocks of 16 tokens: far less than 32 requests need at once, more than any one needs
    small = LLM(dtype="float32", num_kv_blocks=40, enable_prefix_caching=False, quantization="none")  # smollm2_fp32's
    outs = small.generate(prompts, GREEDY)
    assert small.core.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == solo
    assert_idle(small)


def test_abort_frees_every_block(smollm2_fp32):
    llm = smollm2_fp32
    core = llm.core
    for i, p in enumerate(mixed_prompts(llm, 8, seed=1)):
        core.add_request(f"abort-{i}", None, SamplingParams(max_tokens=50), prompt_token_ids=p)
    core.step()
    core.step()
    assert core.blocks.num_free_blocks < core.blocks.num_blocks
    deltas = core.abort([f"abort-{i}" for i in range(8)])
    assert len(deltas) == 8 and all(d.finished and d.finish_reason == "abort" for d in deltas)
    assert_idle(llm)
