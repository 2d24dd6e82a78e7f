"""Rotary position embedding, in place on q and k (NeoX or GPT-J pairing). Dispatch as described in
engine/ops/native.py."""

from __future__ import annotations

import torch

from engine.ops import reference
from engine.ops.native import (
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
    native_lib,
    raw_stream,
)


def _validate_rotary(op, positions, q, k, head_size, cache) -> None:
    check_dtype(op, "q", q)
    check_shape(op, "q", q, (None, None))
    T = q.shape[0]
    check_dtype(op, "k", k, q.dtype)
    check_shape(op, "k", k, (T, None))
    check_last_contiguous(op, "q", q)
    check_last_contiguous(op, "k", k)
    if head_size <= 0 or q.shape[1] % head_size or k.shape[1] % head_size:
        fail(op, f"head_size {head_size} must divide q's width {q.shape[1]} and k's width {k.shape[1]}")
    check_dtype(op, "positions", positions, torch.int64)
    check_shape(op, "positions", positions, (T,))
    check_contiguous(op, "positions", positions)
    check_dtype(op, "cos_sin_cache", cache, torch.float32)
    check_shape(op, "cos_sin_cache", cache, (None, None))
    check_contiguous(op, "cos_sin_cache", cache)
    rot = cache.shape[1]
    if rot == 0 or rot % 2 or rot > head_size:
        fail(op, f"cos_sin_cache's rot_dim {rot} must be even, > 0 and <= head_size {head_size}")


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """In place on q [T, nh*hd] and k [T, nkv*hd] (row-strided views with a contiguous last dim are fine).

    positions [T] int64; cos_sin_cache [max_pos, rot_dim] float32, cos in the first rot_dim/2 columns and
    sin in the rest; only the first rot_dim dims of each head rotate. is_neox: pairs (i, i + rot_dim/2)
    (HF Llama's rotate_half); otherwise GPT-J's interleaved pairs (2i, 2i + 1). On CPU a position outside
    the cache raises ValueError; on CUDA positions are not checked (they live on the device)."""
    if native_lib is None:
        return reference.rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)
    dt = dtype_code(q.dtype)
    qshape, kshape, cshape = q.shape, k.shape, cos_sin_cache.shape
    qs, ks = q.stride(), k.stride()
    ps = positions.shape
    if (dt is None or len(qshape) != 2 or len(kshape) != 2 or k.dtype != q.dtype or qs[1] != 1 or ks[1] != 1
            or kshape[0] != qshape[0] or head_size <= 0 or qshape[1] % head_size or kshape[1] % head_size
            or positions.dtype != torch.int64 or len(ps) != 1 or ps[0] != qshape[0] or not positions.is_contiguous()
            or cos_sin_cache.dtype != torch.float32 or len(cshape) != 2 or not cos_sin_cache.is_contiguous()
            or cshape[1] % 2 or cshape[1] > head_size or cshape[1] == 0):
        _validate_rotary("rotary_embedding", positions, q, k, head_size, cos_sin_cache)
    T = qshape[0]
    if q.is_cuda:
        check_cuda("rotary_embedding", q, k, positions, cos_sin_cache)
        native_lib.cuda_rotary_embedding(dt, positions.data_ptr(), q.data_ptr(), qs[0], k.data_ptr(), ks[0],
                                         T, qshape[1] // head_size, kshape[1] // head_size, head_size,
                                         cos_sin_cache.data_ptr(), cshape[1], bool(is_neox), q.get_device(),
                                         raw_stream(q))
    else:
        if not (q.is_cpu and k.is_cpu and positions.is_cpu and cos_sin_cache.is_cpu):
            fail_not_cpu("rotary_embedding", q, k, positions, cos_sin_cache)
        native_lib.rotary_embedding(dt, positions.data_ptr(), q.data_ptr(), qs[0], k.data_ptr(), ks[0], T,
                                    qshape[1] // head_size, kshape[1] // head_size, head_size,
                                    cos_sin_cache.data_ptr(), cshape[0], cshape[1], bool(is_neox))


def rotary_and_cache(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """``rotary_embedding(positions, q, k, ...)`` then ``reshape_and_cache`` of k and v [T, nkv*hd] (row-strided
    views fine) into the caches at slot_mapping: one kernel on CUDA (a decode layer's rope and cache write in one
    launch), the two ops elsewhere and for any input the fused kernel does not take (which they then check).
    fp8 caches: k_scale / v_scale as reshape_and_cache takes them."""
    T = q.shape[0]
    cs = k_cache.shape
    if (native_lib is not None and q.is_cuda and q.dim() == 2 and k.dim() == 2 and v.shape == k.shape
            and k.shape[0] == T and head_size > 0 and q.shape[1] % head_size == 0 and k.shape[1] % head_size == 0
            and q.dtype == k.dtype == v.dtype and v_cache.dtype == k_cache.dtype
            and (k_cache.dtype == q.dtype or k_cache.dtype == torch.float8_e4m3fn) and dtype_code(q.dtype) is not None
            and q.stride(1) == 1 and k.stride(1) == 1 and v.stride(1) == 1
            and len(cs) == 4 and v_cache.shape == cs and cs[2] * cs[3] == k.shape[1] and cs[3] == head_size
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and positions.dtype == torch.int64 and positions.shape == (T,) and positions.is_contiguous()
            and slot_mapping.dtype == torch.int64 and slot_mapping.shape == (T,) and slot_mapping.is_contiguous()
            and cos_sin_cache.dtype == torch.float32 and cos_sin_cache.dim() == 2 and cos_sin_cache.is_contiguous()
            and 0 < cos_sin_cache.shape[1] <= head_size and cos_sin_cache.shape[1] % 2 == 0):
        check_cuda("rotary_and_cache", q, k, v, k_cache, v_cache, positions, slot_mapping, cos_sin_cache)
        ksp = vsp = 0
        if k_cache.dtype != q.dtype:  # fp8
            check_scales("rotary_and_cache", k_scale, v_scale, k_cache.device)
            ksp, vsp = k_scale.data_ptr(), v_scale.data_ptr()
        native_lib.cuda_rotary_and_cache(dtype_code(q.dtype), positions.data_ptr(), q.data_ptr(), q.stride(0),
                                         k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(),
                                         v_cache.data_ptr(), slot_mapping.data_ptr(), T, q.shape[1] // head_size,
                                         k.shape[1] // head_size, head_size, cos_sin_cache.data_ptr(),
                                         cos_sin_cache.shape[1], bool(is_neox), cache_code(k_cache.dtype), ksp, vsp,
                                         q.get_device(), raw_stream(q))
        return
    from engine.ops.attention import reshape_and_cache

    rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)
    nkv = k.shape[1] // head_size if head_size > 0 else 0
    reshape_and_cache(k.view(T, nkv, head_size), v.view(T, nkv, head_size), k_cache, v_cache, slot_mapping,
                      k_scale, v_scale)
