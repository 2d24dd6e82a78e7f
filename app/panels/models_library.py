"""The Models panel's Library tab: every local model with its size, architecture, quantization and whether
the engine supports it; load (in the Load panel), add a GGUF file, delete with the space freed, and remove a
file added by Browse or "Add GGUF file" from the list (right-click, the Delete key, or the button; the file stays),
or forget those that are gone."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import fit, paths
from app.context import AppContext
from app.library import LibraryEntry, delete_entry, deletion_size, missing_added
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
        for text, slot in (("Refresh", self.library.refresh), ("Add GGUF file…", self.add_file),
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
        # the names sized to their text; the engine support column takes what is left (a long "no: ..." is
        # elided, whole in its tooltip) instead of squeezing the names to "SmolL..." (issue 14 item 5)
        # (issue 45 row 14: the selected model's reason is shown whole below the table, reason_note)
        self.table = table(COLUMNS, stretch=COLUMNS.index("Engine support"))
        self.table.setTextElideMode(Qt.ElideRight)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.itemDoubleClicked.connect(self._on_double_click)
        self.table.setContextMenuPolicy(Qt.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._context_menu)
        self.table.installEventFilter(self)  # the Delete key: remove (added file) or delete
        lay.addWidget(self.table, 1)
        self.reason_note = QLabel()  # the selected file's whole reason, where the column has to cut it
        self.reason_note.setObjectName("warningBox")
        self.reason_note.setWordWrap(True)
        self.reason_note.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.reason_note.hide()
        lay.addWidget(self.reason_note)
        missing = QHBoxLayout()
        self.missing_note = QLabel()
        self.missing_note.setObjectName("hint")
        self.missing_note.setWordWrap(True)
        self.forget_button = QPushButton("Forget them")
        self.forget_button.clicked.connect(self.forget_missing)
        missing.addWidget(self.missing_note, 1)
        missing.addWidget(self.forget_button)
        lay.addLayout(missing)
        hint = QLabel(f"Models live in the Hugging Face cache ({paths.hf_cache_dir()}), shared with other tools, "
                      f"and in Kestrel's models folder ({paths.models_dir()}).")
        hint.setObjectName("hint")
        hint.setWordWrap(True)
        lay.addWidget(hint)
        self.library.changed.connect(self.show_entries)
        self.library.failed.connect(self._on_scan_failed)
        self._update_buttons()
        self._update_missing()

    def show_entries(self) -> None:
        entries = self.library.entries
        self.table.setRowCount(len(entries))
        for r, e in enumerate(entries):
            f = e.facts
            # an unreadable file (a PNG renamed .gguf) has no format: "unknown", the reason in the tooltip
            fmt = (cell(f.format_text) if f.readable
                   else cell("unknown", f"Not a model file Kestrel can read: {f.reason}"))
            support = cell("yes", color=GREEN) if f.supported else cell(f"no: {f.reason}", f.reason, RED)
            cells = [cell(e.name, str(f.path)), cell(e.source_label), fmt,
                     cell(f.architecture or "?"), cell(f.quantization_name or f.quantization or "—"),
                     cell(fit.params_text(f.num_params, f.shape), right=True), cell(fit.human_bytes(f.size_bytes), right=True),
                     support]
            if e.source == "added":
                cells[1].setToolTip("Added with Browse or \u201cAdd GGUF file\u201d. Remove from list (right-click "
                                    "or Delete) forgets it; the file stays where it is.")
            for c, it in enumerate(cells):
                it.setData(Qt.UserRole, e.key)
                self.table.setItem(r, c, it)
        self._update_buttons()
        self._update_missing()

    def _update_missing(self) -> None:
        gone = missing_added(self.library.added_files())
        n = len(gone)
        self.missing_note.setText(f"{n} added file{'s are' if n != 1 else ' is'} no longer there: "
                                  + ", ".join(gone[:3]) + (" …" if n > 3 else "") if gone else "")
        self.missing_note.setVisible(bool(gone))
        self.forget_button.setVisible(bool(gone))

    def forget_missing(self) -> list[str]:
        """Remove the added files that are gone from the list."""
        gone = missing_added(self.library.added_files())
        for path in gone:
            self.library.remove_added(path)
        if gone:
            self.status(f"Forgot {len(gone)} missing file{'s' if len(gone) != 1 else ''}.")
        self._update_missing()
        return gone

    def remove_selected_from_list(self) -> bool:
        """Forget the selected added file (it stays on disk); False when the selection is not an added file."""
        e = self.selected_entry()
        if e is None or e.source != "added":
            return False
        self.library.remove_added(e.model_ref)
        self.status(f"Removed {e.name} from the library (the file stays where it is).")
        return True

    def eventFilter(self, obj, event) -> bool:
        if obj is self.table and event.type() == QEvent.KeyPress and event.key() == Qt.Key_Delete:
            self.delete_selected()
            return True
        return super().eventFilter(obj, event)

    def _context_menu(self, pos) -> None:
        item = self.table.itemAt(pos)
        if item is None:
            return
        self.table.selectRow(item.row())
        e = self.selected_entry()
        if e is None:
            return
        menu = QMenu(self)
        menu.addAction("Load…", self.load_selected).setEnabled(e.facts.supported)
        if e.source == "added":
            menu.addAction("Remove from list (the file stays)", self.remove_selected_from_list)
        elif e.deletable:
            menu.addAction("Delete from disk…", self.delete_selected)
        menu.addAction("Open containing folder", self._open_containing_folder)
        self._menu = menu  # kept for tests
        menu.popup(self.table.viewport().mapToGlobal(pos))

    def _open_containing_folder(self) -> None:
        e = self.selected_entry()
        if e is not None:
            folder = e.facts.path if e.facts.path.is_dir() else e.facts.path.parent
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

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
        if e is not None and e.facts.supported:
            self.ctx.open_in_load_panel(e.key)

    def delete_selected(self, confirm: bool = True) -> None:
        e = self.selected_entry()
        if e is None:
            return
        if self.remove_selected_from_list():
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
        bad = e is not None and not e.facts.supported
        self.load_button.setEnabled(e is not None and not bad)
        self.load_button.setToolTip(f"Kestrel cannot load {e.name}: {e.facts.reason}" if bad else
                                    "Open the selected model in the Load panel")
        self.reason_note.setText(f"Kestrel cannot load {e.name}: {e.facts.reason}" if bad else "")
        self.reason_note.setVisible(bad)
        self.delete_button.setEnabled(e is not None and e.source != "embedded")
        self.delete_button.setText("Remove from list" if e is not None and e.source == "added" else "Delete")

    def _on_double_click(self, _item) -> None:
        self.load_selected()

    def _on_scan_failed(self, message: str) -> None:
        self.status(f"Could not read the library: {message}", error=True)

    def add_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a GGUF file", "", "GGUF models (*.gguf)")
        if path:
            self.library.add_file(path)

    def _open_models_folder(self) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(paths.models_dir())))
