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


FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x as the KV cache stores it: an fp8 (e4m3) cache holds fp32(x) / scale saturated to +-448 and rounded to
    nearest even (the CUDA kernels' __nv_cvt_float_to_fp8 with __NV_SATFINITE); any other cache holds x in its own
    dtype. scale: a float32 scalar tensor (1.0 when None)."""
    if cache_dtype != torch.float8_e4m3fn:
        return x.to(cache_dtype)
    xf = x.float() if scale is None else x.float() / scale.float()
    return xf.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(cache_dtype)


def from_cache(c: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Cached keys or values as float32: an fp8 cache's values times its scale, any other as they are."""
    if c.dtype != torch.float8_e4m3fn or scale is None:
        return c.float()
    return c.float() * scale.float()


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """In place: token t's key/value [nkv, hd] go to slot slot_mapping[t] of the caches
    [num_blocks, block_size, nkv, hd] (slot = block * block_size + offset); slot < 0 is skipped. An fp8 cache
    stores them as ``to_cache`` does with k_scale / v_scale."""
    num_blocks, block_size = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slots] = to_cache(key[keep], k_cache.dtype, k_scale)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slots] = to_cache(value[keep], v_cache.dtype, v_scale)


def token_positions_and_slots(query_start_loc: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
                              block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and cache slots (int64 [T]) of a step's tokens: token t of sequence s (query_start_loc[s] <= t <
    query_start_loc[s + 1]) sits at position context_lens[s] - query_len(s) + (t - query_start_loc[s]), in slot
    block_tables[s, pos // block_size] * block_size + pos % block_size."""
    qsl = query_start_loc.long()
    lens = qsl[1:] - qsl[:-1]
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=qsl.device), lens)
    t = torch.arange(seq.numel(), device=qsl.device)
    positions = t - qsl[seq] + context_lens.long()[seq] - lens[seq]
    slots = block_tables.long()[seq, positions // block_size] * block_size + positions % block_size
    return positions, slots


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, nh, hd]: one query token per sequence attending to the first context_lens[b] tokens of its
    blocks (block_tables [B, M] int32) in the caches [num_blocks, block_size, nkv, hd]. Query head h
    reads kv head h // (nh / nkv). A sequence with context length 0 gets zeros. Returns [B, nh, hd].
    fp8 caches are read as ``from_cache`` with k_scale / v_scale."""
    B, nh, hd = q.shape
    block_size, nkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(B, nh, hd, dtype=q.dtype, device=q.device)
    for b in range(B):
        n = int(context_lens[b])
        if n == 0:
            continue
        blocks = block_tables[b, : (n + block_size - 1) // block_size].long()
        k = from_cache(k_cache[blocks].reshape(-1, nkv, hd)[:n], k_scale)  # [n, nkv, hd] float32
        v = from_cache(v_cache[blocks].reshape(-1, nkv, hd)[:n], v_scale)
        k = k.repeat_interleave(nh // nkv, dim=1)  # [n, nh, hd]
        v = v.repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        probs = scores.softmax(dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, v).to(q.dtype)
    return out


# -- GGUF quantized weights (engine/ops/gguf_quant.py, csrc/cpu/gguf.h) --------------------------------------------
# ggml type id -> (bytes per block of 32, offset of the quants in a block)
_GGUF_BLOCKS = {2: (18, 2), 3: (20, 4), 8: (34, 2)}


def gguf_dequantize(data: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """GGUF rows (uint8 [N, row_bytes]) of Q4_0 / Q4_1 / Q8_0 -> float32 [N, k], as ``gguf.quants.dequantize``:
    Q4_0 d * (q - 8), Q4_1 d * q + m, Q8_0 d * q (d, m float16 at the block's start)."""
    size, qs = _GGUF_BLOCKS[int(qtype)]
    n = data.shape[0]
    blocks = data.reshape(n, k // 32, size)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [n, nb, 1]
    if qtype == 8:
        q = blocks[..., qs:].contiguous().view(torch.int8).float()
        return (d * q).reshape(n, k)
    nib = blocks[..., qs:].long()
    q = torch.cat([nib & 0x0F, nib >> 4], dim=-1).float()  # byte j: weight j (low), weight j + 16 (high)
    if qtype == 2:
        return (d * (q - 8)).reshape(n, k)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float()
    return (d * q + m).reshape(n, k)


def gguf_quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q, d, s): per block of 32, d = absmax / 127, q = round_half_even(x / d) in [-127, 127] (as
    float32, [M, K / 32, 32]), s = sum(q) ([M, K / 32, 1]): llama.cpp's Q8_0 / Q8_1 activations, as the kernels
    quantize them (x * (1 / d), each an IEEE fp32 operation)."""
    m, k = x.shape
    g = x.float().reshape(m, k // 32, 32)
    amax = g.abs().amax(dim=-1, keepdim=True)
    d = amax / torch.full_like(amax, 127.0)
    inv = torch.where(d != 0, torch.ones_like(d) / d, torch.zeros_like(d))
    q = torch.round(g * inv).clamp_(-127, 127)
    return q, d, q.sum(dim=-1, keepdim=True)


def gguf_linear(x: torch.Tensor, data: torch.Tensor, qtype: int, k: int, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
    """x [M, K] @ W^T + bias with W the GGUF rows ``data`` (the file's block layout), the CPU kernels' arithmetic:
    x is quantized per block (gguf_quantize_activations) and each (weight block, x block) pair contributes
    d_w d_x sum(q_w q_x) (Q4_0: q_w = nibble - 8; Q4_1 adds m_w d_x s_x). fp32 accumulation, one rounding to x's
    dtype. (The kernels' prefill regime gets the same products through a float GEMM on the dequantized weights and
    the quantized x, rounded to x's dtype: float32 matches this up to summation order.)"""
    n = data.shape[0]
    size, qs = _GGUF_BLOCKS[int(qtype)]
    blocks = data.reshape(n, k // 32, size)
    dw = blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)  # [n, nb]
    if qtype == 8:
        qw = blocks[..., qs:].contiguous().view(torch.int8).double()
    else:
        nib = blocks[..., qs:].long()
        qw = torch.cat([nib & 0x0F, nib >> 4], dim=-1).double() - (8 if qtype == 2 else 0)
    qx, dx, sx = gguf_quantize_activations(x)
    # integer dots are exact in float64; then the scales in fp32
    dots = torch.einsum("mbj,nbj->mnb", qx.double(), qw).float()  # [m, n, nb]
    y = (dots * (dw.unsqueeze(0) * dx.squeeze(-1).unsqueeze(1))).sum(-1)
    if qtype == 3:
        mw = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)  # [n, nb]
        y = y + (mw.unsqueeze(0) * (dx * sx).squeeze(-1).unsqueeze(1)).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
