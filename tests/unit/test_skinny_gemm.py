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


def test_short_and_ragged_k_around_the_two_early_tiles():
    """The two weight tiles loaded before waiting for x (as the PDL launch does) and the loop after them: K shorter
    than one tile, one, several, ragged; each within the rounding of the reference. (The EARLY 0 / 1 variants this
    test once compared bit for bit were deleted with KESTREL_GEMV_EARLY: issue 46.)"""
    rng = random.Random(11)
    for K in (40, 64, 200, 320):
        x, w, b, ref = _case(rng, 24, K, True, torch.bfloat16)
        y = skinny_gemm.skinny_linear(x, w, b, config=SMALL)
        tol = 2 ** -7 * ref.abs() + 1e-3
        assert ((y.float() - ref).abs() <= tol).all(), K


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


def _unfused(x, w, config):
    from engine import ops

    return ops.silu_and_mul(skinny_gemm.skinny_linear(x, w, config=config))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(3))
def test_gate_up_with_the_activation_in_its_epilogue(seed, dtype):
    """skinny_silu_and_mul = silu_and_mul(skinny_linear(x, [gate; up])): the projections are the same sums (each
    row streamed in the same order), then the same roundings (the projection, silu, the product); the exponential
    may differ in its last fp32 bit from the native kernel's, so at most one output ulp, on few elements. I not a
    multiple of the outputs per program, K ragged or not. (Triton's interpreter rounds float32 to bfloat16 toward
    zero, the compiled kernel and the native ops to nearest: there, three roundings in bfloat16 differ by up to
    three ulps from the two ops' mix of both.)"""
    rng = random.Random(100 + seed)
    ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    nearest = DEV == "cuda" or dtype == torch.float16
    ulps = 1 if nearest else 3
    for _ in range(2):
        inter, K = rng.choice([8, 20, 36]), rng.choice([64, 96, 200])
        x, w, _, _ = _case(rng, 2 * inter, K, False, dtype)
        w = w * 8  # projections of a few units: silu's curved part
        for cfg in (SMALL, skinny_gemm.GEMV_CONFIG):
            want = _unfused(x, w, cfg)
            got = skinny_gemm.skinny_silu_and_mul(x, w, config=cfg)
            assert got.shape == (1, inter) and got.dtype == dtype
            diff = (got.float() - want.float()).abs()
            assert (diff <= ulps * ulp * want.float().abs() + 1e-6).all(), (inter, K, diff.max().item())
            if nearest:
                assert (diff == 0).float().mean() >= 0.9
            ref = skinny_gemm.skinny_linear(x, w, config=cfg).float()
            g, u = ref[:, :inter], ref[:, inter:]
            assert torch.allclose(got.float(), g * torch.sigmoid(g) * u, rtol=(ulps + 2) * ulp, atol=1e-3)


def test_the_fused_activation_is_taken_inside_graphs():
    from engine import ops

    x = torch.randn(1, 64, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(48, 64, dtype=torch.bfloat16, device=DEV)
    assert not skinny_gemm.wanted_gated(x, w)
    with skinny_gemm.for_graphs():
        assert skinny_gemm.wanted_gated(x, w) == x.is_cuda
        assert not skinny_gemm.wanted_gated(x, w[:47])  # gate + up: an even number of rows
    ref = ops.silu_and_mul(ops.linear(x, w))
    torch.testing.assert_close(ops.linear_silu_and_mul(x, w), ref)  # outside the graphs: the two ops
    with pytest.raises(ValueError, match="even"):
        skinny_gemm.skinny_silu_and_mul(x, w[:47])
