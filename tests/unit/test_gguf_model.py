"""The embedded SmolLM2 Q4_1 GGUF with its linear weights kept quantized on the CPU (engine/loader/gguf.py,
engine/layers/linear.py, engine/ops/gguf_quant.py; --quantization gguf) against the same file dequantized at
load (the default).

- Both regimes (integer GEMV at <= 8 rows, float GEMM on dequantized panels above) quantize the activations per
  block of 32 to int8 (llama.cpp's rounding), so the logits move off the dequantized model's by that rounding.
  Prefill: the prompts' logits, same bounds as below.
- Decode: compared under
  teacher forcing on the dequantized model's greedy continuations (8 prompts x 64 tokens; deterministic engines,
  whose linear layers take that decode arithmetic for every row). Bounds, with what was measured when written:
  per position max |logit difference| <= 8% of the largest |logit| (measured <= 3.6%); argmax agreement >= 95%
  over all positions and >= 85% per prompt (measured 98.0% overall); mean negative log-likelihood of the
  continuations within 2% (measured 0.76%: perplexity 1.836 against 1.827). Free-running greedy outputs, for the
  record: 3 of the 8 prompts give the same 64 tokens, the others part after 5-39 (a near-tie flips, and the two
  continuations go their own ways), which is why agreement is measured under teacher forcing.
"""

from __future__ import annotations

import logging

import pytest
import torch

from engine import LLM, SamplingParams, ops
from engine.layers.linear import LinearBase
from engine.ops import GGUFWeight

PROMPTS = [
    "The capital of France is a city famous for its museums, and",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a forest,",
    "The three primary colors are red, blue and yellow. Mixing them",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Write a short poem about the sea and the wind:\n",
    "List three benefits of regular exercise for older adults:\n1.",
    "In 1969, the first humans landed on the Moon. The mission was called",
]


def _engine(dequantize: bool, deterministic: bool = False) -> LLM:
    return LLM(dtype="float32", kv_cache_memory_gib=0.05, deterministic=deterministic,
               quantization="none" if dequantize else "gguf")


def _linears(llm: LLM) -> list[LinearBase]:
    return [m for m in llm.core.runner.model.modules() if isinstance(m, LinearBase)]


@pytest.fixture(scope="module")
def quantized():
    llm = _engine(dequantize=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def dequantized():
    llm = _engine(dequantize=True)
    yield llm
    llm.close()


def test_linear_weights_stay_the_files_blocks(quantized, dequantized, smollm2_gguf):
    from engine.loader.gguf_file import GGUFFile

    layers = _linears(quantized)
    assert layers and all(isinstance(m.gguf, GGUFWeight) and m.weight.numel() == 0 for m in layers)
    assert all(m.gguf is None and m.weight.numel() > 0 for m in _linears(dequantized))
    gf = GGUFFile(smollm2_gguf)
    try:
        linear_bytes = sum(t.nbytes for n, t in gf.tensors.items()
                           if n.startswith("blk.") and len(t.shape) == 2)
    finally:
        gf.close()
    assert sum(m.gguf.nbytes for m in layers) == linear_bytes  # the file's size, not 4-8x it


def test_prefill_close_to_dequantized(quantized, dequantized):
    agree = total = 0
    for p in PROMPTS:
        ids = quantized.tokenizer.encode(p)
        assert len(ids) > 8  # the prefill regime
        lq, ld = quantized.core.score(ids), dequantized.core.score(ids)
        diff = (lq - ld).abs().max(-1).values
        assert (diff <= 0.08 * ld.abs().max()).all(), (p, diff.max())
        agree, total = agree + int((lq.argmax(-1) == ld.argmax(-1)).sum()), total + len(ids)
    assert agree >= 0.9 * total, agree / total


def test_decode_close_to_dequantized():
    ref = _engine(dequantize=True, deterministic=True)
    q = _engine(dequantize=False, deterministic=True)
    try:
        ids = [ref.tokenizer.encode(p) for p in PROMPTS]
        outs = ref.generate(ids, SamplingParams(max_tokens=64, min_tokens=64, temperature=0))
        agree = total = 0
        nll_q = nll_d = 0.0
        for prompt, out in zip(ids, outs):
            gen = out.outputs[0].token_ids
            n = len(prompt)
            lq = q.core.score(prompt + gen)[n - 1:-1]
            ld = ref.core.score(prompt + gen)[n - 1:-1]
            assert ld.argmax(-1).tolist() == gen  # the reference continues greedily
            diff = (lq - ld).abs().max(-1).values
            assert (diff <= 0.08 * ld.abs().max()).all(), (ref.tokenizer.decode(prompt), diff.max())
            same = int((lq.argmax(-1) == ld.argmax(-1)).sum())
            assert same >= 0.85 * len(gen), ref.tokenizer.decode(prompt)
            agree, total = agree + same, total + len(gen)
            target = torch.tensor(gen).unsqueeze(1)
            nll_q -= torch.log_softmax(lq, -1).gather(1, target).sum().item()
            nll_d -= torch.log_softmax(ld, -1).gather(1, target).sum().item()
        assert agree >= 0.95 * total, agree / total
        assert abs(nll_q - nll_d) <= 0.02 * nll_d, (nll_q / total, nll_d / total)
    finally:
        q.close()
        ref.close()
        ops.set_batch_invariant(False)  # a deterministic engine's steps leave it on, process-wide


def test_type_without_kernel_is_dequantized_and_logged(monkeypatch, caplog):
    monkeypatch.setattr(GGUFWeight, "KERNEL_TYPES", frozenset())
    with caplog.at_level(logging.INFO, logger="engine.loader.gguf"):
        llm = _engine(dequantize=False)
    try:
        assert all(m.gguf is None and m.weight.numel() > 0 for m in _linears(llm))
        assert "Q4_1 tensors have no CPU kernel yet; dequantized at load" in caplog.text
        assert caplog.text.count("no CPU kernel") == 1  # once per type
    finally:
        llm.close()


def test_gguf_blocks_are_opt_in_and_refused_where_they_cannot_run(tiny_model_dir):
    """The default load dequantizes (batch-invariant greedy outputs); --quantization gguf on float weights or on a
    GPU is a clear error, not a silent float load."""
    from engine.errors import KestrelError

    with pytest.raises(KestrelError, match="needs a .gguf checkpoint"):
        LLM(str(tiny_model_dir("llama")), dtype="float32", kv_cache_memory_gib=0.05, quantization="gguf")
