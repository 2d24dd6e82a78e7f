"""D5 of issue 47: a seeded request gives the same text with a cold and a warm prefix cache.

Before the fix, the rows after a prefix-cache hit were computed in a smaller call than the cold prefill's (on the
default model's CPU GGUF kernels: a 17-token prompt with 16 cached is a 1-row GEMV, where cold its last row came from
a 17-row GEMM), so the last prompt position's logits differed in their last bits and the seed's draws picked other
tokens (here: 17- and 33-token prompts, warm behind 16 / 32 cached tokens). A seeded request now takes no
prefix-cache hit (engine/core/scheduler.py ``_may_share``)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

BASE = ("The history of the city of Lyon begins in Roman times, when the town was founded on a hill above two "
        "rivers and grew quickly")
SEEDED = SamplingParams(max_tokens=32, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def default_llm():
    """The default load of the embedded model (GGUF blocks on the CPU kernels), where D5 showed."""
    return LLM()


@pytest.mark.parametrize("length", [17, 33])
def test_seeded_output_same_cold_and_warm(default_llm, length):
    ids = default_llm.tokenizer.encode(f"Story {length}: " + BASE * 2)[:length]
    cold = default_llm.generate([ids], SEEDED)[0]
    warm = default_llm.generate([ids], SEEDED)[0]
    assert cold.num_cached_tokens == warm.num_cached_tokens == 0  # no hit for a seeded request
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    # the prefix is cached all the same: an unseeded request with it hits
    again = default_llm.generate([ids], SamplingParams(max_tokens=1, temperature=1.0))[0]
    assert again.num_cached_tokens >= 16


def test_seeded_output_same_warm_beside_another_request(smollm2_fp32):
    """Cold alone, then warm beside a different request in the same steps: the same tokens (the float32 engine,
    whose kernels compute a row the same whatever the batch; the GGUF kernels' regimes change with the batch's rows,
    for which --deterministic is the mode)."""
    ids = smollm2_fp32.tokenizer.encode("Neighbours: " + BASE)
    cold = smollm2_fp32.generate([ids], SEEDED)[0]
    other = smollm2_fp32.tokenizer.encode("A different prompt that shares nothing, and is shorter.")
    warm = smollm2_fp32.generate([other, ids], [SamplingParams(max_tokens=20, temperature=1.0), SEEDED])[1]
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
