"""The Python face of Kestrel's native kernels (engine._C).

Every function takes torch tensors on CPU or CUDA, checks device, dtype, shape and strides with cheap
attribute reads (this is the decode hot path: ~10 calls per layer), and passes raw pointers, sizes,
strides, a dtype code and (CUDA) the current stream to engine._C. Misuse raises ValueError.

dtypes: float32, bfloat16, float16; arithmetic is fp32 inside the kernels. The rounding points are those
of the pure-torch references in ``engine.ops.reference`` (which documents them).

If engine._C cannot be imported (a source tree that was never built), the functions fall back to the
references (``linear`` to torch's F.linear, which has the same semantics and is much faster than the
fp32 reference); that is logged as a warning and ``native_available()`` returns False. Set
KESTREL_REQUIRE_NATIVE=1 to make a missing native module an ImportError instead.

CPU: the dispatcher picks AVX-512, AVX2 or scalar kernels at import (``cpu_isa()``); KESTREL_CPU_ISA
forces a level ("avx512bf16": AVX-512 plus the bf16 dot product, used by ``linear``; ``linear_isa()``).
CUDA tensors need a build with the CUDA toolkit (``engine._C.has_cuda``); ``linear`` hands them to torch.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch
import torch.nn.functional as F

from engine.ops import reference
from engine.ops.int8 import Int8Weight

__all__ = [
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "linear",
    "Int8Weight",
    "reshape_and_cache",
    "paged_decode_attention",
    "native_available",
    "cuda_available",
    "cpu_isa",
    "available_isas",
    "linear_isa",
    "set_num_threads",
    "reference",
]

log = logging.getLogger(__name__)

try:
    from engine import _C
except ImportError as _exc:  # not built: fall back to the references, loudly
    if os.environ.get("KESTREL_REQUIRE_NATIVE", "") not in ("", "0"):
        raise ImportError(f"engine._C (Kestrel's native kernels) is not importable: {_exc}") from _exc
    _C = None
    _msg = (
        f"engine._C is not importable ({_exc}); engine.ops runs the slow pure-torch reference kernels. "
        "Build the native module with `pip install -e .` (or `pip install .`)."
    )
    log.warning(_msg)
    warnings.warn(_msg, RuntimeWarning, stacklevel=2)

_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_HAS_CUDA = bool(_C is not None and _C.has_cuda)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def native_available() -> bool:
    """True when engine._C is loaded (the kernels below are native, not the torch references)."""
    return _C is not None


def cuda_available() -> bool:
    """True when engine._C was compiled with the CUDA kernels."""
    return _HAS_CUDA


def cpu_isa() -> str:
    """The ISA level the CPU dispatcher uses ('avx512', 'avx2', 'scalar'), or 'reference' without _C."""
    return _C.cpu_isa() if _C is not None else "reference"


def available_isas() -> list[str]:
    return list(_C.available_isas()) if _C is not None else []


def linear_isa() -> str:
    """The level the CPU linear kernels use: cpu_isa(), or 'avx512bf16' (AVX-512 with the bf16 dot product
    vdpbf16ps) where the CPU has it; 'reference' without _C."""
    return _C.linear_isa() if _C is not None else "reference"


def set_num_threads(n: int) -> None:
    """Threads the native CPU kernels may use (they use fewer when the work is small)."""
    if n < 1:
        raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
    if _C is not None:
        _C.set_num_threads(int(n))


# ------------------------------------------------------------------------------------------------
# Validation. The hot path of each op is one compact boolean test of cheap attributes; only when it
# fails does a cold validator below work out what exactly is wrong (and raise ValueError), or accept
# the input (e.g. a size-1 dim whose stride the compact test did not like).


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def _stream(t: torch.Tensor) -> int:
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _cuda_ready(op: str, first: torch.Tensor, *others: torch.Tensor) -> None:
    """first is a CUDA tensor: the others must be on its device and the CUDA kernels must exist."""
    dev = first.device
    for t in others:
        if t.device != dev:
            _fail(op, f"all tensors must be on {dev}, got one on {t.device}")
    if not _HAS_CUDA:
        _fail(op, "got CUDA tensors, but engine._C was built without CUDA (no CUDA compiler at build time). "
                  "Rebuild on a machine with the CUDA toolkit (nvcc on PATH), or run on CPU.")


def _not_cpu(op: str, *tensors: torch.Tensor):
    for t in tensors:
        if not t.is_cpu:
            _fail(op, f"tensors must all be on CPU or all on one CUDA device, got one on {t.device}")


def _check_dtype(op: str, name: str, t: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    if dtype is None:
        if t.dtype not in _DTYPE_CODE:
            _fail(op, f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    elif t.dtype != dtype:
        _fail(op, f"{name} must be {dtype}, got {t.dtype}")


def _check_shape(op: str, name: str, t: torch.Tensor, shape: tuple) -> None:
    """shape: ints, or None for 'any size'."""
    ok = t.dim() == len(shape) and all(s is None or t.shape[i] == s for i, s in enumerate(shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        _fail(op, f"{name} must have shape {want}, got {list(t.shape)}")


def _check_last_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(op, f"{name}'s last dimension must be contiguous (row-strided views are fine)")


def _check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        _fail(op, f"{name} must be contiguous")


def _validate_norm(op: str, x, weight, residual=None, out=None) -> None:
    _check_dtype(op, "x", x)
    _check_shape(op, "x", x, (None, None))
    _check_last_contiguous(op, "x", x)
    T, H = x.shape
    _check_dtype(op, "weight", weight, x.dtype)
    _check_shape(op, "weight", weight, (H,))
    _check_contiguous(op, "weight", weight)
    for name, t in (("residual", residual), ("out", out)):
        if t is not None:
            _check_dtype(op, name, t, x.dtype)
            _check_shape(op, name, t, (T, H))
            _check_last_contiguous(op, name, t)


# ------------------------------------------------------------------------------------------------
# normalisation


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [T, H] (last dim contiguous, rows may be strided) with weight [H].

    Returns `out`: a new [T, H] tensor unless given (then [T, H] of x's dtype, rows may be strided)."""
    if _C is None:
        y = reference.rms_norm(x, weight, eps)
        return y if out is None else out.copy_(y)
    dt = _DTYPE_CODE.get(x.dtype)
    shape = x.shape
    xs = x.stride()
    ws = weight.shape
    if (dt is None or len(shape) != 2 or xs[1] != 1 or weight.dtype != x.dtype or len(ws) != 1 or ws[0] != shape[1]
            or not weight.is_contiguous()):
        _validate_norm("rms_norm", x, weight)
    if out is None:
        out = torch.empty_like(x)  # x is dense with a contiguous last dim, or this is contiguous
    elif out.dtype != x.dtype or out.shape != shape or out.stride()[1] != 1:
        _validate_norm("rms_norm", x, weight, out=out)
    if x.is_cuda:
        _cuda_ready("rms_norm", x, weight, out)
        _C.cuda_rms_norm(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], weight.data_ptr(), shape[0],
                         shape[1], eps, x.get_device(), _stream(x))
    else:
        if not (x.is_cpu and weight.is_cpu and out.is_cpu):
            _not_cpu("rms_norm", x, weight, out)
        _C.rms_norm(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], weight.data_ptr(), shape[0], shape[1],
                    eps)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place (vLLM semantics): residual <- x + residual (stored in the dtype), then
    x <- rms_norm(residual) * weight. x and residual: [T, H], rows may be strided."""
    if _C is None:
        return reference.fused_add_rms_norm(x, residual, weight, eps)
    dt = _DTYPE_CODE.get(x.dtype)
    shape = x.shape
    xs = x.stride()
    rs = residual.stride()
    ws = weight.shape
    if (dt is None or len(shape) != 2 or xs[1] != 1 or residual.dtype != x.dtype or residual.shape != shape
            or rs[1] != 1 or weight.dtype != x.dtype or len(ws) != 1 or ws[0] != shape[1]
            or not weight.is_contiguous()):
        _validate_norm("fused_add_rms_norm", x, weight, residual=residual)
    if x.is_cuda:
        _cuda_ready("fused_add_rms_norm", x, residual, weight)
        _C.cuda_fused_add_rms_norm(dt, x.data_ptr(), xs[0], residual.data_ptr(), rs[0], weight.data_ptr(), shape[0],
                                   shape[1], eps, x.get_device(), _stream(x))
    else:
        if not (x.is_cpu and residual.is_cpu and weight.is_cpu):
            _not_cpu("fused_add_rms_norm", x, residual, weight)
        _C.fused_add_rms_norm(dt, x.data_ptr(), xs[0], residual.data_ptr(), rs[0], weight.data_ptr(), shape[0],
                              shape[1], eps)


# ------------------------------------------------------------------------------------------------
# rotary embedding


def _validate_rotary(op, positions, q, k, head_size, cache) -> None:
    _check_dtype(op, "q", q)
    _check_shape(op, "q", q, (None, None))
    T = q.shape[0]
    _check_dtype(op, "k", k, q.dtype)
    _check_shape(op, "k", k, (T, None))
    _check_last_contiguous(op, "q", q)
    _check_last_contiguous(op, "k", k)
    if head_size <= 0 or q.shape[1] % head_size or k.shape[1] % head_size:
        _fail(op, f"head_size {head_size} must divide q's width {q.shape[1]} and k's width {k.shape[1]}")
    _check_dtype(op, "positions", positions, torch.int64)
    _check_shape(op, "positions", positions, (T,))
    _check_contiguous(op, "positions", positions)
    _check_dtype(op, "cos_sin_cache", cache, torch.float32)
    _check_shape(op, "cos_sin_cache", cache, (None, None))
    _check_contiguous(op, "cos_sin_cache", cache)
    rot = cache.shape[1]
    if rot == 0 or rot % 2 or rot > head_size:
        _fail(op, f"cos_sin_cache's rot_dim {rot} must be even, > 0 and <= head_size {head_size}")


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
    if _C is None:
        return reference.rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)
    dt = _DTYPE_CODE.get(q.dtype)
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
        _cuda_ready("rotary_embedding", q, k, positions, cos_sin_cache)
        _C.cuda_rotary_embedding(dt, positions.data_ptr(), q.data_ptr(), qs[0], k.data_ptr(), ks[0], T,
                                 qshape[1] // head_size, kshape[1] // head_size, head_size, cos_sin_cache.data_ptr(),
                                 cshape[1], bool(is_neox), q.get_device(), _stream(q))
    else:
        if not (q.is_cpu and k.is_cpu and positions.is_cpu and cos_sin_cache.is_cpu):
            _not_cpu("rotary_embedding", q, k, positions, cos_sin_cache)
        _C.rotary_embedding(dt, positions.data_ptr(), q.data_ptr(), qs[0], k.data_ptr(), ks[0], T,
                            qshape[1] // head_size, kshape[1] // head_size, head_size, cos_sin_cache.data_ptr(),
                            cshape[0], cshape[1], bool(is_neox))


# ------------------------------------------------------------------------------------------------
# activation


def _validate_silu(op, x, out) -> None:
    _check_dtype(op, "x", x)
    _check_shape(op, "x", x, (None, None))
    if x.shape[1] % 2:
        _fail(op, f"x must be [T, 2*I] (an even last dim), got {list(x.shape)}")
    _check_last_contiguous(op, "x", x)
    if out is not None:
        _check_dtype(op, "out", out, x.dtype)
        _check_shape(op, "out", out, (x.shape[0], x.shape[1] // 2))
        _check_last_contiguous(op, "out", out)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] (last dim contiguous, rows may be strided) -> [T, I] = silu(x[:, :I]) * x[:, I:].

    Returns `out`: a new contiguous tensor unless given (then [T, I] of x's dtype, rows may be strided)."""
    if _C is None:
        y = reference.silu_and_mul(x)
        return y if out is None else out.copy_(y)
    dt = _DTYPE_CODE.get(x.dtype)
    shape = x.shape
    xs = x.stride()
    if dt is None or len(shape) != 2 or shape[1] % 2 or xs[1] != 1:
        _validate_silu("silu_and_mul", x, None)
    T, inter = shape[0], shape[1] // 2
    if out is None:
        out = torch.empty(T, inter, dtype=x.dtype, device=x.device)
    elif out.dtype != x.dtype or out.shape != (T, inter) or out.stride()[1] != 1:
        _validate_silu("silu_and_mul", x, out)
    if inter == 0 or T == 0:
        return out
    if x.is_cuda:
        _cuda_ready("silu_and_mul", x, out)
        _C.cuda_silu_and_mul(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], T, inter, x.get_device(),
                             _stream(x))
    else:
        if not (x.is_cpu and out.is_cpu):
            _not_cpu("silu_and_mul", x, out)
        _C.silu_and_mul(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], T, inter)
    return out


