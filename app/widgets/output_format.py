"""A conversation's output format: plain text, any JSON object, or JSON that follows a schema the user writes.
The schema editor checks the text as it is typed (app.sampling.schema_problem) and says what is wrong and where,
so that a broken schema is fixed here rather than refused by the engine after a send."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QComboBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.sampling import OUTPUT_FORMATS, OutputFormat

EXAMPLE_SCHEMA = """{
  "type": "object",
  "properties": {
    "answer": {"type": "string"},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1}
  },
  "required": ["answer", "confidence"]
}"""


class OutputFormatEditor(QWidget):
    changed = Signal()

    def __init__(self):
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.kind = QComboBox()
        for key, label in OUTPUT_FORMATS.items():
            self.kind.addItem(label, key)
        self.kind.setToolTip("What the replies of this conversation must be: the engine constrains the model's "
                             "tokens, so JSON replies always parse (unless max tokens cuts them)")
        self.kind.currentIndexChanged.connect(self._on_kind)
        lay.addWidget(self.kind)
        self.schema = QPlainTextEdit()
        mono = QFont("monospace")
        mono.setStyleHint(QFont.Monospace)
        self.schema.setFont(mono)
        self.schema.setPlaceholderText(EXAMPLE_SCHEMA)
        self.schema.setFixedHeight(140)
        self.schema.setToolTip("The JSON schema every reply follows")
        self.schema.textChanged.connect(self._on_schema)
        lay.addWidget(self.schema)
        self.status = QLabel()
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self._sync()

    def value(self) -> OutputFormat:
        return OutputFormat(self.kind.currentData() or "text", self.schema.toPlainText())

    def set_value(self, fmt: OutputFormat) -> None:
        """Show ``fmt`` (a conversation opened) without emitting ``changed``."""
        self.blockSignals(True)
        self.kind.setCurrentIndex(max(0, self.kind.findData(fmt.kind)))
        self.schema.setPlainText(fmt.schema)
        self.blockSignals(False)
        self._sync()

    def problem(self) -> str | None:
        return self.value().problem()

    def _on_kind(self, _index: int) -> None:
        if self.kind.currentData() == "json_schema" and not self.schema.toPlainText().strip():
            self.schema.setPlainText(EXAMPLE_SCHEMA)  # a start to edit rather than an empty box
        self._sync()
        self.changed.emit()

    def _on_schema(self) -> None:
        self._sync()
        self.changed.emit()

    def _sync(self) -> None:
        is_schema = self.kind.currentData() == "json_schema"
        self.schema.setVisible(is_schema)
        why = self.problem()
        self.status.setObjectName("messageError" if why else "hint")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        self.status.setText(why or ("The schema is valid." if is_schema else
                                    "Replies are one JSON object." if self.kind.currentData() == "json_object"
                                    else ""))
        self.status.setVisible(bool(self.status.text()))
