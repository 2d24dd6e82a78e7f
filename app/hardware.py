"""What this machine has: CPU and RAM (psutil), and per NVIDIA GPU through NVML (nvidia-ml-py): name,
memory, utilization, temperature, PCIe link and its live TX/RX throughput, and the peer-to-peer matrix.
No CUDA, no torch. Every NVML call may fail on some driver or GPU: a failed reading is None, never an
exception. Runs on a worker thread (the PCIe throughput counters take ~20 ms per GPU and direction)."""

from __future__ import annotations

import functools
import os
from collections import deque
from dataclasses import dataclass, field

import psutil

# cpu_flags and cpu_has_native_bf16: the panels import them from here
from engine.cpu_features import cpu_flags, cpu_has_native_bf16, cpu_model_name  # noqa: F401


@dataclass
class GPUInfo:
    index: int
    name: str
    memory_used: int | None = None  # bytes
    memory_total: int | None = None
    utilization: int | None = None  # percent
    temperature: int | None = None  # °C
    pcie_gen: int | None = None  # current link
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    pcie_tx: float | None = None  # bytes/s, device -> host
    pcie_rx: float | None = None  # bytes/s, host -> device
    bus_id: str = ""


@dataclass
class HardwareSnapshot:
    cpu_name: str
    cores_physical: int | None
    cores_logical: int | None
    cpu_percent: float
    ram_used: int
    ram_total: int
    gpus: list[GPUInfo] = field(default_factory=list)
    peer_matrix: list[list[str]] | None = None  # [i][j]: "X" on the diagonal, else e.g. "P2P · PIX"
    driver: str | None = None
    gpu_message: str = ""  # why there are no GPUs, in plain words


HISTORY = 120  # samples kept per series (two minutes at the worker's one sample a second)
GPU_SERIES = ("util", "mem", "tx", "rx", "temp")  # per GPU: %, GiB used, MB/s each way, °C


class HardwareHistory:
    """The last ``size`` samples of each figure the Hardware panel plots, as (time, value) ring buffers:
    ``cpu`` (%), ``ram`` (GiB used), and per GPU ``gpu<i>.<util|mem|tx|rx|temp>``. A reading NVML could not
    take (None) adds no point. Plain Python: the panel feeds it snapshots with their arrival time."""

    def __init__(self, size: int = HISTORY):
        self.size = size
        self.series: dict[str, deque[tuple[float, float]]] = {}
        self.gpus: list[int] = []  # indices of the GPUs seen, in order
        self.ram_total: int = 0

    def add(self, t: float, snap: HardwareSnapshot) -> None:
        self._put("cpu", t, snap.cpu_percent)
        self._put("ram", t, snap.ram_used / 2**30)
        self.ram_total = snap.ram_total
        for g in snap.gpus:
            if g.index not in self.gpus:
                self.gpus.append(g.index)
            mem = g.memory_used / 2**30 if g.memory_used is not None else None
            tx = g.pcie_tx / 1e6 if g.pcie_tx is not None else None
            rx = g.pcie_rx / 1e6 if g.pcie_rx is not None else None
            for name, value in zip(GPU_SERIES, (g.utilization, mem, tx, rx, g.temperature)):
                self._put(f"gpu{g.index}.{name}", t, value)

    def _put(self, key: str, t: float, value: float | None) -> None:
        if value is None:
            return
        if key not in self.series:
            self.series[key] = deque(maxlen=self.size)
        self.series[key].append((t, float(value)))

    def values(self, key: str) -> list[float]:
        return [v for _, v in self.series.get(key, ())]

    def times(self, key: str) -> list[float]:
        return [t for t, _ in self.series.get(key, ())]

    def clear(self) -> None:
        self.series.clear()
        self.gpus.clear()


