"""The TP comm tests' target, run on every rank of a fresh group by engine.bench.comm_group.run_group:

    results = run_group(2, "tests.support.tp_harness:check",
                        {"sizes": [...], "dtypes": [...], "names": [...]})
"""

from __future__ import annotations

import hashlib

import torch

from engine.bench.comm_group import DTYPES
from engine.parallel.comm import reference


def _inputs(nelem: int, world: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 1009 + r)
        # mixed magnitudes: some groups tiny, some large, some exact zeros (int8 edge cases)
        x = torch.randn(nelem, generator=g) * torch.exp(torch.randn(nelem, generator=g))
        x[torch.rand(nelem, generator=g) < 0.01] = 0.0
        xs.append(x.to(dtype))
    return xs


def check(comm, sizes: list[int], dtypes: list[str], names: list[str], seed: int = 0, async_too: bool = True
          ) -> list[dict]:
    """Every strategy's all-reduce on fresh random inputs against a float64 sum (within the strategy's
    bound) and against its bit-exact torch reference where it has one; digests of every rank's result
    (must agree across ranks); the input of every call is poisoned afterwards (in place)."""
    rows = []
    rank, world, dev = comm.rank, comm.world, comm.device
    for name in names:
        strat = comm.strategies[name]
        for dt in dtypes:
            dtype = DTYPES[dt]
            for i, n in enumerate(sizes):
                xs = _inputs(n, world, dtype, seed + 7919 * i + 31 * len(name))
                x = xs[rank].to(dev).clone()
                y = strat.all_reduce(x)
                if async_too and i % 2:  # every other size through the async path as well
                    x2 = xs[rank].to(dev).clone()
                    y2 = strat.all_reduce_async(x2).wait()
                    same_async = torch.equal(y2.view(torch.uint8) if dtype != torch.float32 else y2,
                                             y.view(torch.uint8) if dtype != torch.float32 else y)
                else:
                    same_async = True
                yc = y.cpu()
                ref64 = reference.float64_sum(xs)
                bound = reference.error_bound(strat.bound, xs)
                ratio = float(((yc.double() - ref64).abs() / bound).max())
                if name == "host":
                    bit = torch.equal(yc.view(-1).view(torch.uint8), reference.exact_all_reduce(xs).view(-1).view(
                        torch.uint8))
                elif name == "int8":
                    bit = torch.equal(yc.view(-1).view(torch.uint8),
                                      reference.int8_all_reduce(xs).view(-1).view(torch.uint8))
                else:
                    bit = None
                digest = hashlib.sha1(yc.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                rows.append({"strategy": strat.name, "dtype": dt, "n": n, "err_ratio": ratio, "bit_exact": bit,
                             "digest": digest, "same_async": same_async})
    return rows
