"""GGUF quantized weights kept as the file's blocks (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), and the linear op
on them.

``GGUFWeight`` holds a linear weight [N, K] as N rows of GGUF blocks (the file's bytes, uint8 [N, row_bytes]; rows
of the types with blocks of 32 rearranged at load into the kernels' planar order: quants, then scales; same size;
K-quant rows, super-blocks of 256, as the file has them); ``ops.linear`` takes it
where it takes a weight tensor. On the CPU the native kernels (csrc/cpu/gguf.h) quantize x per block of 32 to int8
(llama.cpp's Q8_0 / Q8_1 activations, ``reference.gguf_quantize_activations``; for the K-quants too: a sub-block
of 32 meets one x block, so its integer sum is exact) and, for a few rows (decode), meet the
weight blocks in integer dot products; for more rows (prefill) they multiply that quantized x by panels of
dequantized weight rows in the float GEMM kernels (the same products: a row's result does not depend on the
regime beyond float rounding). Elsewhere (CUDA, no engine._C) the weight is dequantized for the call and x is not
quantized. A decode step thus streams 0.56-1.06 bytes per weight (Q4_0 / Q4_K ... Q8_0) instead of 2 (bfloat16),
and the model takes the file's size in memory.

A fused weight whose parts differ in type (a Q4_K_M file's q/k in Q4_K, v in Q6_K) is a ``GGUFSegments``
(``fuse_rows``): a GGUFWeight per run of one type, one native call each into its columns of the output.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.ops import reference
from engine.ops.native import (
    amx_bf16,
    check_contiguous,
    check_dtype,
    check_last_contiguous,
    check_shape,
    dtype_code,
    fail,
    mode,
    native_lib,
)

BLOCK = 32
# ggml type id -> (name, bytes per block, offset of the quants in a block (None: rows kept in the file's layout),
# weights per block): the types with a kernel (csrc/cpu/gguf.h has the layouts)
TYPES = {
    2: ("Q4_0", 18, 2, 32), 3: ("Q4_1", 20, 4, 32), 6: ("Q5_0", 22, 2, 32), 8: ("Q8_0", 34, 2, 32),
    12: ("Q4_K", 144, None, 256), 13: ("Q5_K", 176, None, 256), 14: ("Q6_K", 210, None, 256),
}


def to_planar(blocks: np.ndarray, qtype: int) -> np.ndarray:
    """GGUF rows [N, nb * type_size] -> the kernels' planar rows of the same size: every block's quants (Q5_0: its
    qh bytes, then its nibbles), then the blocks' float16 scales d, then (Q4_1) their mins m (csrc/cpu/gguf.h says
    why). K-quant rows stay as they are (their super-block headers already serve 8 sub-blocks)."""
    _, size, qs, _ = TYPES[qtype]
    if qs is None:
        return np.array(blocks, copy=True)  # a copy, as the concatenation below makes
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, size)
    parts = [b[..., qs:].reshape(n, -1), b[..., 0:2].reshape(n, -1)]
    if qtype == 3:
        parts.append(b[..., 2:4].reshape(n, -1))
    return np.concatenate(parts, axis=1)


def from_planar(data: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """The inverse of to_planar: GGUF's block layout (uint8 [N, nb * type_size])."""
    _, size, qs, _ = TYPES[qtype]
    if qs is None:
        return data
    n, nb = data.shape[0], k // BLOCK
    qbytes = size - qs
    quants = data[:, : nb * qbytes].reshape(n, nb, qbytes)
    d = data[:, nb * qbytes: nb * (qbytes + 2)].reshape(n, nb, 2)
    parts = [d] + ([data[:, nb * (qbytes + 2):].reshape(n, nb, 2)] if qtype == 3 else []) + [quants]
    return torch.cat(parts, dim=-1).reshape(n, nb * size)


