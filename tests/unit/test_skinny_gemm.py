"""The one-row linear kernel (engine/ops/skinny_gemm.py) against a float32 reference with one rounding, on random
shapes (K a multiple of the tile or not, N not a multiple of the rows per program), with and without bias; and
when ops.linear takes it. On the CPU through Triton's interpreter (tests/conftest.py); tests/gpu runs it compiled on
the 8B shapes."""

from __future__ import annotations

import random

import pytest
import torch

from engine.ops import skinny_gemm
from engine.ops.varlen_attention import available

pytestmark = pytest.mark.skipif(not available(), reason="Triton is not installed")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = skinny_gemm.SkinnyConfig(16, 64, 4, 2)  # small tiles: several tiles along K and N in small shapes


def _case(rng: random.Random, N: int, K: int, bias: bool, dtype):
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    x = torch.randn(1, K, generator=g).to(dtype).to(DEV)
    w = (torch.randn(N, K, generator=g) * 0.05).to(dtype).to(DEV)
    b = (torch.randn(N, generator=g) * 0.1).to(dtype).to(DEV) if bias else None
    ref = x.float() @ w.float().t() + (b.float() if b is not None else 0)
    return x, w, b, ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(4))
def test_random_shapes(seed, dtype):
    rng = random.Random(seed)
    for _ in range(2):
        N, K = rng.choice([16, 40, 72]), rng.choice([64, 128, 96, 200])
        x, w, b, ref = _case(rng, N, K, rng.random() < 0.5, dtype)
        y = skinny_gemm.skinny_linear(x, w, b, config=SMALL)
        assert y.shape == (1, N) and y.dtype == dtype
        # fp32 accumulation, one rounding: within an ulp of the output dtype plus summation-order noise
        tol = (2 ** -7 if dtype == torch.bfloat16 else 2 ** -10) * ref.abs() + 1e-3
        assert ((y.float() - ref).abs() <= tol).all(), (N, K)


def test_default_config_and_out():
    x, w, b, ref = _case(random.Random(9), 48, 1024, True, torch.bfloat16)
    out = torch.full((1, 48), float("nan"), dtype=torch.bfloat16, device=DEV)
    assert skinny_gemm.skinny_linear(x, w, b, out=out) is out
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="rows"):
        skinny_gemm.skinny_linear(torch.cat([x, x]), w)


def test_linear_routes_only_one_row_cuda_calls_inside_graphs():
    from engine import ops

    x = torch.randn(1, 64, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(32, 64, dtype=torch.bfloat16, device=DEV)
    assert not skinny_gemm.wanted(x, w, None)
    with skinny_gemm.for_graphs():
        assert skinny_gemm.wanted(x, w, None) == x.is_cuda  # CPU tensors keep the native CPU kernels
        assert not skinny_gemm.wanted(torch.cat([x, x]), w, None)  # several rows: cuBLAS measured faster
        assert not skinny_gemm.wanted(x.float(), w.float(), None)
        torch.testing.assert_close(ops.linear(x, w).float(), x.float() @ w.float().t(), atol=0.05, rtol=0.02)
    assert not skinny_gemm.wanted(x, w, None)


def test_off_keeps_cublas(monkeypatch):
    monkeypatch.setenv("KESTREL_SKINNY_GEMM", "off")
    x = torch.randn(1, 64, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(32, 64, dtype=torch.bfloat16, device=DEV)
    with skinny_gemm.for_graphs():
        assert not skinny_gemm.wanted(x, w, None)


def _rows(g, K: int, dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(1, K, generator=g) * scale).to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_norm_linear_is_the_norm_then_the_linear(seed, with_residual, dtype):
    """The fused RMSNorm prologue: the new residual is the reference's (bit for bit when compiled), the output the
    reference GEMV of
    the reference norm's output (rounded as ops.fused_add_rms_norm rounds) within the GEMV's tolerance; x and the
    old residual stay untouched (other programs still read them)."""
    from engine.ops import reference

    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    N, K = rng.choice([16, 40, 72]), rng.choice([64, 128, 200])
    x, r = _rows(g, K, dtype), (_rows(g, K, dtype, 3.0) if with_residual else None)
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype).to(DEV)
    w = (torch.randn(N, K, generator=g) * 0.05).to(dtype).to(DEV)
    b = (torch.randn(N, generator=g) * 0.1).to(dtype).to(DEV) if rng.random() < 0.5 else None
    x0, r0 = x.clone(), (r.clone() if r is not None else None)
    y, h = skinny_gemm.norm_linear(x, r, nw, 1e-5, w, b, config=SMALL)
    if r is None:
        want_h, normed = x0, reference.rms_norm(x0, nw, 1e-5)
    else:
        want_h, xs = r0.clone(), x0.clone()
        reference.fused_add_rms_norm(xs, want_h, nw, 1e-5)
        normed = xs
    if DEV == "cuda":
        assert torch.equal(h, want_h)
    else:  # Triton's interpreter rounds float32 to bfloat16 by truncation: an ulp at most
        ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
        assert ((h.float() - want_h.float()).abs() <= ulp * want_h.float().abs()).all()
    assert torch.equal(x, x0) and (r is None or torch.equal(r, r0))
    ref = normed.float() @ w.float().t() + (b.float() if b is not None else 0)
    # the norm's statistics may round differently in the last bit: a few ulps of each input on top of the GEMV's
    tol = (2 ** -6 if dtype == torch.bfloat16 else 2 ** -9) * (normed.float().abs() @ w.float().abs().t()) + 1e-3
    assert ((y.float() - ref).abs() <= tol).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(3))
