"""linear (GEMM / GEMV, csrc/cpu/gemm*): y = x @ weight^T + bias with a weight tensor or an Int8Weight, on the
native CPU kernels or torch's F.linear. Dispatch as described in engine/ops/native.py; CUDA tensors go to torch.

(Named gemm, not linear, so that the module does not shadow the function ``engine.ops.linear``.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops import skinny_gemm
from engine.ops.gguf_quant import GGUFSegments, GGUFWeight, gguf_linear
from engine.ops.int8 import Int8Weight
from engine.ops.native import (
    amx_bf16,
    check_contiguous,
    check_dtype,
    check_last_contiguous,
    check_shape,
    dtype_code,
    fail,
    fail_not_cpu,
    mode,
    native_lib,
)
from engine.ops.norm import silu_and_mul
from engine.ops.quant_linear import quant_linear
from engine.weight_quant import Fp8Weight, IntWeight

# Rows of x (M) from which a bfloat16 CPU call goes to torch's F.linear (oneDNN) on CPUs with AMX-BF16 (native.
# amx_bf16(); not under set_batch_invariant). Measured side by side on the 2-core Sapphire Rapids dev machine
# (torch 2.13, 2 threads, SmolLM2 and 1B-Llama shapes; docs/benchmarks/cpu_amx_prefill_2026-12-02.md): oneDNN on
# the AMX tiles 1.4-3x faster than the native avx512bf16 kernels at 16-32 rows, 4-9x at 64-512 (11264 x 2048 at
# M = 512: 16.0 against 117.6 ms). The route starts above the native GEMV regime (M <= 16), which runs on the
# kernels' own pool: torch's OpenMP regions, like the native GEMM's, stall for a time slice when another process
# holds a core, the pool does not, so decode batches keep that robustness. Without AMX (an earlier 2-core EPYC:
# the native kernels as fast or faster at every M and dtype) no M goes to torch.
AMX_MIN_M = 17


# Rows from which a CUDA linear layer adds its product into the residual stream itself (``linear_into``): above the
# decode CUDA graphs' buckets (at most 256 rows), where the one-row GEMV and the graphs' fixed kernels run.
FOLD_MIN_ROWS = 257


def linear_into(x: torch.Tensor, weight, acc: torch.Tensor) -> bool:
    """acc += x @ weight^T as one GEMM that reads acc in its epilogue (cuBLAS with beta = 1), where that is the
    fast path: CUDA, a float weight of acc's dtype, at least FOLD_MIN_ROWS rows, acc [M, N] contiguous. Returns
    False, touching nothing, elsewhere (the caller adds the product itself).

    Why: the row-parallel layers (o_proj, down_proj) of a prefill write their product and the next norm reads it
    and the residual and writes both back; folded into the GEMM, a read and a write of the hidden states per
    half-layer are saved (at 8,192 tokens of the 8B shape 64 MiB each, 64 times a forward)."""
    if not (x.is_cuda and isinstance(weight, torch.Tensor) and x.dim() == 2 and x.shape[0] >= FOLD_MIN_ROWS
            and x.dtype == weight.dtype == acc.dtype and acc.shape == (x.shape[0], weight.shape[0])
            and acc.is_contiguous()):
        return False
    acc.addmm_(x, weight.t())
    return True


def linear_silu_and_mul(x: torch.Tensor, weight) -> torch.Tensor:
    """silu_and_mul(linear(x, weight)) for the MLP's gate_up weight [2I, K] = [gate; up] (any form ``linear``
    takes): one kernel where the one-row GEMV runs (skinny_gemm.skinny_silu_and_mul: CUDA, one row, inside the decode
    graphs), the two ops elsewhere. Same roundings either way."""
    if isinstance(weight, torch.Tensor) and skinny_gemm.wanted_gated(x, weight):
        return skinny_gemm.skinny_silu_and_mul(x, weight)
    return silu_and_mul(linear(x, weight))


def _torch_linear(x, weight, bias, out):
    if skinny_gemm.wanted(x, weight, bias) and (out is None or out.is_contiguous()):  # CUDA, one row, in graphs
        return skinny_gemm.skinny_linear(x, weight, bias, out)
    if out is None:
        return F.linear(x, weight, bias)
    if x.dim() != 2:
        return out.copy_(F.linear(x, weight, bias))
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def _validate_linear(op, x, weight, bias, out) -> None:
    check_dtype(op, "x", x)
    check_shape(op, "x", x, (None, None))
    check_last_contiguous(op, "x", x)
    M, K = x.shape
    check_dtype(op, "weight", weight, x.dtype)
    check_shape(op, "weight", weight, (None, K))
    check_contiguous(op, "weight", weight)
    N = weight.shape[0]
    if bias is not None:
        check_dtype(op, "bias", bias, x.dtype)
        check_shape(op, "bias", bias, (N,))
        check_contiguous(op, "bias", bias)
    if out is not None:
        check_dtype(op, "out", out, x.dtype)
        check_shape(op, "out", out, (M, N))
        check_last_contiguous(op, "out", out)


def linear(x: torch.Tensor, weight: torch.Tensor | Int8Weight | GGUFWeight | GGUFSegments | IntWeight | Fp8Weight,
           bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T + bias, like F.linear: x [..., K] (rows may be strided, last dim contiguous),
    weight [N, K] contiguous, bias [N] or None, all of one dtype; fp32 accumulation, one rounding.
    weight may be an Int8Weight (engine/ops/int8.py): int8 with a scale per group of 32, x's dtype out; or a
    GGUFWeight / GGUFSegments (engine/ops/gguf_quant.py): GGUF blocks, computed on by gguf_linear; or an IntWeight /
    Fp8Weight (engine/ops/quant_linear.py: GPTQ / AWQ / FP8 checkpoints, --quantization int8 | int4 | fp8 on a GPU),
    computed on by quant_linear.

    Returns `out`: a new [..., N] tensor unless given (then [M, N] for a 2-D x, rows may be strided;
    for x with more dims, a tensor that views as [M, N]). CPU calls run the native GEMV (decode, M <= 16)
    / GEMM kernels on up to set_num_threads() threads (fewer when the call is small), or the GEMV kernels at
    every M under set_batch_invariant; CUDA tensors (and CPU calls without engine._C, or bfloat16 ones of at
    least AMX_MIN_M rows on a CPU with AMX) go to torch's F.linear."""
    if isinstance(weight, (IntWeight, Fp8Weight)):
        return quant_linear(x, weight, bias, out)
    if isinstance(weight, Int8Weight):
        return _linear_int8(x, weight, bias, out)
    if isinstance(weight, (GGUFWeight, GGUFSegments)):
        return gguf_linear(x, weight, bias, out)
    shape = x.shape
    if len(shape) != 2:
        if len(shape) < 1:
            fail("linear", f"x must have at least 1 dim, got {list(shape)}")
        lead = shape[:-1]
        out2 = None if out is None else out.view(-1, weight.shape[0])
        y = linear(x.reshape(-1, shape[-1]), weight, bias, out2)
        return y.view(*lead, weight.shape[0]) if out is None else out
    if native_lib is None or not x.is_cpu:
        return _torch_linear(x, weight, bias, out)
    dtype = x.dtype
    dt = dtype_code(dtype)
    ws = weight.shape
    xs = x.stride()
    if (dt is None or weight.dtype != dtype or len(ws) != 2 or ws[1] != shape[1] or (xs[1] != 1 and shape[1] > 1)
            or not weight.is_contiguous()
            or (bias is not None and (bias.dtype != dtype or bias.shape != (ws[0],) or not bias.is_contiguous()))):
        _validate_linear("linear", x, weight, bias, out)
    M, K = shape
    N = ws[0]
    if not (weight.is_cpu and (bias is None or bias.is_cpu)):
        fail_not_cpu("linear", x, weight, *(() if bias is None else (bias,)))
    if M >= AMX_MIN_M and dtype == torch.bfloat16 and not mode.flags and amx_bf16():
        return _torch_linear(x, weight, bias, out)
    if out is None:
        out = torch.empty(M, N, dtype=dtype)
        os0 = N
    else:
        if out.dtype != dtype or out.shape != (M, N) or (out.stride()[1] != 1 and N > 1):
            _validate_linear("linear", x, weight, bias, out)
        if not out.is_cpu:
            fail_not_cpu("linear", x, weight, out)
        os0 = out.stride()[0]
    native_lib.linear(dt | mode.flags, out.data_ptr(), os0, x.data_ptr(), xs[0], weight.data_ptr(),
                      0 if bias is None else bias.data_ptr(), M, N, K)
    return out


