"""Pure-torch references of the native kernels in engine._C.

Each function has the same signature and the same semantics as its counterpart in ``engine.ops``,
including the in-place ones (``fused_add_rms_norm``, ``rotary_embedding`` and ``reshape_and_cache``
mutate their arguments and return ``None``), so that ``engine.ops`` can fall back to them one for one
when the native module is missing. Tests clone their inputs before calling these.

They are written to be read, not to be fast: fp32 arithmetic, results rounded to the tensor dtype at
the same points the kernels round:

- RMSNorm follows HF/vLLM: ``y = dtype(dtype(x * rsqrt(mean(x^2) + eps)) * w)``.
- fused add + RMSNorm stores ``residual = dtype(x + residual)`` first and normalises that stored value.
- SiLU-and-mul rounds the activation before the product: ``dtype(dtype(silu(gate)) * up)``.
- rotary embedding and attention compute in fp32 and round once at the end.
- linear computes ``x @ W^T + b`` in fp32 and rounds once at the end (after the bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H], weight [H] -> new tensor [T, H]."""
    xf = x.float()
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    normed = (xf * inv_rms).to(x.dtype)
    return (normed.float() * weight.float()).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual <- dtype(x + residual); x <- rms_norm(residual) * weight."""
    summed = (x.float() + residual.float()).to(x.dtype)
    residual.copy_(summed)
    x.copy_(rms_norm(summed, weight, eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool) -> torch.Tensor:
    """x [T, n*head_size] -> rotated copy; cos/sin [T, rot_dim/2] float32."""
    T = x.shape[0]
    rot_dim = 2 * cos.shape[-1]
    heads = x.float().reshape(T, -1, head_size)
    rot, rest = heads[..., :rot_dim], heads[..., rot_dim:]
    c, s = cos[:, None, :], sin[:, None, :]
    if is_neox:  # pairs (i, i + rot_dim/2), HF Llama's rotate_half
        x1, x2 = rot[..., : rot_dim // 2], rot[..., rot_dim // 2 :]
        rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    else:  # GPT-J: interleaved pairs (2i, 2i + 1)
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1).to(x.dtype).reshape(T, -1)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """In place on q [T, nh*hd] and k [T, nkv*hd]. cos_sin_cache [max_pos, rot_dim] float32 holds cos in
    its first rot_dim/2 columns and sin in the rest (any rope scaling is already baked into it)."""
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    q.copy_(_rotate(q, cos, sin, head_size, is_neox))
    k.copy_(_rotate(k, cos, sin, head_size, is_neox))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] = x @ weight^T + bias."""
    b = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> [T, I] = silu(x[:, :I]) * x[:, I:]."""
    inter = x.shape[-1] // 2
    gate, up = x[..., :inter].float(), x[..., inter:].float()
    return (F.silu(gate).to(x.dtype).float() * up).to(x.dtype)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In place: token t's key/value [nkv, hd] go to slot slot_mapping[t] of the caches
    [num_blocks, block_size, nkv, hd] (slot = block * block_size + offset); slot < 0 is skipped."""
    num_blocks, block_size = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slots] = key[keep]
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slots] = value[keep]


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, nh, hd]: one query token per sequence attending to the first context_lens[b] tokens of its
    blocks (block_tables [B, M] int32) in the caches [num_blocks, block_size, nkv, hd]. Query head h
    reads kv head h // (nh / nkv). A sequence with context length 0 gets zeros. Returns [B, nh, hd]."""
    B, nh, hd = q.shape
    block_size, nkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(B, nh, hd, dtype=q.dtype, device=q.device)
    for b in range(B):
        n = int(context_lens[b])
        if n == 0:
            continue
        blocks = block_tables[b, : (n + block_size - 1) // block_size].long()
        k = k_cache[blocks].reshape(-1, nkv, hd)[:n].float()  # [n, nkv, hd]
        v = v_cache[blocks].reshape(-1, nkv, hd)[:n].float()
        k = k.repeat_interleave(nh // nkv, dim=1)  # [n, nh, hd]
        v = v.repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        probs = scores.softmax(dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, v).to(q.dtype)
    return out
