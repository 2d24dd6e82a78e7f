"""Everything the panels share, created once by the main window: the store, the workers (engine, server,
downloads, Hub/library tasks, hardware), the library, what the engine can do, and which model is loaded."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app import paths, token_store
from app.capabilities import detect
from app.library_model import LibraryModel
from app.store import Store
from app.workers.download_worker import DownloadWorker
from app.workers.engine_worker import EngineWorker
from app.workers.hardware_worker import HardwareWorker
from app.workers.server_worker import ServerWorker
from app.workers.task_worker import TaskRunner


class AppContext(QObject):
    modelChosen = Signal(str)  # settings key of the model being loaded (panels restore its settings)
    navigate = Signal(str)  # ask the window to show a panel ("chat", "load", ...)
    selectModel = Signal(str)  # pick a library entry (by key) in the Load panel

    def __init__(self, store: Store, core_factory: str | None = None, hardware_interval_ms: int = 1000):
        super().__init__()
        self.store = store
        self.core_factory = core_factory  # tests: a stand-in engine core
        self.capabilities = detect()
        self.engine = EngineWorker()
        self.server = ServerWorker(self.engine)
        self.tasks = TaskRunner("tasks")
        self.downloads = DownloadWorker(paths.hf_cache_dir, token_store.get_token)
        self.hardware = HardwareWorker(hardware_interval_ms)
        self.library = LibraryModel(self.tasks, store)
        self.hardware_snapshot = None
        self.hardware.sampled.connect(self._on_hardware)
        self.model_key: str | None = None
        self.engine.start()

    def _on_hardware(self, snap) -> None:
        self.hardware_snapshot = snap

    @property
    def num_gpus(self) -> int:
        snap = self.hardware_snapshot
        return len(snap.gpus) if snap is not None else 0

    def open_in_load_panel(self, key: str) -> None:
        self.selectModel.emit(key)
        self.navigate.emit("load")

    def load_model(self, key: str, config) -> None:
        """Load ``config`` (an EngineConfig) as the model whose settings live under ``key``."""
        self.model_key = key
        self.store.set_pref("last_model", {"key": key, "model": config.model or ""})
        self.modelChosen.emit(key)
        self.engine.load(config, core_factory=self.core_factory)

    def shutdown(self) -> None:
        """Stop every worker (the engine process included). The store stays open: each write is committed
        at once, and results still queued for the GUI may touch it."""
        try:
            self.engine.shutdown()
        finally:
            self.downloads.stop()
            self.hardware.stop()
            self.tasks.stop()
