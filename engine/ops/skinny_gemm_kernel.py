"""The Triton kernel of engine/ops/skinny_gemm.py (imported only where Triton is installed): it streams the weight
[N, K] (K contiguous) once, BLOCK_N rows per program, in BLOCK_K-wide tiles, with fp32 accumulation and one
rounding to the output dtype at the end (after the bias)."""

from __future__ import annotations

import triton
import triton.language as tl

# Triton's griddepcontrol.launch_dependents (3.4+, with gdc_wait): a GEMV then lets the next programmatic dependent
# (the down projection's GEMV after the gated gate_up one) launch while its last programs run
CAN_TRIGGER = hasattr(tl.extra.cuda, "gdc_launch_dependents")


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                GATED: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """One row of x (batch-1 decode): elementwise products accumulated in a [BLOCK_N, BLOCK_K] fp32 tile, reduced
    over K once at the end (no shuffle per tile). PDL: launched as a programmatic dependent of the kernel before
    it (launch_pdl), so every program first waits for that grid's completion and memory (x is its output).
    TRIGGER: each program allows the next programmatic dependent to launch as it starts (that kernel still waits
    for this grid's completion and memory before it reads anything).
    GATED (the MLP's gate_up projection, no bias): the weight is [2N, K] = [gate | up] and y [N] is
    silu_and_mul of the product: each program takes BLOCK_N gate rows and the BLOCK_N up rows of the same outputs,
    rounds both sums to the output dtype as the plain GEMV's store would, then applies silu(gate) * up with
    ops.silu_and_mul's rounding (T(T(silu(gate)) * up)), so the [2N] product is never written."""
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    u_rows = w_ptr + (rn + N).to(tl.int64)[:, None] * K  # GATED: the up rows
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            x = tl.load(x_ptr + kk)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
            if GATED:
                wu = tl.load(u_rows + kk[None, :], mask=nmask[:, None], other=0.0)
        else:
            kmask = kk < K
            x = tl.load(x_ptr + kk, mask=kmask, other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            if GATED:
                wu = tl.load(u_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        xf = x.to(tl.float32)[None, :]
        acc += w.to(tl.float32) * xf
        if GATED:
            acc_up += wu.to(tl.float32) * xf
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    if GATED:
        gate = y.to(y_ptr.dtype.element_ty).to(tl.float32)
        up = tl.sum(acc_up, axis=1).to(y_ptr.dtype.element_ty).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(y_ptr.dtype.element_ty).to(tl.float32)
        y = act * up
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)