# ------------------------------------------------------------------------------------------------
# linear (GEMM / GEMV)

# Rows of x (M) from which a CPU call goes to torch's F.linear instead of the native kernel, per dtype
# (None: never). Measured side by side on the 2-core EPYC dev machine (torch 2.13 with oneDNN / MKL;
# SmolLM2 shapes K 576 / 1536, N 576 ... 49152; M 1 ... 512): per core (thread CPU time, so the shared
# machine's load does not count) the native kernel was faster or on par at every M: decode GEMV
# (M <= 16, weights from DRAM) 1.2-2.2x, bf16 prefill GEMM (M = 512) ~200 GFLOP/s against torch's
# ~190-200 (~90% of this core's vdpbf16ps peak), fp32 ~105 against ~85-92 GFLOP/s, fp16 ~4-5x at
# M >= 16 (torch has no fast fp16 path on this CPU).
# With 2 threads torch's OpenMP regions are the fragile ones on a loaded machine (one descheduled
# thread stalls the call for a time slice). So no M is routed to torch; re-measure on other CPUs
# (python -m engine.ops.bench) before setting one.
_LINEAR_TORCH_MIN_M = {torch.float32: None, torch.bfloat16: None, torch.float16: None}


def _torch_linear(x, weight, bias, out):
    if out is None:
        return F.linear(x, weight, bias)
    if x.dim() != 2:
        return out.copy_(F.linear(x, weight, bias))
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def _validate_linear(op, x, weight, bias, out) -> None:
    _check_dtype(op, "x", x)
    _check_shape(op, "x", x, (None, None))
    _check_last_contiguous(op, "x", x)
    M, K = x.shape
    _check_dtype(op, "weight", weight, x.dtype)
    _check_shape(op, "weight", weight, (None, K))
    _check_contiguous(op, "weight", weight)
    N = weight.shape[0]
    if bias is not None:
        _check_dtype(op, "bias", bias, x.dtype)
        _check_shape(op, "bias", bias, (N,))
        _check_contiguous(op, "bias", bias)
    if out is not None:
        _check_dtype(op, "out", out, x.dtype)
        _check_shape(op, "out", out, (M, N))
        _check_last_contiguous(op, "out", out)


