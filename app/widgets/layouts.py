"""Layout helpers."""

from __future__ import annotations

from PySide6.QtWidgets import QLayout, QWidget


def widget_of(layout: QLayout) -> QWidget:
    """A plain widget holding ``layout`` without margins (to put a row of widgets in a form cell)."""
    w = QWidget()
    layout.setContentsMargins(0, 0, 0, 0)
    w.setLayout(layout)
    return w
