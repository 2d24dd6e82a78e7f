"""Every communication strategy's all-reduce, run by real rank processes sharing a group (gloo for nccl on
the CPU, the POSIX shared segment for host and int8), on fresh random inputs from decode-sized to a few
MB (several slot-sized chunks), in every dtype: within the strategy's bound of a float64 sum, bit-exact
against its torch reference where it has one (host, int8), the same bits on every rank, the async path
identical to the sync one. Also TP=3 (an odd group) and int8 over torch.distributed (the GPU transport,
run here with the CPU kernels)."""

from __future__ import annotations

import pytest

from engine.bench.comm_group import run_group
from engine.parallel.comm.config import CommConfig

pytestmark = pytest.mark.timeout(600)

# decode-sized, odd, one-shot / two-phase boundary (64 KiB), several 256 KiB chunks (the layout below)
SIZES = [1, 577, 4096, 16385, 40000, 3 * 131072 + 17]
DTYPES = ["float32", "bfloat16", "float16"]
LAYOUT = {"slot_bytes": 256 << 10}


def _check_rows(results: list[list[dict]], expect_bits: set[str]) -> None:
    rows0 = results[0]
    assert rows0, "no cases ran"
    for r in range(1, len(results)):
        assert [x["digest"] for x in results[r]] == [x["digest"] for x in rows0], f"rank {r} ended with other bits"
    for row in rows0:
        case = f"{row['strategy']} {row['dtype']} n={row['n']}"
        assert row["err_ratio"] <= 1.0, f"{case}: error {row['err_ratio']:.3f}x its bound"
        assert row["same_async"], f"{case}: async result differs"
        if row["strategy"] in expect_bits:
            assert row["bit_exact"] is True, f"{case}: not bit-exact with its torch reference"


@pytest.mark.parametrize("world", [2, 3])
def test_strategies_match_float64(world):
    sizes = SIZES if world == 2 else SIZES[:4]
    results = run_group(world, "tests.support.tp_harness:check",
                        {"sizes": sizes, "dtypes": DTYPES, "names": ["host", "int8", "nccl"], "seed": world},
                        layout=LAYOUT)
    assert len(results) == world
    _check_rows(results, {"host", "int8"})
    names = {row["strategy"] for row in results[0]}
    assert names == {"host", "int8", "gloo"}


def test_int8_over_torch_distributed_matches_reference():
    results = run_group(2, "tests.support.tp_harness:check",
                        {"sizes": [5, 4096, 16385], "dtypes": ["bfloat16", "float32"], "names": ["int8"], "seed": 9},
                        comm=CommConfig(int8_transport="dist"))
    _check_rows(results, {"int8"})


def test_benchmark_table_shape():
    rows = run_group(2, "engine.bench.comm_group:bench", {"sizes": [4096, 65536], "dtype": "bfloat16"})[0]
    assert [r["bytes"] for r in rows] == [4096, 65536]
    for r in rows:
        assert set(r["latency_us"]) == {"nccl", "host", "int8"}
        assert all(v > 0 for v in r["latency_us"].values())
        assert all(r["ok"].values())
