"""The row-wise kernels over [T, H] activations: RMSNorm (plain and fused with the residual add) and the
SiLU-gated activation of the MLP (silu_and_mul). Dispatch as described in engine/ops/native.py."""

from __future__ import annotations

import torch

from engine.ops import reference
from engine.ops.native import (
    _C,
    _check_contiguous,
    _check_dtype,
    _check_last_contiguous,
    _check_shape,
    _cuda_ready,
    _dtype_code,
    _fail,
    _not_cpu,
    _stream,
)

# ------------------------------------------------------------------------------------------------
# normalisation


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [T, H] (last dim contiguous, rows may be strided) with weight [H].

    Returns `out`: a new [T, H] tensor unless given (then [T, H] of x's dtype, rows may be strided)."""
    if _C is None:
        y = reference.rms_norm(x, weight, eps)
        return y if out is None else out.copy_(y)
    dt = _dtype_code(x.dtype)
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
    dt = _dtype_code(x.dtype)
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
    dt = _dtype_code(x.dtype)
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
