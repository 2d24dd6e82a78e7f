"""Launchers of csrc/cuda/int_gemm.cu: integer weights in the "mma" layout (engine/weight_quant.py) on the tensor
cores. ``linear`` multiplies up to SLICED_MAX_M rows (decode batches) in one launch of the kernel whose blocks share
x between their output tiles (csrc/cuda/int_gemm_wide.cuh; on an H100, 2026-12-07: batch-64 linears 2.2-2.8x faster
than the per-tile kernel sliced by 16, and with 8 k-groups for the weights of few tiles, o and down, 1-16 rows
1.1-1.8x faster than the per-tile kernel, which it replaced for groups of whole quads); for groups of 16 / 32
positions (the weight scaled in registers) the per-tile kernel, one launch per 16 rows; ``dequantize`` writes the
whole weight for the GEMM of a prefill. Reached through engine/ops/quant_linear.py. ``available()`` says whether
engine._C has the kernels (built with CUDA)."""

from __future__ import annotations

import torch

from engine.ops.native import cuda_available, dtype_code, native_lib, raw_stream
from engine.weight_quant import IntWeight, mma_packable

KERNEL_M = 64  # rows of x per launch (groups of whole quads of 64 positions, or one group for all of K)
LANE_GROUPS_KERNEL_M = 16  # rows per launch for groups of 16 / 32 positions
SLICED_MAX_M = 64  # up to here the kernels; beyond (prefills), the dequantized weight and the GEMM


def rows_per_launch(weight: IntWeight) -> int:
    """Rows of x one kernel launch takes for this weight (csrc/cuda/int_gemm.cu's lane_groups)."""
    return LANE_GROUPS_KERNEL_M if weight.group % 64 and weight.group < weight.k else KERNEL_M


def available() -> bool:
    return cuda_available()


def layout_for(k: int, group: int) -> str | None:
    """The integer layout to pack a weight bound for a GPU in: "mma" where these kernels exist and take the shape;
    None where they do not (the caller keeps the weight float: engine/layers/linear.py). The tensor-core kernels are
    the only GPU integer path (on an H100, 2026-12-07, batch-1 decode int4 1.58x / int8 1.27x bf16 against 0.75x /
    0.71x for the Triton kernels on the "chunk" layout, deleted with KESTREL_INT_MMA: issue 46;
    docs/benchmarks/gpu_quant_2026-12-07.md; the 0.75x / 0.71x: the same H100's bench quant at the default of then)."""
    return "mma" if available() and mma_packable(k, group) else None


def linear(x: torch.Tensor, weight: IntWeight, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None, tiles_per_block: int = 0, k_groups: int = 0) -> torch.Tensor:
    """x [M, K] (bf16 / fp16, CUDA, M <= SLICED_MAX_M; rows may be strided, last dim contiguous) @ W^T (+ bias)
    -> out [M, N] of x's dtype (rows may be strided). ``tiles_per_block`` (2 / 4 / 8) and ``k_groups`` force the
    x-sharing kernel's shape (tests, the kernel sweep); 0: the measured choice."""
    m, k = x.shape
    n = weight.shape[0]
    if weight.perm is not None:
        x = x.index_select(1, weight.perm)
    elif x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    dt = dtype_code(x.dtype)
    sdt = dtype_code(weight.scales.dtype)
    bias_ptr = 0 if bias is None else bias.data_ptr()
    device, stream = x.get_device(), raw_stream(x)
    step = rows_per_launch(weight)
    for r in range(0, m, step):
        rows = min(step, m - r)
        native_lib.cuda_int_mma_linear(
            dt, out.data_ptr() + r * out.stride(0) * out.element_size(), out.stride(0),
            x.data_ptr() + r * x.stride(0) * x.element_size(), x.stride(0), weight.q.data_ptr(),
            weight.scales.data_ptr(), sdt, weight.scales.stride(0), weight.zeros.data_ptr(), weight.zeros.stride(0),
            bias_ptr, rows, n, k, weight.bits, weight.group, device, stream, tiles_per_block, k_groups)
    return out


def dequantize(weight: IntWeight, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in dtype, in the checkpoint's order of K (one kernel, then the act-order permutation undone)."""
    n, k = weight.shape
    w = torch.empty(n, k, dtype=dtype, device=weight.device)
    native_lib.cuda_int_mma_dequantize(
        dtype_code(dtype), w.data_ptr(), w.stride(0), weight.q.data_ptr(), weight.scales.data_ptr(),
        dtype_code(weight.scales.dtype), weight.scales.stride(0), weight.zeros.data_ptr(), weight.zeros.stride(0),
        n, k, weight.bits, weight.group, w.get_device(), raw_stream(w))
    if weight.perm is not None:
        w = torch.empty_like(w).index_copy_(1, weight.perm, w)
    return w
