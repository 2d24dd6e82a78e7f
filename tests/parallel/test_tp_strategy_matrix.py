"""Every communication strategy x {bfloat16 weights, int8 weights} x {micro-batch overlap off, on} at TP=2 on the
CPU gives the logits of TP=1 with the same weights (the engine's scoring path: every position of a prompt scored in
chunks, so prefill chunks straddle the overlap's cut).

Overlap drives the model's own decoder layers with the row-parallel all-reduces deferred (engine/models/overlap.py):
this is the test that would have caught the old copy of the decoder reading emptied float weights under int8.
On the CPU overlap runs its two micro-batches one after the other over the transport that
CommConfig.overlap_cpu_transport names.
Bounds: exact strategies differ from TP=1 only by the order of the bf16 sums; int8 all-reduce adds its quantization
error (group-wise absmax, per hop). A wrong decoder (weights missing, a residual or an all-reduce dropped) moves
logits by their own scale (std ~0.16, max ~0.95), far outside both."""

from __future__ import annotations

import pytest
import torch

from engine.llm import LLM
from engine.parallel.comm.config import CommConfig

pytestmark = pytest.mark.timeout(1200)

STRATEGIES = ("nccl", "host", "int8", "auto")
ARCH = "qwen3"  # q/k norms and tied embeddings: the most of the decoder
BOUND = {"exact": 0.02, "int8": 0.04}  # max |logit difference|; measured 0.006 / 0.013 (logits: max ~0.95)
TEXT = ("The capital of France is a city that has seen many kings, revolutions and painters; its river "
        "runs under thirty-seven bridges")


def _score(llm) -> torch.Tensor:
    ids = llm.core.tokenizer.encode(TEXT)
    return llm.core.score(ids)


def _engine(tiny_model_dir, quant: str, **kw) -> LLM:
    return LLM(str(tiny_model_dir(ARCH)), dtype="bfloat16", quantization=quant, max_num_batched_tokens=16,
               enable_prefix_caching=False, **kw)


def _check(ref: torch.Tensor, got: torch.Tensor, strategy: str, what: str) -> None:
    assert got.shape == ref.shape
    err = (got - ref).abs().max().item()
    bound = BOUND["int8" if strategy in ("int8", "auto") else "exact"]
    assert err <= bound, f"{what}: max |logit - TP=1 logit| = {err:.4f} > {bound}"
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.9, f"{what}: greedy choice agrees with TP=1 at only {agree:.0%} of positions"


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_every_strategy_with_and_without_overlap_equals_tp1(quant, tiny_model_dir, monkeypatch):
    with _engine(tiny_model_dir, quant, num_threads=1) as tp1:
        ref = _score(tp1)
    assert ref.abs().max() > 0.5  # logits of a real scale, so the bounds mean something

    with _engine(tiny_model_dir, quant, tensor_parallel_size=2, comm_strategy="host") as llm:
        ex = llm.core.executor
        for s in STRATEGIES:
            ex.set_strategy(s)
            assert not ex.comm.overlap
            _check(ref, _score(llm), s, f"{quant} weights, {s}, overlap off")

    import engine.models.overlap as ov

    real = ov.overlapped_layers
    calls = {"n": 0}

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(ov, "overlapped_layers", counting)
    for s in STRATEGIES:
        comm_config = CommConfig(overlap_min_tokens=2, overlap_cpu_transport=s)  # rank 0 hands it to the worker
        with _engine(tiny_model_dir, quant, tensor_parallel_size=2, comm_strategy="overlap",
                     comm_config=comm_config) as llm:
            comm = llm.core.executor.comm
            assert comm.overlap and comm.describe()["active"] == s
            before = calls["n"]
            _check(ref, _score(llm), s, f"{quant} weights, {s}, overlap on")
            assert calls["n"] > before  # the forward really ran as two micro-batches
