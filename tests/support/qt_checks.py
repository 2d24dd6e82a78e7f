"""Checks of what a Qt window shows, shared by the app tests (tests/app) and the install test's driver
(tests/install/drive_app.py, which runs under the install's own python: so no pytest and no import of the
app or of tests/ here; PySide6 only, imported where used). The driver loads this file by its path.

- layout_problems(cards, spacing)  what is wrong with chat message cards as laid out now ([] when all is well)
- coloured_pixels(widget)          strongly coloured pixels of a widget as drawn (the data of a chart)
- resize_window(window, size, wait) resize a main window whose minimum follows its sidebar
"""

from __future__ import annotations


def layout_problems(cards, spacing: int) -> list[str]:
    """What is wrong with the cards as laid out now ([] when every text is shown whole, with no gaps between
    the cards): a card or a word-wrapped label lower than its height for its width, a label ending below its
    card, a gap between two cards other than the list's spacing."""
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QLabel

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
                problems.append(f"card {i}: a label {label.height()} px high needs {need} "
                                f"({label.text()[:40]!r})")
            bottom = label.mapTo(card, QPoint(0, label.height())).y()
            if bottom > card.height():
                problems.append(f"card {i}: a label ends at {bottom}, below the card's {card.height()}")
    for a, b in zip(cards, cards[1:]):
        gap = b.y() - (a.y() + a.height())
        if gap != spacing:
            problems.append(f"a gap of {gap} px between cards {cards.index(a)} and {cards.index(b)} "
                            f"(spacing {spacing})")
    return problems


def coloured_pixels(widget) -> int:
    """Pixels of ``widget`` as drawn that are strongly coloured (the data: dots, lines, fills); axes, grid, text
    and the ground are grey, so an empty chart has next to none."""
    img = widget.grab().toImage()
    n = 0
    for y in range(0, img.height(), 2):
        for x in range(0, img.width(), 2):
            c = img.pixelColor(x, y)
            if c.hsvSaturation() > 120 and c.value() > 80:
                n += 1
    return n


def resize_window(window, size: tuple[int, int], wait, tries: int = 4) -> None:
    """Resize ``window`` to ``size``; its minimum follows its sidebar (folded below 1200 px), so ask again once
    that applied. ``wait(ms)`` lets Qt run meanwhile (qtbot.wait, or the driver's event pump)."""
    for _ in range(tries):
        window.resize(*size)
        wait(60)
        if (window.width(), window.height()) == tuple(size):
            break
