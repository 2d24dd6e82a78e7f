"""The Models panel's Hub tab: search text-generation models by format, a repo's variants (GGUF quantizations,
safetensors) and files with the hash each is checked against, whether each variant fits this machine at each
TP size, and Download."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from app import fit, paths, token_store
from app.context import AppContext
from app.downloader import partial_bytes
from app.hardware import cpu_has_native_bf16
from app.hub import FORMATS, HubModel, RepoDetails, Variant, repo_details, search_models
from app.widgets.tables import GREEN, RED, cell, selected_row, table
from app.workers.download_worker import DownloadJob

StatusFn = Callable[..., None]  # (text, error=False)
GPU_SHARE = 0.9  # of each GPU's memory, as the engine's default gpu_memory_utilization
NO_REPO = "Select a model to see its files and whether it fits."


class HubTab(QWidget):
    def __init__(self, ctx: AppContext, status: StatusFn, on_download: Callable[[DownloadJob], None]):
        super().__init__()
        self.ctx = ctx
        self.status = status
        self.on_download = on_download
        self.results: list[HubModel] = []
        self.details: RepoDetails | None = None
        self._wanted: str | None = None  # the repo whose details were asked for last
        self._build()
        ctx.hardware.sampled.connect(self._on_hardware)
        # bound methods, never lambdas: the downloads worker lives on its own thread (queued to this one)
        ctx.downloads.finished.connect(self._on_download_ended)
        ctx.downloads.failed.connect(self._on_download_ended)
        ctx.downloads.cancelled.connect(self._on_download_ended)

    def _on_download_ended(self, _job: int, _detail: str = "") -> None:
        """A download finished, failed or was cancelled: the cache states of the shown files change."""
        self._refresh_cache_states()

    def _build(self) -> None:
        lay = QVBoxLayout(self)
        bar = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search text-generation models, e.g. Qwen2.5 0.5B Instruct")
        self.query.returnPressed.connect(self.search)
        self.format_combo = QComboBox()
        for label, tag in FORMATS.items():
            self.format_combo.addItem(label, tag)
        self.search_button = QPushButton("Search")
        self.search_button.setObjectName("primary")
        self.search_button.clicked.connect(self.search)
        bar.addWidget(self.query, 1)
        bar.addWidget(self.format_combo)
        bar.addWidget(self.search_button)
        lay.addLayout(bar)
        split = QSplitter(Qt.Horizontal)
        self.results_table = table(["Model", "Formats", "Downloads", "Likes", "Updated"])
        self.results_table.setTextElideMode(Qt.ElideLeft)  # a narrow list keeps the model's name, not its owner
        self.results_table.itemSelectionChanged.connect(self._on_result_selected)
        split.addWidget(self.results_table)
        detail = QWidget()
        dl = QVBoxLayout(detail)
        dl.setContentsMargins(8, 0, 0, 0)
        self.repo_title = QLabel(NO_REPO)
        self.repo_title.setWordWrap(True)
        self.repo_title.setTextFormat(Qt.RichText)
        dl.addWidget(self.repo_title)
        self.repo_support = QLabel()
        self.repo_support.setWordWrap(True)
        self.repo_support.hide()
        dl.addWidget(self.repo_support)
        self.variants_table = table(["Variant", "Files", "Size", "In cache"])
        self.variants_table.itemSelectionChanged.connect(self._on_variant_selected)
        dl.addWidget(self.variants_table, 1)
        self.files_table = table(["File", "Size", "Check"])
        dl.addWidget(self.files_table, 1)
        fit_box = QGroupBox("Fit on this machine (estimate: weights + KV cache + overhead)")
        fl = QVBoxLayout(fit_box)
        ctx_row = QHBoxLayout()
        ctx_row.addWidget(QLabel("Context"))
        self.fit_context = QSpinBox()
        self.fit_context.setRange(256, 1 << 20)
        self.fit_context.setSingleStep(1024)
        self.fit_context.setValue(8192)
        self.fit_context.setSuffix(" tokens")
        self.fit_context.valueChanged.connect(self._update_fit)
        ctx_row.addWidget(self.fit_context)
        ctx_row.addStretch(1)
        fl.addLayout(ctx_row)
        self.fit_table = QTableWidget(0, 0)
        self.fit_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.fit_table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.fit_table.setSizeAdjustPolicy(QAbstractItemView.AdjustToContents)
        self.fit_table.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Maximum)
        fl.addWidget(self.fit_table)
        self.fit_note = QLabel()
        self.fit_note.setObjectName("hint")
        self.fit_note.setWordWrap(True)
        fl.addWidget(self.fit_note)
        dl.addWidget(fit_box)
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("primary")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.download_selected_variant)
        dl.addWidget(self.download_button, 0, Qt.AlignRight)
        split.addWidget(detail)
        split.setSizes([520, 560])
        lay.addWidget(split, 1)

    # search -------------------------------------------------------------------------------------------
    def search(self) -> None:
        query, fmt = self.query.text().strip(), self.format_combo.currentData()
        token = token_store.get_token()
        self.search_button.setEnabled(False)
        self.status("Searching the Hub…")
        self.ctx.tasks.submit(lambda: search_models(query, fmt, token=token), self._on_results, self._on_error)

    def _on_error(self, message: str) -> None:
        self.search_button.setEnabled(True)
        self.status(message, error=True)

    def _on_results(self, results: list[HubModel]) -> None:
        self.search_button.setEnabled(True)
        self.results = results
        n = len(results)
        self.status(f"{n} model{'s' if n != 1 else ''} found." if results else "No models found.")
        self.clear_details()
        t = self.results_table
        t.blockSignals(True)  # a new list: nothing selected (a row kept selected would not signal a click)
        t.clearSelection()
        t.setCurrentItem(None)
        t.setRowCount(0)
        t.setRowCount(len(results))
        for r, m in enumerate(results):
            cells = [cell(m.repo_id + ("  (gated)" if m.gated else ""), tip=m.repo_id),
                     cell(", ".join(m.formats) or "—"),
                     cell(f"{m.downloads:,}", right=True), cell(f"{m.likes:,}", right=True),
                     cell(m.last_modified.strftime("%Y-%m-%d") if m.last_modified else "")]
            for c, it in enumerate(cells):
                it.setData(Qt.UserRole, m.repo_id)
                t.setItem(r, c, it)
        t.blockSignals(False)

    def clear_details(self) -> None:
        """Forget the shown repo: details, variants, files, fit and the Download button."""
        self.details = None
        self._wanted = None
        self.repo_title.setText(NO_REPO)
        self.repo_support.hide()
        for t in (self.variants_table, self.files_table):
            t.blockSignals(True)
            t.clearSelection()
            t.setRowCount(0)
            t.blockSignals(False)
        self.fit_table.setRowCount(0)
        self.fit_table.setColumnCount(0)
        self.fit_note.setText("")
        self.download_button.setEnabled(False)
        self.download_button.setText("Download")

    def _on_result_selected(self) -> None:
        row = selected_row(self.results_table)
        if row is not None:
            self.show_repo(self.results_table.item(row, 0).data(Qt.UserRole))

    # one repo -----------------------------------------------------------------------------------------
    def show_repo(self, repo_id: str) -> None:
        token = token_store.get_token()
        self.clear_details()
        self._wanted = repo_id
        self.repo_title.setText(f"<b>{repo_id}</b>: reading its files…")
        self.ctx.tasks.submit(lambda: repo_details(repo_id, token), self._on_details, self._on_error)

    def _on_details(self, d: RepoDetails) -> None:
        if d.repo_id != self._wanted:  # an earlier click's answer, come late
            return
        self.details = d
        self.status("")
        bits = [d.architecture or "unknown architecture",
                f"{fit.human_count(d.num_params)} parameters" if d.num_params else None,
                f"context {d.context_length:,}" if d.context_length else None]
        self.repo_title.setText(f"<b>{d.repo_id}</b><br>{' · '.join(b for b in bits if b)}")
        gated = " Gated: accept its terms on the Hub and set your token." if d.gated else ""
        self.repo_support.setObjectName("okBox" if d.supported and not d.gated else
                                        "warningBox" if d.supported else "errorBox")
        self.repo_support.setText(("Kestrel can run this model." if d.supported else
                                   f"Kestrel cannot run this model: {d.reason}") + gated)
        self.repo_support.style().unpolish(self.repo_support)
        self.repo_support.style().polish(self.repo_support)
        self.repo_support.show()
        if d.context_length:
            self.fit_context.setValue(min(int(d.context_length), 8192))
        t = self.variants_table
        t.blockSignals(True)
        t.clearSelection()
        t.setRowCount(len(d.variants))
        for r, v in enumerate(d.variants):
            for c, it in enumerate([cell(v.label), cell(str(len(v.files)), right=True),
                                    cell(fit.human_bytes(v.size), right=True), cell("")]):
                t.setItem(r, c, it)
        self._refresh_cache_states()
        if d.variants:
            preferred = next((i for i, v in enumerate(d.variants) if v.label.upper() in ("Q4_K_M", "Q8_0")), 0)
            t.selectRow(preferred)
        t.blockSignals(False)
        self._on_variant_selected()  # always: the same row as the last repo's does not signal a change
        self._update_fit()

    def _refresh_cache_states(self) -> None:
        """The "In cache" column, from the cache as it is now (after a download ends, too)."""
        d = self.details
        if d is None:
            return
        cache = paths.hf_cache_dir()
        t = self.variants_table
        for r, v in enumerate(d.variants[:t.rowCount()]):
            have = partial_bytes(d.repo_id, v.files, cache)
            state = "yes" if v.size and have >= v.size else f"{100 * have / v.size:.0f}%" if have and v.size else "no"
            t.setItem(r, 3, cell(state))

    def selected_variant(self) -> Variant | None:
        row = selected_row(self.variants_table)
        return None if self.details is None or row is None else self.details.variants[row]

    def _on_variant_selected(self) -> None:
        v = self.selected_variant()
        files = v.files if v else []
        self.files_table.setRowCount(len(files))
        for r, f in enumerate(files):
            check = "sha256" if f.sha256 else "git hash" if f.blob_id else "size only"
            for c, it in enumerate([cell(f.path), cell(fit.human_bytes(f.size), right=True), cell(check)]):
                self.files_table.setItem(r, c, it)
        self.download_button.setEnabled(v is not None)
        self.download_button.setText(f"Download {v.label} ({fit.human_bytes(v.size)})" if v else "Download")

    def download_selected_variant(self) -> DownloadJob | None:
        v, d = self.selected_variant(), self.details
        if v is None or d is None:
            return None
        job = DownloadJob(repo_id=d.repo_id, files=list(v.files), label=v.label, revision=d.sha or "main")
        self.ctx.downloads.enqueue(job)
        self.on_download(job)
        return job

    # fit ----------------------------------------------------------------------------------------------
    def _on_hardware(self, _snapshot) -> None:
        self._update_fit()

    def _update_fit(self) -> None:
        d = self.details
        if d is None:
            return
        snap = self.ctx.hardware_snapshot
        gpus = snap.gpus if snap is not None else []
        context = self.fit_context.value()
        caps = self.ctx.capabilities
        if gpus:
            dtype = "float16" if d.torch_dtype == "float16" else "bfloat16"  # the engine's "auto" on a GPU
            sizes = fit.tp_choices(len(gpus), d.shape)
            headers = [f"TP {tp}" + ("" if tp == 1 or caps.tensor_parallel else " (unavailable)") for tp in sizes]
            capacity = int(min(g.memory_total or 0 for g in gpus) * GPU_SHARE)
        else:
            dtype = "bfloat16" if cpu_has_native_bf16() else "float32"  # the engine's "auto" on the CPU
            sizes, headers = [1], ["CPU (RAM)"]
            capacity = snap.ram_total if snap is not None else None
        t = self.fit_table
        t.setRowCount(len(d.variants))
        t.setColumnCount(len(sizes))
        t.setHorizontalHeaderLabels(headers)
        t.setVerticalHeaderLabels([v.label for v in d.variants])
        for r, v in enumerate(d.variants):
            weights = fit.weights_in_memory(d.num_params, dtype, v.size, caps.keeps_quantized_weights,
                                            gpu=bool(gpus))
            for c, tp in enumerate(sizes):
                if weights is None:
                    t.setItem(r, c, cell("?", "The Hub gives no parameter count for this repo"))
                    continue
                est = fit.estimate(weights, d.shape, context, tp, dtype, capacity, gpu=bool(gpus))
                mark = "" if est.fits is None else (" ✓" if est.fits else " ✗")
                color = None if est.fits is None else (GREEN if est.fits else RED)
                t.setItem(r, c, cell(fit.gib(est.total) + mark, est.describe(), color))
        where = (f"{len(gpus)} GPU(s), {fit.gib(capacity)} usable each ({GPU_SHARE:.0%})" if gpus else
                 f"no GPU found: the CPU row compares with this machine's RAM ({fit.gib(capacity)})")
        has_gguf = any(v.is_gguf for v in d.variants)
        quant = ("" if not has_gguf else
                 f" On a GPU, GGUF weights are dequantized to {dtype} at load, so every quantization needs the same "
                 "memory." if gpus or not caps.keeps_quantized_weights else
                 " On the CPU, GGUF weights stay in their blocks: a smaller quantization needs less memory.")
        self.fit_note.setText(f"Per device, at {context:,} tokens of context, {dtype}: {where}.{quant}")
