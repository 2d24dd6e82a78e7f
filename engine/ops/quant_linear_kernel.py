"""The Triton kernels of engine/ops/quant_linear.py (imported only where Triton is installed): fp8 weights.

(Integer weights run on the tensor-core kernels of csrc/cuda/int_gemm.cu, engine/ops/int_mma.py. The Triton integer
kernels on the "chunk" layout were deleted, issue 46: on an H100, 2026-12-07, batch-1 decode int4 1.58x / int8
1.27x bf16 with the tensor-core kernels (docs/benchmarks/gpu_quant_2026-12-07.md) against 0.75x / 0.71x with these
(the same H100's `kestrel bench quant --skip kernels` at the default of then).)

Float8 weights (Fp8Weight): e4m3 values [N, K] converted to x's dtype in registers; the scale of output row n and K
group g at ``s_ptr + (n // S_ROWS) * stride_sn + g * stride_sg`` (per tensor: both strides 0; 128 x 128 blocks:
S_ROWS = 128).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp8_mm_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_ym, stride_sn, stride_sg,
                  GROUP: tl.constexpr, S_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
                  F32_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y = x @ W^T (+ bias) for e4m3 weights: program (i, j) computes rows j * BLOCK_M .. of output columns
    i * BLOCK_N ..; per scale group (GROUP positions: 128 for blocks, K per channel / tensor) the values go through
    the tensor cores in x's dtype (exact: e4m3 fits bf16 and fp16) and the scale multiplies the group's sums.
    BLOCK_K divides GROUP, GROUP divides K. F32_DOT: float32 products (the interpreter, whose bf16 dot is wrong)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = rm < M
    srow = rn // S_ROWS
    rows = rn.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, K, GROUP):
        part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for t in range(0, GROUP, BLOCK_K):
            kk = g0 + t + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=mmask[:, None], other=0.0)
            # rows past N are left undefined: they reach only outputs that are not stored
            w = tl.load(q_ptr + rows + kk[None, :], mask=nmask[:, None]).to(tl.float32)
            if F32_DOT:
                part = tl.dot(x.to(tl.float32), tl.trans(w), part, input_precision="ieee")
            else:
                part = tl.dot(x, tl.trans(w.to(x.dtype)), part)
        s = tl.load(s_ptr + srow * stride_sn + (g0 // GROUP) * stride_sg, mask=nmask, other=0.0).to(tl.float32)
        acc += part * s[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


@triton.jit
def fp8_dequantize_kernel(q_ptr, s_ptr, w_ptr, N, K, stride_sn, stride_sg, GROUP: tl.constexpr, S_ROWS: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W [N, K] in w_ptr's dtype from e4m3 values and their scales, one [BLOCK_N, BLOCK_K] tile per program
    (BLOCK_K divides GROUP)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    nmask = rn < N
    kk = k0 + tl.arange(0, BLOCK_K)
    rows = rn.to(tl.int64)[:, None] * K
    w = tl.load(q_ptr + rows + kk[None, :], mask=nmask[:, None]).to(tl.float32)
    s = tl.load(s_ptr + (rn // S_ROWS) * stride_sn + (k0 // GROUP) * stride_sg, mask=nmask, other=0.0).to(tl.float32)
    tl.store(w_ptr + rows + kk[None, :], (w * s[:, None]).to(w_ptr.dtype.element_ty), mask=nmask[:, None])


@triton.jit
def fp8_per_token_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCK_K: tl.constexpr):
    """One row of x per program: its absmax / 448 into s_ptr[row] (float32; 1 for a zero row), the row divided by
    it and rounded to e4m3 into q_ptr (contiguous rows). Two passes over the row (it stays in L1/L2)."""
    row = tl.program_id(0)
    xr = x_ptr + row.to(tl.int64) * stride_xm
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        amax = tl.maximum(amax, tl.abs(tl.load(xr + kk, mask=kk < K, other=0.0).to(tl.float32)))
    m = tl.max(amax, axis=0)
    scale = tl.where(m > 0, m / 448.0, 1.0)
    tl.store(s_ptr + row, scale)
    qr = q_ptr + row.to(tl.int64) * K
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(xr + kk, mask=kk < K, other=0.0).to(tl.float32) / scale
        v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        tl.store(qr + kk, v.to(q_ptr.dtype.element_ty), mask=kk < K)
