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
    from engine.cpu_features import cpu_flags
    from engine.runner.device import physical_cores

    cpu_name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu_name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu_name)
    except OSError:
        pass
    env = {
        "command": " ".join(["kestrel", *sys.argv[1:]]),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name,
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
