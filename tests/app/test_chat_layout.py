"""The chat's message cards at every width (issue 45, rows 3 and 11): a long multi-paragraph reply is shown whole
(no label shorter than its text needs at its width), the cards follow each other at the layout's spacing (no
blank gaps), and at 1024x700 the cards, their Edit / Regenerate and the "When full" choice are not cut."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QLabel

from app.widgets.messages import MessageList, MessageWidget

PARA = ("She was born in a small village by the sea, where the fishermen told stories of storms and distant "
        "lands. ") * 6
LONG = "\n\n".join(f"Paragraph {i}. {PARA.strip()}" for i in range(8)) + "\n\nShe continued to inspire them all."


def _layout_problems(cards: list[MessageWidget], spacing: int) -> list[str]:
    """What is wrong with the cards as laid out now ([] when every text is shown whole and there are no gaps)."""
    problems = []
    for i, card in enumerate(cards):
        need = card.heightForWidth(card.width())
        if card.height() < need:
            problems.append(f"card {i}: {card.height()} px high, its text needs {need}")
        for label in card.findChildren(QLabel):
            if not label.isVisible() or not label.wordWrap():
                continue
            need = label.heightForWidth(label.width())
            if label.height() < need:
                problems.append(f"card {i}: a label {label.height()} px high needs {need}")
            bottom = label.mapTo(card, QPoint(0, label.height())).y()
            if bottom > card.height():
                problems.append(f"card {i}: a label ends at {bottom}, below the card's {card.height()}")
    for a, b in zip(cards, cards[1:]):
        gap = b.y() - (a.y() + a.height())
        if gap != spacing:
            problems.append(f"a gap of {gap} px between cards (spacing {spacing})")
    return problems


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
    qtbot.waitUntil(lambda: not _layout_problems(cards, spacing), timeout=5000)
    assert "She continued to inspire them all." in cards[1].body.text()
