"""Read-only tables: the table and its cells, in the app's look."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

GREEN, RED, GREY = QColor("#15803d"), QColor("#b91c1c"), QColor("#6b7280")


def table(headers: list[str], stretch: int = 0) -> QTableWidget:
    """Rows selected whole, one at a time; columns sized to their content except ``stretch``."""
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().hide()
    t.setEditTriggers(QAbstractItemView.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectRows)
    t.setSelectionMode(QAbstractItemView.SingleSelection)
    t.setAlternatingRowColors(True)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
    t.horizontalHeader().setSectionResizeMode(stretch, QHeaderView.Stretch)
    return t


def cell(text: str, tip: str = "", color: QColor | None = None, right: bool = False) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    if tip:
        it.setToolTip(tip)
    if color is not None:
        it.setForeground(QBrush(color))
    if right:
        it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
    return it


def selected_row(t: QTableWidget) -> int | None:
    model = t.selectionModel()
    rows = model.selectedRows() if model is not None else []
    return rows[0].row() if rows else None
