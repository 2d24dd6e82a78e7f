"""engine.ops.linear (native GEMV / GEMM, csrc/cpu/gemm*) against its fp32 reference (F.linear in fp32,
rounded once to the dtype).

Every dtype x every linear ISA level this CPU has (forced through engine._C.force_isa; "avx512bf16" is
the vdpbf16ps path, "avx512" the same CPU with bf16 widened to fp32), on fresh random inputs from a seeded
generator, outputs poisoned (NaN) first. Shapes cross decode sizes (M <= 16: the GEMV regime) and
prefill sizes (the packed GEMM), K not a multiple of any vector width (1000, and odd 77 for the bf16 pair
tail), N with partial blocks / panels (1, 17, 100). Bounds per dtype: the kernels accumulate in fp32 like
the reference, so they differ by fp32 reassociation (growing with K for these N(0, 1) inputs) and,
rarely, one rounding step of the dtype.
"""

from __future__ import annotations

import functools
import itertools
import zlib

import pytest
import torch

from engine import ops
from engine.ops import reference as ref
from engine.ops.int8 import quantize_activations

pytestmark = pytest.mark.timeout(300)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# rtol (the dtype's rounding of the result), atol per unit of K (fp32 reassociation: the partial sums of
# K products of N(0, 1) numbers reach ~sqrt(K), their rounding errors add up to ~1e-7 K; measured <= 7e-8 K)
TOL = {torch.float32: (2e-6, 3e-7), torch.bfloat16: (8e-3, 3e-7), torch.float16: (1e-3, 3e-7)}
ISAS = ops.available_isas()
if ops.native_available():
    from engine import _C

MS = [1, 2, 3, 7, 16, 33, 200]
KS = [64, 576, 1000, 1536]
NS = [1, 17, 3072]


def gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randn(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def close(actual, expected, dtype, K, msg=""):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * max(K, 16), equal_nan=False,
                               msg=lambda m: f"{msg}\n{m}")


@pytest.fixture(params=ISAS)
def isa(request):
    _C.force_isa(request.param)
    assert ops.linear_isa() == request.param
    yield request.param
    _C.force_isa("auto")


@pytest.fixture
def threads():
    before = _C.get_num_threads()
    yield ops.set_num_threads
    ops.set_num_threads(before)


def test_levels():
    assert ops.native_available(), "engine._C is missing: build it with `pip install --no-build-isolation -e .`"
    assert set(ISAS) <= {"scalar", "avx2", "avx512", "avx512bf16"}
    assert ops.linear_isa() == ops.cpu_isa() == ISAS[-1], "auto should pick the best level"
    if "avx512bf16" in ISAS:  # one level for every kernel
        _C.force_isa("avx512bf16")
        try:
            assert ops.cpu_isa() == ops.linear_isa() == "avx512bf16"
            _C.force_isa("avx512")
            assert ops.cpu_isa() == ops.linear_isa() == "avx512"
        finally:
            _C.force_isa("auto")


def _shapes(isa):
    """All (M, K, N); the scalar level (slow by design) gets the products small enough to run quickly,
    which still covers every M, K and N value."""
    for M, K, N in itertools.product(MS, KS, NS):
        if isa == "scalar" and M * K * N > 3_000_000 and not (M == 200 and K == 64 and N == 17):
            continue
        yield M, K, N


_SCALAR_SHAPES = set(_shapes("scalar"))


_POOL = 3072 * 1536 + 200 * 1549 + 3072 + 1024


@functools.lru_cache(maxsize=None)
def _pool(dtype) -> torch.Tensor:
    """Seeded N(0, 1) numbers in the dtype; test_linear's inputs are slices of it (at offsets that depend
    on the shape), so the reference is computed once per case and shared by every ISA level."""
    return randn(gen("pool", str(dtype)), _POOL, dtype=dtype)


