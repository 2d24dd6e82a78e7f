"""The chat's message view: one frame per message (role, Markdown body, stats line, actions) in a scroll
area that follows the newest text while the user is at the bottom, and the input box (Enter sends,
Shift+Enter breaks the line).

An assistant's body is a column of prose labels and code blocks (``CodeBlock``: language, Copy button,
highlighted code), cut by app.markdown_render.segments. A streamed reply re-renders in place: the parts that
did not change keep their widgets, the growing one is updated. A theme change re-renders every body."""

from __future__ import annotations

import html

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
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

from app import theme as themes
from app.markdown_render import Segment, segments

COPIED_MS = 1200  # how long a Copy button says "Copied"


def _rich_label(object_name: str = "") -> QLabel:
    label = QLabel()
    if object_name:
        label.setObjectName(object_name)
    label.setWordWrap(True)
    label.setTextFormat(Qt.RichText)
    label.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.LinksAccessibleByMouse)
    label.setOpenExternalLinks(True)
    label.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
    return label


class CodeBlock(QFrame):
    """One fenced code block: a header with its language and a Copy button, then the highlighted code."""

    def __init__(self, segment: Segment):
        super().__init__()
        self.setObjectName("codeBlock")
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        header = QWidget()
        header.setObjectName("codeHeader")
        header.setAttribute(Qt.WA_StyledBackground, True)
        hl = QHBoxLayout(header)
        hl.setContentsMargins(10, 2, 4, 2)
        self.language_label = QLabel()
        self.language_label.setObjectName("codeLanguage")
        hl.addWidget(self.language_label)
        hl.addStretch(1)
        self.copy_button = QToolButton()
        self.copy_button.setObjectName("codeCopy")
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy this code")
        self.copy_button.setCursor(Qt.PointingHandCursor)
        self.copy_button.clicked.connect(self.copy)
        hl.addWidget(self.copy_button)
        lay.addWidget(header)
        self.code_label = _rich_label("codeText")
        self.code_label.setContentsMargins(10, 8, 10, 8)
        lay.addWidget(self.code_label)
        self._reset_copy = QTimer(self)
        self._reset_copy.setSingleShot(True)
        self._reset_copy.setInterval(COPIED_MS)
        self._reset_copy.timeout.connect(lambda: self.copy_button.setText("Copy"))
        self.segment: Segment | None = None
        self.set_segment(segment)

    @property
    def code(self) -> str:
        return self.segment.code if self.segment else ""

    @property
    def language(self) -> str:
        return self.segment.language if self.segment else ""

    def set_segment(self, segment: Segment) -> None:
        if segment == self.segment:
            return
        self.segment = segment
        self.language_label.setText(segment.language or "code")
        self.code_label.setText(segment.html)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.copy_button.setText("Copied")
        self._reset_copy.start()


class MessageBody(QWidget):
    """A message's text: prose labels and code blocks top to bottom, updated in place as the text changes."""

    def __init__(self):
        super().__init__()
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        # vertical Preferred (not Minimum): the scroll area's minimum is then the height for the actual width,
        # not the taller size hint of word-wrapped labels at their preferred width (blank space below)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        self._parts: list[tuple[Segment, QWidget]] = []

    def set_segments(self, segs: list[Segment]) -> None:
        for i, seg in enumerate(segs):
            if i < len(self._parts):
                old, w = self._parts[i]
                if old == seg:
                    continue
                if old.kind == seg.kind:
                    self._update(w, seg)
                    self._parts[i] = (seg, w)
                    continue
                self._drop_from(i)
            self._parts.append((seg, self._make(seg)))
        self._drop_from(len(segs))

    def set_html(self, text: str) -> None:
        self.set_segments([Segment("html", text)])

    def _make(self, seg: Segment) -> QWidget:
        if seg.kind == "code":
            w = CodeBlock(seg)
        else:
            w = _rich_label()
            w.setText(seg.html)
        self._layout.addWidget(w)
        return w

    @staticmethod
    def _update(w: QWidget, seg: Segment) -> None:
        if isinstance(w, CodeBlock):
            w.set_segment(seg)
        else:
            w.setText(seg.html)

    def _drop_from(self, i: int) -> None:
        for _seg, w in self._parts[i:]:
            self._layout.removeWidget(w)
            w.hide()
            w.deleteLater()
        del self._parts[i:]

    def code_blocks(self) -> list[CodeBlock]:
        return [w for _s, w in self._parts if isinstance(w, CodeBlock)]

    def text(self) -> str:
        """The body as HTML (prose and highlighted code, in order)."""
        return "".join(s.html for s, _w in self._parts)