def _linear_int8(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None, out: torch.Tensor | None
                 ) -> torch.Tensor:
    """linear() with int8 weights: the native kernels on the CPU, else (CUDA, no engine._C) the weights
    dequantized for this call."""
    N, K = weight.shape
    if x.shape[-1] != K:
        fail("linear", f"x's last dim {x.shape[-1]} does not match the int8 weight's K {K}")
    if x.dim() != 2:
        y = _linear_int8(x.reshape(-1, K), weight, bias, None if out is None else out.view(-1, N))
        return y.view(*x.shape[:-1], N) if out is None else out
    dt = dtype_code(x.dtype)
    if native_lib is None or not x.is_cpu or dt is None:
        return _torch_linear(x, weight.dequantize(x.dtype), bias, out)
    check_last_contiguous("linear", "x", x)
    if bias is not None:
        check_dtype("linear", "bias", bias, x.dtype)
        check_shape("linear", "bias", bias, (N,))
        check_contiguous("linear", "bias", bias)
    M = x.shape[0]
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype)
    else:
        check_dtype("linear", "out", out, x.dtype)
        check_shape("linear", "out", out, (M, N))
        check_last_contiguous("linear", "out", out)
    native_lib.linear(dt | mode.flags, out.data_ptr(), out.stride(0), x.data_ptr(), x.stride(0),
                      weight.q.data_ptr(), 0 if bias is None else bias.data_ptr(), M, N, K,
                      weight.scales.data_ptr())
    return out
