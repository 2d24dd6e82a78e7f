"""Neighbouring layers computed by one kernel where the decode CUDA graphs run a one-row step: an RMSNorm (with its
residual add) inside the GEMV of the projection that reads it, SiLU-and-mul inside the down projection's GEMV
(engine/ops/skinny_gemm.py). Everywhere else, and with KESTREL_DECODE_FUSION=off, the same layers one after the
other: the functions here return the same values either way (up to the norm's summation order)."""

from __future__ import annotations

import torch

from engine import ops
from engine.layers.linear import LinearBase, RowParallelLinear
from engine.layers.norm import RMSNorm
from engine.ops import skinny_gemm


def _fusable(x: torch.Tensor, linear: LinearBase, k: int) -> torch.Tensor | None:
    """The linear's float weight when a fused one-row GEMV takes this call (x one contiguous row of width k)."""
    w = linear.matmul_weight
    if not (isinstance(w, torch.Tensor) and skinny_gemm.fusing() and x.is_contiguous()):
        return None
    if not skinny_gemm.wanted(x[:, :k], w, linear.bias):
        return None
    return w


def norm_linear(norm: RMSNorm, linear: LinearBase, x: torch.Tensor, residual: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """linear(norm(x + residual)) and the new residual x + residual (x itself without one): RMSNorm's
    ``forward(x, residual)`` followed by the linear layer."""
    w = _fusable(x, linear, x.shape[-1])
    if w is not None and (residual is None or residual.is_contiguous()) and norm.weight.dtype == x.dtype:
        return skinny_gemm.norm_linear(x, residual, norm.weight, norm.eps, w, linear.bias)
    if residual is None:
        residual = x
        x = norm(x)
    else:
        x, residual = norm(x, residual)
    return linear(x), residual


def silu_linear(linear: RowParallelLinear, gate_up: torch.Tensor, reduce: bool = True) -> torch.Tensor:
    """linear(silu_and_mul(gate_up), reduce): the MLP's activation and down projection."""
    k = gate_up.shape[-1] // 2
    w = _fusable(gate_up, linear, k) if gate_up.shape[-1] == 2 * linear.weight.shape[-1] else None
    if w is not None:
        return linear.finish(skinny_gemm.silu_linear(gate_up, w), reduce)
    return linear(ops.silu_and_mul(gate_up), reduce)
