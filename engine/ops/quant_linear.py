"""The product with a quantized weight (the forms: engine/weight_quant.py): ``quant_linear``, reached through
``engine.ops.linear``."""

from __future__ import annotations

import torch

from engine.weight_quant import Fp8Weight, IntWeight, QuantWeight


# fp8 weights (per channel / per tensor) past this many rows go to torch._scaled_mm instead of the fused Triton
# kernel: H100, 2026-12-07 (kestrel bench quant, Llama-3-8B shapes), at 16 rows the fused kernel was faster on
# four of five shapes (qkv 13.0 vs 20.7 us), at 64 rows _scaled_mm on all five (qkv 18.4 vs 34.1, down 46.7 vs
# 113.7, LM head 194.5 vs 298.5 us).
FP8_FUSED_MAX_M = 16


def quant_linear(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T + bias with W the weight dequantized; x [..., K] of the compute dtype. CUDA, integer weights (the
    "mma" layout: engine/layers/linear.py packs every GPU integer weight so, or keeps it float where the kernels
    cannot take its shape): the tensor-core kernels of csrc/cuda/int_gemm.cu up to SLICED_MAX_M rows in one launch
    (16 rows a launch for groups of 16 / 32), the weight dequantized by one of them for cuBLAS beyond (engine/ops/int_mma.py). fp8 weights: up to
    FP8_FUSED_MAX_M rows the Triton kernel that reads the packed weight once and dequantizes it in registers
    (engine/ops/quant_linear_kernel.py), more rows through ``torch._scaled_mm`` with x quantized per token on a GPU
    with fp8 tensor cores, else the weight dequantized into x's dtype by a kernel, then torch's GEMM. Elsewhere
    (CPU; an integer weight in another layout): dequantized by torch ops for the call."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"linear: x's last dim {x.shape[-1]} does not match the quantized weight's K {k}")
    if x.dim() != 2:
        y = quant_linear(x.reshape(-1, k), weight, bias, None if out is None else out.view(-1, n))
        return y.view(*x.shape[:-1], n) if out is None else out
    if not (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)) or (
            isinstance(weight, IntWeight) and weight.layout != "mma"):
        w = weight.dequantize(x.dtype)
    elif isinstance(weight, IntWeight):
        from engine.ops import int_mma

        if x.shape[0] <= int_mma.SLICED_MAX_M:
            return int_mma.linear(x, weight, bias, out)
        w = int_mma.dequantize(weight, x.dtype)
    else:
        from engine.ops import quant_linear_triton as kern

        if (isinstance(weight, Fp8Weight) and x.shape[0] > FP8_FUSED_MAX_M
                and kern.scaled_mm_fits(x, weight)):
            return _put(kern.fp8_scaled_mm(x, weight, bias), out)
        if x.shape[0] <= kern.FUSED_MAX_M and kern.supported(weight):
            return kern.fused(x, weight, bias, out)
        if isinstance(weight, Fp8Weight) and kern.scaled_mm_fits(x, weight):
            return _put(kern.fp8_scaled_mm(x, weight, bias), out)
        w = kern.dequantize(weight, x.dtype)
    return _put(torch.nn.functional.linear(x, w, bias), out)


def _put(y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return y if out is None else out.copy_(y)