@functools.lru_cache(maxsize=None)
def _case(dtype, M, K, N, with_bias, strided):
    pool = _pool(dtype)
    off = zlib.crc32(repr((M, K, N)).encode()) % 1024
    w = pool[off : off + N * K].view(N, K)
    if strided:  # x rows strided: a view into a wider buffer
        x = pool[off + 1 : off + 1 + M * (K + 13)].view(M, K + 13)[:, 5 : 5 + K]
    else:
        x = pool[off + 2 : off + 2 + M * K].view(M, K)
    b = pool[off + 3 : off + 3 + N] if with_bias else None
    return x, w, b, ref.linear(x, w, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear(isa, dtype):
    covered = set()
    for i, (M, K, N) in enumerate(_shapes("any")):
        if isa == "scalar" and (M, K, N) not in _SCALAR_SHAPES:
            continue
        strided, with_bias = i % 3 == 1, i % 2 == 0
        x, w, b, expected = _case(dtype, M, K, N, with_bias, strided)
        if strided:  # out rows strided too
            out_base = poisoned((M, N + 7), dtype)
            out = out_base[:, :N]
        else:
            out = poisoned((M, N), dtype)
        got = ops.linear(x, w, b, out=out)
        assert got is out
        close(out, expected, dtype, K, f"{isa} M={M} K={K} N={N} bias={with_bias} strided={strided}")
        if strided:
            assert torch.isnan(out_base[:, N:]).all(), "linear wrote outside its output rows"
        covered.update([("M", M), ("K", K), ("N", N)])
    assert covered == {("M", m) for m in MS} | {("K", k) for k in KS} | {("N", n) for n in NS}


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_tails(isa, dtype):
    # K odd (bf16 pairs), K below one vector; N around the GEMV block (4) and GEMM panel (48) sizes;
    # M around the GEMV / GEMM switch (16) and the micro-kernel rows (8, 6, 4).
    for M, K, N in [(1, 1, 5), (1, 77, 100), (5, 77, 49), (17, 77, 47), (9, 31, 96), (16, 15, 3), (23, 129, 50),
                    (1, 2049, 9), (20, 2100, 20)]:
        g = gen("tails", str(dtype), M, K, N)
        x, w, b = randn(g, M, K, dtype=dtype), randn(g, N, K, dtype=dtype), randn(g, N, dtype=dtype)
        out = poisoned((M, N), dtype)
        ops.linear(x, w, b, out=out)
        close(out, ref.linear(x, w, b), dtype, K, f"{isa} M={M} K={K} N={N}")


def test_linear_default_out_and_batched_x():
    g = gen("nd")
    for dtype in DTYPES:
        x, w, b = randn(g, 2, 3, 64, dtype=dtype), randn(g, 40, 64, dtype=dtype), randn(g, 40, dtype=dtype)
        y = ops.linear(x, w, b)
        assert y.shape == (2, 3, 40) and y.dtype == dtype
        close(y, ref.linear(x, w, b), dtype, 64)
        out = poisoned((2, 3, 40), dtype)
        assert ops.linear(x, w, None, out=out) is out
        close(out, ref.linear(x, w), dtype, 64)
        x1 = randn(g, 64, dtype=dtype)  # 1-D x, like F.linear
        close(ops.linear(x1, w), ref.linear(x1, w), dtype, 64)


def test_linear_empty():
    w, b = torch.randn(5, 8), torch.randn(5)
    assert ops.linear(torch.randn(0, 8), w, b).shape == (0, 5)
    assert ops.linear(torch.randn(3, 8), torch.randn(0, 8)).shape == (3, 0)
    for dtype in DTYPES:  # K = 0: an empty sum, the bias alone
        x, w0, b0 = torch.randn(3, 0).to(dtype), torch.randn(5, 0).to(dtype), torch.randn(5).to(dtype)
        assert torch.equal(ops.linear(x, w0, b0), b0.expand(3, 5))
        assert torch.equal(ops.linear(x, w0), torch.zeros(3, 5, dtype=dtype))


def test_linear_broadcast_x_rows():
    # x rows may overlap (stride 0): they are only read
    g = gen("bcast")
    row, w = randn(g, 1, 100), randn(g, 30, 100)
    x = row.expand(20, 100)
    close(ops.linear(x, w), ref.linear(x.contiguous(), w), torch.float32, 100)


def test_linear_threads_match_serial(threads):
    # Big enough to fork (decode GEMV and prefill GEMM): 2 threads give exactly the 1-thread result.
    g = gen("threads")
    for dtype in (torch.bfloat16, torch.float32):
        for M, K, N in [(1, 576, 3072), (4, 1536, 1000), (40, 576, 1000)]:
            x, w, b = randn(g, M, K, dtype=dtype), randn(g, N, K, dtype=dtype), randn(g, N, dtype=dtype)
            threads(1)
            a = ops.linear(x, w, b)
            threads(2)
            assert torch.equal(ops.linear(x, w, b), a), f"M={M} K={K} N={N} {dtype}"


def test_linear_rejects_bad_inputs():
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    with pytest.raises(ValueError, match="weight must be torch.bfloat16"):
        ops.linear(x.bfloat16(), w)
    with pytest.raises(ValueError, match=r"weight must have shape \[\*, 8\]"):
        ops.linear(x, torch.randn(5, 9))
    with pytest.raises(ValueError, match="weight must be contiguous"):
        ops.linear(x, torch.randn(8, 5).t())
    with pytest.raises(ValueError, match="x's last dimension must be contiguous"):
        ops.linear(torch.randn(8, 3).t(), w)
    with pytest.raises(ValueError, match=r"bias must have shape \[5\]"):
        ops.linear(x, w, torch.randn(4))
    with pytest.raises(ValueError, match=r"out must have shape \[3, 5\]"):
        ops.linear(x, w, out=torch.empty(3, 6))
    with pytest.raises(ValueError, match="out must be torch.float32"):
        ops.linear(x, w, out=torch.empty(3, 5, dtype=torch.float16))
    with pytest.raises(ValueError, match="x must be float32, bfloat16 or float16"):
        ops.linear(x.double(), w.double())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_linear_cuda_goes_to_torch():
    x, w, b = torch.randn(3, 64, device="cuda"), torch.randn(10, 64, device="cuda"), torch.randn(10, device="cuda")
    torch.testing.assert_close(ops.linear(x, w, b), torch.nn.functional.linear(x, w, b))


def test_linear_into_folds_only_cuda_prefill_sizes():
    """acc += x @ w^T in the GEMM itself only on CUDA at FOLD_MIN_ROWS rows or more; elsewhere False, acc untouched."""
    from engine.ops import gemm

    x, w = torch.randn(gemm.FOLD_MIN_ROWS, 64), torch.randn(10, 64)
    acc = torch.randn(gemm.FOLD_MIN_ROWS, 10)
    before = acc.clone()
    assert not ops.linear_into(x, w, acc)
    assert torch.equal(acc, before)
    if torch.cuda.is_available():
        xc, wc, ac = x.cuda(), w.cuda(), acc.cuda()
        assert ops.linear_into(xc, wc, ac)
        torch.testing.assert_close(ac.cpu(), before + x @ w.t(), rtol=1e-4, atol=1e-4)
        assert not ops.linear_into(xc[:-1], wc, ac[:-1])  # below FOLD_MIN_ROWS: the GEMV / graphs' sizes
        assert not ops.linear_into(xc, wc.half(), ac)  # dtypes differ


# -- int8 weights (engine/ops/int8.py): the same kernels, weights widened and scaled per group of 32 --------------

def test_int8_quantize_round_trip():
    g = gen("q8-roundtrip")
    w = randn(g, 37, 96) * torch.logspace(-3, 2, 96)  # groups of very different magnitudes
    w[3, 32:64] = 0  # an all-zero group: scale 0, exactly zero back
    q = ops.Int8Weight.quantize(w)
    assert q.q.dtype == torch.int8 and q.scales.shape == (37, 3)
    back = q.dequantize()
    assert torch.equal(back[3, 32:64], torch.zeros(32))
    err = (back - w).abs().reshape(37, 3, 32).amax(-1)
    assert (err <= q.scales / 2 * (1 + 1e-5) + 1e-30).all()  # round to nearest: half a step at most
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.Int8Weight.quantize(torch.zeros(4, 40))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_linear_matches_reference(isa, threads, dtype):
    """Every M regime (GEMV, GEMM), N with partial blocks, K multiples of 32, bias or not, strided x / out."""
    threads(2)
    for M, K, N in itertools.product([1, 3, 16, 33], [32, 576, 1536], NS):
        g = gen("q8", isa, str(dtype), M, K, N)
        w = ops.Int8Weight.quantize(randn(g, N, K))
        x_full = randn(g, M, K + 8, dtype=dtype)
        x = x_full[:, 4:4 + K]  # rows K + 8 apart
        bias = randn(g, N, dtype=dtype) if N != 17 else None
        out_full = poisoned((M, N + 3), dtype)
        out = out_full[:, :N]
        got = ops.linear(x, w, bias, out=out)
        assert got.data_ptr() == out.data_ptr()
        xr = x.float()
        if isa == "avx512bf16" and dtype == torch.bfloat16 and M <= 16:  # the VNNI GEMV quantizes x too
            xr = quantize_activations(x)
        expected = torch.nn.functional.linear(xr, w.dequantize(), None if bias is None else bias.float())
        if isa == "avx512bf16" and dtype == torch.bfloat16 and M > 16:  # weights packed as bf16 pairs
            expected = torch.nn.functional.linear(xr, w.dequantize(torch.bfloat16).float(),
                                                  None if bias is None else bias.float())
        close(out.float(), expected.to(dtype).float(), dtype, K, f"{isa} {dtype} M={M} K={K} N={N}")
        assert torch.isnan(out_full[:, N:].float()).all()  # nothing written past N


def test_int8_linear_3d_input_and_errors():
    w = ops.Int8Weight.quantize(torch.randn(8, 64))
    x = torch.randn(2, 3, 64)
    y = ops.linear(x, w)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w.dequantize()), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="int8 weight's K 64"):
        ops.linear(torch.randn(2, 32), w)
