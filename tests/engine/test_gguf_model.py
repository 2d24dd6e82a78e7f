"""The embedded SmolLM2 Q4_1 GGUF with its linear weights kept quantized on the CPU (engine/loader/gguf.py,
engine/layers/linear.py, engine/ops/gguf_quant.py; --quantization gguf, which the default auto picks on the CPU:
tests/engine/test_quantization_auto.py) against the same file dequantized at load (--quantization none).

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
def dequantized(smollm2_fp32):
    """The same file dequantized at load: the session's float32 engine (``_engine(dequantize=True)`` but for the KV
    cache's size, which these prompts do not reach)."""
    return smollm2_fp32


def _file_bytes(path, keep) -> int:
    """Bytes of the file's 2-D tensors whose (name, info) ``keep`` accepts."""
    from engine.loader.gguf_file import GGUFFile

    gf = GGUFFile(path)
    try:
        return sum(t.nbytes for n, t in gf.tensors.items() if len(t.shape) == 2 and keep(n, t))
    finally:
        gf.close()


def test_linear_weights_stay_the_files_blocks(quantized, dequantized, smollm2_gguf):

    layers = _linears(quantized)
    assert layers and all(isinstance(m.gguf, GGUFWeight) and m.weight.numel() == 0 for m in layers)
    assert all(m.gguf is None and m.weight.numel() > 0 for m in _linears(dequantized))
    linear_bytes = _file_bytes(smollm2_gguf, lambda n, t: n.startswith("blk."))
    assert sum(m.gguf.nbytes for m in layers) == linear_bytes  # the file's size, not 4-8x it


def _prefill_agreement(q: LLM, d: LLM, prompts: list[list[int]], bound: float) -> tuple[int, int]:
    """Every prompt's logits scored by both engines (the prefill regime): each position's max |difference| within
    ``bound`` of the largest |logit|; returns (positions whose argmax agrees, positions)."""
    agree = total = 0
    for ids in prompts:
        assert len(ids) > 8  # the prefill regime
        lq, ld = q.core.score(ids), d.core.score(ids)
        diff = (lq - ld).abs().max(-1).values
        assert (diff <= bound * ld.abs().max()).all(), (ids[:4], diff.max())
        agree, total = agree + int((lq.argmax(-1) == ld.argmax(-1)).sum()), total + len(ids)
    return agree, total


def test_prefill_close_to_dequantized(quantized, dequantized):
    prompts = [quantized.tokenizer.encode(p) for p in PROMPTS]
    agree, total = _prefill_agreement(quantized, dequantized, prompts, 0.08)
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
        assert llm.core.runner.model.embed_tokens.gguf is None  # the Q8_0 table too
        for qtype in ("Q4_1", "Q8_0"):  # the layers' type, the table's: once per type
            assert caplog.text.count(f"{qtype} tensors have no CPU kernel yet; dequantized at load") == 1
    finally:
        llm.close()


def test_gguf_blocks_are_refused_where_they_cannot_run(tiny_model_dir):
    """--quantization gguf asked for on float weights (or on a GPU: tests/engine/test_quantization_auto.py) is a clear
    error, not a silent float load (the default, auto, picks the blocks only where they run)."""
    from engine.errors import KestrelError

    with pytest.raises(KestrelError, match="needs a .gguf checkpoint"):
        LLM(str(tiny_model_dir("llama")), dtype="float32", kv_cache_memory_gib=0.05, quantization="gguf")


# -- K-quants: a tiny wide Llama written as Q4_K / Q6_K (llama.cpp's Q4_K_M mix) ------------------------------------
# A random-weight model (hidden 256, the K-quants' super-block) whose linear weights are Q4_K, down_proj and the
# LM head Q6_K (as Q4_K_M files have them), layer 1's v_proj Q6_K (its fused q/k/v then holds a Q4_K and a Q6_K
# segment) and o_proj Q5_1 (no kernel: dequantized, logged);
# quantized by the test writer's plain quantizer (tests/support/gguf_writer.py quantize_kquant; gguf-py has no
# K-quant quantizer). Same comparisons as above, on 4 random prompts x 32 greedy tokens, teacher-forced. Measured when written (AVX512-VNNI):
# argmax agreement 96.1% under decode arithmetic, 97.6% for the prompts' prefill; max |logit difference| 0.9% / 1.1%
# of the largest |logit|. A random-weight model has near-ties (flat logits), hence the looser agreement bounds.