def linear(x: torch.Tensor, weight: torch.Tensor | Int8Weight, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T + bias, like F.linear: x [..., K] (rows may be strided, last dim contiguous),
    weight [N, K] contiguous, bias [N] or None, all of one dtype; fp32 accumulation, one rounding.
    weight may be an Int8Weight (engine/ops/int8.py): int8 with a scale per group of 32, x's dtype out.

    Returns `out`: a new [..., N] tensor unless given (then [M, N] for a 2-D x, rows may be strided;
    for x with more dims, a tensor that views as [M, N]). CPU calls run the native GEMV (decode, M <= 16)
    / GEMM kernels on up to set_num_threads() threads (fewer when the call is small); CUDA tensors (and
    CPU calls without engine._C, or at an M routed by _LINEAR_TORCH_MIN_M) go to torch's F.linear."""
    if isinstance(weight, Int8Weight):
        return _linear_int8(x, weight, bias, out)
    shape = x.shape
    if len(shape) != 2:
        if len(shape) < 1:
            _fail("linear", f"x must have at least 1 dim, got {list(shape)}")
        lead = shape[:-1]
        out2 = None if out is None else out.view(-1, weight.shape[0])
        y = linear(x.reshape(-1, shape[-1]), weight, bias, out2)
        return y.view(*lead, weight.shape[0]) if out is None else out
    if _C is None or not x.is_cpu:
        return _torch_linear(x, weight, bias, out)
    dtype = x.dtype
    dt = _DTYPE_CODE.get(dtype)
    ws = weight.shape
    xs = x.stride()
    if (dt is None or weight.dtype != dtype or len(ws) != 2 or ws[1] != shape[1] or (xs[1] != 1 and shape[1] > 1)
            or not weight.is_contiguous()
            or (bias is not None and (bias.dtype != dtype or bias.shape != (ws[0],) or not bias.is_contiguous()))):
        _validate_linear("linear", x, weight, bias, out)
    M, K = shape
    N = ws[0]
    if not (weight.is_cpu and (bias is None or bias.is_cpu)):
        _not_cpu("linear", x, weight, *(() if bias is None else (bias,)))
    min_m = _LINEAR_TORCH_MIN_M[dtype]
    if min_m is not None and M >= min_m:
        return _torch_linear(x, weight, bias, out)
    if out is None:
        out = torch.empty(M, N, dtype=dtype)
        os0 = N
    else:
        if out.dtype != dtype or out.shape != (M, N) or (out.stride()[1] != 1 and N > 1):
            _validate_linear("linear", x, weight, bias, out)
        if not out.is_cpu:
            _not_cpu("linear", x, weight, out)
        os0 = out.stride()[0]
    _C.linear(dt, out.data_ptr(), os0, x.data_ptr(), xs[0], weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
              M, N, K)
    return out


def _linear_int8(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None, out: torch.Tensor | None
                 ) -> torch.Tensor:
    """linear() with int8 weights: the native kernels on the CPU, else (CUDA, no engine._C) the weights
    dequantized for this call."""
    N, K = weight.shape
    if x.shape[-1] != K:
        _fail("linear", f"x's last dim {x.shape[-1]} does not match the int8 weight's K {K}")
    if x.dim() != 2:
        y = _linear_int8(x.reshape(-1, K), weight, bias, None if out is None else out.view(-1, N))
        return y.view(*x.shape[:-1], N) if out is None else out
    dt = _DTYPE_CODE.get(x.dtype)
    if _C is None or not x.is_cpu or dt is None:
        return _torch_linear(x, weight.dequantize(x.dtype), bias, out)
    _check_last_contiguous("linear", "x", x)
    if bias is not None:
        _check_dtype("linear", "bias", bias, x.dtype)
        _check_shape("linear", "bias", bias, (N,))
        _check_contiguous("linear", "bias", bias)
    M = x.shape[0]
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype)
    else:
        _check_dtype("linear", "out", out, x.dtype)
        _check_shape("linear", "out", out, (M, N))
        _check_last_contiguous("linear", "out", out)
    _C.linear(dt, out.data_ptr(), out.stride(0), x.data_ptr(), x.stride(0), weight.q.data_ptr(),
              0 if bias is None else bias.data_ptr(), M, N, K, weight.scales.data_ptr())
    return out


