"""CommConfig: every choice of tensor parallelism's communication in one typed, frozen value (torch-free).

Resolved once, when a tensor-parallel engine starts (rank 0's TPExecutor: ``CommConfig.for_engine``), from the
measured defaults below and from the EngineConfig fields a user chooses (``--comm-strategy``); then handed to
every rank explicitly (pickled in the worker's boot data, ``to_dict`` / ``from_dict`` for reports): no rank reads
an environment variable for it, so a run is reproduced from its configuration. A benchmark report records
``resolved_comm_config(...)`` (or a live engine's ``executor.comm_config.to_dict()``, also in
``Communicator.describe()["config"]``).

The defaults and where they come from:

- ``spin_ns``: a rank spins this long on a peer's flag, then sleeps in futex_wait (the peer's store wakes it).
  Measured on the shared 2-core dev box under load: a 2 KiB all-reduce took 2.4-3.2 us (p50) with a 20 us spin,
  76-1170 us with 50 us - 1 ms spins followed by sched_yield (the ranks fall into a ping-pong of time slices). So
  20 us, 2 us when there are more ranks than cores (the peer needs our core); and no sched_yield phase (the
  former yield switch, 0 by default, lost that measurement and is gone; the native HostComm gets 0).
- ``host_gpu_small_max`` (256 KiB): on a GPU the host strategy sends messages up to this size by one zero-copy
  kernel over mapped host memory (7.7 us against NCCL's 40.7 us at 16 KiB with peer access off:
  /work/shared/anchors/README.md, "Host-memory all-reduce without peer access"); larger ones take the chunked copy
  pipeline (``host_gpu_chunk``, 2 MiB chunks) whose copies run on the copy engines, not the SMs (same file,
  "Does communication over host memory overlap with compute?").
- ``host_oneshot_max`` (64 KiB): CPU messages up to it go in one phase (decode-sized), larger ones
  reduce-scatter + all-gather (csrc/comm/hostar.cpp).
- ``auto_int8*``: auto may pick the lossy int8 all-reduce only for messages of at least 1 MiB (prefill: as
  ZhiLight does, host/int8 all-reduce only for prefill, /work/shared/anchors/README.md) and only where it beats
  the best exact strategy by 1.2x; ``auto_int8=False`` keeps auto exact.
- ``overlap_min_tokens`` (256): the smallest step the overlap strategy splits into two micro-batches.
- ``overlap_cpu_transport``: tests only: on the CPU, comm strategy overlap falls back to host (no second stream);
  with a transport named here it still runs the micro-batch split, sequentially, over that transport.
- timeouts: ``startup_timeout_s`` for the ranks to start, load and connect; ``timeout_s`` for a collective to
  wait for a peer before the group is declared dead.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from engine.config import COMM_STRATEGIES

INT8_TRANSPORTS = ("shm", "dist")
OVERLAP_TRANSPORTS = ("host", "nccl", "int8", "auto")


@dataclass(frozen=True)
class CommConfig:
    strategy: str = "auto"  # EngineConfig.comm_strategy (--comm-strategy)
    startup_timeout_s: float = 1800.0
    timeout_s: float = 300.0
    # GPUs talk through host memory only (no peer access); None: from NCCL_P2P_DISABLE, NCCL's own switch
    pcie_mode: bool | None = None
    spin_ns: int | None = None  # None: 20_000, or 2_000 with more ranks than cores
    host_oneshot_max: int = 64 << 10
    host_reduce_threads: int | None = None  # CPU threads summing a GPU all-reduce; None: cores / ranks, 1..8
    host_gpu_small_max: int = 256 << 10
    host_gpu_chunk: int = 2 << 20
    int8_transport: str | None = None  # shm | dist; None: dist on CUDA, shm on the CPU
    auto_int8: bool = True
    auto_int8_min_bytes: int = 1 << 20
    auto_int8_margin: float = 1.2
    overlap_min_tokens: int = 256
    overlap_cpu_transport: str | None = None  # tests only (see the module's doc)

    def __post_init__(self) -> None:
        if self.strategy not in COMM_STRATEGIES:
            raise ValueError(f"unknown communication strategy {self.strategy!r}; choose one of "
                             f"{', '.join(COMM_STRATEGIES)}")
        if self.int8_transport not in (None, *INT8_TRANSPORTS):
            raise ValueError(f"int8_transport must be one of {', '.join(INT8_TRANSPORTS)}, got "
                             f"{self.int8_transport!r}")
        if self.overlap_cpu_transport not in (None, *OVERLAP_TRANSPORTS):
            raise ValueError(f"overlap_cpu_transport must be one of {', '.join(OVERLAP_TRANSPORTS)}, got "
                             f"{self.overlap_cpu_transport!r}")
        for name in ("startup_timeout_s", "timeout_s", "host_oneshot_max", "host_gpu_small_max", "host_gpu_chunk",
                     "auto_int8_min_bytes", "auto_int8_margin"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("spin_ns", "host_reduce_threads"):
            v = getattr(self, name)
            if v is not None and v < (0 if name == "spin_ns" else 1):
                raise ValueError(f"{name} out of range: {v!r}")
        if self.overlap_min_tokens < 2:
            raise ValueError(f"overlap_min_tokens must be >= 2, got {self.overlap_min_tokens!r}")

    # -- resolution -----------------------------------------------------------------------------------------
    @property
    def is_resolved(self) -> bool:
        return None not in (self.pcie_mode, self.spin_ns, self.host_reduce_threads, self.int8_transport)

    def resolved(self, *, device_type: str, world: int, oversubscribed: bool = False,
                 cpu_count: int | None = None, environ: dict[str, str] | None = None) -> CommConfig:
        """Every ``None`` replaced by its default for this device, group size and machine."""
        env = os.environ if environ is None else environ
        cores = cpu_count or os.cpu_count() or 2
        fill: dict[str, Any] = {}
        if self.pcie_mode is None:
            fill["pcie_mode"] = env.get("NCCL_P2P_DISABLE", "0") not in ("", "0")
        if self.spin_ns is None:
            fill["spin_ns"] = 2_000 if oversubscribed else 20_000
        if self.host_reduce_threads is None:
            fill["host_reduce_threads"] = max(1, min(8, cores // max(world, 1)))
        if self.int8_transport is None:
            fill["int8_transport"] = "dist" if device_type == "cuda" else "shm"
        return dataclasses.replace(self, **fill) if fill else self

    @classmethod
    def for_engine(cls, engine_config: Any, *, device_type: str, world: int, oversubscribed: bool = False,
                   base: CommConfig | None = None) -> CommConfig:
        """The configuration a tensor-parallel engine runs with: ``base`` (the measured defaults unless a caller,
        e.g. a test, gives its own), with the user's choices from ``engine_config``, resolved for the device."""
        cfg = base or cls()
        strategy = getattr(engine_config, "comm_strategy", None)
        if strategy is not None:
            cfg = dataclasses.replace(cfg, strategy=strategy)
        return cfg.resolved(device_type=device_type, world=world, oversubscribed=oversubscribed)

    # -- serialisation --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown CommConfig fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def resolved_comm_config(engine_config: Any = None, *, device_type: str = "cpu", world: int = 1,
                         oversubscribed: bool = False, base: CommConfig | None = None) -> dict[str, Any]:
    """The communication configuration an engine with ``engine_config`` would run with here, as a dict: what a
    benchmark report records (a live tensor-parallel engine's own is ``executor.comm_config.to_dict()``)."""
    return CommConfig.for_engine(engine_config, device_type=device_type, world=world,
                                 oversubscribed=oversubscribed, base=base).to_dict()
