"""What every benchmark report records so it can be reproduced."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Iterable, Iterator
from importlib import metadata


@contextlib.contextmanager
def environ_restored(names: Iterable[str]) -> Iterator[None]:
    """The environment variables ``names`` as they were (or unset) again on leaving the block, whatever the block
    set them to (a benchmark comparing KESTREL_* settings in one process)."""
    saved = {k: os.environ.get(k) for k in names}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
