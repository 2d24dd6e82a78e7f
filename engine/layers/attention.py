"""Attention over the paged KV cache.

A step's tokens are laid out decodes first (one query token each), then prefill chunks. Decode
tokens go through the paged decode kernel; each prefill chunk attends to its sequence's cached
prefix plus itself (chunked prefill and prefix-cache hits look the same here)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine import ops


@dataclass
class PrefillSegment:
    query_start: int  # offset of the chunk in the step's token layout
    query_len: int
    context_len: int  # tokens in the cache after this step's write (prefix + chunk)
    block_ids: torch.Tensor  # int64, the blocks holding the first context_len tokens


@dataclass
class AttentionMetadata:
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None = None  # [B, M] int32
    decode_context_lens: torch.Tensor | None = None  # [B] int32
    prefills: list[PrefillSegment] = field(default_factory=list)


class Attention(torch.nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer_index: int):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.layer_index = layer_index
        self.k_cache: torch.Tensor | None = None  # [num_blocks, block_size, n_kv, head_dim], bound by the runner
        self.v_cache: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, nh*hd], k and v [T, nkv*hd] (row-strided views are fine); returns [T, nh*hd]."""
        T = q.shape[0]
        hd = self.head_dim
        ops.reshape_and_cache(k.view(T, self.num_kv_heads, hd), v.view(T, self.num_kv_heads, hd),
                              self.k_cache, self.v_cache, meta.slot_mapping)
        out = torch.empty(T, self.num_heads, hd, dtype=q.dtype, device=q.device)
        nd = meta.num_decode_tokens
        if nd:
            qd = q[:nd].reshape(nd, self.num_heads, hd)
            ops.paged_decode_attention(qd, self.k_cache, self.v_cache, meta.decode_block_tables,
                                       meta.decode_context_lens, self.scale, out=out[:nd])
        for seg in meta.prefills:
            out[seg.query_start:seg.query_start + seg.query_len] = self._prefill(q, k, v, seg)
        return out.view(T, self.num_heads * hd)

    def _prefill(self, q, k, v, seg: PrefillSegment) -> torch.Tensor:
        hd, s, n = self.head_dim, seg.query_start, seg.query_len
        qs = q[s:s + n].reshape(n, self.num_heads, hd).transpose(0, 1)  # [nh, n, hd]
        if seg.context_len == n:  # nothing cached before this chunk: use the fresh K/V directly
            ks = k[s:s + n].reshape(n, self.num_kv_heads, hd)
            vs = v[s:s + n].reshape(n, self.num_kv_heads, hd)
        else:
            ks = self.k_cache[seg.block_ids].flatten(0, 1)[: seg.context_len]
            vs = self.v_cache[seg.block_ids].flatten(0, 1)[: seg.context_len]
        ks, vs = ks.transpose(0, 1), vs.transpose(0, 1)  # [nkv, ctx, hd]
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            ks = ks.repeat_interleave(rep, dim=0)
            vs = vs.repeat_interleave(rep, dim=0)
        if seg.context_len == n:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale)
        else:
            offset = seg.context_len - n
            qpos = torch.arange(n, device=q.device).unsqueeze(1) + offset
            mask = torch.arange(seg.context_len, device=q.device).unsqueeze(0) <= qpos
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.scale)
        return o.transpose(0, 1)
