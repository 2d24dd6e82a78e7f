"""Rotary position embedding: the cos/sin cache (with llama3 / linear scaling) and its application."""

from __future__ import annotations

import math

import torch

from engine import ops


def _inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low_ff = float(scaling.get("low_freq_factor", 1.0))
        high_ff = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen = old_len / low_ff
        high_wavelen = old_len / high_ff
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3)")


class RotaryEmbedding(torch.nn.Module):
    """Neox-style (rotate-half) rotary embedding over a precomputed float32 cos/sin cache of ``max_position``
    positions: the model runner builds the model with the positions its engine will serve (the KV cache's capacity
    where that is known first) and ``resize``s the table once the KV cache is allocated."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None):
        super().__init__()
        self.head_dim = head_dim
        self.inv_freq = _inv_freq(head_dim, theta, scaling)  # [head_dim / 2] float32 (not a buffer: not moved)
        self.register_buffer("cos_sin_cache", self._table(max_position, self.inv_freq.device), persistent=False)

    def _table(self, n: int, device: torch.device) -> torch.Tensor:
        """[n, head_dim] float32 on ``device``: cos(t * inv_freq) then sin(t * inv_freq) for positions t < n. Row t
        does not depend on n (element-wise ops), so a table of fewer positions is the first rows of a longer one."""
        inv_freq = self.inv_freq.to(device)
        freqs = torch.outer(torch.arange(n, dtype=torch.float32, device=device), inv_freq)
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    @property
    def max_position(self) -> int:
        return self.cos_sin_cache.shape[0]

    def resize(self, n: int) -> None:
        """Hold positions 0 .. n - 1 exactly: the table's first n rows (the KV cache capped the context below the
        positions it was built for), or a table built again for n (more positions than it was built for)."""
        if 0 < n < self.max_position:
            self.cos_sin_cache = self.cos_sin_cache[:n].clone()
        elif n > self.max_position:
            self.cos_sin_cache = self._table(n, self.cos_sin_cache.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        ops.rotary_embedding(positions, q, k, self.head_dim, self.cos_sin_cache, True)

    def with_cache(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                   k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
        """forward(positions, q, k), then k and v written into the caches at slot_mapping (one CUDA kernel);
        the scales of fp8 caches (ops.reshape_and_cache)."""
        ops.rotary_and_cache(positions, q, k, v, k_cache, v_cache, slot_mapping, self.head_dim, self.cos_sin_cache,
                             True, k_scale, v_scale)
