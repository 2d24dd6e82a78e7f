"""Host facts without torch: this machine's CPU and, when NVML answers, its NVIDIA GPUs, driver and PCIe topology.

A low-level module (it imports only engine.cpu_features) so that the API server's /v1/server_info and the
benchmarks' reports (engine/bench/report.py, `kestrel bench serve` on a client machine) share it without the
server importing the benchmarks."""

from __future__ import annotations

import os
import platform

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
