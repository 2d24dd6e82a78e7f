"""--deterministic: at temperature 0 (or with a seed) a request gets the same tokens alone or beside any other
requests, on the default model (the embedded SmolLM2-135M-Instruct, CPU), dequantized at load (--quantization none)
and as the default load keeps it (auto: its GGUF blocks, whose kernels quantize the activations per block).

Without it the tokens can depend on the step: the linear kernels round differently at decode sizes (M <= 16,
GEMV) and prefill sizes (GEMM), decode attention splits long contexts by the batch and the thread count, and
prefill attention (SDPA per chunk) depends on where the chunks fall. The mix below hits all of that: prompts
shorter than 16 tokens (GEMV alone, GEMM beside others), prompts cut into several chunks by a small step budget,
prompts that extend others (prefix-cache hits move their chunks), duplicates, decodes beside prefills. (Measured
on the 2-core AVX2 dev machine without --deterministic: bfloat16, 4 of the 16 requests differ from their solo
runs.)
"""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams

pytestmark = pytest.mark.timeout(600)

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
# seeded sampling draws from the request's own generator: as batch-invariant as its logits
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, top_k=50, top_p=0.9, seed=7, ignore_eos=True)


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    base = [rng.randrange(100, 40000) for _ in range(200)]
    other = [rng.randrange(100, 40000) for _ in range(60)]
    return [base[:3], base[:9], base[:15], base[:40], base[:97], base[:150], other, base[:33] + [7, 8, 9]]


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("dtype, quantization", [("auto", "none"), ("bfloat16", "none"), ("auto", "auto")])
def test_concurrent_requests_get_their_solo_tokens(dtype, quantization):
    with LLM(deterministic=True, dtype=dtype, quantization=quantization, max_model_len=1024,
             max_num_batched_tokens=96) as llm:
        assert llm.core.runner.deterministic
        assert llm.core.runner.quantization == ("gguf" if quantization == "auto" else "none")
        prompts = _prompts()
        params = [SEEDED if i in (3, 6) else GREEDY for i in range(len(prompts))]
        solo = [_tokens(llm.generate([p], sp))[0] for p, sp in zip(prompts, params)]
        assert all(len(t) == GREEDY.max_tokens for t in solo)
        # 16 at once: every prompt twice, shuffled; different and identical requests side by side
        order = list(range(len(prompts))) * 2
        random.Random(1).shuffle(order)
        together = _tokens(llm.generate([prompts[i] for i in order], [params[i] for i in order]))
        differ = [(j, i) for j, (i, t) in enumerate(zip(order, together)) if t != solo[i]]
        assert not differ, f"(position, prompt) of the requests whose tokens changed in the batch: {differ}"
        # requests arriving while another decodes: their prefills share its steps
        core = llm.core
        got: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        core.add_request("a", None, params[4], prompt_token_ids=prompts[4])
        for _ in range(5):
            for d in core.step():
                got[d.request_id] += d.token_ids
        core.add_request("b", None, params[1], prompt_token_ids=prompts[1])
        core.add_request("c", None, params[6], prompt_token_ids=prompts[6])
        while core.has_unfinished():
            for d in core.step():
                got[d.request_id] += d.token_ids
        assert got == {"a": solo[4], "b": solo[1], "c": solo[6]}


@pytest.mark.slow
def test_256_concurrent_streams_equal_serial():
    """The issue's case: 256 streams at once on the default model, each equal to its serial run (8 different
    prompts, 32 streams each)."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    with LLM(deterministic=True) as llm:
        rng = random.Random(2)
        prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(4, 120))] for _ in range(8)]
        serial = [_tokens(llm.generate([p], params))[0] for p in prompts]
        order = [i % len(prompts) for i in range(256)]
        together = _tokens(llm.generate([prompts[i] for i in order], params))
        assert sum(t != serial[i] for i, t in zip(order, together)) == 0


def test_deterministic_is_refused_where_it_cannot_hold():
    import torch

    from engine.errors import KestrelError
    from engine.parallel.context import SINGLE
    from engine.runner.load_checks import check_deterministic

    with pytest.raises(KestrelError, match="CPU kernels"):
        check_deterministic(torch.device("cuda", 0), SINGLE)

    class TwoRanks:
        size = 2

    with pytest.raises(KestrelError, match="tensor-parallel-size 1"):
        check_deterministic(torch.device("cpu"), TwoRanks())
