"""The chat's sampling settings: temperature, top-p, top-k, min-p, max tokens, seed, stop strings."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QLineEdit, QSpinBox, QWidget

from app.sampling import SamplingSettings


class SamplingForm(QWidget):
    changed = Signal()

    def __init__(self):
        super().__init__()
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        self.temperature = self._double(0.0, 2.0, 0.05, "0 = greedy (always the most likely token)")
        self.top_p = self._double(0.01, 1.0, 0.01, "Sample from the smallest set of tokens whose probabilities sum to this")
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")
        self.top_k.setToolTip("Sample from the k most likely tokens (0 = off)")
        self.min_p = self._double(0.0, 1.0, 0.01, "Drop tokens less likely than this share of the most likely one")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 131072)
        self.max_tokens.setToolTip("Longest reply, in tokens")
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.seed.setToolTip("A fixed seed gives the same reply for the same conversation and settings")
        self.stop = QLineEdit()
        self.stop.setPlaceholderText("e.g. ###, END  (comma-separated)")
        self.stop.setToolTip("Stop the reply when one of these strings appears")
        for label, w in (("Temperature", self.temperature), ("Top-p", self.top_p), ("Top-k", self.top_k),
                         ("Min-p", self.min_p), ("Max tokens", self.max_tokens), ("Seed", self.seed),
                         ("Stop", self.stop)):
            form.addRow(label, w)
            if not isinstance(w, QLineEdit):  # not the width of 2147483647: the column folds down on a narrow window
                w.setMinimumWidth(96)
            signal = w.textChanged if isinstance(w, QLineEdit) else w.valueChanged
            signal.connect(self._emit)
        self._extra = SamplingSettings()
        self._loading = False

    def _double(self, lo: float, hi: float, step: float, tip: str) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(lo, hi)
        w.setSingleStep(step)
        w.setDecimals(2)
        w.setToolTip(tip)
        return w

    def _emit(self, *_):
        if not self._loading:
            self.changed.emit()

    def settings(self) -> SamplingSettings:
        stop = [s.strip() for s in self.stop.text().split(",") if s.strip()]
        return SamplingSettings(temperature=self.temperature.value(), top_p=self.top_p.value(),
                                top_k=self.top_k.value(), min_p=self.min_p.value(), max_tokens=self.max_tokens.value(),
                                seed=None if self.seed.value() < 0 else self.seed.value(), stop=stop,
                                repetition_penalty=self._extra.repetition_penalty)

    def set_settings(self, s: SamplingSettings) -> None:
        self._loading = True
        try:
            self._extra = s
            self.temperature.setValue(s.temperature)
            self.top_p.setValue(s.top_p)
            self.top_k.setValue(max(0, s.top_k))
            self.min_p.setValue(s.min_p)
            self.max_tokens.setValue(s.max_tokens)
            self.seed.setValue(-1 if s.seed is None else s.seed)
            self.stop.setText(", ".join(s.stop))
        finally:
            self._loading = False
