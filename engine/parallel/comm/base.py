"""The communication strategy interface of tensor parallelism, and its traffic counters.

A strategy moves partial results between the ranks of one tensor-parallel group:

- ``all_reduce(x) -> Tensor``: the element-wise sum over ranks (may work in place and return x); every rank
  ends with the same bits.
- ``all_gather(x, dim) -> Tensor``: the ranks' equal-shaped shards concatenated along dim, in rank order.
- ``all_reduce_async(x) -> Handle``: the same, started now and finished by ``handle.wait()``; strategies
  whose transport is stream-ordered run it on a second CUDA stream (dual-stream overlap). On the CPU it
  completes before returning.

Every call is counted (``CommStats``): calls, payload bytes (the size of the reduced tensors), link bytes
(what this rank moves over the interconnect under the strategy's algorithm: see each strategy) and time.
The engine reads them per step and in total (EngineStats / the GUI's interconnect plot).

PCIe mode (``CommConfig.pcie_mode``, from NCCL_P2P_DISABLE=1 unless given): the engine's own strategies then
never use peer-to-peer access between GPUs: host memory only, as on RTX 4090 boxes. (None of them uses peer
access in any mode today: the host strategy's transport is host memory by design; NCCL follows its own
NCCL_P2P_DISABLE.) On CUDA every collective is timed by a pair of CUDA events, resolved after the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.errors import EngineDeadError


@dataclass
class CommTotals:
    calls: int = 0
    payload_bytes: int = 0
    link_bytes: int = 0
    seconds: float = 0.0

    def minus(self, other: CommTotals) -> CommTotals:
        return CommTotals(self.calls - other.calls, self.payload_bytes - other.payload_bytes,
                          self.link_bytes - other.link_bytes, self.seconds - other.seconds)


@dataclass
class CommStats:
    """Counters of one rank. ``by_strategy`` splits the totals by the strategy that served each call."""

    total: CommTotals = field(default_factory=CommTotals)
    by_strategy: dict[str, CommTotals] = field(default_factory=dict)
    _mark: CommTotals = field(default_factory=CommTotals)
    # GPU: (strategy, payload, link, start event, end event) resolved at the end of the step
    _pending: list = field(default_factory=list)

    def add(self, strategy: str, payload: int, link: int, seconds: float) -> None:
        t = self.total
        t.calls += 1
        t.payload_bytes += payload
        t.link_bytes += link
        t.seconds += seconds
        s = self.by_strategy.get(strategy)
        if s is None:
            s = self.by_strategy[strategy] = CommTotals()
        s.calls += 1
        s.payload_bytes += payload
        s.link_bytes += link
        s.seconds += seconds

    def add_events(self, strategy: str, payload: int, link: int, start, end) -> None:
        self._pending.append((strategy, payload, link, start, end))

    def resolve(self) -> None:
        """Turn recorded CUDA event pairs into seconds (call after the step synchronised)."""
        pending, self._pending = self._pending, []
        for strategy, payload, link, start, end in pending:
            try:
                secs = start.elapsed_time(end) / 1e3
            except RuntimeError:  # not completed (should not happen after a synchronising step)
                secs = 0.0
            self.add(strategy, payload, link, secs)

    def step_delta(self) -> CommTotals:
        """Traffic since the previous call (one engine step)."""
        self.resolve()
        d = self.total.minus(self._mark)
        self._mark = CommTotals(**vars(self.total))
        return d


class Handle:
    """A started all-reduce; ``wait()`` returns the reduced tensor (on the caller's stream)."""

    __slots__ = ("_event", "_fn", "_result")

    def __init__(self, result: torch.Tensor | None = None, event=None, fn=None):
        self._result, self._event, self._fn = result, event, fn

    def wait(self) -> torch.Tensor:
        if self._fn is not None:  # a future-like completion (host transport on a helper thread)
            self._result, self._fn = self._fn(), None
        if self._event is not None:
            torch.cuda.current_stream(self._result.device).wait_event(self._event)
            self._event = None
        return self._result


class CommStrategy:
    """Base of the strategies. Subclasses implement ``_all_reduce`` and may override the rest."""

    name = "base"
    exact = True  # False: lossy (int8); auto only picks it where allowed
    bound = "exact"  # reference.error_bound kind: exact (fp32 accumulation), dtype_sum, int8

    def __init__(self, rank: int, world: int, device: torch.device, stats: CommStats | None = None,
                 dead_reason=None):
        self.rank, self.world, self.device = rank, world, device
        self.stats = stats if stats is not None else CommStats()
        self.dead_reason = dead_reason or (lambda: None)  # () -> str | None, set by the executor
        self._side_stream = None
        self.timing_events = device.type == "cuda"

    # -- public -----------------------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return x
        nbytes = x.numel() * x.element_size()
        if self.timing_events:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = self._all_reduce(x)
            end.record()
            self.stats.add_events(self.name, nbytes, self.link_bytes(nbytes), start, end)
            return out
        t0 = time.perf_counter()
        out = self._all_reduce(x)
        self.stats.add(self.name, nbytes, self.link_bytes(nbytes), time.perf_counter() - t0)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        raise NotImplementedError

    def all_reduce_async(self, x: torch.Tensor) -> Handle:
        """Default: on CUDA, run the (stream-ordered) all-reduce on a second stream; on CPU, synchronously."""
        if x.device.type != "cuda":
            return Handle(self.all_reduce(x))
        main = torch.cuda.current_stream(x.device)
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device=x.device)
        side = self._side_stream
        side.wait_stream(main)
        x.record_stream(side)
        with torch.cuda.stream(side):
            out = self.all_reduce(x)
            ev = torch.cuda.Event()
            ev.record(side)
        if out is not x:
            out.record_stream(main)
        return Handle(out, ev)

    def link_bytes(self, nbytes: int) -> int:
        """Bytes this rank sends over the interconnect for an all-reduce of nbytes (ring model by default:
        reduce-scatter + all-gather each move (N-1)/N of the message)."""
        return 2 * (self.world - 1) * nbytes // self.world

    def close(self) -> None:
        pass

    # -- helpers ----------------------------------------------------------------------------------------
    def _dead(self, what: str, status: int | None = None) -> EngineDeadError:
        reason = self.dead_reason()
        if reason:
            return EngineDeadError(reason)
        if status == 2:
            return EngineDeadError(f"tensor parallelism: a peer rank did not answer ({what} timed out); "
                                   "the engine must be restarted")
        return EngineDeadError(f"tensor parallelism: the group was shut down during {what}; "
                               "the engine must be restarted")

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def gather_dim(flat: torch.Tensor, shape: torch.Size, world: int, dim: int) -> torch.Tensor:
    """flat = the ranks' shards stacked ([world, *shape] contiguous) -> concatenated along dim."""
    stacked = flat.view(world, *shape)
    dim = dim % len(shape)
    return torch.cat(list(stacked.unbind(0)), dim=dim)
