"""GGUF quantized-weight kernels (csrc/cpu/gguf*.cpp, engine/ops/gguf_quant.py) against the `gguf` package's own
dequantization (gguf.quants.dequantize, the ground truth), for Q4_0, Q4_1, Q8_0 and Q5_0, Q4_K, Q5_K, Q6_K on every
ISA level this machine has (forced through engine._C.gguf_force_isa).

Bounds: x is quantized per block of 32 to int8 steps of d_x = absmax / 127 in both regimes (integer GEMV for
M <= 8, float GEMM on dequantized panels above), so each x element moves by at most d_x / 2 and
|y - x W^T| <= sum_k |W[n, k]| d_x(k) / 2 (a hard bound, checked with a 1% margin plus fp32 noise); and against
reference.gguf_linear, which emulates that arithmetic, within fp32 accumulation noise (1e-5 of sum |x| |W|). For
bfloat16 / float16 the prefill regime also rounds the dequantized weights and the quantized x to the dtype, and the
output is rounded (2^-8 / 2^-11 relative per term).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from engine import ops
from engine.ops import reference as ref

_C = pytest.importorskip("engine._C")

TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]
NEW_TYPES = [Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]  # no emulation in engine.ops.reference: checked against x_q @ W
ISAS = list(_C.gguf_isas())


@pytest.fixture(autouse=True)
def _not_batch_invariant():
    """The regimes below assume the default mode (a deterministic engine in this process leaves it on)."""
    was = ops.batch_invariant()
    ops.set_batch_invariant(False)
    yield
    ops.set_batch_invariant(was)


@pytest.fixture(params=ISAS)
def isa(request):
    _C.gguf_force_isa(request.param)
    assert ops.gguf_isa() == request.param
    yield request.param
    _C.gguf_force_isa("auto")


def _random_blocks(rng, qtype, n, k, mode):
    """n rows of K as GGUF bytes: weights quantized by gguf itself ("quantized"), or random bytes with random
    finite float16 scales ("raw": every nibble / int8 value and sign appears)."""
    if mode == "quantized":
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)
        return quants.quantize(w, qtype)
    size = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34}[qtype]
    raw = rng.integers(0, 256, (n, k // 32, size), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, (n, k // 32, 2 if qtype == Q.Q4_1 else 1)).astype(np.float16)
    raw[..., : scales.shape[-1] * 2] = scales.view(np.uint8).reshape(n, k // 32, -1)
    return raw.reshape(n, -1)


def _truth(raw, qtype, n, k):
    return torch.from_numpy(quants.dequantize(raw, qtype).astype(np.float32)).reshape(n, k)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("mode", ["quantized", "raw"])
def test_dequantize_is_gguf_dequantize(qtype, mode):
    rng = np.random.default_rng(int(qtype) * 10 + len(mode))
    n, k = 13, 32 * 7
    raw = _random_blocks(rng, qtype, n, k, mode)
    w = ops.GGUFWeight.from_blocks(raw, int(qtype), k)
    assert torch.equal(w.dequantize(), _truth(raw, qtype, n, k))
    assert w.shape == (n, k) and w.nbytes == raw.nbytes
    assert np.array_equal(w.file_blocks().numpy(), raw)


def _decode_bound(x, truth):
    _, d, _ = ref.gguf_quantize_activations(x)
    dx = d.expand(-1, -1, 32).reshape(x.shape)  # [M, K]: each element's block scale
    return 0.5 * dx @ truth.abs().T * 1.01 + 1e-5 * (x.abs() @ truth.abs().T) + 1e-6


# (M, N, K): decode M <= 8, prefill above
_SHAPES = [(1, 1, 32), (1, 67, 576), (2, 5, 96), (3, 40, 160), (4, 33, 64), (5, 17, 1536), (7, 9, 224),
           (8, 64, 288), (9, 31, 96), (16, 50, 320), (37, 70, 64)]


def _check_linear_shapes(isa, qtype, shapes, rng, g, blocks, reference):
    """ops.linear on random weights of ``qtype`` (``blocks``: every third "raw", the others "quantized"), random
    x and, on every other shape, a bias, for each (M, N, K) of ``shapes`` (on the scalar ISA the small ones):
    against ``reference(x, w, truth, bias)`` (what the kernels compute) within fp32 accumulation noise, and
    against x W^T within the x-rounding bound."""
    if isa == "scalar":
        shapes = [s for s in shapes if s[0] * s[1] * s[2] <= 200_000]
    for i, (M, N, K) in enumerate(shapes):
        raw = blocks(rng, qtype, N, K, "raw" if i % 3 == 2 else "quantized")
        w = ops.GGUFWeight.from_blocks(raw, int(qtype), K)
        truth = _truth(raw, qtype, N, K)
        x = torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g) * 4
        bias = torch.randn(N, generator=g) if i % 2 else None
        out = torch.full((M, N), float("nan"))
        y = ops.linear(x, w, bias, out=out)
        assert y is out and not torch.isnan(y).any()
        exact = x @ truth.T + (0 if bias is None else bias)
        scale = x.abs() @ truth.abs().T
        what = f"{isa} {qtype.name} M={M} N={N} K={K}"
        expected = reference(x, w, truth, bias)
        assert ((y.to(expected.dtype) - expected).abs() <= 1e-5 * scale + 1e-5).all(), what
        assert ((y - exact).abs() <= _decode_bound(x, truth)).all(), what


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_linear_every_isa(isa, qtype):
    def emulated(x, w, truth, bias):
        return ref.gguf_linear(x, w.file_blocks(), int(qtype), x.shape[1], bias)

    _check_linear_shapes(isa, qtype, _SHAPES, np.random.default_rng(int(qtype)),
                         torch.Generator().manual_seed(int(qtype)), _random_blocks, emulated)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 6, 24])
def test_linear_half_dtypes(dtype, M):
    rng = np.random.default_rng(M)
    N, K = 45, 320
    raw = _random_blocks(rng, Q.Q4_1, N, K, "quantized")
    w = ops.GGUFWeight.from_blocks(raw, int(Q.Q4_1), K)
    truth = _truth(raw, Q.Q4_1, N, K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(dtype)
    bias = torch.randn(N).to(dtype)
    y = ops.linear(x, w, bias)
    assert y.dtype == dtype and y.shape == (M, N)
    xf = x.float()
    exact = xf @ truth.T + bias.float()
    ulp = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)
    bound = 2 * ulp * ((xf.abs() @ truth.abs().T) + exact.abs()) + _decode_bound(xf, truth) + 1e-3
    assert ((y.float() - exact).abs() <= bound).all()


def test_strided_x_leading_dims_and_threads():
    rng = np.random.default_rng(5)
    N, K = 300, 576
    raw = _random_blocks(rng, Q.Q8_0, N, K, "quantized")
    w = ops.GGUFWeight.from_blocks(raw, int(Q.Q8_0), K)
    base = torch.randn(6, 2 * K)
    x = base[:, :K]  # rows 2K apart
    assert x.stride(0) == 2 * K
    y = ops.linear(x, w)
    torch.testing.assert_close(y, ops.linear(x.contiguous(), w), atol=0, rtol=0)
    y3 = ops.linear(x.contiguous().view(2, 3, K), w)
    assert y3.shape == (2, 3, N) and torch.equal(y3.view(6, N), y)
    assert torch.equal(_on_one_thread(x, w), y)  # each output is one thread's, in one order


def _on_one_thread(x, w) -> torch.Tensor:
    """x @ w with the kernels' pool at one thread."""
    before = _C.get_num_threads()
    try:
        ops.set_num_threads(1)
        return ops.linear(x, w)
    finally:
        ops.set_num_threads(before)


