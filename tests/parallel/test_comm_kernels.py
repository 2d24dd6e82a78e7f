"""csrc/comm CPU kernels (reduction, int8 quantise / dequantise-accumulate-requantise / dequantise) against
their torch references in engine/parallel/comm/reference.py: bit for bit, every dtype x ISA level this
CPU has, fresh random inputs of awkward sizes, outputs poisoned before the call. Plus the int8 error bound
itself (a bound that a perturbed result violates), single process, fast."""

from __future__ import annotations

import pytest
import torch

from engine.parallel.comm import kernels as K
from engine.parallel.comm import reference as R

pytestmark = pytest.mark.timeout(300)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SIZES = [1, 7, 127, 128, 129, 576, 1000, 4096 + 5, 65536 + 3]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.int8 else t.reshape(-1)


@pytest.fixture(params=["scalar", "avx2", "avx512"])
def isa(request):
    from engine import _C

    try:
        _C.comm_force_isa(request.param)
    except ValueError:
        pytest.skip(f"{request.param} not available on this CPU/build")
    yield request.param
    _C.comm_force_isa("auto")


def _inputs(n, dtype, k, seed):
    g = torch.Generator().manual_seed(seed)
    xs = []
    for _ in range(k):
        x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
        x[torch.rand(n, generator=g) < 0.05] = 0.0
        if n >= 256:
            x[128:256] = 0.0  # an all-zero group: scale 0
        xs.append(x.to(dtype))
    return xs


def test_native_comm_is_built():
    assert K.native(), "engine._C lacks csrc/comm: rebuild with `pip install --no-build-isolation -e .`"
    assert K.GROUP == 128
    from engine import _C

    assert _C.comm_int8_group == 128


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_bit_exact(isa, dtype):
    for i, n in enumerate(SIZES):
        for k in (1, 2, 3, 5):
            xs = _inputs(n, dtype, k, 100 * i + k)
            out = torch.full((n,), float("nan")).to(dtype)
            K.reduce_sum(xs, out=out)
            assert torch.equal(_bits(out), _bits(R.reduce_sum(xs))), (isa, dtype, n, k)
            # in place into the first source (the one-shot all-reduce does this)
            first = xs[0].clone()
            K.reduce_sum([first] + xs[1:], out=first)
            assert torch.equal(_bits(first), _bits(R.reduce_sum(xs)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_kernels_bit_exact(isa, dtype):
    from engine import _C

    for i, n in enumerate(SIZES):
        xs = _inputs(n, dtype, 3, 7 + i)
        ng = -(-n // 128)
        q = torch.full((ng * 128,), 99, dtype=torch.int8)
        s = torch.full((ng,), float("nan"))
        _C.comm_quantize_int8(K.DTYPE_CODE[dtype], xs[0].data_ptr(), n, q.data_ptr(), s.data_ptr())
        qr, sr = R.quantize_int8(xs[0])
        assert torch.equal(q, qr) and torch.equal(s.view(torch.int32), sr.view(torch.int32)), (isa, dtype, n)
        assert int(q.abs().max()) <= 127
        qs, ss = zip(*(K.quantize_int8(x) for x in xs))
        oq, os_ = K.dequant_sum_requant(list(qs), list(ss))
        oqr, osr = R.dequant_sum_requant(list(qs), list(ss))
        assert torch.equal(oq, oqr) and torch.equal(os_, osr), (isa, dtype, n)
        out = torch.full((n,), float("nan")).to(dtype)
        _C.comm_dequantize_int8(K.DTYPE_CODE[dtype], oq.data_ptr(), os_.data_ptr(), n, out.data_ptr())
        assert torch.equal(_bits(out), _bits(R.dequantize_int8(oq, os_, n, dtype))), (isa, dtype, n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_all_reduce_within_bound(dtype):
    """The int8 reference result stays within reference.error_bound of the float64 sum, and the bound is
    not vacuous: moving the result by 2x the bound at one element violates it."""
    for i, n in enumerate([129, 576, 4096, 65536]):
        xs = _inputs(n, dtype, 3, 50 + i)
        y = R.int8_all_reduce(xs)
        ref = R.float64_sum(xs)
        bound = R.error_bound("int8", xs)
        ratio = ((y.double() - ref).abs() / bound).max()
        assert ratio <= 1.0, (dtype, n, float(ratio))
        # a worst-case bound (rotating back averages 128 rounding errors, typically ~1/sqrt(128) of it), but
        # not a vacuous one
        assert ratio > 0.02, (dtype, n, float(ratio))
        bad = y.double().clone()
        j = int(bound.argmax())
        bad[j] += 2 * bound[j]
        assert ((bad - ref).abs() > bound).any()
        # and the exact strategies' bound is much tighter than int8's
        assert (R.error_bound("exact", xs) <= bound).all() and (R.error_bound("exact", xs) < bound).any()
