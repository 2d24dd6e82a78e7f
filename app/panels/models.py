"""Models: the local library, the Hugging Face Hub (search, files, fit, download), the downloads, and the
Hugging Face token for gated models. Each tab is its own module; this one holds them together."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPushButton,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import token_store
from app.context import AppContext
from app.panels.models_downloads import DownloadsTab
from app.panels.models_hub import HubTab
from app.panels.models_library import LibraryTab
from app.workers.download_worker import DownloadJob

LIBRARY, HUB, DOWNLOADS = 0, 1, 2
UNREACHABLE = ("offline mode is on", "not reachable")  # app.hub's words for a Hub it cannot reach


class ModelsPanel(QWidget):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
        root = QVBoxLayout(self)
        root.setContentsMargins(20, 16, 20, 16)
        head = QHBoxLayout()
        title = QLabel("Models")
        title.setObjectName("pageTitle")
        head.addWidget(title)
        head.addStretch(1)
        self.token_label = QLabel()
        self.token_label.setObjectName("hint")
        head.addWidget(self.token_label)
        token_button = QPushButton("Hugging Face token…")
        token_button.clicked.connect(self.edit_token)
        head.addWidget(token_button)
        root.addLayout(head)
        # the banner: under the tabs (a message does not push them down), with a close button, and for a Hub that
        # cannot be reached a way to a model file already on disk
        self.banner = QWidget()
        bl = QHBoxLayout(self.banner)
        bl.setContentsMargins(0, 6, 0, 0)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.status.hide()
        bl.addWidget(self.status, 1)
        self.add_file_button = QPushButton("Add GGUF file…")
        self.add_file_button.setToolTip("A .gguf file you already have: it joins the Library")
        self.add_file_button.clicked.connect(self.add_file_instead)
        self.add_file_button.hide()
        bl.addWidget(self.add_file_button, 0, Qt.AlignTop)
        self.dismiss_button = QToolButton()
        self.dismiss_button.setObjectName("link")
        self.dismiss_button.setText("✕")
        self.dismiss_button.setToolTip("Dismiss this message")
        self.dismiss_button.clicked.connect(self.dismiss_status)
        bl.addWidget(self.dismiss_button, 0, Qt.AlignTop)
        self.banner.hide()
        self._held: dict[int, tuple[str, bool]] = {}  # a tab's error that came while another tab was shown
        self.library_tab = LibraryTab(ctx, self._status_of(LIBRARY))
        self.hub_tab = HubTab(ctx, self._status_of(HUB), self._on_download_started)
        self.downloads_tab = DownloadsTab(ctx, self._status_of(DOWNLOADS))
        self.tabs = QTabWidget()
        self.tabs.addTab(self.library_tab, "Library")
        self.tabs.addTab(self.hub_tab, "Find on the Hub")
        self.tabs.addTab(self.downloads_tab, "Downloads")
        self.tabs.currentChanged.connect(self._on_tab_changed)
        root.addWidget(self.tabs, 1)
        root.addWidget(self.banner)
        self._update_token_label()

    def _status_of(self, tab: int):
        """The status function of one tab: its errors show on that tab only (held until it is shown)."""
        def status(text: str, error: bool = False) -> None:
            if error and self.tabs.currentIndex() != tab:
                self._held[tab] = (text, error)
            else:
                self._held.pop(tab, None)
                self.show_status(text, error)
        return status

    def _on_tab_changed(self, index: int) -> None:
        """Leaving a tab clears the banner (one tab's message does not stay on the others)."""
        text, error = self._held.pop(index, ("", False))
        self.show_status(text, error)

    def show_status(self, text: str, error: bool = False) -> None:
        unreachable = error and any(words in text for words in UNREACHABLE)
        if unreachable:
            text += (" Models already on this computer still work: add a .gguf file with “Add GGUF "
                     "file…” (here, or in the Library).")
        self.status.setObjectName("errorBox" if error else "hint")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        self.status.setText(text)
        self.status.setVisible(bool(text))
        self.add_file_button.setVisible(unreachable)
        self.banner.setVisible(bool(text))

    def dismiss_status(self) -> None:
        self._held.pop(self.tabs.currentIndex(), None)
        self.show_status("")

    def add_file_instead(self) -> None:
        """From the Hub's "cannot reach" message: the Library, and its "Add GGUF file" dialog."""
        self.dismiss_status()
        self.tabs.setCurrentIndex(LIBRARY)
        self.library_tab.add_file()

    def _on_download_started(self, _job: DownloadJob) -> None:
        self.tabs.setCurrentIndex(DOWNLOADS)

    def edit_token(self) -> None:
        current = token_store.get_token()
        text, ok = QInputDialog.getText(
            self, "Hugging Face token",
            "Token for gated models (from huggingface.co/settings/tokens).\n"
            f"It is stored in {token_store.storage_kind()}. Leave empty to remove it.",
            QLineEdit.Password, current or "")
        if not ok:
            return
        if text.strip():
            self.show_status(f"Token saved in {token_store.set_token(text)}.")
        else:
            token_store.clear_token()
            self.show_status("Token removed.")
        self._update_token_label()

    def _update_token_label(self) -> None:
        self.token_label.setText("Token: set" if token_store.get_token() else "Token: not set")