def test_silu_linear_is_silu_and_mul_then_the_linear(seed, dtype):
    from engine.ops import reference

    rng = random.Random(seed)
    g = torch.Generator().manual_seed(100 + seed)
    N, K = rng.choice([16, 40, 72]), rng.choice([64, 128, 200])
    gate_up = _rows(g, 2 * K, dtype, 2.0)
    w = (torch.randn(N, K, generator=g) * 0.05).to(dtype).to(DEV)
    act = reference.silu_and_mul(gate_up)
    ref = act.float() @ w.float().t()
    y = skinny_gemm.silu_linear(gate_up, w, config=SMALL)
    tol = (2 ** -6 if dtype == torch.bfloat16 else 2 ** -9) * (act.float().abs() @ w.float().abs().t()) + 1e-3
    assert y.shape == (1, N) and ((y.float() - ref).abs() <= tol).all()
    with pytest.raises(ValueError, match="twice"):
        skinny_gemm.silu_linear(gate_up[:, :K], w)


def test_fused_layers_take_the_kernels_only_where_the_gemv_runs(monkeypatch):
    """engine/layers/fused.py: outside for_graphs() (and on CPU tensors) the layers run one after the other;
    the fused functions return what the unfused layers return."""
    from engine.layers import fused
    from engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear
    from engine.layers.norm import RMSNorm
    from engine.parallel.context import SINGLE

    torch.manual_seed(0)
    K, inter = 64, 96
    with torch.device(DEV):
        norm = RMSNorm(K, 1e-5, torch.bfloat16)
        up = MergedColumnParallelLinear(K, inter, ["gate_proj", "up_proj"], torch.bfloat16, SINGLE)
        down = RowParallelLinear(inter, K, torch.bfloat16, SINGLE, "intermediate size")
    for p in (norm.weight, up.weight, down.weight):
        p.data.copy_(torch.randn_like(p, dtype=torch.float32).to(p.dtype) * 0.1 + (1 if p is norm.weight else 0))
    x = torch.randn(1, K, dtype=torch.bfloat16, device=DEV)
    r = torch.randn(1, K, dtype=torch.bfloat16, device=DEV)
    xs, rs = x.clone(), r.clone()
    want_res = rs
    want = down(ops_silu(up(norm(xs, want_res)[0])))
    for mode in ("on", "off"):
        monkeypatch.setenv("KESTREL_DECODE_FUSION", mode)
        with skinny_gemm.for_graphs():
            gu, res = fused.norm_linear(norm, up, x.clone(), r.clone())
            y = fused.silu_linear(down, gu)
        assert torch.equal(res, want_res)
        torch.testing.assert_close(y.float(), want.float(), atol=2e-2, rtol=2e-2)


def ops_silu(x):
    from engine import ops

    return ops.silu_and_mul(x)
