"""Launchers of engine/ops/quant_linear_kernel.py, fp8 weights: the fused dequantize-and-multiply of up to
FUSED_MAX_M rows on the tensor cores, the dequantization of a whole weight (for the GEMM of a prefill), and the
per-token fp8 quantization of activations with torch._scaled_mm. CUDA tensors, or CPU tensors under
TRITON_INTERPRET=1 (the tests). (Integer weights: engine/ops/int_mma.py.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.ops.skinny_gemm import pdl as pdl_for
from engine.weight_quant import FP8, FP8_BLOCK, Fp8Weight


@dataclass(frozen=True)
class QuantConfig:
    block_m: int
    block_n: int
    block_k: int = 128  # at most (the launch takes the largest power of two <= this dividing the group)
    num_warps: int = 4
    num_stages: int = 4


FUSED_MAX_M = 256  # rows up to which the fused kernels run (beyond, a prefill: dequantize once, then the GEMM)


def config_for(weight: Fp8Weight, m: int) -> QuantConfig:
    if m <= 16:
        return QuantConfig(16, 32, 256, 4, 3)
    return QuantConfig(32, 64, 128, 4, 3) if m <= 32 else QuantConfig(64, 64, 64, 4, 3)


def _fp8_layout(weight: Fp8Weight) -> tuple[int, int, int, int]:
    """(group, s_rows, stride_sn, stride_sg) of the scale addressing."""
    s = weight.scale
    if weight.kind == "block":
        return FP8_BLOCK, FP8_BLOCK, s.stride(0), s.stride(1)
    return weight.shape[1], 1, (1 if weight.kind == "channel" else 0), 0


def block_k_for(group: int, most: int) -> int | None:
    """The largest power of two <= most dividing the group, at least 16 (the tensor cores' K); None if none."""
    b = most
    while b >= 16:
        if group % b == 0:
            return b
        b //= 2
    return None


def supported(weight) -> bool:
    """Whether the fused kernel takes this weight: fp8 scale groups with a power-of-two factor of at least 16."""
    if not isinstance(weight, Fp8Weight):
        return False
    bk = block_k_for(_fp8_layout(weight)[0], 128)
    return bk is not None and weight.shape[1] % bk == 0  # (a partial last block of 128 columns: dequantized)


def fused(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
          config: QuantConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) @ W^T (+ bias) -> out [M, N] (rows may be strided, last dim contiguous), the fp8
    weight dequantized in registers on the tensor cores (``config_for`` unless a config is given)."""
    from engine.ops import quant_linear_kernel as kern

    m, k = x.shape
    n = weight.shape[0]
    cfg = config or config_for(weight, m)
    if x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    pdl = pdl_for(x.device)
    grid = (-(-n // cfg.block_n), -(-m // cfg.block_m))
    b = bias if bias is not None else out
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, **({"launch_pdl": True} if pdl else {})}
    group, s_rows, sn, sg = _fp8_layout(weight)
    bk = block_k_for(group, cfg.block_k)
    if bk is None:
        raise ValueError(f"quantized linear: no K tile divides the fp8 scale group of {group}")
    kern.fp8_mm_kernel[grid](
        x, weight.w, weight.scale, b, out, m, n, k, x.stride(0), out.stride(0), sn, sg, GROUP=group, S_ROWS=s_rows,
        HAS_BIAS=bias is not None, PDL=pdl, F32_DOT=not x.is_cuda, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=bk, **launch)
    return out


def dequantize(weight: Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in dtype (one kernel)."""
    from engine.ops import quant_linear_kernel as kern

    n, k = weight.shape
    w = torch.empty(n, k, dtype=dtype, device=weight.device)
    block_n = 32
    group, s_rows, sn, sg = _fp8_layout(weight)
    bk = block_k_for(group, 128)
    if bk is None:
        return weight.dequantize(dtype)
    kern.fp8_dequantize_kernel[(-(-n // block_n), k // bk)](
        weight.w, weight.scale, w, n, k, sn, sg, GROUP=group, S_ROWS=s_rows, BLOCK_N=block_n, BLOCK_K=bk, num_warps=4)
    return w


_FP8_TC: dict[int, bool] = {}


def fp8_tensor_cores(device: torch.device) -> bool:
    """Compute capability 8.9 or more (Ada, Hopper): torch._scaled_mm runs there."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FP8_TC:
        _FP8_TC[index] = torch.cuda.get_device_capability(index) >= (8, 9)
    return _FP8_TC[index]


def fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K] contiguous, float32 scales [M, 1]): each row's absmax onto 448."""
    from engine.ops import quant_linear_kernel as kern

    m, k = x.shape
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    kern.fp8_per_token_kernel[(m,)](x, q, s, k, x.stride(0), BLOCK_K=1024, num_warps=4)
    return q, s


def fp8_scaled_mm(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8: x quantized per token, then cuBLASLt's fp8 GEMM with the row-wise scales of both sides (x's dtype out).
    K and N must be multiples of 16 (the caller checks ``scaled_mm_fits``)."""
    xq, sx = fp8_per_token(x)
    sw = weight.row_scales().view(1, -1)
    return torch._scaled_mm(xq, weight.w.t(), scale_a=sx, scale_b=sw, bias=bias, out_dtype=x.dtype)


def scaled_mm_fits(x: torch.Tensor, weight: Fp8Weight) -> bool:
    n, k = weight.shape
    return weight.kind != "block" and k % 16 == 0 and n % 16 == 0 and fp8_tensor_cores(x.device)