def _batch_invariant_call_and_rows(x, w) -> tuple[torch.Tensor, torch.Tensor]:
    """x @ w in one batch-invariant call, and row by row."""
    ops.set_batch_invariant(True)
    try:
        return ops.linear(x, w), torch.cat([ops.linear(x[i:i + 1], w) for i in range(x.shape[0])])
    finally:
        ops.set_batch_invariant(False)


def test_batch_invariant_rows_do_not_depend_on_m():
    rng = np.random.default_rng(6)
    N, K = 70, 256
    w = ops.GGUFWeight.from_blocks(_random_blocks(rng, Q.Q4_0, N, K, "quantized"), int(Q.Q4_0), K)
    full, rows = _batch_invariant_call_and_rows(torch.randn(20, K), w)
    assert torch.equal(full, rows)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("K", [256, 288, 1536])  # whole groups of 8 blocks, one block past a group, 6 groups
def test_batch_invariant_every_isa(isa, qtype, K):
    """A row's bits do not depend on how many rows share its call, on every ISA (the avx512vnni level's zmm block
    pairs and the ymm tail of a row whose blocks are not a multiple of 8 included)."""
    rng = np.random.default_rng(K + int(qtype))
    N = 37
    w = ops.GGUFWeight.from_blocks(_random_blocks(rng, qtype, N, K, "quantized"), int(qtype), K)
    x = torch.randn(11, K, generator=torch.Generator().manual_seed(K))
    full, rows = _batch_invariant_call_and_rows(x, w)
    assert torch.equal(full, rows)
    assert torch.equal(ops.linear(x[:5], w), full[:5])  # GEMV regime without the mode: the same sums