class HardwareProbe:
    """Open once (NVML init), read many times, close at the end."""

    def __init__(self):
        self.nvml = None
        self.handles: list = []
        self.error = ""
        self.driver: str | None = None
        self._cpu_name = cpu_model_name()
        psutil.cpu_percent(None)  # prime the counter
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.driver = _text(_try(pynvml.nvmlSystemGetDriverVersion))
            if not self.handles:
                self.error = "The NVIDIA driver reports no GPU."
        except ImportError:
            self.error = "No NVIDIA GPU found (nvidia-ml-py is not installed, so GPUs cannot be listed)."
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.nvml = None
            self.error = _nvml_message(e)
        self._peer: list[list[str]] | None = None

    @property
    def num_gpus(self) -> int:
        return len(self.handles)

    def snapshot(self, pcie_throughput: bool = True) -> HardwareSnapshot:
        vm = psutil.virtual_memory()
        snap = HardwareSnapshot(
            cpu_name=self._cpu_name, cores_physical=psutil.cpu_count(logical=False),
            cores_logical=psutil.cpu_count(logical=True) or os.cpu_count(), cpu_percent=psutil.cpu_percent(None),
            ram_used=vm.total - vm.available, ram_total=vm.total, driver=self.driver, gpu_message=self.error)
        if self.nvml is None:
            return snap
        snap.gpus = [self._gpu(i, h, pcie_throughput) for i, h in enumerate(self.handles)]
        if self._peer is None:
            self._peer = self._peer_matrix()
        snap.peer_matrix = self._peer
        return snap

    def _gpu(self, index: int, h, pcie_throughput: bool) -> GPUInfo:
        n = self.nvml
        info = GPUInfo(index=index, name=_text(_try(n.nvmlDeviceGetName, h)) or f"GPU {index}")
        mem = _try(n.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            info.memory_used, info.memory_total = int(mem.used), int(mem.total)
        util = _try(n.nvmlDeviceGetUtilizationRates, h)
        info.utilization = int(util.gpu) if util is not None else None
        info.temperature = _try(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        info.pcie_gen = _try(n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        info.pcie_width = _try(n.nvmlDeviceGetCurrPcieLinkWidth, h)
        info.pcie_gen_max = _try(n.nvmlDeviceGetMaxPcieLinkGeneration, h)
        info.pcie_width_max = _try(n.nvmlDeviceGetMaxPcieLinkWidth, h)
        pci = _try(n.nvmlDeviceGetPciInfo, h)
        info.bus_id = _text(getattr(pci, "busId", "")) if pci is not None else ""
        if pcie_throughput:
            tx = _try(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)  # KB/s
            rx = _try(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)
            info.pcie_tx = tx * 1024.0 if tx is not None else None
            info.pcie_rx = rx * 1024.0 if rx is not None else None
        return info

    def _peer_matrix(self) -> list[list[str]]:
        """Like ``nvidia-smi topo -m``: NV# (NVLink, # active links) or the PCIe path (PIX, PXB, PHB, NODE,
        SYS), and whether peer-to-peer reads are allowed."""
        n = self.nvml
        topo_names = {
            getattr(n, "NVML_TOPOLOGY_INTERNAL", 0): "same board",
            getattr(n, "NVML_TOPOLOGY_SINGLE", 10): "PIX",
            getattr(n, "NVML_TOPOLOGY_MULTIPLE", 20): "PXB",
            getattr(n, "NVML_TOPOLOGY_HOSTBRIDGE", 30): "PHB",
            getattr(n, "NVML_TOPOLOGY_NODE", 40): "NODE",
            getattr(n, "NVML_TOPOLOGY_SYSTEM", 50): "SYS",
        }
        ok = getattr(n, "NVML_P2P_STATUS_OK", 0)
        read, nvlink = _caps_index(n, "READ", 0), _caps_index(n, "NVLINK", 2)
        links = [_active_nvlinks(n, h) for h in self.handles]
        size = len(self.handles)
        out = [["" for _ in range(size)] for _ in range(size)]
        for i in range(size):
            for j in range(size):
                if i == j:
                    out[i][j] = "X"
                    continue
                hi, hj = self.handles[i], self.handles[j]
                p2p = _try(n.nvmlDeviceGetP2PStatus, hi, hj, read) == ok
                if links[i] and _try(n.nvmlDeviceGetP2PStatus, hi, hj, nvlink) == ok:
                    link = f"NV{links[i]}"
                else:
                    topo = _try(n.nvmlDeviceGetTopologyCommonAncestor, hi, hj)
                    link = topo_names.get(topo, "?")
                out[i][j] = f"{'P2P' if p2p else 'no P2P'} · {link}"
        return out

    def close(self) -> None:
        if self.nvml is not None:
            _try(self.nvml.nvmlShutdown)
            self.nvml = None


def _caps_index(n, name: str, default: int) -> int:
    value = getattr(n, f"NVML_P2P_CAPS_INDEX_{name}", default)
    return value[0] if isinstance(value, tuple) else value  # some nvidia-ml-py versions define (0,)


def _active_nvlinks(n, h) -> int:
    count = 0
    for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _try(n.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            break
        count += state == getattr(n, "NVML_FEATURE_ENABLED", 1)
    return count


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return None


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value) if value is not None else ""


def _nvml_message(e: Exception) -> str:
    name = type(e).__name__
    if "LibraryNotFound" in name:
        return "No NVIDIA GPU found (no NVIDIA driver is installed)."
    if "DriverNotLoaded" in name:
        return "No NVIDIA GPU found (the NVIDIA driver is not loaded)."
    if "NoPermission" in name:
        return "NVIDIA GPUs are present but this user may not query them (NVML: no permission)."
    return f"No NVIDIA GPU found ({name}: {e})."


# a GPU's compute capability, for the Load panel's fp8 choices (NVML by PCI bus id where the facts lack it)

def gpu_compute_capability(gpu) -> tuple[int, int] | None:
    """A GPU's CUDA compute capability, e.g. (8, 9): from its hardware facts where they carry it, else from NVML by
    its PCI bus id (once per GPU); None when unknown."""
    cc = getattr(gpu, "compute_capability", None)
    if cc:
        return int(cc[0]), int(cc[1])
    bus = getattr(gpu, "bus_id", "") or ""
    return _nvml_compute_capability(bus) if bus else None


@functools.lru_cache(maxsize=None)
def _nvml_compute_capability(bus_id: str) -> tuple[int, int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return int(major), int(minor)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
