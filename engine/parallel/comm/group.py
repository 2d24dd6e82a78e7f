"""The communicator of one rank: every strategy of the group, the active one, the counters.

``TPContext.comm`` is a Communicator. It is built in two steps so that loading the model overlaps with the
other ranks' start-up: ``Communicator(...)`` attaches the shared segment (cheap, no peers needed);
``connect()`` (collective) joins torch.distributed and builds the strategies; ``tune(dtype)`` (collective)
runs the auto micro-benchmark when the strategy is auto (or overlap on GPUs).

Strategy names (``--comm-strategy``): nccl (gloo on CPU), host, int8, auto, overlap. ``overlap`` splits the
batch in two micro-batches inside the forward and runs one half's all-reduce on a second CUDA stream while
the other half computes (engine/models/overlap.py; the model asks ``TPContext.overlaps``), with auto's per-size choice for the transport. On the
CPU there is no second stream and the ranks' cores are all busy computing, so overlap falls back to
``host`` (logged); CommConfig(overlap_cpu_transport=<transport>) still runs the micro-batch split there,
sequentially (tests).

Every tuning choice comes from the ``CommConfig`` the Communicator is built with (engine/parallel/comm/config.py),
resolved once on rank 0 and handed to every rank; nothing here reads the environment.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

from engine.config import COMM_STRATEGIES
from engine.errors import EngineDeadError, KestrelError
from engine.parallel.comm.base import CommStats
from engine.parallel.comm.config import CommConfig
from engine.parallel.comm.shm import Segment

log = logging.getLogger(__name__)

STRATEGIES = COMM_STRATEGIES  # defined once, torch-free, in engine/config.py


class Communicator:
    def __init__(self, rank: int, world: int, device: torch.device, config: CommConfig, seg: Segment | None,
                 store_port: int | None = None, store=None):
        if not isinstance(config, CommConfig) or not config.is_resolved:
            raise KestrelError("a Communicator needs a resolved CommConfig (CommConfig.for_engine / .resolved)")
        self.rank, self.world, self.device = rank, world, device
        self.config = config
        self.requested = config.strategy
        self.seg = seg
        self.store_port = store_port
        self._store = store  # rank 0 hosts the TCPStore (created by the executor before the workers start)
        self.stats = CommStats()
        self._dead_reason = None  # set by the executor: () -> str | None
        self.pcie_mode = config.pcie_mode
        self.transport = None
        if seg is not None:
            from engine.parallel.comm.host import HostTransport

            self.transport = HostTransport(seg, rank, world, device, config)
        self.strategies: dict = {}
        self.active = None
        self.overlap = False
        self.overlap_min_tokens = config.overlap_min_tokens
        self.backend = None
        self._owns_dist = False
        self.table: list[dict] | None = None
        self.note = ""

    # -- set-up -----------------------------------------------------------------------------------------
    def dead_reason(self) -> str | None:
        return self._dead_reason() if self._dead_reason is not None else None

    def set_dead_reason(self, fn) -> None:
        self._dead_reason = fn

    def connect(self) -> None:
        """Collective: join the torch.distributed group and build the strategies."""
        from engine.parallel.comm.dist import DistStrategy
        from engine.parallel.comm.host import HostStrategy
        from engine.parallel.comm.int8 import Int8Strategy

        cuda = self.device.type == "cuda"
        self.backend = "nccl" if cuda else "gloo"
        if self.store_port is not None:
            if dist.is_initialized():
                import gc

                gc.collect()  # an abandoned engine's finalizer shuts its group down
            if dist.is_initialized():
                raise KestrelError("torch.distributed is already initialised in this process; a tensor-parallel "
                                   "engine needs its own process group (one TP engine per process)")
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # all ranks are local
            timeout = datetime.timedelta(seconds=self.config.timeout_s)
            store = self._store or dist.TCPStore("127.0.0.1", self.store_port, self.world, False,
                                                 timeout=timeout)
            kw = {}
            if cuda:
                kw["device_id"] = self.device
            dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world,
                                    timeout=timeout, **kw)
            self._owns_dist = True
        common = {"stats": self.stats, "dead_reason": self.dead_reason}
        s = self.strategies
        if dist.is_initialized():
            s["nccl"] = DistStrategy(self.rank, self.world, self.device, self.backend, **common)
        if self.transport is not None:
            s["host"] = HostStrategy(self.transport, **common)
        if self.transport is not None or dist.is_initialized():
            s["int8"] = Int8Strategy(self.rank, self.world, self.device, transport=self.transport,
                                     backend=self.backend if dist.is_initialized() else None,
                                     transport_name=self.config.int8_transport, **common)
        self._choose(self.requested)

    def _choose(self, name: str) -> None:
        from engine.parallel.comm.auto import AutoStrategy

        cuda = self.device.type == "cuda"
        self.overlap = False
        self.note = ""
        if name == "overlap" and not cuda:
            forced = self.config.overlap_cpu_transport
            if forced:
                self.overlap = True
                name = forced
                self.note = (f"overlap on CPU over {forced}: micro-batch split run sequentially "
                             "(CommConfig.overlap_cpu_transport)")
            else:
                name = "host"
                self.note = ("overlap needs CUDA streams; on the CPU it falls back to the host strategy "
                             "(every core already computes, there is nothing to overlap with)")
            if self.rank == 0:
                log.info("comm strategy: %s", self.note)
        elif name == "overlap":
            self.overlap = True
            name = "auto"
        if name == "nccl" and "nccl" not in self.strategies:
            raise KestrelError("the nccl strategy needs torch.distributed")
        if name == "auto":
            cands = {k: v for k, v in self.strategies.items() if k != "auto"}
            self.strategies["auto"] = self.strategies.get("auto") or AutoStrategy(
                self.rank, self.world, self.device, cands, config=self.config, stats=self.stats,
                dead_reason=self.dead_reason)
        if name not in self.strategies:
            raise KestrelError(f"the {name} strategy is not available here")
        self.active = self.strategies[name]
        self.active_name = name

    def tune(self, dtype: torch.dtype, sizes: list[int] | None = None) -> list[dict] | None:
        """Collective: run auto's start-up micro-benchmark (no-op for the other strategies)."""
        auto = self.strategies.get("auto")
        if auto is not None and self.active is auto:
            self.table = auto.tune(dtype, sizes)
            self.stats.__init__()  # the benchmark's traffic is not the engine's
        return self.table

    def set_strategy(self, name: str) -> None:
        """Every rank must call this between steps (the executor broadcasts it)."""
        self.requested = name
        self._choose(name)

    def benchmark(self, dtype: torch.dtype, sizes: list[int], names: list[str] | None = None) -> list[dict]:
        """Collective: latency table of the named strategies (default: all but auto) without changing
        the active one; the counters are restored afterwards."""
        from engine.parallel.comm.auto import measure

        names = names or [n for n in ("nccl", "host", "int8") if n in self.strategies]
        saved = (self.stats.total, dict(self.stats.by_strategy), self.stats._mark)
        rows = measure({n: self.strategies[n] for n in names}, dtype, sizes, self.rank, self.world, self.device)
        self.stats.total, self.stats.by_strategy, self.stats._mark = saved[0], saved[1], saved[2]
        return rows

    # -- the collectives (TPContext calls these) ---------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.active.all_reduce(x)

    def all_reduce_async(self, x: torch.Tensor):
        return self.active.all_reduce_async(x)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Exact always (the logits). CPU: through the host segment; CUDA: NCCL (device to device; the host
        segment would need a round trip through host memory for a message that is the whole batch's logits)."""
        order = ("nccl", "host") if x.is_cuda else ("host", "nccl")
        s = self.strategies.get(order[0]) or self.strategies.get(order[1])
        return s.all_gather(x, dim)

    def end_step(self) -> None:
        """After a step: GPU kernels that gave up on a peer leave an error word in the segment."""
        if self.seg is not None and self.device.type == "cuda":
            err = self.seg.u32(self.seg.layout.err(self.rank))
            if err:
                raise EngineDeadError(self.dead_reason() or "tensor parallelism: a peer GPU did not answer the "
                                      "all-reduce (timeout); the engine must be restarted")

    def describe(self) -> dict:
        return {"requested": self.requested, "active": getattr(self, "active_name", None),
                "backend": self.backend, "overlap": self.overlap, "pcie_mode": self.pcie_mode, "note": self.note,
                "host_isa": _isa(), "config": self.config.to_dict()}

    def close(self) -> None:
        for s in self.strategies.values():
            try:
                s.close()
            except Exception:  # noqa: BLE001
                pass
        if self.transport is not None:
            self.transport.close()
        if self._owns_dist and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
            self._owns_dist = False


def _isa() -> str:
    from engine.parallel.comm import kernels

    return kernels.isa()