def test_validation():
    rng = np.random.default_rng(7)
    w = ops.GGUFWeight.from_blocks(_random_blocks(rng, Q.Q4_1, 8, 64, "quantized"), int(Q.Q4_1), 64)
    with pytest.raises(ValueError, match="K"):
        ops.linear(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match="bias"):
        ops.linear(torch.randn(2, 64), w, torch.randn(7))
    with pytest.raises(ValueError, match="no GGUF kernel"):
        ops.GGUFWeight.from_blocks(np.zeros((2, 84), np.uint8), int(Q.Q2_K), 256)
    with pytest.raises(ValueError, match="bytes"):
        ops.GGUFWeight.from_blocks(np.zeros((2, 39), np.uint8), int(Q.Q4_1), 64)
    with pytest.raises(ValueError):
        _C.gguf_linear(0, 0, 8, 0, 64, 0, 41, int(Q.Q4_1), 0, 1, 8, 64)  # row_bytes does not match
    with pytest.raises(ValueError):
        _C.gguf_force_isa("avx9000")


def test_fallback_without_native(monkeypatch):
    """Without engine._C the op multiplies by the dequantized weight (torch)."""
    import engine.ops.gguf_quant as gq

    rng = np.random.default_rng(8)
    raw = _random_blocks(rng, Q.Q4_0, 12, 96, "quantized")
    w = ops.GGUFWeight.from_blocks(raw, int(Q.Q4_0), 96)
    x = torch.randn(3, 96)
    monkeypatch.setattr(gq, "native_lib", None)
    torch.testing.assert_close(ops.linear(x, w), x @ _truth(raw, Q.Q4_0, 12, 96).T)