class MessageWidget(QFrame):
    editRequested = Signal(object)  # self
    regenerateRequested = Signal(object)
    versionRequested = Signal(object, int)  # self, the version to show (0-based)

    def __init__(self, role: str, text: str = "", title: str = "", message_id: int | None = None):
        super().__init__()
        self.role = role
        self.message_id = message_id
        self.text = ""
        self.setObjectName("message")
        self.setProperty("role", role)
        # vertical Preferred, not Maximum: Maximum caps a card at its size hint, the height at the label's preferred
        # width; at a narrower width the wrapped text needs more (the end of a long reply was cut off) and at a wider
        # one the list's height-for-width gave the difference out as gaps between the cards (issue 45, row 3)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 10, 14, 10)
        lay.setSpacing(4)
        head = QHBoxLayout()
        self.role_label = QLabel(title or ("You" if role == "user" else "Assistant"))
        self.role_label.setObjectName("messageRole")
        head.addWidget(self.role_label, 0)
        # a regenerated reply: "‹ 2/3 ›" switches between its versions
        self.versions = QWidget()
        vl = QHBoxLayout(self.versions)
        vl.setContentsMargins(8, 0, 0, 0)
        vl.setSpacing(0)
        self.prev_version = self._action("‹", lambda: self.versionRequested.emit(self, self.version - 1))
        self.prev_version.setToolTip("The previous version of this reply")
        self.version_label = QLabel()
        self.version_label.setObjectName("messageStats")
        self.next_version = self._action("›", lambda: self.versionRequested.emit(self, self.version + 1))
        self.next_version.setToolTip("The next version of this reply")
        vl.addWidget(self.prev_version)
        vl.addWidget(self.version_label)
        vl.addWidget(self.next_version)
        self.versions.hide()
        self.version, self.version_count = 0, 1
        self._versions_enabled = True
        head.addWidget(self.versions)
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
        self.body = MessageBody()
        self._theme = ""  # the theme the body was rendered with
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
        theme = themes.current()
        self._theme = theme.name
        if self.role == "user":
            escaped = html.escape(text).replace("\n", "<br>")
            self.body.set_html(f'<div style="white-space: pre-wrap;">{escaped}</div>')
        elif text:
            self.body.set_segments(segments(text, theme))
        else:
            self.body.set_html(f'<span style="color:{theme["muted"]};">…</span>')

    def code_blocks(self) -> list[CodeBlock]:
        return self.body.code_blocks()

    def changeEvent(self, e: QEvent) -> None:
        # a new application style sheet: re-render when the theme (code colours) changed
        if e.type() == QEvent.StyleChange and self._theme and self._theme != themes.current().name:
            self.set_text(self.text)
        super().changeEvent(e)

    def set_stats(self, text: str) -> None:
        self.stats_label.setText(text)
        self.stats_label.setVisible(bool(text))

    def set_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def set_versions(self, index: int, count: int) -> None:
        """Which version of the reply this is, of how many (the arrows show from two on)."""
        self.version, self.version_count = index, max(1, count)
        self.version_label.setText(f"{index + 1}/{self.version_count}")
        self.versions.setVisible(self.version_count > 1)
        self.set_versions_enabled(self._versions_enabled)

    def set_versions_enabled(self, enabled: bool) -> None:
        """The arrows (off while a reply streams)."""
        self._versions_enabled = enabled
        self.prev_version.setEnabled(enabled and self.version > 0)
        self.next_version.setEnabled(enabled and self.version < self.version_count - 1)

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
        w.hide()  # gone at once, even before Qt runs the deferred delete
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