KQ_PROMPTS = [[5, 17, 300, 42, 99, 7, 256, 131, 64, 3], [400, 401, 402, 8, 9, 10, 11, 12, 13, 14, 15],
              [270, 33, 501, 6, 77, 78, 79, 260, 261, 19, 20, 21], [100, 200, 300, 400, 500, 11, 22, 33, 44]]


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory):
    from gguf import GGMLQuantizationType as Q

    from tests.support.gguf_writer import write_gguf
    from tests.support.tiny_models import WIDE_DIMS, build_tiny_model

    def types(name, shape):
        if name == "model.layers.1.self_attn.o_proj.weight":
            return Q.Q5_1
        if name.endswith(("down_proj.weight", "lm_head.weight")) or name == "model.layers.1.self_attn.v_proj.weight":
            return Q.Q6_K
        return Q.Q4_K

    model = build_tiny_model("llama", WIDE_DIMS, seed=11, vocab_size=512)
    out = tmp_path_factory.mktemp("kquant") / "wide-Q4_K_M.gguf"
    return write_gguf(model, out, "llama", types, name="wide", kquant_values=True)


def _kq_engine(path, dequantize: bool, deterministic: bool = False) -> LLM:
    return LLM(str(path), dtype="float32", kv_cache_memory_gib=0.05, deterministic=deterministic,
               quantization="none" if dequantize else "gguf")


def _teacher_forced(q, ref, prompts, gen_len):
    """(agreement, total, max relative logit difference) of q against ref on ref's greedy continuations."""
    outs = ref.generate(prompts, SamplingParams(max_tokens=gen_len, min_tokens=gen_len, temperature=0))
    agree = total = 0
    worst = 0.0
    for prompt, out in zip(prompts, outs):
        gen = out.outputs[0].token_ids
        n = len(prompt)
        lq = q.core.score(prompt + gen)[n - 1:-1]
        ld = ref.core.score(prompt + gen)[n - 1:-1]
        assert ld.argmax(-1).tolist() == gen
        worst = max(worst, float((lq - ld).abs().max() / ld.abs().max()))
        same = int((lq.argmax(-1) == ld.argmax(-1)).sum())
        assert same >= 0.75 * len(gen)
        agree, total = agree + same, total + len(gen)
    return agree, total, worst


def test_kquant_model_blocks_memory_and_teacher_forced_agreement(kquant_gguf, caplog):

    ref = _kq_engine(kquant_gguf, dequantize=True, deterministic=True)
    with caplog.at_level(logging.INFO, logger="engine.loader.gguf"):
        q = _kq_engine(kquant_gguf, dequantize=False, deterministic=True)
    try:
        assert "Q5_1 tensors have no CPU kernel yet; dequantized at load" in caplog.text
        layers = _linears(q)
        kept = [m for m in layers if m.gguf is not None]
        assert {m.gguf.type_name for m in kept} == {"Q4_K", "Q6_K", "Q4_K+Q6_K"}  # layer 1's q/k/v: two segments
        # float: layer 1's o_proj (Q5_1, no kernel)
        float_layers = [m for m in layers if m.gguf is None]
        assert len(float_layers) == 1 and all(m.weight.numel() > 0 for m in float_layers)
        assert all(m.weight.numel() == 0 for m in kept)
        kq_bytes = _file_bytes(kquant_gguf, lambda n, t: n.startswith("blk.") and t.type_name in ("Q4_K", "Q6_K"))
        assert sum(m.gguf.nbytes for m in kept) == kq_bytes  # the file's size, not 7x it (float32)

        # decode arithmetic (integer GEMV) for every row
        agree, total, worst = _teacher_forced(q, ref, KQ_PROMPTS, 32)
        assert worst <= 0.05, worst  # a broken kernel is far off this
        assert agree >= 0.9 * total, agree / total
    finally:
        q.close()
        ref.close()
        ops.set_batch_invariant(False)


