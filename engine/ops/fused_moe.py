"""Fused MoE on the GPU (Triton), as vLLM's fused_moe: the experts of a layer in two grouped launches.

The [T, k] expert choices are sorted by expert and each expert's run padded to a multiple of BLOCK_M
(``align_block_size``: sorted row ids, the sentinel T * k for padding, and the expert of every block), all in torch
ops on the device with sizes fixed by T, k, E and BLOCK_M (the most blocks the padding can need), so no host
synchronisation (CUDA-graph safe). Then one launch of the grouped GEMM (engine/ops/fused_moe_kernel.py) for every
expert's gate_up on its tokens -> [T * k, 2I], SiLU-and-mul (ops.silu_and_mul) -> [T * k, I], one launch for down
with the routing weight folded into its epilogue -> [T * k, H], and the sum of each token's k rows.

``fused_moe_reference`` is the plain torch loop over experts it must equal (the tests' reference; fp32 accumulation).

Why Triton: one kernel serves every shape and dtype without a native build, and the interpreter (TRITON_INTERPRET=1)
runs the same kernel on the CPU in tests (tests/unit/test_fused_moe.py). Its GPU speed is measured in a device run.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from engine.ops.norm import silu_and_mul

BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 32


@functools.cache
def available() -> bool:
    """Triton is installed (CUDA builds of torch bring it)."""
    return importlib.util.find_spec("triton") is not None


def align_block_size(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_rows int32 [P], block_expert int32 [P / block_m]) for choices ids [T, k]: the flattened choice rows
    (r = token * k + slot) sorted by expert (stable), each expert's run starting on a block boundary and padded with
    T * k; a block's expert, num_experts for the blocks past the last run. P = T * k + E * (block_m - 1) rounded up
    to block_m: the most the padding can need, so nothing here waits for the device."""
    flat = ids.reshape(-1)
    n = flat.numel()
    dev = flat.device
    # (a scatter-add, not torch.bincount: on CUDA bincount reads the largest id back to the host)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    expert_sorted = flat[order]
    first = torch.cumsum(counts, 0) - counts  # each expert's first position in the unpadded sorted list
    dest = starts[expert_sorted] + torch.arange(n, device=dev) - first[expert_sorted]
    size = -(-(n + num_experts * (block_m - 1)) // block_m) * block_m
    sorted_rows = torch.full((size,), n, dtype=torch.int32, device=dev)
    sorted_rows[dest] = order.to(torch.int32)
    block_starts = torch.arange(0, size, block_m, device=dev)
    block_expert = torch.searchsorted(ends, block_starts, right=True).to(torch.int32)
    return sorted_rows, block_expert


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, sorted_rows: torch.Tensor, block_expert: torch.Tensor,
                 num_rows: int, top_k: int, route_weights: torch.Tensor | None = None) -> torch.Tensor:
    """C [num_rows, N]: C[r] = a[r // top_k] @ w[e(r)]^T (times route_weights[r] where given), one launch.
    w [E, N, K] (last dim contiguous); a [*, K]."""
    from engine.ops.fused_moe_kernel import fused_moe_kernel
    import triton

    E, N, K = w.shape
    c = torch.empty(num_rows, N, dtype=a.dtype, device=a.device)
    if num_rows == 0:
        return c
    num_blocks = block_expert.numel()
    grid = (num_blocks * triton.cdiv(N, BLOCK_N),)
    rw = route_weights if route_weights is not None else c  # (not read without MUL_WEIGHT)
    fused_moe_kernel[grid](
        a, w, c, rw, sorted_rows, block_expert, N, K, num_rows, E,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1),
        TOP_K=top_k, MUL_WEIGHT=route_weights is not None,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        UPCAST=a.dtype == torch.bfloat16 and not a.is_cuda,  # CPU tensors: the interpreter (the kernel's doc)
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return c


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
              ) -> torch.Tensor:
    """sum over each token's k experts e of weight * down_e(silu(gate_e(x)) * up_e(x)): x [T, H], w13 [E, 2I, H]
    (gate rows then up rows), w2 [E, H, I], weights float32 [T, k], ids [T, k] -> [T, H] in x's dtype."""
    T, k = ids.shape
    E = w13.shape[0]
    sorted_rows, block_expert = align_block_size(ids, E)
    gate_up = grouped_gemm(x, w13, sorted_rows, block_expert, T * k, k)
    act = silu_and_mul(gate_up)
    down = grouped_gemm(act, w2, sorted_rows, block_expert, T * k, 1, weights.reshape(-1).float().contiguous())
    return down.view(T, k, -1).sum(dim=1)


def fused_moe_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                        ids: torch.Tensor) -> torch.Tensor:
    """``fused_moe`` as a plain loop over tokens and their choices, in float32 (cast to x's dtype at the end)."""
    T, k = ids.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = w13[e].float() @ x[t].float()
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += float(weights[t, j]) * (w2[e].float() @ a)
    return out.to(x.dtype)