@dataclass(frozen=True)
class GGUFWeight:
    data: torch.Tensor  # uint8 [N, K / block * type_size], contiguous: the file's blocks of a row (to_planar)
    qtype: int          # ggml type id (gguf.GGMLQuantizationType)
    k: int

    KERNEL_TYPES = frozenset(TYPES)  # ggml type ids the CPU kernels compute on (not a field)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.data.shape[0], self.k))

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @property
    def type_name(self) -> str:
        return TYPES[self.qtype][0]

    def file_blocks(self) -> torch.Tensor:
        """The rows in GGUF's own block layout (what the file stores)."""
        return from_planar(self.data, self.qtype, self.k)

    @classmethod
    def from_blocks(cls, blocks: np.ndarray | torch.Tensor, qtype: int, k: int) -> GGUFWeight:
        """From the raw GGUF bytes of N rows ([N, row_bytes] uint8, e.g. ``GGUFFile.raw``'s rows), rearranged into
        planar rows (a copy, so the weight owns its memory, not the file's map)."""
        qtype = int(qtype)
        if qtype not in TYPES:
            raise ValueError(f"no GGUF kernel for ggml type {qtype}; kernels: "
                             f"{', '.join(t[0] for t in TYPES.values())}")
        name, size, _, block = TYPES[qtype]
        if k <= 0 or k % block:
            raise ValueError(f"GGUF {name} weights need K a positive multiple of {block}, got {k}")
        arr = np.asarray(blocks.numpy() if isinstance(blocks, torch.Tensor) else blocks, dtype=np.uint8)
        row_bytes = k // block * size
        if arr.ndim != 2 or arr.shape[1] != row_bytes:
            raise ValueError(f"{TYPES[qtype][0]} rows of K={k} take {row_bytes} bytes, got blocks of shape "
                             f"{tuple(arr.shape)}")
        return cls(torch.from_numpy(np.ascontiguousarray(to_planar(arr, qtype))), qtype, k)

    @classmethod
    def cat_rows(cls, parts: list[GGUFWeight]) -> GGUFWeight:
        """Row blocks stacked in order (fused q/k/v, gate/up): blocks never span rows, so this is a byte concat."""
        if not parts or any(p.qtype != parts[0].qtype or p.k != parts[0].k for p in parts):
            raise ValueError("cat_rows needs GGUF weights of one type and one K")
        if len(parts) == 1:
            return parts[0]
        return cls(torch.cat([p.data for p in parts]).contiguous(), parts[0].qtype, parts[0].k)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.qtype in (2, 3, 8):
            return reference.gguf_dequantize(self.file_blocks(), self.qtype, self.k).to(dtype)
        from gguf import GGMLQuantizationType
        from gguf import quants as gguf_quants

        values = gguf_quants.dequantize(self.file_blocks().numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(self.shape).to(dtype)


@dataclass(frozen=True)
class GGUFSegments:
    """A fused linear weight (q/k/v, gate/up) whose row blocks differ in type, e.g. a Q4_K_M file's attn_q / attn_k
    in Q4_K and attn_v in Q6_K: each run of rows of one type is its own GGUFWeight (the file's bytes, as there),
    their outputs stacked in order. ``gguf_linear`` meets it with one native call per segment (each quantizes x
    for itself: K values, small beside the rows it then streams), writing into its columns of one output.
    Built by ``fuse_rows``, which merges neighbouring parts of one type first."""

    parts: tuple[GGUFWeight, ...]
    rows: int = field(init=False)  # N: the segments' rows together

    def __post_init__(self):
        if not self.parts or any(p.k != self.parts[0].k for p in self.parts):
            raise ValueError("GGUFSegments needs GGUF weights of one K")
        object.__setattr__(self, "rows", sum(p.data.shape[0] for p in self.parts))

    @property
    def k(self) -> int:
        return self.parts[0].k

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.rows, self.k))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def type_name(self) -> str:
        return "+".join(p.type_name for p in self.parts)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])


def fuse_rows(parts: list[GGUFWeight]) -> GGUFWeight | GGUFSegments:
    """Row blocks stacked in order: one GGUFWeight when they share a type (a byte concat, ``cat_rows``), else
    a GGUFSegments of the runs of one type (q+k Q4_K, v Q6_K: two segments)."""
    if not parts or any(p.k != parts[0].k for p in parts):
        raise ValueError("fuse_rows needs GGUF weights of one K")
    runs: list[list[GGUFWeight]] = []
    for p in parts:
        if runs and runs[-1][0].qtype == p.qtype:
            runs[-1].append(p)
        else:
            runs.append([p])
    merged = tuple(GGUFWeight.cat_rows(r) for r in runs)
    return merged[0] if len(merged) == 1 else GGUFSegments(merged)


