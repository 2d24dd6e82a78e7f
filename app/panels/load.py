"""Load: pick a model and the engine options (a form derived from EngineConfig), see what it will take in
memory, load with progress and cancel. Options the engine or this machine lacks are disabled with the reason.
A failed load is explained in place and the app stays usable. Settings are kept per model."""

from __future__ import annotations

import dataclasses
import functools
import json
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
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app import fit
from app.capabilities import TP_REASON
from app.context import AppContext
from app.hardware import cpu_has_native_bf16
from app.library import EMBEDDED_KEY, LibraryEntry
from app.model_inspect import inspect_model
from app.workers.engine_worker import DEAD, EMPTY, LOADING, READY, restart_text
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
    "quantization": {"auto": "Auto (a .gguf file's blocks kept on the CPU; otherwise the checkpoint's own weights)",
                     "none": "None (the checkpoint's own weights; a .gguf file dequantized to the chosen dtype)",
                     "int8": "int8 (CPU or GPU: 8-bit weights; ~2x smaller than bf16)",
                     "int4": "int4 (GPU: 4-bit weights, groups of 128; ~3.8x smaller than bf16)",
                     "fp8": "fp8 (GPU: 8-bit float weights; ~2x smaller than bf16)",
                     "gguf": "GGUF blocks kept (CPU: Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K)"},
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
GPU_KERNELS_REASON = "runs on the GPU kernels"
# the strategies that need GPUs: on the CPU the ranks all-reduce through shared memory (host, int8)
GPU_COMM_REASONS = {"nccl": "needs NVIDIA GPUs", "overlap": "needs a GPU's second stream"}
# what a chosen quantization does to the linear layers, for the estimate's note ({dtype}: the load dtype)
# (the engine puts the LM head in int8 under every GPU mode: engine/layers/embedding.py quantize_head)
GPU_QUANT_NOTES = {
    "int8": "The linear layers and the LM head are quantized to int8 while loading (a scale per output channel: "
            "~1 byte a weight); the token embeddings stay {dtype}.",
    "int4": "The linear layers are quantized to 4 bits while loading (groups of 128 with a scale and zero point: "
            "~0.52 bytes a weight), the LM head to int8; the token embeddings stay {dtype}.",
    "fp8": "The linear layers are quantized to fp8 (e4m3) while loading (a scale per output channel: ~1 byte a "
           "weight), the LM head to int8; the token embeddings stay {dtype}.",
}


def gpu_compute_capability(gpu) -> tuple[int, int] | None:
    """A GPU's CUDA compute capability, e.g. (8, 9): from its hardware facts where they carry it, else from NVML by
    its PCI bus id (once per GPU); None when unknown."""
    cc = getattr(gpu, "compute_capability", None)
    if cc:
        return int(cc[0]), int(cc[1])
    bus = getattr(gpu, "bus_id", "") or ""
    return _nvml_compute_capability(bus) if bus else None


