"""Paged varlen attention (Triton): every sequence of a step in one launch.

Each sequence s has query_len(s) new tokens (a prefill chunk, or 1 for a decode) and context_len(s) tokens in
the paged KV cache after this step's write: its cached prefix plus the new tokens. Query token i of s sits at
position context_len - query_len + i and attends to cache positions 0..that position (lower-right causal).
Keys and values are read in place through the block table: no gathered copy of the prefix, GQA by indexing
(query head h reads KV head h // (num_heads / num_kv_heads)). Online softmax in fp32, exp2 with the scale
folded in; bf16 / fp16 tensor-core dots (fp32 inputs use exact fp32 dots).

The grid is (query tiles, query heads). A query tile is BLOCK_M consecutive query tokens of one sequence; the
host plans the tiles once per step (``VarlenPlan``: every layer of the step reuses it), heaviest first so that
the long causal tiles do not end the launch alone. Inside a tile, the key blocks that every row sees run
without masks; only the blocks on the diagonal (and past the context) are masked.

Why Triton: it ships with torch on CUDA machines (nothing to build or carry), reaches FlashAttention-2-class
speed for this shape of problem, and the interpreter (TRITON_INTERPRET=1) runs the same kernel on the CPU in
tests. Configurations exist for sm_90 (227 KB of shared memory per block) and sm_89 / AD102 (99 KB); the GPU
tests force the sm_89 one on the H200.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch

from engine.ops.transfer import to_device

LOG2E = 1.4426950408889634
FP8 = torch.float8_e4m3fn


@functools.cache
def available() -> bool:
    """Triton is installed (CUDA builds of torch bring it; CPU-only builds do not: then SDPA runs). Asked by every
    attention layer of every step: a failed find_spec searches sys.path each time (~0.1 ms), so it is asked once."""
    return importlib.util.find_spec("triton") is not None


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _kernel():
    from engine.ops.varlen_attention_kernel import varlen_paged_attention_kernel as kernel

    return kernel


@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False  # load the unmasked key tiles with the Tensor Memory Accelerator (sm_90+; see tma_descriptors)

    def smem_bytes(self, head_dim: int, elem: int = 2) -> int:
        """Shared memory of the pipelined loads: the Q tile plus num_stages K and V tiles."""
        d = max(16, _pow2(head_dim))
        return elem * d * (self.block_m + 2 * self.num_stages * self.block_n)


# (head_dim <= 64, head_dim <= 128) per target. sm_89 (AD102, 99 KB per block, no TMA) configurations fit 99 KB.
# On the H200 (8B shape, head size 128, 4,096 new tokens over 8,192): with pointer loads through the block table
# 64 x 64 tiles, 4 warps, 2 stages ran fastest (389 TFLOP/s; 128 x 64 x 4 x 3: 379); with TMA loads of whole
# key tiles (KV blocks of 64+ tokens) 128 x 64 x 4 x 3 ran fastest (454; cuDNN through SDPA: 236 there, 615 on a
# fresh causal prompt, where the engine uses it). With the softmax scale folded into the exponent's multiply-add
# (2026-12-02) the same configuration reached 411-446 there and 453 on a fresh 8,192-token prompt (was 372-396).
# Triton 3.6's warp specialisation (tl.range(warp_specialize=True)) does not compile this kernel on sm_90.
CONFIGS = {
    "sm90": (KernelConfig(128, 64, 4, 3, tma=True), KernelConfig(128, 64, 4, 3, tma=True)),
    "sm89": (KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 4, 2)),
    "interpret": (KernelConfig(16, 16, 1, 1), KernelConfig(16, 16, 1, 1)),
}
# Steps with decodes or only short chunks: a decode is one query row of a BLOCK_M-row tile, so 128-row tiles
# double the work of the decodes in a mixed step (measured on the H200: 1,024 x (512 in, 256 out) fell from
# 4,848 to 4,291 output tok/s with 128 rows) and of short chunks (64 x 512: 199 TFLOP/s against 171).
SHORT_CONFIGS = {"sm90": KernelConfig(64, 64, 4, 2, tma=True)}
SHORT_QUERY = 512  # a step whose longest chunk is at most this many tokens counts as short


def config_for(device: torch.device, head_dim: int, target: str | None = None, short: bool = False
               ) -> KernelConfig:
    """The configuration for this device (or a forced target: 'sm90', 'sm89'); short: the step has decodes
    or only chunks of at most SHORT_QUERY tokens."""
    if target is None:
        if device.type != "cuda":
            target = "interpret"
        else:
            major, minor = torch.cuda.get_device_capability(device)
            target = "sm90" if (major, minor) >= (9, 0) else "sm89"
    small, large = CONFIGS[target]
    if short and target in SHORT_CONFIGS:
        return SHORT_CONFIGS[target]
    return small if head_dim <= 64 else large


@dataclass
class VarlenPlan:
    """The query tiles of one step for one BLOCK_M: tile_seq[t] is the sequence of tile t, tile_start[t]
    the first query row of the tile inside that sequence. Built on the host from the step's lengths."""

    block_m: int
    tile_seq: torch.Tensor  # [tiles] int32
    tile_start: torch.Tensor  # [tiles] int32
    num_tiles: int

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], block_m: int, device: torch.device
              ) -> VarlenPlan:
        tiles = []  # (work, seq, start)
        for s, (n, ctx) in enumerate(zip(query_lens, context_lens)):
            prefix = ctx - n
            for start in range(0, n, block_m):
                tiles.append((prefix + min(n, start + block_m), s, start))
        tiles.sort(key=lambda t: -t[0])
        flat = [t[1] for t in tiles] + [t[2] for t in tiles]
        packed = to_device(flat, torch.int32, device)
        n = len(tiles)
        return cls(block_m, packed[:n], packed[n:], n)


