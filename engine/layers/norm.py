"""RMSNorm with the fused residual-add variant (vLLM semantics)."""

from __future__ import annotations

import torch

from engine import ops


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def load(self, weights, name: str) -> None:
        """The checkpoint's tensor ``name`` (a WeightSource: safetensors or GGUF, any float dtype) as the weight."""
        self.weight.data.copy_(weights.get(name))

    def forward(self, x: torch.Tensor | None, residual: torch.Tensor | None = None):
        """Without residual: returns norm(x). With residual: residual += x, x = norm(residual),
        both in place; returns (x, residual). x None: the previous layer already added its output into the
        residual (RowParallelLinear's fold); returns (norm(residual), residual)."""
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        if x is None:
            return ops.rms_norm(residual, self.weight, self.eps), residual
        ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual
