"""The Triton kernel of engine/ops/skinny_gemm.py (imported only where Triton is installed): it streams the weight
[N, K] (K contiguous) once, BLOCK_N rows per program, in BLOCK_K-wide tiles, with fp32 accumulation and one
rounding to the output dtype at the end (after the bias)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _prefetch_l2(ptrs):
    """A hint that pulls the 128-byte lines at ``ptrs`` into the L2 cache; nothing is loaded into registers."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                PDL: tl.constexpr, EARLY: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row of x (batch-1 decode): elementwise products accumulated in a [BLOCK_N, BLOCK_K] fp32 tile, reduced
    over K once at the end (no shuffle per tile).

    PDL: launched as a programmatic dependent of the kernel before it (launch_pdl): the programs that are resident
    while that kernel still runs wait for its completion and memory (x is its output) before reading x. The
    weights do not depend on it, so with EARLY >= 1 a program requests its first weight tile (into registers)
    before waiting, and with EARLY > 1 also its next EARLY - 1 tiles into the L2 cache: the weight stream starts
    under the kernel before instead of after it. EARLY = 0: the whole program waits at entry."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # the kernel after it (norm, rope, silu_and_mul) may launch now
    if PDL and EARLY == 0:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    if EVEN_K:
        w = tl.load(w_rows + rk[None, :], mask=nmask[:, None], other=0.0)
    else:
        w = tl.load(w_rows + rk[None, :], mask=nmask[:, None] & (rk < K)[None, :], other=0.0)
    if PDL and EARLY > 1:
        lines = tl.arange(0, BLOCK_K // 64) * 64  # one hint per 128 bytes of a row (2-byte weights)
        rows = w_ptr + tl.minimum(rn, N - 1).to(tl.int64)[:, None] * K
        for t in tl.static_range(1, EARLY):
            if t * BLOCK_K < K:
                _prefetch_l2(rows + (t * BLOCK_K + lines)[None, :])
    if PDL and EARLY > 0:
        tl.extra.cuda.gdc_wait()
    if EVEN_K:
        x = tl.load(x_ptr + rk)
    else:
        x = tl.load(x_ptr + rk, mask=rk < K, other=0.0)
    acc = w.to(tl.float32) * x.to(tl.float32)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
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