# ------------------------------------------------------------------------------------------------
# paged KV cache


def _validate_caches(op, k_cache, v_cache, dtype) -> None:
    _check_shape(op, "k_cache", k_cache, (None, None, None, None))
    _check_shape(op, "v_cache", v_cache, tuple(k_cache.shape))
    _check_dtype(op, "k_cache", k_cache, dtype)
    _check_dtype(op, "v_cache", v_cache, dtype)
    _check_contiguous(op, "k_cache", k_cache)
    _check_contiguous(op, "v_cache", v_cache)


def _validate_cache_write(op, key, value, k_cache, v_cache, slot_mapping) -> None:
    _check_dtype(op, "key", key)
    _check_shape(op, "key", key, (None, None, None))
    T, nkv, hd = key.shape
    _check_dtype(op, "value", value, key.dtype)
    _check_shape(op, "value", value, (T, nkv, hd))
    _check_last_contiguous(op, "key", key)
    _check_last_contiguous(op, "value", value)
    _validate_caches(op, k_cache, v_cache, key.dtype)
    _check_shape(op, "k_cache", k_cache, (None, None, nkv, hd))
    _check_dtype(op, "slot_mapping", slot_mapping, torch.int64)
    _check_shape(op, "slot_mapping", slot_mapping, (T,))
    _check_contiguous(op, "slot_mapping", slot_mapping)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, nkv, hd] (strided views fine; last dim contiguous) into the caches
    [num_blocks, block_size, nkv, hd] at slot_mapping [T] int64 (block * block_size + offset; < 0 skips).
    On CPU a slot past the cache raises ValueError; on CUDA slots are not checked."""
    if _C is None:
        return reference.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
    dt = _DTYPE_CODE.get(key.dtype)
    shape, cshape = key.shape, k_cache.shape
    ks, vs = key.stride(), value.stride()
    ss = slot_mapping.shape
    if (dt is None or len(shape) != 3 or value.shape != shape or value.dtype != key.dtype or ks[2] != 1
            or vs[2] != 1 or len(cshape) != 4 or v_cache.shape != cshape or cshape[2] != shape[1] or cshape[3] != shape[2]
            or k_cache.dtype != key.dtype or v_cache.dtype != key.dtype or not k_cache.is_contiguous()
            or not v_cache.is_contiguous() or slot_mapping.dtype != torch.int64 or len(ss) != 1 or ss[0] != shape[0]
            or not slot_mapping.is_contiguous()):
        _validate_cache_write("reshape_and_cache", key, value, k_cache, v_cache, slot_mapping)
    T, nkv, hd = shape
    if key.is_cuda:
        _cuda_ready("reshape_and_cache", key, value, k_cache, v_cache, slot_mapping)
        _C.cuda_reshape_and_cache(dt, key.data_ptr(), ks[0], ks[1], value.data_ptr(), vs[0], vs[1],
                                  k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(), T, nkv, hd,
                                  key.get_device(), _stream(key))
    else:
        if not (key.is_cpu and value.is_cpu and k_cache.is_cpu and v_cache.is_cpu and slot_mapping.is_cpu):
            _not_cpu("reshape_and_cache", key, value, k_cache, v_cache, slot_mapping)
        _C.reshape_and_cache(dt, key.data_ptr(), ks[0], ks[1], value.data_ptr(), vs[0], vs[1], k_cache.data_ptr(),
                             v_cache.data_ptr(), slot_mapping.data_ptr(), T, nkv, hd, cshape[0] * cshape[1])


def _validate_attention(op, q, k_cache, v_cache, block_tables, context_lens, out) -> None:
    _check_dtype(op, "q", q)
    _check_shape(op, "q", q, (None, None, None))
    _check_last_contiguous(op, "q", q)
    B, nh, hd = q.shape
    _validate_caches(op, k_cache, v_cache, q.dtype)
    nkv = k_cache.shape[2]
    if k_cache.shape[3] != hd:
        _fail(op, f"q's head_size {hd} differs from the caches' {k_cache.shape[3]}")
    if nkv == 0 or nh % nkv:
        _fail(op, f"num_heads {nh} must be a multiple of the caches' num_kv_heads {nkv}")
    _check_dtype(op, "block_tables", block_tables, torch.int32)
    _check_shape(op, "block_tables", block_tables, (B, None))
    _check_last_contiguous(op, "block_tables", block_tables)
    _check_dtype(op, "context_lens", context_lens, torch.int32)
    _check_shape(op, "context_lens", context_lens, (B,))
    _check_contiguous(op, "context_lens", context_lens)
    if out is not None:
        _check_dtype(op, "out", out, q.dtype)
        _check_shape(op, "out", out, (B, nh, hd))
        _check_last_contiguous(op, "out", out)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: q [B, nh, hd] (one token per sequence; strided views fine, last dim contiguous)
    over the first context_lens[b] tokens of the caches [num_blocks, block_size, nkv, hd] through
    block_tables [B, M] int32; context_lens [B] int32. Head h uses kv head h // (nh / nkv).

    Returns `out`: a new [B, nh, hd] tensor unless given (then [B, nh, hd] of q's dtype, last dim
    contiguous). A sequence with context length 0 gets zeros. On CPU, context lengths and block ids are
    checked against the tables and the caches (ValueError); on CUDA they are not."""
    if _C is None:
        y = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
        return y if out is None else out.copy_(y)
    dt = _DTYPE_CODE.get(q.dtype)
    shape, cshape, btshape = q.shape, k_cache.shape, block_tables.shape
    qs = q.stride()
    cls = context_lens.shape
    if (dt is None or len(shape) != 3 or qs[2] != 1 or len(cshape) != 4 or v_cache.shape != cshape
            or cshape[3] != shape[2] or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype
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
        _cuda_ready("paged_decode_attention", q, k_cache, v_cache, block_tables, context_lens, out)
        dev = q.get_device()
        n_ws = _C.cuda_paged_decode_attention_workspace(B, nh, hd, btshape[1] * cshape[1], dev)
        ws = torch.empty(n_ws, dtype=torch.float32, device=q.device) if n_ws else None
        _C.cuda_paged_decode_attention(dt, out.data_ptr(), os_[0], os_[1], q.data_ptr(), qs[0], qs[1],
                                       k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                                       block_tables.stride(0), btshape[1], context_lens.data_ptr(), B, nh,
                                       cshape[2], hd, cshape[1], scale, ws.data_ptr() if n_ws else 0, n_ws, dev,
                                       _stream(q))
    else:
        if not (q.is_cpu and k_cache.is_cpu and v_cache.is_cpu and block_tables.is_cpu and context_lens.is_cpu
                and out.is_cpu):
            _not_cpu("paged_decode_attention", q, k_cache, v_cache, block_tables, context_lens, out)
        _C.paged_decode_attention(dt, out.data_ptr(), os_[0], os_[1], q.data_ptr(), qs[0], qs[1],
                                  k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                                  block_tables.stride(0), btshape[1], context_lens.data_ptr(), B, nh, cshape[2], hd,
                                  cshape[1], cshape[0], scale)
    return out