def _tensor_descriptor():
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # Triton < 3.4
        return None
    return TensorDescriptor


def tma_descriptors(k_cache: torch.Tensor, v_cache: torch.Tensor, cfg: KernelConfig, head_dim: int,
                    memo: dict | None = None):
    """TMA descriptors of the caches viewed as [blocks * block_size, nkv * hd] with [BLOCK_N, hd] boxes, or
    None where TMA cannot load a key tile: a tile must lie in one cache block (block_size % BLOCK_N == 0), the
    caches must be contiguous, head_dim a power of two (the box is the whole head) and the GPU sm_90+.
    ``memo``: the caller's dict (an attention layer's) keeping the last caches' descriptors, so that every step
    after the first skips the checks; it goes with its owner. (A registry of this module's own kept every
    unloaded model's caches alive, since a descriptor holds its tensor: on an H100, 2026-12-07, half of each
    shut-down engine's KV cache stayed allocated.)"""
    if not cfg.tma or k_cache.dtype == FP8:  # fp8 caches: pointer loads (TMA not validated on them)
        return None
    key = (k_cache.data_ptr(), v_cache.data_ptr(), tuple(k_cache.shape), k_cache.stride(), v_cache.stride(),
           k_cache.dtype, cfg.block_n, head_dim)
    if memo is not None and key in memo:
        return memo[key]
    found = None
    TensorDescriptor = _tensor_descriptor()
    if (TensorDescriptor is not None and k_cache.shape[1] % cfg.block_n == 0
            and head_dim == max(16, _pow2(head_dim)) and k_cache.is_contiguous() and v_cache.is_contiguous()
            and not (k_cache.is_cuda and torch.cuda.get_device_capability(k_cache.device) < (9, 0))):
        rows = k_cache.shape[0] * k_cache.shape[1]
        found = tuple(TensorDescriptor.from_tensor(c.view(rows, -1), [cfg.block_n, head_dim])
                      for c in (k_cache, v_cache))
    if memo is not None:
        if not any(k[0] == key[0] and k[1] == key[1] for k in memo):  # other caches (reallocated): drop theirs
            memo.clear()
        memo[key] = found
    return found


def _interpreted() -> bool:
    return type(_kernel()).__name__ == "InterpretedFunction"


def _fail(msg: str):
    raise ValueError(f"varlen_paged_attention: {msg}")


