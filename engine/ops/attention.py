"""The paged KV cache: where a step's tokens go in it (token_positions_and_slots), writing new keys and values
into it (reshape_and_cache) and decode attention over it (paged_decode_attention). Dispatch as described in engine/ops/native.py."""

from __future__ import annotations

import torch

from engine.ops import reference
from engine.ops.native import (
    FP8_CACHE_CODE,
    cache_code,
    check_contiguous,
    check_cuda,
    check_dtype,
    check_last_contiguous,
    check_scales,
    check_shape,
    dtype_code,
    fail,
    fail_not_cpu,
    mode,
    native_lib,
    raw_stream,
)


FP8 = torch.float8_e4m3fn


def _validate_caches(op, k_cache, v_cache, dtype) -> None:
    """The caches: one shape, contiguous, of ``dtype`` (the model's) or both fp8 e4m3 (--kv-cache-dtype fp8)."""
    check_shape(op, "k_cache", k_cache, (None, None, None, None))
    check_shape(op, "v_cache", v_cache, tuple(k_cache.shape))
    cache_dtype = FP8 if k_cache.dtype == FP8 else dtype
    check_dtype(op, "k_cache", k_cache, cache_dtype)
    check_dtype(op, "v_cache", v_cache, cache_dtype)
    check_contiguous(op, "k_cache", k_cache)
    check_contiguous(op, "v_cache", v_cache)


def _validate_cache_write(op, key, value, k_cache, v_cache, slot_mapping) -> None:
    check_dtype(op, "key", key)
    check_shape(op, "key", key, (None, None, None))
    T, nkv, hd = key.shape
    check_dtype(op, "value", value, key.dtype)
    check_shape(op, "value", value, (T, nkv, hd))
    check_last_contiguous(op, "key", key)
    check_last_contiguous(op, "value", value)
    _validate_caches(op, k_cache, v_cache, key.dtype)
    check_shape(op, "k_cache", k_cache, (None, None, nkv, hd))
    check_dtype(op, "slot_mapping", slot_mapping, torch.int64)
    check_shape(op, "slot_mapping", slot_mapping, (T,))
    check_contiguous(op, "slot_mapping", slot_mapping)


