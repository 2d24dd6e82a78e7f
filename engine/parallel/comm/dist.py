"""``nccl``: torch.distributed collectives - NCCL on GPUs (it honours NCCL_P2P_DISABLE=1 itself: PCIe mode),
gloo on the CPU (reported as "gloo"). The process group is the group's default one, set up by
``init_process_group`` against a TCPStore that rank 0 hosts on 127.0.0.1 (see engine/parallel/comm/group.py).
Link bytes follow the ring model: 2 (N-1)/N of the message."""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.parallel.comm.base import CommStrategy, gather_dim


class DistStrategy(CommStrategy):
    bound = "dtype_sum"  # NCCL / gloo may round partial sums to the dtype (gloo sums bf16 in bf16)

    def __init__(self, rank: int, world: int, device: torch.device, backend: str, group=None, **kw):
        super().__init__(rank, world, device, **kw)
        self.backend = backend
        self.pg = group
        self.name = "nccl" if backend == "nccl" else backend

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        try:
            dist.all_reduce(x, group=self.pg)
        except RuntimeError as e:  # a peer died: gloo/NCCL report a closed connection or a timeout
            raise self._dead(f"an all-reduce ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
        return x

    def all_reduce_async(self, x: torch.Tensor):
        if x.device.type != "cuda":
            return super().all_reduce_async(x)
        from engine.parallel.comm.base import Handle

        nbytes = x.numel() * x.element_size()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        work = dist.all_reduce(x, group=self.pg, async_op=True)  # runs on NCCL's stream

        def finish() -> torch.Tensor:
            work.wait()  # makes the current stream wait
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.stats.add_events(self.name, nbytes, self.link_bytes(nbytes), start, end)
            return x
        return Handle(fn=finish)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return self.gather(x, dim)

    def gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world == 1:
            return x
        xc = x.contiguous()
        out = torch.empty((self.world, *xc.shape), dtype=xc.dtype, device=xc.device)
        try:
            if self.backend == "nccl":
                dist.all_gather_into_tensor(out, xc, group=self.pg)
            else:
                dist.all_gather(list(out.unbind(0)), xc, group=self.pg)
        except RuntimeError as e:
            raise self._dead(f"an all-gather ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
        nbytes = xc.numel() * xc.element_size()
        self.stats.add(self.name + "-gather", nbytes, (self.world - 1) * nbytes, 0.0)
        return gather_dim(out, xc.shape, self.world, dim)
