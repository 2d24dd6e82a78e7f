"""Attention with sinks and an optional sliding window (gpt-oss), in torch over the paged KV cache.

A sink is a learned logit per query head that joins the softmax's denominator and nothing else: the probabilities
are softmax([scores, sink]) with the sink's column dropped, so a head may attend to nothing (transformers'
GptOssAttention / eager_attention_forward). A sliding layer lets query position p see keys p - window < j <= p
(transformers' sliding_window_overlay); the other layers are causal over the whole context.

The native paged decode kernel and the prefill paths of engine/layers/attention.py take neither, so this layer
keeps Attention's cache write (the rotary embedding and the K/V write at the step's slots) and then computes the
attention itself in float32 torch ops, on the CPU (the model refuses a GPU: engine/models/gpt_oss.py):
- decode rows, from the step's tensors (``decode_block_tables`` / ``decode_context_lens``, so the CPU decode
  buckets' padding rows, context 0, work too; their output is zeros): each row's last min(context, window) keys;
- each prefill chunk (a cached prefix, chunked prefill and prefix-cache hits alike): the keys from the first one
  its first query sees to its last, read from the cache through its block table, in query slices that keep the
  score matrix under ``SCORE_ELEMENTS``.
A decode step runs torch ops, so the CPU decode tapes refuse it (the bucket stays eager, with a log line).
"""

from __future__ import annotations

import torch

from engine import ops
from engine.layers.attention import Attention, AttentionMetadata

SCORE_ELEMENTS = 1 << 25  # float32 scores per query slice of a prefill chunk (128 MiB)


class SinkAttention(Attention):
    prefill_attention = "sdpa"  # the runner's backend only builds the step's metadata here (no varlen plans)

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer_index: int,
                 sliding_window: int | None, dtype: torch.dtype):
        super().__init__(num_heads, num_kv_heads, head_dim, layer_index)
        self.sliding_window = sliding_window or None  # None: full causal attention
        self.sinks = torch.nn.Parameter(torch.zeros(num_heads, dtype=dtype), requires_grad=False)  # this rank's

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
                rotary=None) -> torch.Tensor:
        """As Attention.forward (q [T, nh*hd], k and v [T, nkv*hd]; rotated and written to the cache first), with
        the sinks and the window; returns [T, nh*hd]."""
        T, hd = q.shape[0], self.head_dim
        if rotary is not None:
            rotary.with_cache(meta.positions, q, k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        else:
            ops.reshape_and_cache(k.view(T, self.num_kv_heads, hd), v.view(T, self.num_kv_heads, hd),
                                  self.k_cache, self.v_cache, meta.slot_mapping)
        q3 = q.view(T, self.num_heads, hd)
        out = torch.empty(T, self.num_heads, hd, dtype=q.dtype, device=q.device)
        nd = meta.num_decode_tokens
        if nd:
            out[:nd] = self._decodes(q3[:nd], meta.decode_block_tables, meta.decode_context_lens)
        for i, seg in enumerate(meta.prefills, start=nd):
            s, n = seg.query_start, seg.query_len
            out[s:s + n] = self._chunk(q3[s:s + n], meta.block_tables[i:i + 1], seg.context_len)
        return out.view(T, self.num_heads * hd)

    def _decodes(self, q: torch.Tensor, tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
        """One query token per row [R, nh, hd] at position context - 1, over its last min(context, window) keys."""
        ctx = context_lens.long()
        span = int(ctx.max())
        if self.sliding_window:
            span = min(span, self.sliding_window)
        if span == 0:  # padding rows only
            return torch.zeros_like(q)
        kpos = ctx[:, None] - span + torch.arange(span, device=q.device)  # [R, span]; < 0: before the sequence
        keys, values = self._read(tables, kpos)
        return self._attend(q[:, None], keys, values, (kpos >= 0)[:, None, :])[:, 0]

    def _chunk(self, q: torch.Tensor, table: torch.Tensor, context_len: int) -> torch.Tensor:
        """A prefill chunk's n query tokens [n, nh, hd], the last n of its context_len, over the keys they see."""
        n = q.shape[0]
        first = context_len - n  # the first query's position
        out = torch.empty_like(q)
        rows = max(1, SCORE_ELEMENTS // (self.num_heads * context_len))
        for a in range(0, n, rows):
            b = min(n, a + rows)
            start = 0 if self.sliding_window is None else max(0, first + a - self.sliding_window + 1)
            stop = first + b  # keys up to the slice's last query
            kpos = torch.arange(start, stop, device=q.device)
            qpos = torch.arange(first + a, first + b, device=q.device)
            allowed = kpos[None, :] <= qpos[:, None]
            if self.sliding_window:
                allowed &= kpos[None, :] > qpos[:, None] - self.sliding_window
            keys, values = self._read(table, kpos[None, :])
            out[a:b] = self._attend(q[None, a:b], keys, values, allowed[None])[0]
        return out

    def _read(self, tables: torch.Tensor, kpos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values at positions kpos [R, m] of the sequences whose block-table rows are tables
        [R, width] (a negative position reads position 0: the caller masks it): each [R, m, nkv, hd]."""
        bs = self.k_cache.shape[1]
        pos = kpos.clamp(min=0)
        slots = tables.long().gather(1, pos // bs) * bs + pos % bs
        flat_k = self.k_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_v = self.v_cache.view(-1, self.num_kv_heads, self.head_dim)
        return flat_k[slots], flat_v[slots]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor
                ) -> torch.Tensor:
        """q [R, n, nh, hd], keys / values [R, m, nkv, hd], allowed [R, n, m] -> [R, n, nh, hd] in q's dtype:
        softmax over the allowed scores and the head's sink, the sink's share dropped (float32 throughout)."""
        R, n, H, hd = q.shape
        kv = self.num_kv_heads
        g = H // kv  # query head h reads KV head h // g (transformers' repeat_kv)
        scores = torch.einsum("rnkgd,rmkd->rkgnm", q.float().view(R, n, kv, g, hd), keys.float()) * self.scale
        scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
        sinks = self.sinks.float().view(1, kv, g, 1, 1).expand(R, kv, g, n, 1)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
        out = torch.einsum("rkgnm,rmkd->rnkgd", probs, values.float())
        return out.reshape(R, n, H, hd).to(q.dtype)