def token_positions_and_slots(query_start_loc: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
                              block_size: int, num_tokens: int, max_query_len: int
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions and KV-cache slots (int64 [T], views of one new buffer) of a step's T tokens, computed where
    the step's metadata lives instead of as host lists: token t of sequence s (query_start_loc[s] <= t <
    query_start_loc[s + 1]) sits at position context_lens[s] - query_len(s) + (t - query_start_loc[s]) and goes
    to slot block_tables[s, pos // block_size] * block_size + pos % block_size.

    query_start_loc [S + 1], context_lens [S], block_tables [S, M] (contiguous last dim): int32, on one device.
    max_query_len: the longest query_len (CUDA sizes its grid by it). On CPU inconsistent arguments raise
    ValueError; on CUDA they are not checked (they live on the device)."""
    op = "token_positions_and_slots"
    S = context_lens.shape[0] if context_lens.dim() == 1 else -1
    for name, t, shape in (("query_start_loc", query_start_loc, (S + 1,)), ("context_lens", context_lens, (S,)),
                           ("block_tables", block_tables, (S, None))):
        check_dtype(op, name, t, torch.int32)
        check_shape(op, name, t, shape)
    check_contiguous(op, "query_start_loc", query_start_loc)
    check_contiguous(op, "context_lens", context_lens)
    check_last_contiguous(op, "block_tables", block_tables)
    if block_size <= 0:
        fail(op, f"block_size must be > 0, got {block_size}")
    if native_lib is None:
        return reference.token_positions_and_slots(query_start_loc, context_lens, block_tables, block_size)
    out = torch.empty(2, num_tokens, dtype=torch.int64, device=context_lens.device)
    positions, slots = out[0], out[1]
    if context_lens.is_cuda:
        check_cuda(op, query_start_loc, context_lens, block_tables)
        native_lib.cuda_token_positions_and_slots(
            query_start_loc.data_ptr(), context_lens.data_ptr(), block_tables.data_ptr(), block_tables.stride(0), S,
            max_query_len, block_size, positions.data_ptr(), slots.data_ptr(), context_lens.get_device(),
            raw_stream(context_lens))
    else:
        if not (query_start_loc.is_cpu and block_tables.is_cpu):
            fail_not_cpu(op, query_start_loc, context_lens, block_tables)
        native_lib.token_positions_and_slots(query_start_loc.data_ptr(), context_lens.data_ptr(),
                                             block_tables.data_ptr(), block_tables.stride(0), block_tables.shape[1],
                                             S, num_tokens, block_size, positions.data_ptr(), slots.data_ptr())
    return positions, slots


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write key/value [T, nkv, hd] (strided views fine; last dim contiguous) into the caches
    [num_blocks, block_size, nkv, hd] at slot_mapping [T] int64 (block * block_size + offset; < 0 skips).
    On CPU a slot past the cache raises ValueError; on CUDA slots are not checked.

    fp8 e4m3 caches (--kv-cache-dtype fp8) hold fp32(x) / scale saturated to +-448, with k_scale and v_scale
    float32 tensors of one element on the caches' device (read there by the kernel: capturable in a CUDA graph);
    on the CPU such caches take the torch reference (reference.to_cache)."""
    if native_lib is None or (k_cache.dtype == FP8 and not key.is_cuda):
        if k_cache.dtype == FP8:
            check_scales("reshape_and_cache", k_scale, v_scale, k_cache.device)
        return reference.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    dt = dtype_code(key.dtype)
    cdt = dt if k_cache.dtype == key.dtype else cache_code(k_cache.dtype)
    shape, cshape = key.shape, k_cache.shape
    ks, vs = key.stride(), value.stride()
    ss = slot_mapping.shape
    if (dt is None or len(shape) != 3 or value.shape != shape or value.dtype != key.dtype or ks[2] != 1
            or vs[2] != 1 or len(cshape) != 4 or v_cache.shape != cshape or cshape[2] != shape[1] or cshape[3] != shape[2]
            or (cdt != dt and cdt != FP8_CACHE_CODE) or v_cache.dtype != k_cache.dtype or not k_cache.is_contiguous()
            or not v_cache.is_contiguous() or slot_mapping.dtype != torch.int64 or len(ss) != 1 or ss[0] != shape[0]
            or not slot_mapping.is_contiguous()):
        _validate_cache_write("reshape_and_cache", key, value, k_cache, v_cache, slot_mapping)
    T, nkv, hd = shape
    if key.is_cuda:
        check_cuda("reshape_and_cache", key, value, k_cache, v_cache, slot_mapping)
        ksp = vsp = 0
        if cdt == FP8_CACHE_CODE:
            check_scales("reshape_and_cache", k_scale, v_scale, k_cache.device)
            ksp, vsp = k_scale.data_ptr(), v_scale.data_ptr()
        native_lib.cuda_reshape_and_cache(dt, key.data_ptr(), ks[0], ks[1], value.data_ptr(), vs[0], vs[1],
                                          k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(), T,
                                          nkv, hd, cdt, ksp, vsp, key.get_device(), raw_stream(key))
    else:
        if not (key.is_cpu and value.is_cpu and k_cache.is_cpu and v_cache.is_cpu and slot_mapping.is_cpu):
            fail_not_cpu("reshape_and_cache", key, value, k_cache, v_cache, slot_mapping)
        native_lib.reshape_and_cache(dt, key.data_ptr(), ks[0], ks[1], value.data_ptr(), vs[0], vs[1],
                                     k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(), T, nkv,
                                     hd, cshape[0] * cshape[1])


def _validate_attention(op, q, k_cache, v_cache, block_tables, context_lens, out) -> None:
    check_dtype(op, "q", q)
    check_shape(op, "q", q, (None, None, None))
    check_last_contiguous(op, "q", q)
    B, nh, hd = q.shape
    _validate_caches(op, k_cache, v_cache, q.dtype)
    nkv = k_cache.shape[2]
    if k_cache.shape[3] != hd:
        fail(op, f"q's head_size {hd} differs from the caches' {k_cache.shape[3]}")
    if nkv == 0 or nh % nkv:
        fail(op, f"num_heads {nh} must be a multiple of the caches' num_kv_heads {nkv}")
    check_dtype(op, "block_tables", block_tables, torch.int32)
    check_shape(op, "block_tables", block_tables, (B, None))
    check_last_contiguous(op, "block_tables", block_tables)
    check_dtype(op, "context_lens", context_lens, torch.int32)
    check_shape(op, "context_lens", context_lens, (B,))
    check_contiguous(op, "context_lens", context_lens)
    if out is not None:
        check_dtype(op, "out", out, q.dtype)
        check_shape(op, "out", out, (B, nh, hd))
        check_last_contiguous(op, "out", out)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    part_tokens: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: q [B, nh, hd] (one token per sequence; strided views fine, last dim contiguous)
    over the first context_lens[b] tokens of the caches [num_blocks, block_size, nkv, hd] through
    block_tables [B, M] int32; context_lens [B] int32. Head h uses kv head h // (nh / nkv).

    Returns `out`: a new [B, nh, hd] tensor unless given (then [B, nh, hd] of q's dtype, last dim
    contiguous). A sequence with context length 0 gets zeros. On CPU, context lengths and block ids are
    checked against the tables and the caches (ValueError); on CUDA they are not. Under set_batch_invariant
    a CPU row's result depends on its own query, cache and context length only. On the CPU, consecutive rows whose
    block tables agree over their contexts (a verify pass's k + 1 rows of one request) are one span: its rows read
    the cache once, each row with the arithmetic it gets alone (the same bits at the same context partitions;
    csrc/cpu/kernels.h).

    part_tokens (CUDA): 0 sizes the split-K partitions to fill the GPU at the table's capacity (block_tables'
    width x block size: an eager step's longest context); > 0 fixes them at that many tokens over the whole
    capacity (the partitions past each sequence's context exit at once); < 0 cuts each sequence's context on the
    device into -part_tokens partitions of at least 32 tokens (CUDA graphs: their table is as wide as the longest
    possible context).

    fp8 e4m3 caches (--kv-cache-dtype fp8): read as value x k_scale / v_scale (float32 tensors of one element on
    the caches' device); the CUDA kernels only (the CPU runs the torch reference on them)."""
    if native_lib is None or (k_cache.dtype == FP8 and not q.is_cuda):
        if k_cache.dtype == FP8:
            check_scales("paged_decode_attention", k_scale, v_scale, k_cache.device)
        y = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale,
                                             v_scale)
        return y if out is None else out.copy_(y)
    dt = dtype_code(q.dtype)
    cdt = dt if k_cache.dtype == q.dtype else cache_code(k_cache.dtype)
    shape, cshape, btshape = q.shape, k_cache.shape, block_tables.shape
    qs = q.stride()
    cls = context_lens.shape
    if (dt is None or len(shape) != 3 or qs[2] != 1 or len(cshape) != 4 or v_cache.shape != cshape
            or cshape[3] != shape[2] or (cdt != dt and cdt != FP8_CACHE_CODE) or v_cache.dtype != k_cache.dtype
            or not k_cache.is_contiguous() or not v_cache.is_contiguous() or not cshape[2] or shape[1] % cshape[2]
            or block_tables.dtype != torch.int32 or len(btshape) != 2 or btshape[0] != shape[0]
            or block_tables.stride()[1] != 1 or context_lens.dtype != torch.int32
            or len(cls) != 1 or cls[0] != shape[0] or not context_lens.is_contiguous()):
        _validate_attention("paged_decode_attention", q, k_cache, v_cache, block_tables, context_lens, None)
    B, nh, hd = shape
    if out is None:
        out = torch.empty_like(q)  # q is dense with a contiguous last dim, or this is contiguous
    elif out.dtype != q.dtype or out.shape != shape or out.stride()[2] != 1:
        _validate_attention("paged_decode_attention", q, k_cache, v_cache, block_tables, context_lens, out)
    if B == 0:
        return out
    os_ = out.stride()
    if q.is_cuda:
        check_cuda("paged_decode_attention", q, k_cache, v_cache, block_tables, context_lens, out)
        dev = q.get_device()
        n_ws = native_lib.cuda_paged_decode_attention_workspace(B, nh, cshape[2], hd, btshape[1] * cshape[1],
                                                                part_tokens, dev)
        ws = torch.empty(n_ws, dtype=torch.float32, device=q.device) if n_ws else None
        ksp = vsp = 0
        if cdt == FP8_CACHE_CODE:
            check_scales("paged_decode_attention", k_scale, v_scale, k_cache.device)
            ksp, vsp = k_scale.data_ptr(), v_scale.data_ptr()
        native_lib.cuda_paged_decode_attention(dt, out.data_ptr(), os_[0], os_[1], q.data_ptr(), qs[0], qs[1],
                                               k_cache.data_ptr(), v_cache.data_ptr(),
                                               block_tables.data_ptr(), block_tables.stride(0), btshape[1],
                                               context_lens.data_ptr(), B, nh, cshape[2], hd, cshape[1],
                                               scale, ws.data_ptr() if n_ws else 0, n_ws, part_tokens, cdt, ksp,
                                               vsp, dev, raw_stream(q))
    else:
        if not (q.is_cpu and k_cache.is_cpu and v_cache.is_cpu and block_tables.is_cpu and context_lens.is_cpu
                and out.is_cpu):
            fail_not_cpu("paged_decode_attention", q, k_cache, v_cache, block_tables, context_lens, out)
        native_lib.paged_decode_attention(dt | mode.flags, out.data_ptr(), os_[0], os_[1], q.data_ptr(),
                                          qs[0], qs[1], k_cache.data_ptr(), v_cache.data_ptr(),
                                          block_tables.data_ptr(), block_tables.stride(0), btshape[1],
                                          context_lens.data_ptr(), B, nh, cshape[2], hd, cshape[1], cshape[0],
                                          scale)
    return out
