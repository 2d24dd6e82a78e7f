"""The chat view's model picker: the library's runnable models with the loaded one selected; choosing another
loads it the way the Load panel does (``AppContext.load_model`` with the model's saved engine settings; the Load
panel follows). The chat panel disables it while a reply streams; it refuses a pick while a model loads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox

from app.context import AppContext
from app.model_inspect import inspect_model
from app.workers.engine_worker import DEAD, LOADING, READY
from engine.config import EngineConfig


class ModelPicker(QComboBox):
    problem = Signal(str)  # a model that cannot be loaded with its saved settings: what to do, in words

    def __init__(self, ctx: AppContext, busy: Callable[[], bool]):
        super().__init__()
        self.ctx = ctx
        self.engine = ctx.engine
        self._busy = busy  # a reply is streaming: no switch now
        self.setObjectName("modelPicker")
        self.setMinimumContentsLength(16)
        self.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.setMaximumWidth(400)  # a long Hub name is elided, not the whole chat pushed aside
        self.setPlaceholderText("No model loaded: choose one")
        self.setToolTip("The model to chat with. Choosing another loads it with its settings from the Load "
                        "panel; the conversation stays.")
        self.activated.connect(self.pick)
        ctx.library.changed.connect(self.refresh)
        ctx.modelChosen.connect(lambda _key: self.select_loaded())
        self.refresh()

    def refresh(self) -> None:
        """List the library's runnable models (and the loaded one, if the library does not have it yet)."""
        self.blockSignals(True)
        self.clear()
        entries = [e for e in self.ctx.library.entries if e.facts.supported]
        names = [e.name for e in entries]
        for e in entries:  # the same file in two places (embedded, models folder): say which
            self.addItem(e.name if names.count(e.name) == 1 else f"{e.name} ({e.source_label})", e.key)
            bits = [b for b in (e.facts.quantization_name or e.facts.quantization, e.source_label) if b]
            self.setItemData(self.count() - 1, f"{e.name} ({', '.join(bits)})\n{e.facts.path}", Qt.ToolTipRole)
        key = self.ctx.model_key
        if key and self.findData(key) < 0 and self._has_model():
            info = self.engine.info
            self.addItem(info.name if info is not None else key.split(":", 1)[-1], key)
        self.blockSignals(False)
        self.select_loaded()

    def _has_model(self) -> bool:
        return self.engine.state in (READY, LOADING, DEAD)

    def select_loaded(self) -> None:
        key = self.ctx.model_key if self._has_model() else None
        i = self.findData(key) if key else -1
        if key and i < 0:
            self.refresh()  # a model the list does not have yet (a file chosen in the Load panel)
            return
        self.setCurrentIndex(i)

    def pick(self, index: int) -> None:
        """The user chose item ``index``: load it (not while a reply streams or a model loads)."""
        key = self.itemData(index)
        if key is None or self._busy() or self.engine.state == LOADING:
            self.select_loaded()
            return
        if key == self.ctx.model_key and self.engine.state == READY:
            return
        if not self.load(key):
            self.select_loaded()

    def load(self, key: str) -> bool:
        """Load the library's model ``key`` as the Load panel would (its saved engine settings)."""
        entry = self.ctx.library.find(key)
        if entry is None or not entry.facts.supported:
            return False
        fresh = inspect_model(entry.facts.path)  # read again before the loaded model is unloaded
        if not fresh.supported:
            entry.facts = fresh
            self.problem.emit(f"Cannot load {entry.name}: {fresh.reason}")
            return False
        names = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}
        saved = self.ctx.store.model_settings(key).get("engine", {})
        values = {k: v for k, v in saved.items() if k in names and v is not None}
        try:
            config = EngineConfig(model=entry.model_ref or None, **values)
        except (TypeError, ValueError) as e:
            self.problem.emit(f"Cannot load {entry.name} with its saved settings ({e}); open the Load panel.")
            return False
        self.ctx.selectModel.emit(key)  # the Load panel shows what is loading
        self.ctx.load_model(key, config)
        return True
