"""A form built from a dataclass's fields and their metadata (engine.config.EngineConfig): a check box per
bool, a combo per field with ``choices``, spin boxes for numbers (an optional number's lowest value reads
as its "default"), the field's ``help`` as tooltip. A field or a single choice can be disabled with a
reason, which shows beside it. New EngineConfig fields appear without changes here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QWidget,
)


@dataclass
class FieldSpec:
    name: str
    kind: str  # "bool" | "choice" | "int" | "float" | "str"
    optional: bool
    default: Any
    help: str
    choices: list[str] | None = None


def field_specs(cls) -> list[FieldSpec]:
    out = []
    for f in dataclasses.fields(cls):
        type_text = str(f.type)
        optional = "None" in type_text
        base = type_text.replace("| None", "").replace("None |", "").strip()
        choices = f.metadata.get("choices")
        kind = "choice" if choices else {"bool": "bool", "int": "int", "float": "float"}.get(base, "str")
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append(FieldSpec(f.name, kind, optional, default, f.metadata.get("help", ""), choices))
    return out


def humanize(name: str) -> str:
    return name.replace("_", " ").capitalize()


class ConfigForm(QWidget):
    changed = Signal()

    def __init__(self, cls, names: list[str], labels: dict[str, str] | None = None,
                 ranges: dict[str, tuple[float, float]] | None = None, none_text: dict[str, str] | None = None,
                 choice_labels: dict[str, dict[str, str]] | None = None, suffixes: dict[str, str] | None = None):
        super().__init__()
        self.specs = {s.name: s for s in field_specs(cls) if s.name in names}
        self.editors: dict[str, QWidget] = {}
        self.reasons: dict[str, QLabel] = {}
        self.notes: dict[str, str] = {}  # shown beside an enabled field (set_field_note)
        labels, ranges, none_text = labels or {}, ranges or {}, none_text or {}
        choice_labels, suffixes = choice_labels or {}, suffixes or {}
        self.form = QFormLayout(self)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        for name in names:
            spec = self.specs.get(name)
            if spec is None:
                continue
            editor = self._editor(spec, ranges.get(name), none_text.get(name, "default"),
                                  choice_labels.get(name, {}), suffixes.get(name, ""))
            editor.setToolTip(spec.help)
            self.editors[name] = editor
            reason = QLabel()
            reason.setObjectName("hint")
            reason.setWordWrap(True)
            reason.hide()
            self.reasons[name] = reason
            cell = QWidget()
            row = QHBoxLayout(cell)
            row.setContentsMargins(0, 0, 0, 0)
            row.addWidget(editor, 0 if spec.kind == "bool" else 1)
            row.addWidget(reason, 1)
            label = QLabel(labels.get(name, humanize(name)))
            label.setToolTip(spec.help)
            self.form.addRow(label, cell)
        self.set_values({})

    def _editor(self, spec: FieldSpec, rng, none_text: str, choice_labels: dict[str, str], suffix: str) -> QWidget:
        if spec.kind == "bool":
            w = QCheckBox()
            w.toggled.connect(self.changed)
        elif spec.kind == "choice":
            w = QComboBox()
            for c in spec.choices:
                w.addItem(choice_labels.get(c, c), c)
            w.currentIndexChanged.connect(self.changed)
        elif spec.kind == "int":
            w = QSpinBox()
            lo, hi = rng or (0 if spec.optional else 1, 2**31 - 1)
            w.setRange(int(lo), int(hi))
            if spec.optional:
                w.setSpecialValueText(none_text)
            w.setSuffix(suffix)
            w.valueChanged.connect(self.changed)
        elif spec.kind == "float":
            w = QDoubleSpinBox()
            lo, hi = rng or (0.0, 1e6)
            w.setRange(lo, hi)
            w.setDecimals(2)
            w.setSingleStep(0.05 if hi <= 1 else 0.5)
            if spec.optional:
                w.setSpecialValueText(none_text)
            w.setSuffix(suffix)
            w.valueChanged.connect(self.changed)
        else:
            w = QLineEdit()
            w.setPlaceholderText(none_text if spec.optional else "")
            w.textChanged.connect(self.changed)
        return w

    # values --------------------------------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        out = {}
        for name, w in self.editors.items():
            spec = self.specs[name]
            if isinstance(w, QCheckBox):
                v = w.isChecked()
            elif isinstance(w, QComboBox):
                v = w.currentData()
            elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
                v = w.value()
                if spec.optional and v == w.minimum():
                    v = None
            else:
                v = w.text().strip() or None
            out[name] = v
        return out

    def set_values(self, values: dict[str, Any]) -> None:
        self.blockSignals(True)
        try:
            for name, w in self.editors.items():
                spec = self.specs[name]
                v = values.get(name, spec.default)
                if isinstance(w, QCheckBox):
                    w.setChecked(bool(v))
                elif isinstance(w, QComboBox):
                    i = w.findData(v)
                    w.setCurrentIndex(max(i, 0))
                elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
                    w.setValue(w.minimum() if v is None else v)
                else:
                    w.setText("" if v is None else str(v))
        finally:
            self.blockSignals(False)
        self.changed.emit()

    def set_value(self, name: str, value: Any) -> None:
        self.set_values({**self.values(), name: value})

    # availability ------------------------------------------------------------------------------
    def set_field_enabled(self, name: str, enabled: bool, reason: str = "") -> None:
        w = self.editors.get(name)
        if w is None:
            return
        w.setEnabled(enabled)
        label = self.reasons[name]
        text = self.notes.get(name, "") if enabled else reason
        label.setText(text)
        label.setVisible(bool(text))
        w.setToolTip(self.specs[name].help + ("" if enabled or not reason else f"\nUnavailable: {reason}"))

    def set_field_note(self, name: str, note: str) -> None:
        """A word beside an enabled field (why the value just changed, what it accepts); the reason of a disabled
        field takes its place while the field is off."""
        if name not in self.editors:
            return
        self.notes[name] = note
        if self.editors[name].isEnabled():
            self.reasons[name].setText(note)
            self.reasons[name].setVisible(bool(note))

    def field_note(self, name: str) -> str:
        return self.notes.get(name, "")

    def set_choice_enabled(self, name: str, choice: str, enabled: bool, reason: str = "") -> None:
        w = self.editors.get(name)
        if not isinstance(w, QComboBox):
            return
        i = w.findData(choice)
        model = w.model()
        if i < 0 or not isinstance(model, QStandardItemModel):
            return
        item = model.item(i)
        base = item.data(Qt.UserRole + 1) or item.text()
        item.setData(base, Qt.UserRole + 1)
        item.setEnabled(enabled)
        item.setText(base if enabled else f"{base}  ({reason})" if reason else base)
        item.setToolTip("" if enabled else reason)
        if not enabled and w.currentIndex() == i:
            first = next((j for j in range(w.count()) if model.item(j).isEnabled()), 0)
            w.setCurrentIndex(first)

    def is_field_enabled(self, name: str) -> bool:
        return self.editors[name].isEnabled()

    def is_choice_enabled(self, name: str, choice: str) -> bool:
        w = self.editors[name]
        item = w.model().item(w.findData(choice))
        return bool(item.isEnabled())

    def disabled_reason(self, name: str) -> str:
        return "" if self.editors[name].isEnabled() else self.reasons[name].text()
