"""The library as the GUI sees it: the last scan's entries and a signal when they change. Scans run on the
task thread (app.library does the reading)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app import paths
from app.library import LibraryEntry, scan_library
from app.store import Store
from app.workers.task_worker import TaskRunner

ADDED_PREF = "library.added_files"


class LibraryModel(QObject):
    changed = Signal()
    failed = Signal(str)

    def __init__(self, tasks: TaskRunner, store: Store):
        super().__init__()
        self.tasks = tasks
        self.store = store
        self.entries: list[LibraryEntry] = []
        self.scanned = False

    def refresh(self) -> None:
        hf_cache, models_dir, added = paths.hf_cache_dir(), paths.models_dir(), list(self.added_files())
        self.tasks.submit(lambda: scan_library(hf_cache, models_dir, added), self._on_scanned, self.failed.emit)

    def _on_scanned(self, entries: list[LibraryEntry]) -> None:
        self.entries = entries
        self.scanned = True
        self.changed.emit()

    def added_files(self) -> list[str]:
        return self.store.pref(ADDED_PREF, [])

    def add_file(self, path: str) -> None:
        files = self.added_files()
        if path not in files:
            self.store.set_pref(ADDED_PREF, files + [path])
        self.refresh()

    def remove_added(self, path: str) -> None:
        self.store.set_pref(ADDED_PREF, [p for p in self.added_files() if p != path])
        self.refresh()

    def find(self, key: str) -> LibraryEntry | None:
        return next((e for e in self.entries if e.key == key), None)
