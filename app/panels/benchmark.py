"""Benchmark: load-test an OpenAI-compatible endpoint (the local server started from the Server panel, or
any URL) with a sweep over max concurrency, as `kestrel bench sweep` does; see it while it runs (TTFT vs TPOT
of every request, output throughput) and when done (throughput, TTFT and TPOT p50/p99 against concurrency,
the latency CDF). Every finished run is saved in the library (app.bench_runs); runs there can be reopened,
overlaid on one set of charts, compared two at a time (deltas in %), and exported as PNG, CSV, JSON and
Markdown; reports written by `kestrel bench serve` / `sweep` are imported into it ("Import report…"). A sweep
over engine configurations (`--engine-configs`) is drawn as a line per configuration. When the run's server is
Kestrel's at TP > 1, the all-reduce strategies auto measured at start-up are shown as a table (and exported in
the Markdown and JSON). Each run shows the one command line that re-runs it from a terminal.

The run itself is app.workers.bench_worker.BenchWorker on a thread of its own: the panel only draws."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import bench_report
from app import theme as themes
from app.bench_runs import RunLibrary, write_report
from app.context import AppContext
from app.widgets.bench_charts import LiveCharts, ResultCharts
from app.workers.bench_worker import DATASETS, BenchSpec, BenchWorker, parse_concurrencies

LOCAL, CUSTOM = "local", "custom"


class BenchmarkPanel(QWidget):
    def __init__(self, ctx: AppContext, library: RunLibrary | None = None):
        super().__init__()
        self.ctx = ctx
        self.library = library or RunLibrary()
        self.worker = BenchWorker()
        self.report: dict | None = None  # the run shown on the Results tab (the last one, or one reopened)
        self.local_url: str | None = ctx.server.url
        self.local_model: str | None = None
        self._build()
        self.worker.started.connect(self._on_started)
        self.worker.requestDone.connect(self._on_request)
        self.worker.progress.connect(self._on_progress)
        self.worker.pointDone.connect(self._on_point)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        ctx.server.started.connect(self._on_server_started)
        ctx.server.stopped.connect(self._on_server_stopped)
        self._show_target()
        self.refresh_library()

    # ------------------------------------------------------------------------------------------------
    # layout

    def _build(self) -> None:
        root = QVBoxLayout(self)
        root.setContentsMargins(20, 16, 20, 16)
        head = QHBoxLayout()
        title = QLabel("Benchmark")
        title.setObjectName("pageTitle")
        head.addWidget(title)
        head.addStretch(1)
        root.addLayout(head)
        split = QSplitter(Qt.Horizontal)
        root.addWidget(split, 1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # the form wraps to the width; no sideways
        scroll.setMinimumWidth(300)
        scroll.setMaximumWidth(380)
        scroll.setWidget(self._settings())
        split.addWidget(scroll)
        self.tabs = QTabWidget()
        self.live = LiveCharts()
        self.tabs.addTab(self.live, "Live")
        self.tabs.addTab(self._results(), "Results")
        self.tabs.addTab(self._library_tab(), "Library")
        split.addWidget(self.tabs)
        split.setStretchFactor(1, 1)

    def _settings(self) -> QWidget:
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(0, 0, 8, 0)
        target = QGroupBox("Target")
        tf = QFormLayout(target)
        self.local_radio = QRadioButton("Local server (Server panel)")
        self.custom_radio = QRadioButton("Other endpoint")
        self.target_group = QButtonGroup(self)
        self.target_group.addButton(self.local_radio)
        self.target_group.addButton(self.custom_radio)
        self.custom_radio.setChecked(True)
        self.local_radio.toggled.connect(self._show_target)
        tf.addRow(self.local_radio)
        self.local_note = QLabel()
        self.local_note.setObjectName("hint")
        self.local_note.setWordWrap(True)
        tf.addRow(self.local_note)
        tf.addRow(self.custom_radio)
        self.url = QLineEdit("http://127.0.0.1:8000")
        self.url.setPlaceholderText("http://host:port (without /v1)")
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.Password)
        self.api_key.setPlaceholderText("none")
        self.model = QLineEdit()
        self.model.setPlaceholderText("first of /v1/models")
        tf.addRow("URL", self.url)
        tf.addRow("API key", self.api_key)
        tf.addRow("Model", self.model)
        lay.addWidget(target)

        data = QGroupBox("Dataset")
        df = QFormLayout(data)
        self.dataset = QComboBox()
        for key, text in DATASETS.items():
            self.dataset.addItem(text, key)
        self.dataset.currentIndexChanged.connect(self._show_dataset)
        df.addRow("Kind", self.dataset)
        self.input_len = self._spin(1, 1_000_000, 1024)
        self.output_len = self._spin(1, 1_000_000, 128)
        self.range_ratio = QDoubleSpinBox()
        self.range_ratio.setRange(0.0, 0.99)
        self.range_ratio.setSingleStep(0.1)
        self.prefix_len = self._spin(1, 1_000_000, 256)
        self.suffix_len = self._spin(0, 1_000_000, 256)
        self.num_prefixes = self._spin(1, 10_000, 10)
        path_row = QWidget()
        pr = QHBoxLayout(path_row)
        pr.setContentsMargins(0, 0, 0, 0)
        self.dataset_path = QLineEdit()
        self.dataset_path.setPlaceholderText("ShareGPT-format JSON")
        browse = QPushButton("…")
        browse.setFixedWidth(32)
        browse.clicked.connect(self._browse_dataset)
        pr.addWidget(self.dataset_path, 1)
        pr.addWidget(browse)
        self._rows = {}
        for name, label, w in (("input_len", "Input tokens", self.input_len),
                               ("range_ratio", "Length range ±", self.range_ratio),
                               ("prefix_len", "Shared prefix tokens", self.prefix_len),
                               ("suffix_len", "Own suffix tokens", self.suffix_len),
                               ("num_prefixes", "Distinct prefixes", self.num_prefixes),
                               ("output_len", "Output tokens", self.output_len),
                               ("dataset_path", "File", path_row)):
            df.addRow(label, w)
            self._rows[name] = w
        self.num_prompts = self._spin(1, 1_000_000, 100)
        df.addRow("Prompts per point", self.num_prompts)
        self.seed = self._spin(0, 2**31 - 1, 0)
        df.addRow("Seed", self.seed)
        lay.addWidget(data)

        sweep = QGroupBox("Sweep")
        sf = QFormLayout(sweep)
        self.concurrencies = QLineEdit("1,2,4,8,16")
        self.concurrencies.setToolTip("Max concurrency of each point, separated by commas")
        sf.addRow("Max concurrency", self.concurrencies)
        self.label = QLineEdit()
        self.label.setPlaceholderText("optional name of the run")
        sf.addRow("Label", self.label)
        lay.addWidget(sweep)

        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("primary")
        self.run_button.clicked.connect(self.run)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        buttons.addWidget(self.run_button, 1)
        buttons.addWidget(self.stop_button, 1)
        lay.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        lay.addWidget(self.progress)
        self.message = QLabel("Ready.")
        self.message.setWordWrap(True)
        self.message.setObjectName("hint")
        self.message.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.message)
        lay.addStretch(1)
        self._show_dataset()
        return box

    @staticmethod
    def _spin(lo: int, hi: int, value: int) -> QSpinBox:
        s = QSpinBox()
        s.setRange(lo, hi)
        s.setValue(value)
        return s

    def _results(self) -> QWidget:
        w = QWidget()
        lay = QVBoxLayout(w)
        lay.setContentsMargins(0, 6, 0, 0)
        self.results_title = QLabel("No run yet.")
        lay.addWidget(self.results_title)
        self.charts = ResultCharts()
        lay.addWidget(self.charts, 1)
        self.comm_box = QGroupBox("All-reduce strategies measured at start-up (TP > 1, auto)")
        cb = QVBoxLayout(self.comm_box)
        self.comm_table = QTableWidget(0, 0)
        self.comm_table.verticalHeader().setVisible(False)
        self.comm_table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.comm_table.setMaximumHeight(200)
        cb.addWidget(self.comm_table)
        self.comm_box.setVisible(False)
        lay.addWidget(self.comm_box)
        cmd = QHBoxLayout()
        cmd.addWidget(QLabel("Re-run:"))
        self.command = QLineEdit()
        self.command.setReadOnly(True)
        self.command.setPlaceholderText("the command line of the run shown")
        cmd.addWidget(self.command, 1)
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(self.copy_command)
        cmd.addWidget(self.copy_button)
        lay.addLayout(cmd)
        exports = QHBoxLayout()
        exports.addStretch(1)
        self.export_buttons = []
        for text, filt, suffix, fn in (("Export PNG…", "PNG image (*.png)", ".png", self.export_png),
                                       ("Export CSV…", "CSV (*.csv)", ".csv", self.export_csv),
                                       ("Export JSON…", "JSON report (*.json)", ".json", self.export_json),
                                       ("Export Markdown…", "Markdown (*.md)", ".md",
                                        self.export_markdown)):
            b = QPushButton(text)
            b.setEnabled(False)
            b.clicked.connect(lambda _=False, f=filt, s=suffix, g=fn: self._ask_export(f, s, g))
            exports.addWidget(b)
            self.export_buttons.append(b)
        lay.addLayout(exports)
        return w

    def _library_tab(self) -> QWidget:
        w = QWidget()
        lay = QVBoxLayout(w)
        lay.setContentsMargins(0, 6, 0, 0)
        hint = QLabel("Tick runs to overlay them on the Results charts; tick two to compare them.")
        hint.setObjectName("hint")
        lay.addWidget(hint)
        self.runs = QListWidget()
        self.runs.itemChanged.connect(self._on_run_ticked)
        self.runs.itemDoubleClicked.connect(self._open_item)
        lay.addWidget(self.runs, 1)
        row = QHBoxLayout()
        self.open_button = QPushButton("Open")
        self.open_button.clicked.connect(self._open_selected)
        self.overlay_button = QPushButton("Overlay ticked")
        self.overlay_button.clicked.connect(self.show_overlay)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._delete_selected)
        self.import_button = QPushButton("Import report…")
        self.import_button.setToolTip("Add a JSON report written by `kestrel bench serve` or `kestrel bench "
                                      "sweep` (--result-filename) to the library")
        self.import_button.clicked.connect(self._ask_import)
        for b in (self.open_button, self.overlay_button, self.delete_button, self.import_button):
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        self.compare_title = QLabel("Comparison: tick two runs.")
        lay.addWidget(self.compare_title)
        self.compare_table = QTableWidget(0, 0)
        self.compare_table.verticalHeader().setVisible(False)
        lay.addWidget(self.compare_table, 2)  # the comparison gets the room; the list scrolls
        return w

    # ------------------------------------------------------------------------------------------------
    # target and dataset

    def _show_target(self) -> None:
        local = self.local_radio.isChecked()
        for w in (self.url, self.model):  # the API key stays: the local server's, when it was given one
            w.setEnabled(not local)
        self.local_radio.setEnabled(self.local_url is not None)
        if self.local_url is None:
            self.local_note.setText("Not running: start the endpoint in the Server panel.")
            if local:
                self.custom_radio.setChecked(True)
        else:
            self.local_note.setText(f"{self.local_url} · {self.local_model or ''}")

    def _on_server_started(self, url: str, model: str) -> None:
        self.local_url, self.local_model = url, model
        self.local_radio.setEnabled(True)
        if not self.worker.running:
            self.local_radio.setChecked(True)
        self._show_target()

    def _on_server_stopped(self, _why: str) -> None:
        self.local_url = self.local_model = None
        self._show_target()

    def _show_dataset(self) -> None:
        kind = self.dataset.currentData()
        shown = {"random": {"input_len", "range_ratio", "output_len"},
                 "prefix_repetition": {"prefix_len", "suffix_len", "num_prefixes", "output_len"},
                 "sharegpt": {"dataset_path"}}[kind]
        form = self._rows["input_len"].parentWidget().layout()
        for name, w in self._rows.items():
            form.setRowVisible(w, name in shown)

    def _browse_dataset(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "ShareGPT dataset", str(Path.home()), "JSON (*.json)")
        if path:
            self.dataset_path.setText(path)

    def spec(self) -> BenchSpec:
        """The sweep the form describes; ValueError in words when it cannot run."""
        if self.local_radio.isChecked():
            if self.local_url is None:
                raise ValueError("The local server is not running: start it in the Server panel.")
            url, key, model = self.local_url, self.api_key.text().strip() or None, self.local_model
        else:
            url, key, model = self.url.text().strip(), self.api_key.text().strip() or None, \
                self.model.text().strip() or None
            if not url.startswith(("http://", "https://")):
                raise ValueError("The URL starts with http:// or https://, e.g. http://127.0.0.1:8000")
        kind = self.dataset.currentData()
        if kind == "sharegpt" and not Path(self.dataset_path.text()).is_file():
            raise ValueError("Choose a ShareGPT-format JSON file for the dataset.")
        return BenchSpec(base_url=url, api_key=key, model=model, dataset=kind,
                         input_len=self.input_len.value(),
                         output_len=self.output_len.value(), range_ratio=round(self.range_ratio.value(), 2),
                         prefix_len=self.prefix_len.value(), suffix_len=self.suffix_len.value(),
                         num_prefixes=self.num_prefixes.value(),
                         dataset_path=self.dataset_path.text() or None,
                         num_prompts=self.num_prompts.value(),
                         concurrencies=parse_concurrencies(self.concurrencies.text()), seed=self.seed.value(),
                         label=self.label.text().strip() or None)

    # ------------------------------------------------------------------------------------------------
    # running

    def run(self) -> None:
        if self.worker.running:
            return
        try:
            spec = self.spec()
        except ValueError as e:
            self._say(str(e), error=True)
            return
        self.live.clear()
        self.progress.setRange(0, 0)  # busy until the worker knows the total
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.tabs.setCurrentWidget(self.live)
        self._say(f"Contacting {spec.base_url}…")
        self.worker.run(spec)

    def stop(self) -> None:
        if self.worker.running:
            self._say("Stopping…")
            self.worker.stop()

    def _on_started(self, command: str, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(0)
        self.command.setText(command)
        self._say("Running…")

    def _on_request(self, sample) -> None:
        self.live.add(sample)

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setValue(done)
        self._say(f"Running: {done} / {total} requests")

    def _on_point(self, point: dict) -> None:
        m = point["metrics"]
        self._say(f"Concurrency {point['params']['max_concurrency']}: {m['completed']} ok, "
                  f"{m['output_throughput']:.1f} output tok/s")

    def _on_finished(self, report: dict) -> None:
        self._idle()
        path = self.library.save(report)
        self.refresh_library()
        self.show_report(report)
        failed = sum(p["metrics"]["failed"] for p in report["points"])
        note = " (stopped: the points finished are kept)" if report.get("metadata", {}).get("stopped") else ""
        errors = f"; {failed} requests failed: {report['points'][0]['errors'][:1]}" if failed else ""
        self._say(f"Done{note}: {len(report['points'])} points, saved as {path.name}{errors}")
        self.tabs.setCurrentIndex(1)

    def _on_failed(self, message: str) -> None:
        self._idle()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self._say(message, error=True)

    def _idle(self) -> None:
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    def _say(self, text: str, error: bool = False) -> None:
        self.message.setObjectName("messageError" if error else "hint")
        self.message.setStyleSheet("")  # re-polish for the object name
        self.message.style().unpolish(self.message)
        self.message.style().polish(self.message)
        self.message.setText(text)

    # ------------------------------------------------------------------------------------------------
    # results

    def show_report(self, report: dict) -> None:
        self.report = report
        where = report.get("server", {}).get("base_url", "")
        self.results_title.setText(f"{bench_report.label(report)} · {where}")
        self.command.setText(report.get("command", ""))
        self.command.setCursorPosition(0)  # show where it starts: "kestrel bench sweep ..."
        self.charts.show_runs([report])
        self.show_comm_table(report)
        for b in self.export_buttons:
            b.setEnabled(True)

    def show_comm_table(self, report: dict | None) -> None:
        """auto's start-up all-reduce measurements of the run's server (TP > 1): latency per strategy and
        message size, the choice in bold; hidden when the report has none."""
        table = bench_report.comm_table(report or {})
        self.comm_box.setVisible(bool(table))
        t = self.comm_table
        t.setRowCount(0)
        if not table:
            t.setColumnCount(0)
            return
        info = (report.get("server", {}).get("kestrel") or {})
        self.comm_box.setTitle(f"All-reduce strategies measured at start-up (TP {info.get('tensor_parallel_size')}, "
                               f"{info.get('comm_strategy')})")
        names = bench_report.comm_strategies(table)
        t.setColumnCount(len(names) + 2)
        t.setHorizontalHeaderLabels(["message", *(f"{n} µs" for n in names), "chosen"])
        t.setRowCount(len(table))
        for i, row in enumerate(table):
            cells = [bench_report.size_text(int(row["bytes"]))]
            for n in names:
                v = row.get("latency_us", {}).get(n)
                ok = row.get("ok", {}).get(n, True)
                cells.append("" if v is None else f"{v:.1f}" + ("" if ok else " ✗"))
            cells.append(str(row.get("choice", "")))
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment((Qt.AlignLeft if j == len(cells) - 1 else Qt.AlignRight) | Qt.AlignVCenter)
                if 0 < j < len(cells) - 1 and names[j - 1] == row.get("choice"):
                    f = item.font()
                    f.setBold(True)
                    item.setFont(f)
                t.setItem(i, j, item)
        t.resizeColumnsToContents()

    def copy_command(self) -> None:
        QGuiApplication.clipboard().setText(self.command.text())

    def export_png(self, path: str | Path) -> None:
        self.charts.grab().save(str(path))

    def export_csv(self, path: str | Path) -> None:
        bench_report.write_csv(self.report, path)

    def export_json(self, path: str | Path) -> None:
        write_report(self.report, path)

    def export_markdown(self, path: str | Path) -> None:
        Path(path).write_text(bench_report.markdown(self.report))

    def _ask_export(self, filter_: str, suffix: str, fn) -> None:
        if self.report is None:
            return
        name = time.strftime(f"kestrel-bench-%Y%m%d-%H%M%S{suffix}")
        path, _ = QFileDialog.getSaveFileName(self, "Export", str(Path.home() / name), filter_)
        if path:
            fn(path if path.endswith(suffix) else path + suffix)

    # ------------------------------------------------------------------------------------------------
    # the library

    def refresh_library(self) -> None:
        ticked = set(self.ticked_paths())
        self.runs.blockSignals(True)
        self.runs.clear()
        for e in self.library.entries():
            item = QListWidgetItem(f"{e.label}  ·  {e.points} points  ·  {e.date[:16].replace('T', ' ')}")
            item.setData(Qt.UserRole, str(e.path))
            item.setToolTip(e.command)
            item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
            item.setCheckState(Qt.Checked if str(e.path) in ticked else Qt.Unchecked)
            self.runs.addItem(item)
        self.runs.blockSignals(False)
        self._update_comparison()

    def ticked_paths(self) -> list[str]:
        return [self.runs.item(i).data(Qt.UserRole) for i in range(self.runs.count())
                if self.runs.item(i).checkState() == Qt.Checked]

    def set_ticked(self, paths: list[str]) -> None:
        for i in range(self.runs.count()):
            item = self.runs.item(i)
            item.setCheckState(Qt.Checked if item.data(Qt.UserRole) in paths else Qt.Unchecked)

    def _on_run_ticked(self, _item) -> None:
        self._update_comparison()

    def _load(self, path: str) -> dict | None:
        try:
            return self.library.load(path)
        except ValueError as e:
            self._say(str(e), error=True)
            return None

    def _open_item(self, item) -> None:
        report = self._load(item.data(Qt.UserRole))
        if report is not None:
            self.show_report(report)
            self.tabs.setCurrentIndex(1)

    def _open_selected(self) -> None:
        item = self.runs.currentItem()
        if item is not None:
            self._open_item(item)

    def _delete_selected(self) -> None:
        item = self.runs.currentItem()
        if item is not None:
            self.library.delete(item.data(Qt.UserRole))
            self.refresh_library()

    def import_report(self, path: str | Path) -> Path | None:
        """Add a report made by the command line to the library and show it; None (said in words) when the
        file is not a report."""
        try:
            dest = self.library.import_file(path)
        except ValueError as e:
            self._say(str(e), error=True)
            return None
        self.refresh_library()
        for i in range(self.runs.count()):
            if self.runs.item(i).data(Qt.UserRole) == str(dest):
                self.runs.setCurrentRow(i)
        report = self._load(str(dest))
        if report is not None:
            self.show_report(report)
            self._say(f"Imported {bench_report.label(report)!r} into the library.")
        return dest

    def _ask_import(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Import benchmark reports", str(Path.home()),
                                                "JSON report (*.json)")
        for p in paths:
            self.import_report(p)

    def show_overlay(self) -> None:
        """The ticked runs on one set of charts (the Results tab)."""
        reports = [r for r in (self._load(p) for p in self.ticked_paths()) if r is not None]
        if not reports:
            self._say("Tick the runs to overlay in the Library.", error=True)
            return
        self.charts.show_runs(reports)
        self.show_comm_table(reports[0] if len(reports) == 1 else None)
        self.results_title.setText("Overlay: " + ", ".join(bench_report.label(r) for r in reports))
        if len(reports) == 1:
            self.show_report(reports[0])
        else:
            self.command.setText("")
            for b in self.export_buttons[1:]:
                b.setEnabled(False)  # CSV / JSON / Markdown are of one run; the PNG is of what is shown
            self.export_buttons[0].setEnabled(True)
        self.tabs.setCurrentIndex(1)

    def _update_comparison(self) -> None:
        paths = self.ticked_paths()
        table = self.compare_table
        table.setRowCount(0)
        if len(paths) != 2:
            self.compare_title.setText("Comparison: tick two runs.")
            table.setColumnCount(0)
            return
        a, b = self._load(paths[0]), self._load(paths[1])
        if a is None or b is None:
            return
        self.compare_title.setText(f"A = {bench_report.label(a)}   ·   B = {bench_report.label(b)}   "
                                   f"(Δ = B vs A)")
        rows = bench_report.compare(a, b)
        cols = ["concurrency"] + [f"{t} {s}" for _, t in bench_report.COLUMNS[:6] for s in ("A", "B", "Δ")]
        table.setColumnCount(len(cols))
        table.setHorizontalHeaderLabels(cols)
        table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            cells = [str(r["concurrency"])]
            for key, _ in bench_report.COLUMNS[:6]:
                va, vb, d = r[key]
                cells += [_fmt(va), _fmt(vb), "" if d is None else f"{d:+.1f}%"]
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                table.setItem(i, j, item)
        table.resizeColumnsToContents()

    # ------------------------------------------------------------------------------------------------

    def apply_theme(self, theme: themes.Theme) -> None:
        self.live.apply_theme(theme)
        self.charts.apply_theme(theme)

    def shutdown(self) -> None:
        self.worker.shutdown()


def _fmt(v) -> str:
    return "" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)
