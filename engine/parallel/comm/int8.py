"""``int8``: quantised all-reduce. Group-wise absmax int8 (128 elements per fp32 scale; why 128: see
engine/parallel/comm/reference.py), reduce-scatter of int8 parts + scales, each rank sums its own part in
fp32 and requantises it, all-gather of the requantised int8, dequantised into the output. About half the
bytes of bf16 on the wire (a quarter of fp32), at the cost of two quantisation errors (bounded in
reference.error_bound; the engine's perplexity stays within 1% of the exact all-reduce).

Transports:
  - ``shm`` (CPU default): the host segment (csrc/comm HostComm.int8_all_reduce: quantise into the own slot,
    publish, sum-and-requantise the own part of every slot, publish, dequantise every part);
  - ``dist`` (CUDA default): torch.distributed - all_to_all of packets [int8 part | scales] then all_gather of
    the requantised packets, with the fused CUDA kernels (csrc/comm/cuda_comm.cu). Stream-ordered, so it
    overlaps on a second stream. On the CPU (tests, CommConfig(int8_transport="dist")) the CPU kernels build the
    same packets.
Every transport gives the same bits (reference.int8_all_reduce).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from engine.parallel.comm import kernels
from engine.parallel.comm.base import CommStrategy
from engine.parallel.comm.host import HostTransport

try:
    from engine import _C
except ImportError:  # pragma: no cover
    _C = None

GROUP = kernels.GROUP


class Int8Strategy(CommStrategy):
    name = "int8"
    exact = False
    bound = "int8"

    def __init__(self, rank: int, world: int, device: torch.device, transport: HostTransport | None = None,
                 dist_group=None, backend: str | None = None, transport_name: str | None = None, **kw):
        super().__init__(rank, world, device, **kw)
        self.t = transport
        self.pg = dist_group
        self.backend = backend
        default = "dist" if device.type == "cuda" else "shm"
        self.transport = transport_name or default  # CommConfig.int8_transport
        if self.transport == "shm" and (transport is None or device.type == "cuda"):
            self.transport = "dist"
        if self.transport == "dist" and backend is None:
            raise RuntimeError("int8 over torch.distributed needs the process group")

    def _link(self, n: int) -> int:
        c = -(-n // (self.world * GROUP)) * GROUP
        return 2 * (self.world - 1) * kernels.packet_bytes(c)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """As the base class, but the link bytes are the int8 packets actually moved."""
        if self.world == 1:
            return x
        nbytes = x.numel() * x.element_size()
        link = self._link(x.numel())
        if self.timing_events:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = self._all_reduce(x)
            end.record()
            self.stats.add_events(self.name, nbytes, link, start, end)
            return out
        t0 = time.perf_counter()
        out = self._all_reduce(x)
        self.stats.add(self.name, nbytes, link, time.perf_counter() - t0)
        return out

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            return x.copy_(self._all_reduce(x.contiguous()))
        if self.transport == "shm":
            self.t.drain()
            st = self.t.hc.int8_all_reduce(kernels.DTYPE_CODE[x.dtype], x.data_ptr(), x.numel())
            if st:
                raise self._dead("an int8 all-reduce", st)
            return x
        try:
            return self._dist(x)
        except RuntimeError as e:
            raise self._dead(f"an int8 all-reduce ({e})") from e

    def _dist(self, x: torch.Tensor) -> torch.Tensor:
        world, n = self.world, x.numel()
        unit = world * GROUP
        npad = -(-n // unit) * unit
        c = npad // world
        flat = x.view(-1)
        if npad != n:
            xp = torch.zeros(npad, dtype=x.dtype, device=x.device)
            xp[:n] = flat
        else:
            xp = flat
        P = kernels.packet_bytes(c)
        send = torch.empty(world * P, dtype=torch.uint8, device=x.device)
        self._quantize(xp, c, send)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.pg)
        own = torch.empty(P, dtype=torch.uint8, device=x.device)
        self._reduce(recv, c, own)
        gathered = torch.empty_like(send)
        if self.backend == "nccl":
            dist.all_gather_into_tensor(gathered, own, group=self.pg)
        else:
            dist.all_gather(list(gathered.view(world, P).unbind(0)), own, group=self.pg)
        self._dequantize(gathered, c, xp)
        if npad != n:
            flat.copy_(xp[:n])
        return x

    # packet kernels: CUDA (csrc/comm/cuda_comm.cu) or CPU (csrc/comm kernels on the packet layout)
    def _quantize(self, xp: torch.Tensor, c: int, out: torch.Tensor) -> None:
        if xp.is_cuda:
            return kernels.cuda_quantize_packets(xp, c, self.world, out)
        P, code, esz = kernels.packet_bytes(c), kernels.DTYPE_CODE[xp.dtype], xp.element_size()
        for j in range(self.world):
            base = out.data_ptr() + j * P
            _C.comm_quantize_int8(code, xp.data_ptr() + j * c * esz, c, base, base + c)

    def _reduce(self, inp: torch.Tensor, c: int, out: torch.Tensor) -> None:
        if inp.is_cuda:
            return kernels.cuda_reduce_packets(inp, c, self.world, out)
        P = kernels.packet_bytes(c)
        qs = [inp.data_ptr() + j * P for j in range(self.world)]
        _C.comm_dequant_sum_requant(qs, [q + c for q in qs], c, out.data_ptr(), out.data_ptr() + c)

    def _dequantize(self, inp: torch.Tensor, c: int, xp: torch.Tensor) -> None:
        if inp.is_cuda:
            return kernels.cuda_dequantize_packets(inp, c, self.world, xp)
        P, code, esz = kernels.packet_bytes(c), kernels.DTYPE_CODE[xp.dtype], xp.element_size()
        for j in range(self.world):
            base = inp.data_ptr() + j * P
            _C.comm_dequantize_int8(code, base, base + c, c, xp.data_ptr() + j * c * esz)
