"""Server: one click starts or stops the OpenAI-compatible endpoint on the loaded model. Port, API key (with a
generator), LAN access (off by default, warned about), CORS origins, and whether the endpoint starts with the
app (once the model is loaded at start-up); the base URL with copy buttons, ready-to-paste curl and Python,
and a live log of the requests served, with the reason of each failure, and a line when the endpoint moves
to another model (it follows the loaded one, at the same address)."""

from __future__ import annotations

import secrets
import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.server_log import LogEntry
from app.snippets import SNIPPET_KINDS, curl_snippet, python_snippet
from app.widgets.layouts import widget_of
from app.workers.engine_worker import READY, restart_text
from app.workers.server_worker import ServerOptions

LOG_LIMIT = 500
LOG_MIN_ROWS = 6  # the request log shows at least this many rows, however small the window
ERROR_RED = "#d64545"
LOAD_FIRST = "Load a model first: the endpoint serves the loaded model."  # readable on the light and the dark theme
PREFS = "server.options"


class ServerPanel(QWidget):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
        self.server = ctx.server
        self.url: str | None = None
        self.model_name = ""
        self._starting = False
        self._stop_note = ""  # why the endpoint last stopped or failed (kept shown until it starts again)
        self._build()
        self._restore()
        self._autostart_pending = self.autostart.isChecked()  # once, for the model loaded at start-up
        self.server.started.connect(self._on_started)
        self.server.stopped.connect(self._on_stopped)
        self.server.failed.connect(self._on_failed)
        self.server.requestLogged.connect(self.add_log_entry)
        self.server.modelChanging.connect(self._on_model_changing)
        self.server.modelChanged.connect(self._on_model_changed)
        ctx.engine.stateChanged.connect(self._on_engine_state)
        ctx.engine.loaded.connect(self._on_model_loaded)
        ctx.engine.restartAttempt.connect(self._on_restart_attempt)
        ctx.engine.engineRestarted.connect(self._on_engine_restarted)
        ctx.engine.engineGaveUp.connect(self._on_engine_gave_up)
        self.api_key.textChanged.connect(lambda _t: self._update_snippets())
        self.port.valueChanged.connect(lambda _v: self._update_snippets())
        self._update_controls()

    def _build(self) -> None:
        root = QVBoxLayout(self)
        root.setContentsMargins(20, 16, 20, 16)
        title = QLabel("OpenAI-compatible endpoint")
        title.setObjectName("pageTitle")
        root.addWidget(title)
        top = QHBoxLayout()
        settings = QGroupBox("Settings")
        form = QFormLayout(settings)
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")
        self.port.setValue(8000)
        form.addRow("Port", self.port)
        key_row = QHBoxLayout()
        self.api_key = QLineEdit()
        self.api_key.setPlaceholderText("none: anyone who can reach the port may use it")
        key_row.addWidget(self.api_key, 1)
        self.generate_key = QPushButton("Generate")
        self.generate_key.clicked.connect(lambda: self.api_key.setText("sk-kestrel-" + secrets.token_urlsafe(24)))
        key_row.addWidget(self.generate_key)
        form.addRow("API key", widget_of(key_row))
        self.lan = QCheckBox("Allow other machines on the network (LAN)")
        self.lan.toggled.connect(self._update_lan_warning)
        form.addRow("Access", self.lan)
        self.lan_warning = QLabel()
        self.lan_warning.setObjectName("warningBox")
        self.lan_warning.setWordWrap(True)
        self.lan_warning.hide()
        form.addRow("", self.lan_warning)
        self.cors = QLineEdit()
        self.cors.setPlaceholderText("e.g. http://localhost:3000, https://app.example  (none by default)")
        form.addRow("CORS origins", self.cors)
        self.autostart = QCheckBox("Start the local endpoint with the app")
        self.autostart.setToolTip("When Kestrel starts, the endpoint starts on this port as soon as the model is "
                                  "loaded (on this machine only: LAN access is chosen each session).")
        self.autostart.toggled.connect(lambda _on: self._save())
        form.addRow("At start-up", self.autostart)
        buttons = QHBoxLayout()
        self.start_button = QPushButton("Start server")
        self.start_button.setObjectName("primary")
        self.start_button.clicked.connect(self.toggle)
        buttons.addWidget(self.start_button)
        buttons.addStretch(1)
        form.addRow("", widget_of(buttons))
        self.status = QLabel()
        self.status.setWordWrap(True)
        form.addRow("", self.status)
        top.addWidget(settings, 1)

        use = QGroupBox("Use it")
        ul = QVBoxLayout(use)
        url_row = QHBoxLayout()
        self.url_field = QLineEdit()
        self.url_field.setReadOnly(True)
        self.url_field.setPlaceholderText("the base URL appears here when the server runs")
        url_row.addWidget(self.url_field, 1)
        self.copy_url = QPushButton("Copy URL")
        self.copy_url.clicked.connect(lambda: self._copy(self.url_field.text()))
        url_row.addWidget(self.copy_url)
        self.copy_key = QPushButton("Copy key")
        self.copy_key.clicked.connect(lambda: self._copy(self.api_key.text()))
        url_row.addWidget(self.copy_key)
        ul.addLayout(url_row)
        kind_row = QHBoxLayout()
        kind_row.addWidget(QLabel("Example:"))
        self.snippet_kind = QComboBox()  # which request the snippets show: chat, tool call, JSON schema, embeddings
        for key, label in SNIPPET_KINDS:
            self.snippet_kind.addItem(label, key)
        self.snippet_kind.currentIndexChanged.connect(self._on_snippet_kind)
        kind_row.addWidget(self.snippet_kind)
        kind_row.addStretch(1)
        ul.addLayout(kind_row)
        self.snippets = QTabWidget()
        mono = QFont("monospace")
        mono.setStyleHint(QFont.Monospace)
        self.curl = QPlainTextEdit()
        self.curl.setReadOnly(True)
        self.curl.setFont(mono)
        self.python = QPlainTextEdit()
        self.python.setReadOnly(True)
        self.python.setFont(mono)
        self.snippets.addTab(self.curl, "curl")
        self.snippets.addTab(self.python, "Python (openai)")
        ul.addWidget(self.snippets, 1)
        copy_snippet = QPushButton("Copy snippet")
        copy_snippet.clicked.connect(lambda: self._copy(self.snippets.currentWidget().toPlainText()))
        ul.addWidget(copy_snippet, 0, Qt.AlignRight)
        top.addWidget(use, 1)
        # the settings scroll above the request log, which keeps room for LOG_MIN_ROWS rows (at 1024x700 it
        # showed two and a half); the splitter between them moves
        top_widget = QWidget()
        top_widget.setLayout(top)
        top.setContentsMargins(0, 0, 0, 0)
        self.top_scroll = QScrollArea()
        self.top_scroll.setWidgetResizable(True)
        self.top_scroll.setFrameShape(QFrame.NoFrame)
        self.top_scroll.setWidget(top_widget)
        self.top_scroll.setMinimumHeight(120)

        log_box = QGroupBox("Requests")
        ll = QVBoxLayout(log_box)
        self.log = QTableWidget(0, 7)
        self.log.setHorizontalHeaderLabels(["Time", "Method", "Route", "Status", "Tokens", "Latency", "Detail"])
        self.log.verticalHeader().hide()
        self.log.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.log.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.log.setAlternatingRowColors(True)
        self.log.setWordWrap(False)
        self.log.setTextElideMode(Qt.ElideRight)
        header = self.log.horizontalHeader()
        for col in (0, 1, 3, 4, 5):
            header.setSectionResizeMode(col, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.Interactive)
        header.resizeSection(2, 190)
        header.setSectionResizeMode(6, QHeaderView.Stretch)
        ll.addWidget(self.log)
        clear = QPushButton("Clear")
        clear.clicked.connect(lambda: self.log.setRowCount(0))
        ll.addWidget(clear, 0, Qt.AlignRight)
        rows = self.log.verticalHeader().defaultSectionSize()
        self.log.setMinimumHeight(self.log.horizontalHeader().sizeHint().height() + LOG_MIN_ROWS * rows
                                  + 2 * self.log.frameWidth() + 2)
        self.splitter = QSplitter(Qt.Vertical)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.top_scroll)
        self.splitter.addWidget(log_box)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self._split_moved = False  # once the user drags the splitter, it stays where they put it
        self.splitter.splitterMoved.connect(lambda *_: setattr(self, "_split_moved", True))
        root.addWidget(self.splitter, 1)
        self._update_snippets()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_splitter()

    def _fit_splitter(self) -> None:
        """The settings get their whole height where the log still has its rows; else they scroll."""
        if self._split_moved:
            return
        total = self.splitter.height() - self.splitter.handleWidth()
        log_min = self.splitter.widget(1).minimumSizeHint().height()
        natural = self.top_scroll.widget().sizeHint().height() + 2
        top = max(self.top_scroll.minimumHeight(), min(natural, total - log_min))
        self.splitter.setSizes([top, max(total - top, log_min)])
        self._split_moved = False  # setSizes is not the user's move

    # ------------------------------------------------------------------------------------------------
    def options(self) -> ServerOptions:
        origins = [o.strip() for o in self.cors.text().split(",") if o.strip()]
        return ServerOptions(port=self.port.value(), api_key=self.api_key.text().strip() or None,
                             lan=self.lan.isChecked(), cors_origins=origins)

    def toggle(self) -> None:
        if self.server.running or self.url:
            self.server.stop()
            self.status.setText("Stopping…")
            return
        self._save()
        self._starting = True
        self.status.setText("Starting…")
        self.server.start(self.options())
        self._update_controls()

    def _on_started(self, url: str, model: str) -> None:
        self._starting = False
        self._stop_note = ""
        self.url, self.model_name = url, model
        self.url_field.setText(url + "/v1")
        self.status.setText(self._serving_text())
        self.status.setObjectName("okBox")
        self._repolish(self.status)
        self._update_snippets()
        self._update_controls()

    def _on_stopped(self, why: str) -> None:
        self._starting = False
        self._stop_note = why
        self.url = None
        self.url_field.clear()
        self.status.setText(why or "Stopped.")
        self.status.setObjectName("hint")
        self._repolish(self.status)
        self._update_snippets()
        self._update_controls()

    def _on_failed(self, message: str) -> None:
        self._starting = False
        self._stop_note = message
        self.url = None
        self.status.setText(message)
        self.status.setObjectName("errorBox")
        self._repolish(self.status)
        self._update_controls()

    def _serving_text(self) -> str:
        where = "from this machine only" if not self.lan.isChecked() else "from the local network"
        return f"Serving {self.model_name} at {self.url}/v1 ({where})."

    def add_log_entry(self, e: LogEntry) -> None:
        row = self._new_log_row()
        cells = [time.strftime("%H:%M:%S", time.localtime(e.time)), e.method, e.path, str(e.status),
                 "" if e.tokens is None else str(e.tokens), f"{e.latency * 1000:.0f} ms" if e.latency < 10
                 else f"{e.latency:.1f} s", e.detail]
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if col in (3, 6) and e.failed:
                item.setForeground(QColor(ERROR_RED))
            if e.detail:
                item.setToolTip(f"{e.status}: {e.detail}")
            self.log.setItem(row, col, item)
        self.log.scrollToBottom()

    def add_log_event(self, text: str) -> None:
        """A line in the log that is not a request (the endpoint moved to another model)."""
        row = self._new_log_row()
        self.log.setItem(row, 0, QTableWidgetItem(time.strftime("%H:%M:%S")))
        item = QTableWidgetItem(text)
        item.setToolTip(text)
        font = item.font()
        font.setItalic(True)
        item.setFont(font)
        self.log.setItem(row, 1, item)
        self.log.setSpan(row, 1, 1, self.log.columnCount() - 1)
        self.log.scrollToBottom()

    def _new_log_row(self) -> int:
        row = self.log.rowCount()
        if row >= LOG_LIMIT:
            self.log.removeRow(0)
            row -= 1
        self.log.insertRow(row)
        return row

    def log_rows(self) -> list[list[str]]:
        def text(r: int, c: int) -> str:
            item = self.log.item(r, c)
            return item.text() if item is not None else ""

        return [[text(r, c) for c in range(self.log.columnCount())] for r in range(self.log.rowCount())]

    # ------------------------------------------------------------------------------------------------
    def _on_engine_state(self, _state: str) -> None:
        self._update_controls()

    def _on_model_loaded(self, _info) -> None:
        self._update_snippets()
        if self._autostart_pending:
            self._autostart_pending = False
            if self.url is None and not self._starting:
                self.toggle()

    def _on_model_changing(self, notice: str) -> None:
        if self.url is not None:
            self.status.setText(notice)
            self.status.setObjectName("hint")
            self._repolish(self.status)

    def _on_model_changed(self, old: str, new: str) -> None:
        same = " (the same model, loaded again with other settings)" if old == new else ""
        self.add_log_event(f"Model changed to {new}{same}: the endpoint serves it at the same address.")

    def _on_restart_attempt(self, attempt: int, most: int, why: str) -> None:
        if self.url is not None:
            self.status.setText(f"{restart_text(attempt, most)}: {why}\nThe endpoint stays at {self.url}/v1 and "
                                "answers 503 (retry) meanwhile.")
            self.status.setObjectName("errorBox")
            self._repolish(self.status)

    def _on_engine_gave_up(self, reason: str) -> None:
        if self.url is not None:
            self.status.setText(f"The engine stopped and is not restarted: {reason}\nThe endpoint at {self.url}/v1 "
                                "answers 503 until a model is loaded again (Load panel).")
            self.status.setObjectName("errorBox")
            self._repolish(self.status)

    def _on_engine_restarted(self, notice: str) -> None:
        if self.url is not None:
            self.status.setText(f"{self._serving_text()} {notice}")
            self.status.setObjectName("okBox")
            self._repolish(self.status)

    def _update_controls(self) -> None:
        running = self.url is not None
        ready = self.ctx.engine.state == READY
        self.start_button.setText("Stop server" if running else "Start server")
        self.start_button.setEnabled(running or (ready and not self._starting))
        for w in (self.port, self.api_key, self.generate_key, self.lan, self.cors):  # (autostart: any time)
            w.setEnabled(not running and not self._starting)
        self.copy_url.setEnabled(running)
        if not running and not ready and not self._starting:
            text = f"{self._stop_note}\n{LOAD_FIRST}" if self._stop_note else LOAD_FIRST
            if self.status.text() != text:
                if not self._stop_note:
                    self.status.setObjectName("hint")
                    self._repolish(self.status)
                self.status.setText(text)
        elif not running and ready and self.status.text().endswith(LOAD_FIRST):
            self.status.setText(self._stop_note)

    def _update_lan_warning(self, on: bool) -> None:
        if on and not self.api_key.text().strip():
            self.api_key.setText("sk-kestrel-" + secrets.token_urlsafe(24))
        self.lan_warning.setText(
            "Anyone on your network who has the API key can use this model, and traffic is not encrypted "
            "(plain HTTP). Keep the key secret; turn this off when you are done.")
        self.lan_warning.setVisible(on)

    def _update_snippets(self) -> None:
        base = self.url or f"http://127.0.0.1:{self.port.value() or 8000}"
        model = self.model_name or (self.ctx.engine.info.name if self.ctx.engine.info else "MODEL")
        key = self.api_key.text().strip() or None
        kind = self.snippet_kind.currentData() or "chat"
        self.curl.setPlainText(curl_snippet(base, model, key, kind))
        self.python.setPlainText(python_snippet(base, model, key, kind))

    def _on_snippet_kind(self, _index: int) -> None:
        self._update_snippets()

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)

    @staticmethod
    def _repolish(w: QWidget) -> None:
        w.style().unpolish(w)
        w.style().polish(w)

    def _save(self) -> None:
        o = self.options()
        self.ctx.store.set_pref(PREFS, {"port": o.port, "lan": o.lan, "cors": self.cors.text(),
                                        "api_key": o.api_key or "", "autostart": self.autostart.isChecked()})

    def _restore(self) -> None:
        p = self.ctx.store.pref(PREFS) or {}
        self.port.setValue(int(p.get("port", 8000)))
        self.cors.setText(p.get("cors", ""))
        self.api_key.setText(p.get("api_key", ""))
        self.autostart.blockSignals(True)  # restoring is not a change to save
        self.autostart.setChecked(bool(p.get("autostart", False)))
        self.autostart.blockSignals(False)
        # LAN access always starts off: it is opted into each session
