"""The Models panel's Library tab: every local model with its size, architecture, quantization and whether
the engine supports it; load (in the Load panel), add a GGUF file, delete with the space freed."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QMessageBox, QPushButton, QVBoxLayout, QWidget

from app import fit, paths
from app.context import AppContext
from app.library import LibraryEntry, delete_entry, deletion_size
from app.widgets.tables import GREEN, RED, cell, selected_row, table

StatusFn = Callable[..., None]  # (text, error=False)

COLUMNS = ["Model", "Source", "Format", "Architecture", "Quantization", "Parameters", "Size", "Engine support"]


class LibraryTab(QWidget):
    def __init__(self, ctx: AppContext, status: StatusFn):
        super().__init__()
        self.ctx = ctx
        self.library = ctx.library
        self.status = status
        lay = QVBoxLayout(self)
        bar = QHBoxLayout()
        for text, slot in (("Refresh", self.library.refresh), ("Add GGUF file…", self._add_file),
                           ("Open models folder", self._open_models_folder)):
            b = QPushButton(text)
            b.clicked.connect(slot)
            bar.addWidget(b)
        bar.addStretch(1)
        self.load_button = QPushButton("Load…")
        self.load_button.setObjectName("primary")
        self.load_button.clicked.connect(self.load_selected)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("danger")
        self.delete_button.clicked.connect(self.delete_selected)
        bar.addWidget(self.load_button)
        bar.addWidget(self.delete_button)
        lay.addLayout(bar)
        self.table = table(COLUMNS)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.itemDoubleClicked.connect(self._on_double_click)
        lay.addWidget(self.table, 1)
        hint = QLabel(f"Models live in the Hugging Face cache ({paths.hf_cache_dir()}), shared with other tools, "
                      f"and in Kestrel's models folder ({paths.models_dir()}).")
        hint.setObjectName("hint")
        hint.setWordWrap(True)
        lay.addWidget(hint)
        self.library.changed.connect(self.show_entries)
        self.library.failed.connect(self._on_scan_failed)
        self._update_buttons()

    def show_entries(self) -> None:
        entries = self.library.entries
        self.table.setRowCount(len(entries))
        for r, e in enumerate(entries):
            f = e.facts
            support = cell("yes", color=GREEN) if f.supported else cell(f"no: {f.reason}", f.reason, RED)
            cells = [cell(e.name, str(f.path)), cell(e.source_label), cell(f.format.upper()),
                     cell(f.architecture or "?"), cell(f.quantization or "—"),
                     cell(fit.human_count(f.num_params), right=True), cell(fit.human_bytes(f.size_bytes), right=True),
                     support]
            for c, it in enumerate(cells):
                it.setData(Qt.UserRole, e.key)
                self.table.setItem(r, c, it)
        self._update_buttons()

    def selected_entry(self) -> LibraryEntry | None:
        row = selected_row(self.table)
        return None if row is None else self.library.find(self.table.item(row, 0).data(Qt.UserRole))

    def select_key(self, key: str) -> bool:
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).data(Qt.UserRole) == key:
                self.table.selectRow(r)
                return True
        return False

    def load_selected(self) -> None:
        e = self.selected_entry()
        if e is not None:
            self.ctx.open_in_load_panel(e.key)

    def delete_selected(self, confirm: bool = True) -> None:
        e = self.selected_entry()
        if e is None:
            return
        if e.source == "added":
            self.library.remove_added(e.model_ref)
            self.status(f"Removed {e.name} from the library (the file stays where it is).")
            return
        if not e.deletable:
            return
        cache = paths.hf_cache_dir()
        size = deletion_size(e, cache)
        if confirm and QMessageBox.question(
                self, "Delete model", f"Delete {e.name} from disk?\nThis frees {fit.human_bytes(size)}.") \
                != QMessageBox.Yes:
            return

        def deleted(freed: int) -> None:
            self.status(f"Deleted {e.name}: freed {fit.human_bytes(freed)}.")
            self.library.refresh()

        self.ctx.tasks.submit(lambda: delete_entry(e, cache), deleted,
                              lambda msg: self.status(f"Could not delete {e.name}: {msg}", error=True))

    def _update_buttons(self) -> None:
        e = self.selected_entry()
        self.load_button.setEnabled(e is not None)
        self.delete_button.setEnabled(e is not None and e.source != "embedded")
        self.delete_button.setText("Remove from list" if e is not None and e.source == "added" else "Delete")

    def _on_double_click(self, _item) -> None:
        self.load_selected()

    def _on_scan_failed(self, message: str) -> None:
        self.status(f"Could not read the library: {message}", error=True)

    def _add_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a GGUF file", "", "GGUF models (*.gguf)")
        if path:
            self.library.add_file(path)

    def _open_models_folder(self) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(paths.models_dir())))
