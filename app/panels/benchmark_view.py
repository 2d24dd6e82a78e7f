"""The Benchmark panel's widgets (app.panels.benchmark.BenchmarkPanel mixes this in): the settings form, Run and
Stop with the estimate and progress, the Results tab (live and finished charts, the comm table, exports) and the
Library tab. Layout only: what the widgets do is the panel's."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import bench_estimate, bench_report
from app.widgets.bench_charts import LiveCharts, ResultCharts
from app.workers.bench_worker import DATASETS


CAPTION = ("TTFT: time to first token · TPOT: time per output token after the first · E2E: request sent to "
           "last token · CDF: share of requests done within a latency · p50 / p99: half / 99 in 100 were faster. "
           "Hover a chart for more.")
LIVE_CAPTION = ("Each dot is a request as it ends: its TTFT (time to first token) against its TPOT (time per "
                "output token after the first). Throughput: output tokens per second of all requests together.")


class BenchmarkViewMixin:
    """For BenchmarkPanel only: builds its widgets onto it, connected to its own methods."""

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
        # the form scrolls; Run, Stop, the estimate and the progress stay in view under it at any height
        left = QWidget()
        left.setMinimumWidth(300)
        left.setMaximumWidth(380)
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # the form wraps to the width; no sideways
        scroll.setWidget(self._settings())
        self.form_scroll = scroll
        ll.addWidget(scroll, 1)
        ll.addWidget(self._run_box())
        split.addWidget(left)
        self.tabs = QTabWidget()
        self.live = LiveCharts()
        self.live_tab = QWidget()
        lt = QVBoxLayout(self.live_tab)
        lt.setContentsMargins(0, 6, 0, 0)
        lt.addWidget(self.live, 1)
        self.live_caption = self._caption(LIVE_CAPTION)
        lt.addWidget(self.live_caption)
        self.tabs.addTab(self.live_tab, "Live")
        self.tabs.addTab(self._results(), "Results")
        self.tabs.addTab(self._library_tab(), "Library")
        split.addWidget(self.tabs)
        split.setStretchFactor(1, 1)

    @staticmethod
    def _caption(text: str) -> QLabel:
        c = QLabel(text)
        c.setObjectName("hint")
        c.setWordWrap(True)
        c.setTextInteractionFlags(Qt.TextSelectableByMouse)
        return c

    def _settings(self) -> QWidget:
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(0, 0, 8, 0)
        target = QGroupBox("Target")
        tf = _form(target)
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
        df = _form(data)
        self.preset = QComboBox()
        for p in bench_estimate.PRESETS.values():
            self.preset.addItem(p.title, p.key)
            self.preset.setItemData(self.preset.count() - 1, p.tip, Qt.ToolTipRole)
        self.preset.addItem("Custom", bench_estimate.CUSTOM)
        self.preset.setToolTip("Sizes that suit the server's device; changing a size below makes it Custom")
        self.preset.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.preset.setMinimumContentsLength(12)
        self.preset.currentIndexChanged.connect(self._on_preset)
        df.addRow("Preset", self.preset)
        self.dataset = QComboBox()
        for key, text in DATASETS.items():
            self.dataset.addItem(text, key)
        self.dataset.currentIndexChanged.connect(self._show_dataset)
        df.addRow("Kind", self.dataset)
        p = bench_estimate.PRESETS["gpu"]
        self.input_len = self._spin(1, 1_000_000, p.input_len)
        self.output_len = self._spin(1, 1_000_000, p.output_len)
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
        self.num_prompts = self._spin(1, 1_000_000, p.num_prompts)
        self.num_prompts.setToolTip("Requests sent at each concurrency of the sweep")
        df.addRow("Prompts per point", self.num_prompts)
        self.seed = self._spin(0, 2**31 - 1, 0)
        df.addRow("Seed", self.seed)
        lay.addWidget(data)

        sweep = QGroupBox("Sweep")
        sf = _form(sweep)
        self.concurrencies = QLineEdit(",".join(str(c) for c in p.concurrencies))
        self.concurrencies.setToolTip("Max concurrency of each point (requests in flight at once), separated by "
                                      "commas")
        sf.addRow("Max concurrency", self.concurrencies)
        self.label = QLineEdit()
        self.label.setPlaceholderText("optional name of the run")
        sf.addRow("Label", self.label)
        lay.addWidget(sweep)
        lay.addStretch(1)
        self._show_dataset()
        # a size changed by hand makes the preset Custom; any change is remembered and re-estimated
        self._applying = False
        for w in (self.input_len, self.output_len, self.num_prompts):
            w.valueChanged.connect(self._on_size_edited)
        self.concurrencies.textChanged.connect(self._on_size_edited)
        self.dataset.currentIndexChanged.connect(self._on_size_edited)
        for w in (self.range_ratio, self.prefix_len, self.suffix_len, self.num_prefixes, self.seed):
            w.valueChanged.connect(self._on_form_changed)
        for w in (self.url, self.model, self.label, self.dataset_path):
            w.textChanged.connect(self._on_form_changed)
        self.local_radio.toggled.connect(self._on_form_changed)
        return box

    def _run_box(self) -> QWidget:
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(0, 6, 8, 0)
        self.estimate_label = QLabel()
        self.estimate_label.setObjectName("hint")
        self.estimate_label.setWordWrap(True)
        lay.addWidget(self.estimate_label)
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
        lay.setContentsMargins(6, 6, 6, 0)  # the title and caption off the tab's border
        self.results_title = QLabel("No run yet.")
        lay.addWidget(self.results_title)
        self.charts = ResultCharts()
        lay.addWidget(self.charts, 1)
        self.results_caption = self._caption(CAPTION)
        self.results_caption.setToolTip("\n".join(f"{k}: {v}" for k, v in bench_report.GLOSSARY.items()))
        lay.addWidget(self.results_caption)
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


def _form(box: QWidget) -> QFormLayout:
    """A form that puts a field under its label when the column is too narrow for both (1024 px windows)."""
    f = QFormLayout(box)
    f.setRowWrapPolicy(QFormLayout.WrapLongRows)
    return f
