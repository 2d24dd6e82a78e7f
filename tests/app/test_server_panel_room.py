"""Issue 45 (first-day polish): at 1024x700 the Server panel's request log showed two and a half rows (the
settings above took the rest). The settings and the log are split (a splitter; the settings scroll when the
window is short) and the log keeps room for at least six rows; at 1600x1000 the settings show whole."""

from __future__ import annotations

import time

from app.panels.server import LOG_MIN_ROWS
from app.server_log import LogEntry


def _visible_rows(log) -> int:
    return log.viewport().height() // log.rowHeight(0)


def test_the_request_log_shows_six_rows_at_1024x700(make_window, qtbot):
    w = make_window(autoload=False)
    w.show_panel("server")
    panel = w.panels["server"]
    for i in range(12):
        panel.add_log_entry(LogEntry(time.time(), "POST", "/v1/chat/completions", 404 if i % 3 else 200, 5, 0.2,
                                     detail="model 'x' is not served here" if i % 3 else ""))
    w.resize(1024, 700)
    qtbot.waitUntil(lambda: panel.log.viewport().height() > 0, timeout=5_000)
    qtbot.wait(50)
    assert LOG_MIN_ROWS >= 6
    assert _visible_rows(panel.log) >= 6, (panel.log.viewport().height(), panel.log.rowHeight(0))
    assert panel.log.columnViewportPosition(6) + 60 <= panel.log.viewport().width()  # Detail has room
    # the settings are still there: the Start button shows, and the rest scrolls into view
    assert not panel.start_button.visibleRegion().isEmpty()

    w.resize(1600, 1000)
    qtbot.waitUntil(lambda: panel.top_scroll.verticalScrollBar().maximum() == 0, timeout=5_000)
    assert _visible_rows(panel.log) >= 10
