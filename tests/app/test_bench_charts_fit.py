"""Issue 45 (first-day polish): at 1024x700 the Benchmark Results tab's right-hand charts (TTFT p50/p99, the E2E
latency CDF) ran into the panel's border and the CDF's last x tick label was hidden. The plots keep a margin
inside their view, and a tick label at the end of an x axis is drawn."""

from __future__ import annotations

from PySide6.QtGui import QImage, QPainter

from tests.app.test_benchmark_reports import _point, _report


def _drawn_labels(axis) -> list[str]:
    img = QImage(10, 10, QImage.Format_ARGB32)
    painter = QPainter(img)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [text for _rect, _flags, text in specs[2]] if specs else []


def test_result_charts_fit_the_tab_at_1024x700(make_window, qtbot):
    w = make_window(autoload=False)
    w.resize(1024, 700)
    w.show_panel("benchmark")
    panel = w.panels["benchmark"]
    rep = _report([_point(1, 10.0), _point(2, 18.0), _point(4, 30.0)], label="three points")
    panel.show_report(rep)
    panel.tabs.setCurrentIndex(1)
    view = panel.charts.view
    qtbot.waitUntil(lambda: view.isVisible() and view.width() > 300, timeout=10_000)
    qtbot.wait(200)  # the graphics layout follows the view's size on the event loop

    def rights() -> list[float]:
        return [p.mapRectToScene(p.boundingRect()).right() for p in panel.charts.plot_items()]

    assert view.ci.geometry().width() <= view.width(), (view.ci.geometry(), view.width())  # nothing cut
    assert max(rights()) <= view.width() - 10, (rights(), view.width())  # a margin to the border
    cdf = panel.charts.p_cdf
    cdf.setXRange(0, 400, padding=0)  # a tick at the very end of the axis
    qtbot.wait(50)
    labels = _drawn_labels(cdf.getAxis("bottom"))
    assert "400" in labels, labels
