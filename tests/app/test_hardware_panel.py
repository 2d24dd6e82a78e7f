"""The Hardware panel's history plots: fed injected snapshots on a fake clock, each curve holds exactly the
samples (CPU, memory, and per GPU utilization, memory, PCIe TX/RX, temperature), the ring buffer keeps the
last HISTORY of them, readings NVML could not take add no point; without a GPU the GPU plots are not shown."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QObject, Signal

from app.hardware import HISTORY, GPUInfo, HardwareHistory, HardwareSnapshot


class FakeHardware(QObject):
    sampled = Signal(object)
    interval_ms = 1000


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _snap(k: int, gpus: int = 0) -> HardwareSnapshot:
    """Sample number ``k``: distinct values per figure and GPU."""
    return HardwareSnapshot(
        cpu_name="Test CPU", cores_physical=4, cores_logical=8, cpu_percent=float(k % 100),
        ram_used=(k + 1) * 2**30, ram_total=64 * 2**30,
        gpus=[GPUInfo(index=i, name="NVIDIA H200", memory_used=(k + i) * 2**30, memory_total=141 * 2**30,
                      utilization=(k * 3 + i) % 101, temperature=30 + (k + i) % 50, pcie_gen=5, pcie_width=16,
                      pcie_gen_max=5, pcie_width_max=16, pcie_tx=(k + 1) * 1e6 * (i + 1), pcie_rx=k * 2e6 + i * 1e6)
              for i in range(gpus)],
        peer_matrix=[["X" if i == j else "P2P · NV18" for j in range(gpus)] for i in range(gpus)] if gpus else None,
        driver="580.159.04" if gpus else None, gpu_message="" if gpus else "No NVIDIA GPU found (test).")


@pytest.fixture
def panel(qtbot):
    from app.panels.hardware import HardwarePanel

    clock = FakeClock()
    ctx = SimpleNamespace(hardware=FakeHardware(), hardware_snapshot=None)
    p = HardwarePanel(ctx, clock=clock)
    qtbot.addWidget(p)
    p.resize(1200, 800)
    p.show()
    p.clock_ = clock
    return p


def _feed(panel, snaps) -> None:
    for s in snaps:
        panel.clock_.t += 1.0
        panel.ctx.hardware.sampled.emit(s)


def test_cpu_and_memory_curves_hold_the_samples_without_gpu(panel):
    snaps = [_snap(k) for k in range(10)]
    _feed(panel, snaps)
    x, y = panel.cpu_curve.getData()
    assert list(y) == [s.cpu_percent for s in snaps]
    assert list(x) == [float(k) for k in range(-9, 1)]  # seconds before the latest sample
    _, ram = panel.ram_curve.getData()
    assert list(ram) == [s.ram_used / 2**30 for s in snaps]
    assert panel.cpu_load.value() == 9 and "GiB" in panel.ram.format()  # the bars still show the latest
    # no GPU: the GPU plots are not shown, the message is
    assert panel.gpu_plots.isHidden() and panel.gpu_table.isHidden() and not panel.gpu_message.isHidden()
    assert panel.gpu_curves == {}


def test_gpu_curves_hold_each_gpus_samples(panel):
    snaps = [_snap(k, gpus=2) for k in range(20)]
    _feed(panel, snaps)
    assert not panel.gpu_plots.isHidden() and panel.gpu_message.isHidden()
    assert set(panel.gpu_curves) == {f"gpu{i}.{n}" for i in range(2) for n in ("util", "mem", "tx", "rx", "temp")}
    for i in range(2):
        gpus = [s.gpus[i] for s in snaps]
        expect = {"util": [g.utilization for g in gpus], "mem": [g.memory_used / 2**30 for g in gpus],
                  "tx": [g.pcie_tx / 1e6 for g in gpus], "rx": [g.pcie_rx / 1e6 for g in gpus],
                  "temp": [g.temperature for g in gpus]}
        for name, values in expect.items():
            x, y = panel.gpu_curves[f"gpu{i}.{name}"].getData()
            np.testing.assert_allclose(y, values, err_msg=f"gpu{i}.{name}")
            assert x[-1] == 0 and x[0] == -19
    # the curves are on the plots they belong to
    assert panel.gpu_curves["gpu1.rx"] in panel.p_gpu_pcie.listDataItems()
    assert panel.gpu_curves["gpu0.temp"] in panel.p_gpu_temp.listDataItems()
    assert panel.gpu_table.rowCount() == 2


def test_history_is_a_bounded_ring_buffer(panel):
    n = HISTORY + 55
    snaps = [_snap(k, gpus=1) for k in range(n)]
    _feed(panel, snaps)
    _, cpu = panel.cpu_curve.getData()
    assert len(cpu) == HISTORY and list(cpu) == [s.cpu_percent for s in snaps[-HISTORY:]]
    x, util = panel.gpu_curves["gpu0.util"].getData()
    assert len(util) == HISTORY and list(util) == [s.gpus[0].utilization for s in snaps[-HISTORY:]]
    assert x[0] == -(HISTORY - 1) and x[-1] == 0
    assert all(len(d) == HISTORY for d in panel.history.series.values())


def test_hidden_panel_keeps_sampling_and_draws_when_shown(panel):
    panel.hide()
    snaps = [_snap(k, gpus=1) for k in range(5)]
    _feed(panel, snaps)
    assert len(panel.history.values("cpu")) == 5
    panel.show()  # showEvent draws what came meanwhile
    _, y = panel.gpu_curves["gpu0.temp"].getData()
    assert list(y) == [s.gpus[0].temperature for s in snaps]


def test_missing_readings_add_no_point():
    h = HardwareHistory(size=4)
    s = _snap(1, gpus=1)
    s.gpus[0].temperature = None  # NVML_ERROR_NOT_SUPPORTED
    s.gpus[0].pcie_tx = None
    h.add(0.0, s)
    h.add(1.0, _snap(2, gpus=1))
    assert h.values("gpu0.temp") == [32.0] and h.times("gpu0.temp") == [1.0]
    assert h.values("gpu0.tx") == [3.0]
    assert h.values("gpu0.util") == [3.0, 6.0]
    for k in range(10):
        h.add(2.0 + k, _snap(k))
    assert len(h.values("cpu")) == 4 and h.values("cpu") == [6.0, 7.0, 8.0, 9.0]


def test_real_samples_in_the_window(make_window, qtbot):
    w = make_window(autoload=False)
    hw = w.panels["hardware"]
    w.show_panel("hardware")
    qtbot.waitUntil(lambda: len(hw.history.values("cpu")) >= 2, timeout=30_000)
    hw.redraw()
    _, y = hw.cpu_curve.getData()
    assert len(y) >= 2 and all(0 <= v <= 100 for v in y)
    if not w.ctx.hardware_snapshot.gpus:
        assert hw.gpu_plots.isHidden()
