"""Large bfloat16 CPU linear calls on torch's oneDNN GEMM where the CPU has AMX (engine/ops/gemm.py AMX_MIN_M,
engine/ops/gguf_quant.py: GGUF weights dequantized panel by panel): which calls take that route
(KernelConfig.cpu_amx forces it on or off, so these run on any CPU), and that it computes what the dequantized
weights times x give. Batch-invariant mode (--deterministic) never takes it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from engine import ops
from engine.ops import GGUFWeight, gemm, gguf_quant, native
from engine.ops.gguf_quant import fuse_rows
from tests.support.kernels import use_kernels  # noqa: F401

pytestmark = pytest.mark.skipif(not ops.native_available(), reason="needs engine._C")


def _cpu_has_amx() -> bool:
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " amx_bf16" in line for line in f)


def test_the_setting_and_the_cpu_flag(use_kernels):
    use_kernels(cpu_amx="off")
    assert native.amx_bf16() is False
    use_kernels(cpu_amx="on")
    assert native.amx_bf16() is True
    use_kernels(cpu_amx="auto")
    assert native.amx_bf16() is _cpu_has_amx()
    with pytest.raises(ValueError, match="cpu_amx"):
        use_kernels(cpu_amx="maybe")


def _weight(qtype, n, k, seed):
    from tests.support.gguf_writer import quantize_kquant

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    raw = quantize_kquant(w, qtype) if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else quants.quantize(w, qtype)
    return GGUFWeight.from_blocks(raw, int(qtype), k)


@pytest.fixture
def routes(monkeypatch):
    """Counts the calls that take the oneDNN routes (batch invariance off: a deterministic engine's steps before
    may have left it on, process-wide)."""
    ops.set_batch_invariant(False)
    seen = {"float": 0, "gguf": 0}
    torch_linear, amx_linear = gemm._torch_linear, gguf_quant._dequantized_amx_linear

    def count_float(*a):
        seen["float"] += 1
        return torch_linear(*a)

    def count_gguf(*a):
        seen["gguf"] += 1
        return amx_linear(*a)

    monkeypatch.setattr(gemm, "_torch_linear", count_float)
    monkeypatch.setattr(gguf_quant, "_dequantized_amx_linear", count_gguf)
    return seen


def test_which_calls_take_the_route(monkeypatch, routes, use_kernels):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 256, generator=g).to(torch.bfloat16)
    q = _weight(Q.Q8_0, 96, 256, 0)
    big, small = (torch.randn(m, 256, generator=g).to(torch.bfloat16) for m in (gemm.AMX_MIN_M, 8))
    use_kernels(cpu_amx="on")
    ops.linear(big, w)
    ops.linear(big[: gguf_quant.AMX_MIN_M], q)
    assert routes == {"float": 1, "gguf": 1}
    ops.linear(small, w)  # few rows: native
    ops.linear(small, q)
    ops.linear(big.float(), w.float())  # float32: native (oneDNN has no AMX path for it)
    ops.linear(big.float(), q)
    ops.set_batch_invariant(True)
    try:
        ops.linear(big, w)
        ops.linear(big, q)
    finally:
        ops.set_batch_invariant(False)
    use_kernels(cpu_amx="off")
    ops.linear(big, w)
    ops.linear(big, q)
    assert routes == {"float": 1, "gguf": 1}


@pytest.mark.parametrize("types", [(Q.Q4_0,), (Q.Q4_K, Q.Q6_K), (Q.Q4_1, Q.Q5_0, Q.Q8_0)],
                         ids=lambda t: "+".join(q.name for q in t))
def test_gguf_panels_compute_the_dequantized_product(monkeypatch, types, routes, use_kernels):
    """Weights of one type or segments of several, panels smaller than a segment (so a segment spans panels),
    bias, rows of x and of out strided: the dequantized weights times x, in float32 within bfloat16 rounding."""
    use_kernels(cpu_amx="on")
    monkeypatch.setattr(gguf_quant, "_AMX_PANEL_ELEMS", 70 * 512)  # 70 rows per panel
    parts = [_weight(t, 160 + 32 * i, 512, i) for i, t in enumerate(types)]
    w = fuse_rows(parts)
    N = w.shape[0]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 600, generator=g).to(torch.bfloat16)[:, 40:552]  # rows 600 apart
    bias = torch.randn(N, generator=g).to(torch.bfloat16)
    out = torch.zeros(48, N + 9, dtype=torch.bfloat16)[:, 4:N + 4]
    ops.linear(x, w, bias, out=out)
    assert routes["gguf"] == 1
    ref = torch.nn.functional.linear(x.float(), w.dequantize(torch.float32), bias.float())
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    use_kernels(cpu_amx="off")  # the native panels: x quantized, close to the same
    native_out = ops.linear(x, w, bias)
    torch.testing.assert_close(native_out.float(), ref, rtol=5e-2, atol=5e-2 * ref.abs().max().item())


def test_float_route_is_torchs_linear(monkeypatch, use_kernels):
    use_kernels(cpu_amx="on")
    g = torch.Generator().manual_seed(2)
    w = torch.randn(200, 384, generator=g).to(torch.bfloat16)
    x = torch.randn(gemm.AMX_MIN_M + 3, 384, generator=g).to(torch.bfloat16)
    b = torch.randn(200, generator=g).to(torch.bfloat16)
    assert torch.equal(ops.linear(x, w, b), torch.nn.functional.linear(x, w, b))


@pytest.mark.parametrize("quantization", ["gguf", "none"])
def test_embedded_model_prefill_on_the_route_is_as_close_to_float32(monkeypatch, quantization, use_kernels,
                                                                    smollm2_fp32):
    """SmolLM2 in bfloat16, a 241-token text scored (every linear call of the prefill has 241 rows), the route on
    and off, against the float32 model: on, within 4% of the largest logit and the same argmax at >= 97% of the
    positions (measured when written: 1.6%, 100%), and no further off than the native kernels beyond the noise of
    two bfloat16 summation orders (measured: GGUF blocks 5.8% with x quantized per block, dequantized 2.1%; on a
    CPU without AMX or AVX512-BF16, where oneDNN emulates bfloat16: 2.04% on against 1.85% off; see the bound)."""
    from engine import LLM

    text = "The history of the city begins in the Middle Ages, when a small market grew around the bridge. " * 12
    ref = smollm2_fp32  # LLM(dtype="float32", quantization="none"), the session's, scored before any kernel choice
    ids = ref.core.tokenizer.encode(text)[:300]
    truth = ref.core.score(ids).float()
    err, agree = {}, {}
    for setting in ("on", "off"):
        use_kernels(cpu_amx=setting)
        with LLM(dtype="bfloat16", kv_cache_memory_gib=0.02, quantization=quantization) as llm:
            got = llm.core.score(ids).float()
        err[setting] = ((got - truth).abs().max() / truth.abs().max()).item()
        agree[setting] = (got.argmax(-1) == truth.argmax(-1)).float().mean().item()
    assert err["on"] <= 0.04 and agree["on"] >= 0.97, (err, agree)
    # On AMX (where auto takes the route) oneDNN's tiles are no further off than the native kernels beyond the
    # noise of two summation orders; forced on a CPU without AMX, oneDNN runs its AVX512-BF16 or emulated kernels,
    # another summation again (measured on a Zen 5 without AMX: 2.24% on against 1.63% off, the GGUF blocks now
    # taking the native bfloat16 GEMM above 24 rows, as the dequantized model does).
    slack = 0.005 if _cpu_has_amx() else 0.01
    assert err["on"] <= max(err["off"] * 1.1, err["off"] + slack), err
