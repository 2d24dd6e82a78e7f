"""Launchers of engine/ops/quant_linear_kernel.py: the fused dequantize-and-multiply of up to FUSED_MAX_M rows (one
row of integer weights on the CUDA cores, more on the tensor cores), the dequantization of a whole weight (for the
GEMM of a prefill), and the per-token fp8 quantization of activations with torch._scaled_mm. CUDA tensors, or CPU
tensors under TRITON_INTERPRET=1 (the tests)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.ops.skinny_gemm import pdl as pdl_for
from engine.weight_quant import FP8, FP8_BLOCK, Fp8Weight, IntWeight, QuantWeight


@dataclass(frozen=True)
class QuantConfig:
    block_m: int
    block_n: int
    block_k: int = 128  # fp8: at most (the launch takes the largest power of two <= this dividing the group)
    num_warps: int = 4
    num_stages: int = 4


@dataclass(frozen=True)
class GemvConfig:
    """The one-row integer kernel's tiles: output rows per program, chunks of 128 positions per loop step."""
    block_n: int = 16
    chunks: int = 2
    num_warps: int = 4
    num_stages: int = 3


GEMV_CONFIG = GemvConfig()
FUSED_MAX_M = 256  # rows up to which the fused kernels run (beyond, a prefill: dequantize once, then the GEMM)


def config_for(weight: QuantWeight, m: int) -> QuantConfig:
    if isinstance(weight, Fp8Weight):
        if m <= 16:
            return QuantConfig(16, 32, 256, 4, 3)
        return QuantConfig(32, 64, 128, 4, 3) if m <= 32 else QuantConfig(64, 64, 64, 4, 3)
    if m <= 16:
        return QuantConfig(16, 32, num_warps=4, num_stages=4)
    return QuantConfig(32, 64, num_warps=4, num_stages=3) if m <= 32 else QuantConfig(64, 64, num_warps=4,
                                                                                     num_stages=3)


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


def supported(weight: QuantWeight) -> bool:
    """Whether the fused kernels take this weight: integer groups of 16 / 32 / 64, a multiple of 128 or all of K;
    fp8 scale groups with a power-of-two factor of at least 16."""
    if isinstance(weight, IntWeight):
        g = weight.group
        return (g < 128 and 128 % g == 0 and g % 16 == 0) or g % 128 == 0 or g == weight.k
    bk = block_k_for(_fp8_layout(weight)[0], 128)
    return bk is not None and weight.shape[1] % bk == 0  # (a partial last block of 128 columns: dequantized)


def fused(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
          config: QuantConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) @ W^T (+ bias) -> out [M, N] (rows may be strided, last dim contiguous), the weight
    dequantized in registers: integer weights at one row on the CUDA cores (int_gemv_kernel), else on the tensor
    cores (``config_for`` unless a config is given, which also forces the tensor-core kernel)."""
    from engine.ops import quant_linear_kernel as kern

    m, k = x.shape
    n = weight.shape[0]
    if isinstance(weight, IntWeight) and m == 1 and config is None:
        return int_gemv(x, weight, bias, out)
    cfg = config or config_for(weight, m)
    if isinstance(weight, IntWeight) and weight.perm is not None:
        x = x.index_select(1, weight.perm)
    elif x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    pdl = pdl_for(x.device)
    grid = (-(-n // cfg.block_n), -(-m // cfg.block_m))
    b = bias if bias is not None else out
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, **({"launch_pdl": True} if pdl else {})}
    if isinstance(weight, IntWeight):
        kern.int_mm_kernel[grid](
            x, weight.q, weight.scales, weight.zeros, b, out, m, n, k, weight.scales.shape[1], x.stride(0),
            out.stride(0), weight.q.stride(0), weight.scales.stride(0), weight.zeros.stride(0), PLANES=weight.planes,
            GROUP=weight.group, PER_ROW=weight.group >= k, HAS_BIAS=bias is not None, PDL=pdl,
            IS_F16=x.dtype == torch.float16, INTERPRET=not x.is_cuda, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            **launch)
        return out
    group, s_rows, sn, sg = _fp8_layout(weight)
    bk = block_k_for(group, cfg.block_k)
    if bk is None:
        raise ValueError(f"quantized linear: no K tile divides the fp8 scale group of {group}")
    kern.fp8_mm_kernel[grid](
        x, weight.w, weight.scale, b, out, m, n, k, x.stride(0), out.stride(0), sn, sg, GROUP=group, S_ROWS=s_rows,
        HAS_BIAS=bias is not None, PDL=pdl, F32_DOT=not x.is_cuda, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=bk, **launch)
    return out


def int_gemv(x: torch.Tensor, weight: IntWeight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
             config: GemvConfig | None = None) -> torch.Tensor:
    """x [1, K] @ W^T (+ bias) for integer weights on the CUDA cores (int_gemv_kernel) -> out [1, N]."""
    from engine.ops import quant_linear_kernel as kern

    k = x.shape[1]
    n = weight.shape[0]
    cfg = config or GEMV_CONFIG
    if weight.perm is not None:
        x = x.index_select(1, weight.perm)
    elif x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    pdl = pdl_for(x.device)
    kern.int_gemv_kernel[(-(-n // cfg.block_n),)](
        x, weight.q, weight.scales, weight.zeros, bias if bias is not None else out, out, n, k,
        weight.scales.shape[1], weight.q.stride(0), weight.scales.stride(0), weight.zeros.stride(0),
        PLANES=weight.planes, GROUP=weight.group, PER_ROW=weight.group >= k, HAS_BIAS=bias is not None, PDL=pdl,
        BLOCK_N=cfg.block_n, CHUNKS=cfg.chunks, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}))
    return out


def dequantize(weight: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in dtype, in the checkpoint's order of K (one kernel)."""
    from engine.ops import quant_linear_kernel as kern

    n, k = weight.shape
    w = torch.empty(n, k, dtype=dtype, device=weight.device)
    block_n = 32
    if isinstance(weight, IntWeight):
        perm = weight.perm
        kern.int_dequantize_kernel[(-(-n // block_n), -(-k // 128))](
            weight.q, weight.scales, weight.zeros, perm if perm is not None else weight.scales, w, n, k,
            weight.q.stride(0), weight.scales.stride(0), weight.zeros.stride(0), PLANES=weight.planes,
            GROUP=weight.group, HAS_PERM=perm is not None, BLOCK_N=block_n, num_warps=4)
        return w
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
