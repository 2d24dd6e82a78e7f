"""``auto``: a start-up micro-benchmark picks the fastest correct strategy per message-size bucket.

At start-up (collectively, on every rank) each candidate strategy all-reduces messages of every size in
``sizes`` (the model's dtype): first a correctness check against a float64 sum of the ranks' inputs (each
rank generates every rank's input from fixed seeds, so each can compute the reference; a strategy outside
its bound - reference.error_bound - is excluded from that size), then a timing (median of the per-call
times of a fixed number of calls, the same on every rank). Rank 0's measurements decide; the table is
broadcast so every rank dispatches identically (the collectives must match). A message is served by the
choice of the nearest measured size (log scale).

The lossy int8 strategy is a candidate only for messages of at least ``int8_min_bytes`` (prefill) and must
beat the best exact strategy by ``int8_margin``; CommConfig(auto_int8=False) keeps auto exact.
The table (``rows``) is kept in the engine's stats for the GUI and the benchmark reports.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import time

import torch
import torch.distributed as dist

from engine.parallel.comm import reference
from engine.parallel.comm.base import CommStrategy
from engine.parallel.comm.config import CommConfig

log = logging.getLogger(__name__)

CPU_SIZES = [2 << 10, 8 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20]
GPU_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(nelem: int, world: int, dtype: torch.dtype, size: int) -> list[torch.Tensor]:
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(1_000_003 * size + r)
        xs.append((torch.randn(nelem, generator=g) * (1 + r)).to(dtype))
    return xs


def _iters(size: int, device: torch.device) -> int:
    budget = 4e6 if device.type == "cpu" else 64e6  # bytes moved per timed cell, roughly
    return int(max(5, min(40, budget // max(size, 4096))))


def measure(strategies: dict[str, CommStrategy], dtype: torch.dtype, sizes: list[int], rank: int, world: int,
            device: torch.device, check: bool = True, check_max_bytes: int = 2 << 20) -> list[dict]:
    """Collective: every rank calls with the same arguments. Returns one row per size:
    {"bytes", "latency_us": {name: median us}, "ok": {name: bool}, "max_err_ratio": {name: float}}.
    Sizes above check_max_bytes are timed only (the same code paths as the largest checked size, which
    already spans several chunks; the float64 reference of 64 MiB would take seconds)."""
    rows = []
    esz = torch.tensor([], dtype=dtype).element_size()
    last_ok: dict[str, bool] = {}
    for size in sizes:
        n = max(1, size // esz)
        row = {"bytes": n * esz, "latency_us": {}, "ok": {}, "max_err_ratio": {}, "checked": False}
        do_check = check and n * esz <= check_max_bytes
        row["checked"] = do_check
        xs = _inputs(n, world, dtype, size) if do_check else None
        ref = reference.float64_sum(xs) if do_check else None
        bounds: dict[str, torch.Tensor] = {}
        for name, strat in strategies.items():
            if do_check:
                y = strat.all_reduce(xs[rank].to(device).clone()).double().cpu()
                if strat.bound not in bounds:
                    bounds[strat.bound] = reference.error_bound(strat.bound, xs)
                bound = bounds[strat.bound]
                ratio = float(((y - ref).abs() / bound).max())
                row["ok"][name] = last_ok[name] = bool(math.isfinite(ratio) and ratio <= 1.0)
                row["max_err_ratio"][name] = ratio
            elif check:  # not checked at this size: the verdict of the largest checked one
                row["ok"][name] = last_ok.get(name, False)
            buf = torch.zeros(n, dtype=dtype, device=device)
            for _ in range(2):
                strat.all_reduce(buf)
            times = []
            for _ in range(_iters(size, device)):
                _sync(device)
                t0 = time.perf_counter()
                strat.all_reduce(buf)
                _sync(device)
                times.append(time.perf_counter() - t0)
            times.sort()
            row["latency_us"][name] = round(times[len(times) // 2] * 1e6, 2)
        rows.append(row)
    return rows


class AutoStrategy(CommStrategy):
    name = "auto"

    def __init__(self, rank: int, world: int, device: torch.device, candidates: dict[str, CommStrategy],
                 config: CommConfig | None = None, **kw):
        super().__init__(rank, world, device, **kw)
        self.candidates = candidates
        self.rows: list[dict] = []
        self._bounds: list[float] = []
        self._choice: list[CommStrategy] = []
        fallback = candidates.get("host") or next(iter(candidates.values()))
        self._fallback = fallback
        config = config or CommConfig()
        self.int8_min_bytes = config.auto_int8_min_bytes
        self.int8_margin = config.auto_int8_margin
        self.allow_int8 = config.auto_int8

    def tune(self, dtype: torch.dtype, sizes: list[int] | None = None) -> list[dict]:
        """Collective. Measures every candidate, decides on rank 0, broadcasts the table."""
        sizes = sizes or (GPU_SIZES if self.device.type == "cuda" else CPU_SIZES)
        t0 = time.perf_counter()
        rows = measure(self.candidates, dtype, sizes, self.rank, self.world, self.device)
        for row in rows:
            row["choice"] = self._decide(row)
        obj = [rows]
        dist.broadcast_object_list(obj, src=0)
        self.set_table(obj[0])
        if self.rank == 0:
            log.info("auto all-reduce table (%.2f s): %s", time.perf_counter() - t0,
                     ", ".join(f"{r['bytes']}B->{r['choice']}" for r in self.rows))
        return self.rows

    def _decide(self, row: dict) -> str:
        lat, ok = row["latency_us"], row["ok"]
        exact = [n for n, s in self.candidates.items() if s.exact and ok.get(n, True)]
        if not exact:
            raise RuntimeError(f"no exact all-reduce strategy passed the correctness check at {row['bytes']} "
                               f"bytes: {row['max_err_ratio']}")
        best = min(exact, key=lambda n: lat[n])
        if self.allow_int8 and row["bytes"] >= self.int8_min_bytes:
            for n, s in self.candidates.items():
                if not s.exact and ok.get(n, False) and lat[n] * self.int8_margin < lat[best]:
                    best = n
        return best

    def set_table(self, rows: list[dict]) -> None:
        self.rows = rows
        sizes = [r["bytes"] for r in rows]
        self._bounds = [math.sqrt(a * b) for a, b in itertools.pairwise(sizes)]
        self._choice = [self.candidates[r["choice"]] for r in rows]

    def pick(self, nbytes: int) -> CommStrategy:
        if not self._choice:
            return self._fallback
        return self._choice[bisect.bisect_left(self._bounds, nbytes)]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.pick(x.numel() * x.element_size()).all_reduce(x)  # counted by the chosen strategy

    def all_reduce_async(self, x: torch.Tensor):
        return self.pick(x.numel() * x.element_size()).all_reduce_async(x)
