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


@pytest.mark.parametrize("early", ["1", "2"])
def test_weight_tiles_loaded_early_give_the_same_sums(monkeypatch, early):
    """KESTREL_GEMV_EARLY (the first weight tiles loaded before waiting for x, as the PDL launch does) changes no
    bit of the result: the tiles are added in the same order (K shorter than two tiles, several tiles, ragged)."""
    rng = random.Random(11)
    for K in (40, 64, 200, 320):
        x, w, b, _ = _case(rng, 24, K, True, torch.bfloat16)
        monkeypatch.setenv("KESTREL_GEMV_EARLY", "0")
        want = skinny_gemm.skinny_linear(x, w, b, config=SMALL)
        monkeypatch.setenv("KESTREL_GEMV_EARLY", early)
        assert torch.equal(skinny_gemm.skinny_linear(x, w, b, config=SMALL), want), K


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
