"""CommConfig (engine/parallel/comm/config.py): the communication configuration of tensor parallelism, typed and
frozen, resolved once at start-up and handed to every rank. Torch-free and fast: no group is started here (the
rank processes getting it are covered by test_tp_engine.py / test_tp_strategy_matrix.py, whose overlap runs would
not match their collectives if a worker ran another configuration than rank 0)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import envs
from engine.config import COMM_STRATEGIES, EngineConfig
from engine.parallel.comm.config import CommConfig, resolved_comm_config

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_resolve_per_device_and_group():
    cpu = CommConfig().resolved(device_type="cpu", world=2, cpu_count=16, environ={})
    assert cpu.is_resolved and not CommConfig().is_resolved
    assert (cpu.int8_transport, cpu.spin_ns, cpu.host_reduce_threads, cpu.pcie_mode) == ("shm", 20_000, 8, False)
    over = CommConfig().resolved(device_type="cpu", world=4, oversubscribed=True, cpu_count=2, environ={})
    assert (over.spin_ns, over.host_reduce_threads) == (2_000, 1)
    gpu = CommConfig().resolved(device_type="cuda", world=2, cpu_count=16, environ={"NCCL_P2P_DISABLE": "1"})
    assert (gpu.int8_transport, gpu.pcie_mode) == ("dist", True)
    # what a caller chose stays
    mine = CommConfig(int8_transport="dist", spin_ns=5, host_reduce_threads=3, pcie_mode=False)
    assert mine.resolved(device_type="cpu", world=2, environ={"NCCL_P2P_DISABLE": "1"}) == mine


def test_for_engine_takes_the_users_strategy():
    cfg = CommConfig.for_engine(EngineConfig(comm_strategy="int8"), device_type="cpu", world=2)
    assert cfg.strategy == "int8" and cfg.is_resolved
    base = CommConfig(overlap_min_tokens=2, overlap_cpu_transport="host")
    cfg = CommConfig.for_engine(EngineConfig(comm_strategy="overlap"), device_type="cpu", world=2, base=base)
    assert (cfg.strategy, cfg.overlap_min_tokens, cfg.overlap_cpu_transport) == ("overlap", 2, "host")
    report = resolved_comm_config(EngineConfig(), device_type="cpu", world=2)
    assert report["strategy"] == "auto" and report["int8_transport"] == "shm"
    assert set(report) == {f.name for f in dataclasses.fields(CommConfig)}


def test_round_trip_and_validation():
    cfg = CommConfig(strategy="host", timeout_s=12.5, auto_int8=False).resolved(device_type="cpu", world=3)
    assert CommConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown CommConfig fields: spin"):
        CommConfig.from_dict({**cfg.to_dict(), "spin": 1})
    for bad in ({"strategy": "carrier-pigeon"}, {"int8_transport": "udp"}, {"overlap_cpu_transport": "1"},
                {"timeout_s": 0}, {"host_gpu_chunk": -1}, {"spin_ns": -1}, {"host_reduce_threads": 0},
                {"overlap_min_tokens": 1}):
        with pytest.raises(ValueError):
            CommConfig(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.timeout_s = 1.0
    assert set(COMM_STRATEGIES) == {"auto", "nccl", "int8", "host", "overlap"}


def test_imports_without_torch():
    code = ("import sys; from engine.parallel.comm.config import CommConfig; "
            "CommConfig().resolved(device_type='cpu', world=2).to_dict(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_comm_side_reads_no_environment_variable():
    """The former KESTREL_* comm switches are gone from the table; nothing under engine/parallel nor the worker
    reads one (rank 0's executor reads the workers' logging level once, when it starts them, and hands it over)."""
    gone = ("TP_STARTUP_TIMEOUT_S", "COMM_TIMEOUT_S", "PCIE_MODE", "COMM_TIMING", "COMM_SPIN_NS", "COMM_YIELD_NS",
            "HOST_ONESHOT_MAX", "HOST_REDUCE_THREADS", "HOST_GPU_SMALL_MAX", "HOST_GPU_CHUNK", "INT8_TRANSPORT",
            "AUTO_INT8", "AUTO_INT8_MIN_BYTES", "AUTO_INT8_MARGIN", "OVERLAP_MIN_TOKENS", "OVERLAP_FORCE")
    assert not [n for n in gone if f"KESTREL_{n}" in envs.ENV_VARS]
    reads = re.compile(r"KESTREL_[A-Z0-9_]+|\benvs\.")
    files = [*(ROOT / "engine" / "parallel").rglob("*.py"), ROOT / "engine" / "executor" / "worker.py"]
    offenders = [f"{p.relative_to(ROOT)}: {m}" for p in files for m in reads.findall(p.read_text())]
    assert not offenders, offenders
