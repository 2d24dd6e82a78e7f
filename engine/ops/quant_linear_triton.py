"""Launchers of engine/ops/quant_linear_kernel.py: the fused dequantize-and-multiply of up to 16 rows, the
dequantization of a whole weight (for the GEMM of a prefill), and the per-token fp8 quantization of activations with
torch._scaled_mm. CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 (the tests)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.weight_quant import FP8, FP8_BLOCK, Fp8Weight, IntWeight, QuantWeight
from engine.ops.skinny_gemm import _pdl


@dataclass(frozen=True)
class QuantConfig:
    block_m: int
    block_n: int
    block_k: int  # at most; the launch takes the largest power of two <= this that divides the group
    num_warps: int = 4
    num_stages: int = 4


FUSED_MAX_M = 256  # rows up to which the fused kernel runs (beyond, a prefill: dequantize once, then the GEMM)


def config_for(m: int) -> QuantConfig:
    if m <= 16:
        return QuantConfig(16, 32, 128, 4, 4)
    if m <= 32:
        return QuantConfig(32, 64, 128, 4, 3)
    return QuantConfig(64, 64, 64, 4, 3)


@dataclass(frozen=True)
class _Layout:
    """A weight's kernel arguments: codes, scale addressing, zero points."""
    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    code: int
    group: int
    s_rows: int
    stride_sn: int
    stride_sg: int
    stride_zn: int = 0

    @property
    def zeros_arg(self) -> torch.Tensor:
        return self.zeros if self.zeros is not None else self.scales  # a pointer the kernel does not read


def _layout(weight: QuantWeight) -> _Layout:
    if isinstance(weight, IntWeight):
        return _Layout(weight.q, weight.scales, weight.zeros, 0 if weight.bits == 4 else 1, weight.group, 1,
                       weight.scales.stride(0), weight.scales.stride(1), weight.zeros.stride(0))
    k = weight.shape[1]
    s = weight.scale
    if weight.kind == "block":
        return _Layout(weight.w, s, None, 2, FP8_BLOCK, FP8_BLOCK, s.stride(0), s.stride(1))
    if weight.kind == "channel":
        return _Layout(weight.w, s, None, 2, k, 1, 1, 0)
    return _Layout(weight.w, s, None, 2, k, 1, 0, 0)


def block_k_for(group: int, code: int, most: int) -> int | None:
    """The largest power of two <= most dividing the group (and at least 16: the tensor cores' K); None if none."""
    b = most
    while b >= 16:
        if group % b == 0 and (code != 0 or b % 8 == 0):
            return b
        b //= 2
    return None


def supported(weight: QuantWeight) -> bool:
    """Whether the kernels take this weight (its group has a power-of-two factor of at least 16)."""
    lay = _layout(weight)
    return block_k_for(lay.group, lay.code, 128) is not None


def fused(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
          config: QuantConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) @ W^T (+ bias) -> out [M, N] (rows may be strided, last dim contiguous), the weight
    dequantized in registers (``config_for(M)`` unless given)."""
    from engine.ops import quant_linear_kernel as kern

    m, k = x.shape
    n = weight.shape[0]
    cfg = config or config_for(m)
    lay = _layout(weight)
    bk = block_k_for(lay.group, lay.code, cfg.block_k)
    if bk is None:
        raise ValueError(f"quantized linear: no K tile divides the group of {lay.group}")
    if isinstance(weight, IntWeight) and weight.perm is not None:
        x = x.index_select(1, weight.perm)
    elif x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    pdl = _pdl(x.device)
    kern.quant_mm_kernel[(-(-n // cfg.block_n), -(-m // cfg.block_m))](
        x, lay.q, lay.scales, lay.zeros_arg, bias if bias is not None else lay.scales, out, m, n, k, x.stride(0),
        out.stride(0), lay.stride_sn, lay.stride_sg, lay.stride_zn, CODE=lay.code, GROUP=lay.group,
        S_ROWS=lay.s_rows, HAS_ZERO=lay.zeros is not None, HAS_BIAS=bias is not None, PDL=pdl, F32_DOT=not x.is_cuda,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}))
    return out


def dequantize(weight: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in dtype, in the checkpoint's order of K (one kernel)."""
    from engine.ops import quant_linear_kernel as kern

    n, k = weight.shape
    lay = _layout(weight)
    bk = block_k_for(lay.group, lay.code, 128)
    if bk is None:
        return weight.dequantize(dtype)
    w = torch.empty(n, k, dtype=dtype, device=weight.device)
    perm = weight.perm if isinstance(weight, IntWeight) else None
    block_n = 32
    kern.dequantize_kernel[(-(-n // block_n), k // bk)](
        lay.q, lay.scales, lay.zeros_arg, perm if perm is not None else lay.scales, w, n, k, lay.stride_sn,
        lay.stride_sg, lay.stride_zn, CODE=lay.code, GROUP=lay.group, S_ROWS=lay.s_rows, HAS_ZERO=lay.zeros is not None,
        HAS_PERM=perm is not None, BLOCK_N=block_n, BLOCK_K=bk, num_warps=4)
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
