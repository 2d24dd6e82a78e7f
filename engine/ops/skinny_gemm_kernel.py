"""The Triton kernel of engine/ops/skinny_gemm.py (imported only where Triton is installed): it streams the weight
[N, K] (K contiguous) once, BLOCK_N rows per program, in BLOCK_K-wide tiles, with fp32 accumulation and one
rounding to the output dtype at the end (after the bias)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row of x (batch-1 decode): elementwise products accumulated in a [BLOCK_N, BLOCK_K] fp32 tile, reduced
    over K once at the end (no shuffle per tile). PDL: launched as a programmatic dependent of the kernel before
    it (launch_pdl), so every program first waits for that grid's completion and memory (x is its output)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            x = tl.load(x_ptr + kk)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
        else:
            kmask = kk < K
            x = tl.load(x_ptr + kk, mask=kmask, other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)

