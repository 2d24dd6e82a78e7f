"""Hardware: CPU and RAM; per GPU its name, memory used / total, utilization, temperature, PCIe generation
and width (current / max); the peer-access matrix between GPUs; a plain message when there is no GPU.
Short history plots (the last HISTORY samples, app.hardware.HardwareHistory) of CPU load and memory, and with
GPUs, one curve per GPU of utilization, memory, PCIe TX/RX and temperature; drawn in the Performance panel's
style, only while the panel is shown."""

from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import theme as themes
from app.context import AppContext
from app.fit import gib
from app.hardware import HISTORY, HardwareHistory
from app.panels.performance import COLORS, style_plots

GPU_COLUMNS = ["GPU", "Name", "Memory used / total", "Utilization", "Temperature", "PCIe link (now / max)",
               "PCIe TX / RX"]


class HardwarePanel(QWidget):
    def __init__(self, ctx: AppContext, clock=time.monotonic):
        super().__init__()
        self.ctx = ctx
        self.clock = clock  # tests inject a fake one
        self.history = HardwareHistory()
        self.gpu_curves: dict[str, pg.PlotDataItem] = {}  # "gpu0.util" -> its curve
        self._build()
        ctx.hardware.sampled.connect(self.show_snapshot)
        if ctx.hardware_snapshot is not None:
            self.show_snapshot(ctx.hardware_snapshot)

    def _build(self) -> None:
        root = QVBoxLayout(self)
        root.setContentsMargins(20, 16, 20, 16)
        title = QLabel("Hardware")
        title.setObjectName("pageTitle")
        root.addWidget(title)
        host = QGroupBox("This machine")
        hl = QHBoxLayout(host)
        form = QFormLayout()
        hl.addLayout(form)
        self.cpu = QLabel("…")
        self.cores = QLabel("…")
        self.cpu_load = QProgressBar()
        self.cpu_load.setRange(0, 100)
        self.ram = QProgressBar()
        self.ram.setRange(0, 1000)
        self.driver = QLabel("")
        form.addRow("CPU", self.cpu)
        form.addRow("Cores", self.cores)
        form.addRow("CPU load", self.cpu_load)
        form.addRow("Memory", self.ram)
        form.addRow("NVIDIA driver", self.driver)
        pg.setConfigOptions(antialias=True, background="w", foreground="#374151")
        self.host_plots = pg.GraphicsLayoutWidget()
        self.host_plots.setMinimumHeight(170)
        self.p_cpu = self._plot(self.host_plots, 0, "CPU load", "%")
        self.p_cpu.setYRange(0, 100, padding=0.02)
        self.cpu_curve = self.p_cpu.plot([], [], pen=pg.mkPen(COLORS[0], width=2), fillLevel=0,
                                         brush=pg.mkBrush(COLORS[0] + "33"))
        self.p_ram = self._plot(self.host_plots, 1, "Memory used", "GiB")
        self.ram_curve = self.p_ram.plot([], [], pen=pg.mkPen(COLORS[1], width=2), fillLevel=0,
                                         brush=pg.mkBrush(COLORS[1] + "33"))
        hl.addWidget(self.host_plots, 1)
        root.addWidget(host)

        gpus = QGroupBox("GPUs")
        gl = QVBoxLayout(gpus)
        self.gpu_message = QLabel()
        self.gpu_message.setObjectName("warningBox")
        self.gpu_message.setWordWrap(True)
        self.gpu_message.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)
        self.gpu_message.hide()
        gl.addWidget(self.gpu_message)
        self.gpu_table = QTableWidget(0, len(GPU_COLUMNS))
        self.gpu_table.setHorizontalHeaderLabels(GPU_COLUMNS)
        self.gpu_table.verticalHeader().hide()
        self.gpu_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.gpu_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.gpu_table.horizontalHeader().setSectionResizeMode(1, QHeaderView.Stretch)
        gl.addWidget(self.gpu_table)
        self.gpu_table.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Maximum)
        self.gpu_plots = pg.GraphicsLayoutWidget()
        self.gpu_plots.setMinimumHeight(190)
        self.p_gpu_util = self._plot(self.gpu_plots, 0, "Utilization", "%")
        self.p_gpu_util.setYRange(0, 100, padding=0.02)
        self.p_gpu_util.addLegend(offset=(-10, 10), brush=pg.mkBrush("#ffffffcc"))
        self.p_gpu_mem = self._plot(self.gpu_plots, 1, "Memory used", "GiB")
        self.p_gpu_pcie = self._plot(self.gpu_plots, 2, "PCIe TX (solid) / RX (dashed)", "MB/s")
        self.p_gpu_temp = self._plot(self.gpu_plots, 3, "Temperature", "°C")
        self.gpu_plots.hide()
        gl.addWidget(self.gpu_plots, 1)
        self.peer_label = QLabel("Peer access between GPUs (P2P: direct copies allowed; PIX/PXB: PCIe switch, "
                                 "PHB: host bridge, NODE/SYS: across the CPU or sockets)")
        self.peer_label.setObjectName("hint")
        self.peer_label.setWordWrap(True)
        gl.addWidget(self.peer_label)
        self.peer_table = QTableWidget(0, 0)
        self.peer_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.peer_table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.peer_table.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Maximum)
        gl.addWidget(self.peer_table)
        root.addWidget(gpus, 1)
        self.gpus_box = gpus
        self.filler = QWidget()
        root.addWidget(self.filler, 1)
        self.apply_theme(themes.current())

    def apply_theme(self, theme: themes.Theme) -> None:
        """The plots in the theme's colours (MainWindow calls it when the theme changes)."""
        self.theme = theme
        style_plots(self.host_plots, [self.p_cpu, self.p_ram], theme)
        style_plots(self.gpu_plots, [self.p_gpu_util, self.p_gpu_mem, self.p_gpu_pcie, self.p_gpu_temp], theme)
        self.p_gpu_util.legend.setBrush(theme["surface"] + "cc")

    def _plot(self, widget: pg.GraphicsLayoutWidget, col: int, title: str, left: str) -> pg.PlotItem:
        p = widget.addPlot(row=0, col=col, title=f"<span style='font-size:10pt'>{title}</span>")
        p.showGrid(x=True, y=True, alpha=0.15)
        p.setLabel("left", left)
        p.setLabel("bottom", "seconds ago")
        p.setMenuEnabled(False)
        p.setMouseEnabled(x=False, y=False)
        p.hideButtons()
        p.setXRange(-self._span(), 0, padding=0)
        return p

    def _span(self) -> float:
        """Seconds the history covers: its size times the sampling interval."""
        interval = getattr(self.ctx.hardware, "interval_ms", 1000) / 1000
        return HISTORY * interval

    # ------------------------------------------------------------------------------------------------
    # data in

    def show_snapshot(self, snap) -> None:
        self.add_sample(snap)
        self.show_figures(snap)

    def add_sample(self, snap) -> None:
        """Into the history (and the plots when they are shown)."""
        self.history.add(self.clock(), snap)
        for i in self.history.gpus:
            if f"gpu{i}.util" not in self.gpu_curves:
                self._add_gpu_curves(i)
        if self.isVisible():
            self.redraw()

    def _add_gpu_curves(self, index: int) -> None:
        color = COLORS[index % len(COLORS)]
        pen = pg.mkPen(color, width=2)
        self.gpu_curves[f"gpu{index}.util"] = self.p_gpu_util.plot([], [], pen=pen, name=f"GPU{index}")
        self.gpu_curves[f"gpu{index}.mem"] = self.p_gpu_mem.plot([], [], pen=pen)
        self.gpu_curves[f"gpu{index}.tx"] = self.p_gpu_pcie.plot([], [], pen=pen)
        self.gpu_curves[f"gpu{index}.rx"] = self.p_gpu_pcie.plot([], [], pen=pg.mkPen(color, width=2,
                                                                                       style=Qt.DashLine))
        self.gpu_curves[f"gpu{index}.temp"] = self.p_gpu_temp.plot([], [], pen=pen)

    def _xy(self, key: str, now: float) -> tuple[np.ndarray, np.ndarray]:
        t = np.asarray(self.history.times(key), float)
        return t - now, np.asarray(self.history.values(key), float)

    def redraw(self) -> None:
        h = self.history
        now = h.times("cpu")[-1] if h.times("cpu") else self.clock()
        self.cpu_curve.setData(*self._xy("cpu", now))
        self.ram_curve.setData(*self._xy("ram", now))
        if h.ram_total:
            self.p_ram.setYRange(0, h.ram_total / 2**30, padding=0.02)
        for key, curve in self.gpu_curves.items():
            curve.setData(*self._xy(key, now))
        # the history's span, or more when samples came slower than the worker's interval
        times = h.times("cpu")
        span = max(self._span(), now - times[0] if times else 0.0)
        for p in self._plots():
            p.setXRange(-span, 0, padding=0)

    def _plots(self) -> list[pg.PlotItem]:
        return [self.p_cpu, self.p_ram, self.p_gpu_util, self.p_gpu_mem, self.p_gpu_pcie, self.p_gpu_temp]

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.redraw()

    def show_figures(self, snap) -> None:
        self.cpu.setText(snap.cpu_name)
        self.cores.setText(f"{snap.cores_physical or '?'} physical, {snap.cores_logical or '?'} logical")
        self.cpu_load.setValue(int(snap.cpu_percent))
        self.cpu_load.setFormat(f"{snap.cpu_percent:.0f}%")
        self.ram.setValue(int(1000 * snap.ram_used / max(snap.ram_total, 1)))
        self.ram.setFormat(f"{gib(snap.ram_used)} used of {gib(snap.ram_total)}")
        fit_text(self.cpu_load)
        fit_text(self.ram)
        self.driver.setText(snap.driver or "—")
        has = bool(snap.gpus)
        layout = self.layout()
        layout.setStretchFactor(self.gpus_box, 1 if has else 0)
        self.filler.setVisible(not has)
        self.gpu_message.setVisible(not has)
        self.gpu_message.setText(snap.gpu_message + "\nKestrel runs models on the CPU; GPU options are disabled."
                                 if not has else "")
        self.gpu_table.setVisible(has)
        self.gpu_plots.setVisible(has)
        if has:  # the memory axis up to the largest GPU
            self.p_gpu_mem.setYRange(0, max(g.memory_total or 0 for g in snap.gpus) / 2**30 or 1, padding=0.02)
        self.peer_label.setVisible(len(snap.gpus) > 1)
        self.peer_table.setVisible(len(snap.gpus) > 1)
        self.gpu_table.setRowCount(len(snap.gpus))
        for r, g in enumerate(snap.gpus):
            mem = (f"{gib(g.memory_used)} / {gib(g.memory_total)}" if g.memory_total else "?")
            link = (f"Gen{g.pcie_gen or '?'} x{g.pcie_width or '?'} / Gen{g.pcie_gen_max or '?'} "
                    f"x{g.pcie_width_max or '?'}")
            traffic = ("—" if g.pcie_tx is None else f"{g.pcie_tx / 1e6:.0f} / {(g.pcie_rx or 0) / 1e6:.0f} MB/s")
            cells = [str(g.index), g.name, mem, "?" if g.utilization is None else f"{g.utilization}%",
                     "?" if g.temperature is None else f"{g.temperature} °C", link, traffic]
            for c, text in enumerate(cells):
                self.gpu_table.setItem(r, c, QTableWidgetItem(text))
        m = snap.peer_matrix or []
        self.peer_table.setRowCount(len(m))
        self.peer_table.setColumnCount(len(m))
        labels = [f"GPU{i}" for i in range(len(m))]
        self.peer_table.setHorizontalHeaderLabels(labels)
        self.peer_table.setVerticalHeaderLabels(labels)
        for i, row in enumerate(m):
            for j, cell in enumerate(row):
                item = QTableWidgetItem(cell)
                item.setTextAlignment(Qt.AlignCenter)
                self.peer_table.setItem(i, j, item)
        for t in (self.gpu_table, self.peer_table):  # as tall as their rows: the plots take the rest
            _fit_rows(t)


def _fit_rows(t: QTableWidget) -> None:
    header = t.horizontalHeader().height() if t.horizontalHeader().isVisible() else 0
    scroll = t.horizontalScrollBar().sizeHint().height()
    rows = sum(t.rowHeight(r) for r in range(t.rowCount()))
    t.setMaximumHeight(header + rows + 2 * t.frameWidth() + scroll)


def fit_text(bar: QProgressBar) -> None:
    """A progress bar never narrower than its text ("13.5 GiB used of 23.5 GiB" was cut to "5 GiB used of 23.5 G"):
    its minimum width follows the text, with room for the frame and padding either side."""
    text = bar.text()
    need = bar.fontMetrics().horizontalAdvance(text + "00") + 24
    if bar.minimumWidth() < need:
        bar.setMinimumWidth(need)
