"""The Triton kernel of the fused MoE path; engine/ops/fused_moe.py is its Python face, plan and reference (read that
first). Imported on first use: importing Triton costs ~0.5 s, and the interpreter (TRITON_INTERPRET=1, CPU tests)
must be chosen before Triton is imported.

One launch computes, for every expert at once, C[r] = A[r // TOP_K] @ W[e]^T (times the routing weight of r with
MUL_WEIGHT) for the rows r of the sorted, block-aligned choice list: each program owns BLOCK_M rows of one expert
(every block holds one expert's rows only, padded with the sentinel row id NUM_ROWS, which is neither read nor
written) and BLOCK_N output columns, and walks K in BLOCK_K steps with the expert's weight tile [BLOCK_K, BLOCK_N]
read straight from the stacked [E, N, K] weights. Accumulation in float32; float32 inputs use exact fp32 dots
(no TF32). UPCAST (set by the host for bfloat16 CPU tensors, which only the interpreter runs) converts the tiles
to float32 before the dot: the interpreter of Triton 3.x computes bf16 dots wrongly (|error| ~ 1e10 on a
16 x 32 x 16 product)"""

import triton
import triton.language as tl


@triton.jit
def fused_moe_kernel(
    A, W, C, ROUTE_W, SORTED_ROWS, BLOCK_EXPERT,
    N, K, NUM_ROWS, NUM_EXPERTS,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
    TOP_K: tl.constexpr, MUL_WEIGHT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    expert = tl.load(BLOCK_EXPERT + pid_m)
    if expert >= NUM_EXPERTS:  # a block past the last expert's rows
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(SORTED_ROWS + offs_m)
    row_ok = rows < NUM_ROWS
    a_rows = rows // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = W + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k + k0 < K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:  # the interpreter's bf16 dot is wrong (Triton 3.x): it gets float32 tiles
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    if MUL_WEIGHT:
        rw = tl.load(ROUTE_W + rows, mask=row_ok, other=0.0)
        acc = acc * rw[:, None]
    c_ptrs = C + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])
