"""The Triton kernel of engine/ops/skinny_gemm.py (imported only where Triton is installed): it streams the weight
[N, K] (K contiguous) once, BLOCK_N rows per program, in BLOCK_K-wide tiles, with fp32 accumulation and one
rounding to the output dtype at the end (after the bias).

Its input row may come out of a fused prologue (PROLOGUE), recomputed by every program from the previous kernel's
output, which then needs no kernel of its own:
- 0: x as it is;
- 1: RMSNorm with the residual add: h = T(x + residual) (h = x without a residual), x = T(T(h * inv_rms(h)) * nw),
  the rounding of engine.ops.fused_add_rms_norm; program 0 stores h into ``r_out`` (the layer's next residual);
- 2: SiLU-and-mul of a [2K] gate|up row: x = T(T(silu(gate)) * up), engine.ops.silu_and_mul's rounding."""

from __future__ import annotations

import triton
import triton.language as tl

PLAIN, ADD_RMSNORM, SILU_MUL = 0, 1, 2


@triton.jit
def _input_tile(x_ptr, r_ptr, nw_ptr, kk, kmask, inv, PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, K,
                EVEN_K: tl.constexpr):
    """The tile kk of the GEMV's input row in fp32 (after the prologue, rounded as the unfused kernels round)."""
    dt = x_ptr.dtype.element_ty
    if PROLOGUE == 1:
        h = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        if HAS_RES:
            h = (h + tl.load(r_ptr + kk, mask=kmask, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
        nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        return ((h * inv).to(dt).to(tl.float32) * nw).to(dt).to(tl.float32)
    elif PROLOGUE == 2:
        g = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + K + kk, mask=kmask, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        return (s * u).to(dt).to(tl.float32)
    elif EVEN_K:
        return tl.load(x_ptr + kk).to(tl.float32)
    else:
        return tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, r_out_ptr, N, K, eps,
                PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row of x (batch-1 decode): elementwise products accumulated in a [BLOCK_N, BLOCK_K] fp32 tile, reduced
    over K once at the end (no shuffle per tile)."""
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    inv = 0.0
    if PROLOGUE == 1:  # the statistics of h over the whole row, then the tiles normalised on the fly
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            kmask = kk < K
            h = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            if HAS_RES:
                h = (h + tl.load(r_ptr + kk, mask=kmask, other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
                h = h.to(tl.float32)
                if pid == 0:
                    tl.store(r_out_ptr + kk, h.to(r_out_ptr.dtype.element_ty), mask=kmask)
            ss += h * h
        inv = tl.math.rsqrt(tl.sum(ss, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            x = _input_tile(x_ptr, r_ptr, nw_ptr, kk, kk < K, inv, PROLOGUE, HAS_RES, K, EVEN_K)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
        else:
            kmask = kk < K
            x = _input_tile(x_ptr, r_ptr, nw_ptr, kk, kmask, inv, PROLOGUE, HAS_RES, K, EVEN_K)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)