def test_kquant_model_prefill_close_to_dequantized(kquant_gguf):
    q = _kq_engine(kquant_gguf, dequantize=False)
    d = _kq_engine(kquant_gguf, dequantize=True)
    try:
        assert any(m.gguf is not None and m.gguf.type_name == "Q4_K" for m in _linears(q))
        agree, total = _prefill_agreement(q, d, KQ_PROMPTS, 0.05)
        assert agree >= 0.85 * total, agree / total
    finally:
        q.close()
        d.close()


# -- fused weights whose parts differ in type (engine/ops/gguf_quant.py GGUFSegments) -----------------------------
# Every layer as a Q4_K_M file mixes them: q/k Q4_K, v Q6_K (one fused q/k/v: a Q4_K and a Q6_K segment), gate Q4_K
# and up Q5_0 (a fused gate/up of two segments), o_proj Q4_K, down_proj Q6_K. Nothing falls back to float: the kept
# bytes are the file's linear tensor bytes. Same comparisons as the K-quant model above (teacher-forced decode
# arithmetic and the prompts' prefill against the dequantized load). Measured when written (AVX512-VNNI): argmax
# agreement 97.7% (decode) / 100% (prefill); max |logit difference| 1.2% / 1.5% of the largest |logit|.


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    from gguf import GGMLQuantizationType as Q

    from tests.support.gguf_writer import write_gguf
    from tests.support.tiny_models import WIDE_DIMS, build_tiny_model

    def types(name, shape):
        if name.endswith(("v_proj.weight", "down_proj.weight", "lm_head.weight")):
            return Q.Q6_K
        if name.endswith("up_proj.weight"):
            return Q.Q5_0
        return Q.Q4_K

    model = build_tiny_model("llama", WIDE_DIMS, seed=12, vocab_size=512)
    out = tmp_path_factory.mktemp("mixed") / "wide-mixed.gguf"
    return write_gguf(model, out, "llama", types, name="wide", kquant_values=True)


def test_mixed_type_fused_weights_stay_quantized(mixed_gguf, caplog):
    from engine.ops.gguf_quant import GGUFSegments

    ref = _kq_engine(mixed_gguf, dequantize=True, deterministic=True)
    with caplog.at_level(logging.INFO, logger="engine.loader.gguf"):
        q = _kq_engine(mixed_gguf, dequantize=False, deterministic=True)
    try:
        assert "dequantized at load" not in caplog.text  # no float fallback
        layers = _linears(q)
        assert all(m.gguf is not None and m.weight.numel() == 0 for m in layers)
        model = q.core.runner.model
        for layer in model.model.layers if hasattr(model, "model") else model.layers:
            qkv, gate_up = layer.self_attn.qkv_proj.gguf, layer.mlp.gate_up_proj.gguf
            assert isinstance(qkv, GGUFSegments) and qkv.type_name == "Q4_K+Q6_K"
            assert [tuple(p.shape) for p in qkv.parts] == [(256 + 128, 256), (128, 256)]  # q+k rows, v rows
            assert isinstance(gate_up, GGUFSegments) and gate_up.type_name == "Q4_K+Q5_0"
            assert [tuple(p.shape) for p in gate_up.parts] == [(512, 256), (512, 256)]
        linear_bytes = _file_bytes(mixed_gguf, lambda n, t: n.startswith("blk."))
        assert sum(m.gguf.nbytes for m in layers) == linear_bytes  # the file's bytes, none in float

        agree, total, worst = _teacher_forced(q, ref, KQ_PROMPTS, 32)  # decode arithmetic for every row
        assert worst <= 0.05, worst
        assert agree >= 0.9 * total, agree / total
    finally:
        q.close()
        ref.close()
        ops.set_batch_invariant(False)


