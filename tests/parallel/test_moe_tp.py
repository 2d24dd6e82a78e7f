"""Mixture of experts under tensor parallelism on the CPU (rank 0 here, the others in worker processes): each rank
holds a slice of every expert (and of the shared expert), the routed and shared partial sums go through one
all-reduce, and TP=2 and TP=3 give TP=1's greedy tokens on the tiny Qwen2-MoE (6 heads over 1 replicated KV head,
expert widths divisible by 6, a shared expert with its gate, a dense layer) and logits within float32 noise; TP=2
through the overlap strategy's split forward, TP=3 through the plain one."""

from __future__ import annotations

import pytest
import torch

from engine.llm import LLM
from engine.parallel.comm.config import CommConfig
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(600)

PROMPTS = ["Hello, my name is", "The capital of France is a city that has seen many"]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
IDS = list(range(40, 63))


@pytest.fixture(scope="module")
def tp1(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen2_moe")), dtype="float32", num_threads=1)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.core.score(IDS)


@pytest.mark.parametrize("size", [2, 3])
def test_moe_tp_same_greedy_tokens_as_tp1(size, tiny_model_dir, tp1):
    ref_tokens, ref_logits = tp1
    # TP=2 runs the overlap strategy's two-micro-batch forward (sequential on the CPU: the MoE block's halves with
    # reduce=False, the all-reduces issued by engine/models/overlap.py), TP=3 the plain forward over host
    overlap = dict(comm_strategy="overlap", max_num_batched_tokens=16,
                   comm_config=CommConfig(overlap_cpu_transport="host", overlap_min_tokens=2))
    opts = overlap if size == 2 else dict(comm_strategy="host")
    llm = LLM(str(tiny_model_dir("qwen2_moe")), dtype="float32", tensor_parallel_size=size, **opts)
    try:
        experts = llm.core.runner.model.layers[0].mlp.experts
        assert experts.w13.shape == (6, 2 * 48 // size, 96) and experts.w2.shape == (6, 96, 48 // size)
        assert len(llm.core.executor.worker_pids) == size - 1
        assert llm.core.executor.comm.overlap == (size == 2)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref_tokens
        logits = llm.core.score(IDS)
        print(f"TP={size}: max |logit diff| vs TP=1 {float((logits - ref_logits).abs().max()):.3g}")
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    finally:
        llm.core.shutdown()
