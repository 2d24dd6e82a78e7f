"""Multi-head latent attention (DeepSeek-V2/V3) over a paged cache of latents.

Per token and layer the cache holds one row of kv_lora_rank + qk_rope_head_dim values: the compressed KV (after
kv_a_layernorm) and the rotated shared rope key k_pe, not per-head keys and values. Its blocks are the engine's
(the same block tables, slots, prefix cache and preemption as the Llama caches): ``LatentAttention.k_cache`` is
[num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim] and ``v_cache`` stays None (``cache_tensors = 1``:
engine/runner/kv_sizing.py counts one tensor).

The attention itself, torch ops on any device (the cache write is ops.reshape_and_cache, which skips slot -1: the
padded rows of the decode buckets):
- decodes, absorbed: W_UK (kv_b_proj's key rows) folded into the query, q_nope @ W_UK -> a query in latent space;
  scores against the cached latents plus q_pe . k_pe; the output in latent space, then W_UV -> [heads, v_head_dim].
- prefill chunks, expanded: kv_b_proj expands the cached latents of the chunk's whole context (prefix + chunk,
  read from the cache after the write) to K_nope and V; keys are [K_nope, k_pe]; SDPA with the lower-right causal
  mask.

Rope (``LatentRope``): DeepSeek rotates the rope dims as interleaved pairs (x0, x1), (x2, x3), ... (V2 always, V3
with rope_interleave); the result is laid out de-interleaved, as transformers' apply_rotary_pos_emb_interleave
does (V2's complex product keeps the pairs in place; q_pe . k_pe is the same either way, and only that dot
product reads them). YaRN (rope_scaling type yarn) as transformers computes it: its inverse frequencies, cos / sin
times the attention factor mscale(factor, mscale) / mscale(factor, mscale_all_dim), and the softmax scale times
mscale(factor, mscale_all_dim)^2 (``softmax_scale``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine import ops
from engine.layers.attention import AttentionMetadata


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _is_yarn(scaling: dict | None) -> bool:
    return bool(scaling) and scaling.get("rope_type", scaling.get("type")) == "yarn"


def softmax_scale(qk_head_dim: int, scaling: dict | None) -> float:
    """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN (transformers' yarn_apply_mscale)."""
    scale = qk_head_dim ** -0.5
    if _is_yarn(scaling) and scaling.get("mscale_all_dim"):
        m = _yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
        scale *= m * m
    return scale


def rope_frequencies(dim: int, theta: float, scaling: dict | None, max_position: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim / 2] float32, the factor cos and sin are multiplied by): plain rope, or YaRN as
    transformers' _compute_yarn_parameters (beta_fast 32, beta_slow 1, truncate by default)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        return 1.0 / pos_freqs, 1.0
    if not _is_yarn(scaling):
        raise ValueError(f"unsupported rope scaling {scaling.get('rope_type', scaling.get('type'))!r} for "
                         "multi-head latent attention (supported: yarn)")
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_position / original
    factor = float(factor)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class LatentRope(torch.nn.Module):
    """The rope of the qk_rope_head_dim dims: cos / sin from the step's positions (no table to size), applied to
    interleaved pairs (``interleaved``) or to the two halves (rotate_half, DeepSeek-V3 with rope_interleave off)."""

    def __init__(self, dim: int, theta: float, scaling: dict | None, max_position: int, interleaved: bool):
        super().__init__()
        inv_freq, self.attention_factor = rope_frequencies(dim, theta, scaling, max_position)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.interleaved = interleaved

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [T, ..., dim] rotated at positions [T]: a new tensor, the halves (x_even', x_odd') side by side."""
        freqs = positions.float()[:, None] * self.inv_freq  # [T, dim / 2]
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (freqs.shape[-1],)
        cos = (freqs.cos() * self.attention_factor).view(shape)
        sin = (freqs.sin() * self.attention_factor).view(shape)
        xf = x.float()
        if self.interleaved:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
        else:
            x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class LatentAttention(torch.nn.Module):
    """The paged latent cache of one layer and the attention over it (the module's docstring). Holds this rank's
    heads of kv_b_proj ([heads * (qk_nope + v_head), kv_lora_rank]), read as W_UK / W_UV by the decodes and as the
    expansion by the prefill chunks."""

    cache_tensors = 1  # one latent row per token: no separate values (engine/runner/kv_sizing.py)
    prefill_attention = "sdpa"  # the runner's backend only builds the step's metadata here (no varlen plans)

    def __init__(self, num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, scale: float, layer_index: int, dtype: torch.dtype):
        super().__init__()
        self.num_heads = num_heads  # this rank's
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.scale = scale
        self.layer_index = layer_index
        # the cache layout the runner allocates: one "KV head" of kv_lora_rank + qk_rope_head_dim values
        self.num_kv_heads = 1
        self.head_dim = kv_lora_rank + qk_rope_head_dim
        self.kv_b_weight = torch.nn.Parameter(
            torch.empty(num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank, dtype=dtype), requires_grad=False)
        self.k_cache: torch.Tensor | None = None  # bound by the runner
        self.v_cache: torch.Tensor | None = None  # stays None (cache_tensors = 1)
        self.k_scale = self.v_scale = None  # the runner's fp8 fields: MLA keeps its cache in the model's dtype
        self.compute_dtype: torch.dtype | None = None
        self.calibrate_scales = False
        self.backend = None  # bound by the runner; unused (the module's own routes)

    def warm_up_kernels(self) -> list[str]:
        """The runner's start-up hook for the Triton prefill variants (Attention.warm_up_kernels): none here."""
        return []

    def _w_uk_uv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [heads, qk_nope, rank] and W_UV [heads, v_head, rank]: views of kv_b_proj's rows."""
        w = self.kv_b_weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def forward(self, q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q_nope [T, heads, qk_nope], q_pe [T, heads, rope] (rotated), latent [T, kv_lora_rank] (normed), k_pe
        [T, rope] (rotated): the new tokens' latents written into the cache, then the attention; [T, heads * v]."""
        if self.k_cache.dtype != latent.dtype:
            raise NotImplementedError("multi-head latent attention keeps its cache in the model's dtype "
                                      "(--kv-cache-dtype fp8 is not supported for it)")
        T = q_nope.shape[0]
        row = torch.cat([latent, k_pe], dim=-1).view(T, 1, self.head_dim)
        ops.reshape_and_cache(row, row, self.k_cache, self.k_cache, meta.slot_mapping)  # the one tensor, twice
        out = torch.empty(T, self.num_heads, self.v_head_dim, dtype=q_nope.dtype, device=q_nope.device)
        nd = meta.num_decode_tokens
        if nd:
            out[:nd] = self._decode_absorbed(q_nope[:nd], q_pe[:nd], meta)
        for i, seg in enumerate(meta.prefills, start=nd):
            s, n = seg.query_start, seg.query_len
            out[s:s + n] = self._prefill_expanded(q_nope[s:s + n], q_pe[s:s + n], meta, i, seg.context_len,
                                                  len(seg.block_ids))
        return out.view(T, self.num_heads * self.v_head_dim)

    def _decode_absorbed(self, q_nope: torch.Tensor, q_pe: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """One query token per sequence over its cached latents (block tables as tensors: the decode buckets'
        static buffers work too, with their padded rows of context 0)."""
        w_uk, w_uv = self._w_uk_uv()
        L = self.kv_lora_rank
        tables, lens = meta.decode_block_tables, meta.decode_context_lens
        n, width = tables.shape
        cached = self.k_cache[tables.long()].view(n, width * self.k_cache.shape[1], self.head_dim)
        past = torch.arange(cached.shape[1], device=lens.device)[None, :] >= lens[:, None].long()
        # rows past a context: zeros, not what the slots hold (never-written memory may be NaN, and 0 x NaN is NaN)
        cached = cached.masked_fill_(past[..., None], 0)
        c_kv, k_pe = cached[..., :L], cached[..., L:]
        q_latent = torch.einsum("nhd,hdl->nhl", q_nope, w_uk)  # W_UK absorbed into the query
        scores = (torch.bmm(q_latent, c_kv.transpose(1, 2)) + torch.bmm(q_pe, k_pe.transpose(1, 2))).float()
        scores = scores.mul_(self.scale).masked_fill_(past[:, None, :], torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1).to(c_kv.dtype)
        o_latent = torch.bmm(probs, c_kv)  # [n, heads, rank]: the output in latent space
        return torch.einsum("nhl,hvl->nhv", o_latent, w_uv)  # then W_UV

    def _prefill_expanded(self, q_nope: torch.Tensor, q_pe: torch.Tensor, meta: AttentionMetadata, i: int,
                          context_len: int, num_blocks: int) -> torch.Tensor:
        """One prefill chunk: its context's latents (prefix + the chunk, from the cache) expanded by kv_b_proj."""
        n, H = q_nope.shape[0], self.num_heads
        L, dn = self.kv_lora_rank, self.qk_nope_head_dim
        blocks = meta.block_tables[i, :num_blocks].long()
        cached = self.k_cache[blocks].flatten(0, 1)[:context_len, 0]  # [ctx, rank + rope]
        kv = F.linear(cached[:, :L], self.kv_b_weight).view(context_len, H, dn + self.v_head_dim)
        k = torch.cat([kv[..., :dn], cached[:, None, L:].expand(context_len, H, self.qk_rope_head_dim)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, kv[..., dn:]))  # [1, heads, len, dim]
        if context_len == n:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            qpos = torch.arange(n, device=q.device).unsqueeze(1) + (context_len - n)
            mask = torch.arange(context_len, device=q.device).unsqueeze(0) <= qpos
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return o[0].transpose(0, 1)

    def load_kv_b(self, weights, name: str, head_range: tuple[int, int]) -> None:
        """This rank's heads of kv_b_proj ([heads * (qk_nope + v_head), kv_lora_rank], heads split)."""
        per = self.qk_nope_head_dim + self.v_head_dim
        w = weights.get_slice(name, 0, head_range[0] * per, head_range[1] * per)
        if tuple(w.shape) != tuple(self.kv_b_weight.shape):
            raise ValueError(f"{name}: shape {tuple(w.shape)} does not fit {tuple(self.kv_b_weight.shape)}")
        self.kv_b_weight.data.copy_(w)