def varlen_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                           plan: VarlenPlan, scale: float, out: torch.Tensor | None = None,
                           config: KernelConfig | None = None, lse: torch.Tensor | None = None,
                           tma_memo: dict | None = None, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of every query token of a step over the paged cache (module docstring).

    q [T, nh, hd] (last dim contiguous; strided heads/rows fine); k_cache, v_cache [num_blocks, block_size,
    nkv, hd] (last dim contiguous); block_tables [S, M] int32; seq_lens [S] int32 (context lengths);
    query_start_loc [S + 1] int32; plan: the step's tiles for config.block_m. Returns out [T, nh, hd].

    With ``lse`` [T, nh] float32 (any strides), ``out`` already holds each query's attention over its own chunk
    (normalised, causal) and lse its natural log-sum-exp of the scaled scores: the kernel adds the cached prefix
    and merges (``chunk_self_attention`` computes that state; engine/layers/attention.py ``_chunk_over_prefix``).
    ``tma_memo``: where the caches' TMA descriptors are remembered (tma_descriptors), the attention layer's.
    fp8 e4m3 caches (--kv-cache-dtype fp8) need k_scale and v_scale (float32, one element, on q's device): keys
    and values are read as stored value x scale."""
    if not available():
        _fail("Triton is not installed")
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        _fail(f"q must be [T, nh, hd] and the caches [blocks, block_size, nkv, hd], got {list(q.shape)}, "
              f"{list(k_cache.shape)}, {list(v_cache.shape)}")
    T, nh, hd = q.shape
    nkv = k_cache.shape[2]
    if k_cache.shape[3] != hd or nkv == 0 or nh % nkv:
        _fail(f"{nh} query heads of size {hd} do not fit the caches' {nkv} KV heads of size {k_cache.shape[3]}")
    fp8 = k_cache.dtype == FP8
    if v_cache.dtype != k_cache.dtype or (k_cache.dtype != q.dtype and not fp8):
        _fail(f"the caches must be {q.dtype} or both {FP8}, got {k_cache.dtype} / {v_cache.dtype}")
    if fp8 and not all(t is not None and t.dtype == torch.float32 and t.numel() == 1 and t.device == q.device
                       for t in (k_scale, v_scale)):
        _fail("fp8 caches need k_scale and v_scale: float32 tensors of one element on q's device")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        _fail("the last dimension of q and the caches must be contiguous")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        if t.dtype != torch.int32:
            _fail(f"{name} must be int32, got {t.dtype}")
    if block_tables.dim() != 2 or block_tables.stride(1) != 1:
        _fail("block_tables must be [S, M] with a contiguous last dimension")
    if lse is not None and (out is None or lse.shape != (T, nh) or lse.dtype != torch.float32):
        _fail(f"resuming needs out and lse [{T}, {nh}] float32, got lse {list(lse.shape)} {lse.dtype}")
    if out is None:
        out = torch.empty(T, nh, hd, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        _fail(f"out must be [{T}, {nh}, {hd}] of {q.dtype} with a contiguous last dim")
    cfg = config or config_for(q.device, hd)
    if plan.block_m != cfg.block_m:
        _fail(f"the plan was built for BLOCK_M {plan.block_m}, the kernel runs {cfg.block_m}")
    if plan.num_tiles == 0 or T == 0:
        return out
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if q.device.type != "cuda" and not _interpreted():
        _fail("CPU tensors run only under Triton's interpreter (TRITON_INTERPRET=1 before Triton is imported)")
    descriptors = tma_descriptors(k_cache, v_cache, cfg, hd, tma_memo)
    k_desc, v_desc = descriptors or (k_cache, v_cache)  # unused without TMA
    _kernel()[(plan.num_tiles, nh)](
        q, k_cache, v_cache, k_desc, v_desc, out, out if lse is None else lse, block_tables, seq_lens,
        query_start_loc, plan.tile_seq, plan.tile_start, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache,
        scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        0 if lse is None else lse.stride(0), 0 if lse is None else lse.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=nh // nkv, CACHE_BLOCK=k_cache.shape[1], HEAD_DIM=hd,
        BLOCK_D=max(16, _pow2(hd)), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        PRECISION=precision, DOT_F32=q.device.type == "cpu" and q.dtype == torch.bfloat16,
        WIDE=max(k_cache.shape[0] * k_cache.stride(0), v_cache.shape[0] * v_cache.stride(0)) >= 2 ** 31,
        TMA=descriptors is not None, RESUME=lse is not None, FP8=fp8,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


_CUDNN_REFUSED: set[tuple] = set()  # (device, dtype, heads, kv heads, head size) cuDNN raised on: not tried again


def chunk_self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Causal attention of one prefill chunk over its own keys, with each row's log-sum-exp: q [n, nh, hd],
    k and v [n, nkv, hd] (strided rows fine). Returns (out [n, nh, hd], lse [n, nh] float32, natural log of the
    scaled scores), the state ``varlen_paged_attention(..., out=out, lse=lse)`` merges with the cached
    prefix; or None where cuDNN's flash attention cannot run it (not CUDA, fp32, no cuDNN attention, a head size
    over 128, a shape it refused).

    Why: on the H200 cuDNN's kernel (SDPA's private entry point, the one F.scaled_dot_product_attention picks for
    fresh prompts there) runs causal attention at ~500-600 TFLOP/s, the Triton kernel at ~400-450; a chunk over a
    cached prefix spends a third of its attention FLOPs (for a chunk as long as its prefix) on its own keys."""
    n, nh, hd = q.shape
    nkv = k.shape[1]
    key = (q.device, q.dtype, nh, nkv, hd)
    op = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    if (op is None or not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16) or hd > 128 or hd % 8
            or not torch.backends.cuda.cudnn_sdp_enabled() or key in _CUDNN_REFUSED):
        return None
    qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, n, hd] views
    try:
        res = op(qs, ks, vs, None, True, 0.0, True, False, scale=scale)
    except RuntimeError:  # a cuDNN build or GPU without this configuration: the Triton kernel does it all
        _CUDNN_REFUSED.add(key)
        return None
    out, lse = res[0], res[1]
    return out[0].transpose(0, 1), lse.reshape(nh, n).transpose(0, 1)


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_ids: list[list[int]],
              context_lens: list[int], query_lens: list[int], scale: float, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 reference: for each sequence, gather its context from the cache and attend with a lower-right
    causal mask, heads grouped by index (fp8 caches read as value x k_scale / v_scale). Returns [T, nh, hd]
    float32."""
    T, nh, hd = q.shape
    nkv = k_cache.shape[2]
    out = torch.empty(T, nh, hd, dtype=torch.float32, device=q.device)
    q0 = 0
    for blocks, ctx, n in zip(block_ids, context_lens, query_lens):
        idx = torch.tensor(blocks, dtype=torch.long, device=q.device)
        k = k_cache[idx].flatten(0, 1)[:ctx].float()  # [ctx, nkv, hd]
        v = v_cache[idx].flatten(0, 1)[:ctx].float()
        if k_scale is not None:
            k, v = k * k_scale.float(), v * v_scale.float()
        group = torch.arange(nh, device=q.device) // (nh // nkv)
        k, v = k[:, group], v[:, group]  # [ctx, nh, hd]
        qs = q[q0:q0 + n].float()
        s = torch.einsum("qhd,khd->hqk", qs, k) * scale
        qpos = torch.arange(n, device=q.device)[:, None] + (ctx - n)
        s = s.masked_fill(torch.arange(ctx, device=q.device)[None, :] > qpos, float("-inf"))
        out[q0:q0 + n] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)
        q0 += n
    return out


def flops(query_lens: list[int], context_lens: list[int], num_heads: int, head_dim: int) -> float:
    """Multiply-add FLOPs of the two attention matmuls (QK^T and PV), causal pairs only."""
    pairs = 0
    for n, ctx in zip(query_lens, context_lens):
        prefix = ctx - n
        pairs += n * prefix + n * (n + 1) // 2
    return 4.0 * pairs * num_heads * head_dim


__all__ = [
    "CONFIGS",
    "KernelConfig",
    "SHORT_CONFIGS",
    "SHORT_QUERY",
    "VarlenPlan",
    "available",
    "chunk_self_attention",
    "config_for",
    "flops",
    "reference",
    "tma_descriptors",
    "varlen_paged_attention",
]