@functools.lru_cache(maxsize=None)
def _nvml_compute_capability(bus_id: str) -> tuple[int, int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return int(major), int(minor)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


@functools.lru_cache(maxsize=64)
def _checkpoint_bits(config_path: str) -> int | None:
    try:
        qc = json.loads(Path(config_path).read_text()).get("quantization_config") or {}
        bits = qc.get("bits", qc.get("w_bit"))
        return int(bits) if bits else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def checkpoint_quantization(facts) -> str:
    """A pre-quantized checkpoint's format in words: "GPTQ int4", "AWQ int4", "FP8"."""
    method = (facts.quantization or "").upper()
    bits = _checkpoint_bits(str(Path(facts.path) / "config.json")) if method in ("GPTQ", "AWQ") else None
    return f"{method} int{bits}" if bits else method


def _tokens(n: int) -> str:
    """A context limit rounded down: 45k tokens, 700 tokens."""
    return f"{n // 1024}k tokens" if n >= 1024 else f"{n:,} tokens"


def _an(words: str) -> str:
    """The article before a number said aloud: an 8k, an 11k, an 18,000-token; a 16k, a 128k."""
    lead = words.split("k")[0].split(",")[0].split("-")[0]
    return "an" if lead.startswith("8") or lead in ("11", "18") else "a"


def weights_text(info, config) -> str:
    """The loaded weights in a few words, for the status bar and the Load panel: what the load option
    --quantization did (``info.quantization_mode``: auto resolved), "Q4_1 blocks kept, bfloat16 activations",
    "int8 weights, bfloat16 activations", or the dtype alone for float weights (a dequantized GGUF file)."""
    option = getattr(config, "quantization", None) if config is not None else None
    mode = getattr(info, "quantization_mode", "") or option or "none"
    if mode == "gguf":
        return f"{info.quantization or 'GGUF'} blocks kept, {info.dtype} activations"
    if mode not in ("none", "auto"):  # int8 / int4 / fp8: the engine requantized the linear layers
        return f"{mode} weights, {info.dtype} activations"
    return info.dtype


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
        self._fit_problem = ""
        self._loaded_key: str | None = None  # the settings key of the model loaded (a failed load brings it back)
        self._reverted = ""  # loadReverted's words, shown with the next `loaded`
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
        self.engine.loadReverted.connect(self._on_reverted)
        self.engine.restartAttempt.connect(self._on_restart_attempt)
        self.engine.engineGaveUp.connect(self._on_gave_up)
        self.engine.engineRestarted.connect(self._on_restarted)
        self.engine.loadCancelled.connect(self._on_cancelled)
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
        outer.addWidget(scroll, 1)
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
        # the quantization choices carry the reasons they are off: sized by a short label, not the longest of them
        # (which would widen the page), with a popup as wide as its items
        quant = self.form.main.editors["quantization"]
        quant.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        quant.setMinimumContentsLength(36)
        root.addWidget(opts)

        est = QGroupBox("Memory estimate")
        el = QVBoxLayout(est)
        self.estimate = QLabel()
        self.estimate.setWordWrap(True)
        el.addWidget(self.estimate)
        root.addWidget(est)

        root.addStretch(1)
        # Load, its progress and its message stay in view under the scrolling form (a 700 px high window)
        bottom = QWidget()
        bottom.setObjectName("page")
        bottom.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)  # its whole height; the form scrolls
        root = QVBoxLayout(bottom)
        root.setContentsMargins(20, 8, 20, 12)
        outer.addWidget(bottom)
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
        self.model_combo.addItem("", e.key)
        self._label_item(self.model_combo.count() - 1, e)

    def _label_item(self, i: int, e: LibraryEntry) -> None:
        facts = e.facts
        bits = [b for b in (facts.quantization_name or facts.quantization, fit.human_bytes(facts.size_bytes)) if b]
        text = f"{e.name}  —  {', '.join(bits)}" + ("" if facts.supported else "  (cannot be loaded)")
        self.model_combo.setItemText(i, text)
        self.model_combo.setItemData(i, facts.reason or str(facts.path), Qt.ToolTipRole)

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
        details = [("Architecture", facts.architecture), ("Format", facts.format_text),
                   # nothing is known of an unreadable file's quantization: no line rather than "none"
                   ("Quantization", (facts.quantization_name or facts.quantization or "none") if facts.readable
                    else None),
                   ("Parameters", fit.human_count(facts.num_params) if facts.num_params else None),
                   ("Context", f"{facts.context_length:,} tokens" if facts.context_length else None),
                   ("Size", fit.human_bytes(facts.size_bytes))]
        lines.append(" · ".join(f"{k}: {v}" for k, v in details if v))
        lines.append(f'<span style="color:#6b7280">{facts.path}</span>')
        self.summary.setText("<br>".join(lines))
        if self.message.text().startswith("Not loaded."):  # a refusal was about the model chosen before
            self.message.hide()
        self.model_warning.setText("" if facts.supported else f"Kestrel cannot load this: {facts.reason}")
        self.model_warning.setVisible(not facts.supported)
        self._update_load_button()
        saved = self.ctx.store.model_settings(e.key).get("engine", {})
        self.form.set_field_note("tensor_parallel_size", "")
        self._last_tp = saved.get("tensor_parallel_size") or 1
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
                if c == "auto":
                    continue
                if c not in caps.comm_strategies:
                    f.set_choice_enabled("comm_strategy", c, False, "not in this engine yet")
                elif not on_gpu and c in GPU_COMM_REASONS:  # only what runs on the CPU ranks
                    f.set_choice_enabled("comm_strategy", c, False, GPU_COMM_REASONS[c])
                else:
                    f.set_choice_enabled("comm_strategy", c, True)
        self._apply_quantization_choices(on_gpu)
        self._apply_kv_dtype_choices(on_gpu)
        f.set_field_enabled("gpu_memory_utilization", on_gpu, "applies when the model runs on a GPU")
        f.set_field_enabled("kv_cache_memory_gib", not on_gpu, "applies when the model runs on the CPU")

    def _apply_quantization_choices(self, on_gpu: bool) -> None:
        """CPU: auto, none, int8, gguf (int4 and fp8 are GPU kernels). GPU: auto, none, int8, int4, and fp8 where every
        GPU in use has FP8 tensor cores (compute capability 8.9+; kept on where that is unknown, and the estimate says
        so); gguf blocks are CPU kernels. A value the device does not offer goes back to auto."""
        f = self.form
        f.set_choice_enabled("quantization", "int8", True)
        for q in fit.GPU_ONLY_QUANTIZATIONS:
            f.set_choice_enabled("quantization", q, on_gpu, GPU_KERNELS_REASON)
        if on_gpu:
            f.set_choice_enabled("quantization", "fp8", self._fp8_ok() is not False, fit.FP8_REASON)
        f.set_choice_enabled("quantization", "gguf", not on_gpu, "the GGUF block kernels run on the CPU")
        quant = f.values().get("quantization") or "auto"
        if not f.main.is_choice_enabled("quantization", quant):
            f.set_value("quantization", "auto")
        view = f.main.editors["quantization"].view()
        view.setMinimumWidth(view.sizeHintForColumn(0) + 2 * view.frameWidth() + 8)

    def _apply_kv_dtype_choices(self, on_gpu: bool) -> None:
        """--kv-cache-dtype fp8 (an e4m3 cache: twice the tokens) needs a GPU with FP8 support (compute capability
        8.9+, the engine's check); on the CPU and older GPUs it is off with the reason, and a chosen fp8 goes back
        to auto."""
        f = self.form
        owner = f._owner("kv_cache_dtype")
        if "kv_cache_dtype" not in owner.editors:
            return
        if not on_gpu:
            f.set_choice_enabled("kv_cache_dtype", "fp8", False, "needs a GPU: the CPU keeps the model dtype")
        else:
            f.set_choice_enabled("kv_cache_dtype", "fp8", self._fp8_ok() is not False, fit.FP8_REASON)
        if not owner.is_choice_enabled("kv_cache_dtype", f.values().get("kv_cache_dtype") or "auto"):
            f.set_value("kv_cache_dtype", "auto")

    def _kv_dtype(self, dtype: str) -> str:
        """The KV cache's element type for the estimate: fp8 (1 byte) when chosen, else the model dtype."""
        return "fp8" if self.form.values().get("kv_cache_dtype") == "fp8" else dtype

    def _gpus_in_use(self) -> list:
        """The GPUs a load would use: the first tensor-parallel-size of them."""
        snap = self.ctx.hardware_snapshot
        if snap is None or not snap.gpus:
            return []
        tp = self.form.values().get("tensor_parallel_size") or 1
        return list(snap.gpus[:max(1, tp)])

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
        # any size up to the limit may be typed: one the model does not split into is replaced by the next that does
        # (in the direction the value moved), and the note beside the field says why and which sizes work
        editor.setMaximum(limit)
        tp = f.values().get("tensor_parallel_size") or 1
        works = ", ".join(map(str, sizes))
        if tp not in sizes:
            up = [s for s in sizes if s > tp]
            down = [s for s in sizes if s < tp]
            new = (up[0] if up else sizes[-1]) if tp > self._last_tp else (down[-1] if down else sizes[0])
            why = fit.tp_misfit(tp, shape) or "it does not split this model"
            f.set_field_note("tensor_parallel_size", f"{tp} is not possible: {why}. Using {new}; sizes that work "
                                                     f"here: {works}.")
            f.set_value("tensor_parallel_size", new)
            tp = new
        elif tp != self._last_tp:
            f.set_field_note("tensor_parallel_size", "")
        self._last_tp = tp
        f.set_field_enabled("tensor_parallel_size", True)
        editor.setToolTip(editor.toolTip() + "\nSizes this model splits into"
                          + (" on these GPUs: " if on_gpu else " (CPU ranks share the cores): ") + works)

    def _device(self) -> str:
        device = self.form.values().get("device") or "auto"
        if device == "auto":
            return "cuda" if self.ctx.num_gpus > 0 else "cpu"
        return device

    def _on_options_changed(self) -> None:
        self._apply_availability()

    def _update_estimate(self) -> None:
        self._fit_problem = ""  # set when the estimate says the model does not fit (the Load check refuses then)
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
        quant = values.get("quantization") or "auto"
        tp = values.get("tensor_parallel_size") or 1
        snap = self.ctx.hardware_snapshot
        on_gpu = device == "cuda" and snap is not None and bool(snap.gpus)
        wb = self._weights(facts, quant, dtype, on_gpu)
        if wb is None:
            self.estimate.setText("Not enough information about this model for an estimate.")
            return
        note = self._quant_note(facts, quant, dtype, on_gpu, wb)
        if on_gpu:
            text = self._gpu_estimate(facts, wb, quant, dtype, context, tp)
        else:
            text = self._cpu_estimate(facts, wb, dtype, context, tp, values)
        text += f"\n{note}" if note else ""
        self.estimate.setText(text.replace(" GiB", "\u00a0GiB"))  # a size never wraps from its unit

    def _cpu_estimate(self, facts, wb: fit.WeightBytes, dtype: str, context: int, tp: int, values: dict) -> str:
        """RAM for a CPU load. Each tensor-parallel rank is a process with its own KV-cache pool of the chosen size
        (engine ModelRunner._fixed_kv_blocks, then the executor takes the ranks' minimum) and its own overhead; a
        rank holds only its share of the KV heads, so the pool has room for more tokens."""
        snap = self.ctx.hardware_snapshot
        ram = snap.ram_total if snap is not None else None
        kv_pool = int((values.get("kv_cache_memory_gib") or 2.0) * fit.GIB)  # the engine's CPU default: 2 GiB
        per_token = facts.shape.kv_bytes_per_token(fit.DTYPE_BYTES[dtype], tp) if facts.shape else None
        total = wb.total + tp * (kv_pool + int(fit.CPU_OVERHEAD))
        tokens = kv_pool // per_token if per_token else 0
        room = f"room for about {tokens:,} tokens: {tokens // context:,} sequences of {context:,}" if per_token else ""
        if tp > 1:
            share = ""
            if facts.shape is not None:
                heads = max(1, -(-facts.shape.num_kv_heads // tp))
                share = f"each holds {heads} of the {facts.shape.num_kv_heads} KV heads, so "
            kv = (f"KV cache {tp} x {fit.gib(kv_pool)} (one pool per rank; {share}"
                  f"{room or 'room for more tokens per pool'})")
            where, over = f"CPU, {tp} ranks", f"{tp} x {fit.gib(fit.CPU_OVERHEAD)}"
            weights = f"weights {fit.gib(wb.total)} split over the ranks"
        else:
            kv = f"KV cache {fit.gib(kv_pool)}" + (f" ({room})" if room else "")
            where, over = "CPU", fit.gib(fit.CPU_OVERHEAD)
            weights = f"weights {fit.gib(wb.total)}"
        if ram is not None and total > ram:
            self._fit_problem = (f"it needs about {fit.gib(total)} of RAM and this machine has {fit.gib(ram)} "
                                 "(a smaller KV-cache memory, int8 weights or fewer ranks need less)")
        verdict = "" if ram is None else (" It fits in this machine's memory." if total <= ram else
                                           " That is more than this machine's memory.")
        return (f"About {fit.gib(total)} of RAM ({dtype}, {where}): {weights}, {kv}, overhead {over}"
                f"{'; this machine has ' + fit.gib(ram) if ram else ''}.{verdict}")

    def _weights(self, facts, quant: str, dtype: str, gpu: bool) -> fit.WeightBytes | None:
        return fit.weights_bytes(facts.num_params, dtype, facts.size_bytes,
                                 self.ctx.capabilities.keeps_quantized_weights, quant, facts.shape, gpu=gpu,
                                 prequantized=fit.prequantized_method(facts),
                                 fp8_ok=self._fp8_ok() if gpu else None)

    def _fp8_ok(self) -> bool | None:
        """Whether the GPUs in use have FP8 tensor cores (None: a compute capability is unknown)."""
        return fit.fp8_supported([gpu_compute_capability(g) for g in self._gpus_in_use()])

    def _gpu_estimate(self, facts, wb: fit.WeightBytes, quant: str, dtype: str, context: int, tp: int) -> str:
        """The verdict for the chosen TP size in the user's terms ("Fits on 4 x 24 GiB with a 16k context" /
        "Does not fit: needs ~27.1 GiB per GPU, the GPUs have 24 GiB ...; try int4 or ..."), then the per-GPU
        breakdown."""
        util = self.form.values().get("gpu_memory_utilization") or 0.9
        gpus = self._gpus_in_use()
        mem = min(g.memory_total or 0 for g in gpus)
        cap = int(mem * util)
        est = fit.estimate(wb.total, facts.shape, context, tp, self._kv_dtype(dtype), cap or None, gpu=True)
        n = len(gpus)
        if not mem:  # NVML gave no memory size: the need without a verdict
            return (f"About {est.describe()} at context {context:,} and TP {tp}; the GPU memory could not be read, "
                    "so Kestrel cannot tell whether it fits.")
        box = fit.gib_round(mem)
        ctx_words = fit.context_words(context)
        need = f"~{fit.gib(est.total)}" + (" per GPU" if n > 1 else "")
        if est.fits:
            where = f"one {box} GPU" if n == 1 else f"{n} x {box}"
            head = (f"Fits on {where} with {_an(ctx_words)} {ctx_words} context: {need} of the {fit.gib(cap)} the "
                    f"engine may use ({util:.0%}).")
        else:
            have = "the GPU has" if n == 1 else "the GPUs have"
            tries = self._fit_suggestions(facts, wb, quant, dtype, context, tp, util)
            head = f"Does not fit: needs {need}, {have} {box} ({fit.gib(cap)} at the {util:.0%} share); {tries}."
            self._fit_problem = (f"it needs {need} of GPU memory, {have} {box} ({fit.gib(cap)} at the {util:.0%} "
                                 f"share); {tries}")
        if wb.from_file:
            what = "about the files' size"
        elif quant in GPU_QUANT_NOTES:
            parts = [(f"{quant} linear layers", wb.linear), ("int8 LM head", wb.head),
                     (f"{dtype} embeddings", wb.other)]
            what = ", ".join(f"{words} {fit.gib(-(-n // tp))}" for words, n in parts if n)
        else:
            what = dtype
        per = "Per GPU" if n > 1 else "On the GPU"
        kv_what = " in fp8" if self._kv_dtype(dtype) == "fp8" else ""
        return (f"{head}\n{per}: weights {fit.gib(est.weights)} ({what}), KV cache{kv_what} {fit.gib(est.kv_cache)} "
                f"for one {ctx_words} sequence, overhead {fit.gib(est.overhead)}.")

    def _fit_suggestions(self, facts, wb: fit.WeightBytes, quant: str, dtype: str, context: int, tp: int,
                         util: float) -> str:
        """What would make the model fit, each change alone: a smaller weight format the device offers, a larger
        TP size, a shorter context; else a smaller format with a larger TP size; else more or larger GPUs."""
        snap = self.ctx.hardware_snapshot
        main = self.form.main
        kv_dtype = self._kv_dtype(dtype)

        def capacity(size: int) -> int:
            return int(min(g.memory_total or 0 for g in snap.gpus[:size]) * util)

        def fits(w: fit.WeightBytes, size: int, ctx: int) -> bool:
            return bool(fit.estimate(w.total, facts.shape, ctx, size, kv_dtype, capacity(size), gpu=True).fits)

        formats = []  # (words, weights) smaller than now, least lossy first
        for group in (("int8", "fp8"), ("int4",)):
            names = [q for q in group if q != quant and main.is_choice_enabled("quantization", q)]
            w = self._weights(facts, names[0], dtype, True) if names else None
            if w is not None and w.total < wb.total:
                formats.append((" or ".join(names), w))
        sizes = []
        if main.is_field_enabled("tensor_parallel_size"):
            limit = min(len(snap.gpus), RANGES["tensor_parallel_size"][1])
            sizes = [s for s in fit.tp_sizes(limit, facts.shape) if s > tp]
        tries = []
        fmt = next((words for words, w in formats if fits(w, tp, context)), None)
        if fmt:
            tries.append(fmt)
        size = next((s for s in sizes if fits(wb, s, context)), None)
        if size:
            tries.append(f"tensor-parallel size {size}")
        longest = fit.max_context(capacity(tp), wb.total, facts.shape, tp, kv_dtype) or 0
        if longest >= 256:
            tries.append(f"a context of at most {_tokens(longest)}")
        if tries:
            return "try " + (", ".join(tries[:-1]) + ", or " + tries[-1] if len(tries) > 1 else tries[0])
        for words, w in formats:  # two changes together, the least lossy format first
            size = next((s for s in sizes if fits(w, s, context)), None)
            if size:
                return f"try {words} with tensor-parallel size {size}"
            longest = fit.max_context(capacity(tp), w.total, facts.shape, tp, kv_dtype) or 0
            if longest >= 256:
                return f"try {words} with a context of at most {_tokens(longest)}"
        return "it needs more or larger GPUs (or a smaller model)"

    def _quant_note(self, facts, quant: str, dtype: str, on_gpu: bool, wb: fit.WeightBytes) -> str:
        """What the chosen quantization (or the checkpoint's own) does to the weights in memory."""
        caps = self.ctx.capabilities
        if fit.prequantized_method(facts):
            what = checkpoint_quantization(facts)
            if wb.from_file:  # on a GPU: kept as they are, whatever the mode (only a float LM head is requantized)
                also = ("" if quant in ("none", "auto") else
                        f"; {quant} applies only to layers the checkpoint keeps in float")
                return f"The checkpoint's {what} weights stay quantized on the GPU (about the files' size){also}."
            ratio = wb.total / facts.size_bytes if facts.size_bytes else 0
            times = f": ~{ratio:.1f}x the files' size" if ratio else ""
            where = "on this GPU (no FP8 tensor cores)" if on_gpu else "on the CPU"
            then = "" if quant in ("none", "auto") else f", then quantized to {quant}"
            return f"The checkpoint's {what} weights are dequantized to {dtype} {where}{then}{times}."
        if quant == "int8" and not on_gpu:
            return "Weights are quantized to int8 while loading (about half of bfloat16's bytes per token)."
        if quant in GPU_QUANT_NOTES and on_gpu:
            note = GPU_QUANT_NOTES[quant].format(dtype=dtype)
            if quant == "fp8" and self._fp8_ok() is None:
                note += f" fp8 {fit.FP8_REASON}; this GPU's compute capability could not be read."
            return note
        if quant == "gguf" or (quant == "auto" and wb.from_file and facts.format == "gguf" and not on_gpu):
            return ("The file's Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K weights (linear layers, token "
                    "table, LM head) stay as their blocks (about the file's size); other types are dequantized.")
        if facts.quantization and facts.format == "gguf" and (quant == "none" or on_gpu or (
                quant == "auto" and not caps.keeps_quantized_weights)):
            if on_gpu:
                return (f"The {facts.quantization} weights are dequantized to {dtype} when loaded; int8 or fp8 "
                        "quantization keeps about half of that, int4 about a quarter.")
            return (f"The {facts.quantization} weights are dequantized to {dtype} when loaded; int8 quantization "
                    "keeps about half of that, and a .gguf file's blocks can stay as they are (quantization: GGUF "
                    "blocks kept).")
        return ""

    # ------------------------------------------------------------------------------------------------
    # loading

    def config(self) -> EngineConfig:
        e = self.entry(self.current_key())
        values = {k: v for k, v in self.form.values().items() if v is not None}
        return EngineConfig(model=(e.model_ref or None) if e is not None else None, **values)

    def load_problem(self) -> str:
        """Why the selected model must not replace the one loaded, checked now, before anything is unloaded: its
        file read again (the header, the architecture, the tensor types: a file can change after the library
        scan), and the memory estimate's verdict for the chosen options. "" when it may load."""
        e = self.entry(self.current_key())
        if e is None:
            return ""
        fresh = inspect_model(e.facts.path)
        if fresh.supported != e.facts.supported or fresh.reason != e.facts.reason:
            e.facts = fresh  # what the file is now: the summary, the warning and the estimate follow
            self._label_item(self.model_combo.currentIndex(), e)
            self._on_model_selected(self.model_combo.currentIndex())
        if not fresh.supported:
            return f"Kestrel cannot load {e.name}: {fresh.reason}"
        self._update_estimate()
        if self._fit_problem:
            return f"{e.name} does not fit: {self._fit_problem}."
        return ""

    def load_selected(self) -> bool:
        """Load the selected model with the form's options, after load_problem's check: a model that cannot load
        is refused here, and the one loaded (if any) keeps working."""
        key = self.current_key() or EMBEDDED_KEY
        problem = self.load_problem()
        if problem:
            info = self.engine.info if self.engine.state == READY else None
            kept = f"\n{info.name} is still loaded." if info is not None else ""
            self._show_message(f"Not loaded. {problem}{kept}", "errorBox")
            self._update_load_button()
            return False
        self.ctx.store.update_model_settings(key, engine=self.form.values())
        self.ctx.load_model(key, self.config())
        return True

    def _update_load_button(self) -> None:
        """Load is off while loading, and for a model Kestrel cannot load (the reason in its tooltip)."""
        e = self.entry(self.current_key())
        bad = e is not None and not e.facts.supported
        self.load_button.setEnabled(self.engine.state != LOADING and not bad)
        self.load_button.setToolTip(f"Kestrel cannot load this: {e.facts.reason}" if bad else
                                    "Load the chosen model (the model loaded now is unloaded first)")

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
        self._update_load_button()
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

    # the engine died: while it restarts by itself each attempt shows, and "Press Load" only once it gave up
    def _on_restart_attempt(self, attempt: int, most: int, why: str) -> None:
        self._show_message(f"{restart_text(attempt, most)}: {why}", "warningBox")

    def _on_gave_up(self, reason: str) -> None:
        self._show_message(f"The engine stopped: {reason}\nPress Load to start it again.", "errorBox")

    def _on_restarted(self, notice: str) -> None:
        self._show_message(notice, "okBox")

    def _on_reverted(self, text: str) -> None:
        """The chosen model failed in the engine and the one before is being loaded again (``loaded`` follows):
        its key is the model's again (the chat's settings, the model picker, the next start's autoload)."""
        self._reverted = text
        key, config = self._loaded_key, self.engine.config
        if key is not None and config is not None:
            self.ctx.model_key = key
            self.ctx.store.set_pref("last_model", {"key": key, "model": config.model or ""})
            self.ctx.modelChosen.emit(key)

    def _on_loaded(self, info) -> None:
        self._loaded_key = self.ctx.model_key
        reverted, self._reverted = self._reverted, ""
        # (after a failed load the engine's own time for the model loaded again, not the time since Load)
        took = time.monotonic() - self._load_started if self._load_started and not reverted else info.load_time
        weights = weights_text(info, self.ctx.engine.config)  # as the status bar says it
        graphs = getattr(info, "cuda_graph_sizes", None)
        graphs_text = (f" Decode CUDA graphs for {len(graphs)} batch sizes (1–{max(graphs)}) captured in "
                       f"{info.cuda_graph_seconds:.1f} s." if graphs else "")
        self._show_message(
            f"Loaded {info.name}: {weights} on {info.device}, context {info.max_model_len:,} tokens, "
            f"{info.num_kv_blocks:,} KV blocks of {info.block_size} tokens, in {took:.1f} s.{graphs_text}", "okBox")
        if reverted:
            self._show_message(f"{reverted}\n{self.message.text()}", "warningBox")

    def _on_failed(self, message: str) -> None:
        self._show_message(f"The model could not be loaded.\n{message}", "errorBox")

    def _show_message(self, text: str, kind: str) -> None:
        self.message.setObjectName(kind)
        self.message.setText(text)
        self.message.style().unpolish(self.message)
        self.message.style().polish(self.message)
        # the box's padding came with the new style; a word-wrapped label's height for its width leaves it out,
        # which cut the box under the form: at least the text's lines at this width plus the padding
        width = max(200, self.width() - 40)  # the box spans the panel (its own width is stale while hidden)
        pad = self.message.contentsMargins().top() + self.message.contentsMargins().bottom()
        self.message.setMinimumHeight(0)  # heightForWidth is never below the minimum: the last message's would stay
        self.message.setMinimumHeight(self.message.heightForWidth(width) + pad + 20)  # the style sheet padding
        self.message.updateGeometry()
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

    def set_field_note(self, name: str, note: str) -> None:
        self._owner(name).set_field_note(name, note)


class _MergedSignal:
    def __init__(self, *signals):
        self.signals = signals

    def connect(self, slot) -> None:
        for s in self.signals:
            s.connect(slot)
