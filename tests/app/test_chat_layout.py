"""The chat's message cards at every width (issue 45, rows 3 and 11): a long multi-paragraph reply is shown whole
(no label shorter than its text needs at its width), the cards follow each other at the layout's spacing (no
blank gaps), and at 1024x700 the cards, their Edit / Regenerate and the "When full" choice are not cut."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.widgets.messages import MessageList, MessageWidget
from tests.support.qt_checks import layout_problems, resize_window

PARA = ("She was born in a small village by the sea, where the fishermen told stories of storms and distant "
        "lands. ") * 6
LONG = "\n\n".join(f"Paragraph {i}. {PARA.strip()}" for i in range(8)) + "\n\nShe continued to inspire them all."


@pytest.mark.parametrize("width", [380, 520, 700, 1000, 1400, 600])
def test_long_reply_is_whole_in_a_message_list_at_any_width(qtbot, width):
    lst = MessageList()
    qtbot.addWidget(lst)
    lst.resize(700, 500)
    lst.show()
    cards = [lst.add(MessageWidget("user", "Tell me a long story")), lst.add(MessageWidget("assistant", LONG)),
             lst.add(MessageWidget("user", "Thanks"))]
    lst.resize(width, 500)
    spacing = lst.widget().layout().spacing()
    qtbot.waitUntil(lambda: not layout_problems(cards, spacing), timeout=5000)
    assert "She continued to inspire them all." in cards[1].body.text()


def _long_conversation(window) -> int:
    store = window.ctx.store
    c = store.create_conversation("A long story")
    store.add_message(c.id, "user", "Tell me a long story.")
    store.add_message(c.id, "assistant", LONG, num_tokens=700, finish_reason="stop", model="m")
    store.add_message(c.id, "user", "And another?")
    r = store.add_message(c.id, "assistant", LONG.replace("Paragraph", "Part"), num_tokens=700, finish_reason="stop")
    store.add_version(r.id, "A short one.", num_tokens=3, finish_reason="stop")
    store.select_version(r.id, 0)  # the long one shown, "1/2"
    window.chat.open_conversation_force(c.id)
    return c.id


def _resize(qtbot, window, size) -> None:
    resize_window(window, size, qtbot.wait)
    assert (window.width(), window.height()) == size


def _inside(widget, outer) -> bool:
    """``widget`` is shown whole within ``outer`` (both visible, its rectangle inside the other's)."""
    top_left = widget.mapTo(outer, widget.rect().topLeft())
    bottom_right = widget.mapTo(outer, widget.rect().bottomRight())
    return widget.isVisible() and outer.rect().contains(top_left) and outer.rect().contains(bottom_right)


def test_long_replies_shown_whole_in_the_chat_as_the_window_resizes(make_window, qtbot):
    w = make_window()
    _long_conversation(w)
    chat = w.chat
    spacing = chat.messages.widget().layout().spacing()
    for size in ((1600, 1000), (1024, 700), (1300, 800), (1100, 700), (1920, 1080), (1024, 700)):
        _resize(qtbot, w, size)
        qtbot.waitUntil(lambda: not layout_problems(chat.message_widgets(), spacing), timeout=5000)


@pytest.mark.parametrize("size", [(1024, 700), (1600, 1000)])
def test_the_chat_is_usable_at_1024x700(make_window, qtbot, size):
    """Issue 45 row 11: cards not clipped sideways, Edit / Regenerate / the version arrows on screen, the
    "When full" choice not cut ("Drop t"); the settings column folds away when narrow and comes back on asking."""
    w = make_window()
    _long_conversation(w)
    chat = w.chat
    _resize(qtbot, w, size)
    viewport = chat.messages.viewport()
    qtbot.waitUntil(lambda: all(c.width() <= viewport.width() for c in chat.message_widgets()), timeout=5000)
    cards = chat.message_widgets()
    chat.messages.ensureWidgetVisible(cards[0].edit_button)
    qtbot.waitUntil(lambda: _inside(cards[0].edit_button, viewport), timeout=5000)
    last = cards[-1]
    chat.messages.ensureWidgetVisible(last.regenerate_button)
    qtbot.waitUntil(lambda: _inside(last.regenerate_button, viewport), timeout=5000)
    assert _inside(last.next_version, viewport) and last.version_label.text() == "1/2"
    combo = chat.overflow
    assert combo.currentText() == "Drop the oldest turns"
    assert combo.width() >= combo.sizeHint().width() and _inside(combo, chat)
    for button in (chat.send_button, chat.regenerate_button, chat.new_button, chat.export_button):
        assert _inside(button, chat)
    narrow = size[0] < 1200
    assert chat.settings_panel.isVisible() is not narrow and chat.settings_button.isChecked() is not narrow
    qtbot.mouseClick(chat.settings_button, Qt.LeftButton)  # the other way round, on asking
    assert chat.settings_panel.isVisible() is narrow
    if narrow:
        qtbot.waitUntil(lambda: _inside(chat.sampling.max_tokens, chat), timeout=5000)
        qtbot.waitUntil(lambda: _inside(combo, chat) and combo.width() >= combo.sizeHint().width(), timeout=5000)
