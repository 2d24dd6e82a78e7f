"""The Triton kernel of engine/ops/skinny_gemm.py (imported only where Triton is installed): it streams the weight
[N, K] (K contiguous) once, BLOCK_N rows per program, in BLOCK_K-wide tiles, with fp32 accumulation and one
rounding to the output dtype at the end (after the bias). GATED: the MLP's gate_up projection with its SiLU-gated
activation in the epilogue (each program's rows are gate / up pairs)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                PDL: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """One row of x (batch-1 decode): elementwise products accumulated in a [BLOCK_N, BLOCK_K] fp32 tile, reduced
    over K once at the end (no shuffle per tile).

    PDL: launched as a programmatic dependent of the kernel before it (launch_pdl): the programs that are resident
    while that kernel still runs wait for its completion and memory (x is its output) before reading x. The
    weights do not depend on it, so a program loads its first two weight tiles into registers before it waits: the
    weight stream starts under the kernel before instead of after it (the tiles are added in order). Two tiles won
    the measurement against one and none (H200 b1 TPOT 4.28 / 4.35 / 4.44 ms, docs/benchmarks/gpu_decode_2026-12-05.md);
    the others were deleted with KESTREL_GEMV_EARLY (issue 46).

    GATED (no bias): w is [gate; up], N = 2I rows; a program computes BLOCK_N // 2 outputs, streaming the rows
    gate i, up i, gate i+1, up i+1, ..., and stores y [I] = T(T(silu(T(gate))) * T(up)) with T the rounding to the
    output dtype, as silu_and_mul of the rounded projection computes it (csrc/cuda/norm_act.cu)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # the kernel after it (norm, rope, silu_and_mul) may launch now
    pid = tl.program_id(0)
    if GATED:
        j = tl.arange(0, BLOCK_N)
        out_row = pid * (BLOCK_N // 2) + j // 2
        rn = out_row + (j % 2) * (N // 2)  # gate row, then its up row
        nmask = out_row < N // 2
    else:
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rn < N
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    if EVEN_K:
        w = tl.load(w_rows + rk[None, :], mask=nmask[:, None], other=0.0)
    else:
        w = tl.load(w_rows + rk[None, :], mask=nmask[:, None] & (rk < K)[None, :], other=0.0)
    rk1 = BLOCK_K + rk
    w1 = tl.load(w_rows + rk1[None, :], mask=nmask[:, None] & (rk1 < K)[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if EVEN_K:
        x = tl.load(x_ptr + rk)
    else:
        x = tl.load(x_ptr + rk, mask=rk < K, other=0.0)
    acc = w.to(tl.float32) * x.to(tl.float32)[None, :]
    x1 = tl.load(x_ptr + rk1, mask=rk1 < K, other=0.0)
    acc += w1.to(tl.float32) * x1.to(tl.float32)[None, :]
    for k0 in range(2 * BLOCK_K, K, BLOCK_K):
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
    if GATED:
        gate, up = tl.split(tl.reshape(y.to(y_ptr.dtype.element_ty).to(tl.float32), (BLOCK_N // 2, 2)))
        act = (gate / (1.0 + tl.exp(-gate))).to(y_ptr.dtype.element_ty).to(tl.float32)
        ro = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(y_ptr + ro, (act * up).to(y_ptr.dtype.element_ty), mask=ro < N // 2)
    else:
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)
