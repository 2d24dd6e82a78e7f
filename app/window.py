"""The main window: a sidebar of panels, the panels, and a status bar with the engine and server state."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app import resources
from app.context import AppContext
from app.panels.chat import ChatPanel
from app.panels.hardware import HardwarePanel
from app.panels.load import LoadPanel
from app.panels.models import ModelsPanel
from app.panels.performance import PerformancePanel
from app.panels.server import ServerPanel
from app.workers.engine_worker import DEAD, EMPTY, FAILED, LOADING, READY

PANELS = [("chat", "Chat"), ("models", "Models"), ("load", "Load"), ("server", "Server"),
          ("performance", "Performance"), ("hardware", "Hardware")]


def weights_text(info, config) -> str:
    """The loaded weights in a few words: the dtype, and "int8" first when the engine requantized the linear
    layers (``--quantization int8``; the dtype is then the activations')."""
    quant = getattr(config, "quantization", None) if config is not None else None
    if quant and quant != "none":
        return f"{quant} weights, {info.dtype} activations"
    return info.dtype


class MainWindow(QMainWindow):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
        self.setWindowTitle("Kestrel")
        self.setWindowIcon(resources.icon("kestrel"))
        self.resize(1320, 840)
        self._closed = False
        central = QWidget()
        lay = QHBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        side = QWidget()
        side.setFixedWidth(190)
        side.setStyleSheet("background: #1f2937;")
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.setSpacing(0)
        brand = QLabel("Kestrel")
        brand.setObjectName("brand")
        sl.addWidget(brand)
        self.nav = QListWidget()
        self.nav.setObjectName("nav")
        self.nav.setIconSize(QSize(18, 18))
        sl.addWidget(self.nav, 1)
        lay.addWidget(side)
        self.stack = QStackedWidget()
        lay.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.panels = {
            "chat": ChatPanel(ctx), "models": ModelsPanel(ctx), "load": LoadPanel(ctx),
            "server": ServerPanel(ctx), "performance": PerformancePanel(ctx), "hardware": HardwarePanel(ctx),
        }
        for name, label in PANELS:
            item = QListWidgetItem(resources.icon(name), label)
            item.setData(Qt.UserRole, name)
            self.nav.addItem(item)
            self.stack.addWidget(self.panels[name])
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)
        self.nav.setCurrentRow(0)
        ctx.navigate.connect(self.show_panel)

        self.engine_label = QLabel()
        self.server_label = QLabel()
        self.reload_button = QPushButton("Reload model")
        self.reload_button.hide()
        self.reload_button.clicked.connect(self._reload)
        self.statusBar().addWidget(self.engine_label, 1)
        self.statusBar().addPermanentWidget(self.reload_button)
        self.statusBar().addPermanentWidget(self.server_label)
        ctx.engine.stateChanged.connect(self._on_engine_state)
        ctx.engine.loadProgress.connect(self._on_load_progress)
        ctx.server.started.connect(self._on_server_started)
        ctx.server.stopped.connect(self._on_server_stopped)
        self.server_label.setText("Endpoint: off")
        self._on_engine_state(ctx.engine.state)

    @property
    def chat(self) -> ChatPanel:
        return self.panels["chat"]

    def show_panel(self, name: str) -> None:
        self.nav.setCurrentRow([n for n, _ in PANELS].index(name))

    def start(self, autoload: bool = True) -> None:
        """After the window shows: scan the library, and load the model (the last one, else the default)."""
        self.ctx.library.refresh()
        if autoload:
            self.panels["load"].autoload()

    # slots for worker signals are bound methods: a lambda would run on the worker's thread
    def _on_load_progress(self, text: str) -> None:
        self.engine_label.setText(f"Loading: {text}")

    def _on_server_started(self, url: str, _model: str) -> None:
        self.server_label.setText(f"Endpoint: {url}/v1")

    def _on_server_stopped(self, _why: str) -> None:
        self.server_label.setText("Endpoint: off")

    def _on_engine_state(self, state: str) -> None:
        info = self.ctx.engine.info
        text = {
            EMPTY: "No model loaded",
            LOADING: "Loading the model…",
            FAILED: "The model could not be loaded (see Load)",
            DEAD: "The engine stopped",
        }.get(state, "")
        if state == READY and info is not None:
            text = (f"● {info.name}  ·  {weights_text(info, self.ctx.engine.config)}  ·  {info.device}  ·  "
                    f"context {info.max_model_len:,}  ·  TP {info.tensor_parallel_size}")
        self.engine_label.setText(text)
        self.reload_button.setVisible(state == DEAD)

    def _reload(self) -> None:
        config = self.ctx.engine.config
        if config is not None:
            self.ctx.load_model(self.ctx.model_key or "", config)

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            for panel in self.panels.values():
                if hasattr(panel, "shutdown"):
                    panel.shutdown()
            self.ctx.shutdown()

    def closeEvent(self, event) -> None:
        self.hide()
        self.shutdown()
        super().closeEvent(event)
