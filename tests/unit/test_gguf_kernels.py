"""GGUF quantized-weight kernels (csrc/cpu/gguf*.cpp, engine/ops/gguf_quant.py) against the `gguf` package's own
dequantization (gguf.quants.dequantize, the ground truth), for Q4_0, Q4_1 and Q8_0 on every ISA level this machine
has (forced through engine._C.gguf_force_isa).

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
from gguf import GGMLQuantizationType as Q
from gguf import quants

from engine import ops
from engine.ops import reference as ref

_C = pytest.importorskip("engine._C")

TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]
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


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_linear_every_isa(isa, qtype):
    rng = np.random.default_rng(int(qtype))
    g = torch.Generator().manual_seed(int(qtype))
    shapes = [(1, 1, 32), (1, 67, 576), (2, 5, 96), (3, 40, 160), (4, 33, 64), (5, 17, 1536), (7, 9, 224),
              (8, 64, 288), (9, 31, 96), (16, 50, 320), (37, 70, 64)]
    if isa == "scalar":
        shapes = [s for s in shapes if s[0] * s[1] * s[2] <= 200_000]
    for i, (M, N, K) in enumerate(shapes):
        raw = _random_blocks(rng, qtype, N, K, "raw" if i % 3 == 2 else "quantized")
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
        emulated = ref.gguf_linear(x, w.file_blocks(), int(qtype), K, bias)
        assert ((y - emulated).abs() <= 1e-5 * scale + 1e-5).all(), what
        assert ((y - exact).abs() <= _decode_bound(x, truth)).all(), what


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
    before = _C.get_num_threads()
    try:
        ops.set_num_threads(1)
        y1 = ops.linear(x, w)
    finally:
        ops.set_num_threads(before)
    assert torch.equal(y1, y)  # each output is one thread's, in one order


def test_batch_invariant_rows_do_not_depend_on_m():
    rng = np.random.default_rng(6)
    N, K = 70, 256
    w = ops.GGUFWeight.from_blocks(_random_blocks(rng, Q.Q4_0, N, K, "quantized"), int(Q.Q4_0), K)
    x = torch.randn(20, K)
    ops.set_batch_invariant(True)
    try:
        full = ops.linear(x, w)
        rows = torch.cat([ops.linear(x[i:i + 1], w) for i in range(20)])
    finally:
        ops.set_batch_invariant(False)
    assert torch.equal(full, rows)


def test_validation():
    rng = np.random.default_rng(7)
    w = ops.GGUFWeight.from_blocks(_random_blocks(rng, Q.Q4_1, 8, 64, "quantized"), int(Q.Q4_1), 64)
    with pytest.raises(ValueError, match="K"):
        ops.linear(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match="bias"):
        ops.linear(torch.randn(2, 64), w, torch.randn(7))
    with pytest.raises(ValueError, match="no GGUF kernel"):
        ops.GGUFWeight.from_blocks(np.zeros((2, 144), np.uint8), int(Q.Q4_K), 256)
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
