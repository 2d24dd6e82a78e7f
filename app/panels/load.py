"""Load: pick a model and the engine options (a form derived from EngineConfig), see what it will take in
memory, load with progress and cancel. Options the engine or this machine lacks are disabled with the reason.
A failed load is explained in place and the app stays usable. Settings are kept per model.

The options form is app.panels.load_form, which options this machine allows and the memory estimate
app.panels.load_options, the GPUs' facts app.hardware."""

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
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app import fit
from app.context import AppContext
from app.library import EMBEDDED_KEY, LibraryEntry
from app.model_inspect import inspect_model
from app.panels.load_form import MAIN_FIELDS, ConfigFormPair
from app.panels.load_options import OptionsMixin
from app.workers.engine_worker import DEAD, EMPTY, LOADING, READY, restart_text
from engine.config import EngineConfig

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


def tool_mode_text(mode: dict | None) -> str:
    """What tool_choice "auto" (what agent frameworks send) does on the loaded model, from engine.server.openai.tools
    ``tool_mode`` (GET /v1/server_info's ``tools`` says the same): the chat template's own tool support, or Kestrel's
    built-in tool prompt where the template takes no tools; the parser that reads the calls."""
    if mode is None:
        return ""
    parser = f"read by the {mode.get('parser')} parser"
    if mode.get("auto") == "builtin_prompt":
        how = ("its chat template takes no tools, so Kestrel's built-in tool prompt describes them and asks for "
               f"<tool_call> blocks, {parser}")
    else:
        how = f"its chat template's own tool support, calls {parser}"
    grammar = "; a grammar keeps each call's arguments valid" if mode.get("grammar") else ""
    return (f"Tool calling (loaded model): {how}{grammar}. kestrel serve chooses with --chat-template and "
            "--tool-call-parser.")


class LoadPanel(OptionsMixin, QWidget):
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
        self.tool_mode = QLabel()  # which tool calling applies to the loaded model (tool_mode_text)
        self.tool_mode.setObjectName("hint")
        self.tool_mode.setWordWrap(True)
        self.tool_mode.hide()
        ml.addWidget(self.tool_mode)
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
                   ("Parameters", fit.params_text(facts.num_params, facts.shape) if facts.num_params else None),
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
        self.tool_mode.hide()
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
        self.tool_mode.setText(tool_mode_text(self.engine.tool_mode))
        self.tool_mode.setVisible(self.engine.tool_mode is not None)

    def _on_failed(self, message: str) -> None:
        self.tool_mode.hide()
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
