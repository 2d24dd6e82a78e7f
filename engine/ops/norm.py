"""The row-wise kernels over [T, H] activations: RMSNorm (plain and fused with the residual add) and the
SiLU-gated activation of the MLP (silu_and_mul). Dispatch as described in engine/ops/native.py."""

from __future__ import annotations

import torch

from engine.ops import reference
from engine.ops.native import (
    check_contiguous,
    check_cuda,
    check_dtype,
    check_last_contiguous,
    check_shape,
    dtype_code,
    fail,
    fail_not_cpu,
    native_lib,
    raw_stream,
)

# ------------------------------------------------------------------------------------------------
# normalisation


def _validate_norm(op: str, x, weight, residual=None, out=None) -> None:
    check_dtype(op, "x", x)
    check_shape(op, "x", x, (None, None))
    check_last_contiguous(op, "x", x)
    T, H = x.shape
    check_dtype(op, "weight", weight, x.dtype)
    check_shape(op, "weight", weight, (H,))
    check_contiguous(op, "weight", weight)
    for name, t in (("residual", residual), ("out", out)):
        if t is not None:
            check_dtype(op, name, t, x.dtype)
            check_shape(op, name, t, (T, H))
            check_last_contiguous(op, name, t)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [T, H] (last dim contiguous, rows may be strided) with weight [H].

    Returns `out`: a new [T, H] tensor unless given (then [T, H] of x's dtype, rows may be strided)."""
    if native_lib is None:
        y = reference.rms_norm(x, weight, eps)
        return y if out is None else out.copy_(y)
    dt = dtype_code(x.dtype)
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
        check_cuda("rms_norm", x, weight, out)
        native_lib.cuda_rms_norm(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], weight.data_ptr(),
                                 shape[0], shape[1], eps, x.get_device(), raw_stream(x))
    else:
        if not (x.is_cpu and weight.is_cpu and out.is_cpu):
            fail_not_cpu("rms_norm", x, weight, out)
        native_lib.rms_norm(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], weight.data_ptr(),
                            shape[0], shape[1], eps)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place (vLLM semantics): residual <- x + residual (stored in the dtype), then
    x <- rms_norm(residual) * weight. x and residual: [T, H], rows may be strided."""
    if native_lib is None:
        return reference.fused_add_rms_norm(x, residual, weight, eps)
    dt = dtype_code(x.dtype)
    shape = x.shape
    xs = x.stride()
    rs = residual.stride()
    ws = weight.shape
    if (dt is None or len(shape) != 2 or xs[1] != 1 or residual.dtype != x.dtype or residual.shape != shape
            or rs[1] != 1 or weight.dtype != x.dtype or len(ws) != 1 or ws[0] != shape[1]
            or not weight.is_contiguous()):
        _validate_norm("fused_add_rms_norm", x, weight, residual=residual)
    if x.is_cuda:
        check_cuda("fused_add_rms_norm", x, residual, weight)
        native_lib.cuda_fused_add_rms_norm(dt, x.data_ptr(), xs[0], residual.data_ptr(), rs[0],
                                           weight.data_ptr(), shape[0], shape[1], eps, x.get_device(),
                                           raw_stream(x))
    else:
        if not (x.is_cpu and residual.is_cpu and weight.is_cpu):
            fail_not_cpu("fused_add_rms_norm", x, residual, weight)
        native_lib.fused_add_rms_norm(dt, x.data_ptr(), xs[0], residual.data_ptr(), rs[0], weight.data_ptr(),
                                      shape[0], shape[1], eps)


# ------------------------------------------------------------------------------------------------
# activation


def _validate_silu(op, x, out) -> None:
    check_dtype(op, "x", x)
    check_shape(op, "x", x, (None, None))
    if x.shape[1] % 2:
        fail(op, f"x must be [T, 2*I] (an even last dim), got {list(x.shape)}")
    check_last_contiguous(op, "x", x)
    if out is not None:
        check_dtype(op, "out", out, x.dtype)
        check_shape(op, "out", out, (x.shape[0], x.shape[1] // 2))
        check_last_contiguous(op, "out", out)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] (last dim contiguous, rows may be strided) -> [T, I] = silu(x[:, :I]) * x[:, I:].

    Returns `out`: a new contiguous tensor unless given (then [T, I] of x's dtype, rows may be strided)."""
    if native_lib is None:
        y = reference.silu_and_mul(x)
        return y if out is None else out.copy_(y)
    dt = dtype_code(x.dtype)
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
        check_cuda("silu_and_mul", x, out)
        native_lib.cuda_silu_and_mul(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], T, inter,
                                     x.get_device(), raw_stream(x))
    else:
        if not (x.is_cpu and out.is_cpu):
            fail_not_cpu("silu_and_mul", x, out)
        native_lib.silu_and_mul(dt, out.data_ptr(), out.stride(0), x.data_ptr(), xs[0], T, inter)
    return out
