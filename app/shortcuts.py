"""The app's keyboard shortcuts, one table: the main window makes a QShortcut of each row that has an action,
and the help overlay (F1 or Ctrl+/) lists every row. Rows without an action are keys a widget handles itself
(the composer's Enter), listed so that the overlay tells the whole story."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget


@dataclass(frozen=True)
class Shortcut:
    action: str  # the window's handler is MainWindow.shortcut_<action> ("" : handled by a widget, listed only)
    keys: tuple[str, ...]  # QKeySequence strings, portable form ("Ctrl+N": Cmd+N on macOS)
    text: str  # what it does, for the overlay
    arg: str = ""  # passed to the handler (the panel of a "panel" row)
    group: str = "Chat"
    scope: str = "window"  # "window": anywhere in the main window; "chat": while the focus is in the chat panel


BASE = (
    Shortcut("new_chat", ("Ctrl+N",), "New chat"),
    Shortcut("stop", ("Esc",), "Stop the reply being generated", scope="chat"),
    Shortcut("regenerate", ("Ctrl+R",), "Regenerate the last reply"),
    Shortcut("focus_composer", ("Ctrl+L",), "Focus the message box"),
    Shortcut("", ("Enter",), "Send the message (in the message box)"),
    Shortcut("", ("Shift+Enter",), "New line in the message box"),
    Shortcut("help", ("F1", "Ctrl+/"), "Show or hide this list", group="App"),
)


def table(panels: list[tuple[str, str]]) -> list[Shortcut]:
    """Every shortcut: the fixed ones, and Ctrl+1..N for the panels (``(name, label)`` in sidebar order)."""
    panel_rows = [Shortcut("panel", (f"Ctrl+{i}",), f"Show {label}", arg=name, group="Panels")
                  for i, (name, label) in enumerate(panels[:9], start=1)]
    return [*BASE, *panel_rows]


def key_text(keys: tuple[str, ...]) -> str:
    """The keys as this platform writes them ("Ctrl+N" or "⌘N"), alternatives joined by " or "."""
    return "  or  ".join(QKeySequence(k).toString(QKeySequence.NativeText) for k in keys)


class HelpOverlay(QWidget):
    """The shortcut list over the window: a dimmed backdrop and a card; a click or Esc closes it."""

    closed = Signal()

    def __init__(self, rows: list[Shortcut], parent: QWidget):
        super().__init__(parent)
        self.setObjectName("shortcutHelp")
        self.setAttribute(Qt.WA_StyledBackground, True)
        self.setFocusPolicy(Qt.StrongFocus)
        outer = QVBoxLayout(self)
        outer.setAlignment(Qt.AlignCenter)
        card = QFrame()
        card.setObjectName("shortcutCard")
        card.setMinimumWidth(440)
        outer.addWidget(card, 0, Qt.AlignCenter)
        lay = QVBoxLayout(card)
        lay.setContentsMargins(22, 18, 22, 18)
        title = QLabel("Keyboard shortcuts")
        title.setObjectName("shortcutTitle")
        lay.addWidget(title)
        grid = QGridLayout()
        grid.setHorizontalSpacing(16)
        grid.setVerticalSpacing(6)
        self.rows: list[tuple[str, str]] = []  # (keys, text) as shown (tests read it)
        r = 0
        group = None
        for row in rows:
            if row.group != group:
                group = row.group
                head = QLabel(group)
                head.setObjectName("messageRole")
                grid.addWidget(head, r, 0, 1, 2)
                r += 1
            keys = QLabel(key_text(row.keys))
            keys.setObjectName("shortcutKeys")
            text = QLabel(row.text)
            text.setObjectName("shortcutText")
            grid.addWidget(keys, r, 0, Qt.AlignLeft)
            grid.addWidget(text, r, 1)
            self.rows.append((keys.text(), row.text))
            r += 1
        lay.addLayout(grid)
        hint = QLabel("Esc or a click closes this list.")
        hint.setObjectName("hint")
        lay.addWidget(hint)
        self.hide()
        parent.installEventFilter(self)

    def toggle(self) -> None:
        if self.isVisible():
            self.close_overlay()
        else:
            self.open_overlay()

    def open_overlay(self) -> None:
        self.setGeometry(self.parentWidget().rect())
        self.raise_()
        self.show()
        self.setFocus()

    def close_overlay(self) -> None:
        if self.isVisible():
            self.hide()
            self.closed.emit()

    def eventFilter(self, obj, event) -> bool:
        if obj is self.parentWidget() and event.type() == QEvent.Resize and self.isVisible():
            self.setGeometry(self.parentWidget().rect())
        return False

    def mousePressEvent(self, e) -> None:
        self.close_overlay()
        e.accept()

    def keyPressEvent(self, e) -> None:
        if e.key() == Qt.Key_Escape:
            self.close_overlay()
            e.accept()
            return
        super().keyPressEvent(e)