def gguf_linear(x: torch.Tensor, weight: GGUFWeight | GGUFSegments, bias: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T + bias with W a GGUFWeight (or GGUFSegments: one call per segment into its columns of y);
    x [..., K] (rows may be strided, last dim contiguous), bias [N] of
    x's dtype, out as ``ops.linear``'s. fp32 accumulation, one rounding to x's dtype. On the CPU x is quantized per
    block of 32 to int8 first (``reference.gguf_linear`` states the arithmetic); M <= 8 rows (every M under
    set_batch_invariant) run the integer GEMV, more rows the float GEMM on dequantized panels (bfloat16 calls of
    AMX_MIN_M rows or more on a CPU with AMX: torch's GEMM on dequantized panels, x not quantized; without AMX from
    PANEL_GEMM_MIN_M rows: the native bfloat16 GEMM on large dequantized panels, x not quantized)."""
    segments = weight.parts if isinstance(weight, GGUFSegments) else None
    N, K = (weight.data.shape[0] if segments is None else weight.rows), weight.k
    if x.shape[-1] != K:
        fail("linear", f"x's last dim {x.shape[-1]} does not match the GGUF weight's K {K}")
    if x.dim() != 2:
        y = gguf_linear(x.reshape(-1, K), weight, bias, None if out is None else out.view(-1, N))
        return y.view(*x.shape[:-1], N) if out is None else out
    dt = dtype_code(x.dtype)
    if native_lib is None or not x.is_cpu or dt is None:
        y = torch.nn.functional.linear(x, weight.dequantize(x.dtype).to(x.device), bias)
        return y if out is None else out.copy_(y)
    if x.stride(1) != 1 and K > 1:
        check_last_contiguous("linear", "x", x)
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (N,) or not bias.is_contiguous()):
        check_dtype("linear", "bias", bias, x.dtype)
        check_shape("linear", "bias", bias, (N,))
        check_contiguous("linear", "bias", bias)
    M = x.shape[0]
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype)
    elif out.dtype != x.dtype or out.shape != (M, N) or (out.stride(1) != 1 and N > 1):
        check_dtype("linear", "out", out, x.dtype)
        check_shape("linear", "out", out, (M, N))
        check_last_contiguous("linear", "out", out)
    if M >= AMX_MIN_M and x.dtype == torch.bfloat16 and not mode.flags and amx_bf16():
        return _dequantized_amx_linear(x, segments or (weight,), bias, out)
    if M >= PANEL_GEMM_MIN_M and x.dtype == torch.bfloat16 and not mode.flags:
        return _dequantized_native_linear(x, segments or (weight,), bias, out)
    flags, xp, xs, os0 = dt | mode.flags, x.data_ptr(), x.stride(0), out.stride(0)
    if segments is None:
        native_lib.gguf_linear(flags, out.data_ptr(), os0, xp, xs, weight.data.data_ptr(), weight.data.shape[1],
                               weight.qtype, 0 if bias is None else bias.data_ptr(), M, N, K)
        return out
    # one call per segment, each writing its columns of out (and reading its part of bias): byte offsets
    esize = out.element_size()
    op, bp, row = out.data_ptr(), 0 if bias is None else bias.data_ptr(), 0
    for w in segments:
        n = w.data.shape[0]
        native_lib.gguf_linear(flags, op + row * esize, os0, xp, xs, w.data.data_ptr(), w.data.shape[1], w.qtype,
                               0 if bias is None else bp + row * esize, M, n, K)
        row += n
    return out


# Rows of x from which a bfloat16 call on a CPU with AMX (native.amx_bf16) dequantizes the weight in panels and
# multiplies them on torch's oneDNN GEMM (the AMX tiles) instead of the native panels (x quantized, avx512bf16
# GEMM): measured on the 2-core Sapphire Rapids dev machine (docs/benchmarks/cpu_amx_prefill_2026-12-02.md), Q4_0
# 1B-Llama and SmolLM2 shapes, even at 8-12 rows, 1.3-3x faster at 16-32 and 5-23x at 512 (2048 x 5632: 8.0
# against 183.0 ms). (The native path above 8 rows is an OpenMP region too: no robustness is lost.) x is then not
# quantized: a prefill computes what the dequantized model computes.
AMX_MIN_M = 16
_AMX_PANEL_ELEMS = 16 << 20  # weights dequantized per panel: 32 MiB of bfloat16, reused across calls
# Without AMX: bfloat16 calls of this many rows or more dequantize panels of _PANEL_ELEMS weights (8 MiB of
# bfloat16, 2,048 rows of a 1B Llama's K = 2048) and multiply each on the native bfloat16 GEMM (the dequantized
# model's kernel, threaded over the panel's rows), x not quantized, as on the AMX route. The native panels below
# (csrc/cpu/gguf_dispatch.cpp run_panels: x quantized, 256 KiB panels, one per thread at a time) stream all of x
# once per 16-64 weight rows. Measured on the 2-core Zen 5 dev VM (AVX512-BF16, no AMX), 2 threads, one layer's
# qkv + gate_up + down (docs/benchmarks/cpu_gguf_models_2026-12-03.md): 1B-Llama Q4_0 at M = 16 / 24 / 64 / 512
# 8.8 / 7.4 / 13.0 / 55.4 ms against 7.0 / 13.5 / 23.8 / 110.3 on the native panels; SmolLM2 Q4_1 0.71 / 0.59 /
# 0.87 / 4.95 against 0.54 / 0.74 / 1.26 / 7.55 (at 16 rows the dequantization, ~1 ms per 8M weights, does not
# yet hide behind the product).
PANEL_GEMM_MIN_M = 24
_PANEL_ELEMS = 4 << 20
_scratch = threading.local()


def _dequantized_amx_linear(x: torch.Tensor, parts: tuple[GGUFWeight, ...], bias: torch.Tensor | None,
                            out: torch.Tensor) -> torch.Tensor:
    """out = x @ W^T + bias with W's rows dequantized panel by panel (gguf_dequantize, on the kernel threads) into
    a per-thread scratch buffer, each panel multiplied on torch's GEMM into its columns of out."""
    return _dequantized_linear(x, parts, bias, out, _AMX_PANEL_ELEMS, on_torch=True)


def _dequantized_native_linear(x: torch.Tensor, parts: tuple[GGUFWeight, ...], bias: torch.Tensor | None,
                               out: torch.Tensor) -> torch.Tensor:
    """As _dequantized_amx_linear, each panel multiplied on the native bfloat16 GEMM (CPUs without AMX)."""
    return _dequantized_linear(x, parts, bias, out, _PANEL_ELEMS, on_torch=False)


def _dequantized_linear(x: torch.Tensor, parts: tuple[GGUFWeight, ...], bias: torch.Tensor | None,
                        out: torch.Tensor, panel_elems: int, on_torch: bool) -> torch.Tensor:
    M, K = x.shape
    rows = max(16, panel_elems // K)
    buf = getattr(_scratch, "buf", None)
    need = min(rows, max(p.data.shape[0] for p in parts)) * K
    if buf is None or buf.numel() < need:
        buf = _scratch.buf = torch.empty(need, dtype=torch.bfloat16)
    col = 0
    for w in parts:
        n_rows = w.data.shape[0]
        for r0 in range(0, n_rows, rows):
            n = min(rows, n_rows - r0)
            panel = buf[: n * K].view(n, K)
            native_lib.gguf_dequantize(dtype_code(torch.bfloat16), panel.data_ptr(),
                                       w.data.data_ptr() + r0 * w.data.shape[1], w.data.shape[1], w.qtype, n, K)
            if not on_torch:
                esize = out.element_size()
                native_lib.linear(dtype_code(torch.bfloat16), out.data_ptr() + (col + r0) * esize, out.stride(0),
                                  x.data_ptr(), x.stride(0), panel.data_ptr(),
                                  0 if bias is None else bias.data_ptr() + (col + r0) * esize, M, n, K)
                continue
            dst = out[:, col + r0: col + r0 + n]
            if bias is None:
                torch.mm(x, panel.t(), out=dst)
            else:
                torch.addmm(bias[col + r0: col + r0 + n], x, panel.t(), out=dst)
        col += n_rows
    return out


def gguf_embedding(ids: torch.Tensor, weight: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:
    """The rows ``ids`` of a GGUF table (the token embedding) dequantized to ``dtype``: ids [...] -> [..., K], like
    F.embedding on the dequantized weight (the values the prefill regime's panels hold). Out-of-range ids raise
    IndexError, as F.embedding's do."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    N, K = weight.shape
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= N):
        raise IndexError(f"token id out of range for an embedding of {N} rows")
    dt = dtype_code(dtype)
    if native_lib is None or not flat.is_cpu or dt is None:
        rows = GGUFWeight(weight.data.index_select(0, flat.to(weight.data.device)), weight.qtype, K)
        return rows.dequantize(dtype).to(ids.device).view(*ids.shape, K)
    out = torch.empty(flat.numel(), K, dtype=dtype)
    native_lib.gguf_get_rows(dt, out.data_ptr(), weight.data.data_ptr(), weight.data.shape[1], weight.qtype,
                             flat.data_ptr(), flat.numel(), N, K)
    return out.view(*ids.shape, K)


def gguf_isa() -> str:
    """Level of the GGUF kernels in use: scalar, avx2, avxvnni or avx512vnni ('' without engine._C)."""
    return native_lib.gguf_isa() if native_lib is not None else ""


def gguf_isas() -> list[str]:
    return list(native_lib.gguf_isas()) if native_lib is not None else []
