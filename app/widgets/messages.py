"""The chat's message view: one frame per message (role, Markdown body, stats line, actions) in a scroll
area that follows the newest text while the user is at the bottom, and the input box (Enter sends,
Shift+Enter breaks the line)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.markdown_render import to_html


class MessageWidget(QFrame):
    editRequested = Signal(object)  # self
    regenerateRequested = Signal(object)

    def __init__(self, role: str, text: str = "", title: str = "", message_id: int | None = None):
        super().__init__()
        self.role = role
        self.message_id = message_id
        self.text = ""
        self.setObjectName("message")
        self.setProperty("role", role)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 10, 14, 10)
        lay.setSpacing(4)
        head = QHBoxLayout()
        self.role_label = QLabel(title or ("You" if role == "user" else "Assistant"))
        self.role_label.setObjectName("messageRole")
        head.addWidget(self.role_label)
        head.addStretch(1)
        self.copy_button = self._action("Copy", self._copy)
        head.addWidget(self.copy_button)
        if role == "user":
            self.edit_button = self._action("Edit", lambda: self.editRequested.emit(self))
            head.addWidget(self.edit_button)
        else:
            self.regenerate_button = self._action("Regenerate", lambda: self.regenerateRequested.emit(self))
            head.addWidget(self.regenerate_button)
        lay.addLayout(head)
        self.body = QLabel()
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.RichText)
        self.body.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.LinksAccessibleByMouse)
        self.body.setOpenExternalLinks(True)
        self.body.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Minimum)
        lay.addWidget(self.body)
        self.error_label = QLabel()
        self.error_label.setObjectName("messageError")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        lay.addWidget(self.error_label)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("messageStats")
        self.stats_label.hide()
        lay.addWidget(self.stats_label)
        self.set_text(text)

    def set_title(self, title: str) -> None:
        self.role_label.setText(title or ("You" if self.role == "user" else "Assistant"))

    @property
    def title(self) -> str:
        return self.role_label.text()

    def _action(self, text: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setObjectName("link")
        b.setCursor(Qt.PointingHandCursor)
        b.clicked.connect(slot)
        return b

    def set_text(self, text: str) -> None:
        self.text = text
        if self.role == "user":
            escaped = html.escape(text).replace("\n", "<br>")
            self.body.setText(f'<div style="white-space: pre-wrap;">{escaped}</div>')
        else:
            self.body.setText(to_html(text) if text else '<span style="color:#9ca3af;">…</span>')

    def set_stats(self, text: str) -> None:
        self.stats_label.setText(text)
        self.stats_label.setVisible(bool(text))

    def set_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def set_actions_enabled(self, enabled: bool, last: bool = False) -> None:
        if self.role == "user":
            self.edit_button.setEnabled(enabled)
        else:
            self.regenerate_button.setVisible(last)
            self.regenerate_button.setEnabled(enabled)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)


class MessageList(QScrollArea):
    """Messages top to bottom; keeps the newest in view while the user has not scrolled up."""

    def __init__(self):
        super().__init__()
        self.setObjectName("messages")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        inner = QWidget()
        inner.setObjectName("messagesInner")
        self._layout = QVBoxLayout(inner)
        self._layout.setContentsMargins(16, 16, 16, 16)
        self._layout.setSpacing(12)
        self.placeholder = QLabel()
        self.placeholder.setObjectName("hint")
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setWordWrap(True)
        self._layout.addWidget(self.placeholder)
        self._layout.addStretch(1)
        self.setWidget(inner)
        self._follow = True
        self.verticalScrollBar().valueChanged.connect(self._on_scroll)
        self.verticalScrollBar().rangeChanged.connect(self._on_range)

    def widgets(self) -> list[MessageWidget]:
        out = []
        for i in range(self._layout.count()):
            w = self._layout.itemAt(i).widget()
            if isinstance(w, MessageWidget):
                out.append(w)
        return out

    def add(self, w: MessageWidget) -> MessageWidget:
        self._layout.insertWidget(self._layout.count() - 1, w)
        self.placeholder.hide()
        self._follow = True
        QTimer.singleShot(0, self.scroll_to_end)
        return w

    def remove(self, w: MessageWidget) -> None:
        self._layout.removeWidget(w)
        w.deleteLater()

    def clear(self) -> None:
        for w in self.widgets():
            self.remove(w)

    def set_placeholder(self, text: str) -> None:
        self.placeholder.setText(text)
        self.placeholder.setVisible(bool(text) and not self.widgets())

    def scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_scroll(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 24

    def _on_range(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)


class Composer(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a line break."""

    submitted = Signal(str)

    def __init__(self):
        super().__init__()
        self.setPlaceholderText("Message the model…  (Enter sends, Shift+Enter adds a line)")
        self.setTabChangesFocus(True)
        self.setFixedHeight(84)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key_Return, Qt.Key_Enter) and not (e.modifiers() & Qt.ShiftModifier):
            text = self.toPlainText()
            if text.strip():
                self.submitted.emit(text)
            e.accept()
            return
        super().keyPressEvent(e)
