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


_NVML_TOPOLOGY = {0: "same board", 10: "single PCIe switch", 20: "multiple PCIe switches", 30: "PCIe host bridge",
                  40: "same NUMA node", 50: "across NUMA nodes (SMP interconnect)"}


def host_hardware() -> dict:
    """This host's CPU and, when NVML answers, its NVIDIA GPUs, driver and the PCIe topology between each pair
    (no torch import: the API server's /v1/server_info and `kestrel bench serve` on a client machine use it)."""
    from engine.cpu_features import cpu_model_name

    hw: dict = {"hostname": platform.node(), "platform": platform.platform(), "cpu": cpu_model_name(),
                "logical_cpus": os.cpu_count(), "gpus": [], "gpu_driver": None}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no NVIDIA driver (or no nvidia-ml-py) here
        hw["nvml"] = f"unavailable ({type(e).__name__})"
        return hw
    try:
        hw["gpu_driver"] = pynvml.nvmlSystemGetDriverVersion()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        for h in handles:
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            hw["gpus"].append({"name": pynvml.nvmlDeviceGetName(h), "memory_gib": round(mem.total / 2**30, 1)})
        topo = {}
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                try:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    topo[f"{i}-{j}"] = _NVML_TOPOLOGY.get(level, str(level))
                except Exception:  # noqa: BLE001 - not supported on this driver
                    topo[f"{i}-{j}"] = None
        if topo:
            hw["gpu_topology"] = topo
    except Exception as e:  # noqa: BLE001 - a partial answer is still worth recording
        hw["nvml"] = f"error ({type(e).__name__}: {e})"
    finally:
        pynvml.nvmlShutdown()
    return hw


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
