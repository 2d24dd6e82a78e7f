"""The chat's context meter: the next turn's tokens (prompt + the reply's max tokens) against the loaded
model's context as a bar and a figure, the conversation's overflow policy beside it, and a note under it when
the next turn will not fit as it stands. The chat panel counts (app.chat_context.Fit) and shows the count here."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QVBoxLayout, QWidget

from app.chat_context import DEFAULT_POLICY, POLICIES, Fit

STYLE = ("QProgressBar#contextMeter { min-height: 8px; max-height: 8px; border-radius: 4px; "
         "border: 1px solid palette(mid); background: palette(base); } "
         "QProgressBar#contextMeter::chunk { border-radius: 3px; } ")
LEVEL_COLORS = {"over": "#d9534f", "near": "#e0a030", "ok": "#3f8fd2"}


class ContextMeter(QWidget):
    policyChanged = Signal(str)  # the user chose another overflow policy

    def __init__(self):
        super().__init__()
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.bar = QProgressBar()
        self.bar.setObjectName("contextMeter")
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(8)
        self.bar.setMinimumWidth(40)
        self.bar.setStyleSheet(STYLE)
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.bar.setToolTip("The next turn (the conversation, your draft and the reply's max tokens) against the "
                            "loaded model's context")
        self.label = QLabel("")
        self.label.setObjectName("hint")
        self.label.setToolTip(self.bar.toolTip())
        self.overflow = _WholeCombo()
        self.overflow.setToolTip("What a turn does when the conversation outgrows the model's context "
                                 "(the system prompt is always kept)")
        for key, label in POLICIES.items():
            self.overflow.addItem(label, key)
        self.overflow.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.overflow.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)
        self.overflow.currentIndexChanged.connect(lambda _i: self.policyChanged.emit(self.policy()))
        row.addWidget(self.bar, 1)
        row.addWidget(self.label)
        row.addWidget(QLabel("When full:"))
        row.addWidget(self.overflow)
        outer.addLayout(row)
        self.note = QLabel("")
        self.note.setObjectName("hint")
        self.note.setWordWrap(True)
        self.note.hide()
        outer.addWidget(self.note)

    def policy(self) -> str:
        return self.overflow.currentData() or DEFAULT_POLICY

    def set_policy(self, policy: str) -> None:
        """Show a conversation's policy (no policyChanged)."""
        i = self.overflow.findData(policy)
        self.overflow.blockSignals(True)
        self.overflow.setCurrentIndex(i if i >= 0 else self.overflow.findData(DEFAULT_POLICY))
        self.overflow.blockSignals(False)

    def show_fit(self, fit: Fit | None, ready: bool, quiet: bool = False) -> None:
        """The count of the next turn (None: none; ready: a model is loaded). quiet: leave the note alone (a
        reply is streaming: the note says what its send did)."""
        if fit is None:
            self.bar.setRange(0, 1)
            self.bar.setValue(0)
            self.label.setText("— tokens" if ready else "")
            self.show_note("")
            return
        total = fit.full_prompt_tokens + fit.requested
        self.bar.setRange(0, max(1, fit.max_len))
        self.bar.setValue(min(total, fit.max_len))
        level = "over" if total > fit.max_len else "near" if total > 0.8 * fit.max_len else "ok"
        self.bar.setStyleSheet(STYLE + f"QProgressBar#contextMeter::chunk {{ background: {LEVEL_COLORS[level]}; }}")
        self.bar.setProperty("level", level)
        self.label.setText(f"{fit.full_prompt_tokens:,} + {fit.requested:,} / {fit.max_len:,} tokens")
        self.label.setToolTip(f"Prompt {fit.full_prompt_tokens:,} tokens + reply up to {fit.requested:,} "
                              f"(max tokens), against the model's {fit.max_len:,}-token context")
        if quiet:
            return
        if total > fit.max_len:
            self.show_note(("Next turn: " + fit.summary()[0].lower() + fit.summary()[1:]) if fit.ok else fit.error)
        else:
            self.show_note("")

    def show_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.setVisible(bool(text))


class _WholeCombo(QComboBox):
    """A combo box never narrower than its longest choice (in the style it is drawn with): squeezed, the
    overflow policy read "Drop t" (issue 45, row 11)."""

    def minimumSizeHint(self):
        return self.sizeHint()
