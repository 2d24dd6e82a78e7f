"""All-reduce micro-benchmarks on a fresh communication group: ``run_group`` runs a function on every rank,
each rank in its own process (no model involved), and the benchmark targets it runs (bench, ping,
loop_latency, latency_table). engine/bench/tp.py --device cpu uses them; the TP tests run their own
target (tests/support/tp_harness.py) through run_group.

    rows = run_group(2, "engine.bench.comm_group:bench", {"sizes": [...], "dtype": "bfloat16"})

Every rank: attach the group's segment, build a Communicator, connect (torch.distributed: gloo on CPU,
NCCL on CUDA), call ``target(comm, **kwargs)``; the results come back in rank order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_group(world: int, target: str, kwargs: dict | None = None, strategy: str = "host", device: str = "cpu",
              timeout: float = 300.0, layout: dict | None = None, env: dict | None = None, comm=None) -> list:
    """``comm``: a CommConfig to start from (default: the measured defaults); ``strategy`` replaces its strategy and
    the result, resolved here, is what every rank's Communicator gets."""
    import dataclasses

    import torch.distributed as dist

    from engine.parallel.comm.config import CommConfig
    from engine.executor.tp_executor import read_msg_fd, write_msg
    from engine.parallel.comm.shm import Layout, Segment

    comm_config = dataclasses.replace(comm or CommConfig(), strategy=strategy).resolved(
        device_type=torch.device(device).type, world=world)
    lay = Layout(world=world, **(layout or {}))
    seg = Segment.create(lay)
    store = dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    procs, fds = [], []
    penv = dict(os.environ)
    penv["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + (
        os.pathsep + penv["PYTHONPATH"] if penv.get("PYTHONPATH") else "")
    penv.setdefault("OMP_NUM_THREADS", "1")
    penv.update(env or {})
    try:
        for rank in range(world):
            r_fd, w_fd = os.pipe()
            p = subprocess.Popen([sys.executable, "-m", "engine.bench.comm_group"], stdin=subprocess.PIPE,
                                 pass_fds=(seg.fd, w_fd), env=penv, close_fds=True)
            os.close(w_fd)
            procs.append(p)
            fds.append(r_fd)
            write_msg(p.stdin, {"rank": rank, "world": world, "shm_fd": seg.fd, "status_fd": w_fd, "layout": lay,
                                 "port": store.port, "target": target, "kwargs": kwargs or {},
                                 "comm_config": comm_config.to_dict(), "device": device})
        results = []
        deadline = time.monotonic() + timeout
        for rank, fd in enumerate(fds):
            msg = _read_with_deadline(fd, deadline, read_msg_fd)
            if msg is None:
                rc = procs[rank].poll()
                raise RuntimeError(f"rank {rank} returned nothing (exit code {rc})")
            if "error" in msg:
                raise RuntimeError(f"rank {rank} failed: {msg['error']}")
            results.append(msg["result"])
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        return results
    finally:
        seg.abort()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stdin:
                p.stdin.close()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        seg.close()


def _read_with_deadline(fd: int, deadline: float, reader):
    import select

    left = deadline - time.monotonic()
    r, _, _ = select.select([fd], [], [], max(0.0, left))
    if not r:
        raise TimeoutError("a rank did not answer in time")
    return reader(fd)


def _main() -> None:
    import importlib
    import traceback

    from engine.parallel.comm.config import CommConfig
    from engine.parallel.comm.group import Communicator
    from engine.executor.tp_executor import read_msg_fd, write_msg
    from engine.parallel.comm.shm import Segment

    boot = read_msg_fd(sys.stdin.fileno())
    out = os.fdopen(boot["status_fd"], "wb", buffering=0)
    comm = None
    try:
        device = torch.device(boot["device"])
        if device.type == "cuda":
            torch.cuda.set_device(boot["rank"])
            device = torch.device("cuda", boot["rank"])
        seg = Segment.attach(boot["shm_fd"], boot["layout"])
        comm = Communicator(boot["rank"], boot["world"], device, CommConfig.from_dict(boot["comm_config"]), seg,
                            store_port=boot["port"])
        comm.connect()
        module, _, name = boot["target"].partition(":")
        result = getattr(importlib.import_module(module), name)(comm, **boot["kwargs"])
        write_msg(out, {"result": result})
    except BaseException as e:  # noqa: BLE001
        write_msg(out, {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"})
    finally:
        if comm is not None:
            comm.close()
    os._exit(0)


# ---------------------------------------------------------------------------------------------------
# benchmark targets (``target(comm, **kwargs)``, run on every rank)


def bench(comm, sizes: list[int], dtype: str = "bfloat16", names: list[str] | None = None) -> list[dict]:
    """Latency table (median us) of the strategies, as auto measures it."""
    return comm.benchmark(DTYPES[dtype], sizes, names)


def ping(comm, n: int = 200) -> dict:
    """Barrier round trip through the host segment (the floor of any host collective)."""
    hc = comm.transport.hc
    for _ in range(10):
        hc.barrier()
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        hc.barrier()
        t.append(time.perf_counter() - t0)
    t.sort()
    return {"barrier_us": t[len(t) // 2] * 1e6}


def loop_latency(comm, name: str = "host", nbytes: int = 2048, n: int = 2000, dtype: str = "bfloat16") -> dict:
    """Percentiles (us) of back-to-back all-reduces of one size with one strategy (CPU)."""
    dt = DTYPES[dtype]
    x = torch.zeros(nbytes // torch.tensor([], dtype=dt).element_size(), dtype=dt)
    s = comm.strategies[name]
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.all_reduce(x)
        t.append(time.perf_counter() - t0)
    t.sort()
    return {"p10": t[n // 10] * 1e6, "p50": t[n // 2] * 1e6, "p90": t[9 * n // 10] * 1e6}


def latency_table(comm, sizes: list[int], names: list[str] | None = None, dtype: str = "bfloat16",
                  budget_s: float = 0.5) -> list[dict]:
    """For every size, p10/p50/p90 (us) of back-to-back all-reduces with each strategy (same call counts on
    every rank: the count depends on the size only)."""
    names = names or [n for n in ("nccl", "host", "int8") if n in comm.strategies]
    dt = DTYPES[dtype]
    esz = torch.tensor([], dtype=dt).element_size()
    rows = []
    for size in sizes:
        n_calls = int(max(20, min(2000, budget_s / (2e-6 + size / 2e9))))
        row = {"bytes": size, "calls": n_calls}
        for name in names:
            x = torch.zeros(size // esz, dtype=dt)
            s = comm.strategies[name]
            for _ in range(3):
                s.all_reduce(x)
            t = []
            for _ in range(n_calls):
                t0 = time.perf_counter()
                s.all_reduce(x)
                t.append(time.perf_counter() - t0)
            t.sort()
            row[s.name] = {"p10": round(t[n_calls // 10] * 1e6, 2), "p50": round(t[n_calls // 2] * 1e6, 2),
                           "p90": round(t[9 * n_calls // 10] * 1e6, 2)}
        rows.append(row)
    return rows


if __name__ == "__main__":
    _main()
