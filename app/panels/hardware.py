"""Hardware: CPU and RAM; per GPU its name, memory used / total, utilization, temperature, PCIe generation
and width (current / max); the peer-access matrix between GPUs; a plain message when there is no GPU."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFormLayout,
    QGroupBox,
    QHeaderView,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.fit import gib

GPU_COLUMNS = ["GPU", "Name", "Memory used / total", "Utilization", "Temperature", "PCIe link (now / max)",
               "PCIe TX / RX"]


class HardwarePanel(QWidget):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
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
        form = QFormLayout(host)
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
        self.peer_label = QLabel("Peer access between GPUs (P2P: direct copies allowed; PIX/PXB: PCIe switch, "
                                 "PHB: host bridge, NODE/SYS: across the CPU or sockets)")
        self.peer_label.setObjectName("hint")
        self.peer_label.setWordWrap(True)
        gl.addWidget(self.peer_label)
        self.peer_table = QTableWidget(0, 0)
        self.peer_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.peer_table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        gl.addWidget(self.peer_table)
        root.addWidget(gpus, 1)
        self.gpus_box = gpus
        self.filler = QWidget()
        root.addWidget(self.filler, 1)

    def show_snapshot(self, snap) -> None:
        self.cpu.setText(snap.cpu_name)
        self.cores.setText(f"{snap.cores_physical or '?'} physical, {snap.cores_logical or '?'} logical")
        self.cpu_load.setValue(int(snap.cpu_percent))
        self.cpu_load.setFormat(f"{snap.cpu_percent:.0f}%")
        self.ram.setValue(int(1000 * snap.ram_used / max(snap.ram_total, 1)))
        self.ram.setFormat(f"{gib(snap.ram_used)} used of {gib(snap.ram_total)}")
        self.driver.setText(snap.driver or "—")
        has = bool(snap.gpus)
        layout = self.layout()
        layout.setStretchFactor(self.gpus_box, 1 if has else 0)
        self.filler.setVisible(not has)
        self.gpu_message.setVisible(not has)
        self.gpu_message.setText(snap.gpu_message + "\nKestrel runs models on the CPU; GPU options are disabled."
                                 if not has else "")
        self.gpu_table.setVisible(has)
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
