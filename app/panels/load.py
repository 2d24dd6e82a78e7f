"""Load: pick a model and the engine options (a form derived from EngineConfig), see what it will take in
memory, load with progress and cancel. Options the engine or this machine lacks are disabled with the reason.
A failed load is explained in place and the app stays usable. Settings are kept per model."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app import fit
from app.capabilities import TP_REASON
from app.context import AppContext
from app.hardware import cpu_has_native_bf16
from app.library import EMBEDDED_KEY, LibraryEntry
from app.model_inspect import inspect_model
from app.workers.engine_worker import DEAD, EMPTY, LOADING, READY
from engine.config import EngineConfig

MAIN_FIELDS = ["quantization", "dtype", "device", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_gib",
               "enable_prefix_caching", "tensor_parallel_size", "comm_strategy"]
LABELS = {
    "quantization": "Quantization", "dtype": "Data type", "device": "Device", "max_model_len": "Context length",
    "gpu_memory_utilization": "KV-cache memory share (GPU)", "kv_cache_memory_gib": "KV-cache memory (CPU)",
    "enable_prefix_caching": "Prefix caching", "tensor_parallel_size": "Tensor-parallel size",
    "comm_strategy": "Communication strategy", "block_size": "KV block size", "num_kv_blocks": "KV blocks",
    "max_num_seqs": "Max concurrent requests", "max_num_batched_tokens": "Token budget per step",
    "num_threads": "CPU threads", "seed": "Seed", "enforce_eager": "No decode graphs or tapes",
    "async_scheduling": "Async scheduling",
}
CHOICE_LABELS = {
    "comm_strategy": {"auto": "Auto (measured at start-up)", "nccl": "NCCL", "int8": "Int8-quantized all-reduce",
                      "host": "Host (shared memory + SIMD)", "overlap": "Dual-stream overlap"},
    "quantization": {"none": "None (float weights in the chosen dtype)",
                     "int8": "Int8 weights, a scale per 32 (CPU)",
                     "gguf": "GGUF blocks kept: Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K (CPU)"},
    "async_scheduling": {"auto": "Auto (on a GPU)", "on": "On", "off": "Off"},
    "dtype": {"auto": "Auto"}, "device": {"auto": "Auto", "cpu": "CPU", "cuda": "NVIDIA GPU (CUDA)"},
}
RANGES = {"max_model_len": (0, 1 << 20), "gpu_memory_utilization": (0.05, 0.99), "kv_cache_memory_gib": (0, 4096),
          "tensor_parallel_size": (1, 8), "block_size": (0, 1024), "num_kv_blocks": (0, 1 << 24),
          "max_num_seqs": (1, 65536), "max_num_batched_tokens": (16, 1 << 20), "num_threads": (0, 1024),
          "seed": (0, 2**31 - 1)}
NONE_TEXT = {"max_model_len": "model's (≤ 8192)", "kv_cache_memory_gib": "auto (2 GiB)", "num_kv_blocks": "auto",
             "num_threads": "physical cores", "block_size": "auto (GPU 64, CPU 16)"}
SUFFIXES = {"kv_cache_memory_gib": " GiB", "max_model_len": " tokens"}
ENGINE_DEFAULT_CONTEXT_CAP = 8192


class LoadPanel(QWidget):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
        self.engine = ctx.engine
        self.entries: list[LibraryEntry] = []
        self.extra: dict[str, LibraryEntry] = {}  # models picked with Browse, by key
        self._load_started = 0.0
        self._applying = False
        self._last_tp = 1  # the TP size shown before the last change: an invalid one steps on in its direction
        self._stage = ""
        self._tick = QTimer(self)  # the engine says when loading starts and ends: show the time in between
        self._tick.setInterval(500)
        self._tick.timeout.connect(self._show_elapsed)
        self._build()
        ctx.library.changed.connect(self._on_library)
        ctx.hardware.sampled.connect(self._on_hardware)
        ctx.selectModel.connect(self.select_key)
        self.engine.stateChanged.connect(self._on_state)
        self.engine.loadProgress.connect(self._on_progress)
        self.engine.loaded.connect(self._on_loaded)
        self.engine.loadFailed.connect(self._on_failed)
        self.engine.loadCancelled.connect(self._on_cancelled)
        self.engine.engineDied.connect(self._on_died)
        self.engine.unloaded.connect(self._on_unloaded)
        self._on_state(self.engine.state)

    # ------------------------------------------------------------------------------------------------
    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        page = QWidget()
        page.setObjectName("page")
        scroll.setWidget(page)
        outer.addWidget(scroll)
        root = QVBoxLayout(page)
        root.setContentsMargins(20, 16, 20, 16)
        title = QLabel("Load a model")
        title.setObjectName("pageTitle")
        root.addWidget(title)

        model_box = QGroupBox("Model")
        ml = QVBoxLayout(model_box)
        row = QHBoxLayout()
        self.model_combo = QComboBox()
        self.model_combo.setMinimumWidth(420)
        self.model_combo.currentIndexChanged.connect(self._on_model_selected)
        row.addWidget(self.model_combo, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row.addWidget(browse)
        ml.addLayout(row)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextSelectableByMouse)
        ml.addWidget(self.summary)
        self.model_warning = QLabel()
        self.model_warning.setObjectName("warningBox")
        self.model_warning.setWordWrap(True)
        self.model_warning.hide()
        ml.addWidget(self.model_warning)
        root.addWidget(model_box)

        opts = QGroupBox("Options")
        ol = QVBoxLayout(opts)
        names = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]
        advanced = [n for n in names if n not in MAIN_FIELDS]
        self.form = ConfigFormPair(MAIN_FIELDS, advanced)
        ol.addWidget(self.form.main)
        self.advanced_toggle = QPushButton("Show advanced options")
        self.advanced_toggle.setCheckable(True)
        self.advanced_toggle.toggled.connect(self._toggle_advanced)
        ol.addWidget(self.advanced_toggle, 0, Qt.AlignLeft)
        self.form.advanced.hide()
        ol.addWidget(self.form.advanced)
        self.form.changed.connect(self._on_options_changed)
        root.addWidget(opts)

        est = QGroupBox("Memory estimate")
        el = QVBoxLayout(est)
        self.estimate = QLabel()
        self.estimate.setWordWrap(True)
        el.addWidget(self.estimate)
        root.addWidget(est)

        actions = QHBoxLayout()
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("primary")
        self.load_button.clicked.connect(self.load_selected)
        self.cancel_button = QPushButton("Cancel loading")
        self.cancel_button.clicked.connect(self.cancel_load)
        self.unload_button = QPushButton("Unload")
        self.unload_button.clicked.connect(self.unload)
        actions.addWidget(self.load_button)
        actions.addWidget(self.cancel_button)
        actions.addWidget(self.unload_button)
        actions.addStretch(1)
        root.addLayout(actions)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.hide()
        root.addWidget(self.progress)
        self.progress_label = QLabel()
        self.progress_label.setObjectName("hint")
        root.addWidget(self.progress_label)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.message.hide()
        root.addWidget(self.message)
        root.addStretch(1)

    def _toggle_advanced(self, on: bool) -> None:
        self.form.advanced.setVisible(on)
        self.advanced_toggle.setText("Hide advanced options" if on else "Show advanced options")

    # ------------------------------------------------------------------------------------------------
    # models

    def _on_library(self) -> None:
        current = self.current_key()
        self.entries = list(self.ctx.library.entries)
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        for e in self.entries + [e for k, e in self.extra.items() if not any(x.key == k for x in self.entries)]:
            self._add_item(e)
        self.model_combo.blockSignals(False)
        target = current or self.ctx.model_key or EMBEDDED_KEY
        self.select_key(target)

    def _add_item(self, e: LibraryEntry) -> None:
        facts = e.facts
        bits = [b for b in (facts.quantization, fit.human_bytes(facts.size_bytes)) if b]
        text = f"{e.name}  —  {', '.join(bits)}" + ("" if facts.supported else "  (not supported)")
        self.model_combo.addItem(text, e.key)
        self.model_combo.setItemData(self.model_combo.count() - 1, facts.reason or str(facts.path), Qt.ToolTipRole)

    def all_entries(self) -> list[LibraryEntry]:
        return self.entries + list(self.extra.values())

    def entry(self, key: str | None) -> LibraryEntry | None:
        return next((e for e in self.all_entries() if e.key == key), None)

    def current_key(self) -> str | None:
        return self.model_combo.currentData()

    def select_key(self, key: str) -> None:
        i = self.model_combo.findData(key)
        if i >= 0:
            if i == self.model_combo.currentIndex():
                self._on_model_selected(i)
            else:
                self.model_combo.setCurrentIndex(i)

    def select_path(self, path: str | Path) -> LibraryEntry:
        """Add a model file or folder to the choices (and the library's added files) and select it."""
        path = Path(path)
        e = LibraryEntry(inspect_model(path), "added", str(path), str(path))
        self.extra[e.key] = e
        if self.model_combo.findData(e.key) < 0:
            self._add_item(e)
        self.ctx.library.add_file(str(path))
        self.select_key(e.key)
        return e

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF file", str(Path.home()), "GGUF models (*.gguf)")
        if path:
            self.select_path(path)

    def _on_model_selected(self, _index: int) -> None:
        e = self.entry(self.current_key())
        if e is None:
            return
        facts = e.facts
        lines = [f"<b>{e.name}</b> ({e.source_label})"]
        details = [("Architecture", facts.architecture), ("Format", facts.format.upper()),
                   ("Quantization", facts.quantization or "none"),
                   ("Parameters", fit.human_count(facts.num_params) if facts.num_params else None),
                   ("Context", f"{facts.context_length:,} tokens" if facts.context_length else None),
                   ("Size", fit.human_bytes(facts.size_bytes))]
        lines.append(" · ".join(f"{k}: {v}" for k, v in details if v))
        lines.append(f'<span style="color:#6b7280">{facts.path}</span>')
        self.summary.setText("<br>".join(lines))
        self.model_warning.setText("" if facts.supported else f"Kestrel may not load this model: {facts.reason}")
        self.model_warning.setVisible(not facts.supported)
        saved = self.ctx.store.model_settings(e.key).get("engine", {})
        self.form.set_values(saved)
        self._apply_availability()

    # ------------------------------------------------------------------------------------------------
    # availability and the estimate

    def _apply_availability(self) -> None:
        if self._applying:
            return
        self._applying = True
        try:
            self._apply_availability_now()
        finally:
            self._applying = False
        self._update_estimate()

    def _apply_availability_now(self) -> None:
        f = self.form
        caps = self.ctx.capabilities
        gpus = self.ctx.num_gpus
        f.set_choice_enabled("device", "cuda", gpus > 0, "no NVIDIA GPU found")
        on_gpu = self._device() == "cuda"
        if not caps.tensor_parallel:
            f.set_field_enabled("tensor_parallel_size", False, TP_REASON)
            f.set_value("tensor_parallel_size", 1)
        else:
            self._apply_tp_sizes(on_gpu)
        tp = f.values().get("tensor_parallel_size") or 1
        if not caps.tensor_parallel:
            f.set_field_enabled("comm_strategy", False, TP_REASON)
        elif tp < 2:
            f.set_field_enabled("comm_strategy", False, "applies with tensor-parallel size 2 or more")
        else:
            f.set_field_enabled("comm_strategy", True)
            for c in f.main.specs["comm_strategy"].choices:
                if c != "auto":
                    f.set_choice_enabled("comm_strategy", c, c in caps.comm_strategies, "not in this engine yet")
        f.set_choice_enabled("quantization", "int8", not on_gpu, "the int8 kernels run on the CPU")
        f.set_choice_enabled("quantization", "gguf", not on_gpu, "the GGUF block kernels run on the CPU")
        if on_gpu and f.values().get("quantization") in ("int8", "gguf"):
            f.set_value("quantization", "none")
        f.set_field_enabled("gpu_memory_utilization", on_gpu, "applies when the model runs on a GPU")
        f.set_field_enabled("kv_cache_memory_gib", not on_gpu, "applies when the model runs on the CPU")

    def _apply_tp_sizes(self, on_gpu: bool) -> None:
        """Offer the TP sizes the selected model splits into (engine.config.tp_size_fits: its attention and KV
        heads, and its MLP width): on a GPU up to the number of GPUs; on the CPU, where the ranks are processes
        sharing the cores, up to the form's limit. A size in between that does not fit steps on to the next one
        that does, in the direction the value moved."""
        f = self.form
        editor = f.main.editors["tensor_parallel_size"]
        e = self.entry(self.current_key())
        shape = e.facts.shape if e is not None else None
        form_max = RANGES["tensor_parallel_size"][1]
        limit = min(self.ctx.num_gpus, form_max) if on_gpu else form_max
        sizes = fit.tp_sizes(limit, shape)
        if len(sizes) < 2:
            if on_gpu and limit < 2:
                reason = f"needs two or more GPUs (found {limit})"
            else:
                where = ("2" if limit == 2 else f"2 to {limit}") + (" GPUs" if on_gpu else " processes")
                reason = (f"this model ({shape.num_attention_heads} attention heads, {shape.num_kv_heads} KV heads) "
                          f"does not split over {where}" if shape is not None else "")
            f.set_value("tensor_parallel_size", 1)
            f.set_field_enabled("tensor_parallel_size", False, reason)
            self._last_tp = 1
            return
        editor.setMaximum(sizes[-1])
        tp = f.values().get("tensor_parallel_size") or 1
        if tp not in sizes:
            up = [s for s in sizes if s > tp]
            down = [s for s in sizes if s < tp]
            tp = (up[0] if up else sizes[-1]) if tp > self._last_tp else (down[-1] if down else sizes[0])
            f.set_value("tensor_parallel_size", tp)
        self._last_tp = tp
        f.set_field_enabled("tensor_parallel_size", True)
        editor.setToolTip(editor.toolTip() + "\nSizes this model splits into"
                          + (" on these GPUs: " if on_gpu else " (CPU ranks share the cores): ")
                          + ", ".join(map(str, sizes)))

    def _device(self) -> str:
        device = self.form.values().get("device") or "auto"
        if device == "auto":
            return "cuda" if self.ctx.num_gpus > 0 else "cpu"
        return device

    def _on_options_changed(self) -> None:
        self._apply_availability()

    def _update_estimate(self) -> None:
        e = self.entry(self.current_key())
        if e is None:
            self.estimate.setText("")
            return
        facts = e.facts
        known, why = fit.can_estimate(facts)
        if not known:  # a garbage file: its size on disk is no estimate, and "it fits" would mislead
            self.estimate.setText(why)
            return
        values = self.form.values()
        device = self._device()
        dtype = values.get("dtype") or "auto"
        if dtype == "auto":
            dtype = ("bfloat16" if cpu_has_native_bf16() else "float32") if device == "cpu" else "bfloat16"
        context = values.get("max_model_len") or min(facts.context_length or ENGINE_DEFAULT_CONTEXT_CAP,
                                                     ENGINE_DEFAULT_CONTEXT_CAP)
        int8 = values.get("quantization") == "int8"
        weights = fit.weights_in_memory(facts.num_params, dtype, facts.size_bytes,
                                        self.ctx.capabilities.keeps_quantized_weights, values.get("quantization"))
        if weights is None:
            self.estimate.setText("Not enough information about this model for an estimate.")
            return
        tp = values.get("tensor_parallel_size") or 1
        snap = self.ctx.hardware_snapshot
        gguf_blocks = values.get("quantization") == "gguf"
        if int8:
            quant_note = " Weights are quantized to int8 while loading (about half of bfloat16's bytes per token)."
        elif gguf_blocks:
            quant_note = (" The file's Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K weights (linear layers, token "
                          "table, LM head) stay as their blocks (about the file's size); other types are dequantized.")
        elif facts.quantization and not self.ctx.capabilities.keeps_quantized_weights:
            quant_note = (f" The {facts.quantization} weights are dequantized to {dtype} when loaded; int8 "
                          "quantization keeps about half of that, and a .gguf file's blocks can stay as they are "
                          "(quantization: GGUF blocks kept).")
        else:
            quant_note = ""
        if device == "cuda" and snap is not None and snap.gpus:
            util = values.get("gpu_memory_utilization") or 0.9
            cap = min(g.memory_total or 0 for g in snap.gpus[:tp]) * util
            est = fit.estimate(weights, facts.shape, context, tp, dtype, int(cap), gpu=True)
            verdict = "fits" if est.fits else "does not fit"
            text = (f"{est.describe()} at context {context:,} and TP {tp}: {verdict} in "
                    f"{fit.gib(cap)} ({util:.0%} of each GPU's memory).")
        else:
            ram = snap.ram_total if snap is not None else None
            kv_pool = int((values.get("kv_cache_memory_gib") or 2.0) * fit.GIB)  # the engine's CPU default: 2 GiB
            per_token = facts.shape.kv_bytes_per_token(fit.DTYPE_BYTES[dtype]) if facts.shape else None
            total = weights + kv_pool + int(fit.CPU_OVERHEAD)
            room = (f" (room for about {kv_pool // per_token:,} tokens: {kv_pool // per_token // context:,} "
                    f"sequences of {context:,})" if per_token else "")
            verdict = "" if ram is None else (" It fits in this machine's memory." if total <= ram else
                                               " That is more than this machine's memory.")
            text = (f"About {fit.gib(total)} of RAM ({dtype}, CPU): weights {fit.gib(weights)}, KV cache "
                    f"{fit.gib(kv_pool)}{room}, overhead {fit.gib(fit.CPU_OVERHEAD)}"
                    f"{'; this machine has ' + fit.gib(ram) if ram else ''}.{verdict}")
        self.estimate.setText(text + quant_note)

    # ------------------------------------------------------------------------------------------------
    # loading

    def config(self) -> EngineConfig:
        e = self.entry(self.current_key())
        values = {k: v for k, v in self.form.values().items() if v is not None}
        return EngineConfig(model=(e.model_ref or None) if e is not None else None, **values)

    def load_selected(self) -> None:
        key = self.current_key() or EMBEDDED_KEY
        self.ctx.store.update_model_settings(key, engine=self.form.values())
        self.ctx.load_model(key, self.config())

    # (the engine worker lives on its own thread: a button wired straight to it would queue the call there)
    def cancel_load(self) -> None:
        self.engine.cancel_load()

    def unload(self) -> None:
        self.engine.unload()

    def autoload(self) -> None:
        """At start-up: the last model loaded (if it is still there), else the embedded default, with its
        saved settings. Runs before the library scan, from the saved preference alone."""
        last = self.ctx.store.pref("last_model") or {}
        key, model = last.get("key") or EMBEDDED_KEY, last.get("model") or ""
        if model and not Path(model).exists():
            key, model = EMBEDDED_KEY, ""
        values = {k: v for k, v in self.ctx.store.model_settings(key).get("engine", {}).items() if v is not None}
        names = {f.name for f in dataclasses.fields(EngineConfig)}
        values = {k: v for k, v in values.items() if k in names and k != "model"}
        self.ctx.load_model(key, EngineConfig(model=model or None, **values))

    def _on_state(self, state: str) -> None:
        loading = state == LOADING
        self.progress.setVisible(loading)
        self.progress_label.setVisible(loading)
        self.cancel_button.setVisible(loading)
        self.unload_button.setEnabled(state in (READY, DEAD))
        self.load_button.setEnabled(not loading)
        if loading:
            self.message.hide()
        if state == EMPTY and self.message.isHidden():
            self._show_message("No model is loaded.", "hint")
        if loading:
            self._load_started = time.monotonic()
            self._stage = "Starting the engine…"
            self._tick.start()
        else:
            self._tick.stop()

    def _on_progress(self, stage: str) -> None:
        self._stage = stage
        self._show_elapsed()

    def _show_elapsed(self) -> None:
        elapsed = time.monotonic() - self._load_started if self._load_started else 0.0
        self.progress_label.setText(f"{self._stage}  {elapsed:.0f} s")

    def _on_hardware(self, _snapshot) -> None:
        self._apply_availability()

    def _on_cancelled(self) -> None:
        self._show_message("Loading was cancelled.", "warningBox")

    def _on_unloaded(self) -> None:
        self._show_message("No model is loaded.", "hint")  # not the last load's (or failure's) message

    def _on_died(self, why: str) -> None:
        self._show_message(f"The engine stopped: {why}\nPress Load to start it again.", "errorBox")

    def _on_loaded(self, info) -> None:
        took = time.monotonic() - self._load_started if self._load_started else info.load_time
        config = self.ctx.engine.config
        quant = getattr(config, "quantization", None) if config is not None else None
        # int8: the engine requantized the linear layers; the dtype is then the activations' (as the status bar)
        weights = f"{quant} weights, {info.dtype} activations" if quant and quant != "none" else info.dtype
        graphs = getattr(info, "cuda_graph_sizes", None)
        graphs_text = (f" Decode CUDA graphs for {len(graphs)} batch sizes (1–{max(graphs)}) captured in "
                       f"{info.cuda_graph_seconds:.1f} s." if graphs else "")
        self._show_message(
            f"Loaded {info.name}: {weights} on {info.device}, context {info.max_model_len:,} tokens, "
            f"{info.num_kv_blocks:,} KV blocks of {info.block_size} tokens, in {took:.1f} s.{graphs_text}", "okBox")

    def _on_failed(self, message: str) -> None:
        self._show_message(f"The model could not be loaded.\n{message}", "errorBox")

    def _show_message(self, text: str, kind: str) -> None:
        self.message.setObjectName(kind)
        self.message.setText(text)
        self.message.style().unpolish(self.message)
        self.message.style().polish(self.message)
        self.message.show()

    def error_text(self) -> str:
        return self.message.text() if self.message.objectName() == "errorBox" and not self.message.isHidden() else ""


class ConfigFormPair:
    """The main and the advanced halves of the EngineConfig form, acting as one."""

    def __init__(self, main: list[str], advanced: list[str]):
        from app.widgets.config_form import ConfigForm

        kw = {"labels": LABELS, "ranges": RANGES, "none_text": NONE_TEXT, "choice_labels": CHOICE_LABELS,
              "suffixes": SUFFIXES}
        self.main = ConfigForm(EngineConfig, main, **kw)
        self.advanced = ConfigForm(EngineConfig, advanced, **kw)
        self.changed = _MergedSignal(self.main.changed, self.advanced.changed)

    def _owner(self, name: str):
        return self.main if name in self.main.editors else self.advanced

    def values(self) -> dict:
        return {**self.main.values(), **self.advanced.values()}

    def set_values(self, values: dict) -> None:
        self.main.set_values(values)
        self.advanced.set_values(values)

    def set_value(self, name: str, value) -> None:
        owner = self._owner(name)
        if owner.values().get(name) != value:
            owner.set_value(name, value)

    def set_field_enabled(self, name: str, enabled: bool, reason: str = "") -> None:
        self._owner(name).set_field_enabled(name, enabled, reason)

    def set_choice_enabled(self, name: str, choice: str, enabled: bool, reason: str = "") -> None:
        self._owner(name).set_choice_enabled(name, choice, enabled, reason)


class _MergedSignal:
    def __init__(self, *signals):
        self.signals = signals

    def connect(self, slot) -> None:
        for s in self.signals:
            s.connect(slot)
