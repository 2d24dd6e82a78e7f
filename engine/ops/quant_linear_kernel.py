"""The Triton kernels of engine/ops/quant_linear.py (imported only where Triton is installed).

Codes (``CODE``): 0 = 4-bit codes packed eight to an int32 along K (position 8j + i in bits 4i..4i+3), 1 = uint8
codes, 2 = float8 e4m3 values. A weight is ``(code - zero) * scale`` (fp8: no zero), with the scale of output row n
and K group g at ``s_ptr + (n // S_ROWS) * stride_sn + g * stride_sg`` (per tensor: both strides 0; fp8 blocks:
S_ROWS = 128), and the zero code at ``z_ptr + n * stride_zn + g``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _codes(q_ptr, rn, nmask, k0, K, CODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] tile of codes at rows rn, K positions k0 .. k0 + BLOCK_K (int32, or fp8 values)."""
    rows = rn.to(tl.int64)[:, None]
    if CODE == 0:
        kw = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(q_ptr + rows * (K // 8) + kw[None, :], mask=nmask[:, None], other=0)
        shifts = tl.arange(0, 8) * 4
        c = (packed[:, :, None] >> shifts[None, None, :]) & 0xF
        return tl.reshape(c, (BLOCK_N, BLOCK_K))
    kk = k0 + tl.arange(0, BLOCK_K)
    if CODE == 1:
        return tl.load(q_ptr + rows * K + kk[None, :], mask=nmask[:, None], other=0)
    # fp8: rows past N are left undefined (they only reach outputs that are not stored)
    return tl.load(q_ptr + rows * K + kk[None, :], mask=nmask[:, None])


@triton.jit
def quant_mm_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_ym, stride_sn, stride_sg,
                    stride_zn, CODE: tl.constexpr, GROUP: tl.constexpr, S_ROWS: tl.constexpr,
                    HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr, F32_DOT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y = x @ W^T (+ bias), x [M, K]: program (i, j) computes rows j * BLOCK_M .. of output columns i * BLOCK_N ..,
    streaming those BLOCK_N rows of the packed weight once (decode batches: one program row, M <= BLOCK_M). Per group the codes themselves go through the tensor cores (exact in x's dtype: integers below 256, or
    e4m3 values), and the group's scale and zero are applied to the group's partial sums:
    sum_k x_k (c_k - z) s = s * (sum_k x_k c_k - z * sum_k x_k). BLOCK_K divides GROUP, GROUP divides K.
    F32_DOT: the products in float32 (Triton's interpreter, whose bf16 dot is wrong; same values)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = rm < M
    srow = rn // S_ROWS
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, K, GROUP):
        part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        xsum = tl.zeros([BLOCK_M], dtype=tl.float32)
        for t in range(0, GROUP, BLOCK_K):
            kk = g0 + t + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=mmask[:, None], other=0.0)
            # through float32: exact for codes below 256 and e4m3 values (the interpreter bit-casts int -> bf16)
            w = _codes(q_ptr, rn, nmask, g0 + t, K, CODE, BLOCK_N, BLOCK_K).to(tl.float32)
            if F32_DOT:
                part = tl.dot(x.to(tl.float32), tl.trans(w), part, input_precision="ieee")
            else:
                part = tl.dot(x, tl.trans(w.to(x.dtype)), part)
            if HAS_ZERO:
                xsum += tl.sum(x.to(tl.float32), axis=1)
        g = g0 // GROUP
        s = tl.load(s_ptr + srow * stride_sn + g * stride_sg, mask=nmask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            z = tl.load(z_ptr + rn * stride_zn + g, mask=nmask, other=0).to(tl.float32)
            acc += (part - xsum[:, None] * z[None, :]) * s[None, :]
        else:
            acc += part * s[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


@triton.jit
def dequantize_kernel(q_ptr, s_ptr, z_ptr, perm_ptr, w_ptr, N, K, stride_sn, stride_sg, stride_zn,
                      CODE: tl.constexpr, GROUP: tl.constexpr, S_ROWS: tl.constexpr, HAS_ZERO: tl.constexpr,
                      HAS_PERM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W [N, K] in w_ptr's dtype, one [BLOCK_N, BLOCK_K] tile per program (BLOCK_K divides GROUP); act-order weights
    (HAS_PERM) are written back to the checkpoint's order: stored position k goes to column perm[k]."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    nmask = rn < N
    c = _codes(q_ptr, rn, nmask, k0, K, CODE, BLOCK_N, BLOCK_K).to(tl.float32)
    g = k0 // GROUP
    s = tl.load(s_ptr + (rn // S_ROWS) * stride_sn + g * stride_sg, mask=nmask, other=0.0).to(tl.float32)
    if HAS_ZERO:
        z = tl.load(z_ptr + rn * stride_zn + g, mask=nmask, other=0).to(tl.float32)
        c = c - z[:, None]
    w = c * s[:, None]
    kk = k0 + tl.arange(0, BLOCK_K)
    if HAS_PERM:
        kk = tl.load(perm_ptr + kk)
    tl.store(w_ptr + rn.to(tl.int64)[:, None] * K + kk[None, :], w.to(w_ptr.dtype.element_ty), mask=nmask[:, None])


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