# -- Q5_0 and the K-quants ----------------------------------------------------------------------------------------
# f16 scale offsets in a block (gguf.quants' layouts): Q5_0 d; Q4_K / Q5_K d, dmin; Q6_K d (after ql, qh, scales)
_SCALE_OFFSETS = {Q.Q5_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def _new_blocks(rng, qtype, n, k, mode):
    """n rows of K as GGUF bytes of a new type: "quantized" (gguf's quantizer for Q5_0, the test writer's plain one
    for the K-quants: gguf-py has none), or "raw": random bytes (every quant bit pattern, packed 6-bit scale / min,
    int8 scale) with random finite float16 scales of either sign."""
    from tests.support.gguf_writer import quantize_kquant

    if mode == "quantized":
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)
        return quants.quantize(w, qtype) if qtype == Q.Q5_0 else quantize_kquant(w, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for off in _SCALE_OFFSETS[qtype]:
        scales = rng.uniform(-0.05, 0.05, (n, k // block)).astype(np.float16)
        raw[..., off:off + 2] = scales.view(np.uint8).reshape(n, k // block, 2)
    return raw.reshape(n, -1)


def _quantized_x_times(x, truth):
    """What both regimes compute: x rounded to its Q8 blocks (reference.gguf_quantize_activations) times the exact
    weights, in float64."""
    q, d, _ = ref.gguf_quantize_activations(x)
    return (q * d).reshape(x.shape).double() @ truth.double().T


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("mode", ["quantized", "raw"])
def test_new_types_dequantize_is_gguf_dequantize(qtype, mode):
    rng = np.random.default_rng(int(qtype) * 10 + len(mode))
    n, k = 13, 768
    raw = _new_blocks(rng, qtype, n, k, mode)
    w = ops.GGUFWeight.from_blocks(raw, int(qtype), k)
    truth = _truth(raw, qtype, n, k)
    assert torch.isfinite(truth).all()
    assert torch.equal(w.dequantize(), truth)
    assert w.shape == (n, k) and w.nbytes == raw.nbytes
    assert np.array_equal(w.file_blocks().numpy(), raw)
    if qtype != Q.Q5_0:  # the quantizer the model tests use is close to its input
        x = (np.random.default_rng(1).standard_normal((n, k)) * 0.02).astype(np.float32)
        from tests.support.gguf_writer import quantize_kquant

        back = quants.dequantize(quantize_kquant(x, qtype), qtype)
        assert np.abs(back - x).max() <= 0.1 * np.abs(x).max()


_NEW_SHAPES = {  # (M, N, K): decode M <= 8, prefill above; Q5_0 also takes K not a multiple of 256
    "Q5_0": _SHAPES,
    "K": [(1, 1, 256), (1, 67, 512), (2, 5, 768), (3, 40, 256), (4, 33, 1536), (5, 17, 256), (7, 9, 2304),
          (8, 64, 512), (9, 31, 256), (16, 50, 768), (37, 70, 256)],
}


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_new_types_linear_every_isa(isa, qtype):
    def quantized_x_times(x, w, truth, bias):  # in float64
        return _quantized_x_times(x, truth) + (0 if bias is None else bias.double())

    _check_linear_shapes(isa, qtype, _NEW_SHAPES["Q5_0" if qtype == Q.Q5_0 else "K"],
                         np.random.default_rng(100 + int(qtype)), torch.Generator().manual_seed(int(qtype)),
                         _new_blocks, quantized_x_times)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 24])
def test_kquant_half_dtypes(qtype, dtype, M):
    rng = np.random.default_rng(M + int(qtype))
    N, K = 45, 512
    raw = _new_blocks(rng, qtype, N, K, "quantized")
    w = ops.GGUFWeight.from_blocks(raw, int(qtype), K)
    truth = _truth(raw, qtype, N, K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(dtype)
    bias = torch.randn(N).to(dtype)
    y = ops.linear(x, w, bias)
    assert y.dtype == dtype and y.shape == (M, N)
    xf = x.float()
    exact = xf @ truth.T + bias.float()
    ulp = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)
    bound = 2 * ulp * ((xf.abs() @ truth.abs().T) + exact.abs()) + _decode_bound(xf, truth) + 1e-3
    assert ((y.float() - exact).abs() <= bound).all()


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q6_K], ids=lambda t: t.name)
def test_new_types_batch_invariant_rows_do_not_depend_on_m(qtype):
    rng = np.random.default_rng(6)
    N, K = 70, 512
    w = ops.GGUFWeight.from_blocks(_new_blocks(rng, qtype, N, K, "quantized"), int(qtype), K)
    x = torch.randn(20, K)
    ops.set_batch_invariant(True)
    try:
        full = ops.linear(x, w)
        rows = torch.cat([ops.linear(x[i:i + 1], w) for i in range(20)])
    finally:
        ops.set_batch_invariant(False)
    assert torch.equal(full, rows)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_kquant_needs_k_multiple_of_256(qtype):
    """K-quant super-blocks are 256 wide: another K is refused clearly, in Python and in the native entry point."""
    size = GGML_QUANT_SIZES[qtype][1]
    with pytest.raises(ValueError, match="multiple of 256"):
        ops.GGUFWeight.from_blocks(np.zeros((2, size), np.uint8), int(qtype), 288)
    out, x, w = torch.empty(1, 2), torch.zeros(1, 288), torch.zeros(2, size, dtype=torch.uint8)
    with pytest.raises(ValueError, match="multiple of 256"):
        _C.gguf_linear(0, out.data_ptr(), 2, x.data_ptr(), 288, w.data_ptr(), size, int(qtype), 0, 1, 2, 288)
    with pytest.raises(ValueError):  # row_bytes of another K
        _C.gguf_linear(0, out.data_ptr(), 2, x.data_ptr(), 256, w.data_ptr(), size - 1, int(qtype), 0, 1, 2, 256)


def test_new_type_fallback_without_native(monkeypatch):
    import engine.ops.gguf_quant as gq

    rng = np.random.default_rng(9)
    raw = _new_blocks(rng, Q.Q4_K, 12, 256, "quantized")
    w = ops.GGUFWeight.from_blocks(raw, int(Q.Q4_K), 256)
    x = torch.randn(3, 256)
    monkeypatch.setattr(gq, "native_lib", None)
    torch.testing.assert_close(ops.linear(x, w), x @ _truth(raw, Q.Q4_K, 12, 256).T)


