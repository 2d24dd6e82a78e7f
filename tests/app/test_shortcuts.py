"""Keyboard shortcuts (app.shortcuts): one table makes the window's QShortcuts and the help overlay's list; each
shortcut, pressed with qtbot.keyClick, does what it says (new chat, stop, regenerate, focus the composer,
switch panels, help)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app import shortcuts
from app.window import PANELS, MainWindow
from tests.app.helpers import REPLY_TIMEOUT_MS, set_sampling


def _active(qtbot, w) -> None:
    w.activateWindow()
    w.raise_()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=5000)


def test_one_table_makes_shortcuts_and_overlay(make_window):
    w = make_window(autoload=False)
    rows = shortcuts.table(PANELS)
    assert rows == w.shortcut_table
    keys = [k for r in rows for k in r.keys]
    assert len(keys) == len(set(keys))  # no key bound twice
    assert [r.arg for r in rows if r.action == "panel"] == [name for name, _ in PANELS]
    for r in rows:
        if r.action:
            assert callable(getattr(MainWindow, f"shortcut_{r.action}"))
            assert [s.key().toString() for s in w.shortcut(r.action, r.arg)] == list(r.keys)
    # the overlay lists exactly the table, in its order
    assert w.help_overlay.rows == [(shortcuts.key_text(r.keys), r.text) for r in rows]
    for needed in ("new_chat", "stop", "regenerate", "focus_composer", "help"):
        assert any(r.action == needed for r in rows)


def test_panel_switching_help_and_focus(make_window, qtbot):
    w = make_window(autoload=False)
    _active(qtbot, w)
    for i, (name, _label) in enumerate(PANELS, start=1):
        qtbot.keyClick(w, Qt.Key_0 + i, Qt.ControlModifier)
        assert w.stack.currentWidget() is w.panels[name] and w.nav.currentRow() == i - 1
    qtbot.keyClick(w, Qt.Key_F1)
    assert w.help_overlay.isVisible()
    assert w.help_overlay.geometry() == w.rect()
    qtbot.keyClick(w.help_overlay, Qt.Key_Escape)
    assert not w.help_overlay.isVisible()
    qtbot.keyClick(w, Qt.Key_Slash, Qt.ControlModifier)
    assert w.help_overlay.isVisible()
    qtbot.keyClick(w, Qt.Key_Slash, Qt.ControlModifier)
    assert not w.help_overlay.isVisible()
    w.help_button.click()
    assert w.help_overlay.isVisible()
    qtbot.mouseClick(w.help_overlay, Qt.LeftButton)
    assert not w.help_overlay.isVisible()

    w.show_panel("server")
    qtbot.keyClick(w, Qt.Key_L, Qt.ControlModifier)  # focus the composer: back to the chat
    assert w.stack.currentWidget() is w.chat
    qtbot.waitUntil(lambda: w.chat.composer.hasFocus(), timeout=5000)


def test_new_chat(make_window, qtbot):
    w = make_window()
    _active(qtbot, w)
    store = w.ctx.store
    before = {c.id for c in store.conversations()}
    w.show_panel("models")
    qtbot.keyClick(w, Qt.Key_N, Qt.ControlModifier)
    after = store.conversations()
    assert len(after) == len(before) + 1
    new = next(c for c in after if c.id not in before)
    assert w.chat.conversation.id == new.id and w.stack.currentWidget() is w.chat
    assert w.chat.message_widgets() == []


def test_stop_and_regenerate(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")
    w = make_window()
    _active(qtbot, w)
    chat = w.chat
    set_sampling(w, max_tokens=400)
    assert chat.send("first")
    qtbot.waitUntil(lambda: chat.pending is not None and len(chat.pending.text) >= 2, timeout=REPLY_TIMEOUT_MS)
    chat.composer.setFocus()
    qtbot.keyClick(chat.composer, Qt.Key_Escape)  # stop
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    conv = chat.conversation.id
    stopped = w.ctx.store.messages(conv)[-1]
    assert stopped.finish_reason == "abort" and stopped.num_tokens < 400

    set_sampling(w, max_tokens=5)
    qtbot.keyClick(w, Qt.Key_R, Qt.ControlModifier)  # regenerate
    qtbot.waitUntil(lambda: chat.pending is None and len(w.ctx.store.messages(conv)) == 2
                    and w.ctx.store.messages(conv)[-1].version_count == 2, timeout=REPLY_TIMEOUT_MS)
    msgs = w.ctx.store.messages(conv)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[-1].num_tokens == 5 and msgs[-1].finish_reason == "length"
    assert [m.role for m in chat.message_widgets()] == ["user", "assistant"]


@pytest.mark.parametrize("action", ["new_chat", "focus_composer"])
def test_shortcut_activation_without_keys(make_window, qtbot, action):
    """The QShortcut objects themselves (what a platform's key handling ends in)."""
    w = make_window(autoload=False)
    w.show_panel("hardware")
    (sc,) = w.shortcut(action)
    sc.activated.emit()
    assert w.stack.currentWidget() is w.chat
