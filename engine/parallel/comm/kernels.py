"""Python face of the comm kernels in engine._C (csrc/comm): tensors in, checks, raw pointers down.
Each has a bit-exact torch reference in ``engine.parallel.comm.reference``; without engine._C (a source
tree that was never built) the references run instead."""

from __future__ import annotations

import torch

from engine import dtype_codes
from engine.parallel.comm import reference

try:
    from engine import _C
except ImportError:  # pragma: no cover - unbuilt tree
    _C = None

GROUP = reference.GROUP
DTYPE_CODE = dtype_codes.torch_map(torch)  # engine/dtype_codes.py (csrc/dtype_codes.h)


def native() -> bool:
    return _C is not None and bool(getattr(_C, "has_comm", False))


def cuda_native() -> bool:
    return native() and hasattr(_C, "cuda_mapped_all_reduce")


def isa() -> str:
    return _C.comm_isa() if native() else "reference"


def _check_cpu(op: str, *ts: torch.Tensor) -> None:
    for t in ts:
        if not t.is_cpu or not t.is_contiguous():
            raise ValueError(f"{op}: tensors must be contiguous CPU tensors")


def reduce_sum(srcs: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """out = dtype(sum of srcs in order, fp32). out may be one of the srcs."""
    x0 = srcs[0]
    if x0.dtype not in DTYPE_CODE:
        raise ValueError(f"reduce_sum: unsupported dtype {x0.dtype}")
    if any(s.shape != x0.shape or s.dtype != x0.dtype for s in srcs):
        raise ValueError("reduce_sum: sources differ in shape or dtype")
    out = torch.empty_like(x0) if out is None else out
    if not native():
        return out.copy_(reference.reduce_sum(srcs))
    _check_cpu("reduce_sum", out, *srcs)
    _C.comm_reduce(DTYPE_CODE[x0.dtype], out.data_ptr(), [s.data_ptr() for s in srcs], x0.numel())
    return out


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (q int8 [ceil(n/128)*128], scales fp32 [ceil(n/128)])."""
    if not native():
        return reference.quantize_int8(x)
    _check_cpu("quantize_int8", x)
    n = x.numel()
    ng = -(-n // GROUP)
    q = torch.empty(ng * GROUP, dtype=torch.int8)
    s = torch.empty(ng, dtype=torch.float32)
    _C.comm_quantize_int8(DTYPE_CODE[x.dtype], x.data_ptr(), n, q.data_ptr(), s.data_ptr())
    return q, s


def dequant_sum_requant(qs: list[torch.Tensor], ss: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    if not native():
        return reference.dequant_sum_requant(qs, ss)
    _check_cpu("dequant_sum_requant", *qs, *ss)
    n = qs[0].numel()
    if n % GROUP or any(q.numel() != n for q in qs) or any(s.numel() != n // GROUP for s in ss):
        raise ValueError("dequant_sum_requant: whole groups of equal size expected")
    oq = torch.empty_like(qs[0])
    os_ = torch.empty_like(ss[0])
    _C.comm_dequant_sum_requant([q.data_ptr() for q in qs], [s.data_ptr() for s in ss], n, oq.data_ptr(),
                                os_.data_ptr())
    return oq, os_


def dequantize_int8(q: torch.Tensor, s: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    if not native():
        return reference.dequantize_int8(q, s, n, dtype)
    _check_cpu("dequantize_int8", q, s)
    if q.numel() < n or s.numel() * GROUP != q.numel():
        raise ValueError("dequantize_int8: q/s too small for n")
    out = torch.empty(n, dtype=dtype)
    _C.comm_dequantize_int8(DTYPE_CODE[dtype], q.data_ptr(), s.data_ptr(), n, out.data_ptr())
    return out


# ---------------------------------------------------------------------------------------------------
# CUDA int8 packets (see csrc/comm/cuda_comm.h): message padded to world * c elements, c % 128 == 0;
# packet j = [c int8 | c / 128 fp32 scales].


def packet_bytes(c: int) -> int:
    return c + c // GROUP * 4


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def cuda_quantize_packets(x: torch.Tensor, c: int, world: int, out: torch.Tensor) -> None:
    _C.cuda_int8_quantize_packets(DTYPE_CODE[x.dtype], x.data_ptr(), c, world, out.data_ptr(), x.get_device(),
                                  _stream(x))


def cuda_reduce_packets(inp: torch.Tensor, c: int, world: int, out: torch.Tensor) -> None:
    _C.cuda_int8_reduce_packets(inp.data_ptr(), c, world, out.data_ptr(), inp.get_device(), _stream(inp))


def cuda_dequantize_packets(inp: torch.Tensor, c: int, world: int, x: torch.Tensor) -> None:
    _C.cuda_int8_dequantize_packets(DTYPE_CODE[x.dtype], inp.data_ptr(), c, world, x.data_ptr(), x.get_device(),
                                    _stream(x))


def reference_quantize_packets(x: torch.Tensor, c: int, world: int) -> torch.Tensor:
    """Torch reference of the packet layout (any device): x [world * c] -> uint8 [world * packet_bytes(c)]."""
    parts = []
    for j in range(world):
        q, s = reference.quantize_int8(x.reshape(-1)[j * c:(j + 1) * c].cpu())
        parts += [q.view(torch.uint8), s.view(torch.uint8)]
    return torch.cat(parts).to(x.device)