# -- fused weights whose parts differ in type (GGUFSegments) -------------------------------------------------------
# A Q4_K_M file's q/k (Q4_K) and v (Q6_K), or gate (Q4_K) and up (Q5_0), fused into one linear: fuse_rows keeps a
# segment per run of one type, and gguf_linear runs each segment's native call into its columns of one output.


def _segment_parts(rng, types, rows, k):
    raws = [_new_blocks(rng, t, n, k, "quantized") if t in NEW_TYPES else _random_blocks(rng, t, n, k, "quantized")
            for t, n in zip(types, rows)]
    return raws, [ops.GGUFWeight.from_blocks(r, int(t), k) for r, t in zip(raws, types)]


def test_fuse_rows_merges_runs_of_one_type():
    from engine.ops.gguf_quant import GGUFSegments, fuse_rows

    rng = np.random.default_rng(21)
    _, parts = _segment_parts(rng, [Q.Q4_K, Q.Q4_K, Q.Q6_K], [16, 8, 8], 256)
    w = fuse_rows(parts)
    assert isinstance(w, GGUFSegments) and [p.type_name for p in w.parts] == ["Q4_K", "Q6_K"]
    assert w.shape == (32, 256) and w.nbytes == sum(p.nbytes for p in parts) and w.type_name == "Q4_K+Q6_K"
    assert torch.equal(w.parts[0].data, torch.cat([parts[0].data, parts[1].data]))
    assert torch.equal(w.dequantize(), torch.cat([p.dequantize() for p in parts]))
    one = fuse_rows(parts[:2])  # one type: one GGUFWeight, one call, as before
    assert isinstance(one, ops.GGUFWeight) and one.shape == (24, 256)
    with pytest.raises(ValueError, match="one K"):
        fuse_rows([parts[0], ops.GGUFWeight.from_blocks(_new_blocks(rng, Q.Q4_K, 2, 512, "quantized"),
                                                        int(Q.Q4_K), 512)])


@pytest.mark.parametrize("types", [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q4_K, Q.Q5_0), (Q.Q8_0, Q.Q4_0, Q.Q5_K)],
                         ids=lambda ts: "+".join(t.name for t in ts))
@pytest.mark.parametrize("M", [1, 5, 24])
def test_segments_linear_is_each_parts_linear(isa, types, M):
    """Each segment's columns are exactly (bit for bit) what its own weight gives alone, bias and strided output
    included, in both regimes, on every ISA; and they agree with the dequantized product within the x-rounding
    bound."""
    from engine.layers.linear import LinearBase
    from engine.ops.gguf_quant import fuse_rows

    rng = np.random.default_rng(30 + M)
    g = torch.Generator().manual_seed(M)
    rows = [24, 8, 8][: len(types)]
    k = 512
    raws, parts = _segment_parts(rng, types, rows, k)
    w = fuse_rows(parts)
    n = sum(rows)
    x = torch.randn(M, k, generator=g)
    bias = torch.randn(n, generator=g)
    buf = torch.full((M, n + 7), float("nan"))
    y = ops.gguf_linear(x, w, bias, out=buf[:, 3:3 + n])
    assert not torch.isnan(y).any() and torch.isnan(buf[:, :3]).all() and torch.isnan(buf[:, 3 + n:]).all()
    row = 0
    for p in parts:
        alone = ops.linear(x, p, bias[row:row + p.shape[0]])
        assert torch.equal(y[:, row:row + p.shape[0]], alone), (isa, p.type_name)
        row += p.shape[0]
    truth = torch.cat([_truth(r, t, rn, k) for r, t, rn in zip(raws, types, rows)])
    assert ((y - (x @ truth.T + bias)).abs() <= _decode_bound(x, truth)).all()
    # through a linear layer, 3-D x, no bias
    layer = LinearBase(k, n, False, torch.float32)
    layer.gguf = w
    x3 = x.reshape(1, M, k)
    assert torch.equal(layer(x3)[0], ops.gguf_linear(x, w))


def test_segments_fallback_without_native(monkeypatch):
    import engine.ops.gguf_quant as gq

    rng = np.random.default_rng(22)
    raws, parts = _segment_parts(rng, [Q.Q4_K, Q.Q6_K], [12, 4], 256)
    w = gq.fuse_rows(parts)
    x = torch.randn(3, 256)
    monkeypatch.setattr(gq, "native_lib", None)
    truth = torch.cat([_truth(raws[0], Q.Q4_K, 12, 256), _truth(raws[1], Q.Q6_K, 4, 256)])
    torch.testing.assert_close(ops.gguf_linear(x, w), x @ truth.T)


