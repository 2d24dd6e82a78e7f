"""The product with a quantized weight (the forms: engine/weight_quant.py): ``quant_linear``, reached through
``engine.ops.linear``."""

from __future__ import annotations

import torch

from engine.weight_quant import Fp8Weight, IntWeight, QuantWeight


def quant_linear(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T + bias with W the weight dequantized; x [..., K] of the compute dtype. CUDA, integer weights in
    the "mma" layout (engine._C built with CUDA): the tensor-core kernels of csrc/cuda/int_gemm.cu up to
    SLICED_MAX_M rows, the weight dequantized by one of them for more (engine/ops/int_mma.py). Other CUDA weights:
    up to FUSED_MAX_M rows (decode batches) the Triton kernel that reads the packed weight once and dequantizes it
    in registers (engine/ops/quant_linear_kernel.py); more rows (a prefill): per-channel / per-tensor fp8 on a GPU
    with fp8 tensor cores through ``torch._scaled_mm`` with x quantized per token, else the weight dequantized into
    x's dtype by a kernel, then torch's GEMM. Elsewhere (CPU): dequantized by torch ops for the call."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"linear: x's last dim {x.shape[-1]} does not match the quantized weight's K {k}")
    if x.dim() != 2:
        y = quant_linear(x.reshape(-1, k), weight, bias, None if out is None else out.view(-1, n))
        return y.view(*x.shape[:-1], n) if out is None else out
    if not (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)):
        w = weight.dequantize(x.dtype)
    elif isinstance(weight, IntWeight) and weight.layout == "mma":
        from engine.ops import int_mma

        if x.shape[0] <= int_mma.SLICED_MAX_M:
            return int_mma.linear(x, weight, bias, out)
        w = int_mma.dequantize(weight, x.dtype)
    else:
        from engine.ops import quant_linear_triton as kern

        if x.shape[0] <= kern.FUSED_MAX_M and kern.supported(weight):
            return kern.fused(x, weight, bias, out)
        if isinstance(weight, Fp8Weight) and kern.scaled_mm_fits(x, weight):
            return _put(kern.fp8_scaled_mm(x, weight, bias), out)
        w = kern.dequantize(weight, x.dtype)  # in the checkpoint's order of K
    return _put(torch.nn.functional.linear(x, w, bias), out)


def _put(y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return y if out is None else out.copy_(y)