def test_mixed_type_fused_weights_prefill_close_to_dequantized(mixed_gguf):
    q = _kq_engine(mixed_gguf, dequantize=False)
    d = _kq_engine(mixed_gguf, dequantize=True)
    try:
        agree, total = _prefill_agreement(q, d, KQ_PROMPTS, 0.05)
        assert agree >= 0.85 * total, agree / total
    finally:
        q.close()
        d.close()


@pytest.mark.parametrize("tp_size", [2, 4])
def test_mixed_type_fused_weights_shard_as_before(mixed_gguf, tp_size):
    """Tensor parallelism slices each part as it slices float weights (q heads split, KV heads split or, with fewer
    KV heads than ranks, replicated; gate/up rows split): rank r's segments hold exactly its rows, and its output
    columns are those of the unsharded layer's."""
    from engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
    from engine.loader.gguf import GGUFWeights
    from engine.loader.gguf_file import GGUFFile
    from engine.ops.gguf_quant import GGUFSegments
    from engine.parallel.context import TPContext

    gf = GGUFFile(mixed_gguf)
    weights = GGUFWeights(gf, 4, 2)
    weights.keep_quantized = True
    hidden, hd, heads, kv, inter = 256, 64, 4, 2, 512
    x = torch.randn(3, hidden, generator=torch.Generator().manual_seed(0))
    try:
        def build(rank, size):
            tp = TPContext(rank=rank, size=size)
            qkv = QKVParallelLinear(hidden, hd, heads, kv, False, torch.float32, tp)
            qkv.load(weights, "model.layers.0.self_attn")
            mlp = MergedColumnParallelLinear(hidden, inter, ["gate_proj", "up_proj"], torch.float32, tp)
            mlp.load(weights, "model.layers.0.mlp")
            return qkv, mlp

        full_qkv, full_mlp = build(0, 1)
        yq, ym = full_qkv(x), full_mlp(x)
        q_full, k_full, v_full = yq.split([heads * hd, kv * hd, kv * hd], -1)
        gate_full, up_full = ym.split([inter, inter], -1)
        for rank in range(tp_size):
            qkv, mlp = build(rank, tp_size)
            assert isinstance(qkv.gguf, GGUFSegments) and qkv.gguf.type_name == "Q4_K+Q6_K"
            assert isinstance(mlp.gguf, GGUFSegments) and mlp.gguf.type_name == "Q4_K+Q5_0"
            q_rows, kv_rows = qkv.q_rows[1] - qkv.q_rows[0], qkv.kv_rows[1] - qkv.kv_rows[0]
            assert [p.shape[0] for p in qkv.gguf.parts] == [q_rows + kv_rows, kv_rows]
            q, k, v = qkv(x).split([q_rows, kv_rows, kv_rows], -1)
            torch.testing.assert_close(q, q_full[:, qkv.q_rows[0]:qkv.q_rows[1]], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(k, k_full[:, qkv.kv_rows[0]:qkv.kv_rows[1]], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v, v_full[:, qkv.kv_rows[0]:qkv.kv_rows[1]], rtol=1e-5, atol=1e-5)
            r0, r1 = mlp.rows
            gate, up = mlp(x).split([r1 - r0, r1 - r0], -1)
            torch.testing.assert_close(gate, gate_full[:, r0:r1], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(up, up_full[:, r0:r1], rtol=1e-5, atol=1e-5)
    finally:
        gf.close()


def test_gguf_blocks_load_without_importing_gguf(smollm2_gguf):
    """--quantization gguf on the CPU reads SmolLM2 (Q4_1 blocks kept, F32 norms, a Q8_0 embedding kept) without
    the gguf package: 1.5 MiB of the process's memory after load (docs/benchmarks/cpu_gguf_memory_2026-12-06.md)."""
    import subprocess
    import sys

    code = ("import sys; from engine import LLM; "
            f"llm = LLM({str(smollm2_gguf)!r}, device='cpu', quantization='gguf', num_kv_blocks=8); "
            "assert llm.generate([[1, 2, 3]])[0].outputs[0].token_ids; "
            "print(sorted(m for m in sys.modules if m == 'gguf' or m.startswith(('gguf.', 'yaml'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