@pytest.mark.parametrize("types", [(Q.Q4_0,), (Q.Q4_K, Q.Q6_K), (Q.Q4_1, Q.Q5_0, Q.Q8_0)],
                         ids=lambda t: "+".join(q.name for q in t))
def test_bf16_large_m_runs_the_native_gemm_on_dequantized_panels(monkeypatch, isa, types):
    """bfloat16 calls of PANEL_GEMM_MIN_M rows or more without AMX: weights of one type or segments of several,
    panels smaller than a segment (so a segment spans panels), bias, rows of x and of out strided: the dequantized
    weights times x (not quantized) within bfloat16 rounding of the product; fewer rows keep the native panels."""
    from engine.ops import gguf_quant

    from engine.ops import native

    monkeypatch.setattr(native.mode, "amx", False)  # KernelConfig.cpu_amx="off": the native GEMM, not oneDNN
    monkeypatch.setattr(gguf_quant, "_PANEL_ELEMS", 70 * 512)  # 70 rows per panel
    seen = []
    route = gguf_quant._dequantized_native_linear
    monkeypatch.setattr(gguf_quant, "_dequantized_native_linear", lambda *a: seen.append(1) or route(*a))
    rng = np.random.default_rng(len(types))
    parts = []
    for i, t in enumerate(types):
        w = (rng.standard_normal((160 + 32 * i, 512)) * 0.05).astype(np.float32)
        if t in (Q.Q4_K, Q.Q6_K):
            from tests.support.gguf_writer import quantize_kquant
            raw = quantize_kquant(w, t)
        else:
            raw = quants.quantize(w, t)
        parts.append(ops.GGUFWeight.from_blocks(raw, int(t), 512))
    w = gguf_quant.fuse_rows(parts)
    N = w.shape[0]
    truth = w.dequantize(torch.float32)
    g = torch.Generator().manual_seed(3)
    for M in (gguf_quant.PANEL_GEMM_MIN_M, 61):
        x = torch.randn(M, 600, generator=g).to(torch.bfloat16)[:, 40:552]  # rows 600 apart
        bias = torch.randn(N, generator=g).to(torch.bfloat16)
        out = torch.full((M, N + 9), float("nan"), dtype=torch.bfloat16)[:, 4:N + 4]
        ops.linear(x, w, bias, out=out)
        exact = x.float() @ truth.T + bias.float()
        # the panel rounds each weight to bfloat16 (2^-9 relative), the GEMM accumulates in fp32, out is rounded
        bound = 2.0 ** -8 * ((x.float().abs() @ truth.abs().T) + exact.abs()) + 1e-3
        assert not torch.isnan(out).any() and ((out.float() - exact).abs() <= bound).all(), (isa, M)
    assert len(seen) == 2
    ops.linear(torch.randn(gguf_quant.PANEL_GEMM_MIN_M - 1, 512).to(torch.bfloat16), w)
    ops.linear(torch.randn(40, 512), w)  # float32: the native panels
    ops.set_batch_invariant(True)
    try:
        ops.linear(torch.randn(40, 512).to(torch.bfloat16), w)
    finally:
        ops.set_batch_invariant(False)
    assert len(seen) == 2


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_weight_rows_result_does_not_depend_on_its_neighbours(isa, qtype):
    """Every weight row comes out with the same bits whatever rows share its call or its chunk: alone (a one-row
    weight), shifted by one row, on 1 or 2 threads (the chunks of the pool split the rows differently)."""
    rng = np.random.default_rng(int(qtype) + 7)
    N, K = 301, 576
    raw = _random_blocks(rng, qtype, N, K, "quantized")
    w = ops.GGUFWeight.from_blocks(raw, int(qtype), K)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(9))
    y = ops.linear(x, w)
    assert torch.equal(_on_one_thread(x, w), y)
    for n in (0, 1, 150, 299, 300):
        alone = ops.GGUFWeight(w.data[n:n + 1].contiguous(), w.qtype, K)
        assert torch.equal(ops.linear(x, alone)[:, 0], y[:, n]), (isa, n)
    shifted = ops.GGUFWeight(w.data[1:].contiguous(), w.qtype, K)  # every pair now pairs other rows
    assert torch.equal(ops.linear(x, shifted), y[:, 1:])
