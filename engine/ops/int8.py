"""Weight-only int8: each row of a weight split in groups of 32 along K, one fp32 scale per group
(absmax / 127, symmetric, like GGUF's Q8_0 with an fp32 scale). ``ops.linear`` takes an Int8Weight where it
takes a weight tensor; the CPU kernels widen and scale it in registers, so a decode step streams ~1.1 bytes per
weight instead of 2 (bfloat16)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32  # csrc/cpu/gemm.h kQ8Group


@dataclass(frozen=True)
class Int8Weight:
    q: torch.Tensor       # int8 [N, K], contiguous
    scales: torch.Tensor  # float32 [N, K // GROUP], contiguous

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scales.numel()

    @staticmethod
    def supports(weight: torch.Tensor) -> bool:
        return weight.dim() == 2 and weight.shape[1] % GROUP == 0 and weight.shape[1] > 0

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Weight:
        """Round to nearest per group; a group of zeros gets scale 0 (and stays exactly zero)."""
        if not cls.supports(weight):
            raise ValueError(f"int8 weights need a 2-D weight with K a multiple of {GROUP}, got {tuple(weight.shape)}")
        n, k = weight.shape
        groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
        scales = groups.abs().amax(dim=-1) / 127.0
        inv = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
        q = torch.round(groups * inv.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
        return cls(q.reshape(n, k).contiguous(), scales.contiguous())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.q.shape
        w = self.q.float().reshape(n, k // GROUP, GROUP) * self.scales.unsqueeze(-1)
        return w.reshape(n, k).to(dtype)


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """What the bfloat16 int8 GEMV (AVX512-VNNI, M <= 16) does to x: per row, groups of 32 rounded to int8 steps of
    absmax / 127 (as llama.cpp's Q8_0 activations); returned dequantized in float32 (the reference for tests)."""
    m, k = x.shape
    g = x.float().reshape(m, k // GROUP, GROUP)
    amax = g.abs().amax(dim=-1, keepdim=True)
    # 127 / amax as an IEEE division of two tensors (a scalar numerator may become a multiplication by a
    # reciprocal, one ulp off), so ties like 63.5 round as the kernel's vcvtps2dq rounds them
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return (torch.round(g * inv) * (amax / 127.0)).reshape(m, k)
