"""What every benchmark report records so it can be reproduced."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    import torch

    from engine import envs
    from engine.cpu_features import cpu_flags, cpu_model_name
    from engine.runner.device import physical_cores

    env = {
        "command": " ".join(["kestrel", *sys.argv[1:]]),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model_name(),
        "cpu_isa": sorted(f for f in cpu_flags() if f.startswith(("avx512", "avx2", "amx", "fma"))),
        "physical_cores": physical_cores(),
        "logical_cpus": os.cpu_count(),
        "versions": {d: _version(d) for d in ("kestrel", "torch", "transformers", "llama_cpp_python", "gguf")},
        "torch_threads": torch.get_num_threads(),
        "kestrel_env": {k: v["value"] for k, v in envs.describe(only_set=True).items()},  # engine/envs.py
    }
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["cuda"] = torch.version.cuda
    return env


def resolved_config(core=None, engine_config=None) -> dict:
    """The kernel and comm configuration an engine runs with (engine/kernel_config.py, engine/parallel/comm/
    config.py), resolved once at its start-up: a live ``core``'s own (its runner's KernelConfig, its TP executor's
    CommConfig), else what ``engine_config`` would resolve to on this machine. Every benchmark report records it
    beside its environment, so that a run can be reproduced from its configuration."""
    out: dict = {}
    runner = getattr(core, "runner", None)
    kc = getattr(runner, "kernel_config", None)
    try:
        if kc is None:
            from engine import ops
            from engine.kernel_config import resolve

            cfg = engine_config if engine_config is not None else getattr(core, "config", None)
            kc = resolve(ops.device_facts(getattr(runner, "device", None) or _device(cfg)), cfg)
        out["kernel"] = kc.to_dict()
    except Exception as e:  # noqa: BLE001 - the report says why instead of failing the benchmark
        out["kernel"] = {"error": f"{type(e).__name__}: {e}"}
    comm = getattr(getattr(core, "executor", None), "comm_config", None)
    try:
        if comm is not None:
            out["comm"] = comm.to_dict()
        else:
            from engine.parallel.comm.config import resolved_comm_config

            cfg = engine_config if engine_config is not None else getattr(core, "config", None)
            out["comm"] = resolved_comm_config(cfg, device_type=_device(cfg).split(":")[0],
                                               world=int(getattr(cfg, "tensor_parallel_size", 1) or 1))
    except Exception as e:  # noqa: BLE001
        out["comm"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _device(cfg) -> str:
    device = str(getattr(cfg, "device", None) or "auto")
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device
