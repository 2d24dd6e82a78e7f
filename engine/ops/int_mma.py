"""Launchers of csrc/cuda/int_gemm.cu: integer weights in the "mma" layout (engine/weight_quant.py) on the tensor
cores. ``linear`` multiplies up to SLICED_MAX_M rows (decode batches: one kernel per 16 rows, each reading the
packed weight once); ``dequantize`` writes the whole weight for the GEMM of a prefill. (Kernels taking 32 and 64
rows at once were measured on an H100, 2026-12-07, and removed: at 64 rows the four linears of a Llama-3-8B
layer took 393 us against 396 us in four 16-row launches, and their weight rounded in bf16 after scaling moved
the tiny model's int4 argmax agreement with the float32 reference from above 0.9 to 0.87.) Reached through
engine/ops/quant_linear.py. ``available()`` says whether engine._C has the kernels (built with CUDA)."""

from __future__ import annotations

import torch

from engine.ops.native import cuda_available, dtype_code, native_lib, raw_stream
from engine.weight_quant import IntWeight, mma_packable

KERNEL_M = 16  # rows of x per kernel
SLICED_MAX_M = 64  # up to here, one kernel per 16 rows; beyond (prefills), the dequantized weight and the GEMM


def available() -> bool:
    return cuda_available()


def layout_for(k: int, group: int) -> str | None:
    """The integer layout to pack a weight bound for a GPU in: "mma" where these kernels exist and take the shape;
    None where they do not (the caller keeps the weight float: engine/layers/linear.py). The tensor-core kernels are
    the only GPU integer path (on an H100, 2026-12-07, batch-1 decode int4 1.58x / int8 1.27x bf16 against 0.75x /
    0.71x for the Triton kernels on the "chunk" layout, deleted with KESTREL_INT_MMA: issue 46,
    docs/benchmarks/gpu_quant_2026-12-07.md)."""
    return "mma" if available() and mma_packable(k, group) else None


def linear(x: torch.Tensor, weight: IntWeight, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16, CUDA, M <= SLICED_MAX_M; rows may be strided, last dim contiguous) @ W^T (+ bias)
    -> out [M, N] of x's dtype (rows may be strided)."""
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
    for r in range(0, m, KERNEL_M):
        rows = min(KERNEL_M, m - r)
        native_lib.cuda_int_mma_linear(
            dt, out.data_ptr() + r * out.stride(0) * out.element_size(), out.stride(0),
            x.data_ptr() + r * x.stride(0) * x.element_size(), x.stride(0), weight.q.data_ptr(),
            weight.scales.data_ptr(), sdt, weight.scales.stride(0), weight.zeros.data_ptr(), weight.zeros.stride(0),
            bias_ptr, rows, n, k, weight.bits, weight.group, device, stream)
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
