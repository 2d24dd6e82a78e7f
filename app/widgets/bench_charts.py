"""The Benchmark panel's plots (pyqtgraph, in the theme's colours like the Performance panel's): the live view
of a running sweep (TTFT against TPOT of each request as it finishes, coloured by sweep point, and the output
throughput over time) and the results of one run or several overlaid (output throughput, TTFT p50/p99 and TPOT
p50/p99 against concurrency on a log scale of concurrency, and the E2E latency CDF).

Legends are a line of text under the plots (wrapping to the width), never over the points; axes start at zero
(the latency CDF's: padded around the data) and end at a rounded value, so that one point or a flat line is not
drawn on a 202.6-203.4 ms axis. Each plot's tooltip says what its metric means (app.bench_report.GLOSSARY).

Note: pyqtgraph's ``GraphicsLayoutWidget.__init__`` sets ``self.clear = self.ci.clear`` on the instance, which
hid the ``clear`` method the live charts had as its subclass (and clearing the layout removed every plot: the
Live tab stayed blank). The charts are therefore plain widgets holding a GraphicsLayoutWidget (``view``), and
their own "start again" is ``reset``."""

from __future__ import annotations

import math
from collections import deque
from html import escape

import numpy as np
import pyqtgraph as pg

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QImage, QPainter
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app import bench_report
from app import theme as themes
from app.panels.performance import COLORS, style_plots

# room around the plots inside their view: the charts on the right no longer run into the panel's border, and
# the last x tick label (up to LABEL_OVERHANG px past the axis) fits in the right margin
LABEL_OVERHANG = 18
VIEW_MARGINS = (4, 4, LABEL_OVERHANG + 4, 4)
THROUGHPUT_WINDOW_S = 2.0  # the live throughput line: output tokens of the requests ended in the last 2 s


class _BottomAxis(pg.AxisItem):
    """An x axis whose end labels are drawn: a label is centred on its tick, so the one at the axis' end
    reaches past it, and pyqtgraph hides it (with a grid shown its ``hideOverlappingLabels`` tolerance is not
    applied). Here a label may reach LABEL_OVERHANG px past either end (the view's margins leave that room)."""

    def boundingRect(self):
        return super().boundingRect().adjusted(-LABEL_OVERHANG, 0, LABEL_OVERHANG, 0)


def _plot(widget: pg.GraphicsLayoutWidget, row: int, col: int, title: str, left: str, bottom: str,
          tip: str = "") -> pg.PlotItem:
    p = widget.addPlot(row=row, col=col, title=f"<span style='font-size:10pt'>{title}</span>",
                       axisItems={"bottom": _BottomAxis("bottom")})
    p.showGrid(x=True, y=True, alpha=0.15)
    p.setLabel("left", left)
    p.setLabel("bottom", bottom)
    p.setMenuEnabled(False)
    if tip:
        p.setToolTip(tip)
        p.titleLabel.setToolTip(tip)
    return p


class Legend(QLabel):
    """A legend as a line of text under the plots: a coloured mark and a name per entry, wrapping to the
    width (pyqtgraph's legends sit over the plot area and cover points)."""

    def __init__(self):
        super().__init__()
        self.setWordWrap(True)
        self.setTextFormat(Qt.RichText)
        self.setContentsMargins(8, 0, 8, 2)
        self.entries: list[tuple[str, str, str]] = []  # (mark, colour, name)

    def set_entries(self, entries: list[tuple[str, str, str]]) -> None:
        self.entries = list(entries)
        self._render()

    def apply_theme(self, theme: themes.Theme) -> None:
        self.theme = theme
        self._render()

    def _render(self) -> None:
        theme = getattr(self, "theme", themes.current())
        parts = [f"<span style='color:{c}'>{escape(m)}</span>&nbsp;{escape(n).replace(' ', '&nbsp;')}"
                 for m, c, n in self.entries]
        self.setStyleSheet(f"background: {theme['surface']}; color: {theme['text']};")  # the plots' ground
        self.setText(" &nbsp;&nbsp; ".join(parts))
        self.setVisible(bool(self.entries))


SOLID, DASHED = "━━●", "╍╍▼"  # the marks of a p50 (solid, dots) and a p99 (dashed, triangles) line


def nice_ceil(v: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10 x 10^k at or above ``v`` (> 0)."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * k >= v * (1 - 1e-9):
            return m * k
    return 10 * k


def nice_floor(v: float) -> float:
    """The largest of the same round values at or below ``v`` (0 for v <= 0)."""
    if v <= 0 or not math.isfinite(v):
        return 0.0
    k = 10 ** math.floor(math.log10(v))
    for m in (10, 8, 6, 5, 4, 3, 2.5, 2, 1.5, 1.2, 1):
        if m * k <= v * (1 + 1e-9):
            return m * k
    return k


def value_range(values, from_zero: bool = True) -> tuple[float, float] | None:
    """The axis range for ``values``: from 0 (or, not from_zero, padded below the smallest by at least 10 % of
    the largest) up to a round value above the largest with ~8 % headroom; None without finite values."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return None
    lo, hi = min(v), max(v)
    if hi <= 0:
        return (0.0, 1.0)
    if from_zero:
        return (0.0, nice_ceil(hi * 1.08))
    pad = max(0.08 * (hi - lo), 0.1 * abs(hi))
    return (nice_floor(max(0.0, lo - pad)), nice_ceil(hi + pad))


def _set_y(plot: pg.PlotItem, values, log: bool = False) -> None:
    v = [float(x) for x in values if x is not None and float(x) > 0]
    if not v:
        plot.enableAutoRange(y=True)
        return
    if log:
        plot.setYRange(math.log10(min(v) / 1.6), math.log10(max(v) * 1.6), padding=0)
    else:
        plot.setYRange(*value_range(v), padding=0)


def _set_x_log(plot: pg.PlotItem, values) -> None:
    v = [float(x) for x in values if x and float(x) > 0]
    if v:  # half a decade beyond the ends: one point sits in the middle, not on the edge
        plot.setXRange(math.log10(min(v)) - 0.25, math.log10(max(v)) + 0.25, padding=0)


def points_text(n: int) -> str:
    return f"{n} point" if n == 1 else f"{n} points"


class _Charts(QWidget):
    """Plots in a view (a GraphicsLayoutWidget, see the module's note) with a legend line under them, in the
    theme's colours. A subclass adds its plots to ``self.view`` and names them in ``plot_items``."""

    def __init__(self):
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        self.view = pg.GraphicsLayoutWidget()
        self.view.ci.setContentsMargins(*VIEW_MARGINS)
        lay.addWidget(self.view, 1)
        self.legend = Legend()
        lay.addWidget(self.legend)

    def plot_items(self) -> list[pg.PlotItem]:
        raise NotImplementedError

    def apply_theme(self, theme: themes.Theme) -> None:
        self.theme = theme
        style_plots(self.view, self.plot_items(), theme)
        self.legend.apply_theme(theme)


class LiveCharts(_Charts):
    """TTFT (y) against TPOT (x) per request (one colour per sweep point) and output tokens/s over the run."""

    def __init__(self):
        super().__init__()
        g = bench_report.GLOSSARY
        self.p_scatter = _plot(self.view, 0, 0, "TTFT vs TPOT, per request", "TTFT (ms)", "TPOT (ms)",
                               f"TTFT: {g['TTFT']}\nTPOT: {g['TPOT']}")
        self.p_tps = _plot(self.view, 0, 1, "Output throughput", "tokens/s", "time (s)", g["throughput"])
        self.tps_curve = self.p_tps.plot([], [], pen=pg.mkPen(COLORS[2], width=2), fillLevel=0,
                                         brush=pg.mkBrush(COLORS[2] + "33"))
        self.scatters: dict[int, pg.PlotDataItem] = {}
        self._points: dict[int, tuple[list[float], list[float]]] = {}
        self._ends: deque[tuple[float, int]] = deque()  # (time, output tokens) of the last window's requests
        self.tps_x: list[float] = []
        self.tps_y: list[float] = []
        self.apply_theme(themes.current())

    def plot_items(self) -> list[pg.PlotItem]:
        return [self.p_scatter, self.p_tps]

    def reset(self) -> None:
        """Empty the plots for a new run (the plots themselves stay; see the module's note on ``clear``)."""
        for item in self.scatters.values():
            self.p_scatter.removeItem(item)
        self.legend.set_entries([])
        self.scatters.clear()
        self._points.clear()
        self._ends.clear()
        self.tps_x, self.tps_y = [], []
        self.tps_curve.setData([], [])
        for p in (self.p_scatter, self.p_tps):
            p.setXRange(0, 1, padding=0)
            p.setYRange(0, 1, padding=0)

    def add(self, sample) -> None:
        """A finished request (app.workers.bench_worker.RequestSample)."""
        if sample.ok and sample.tpot_ms is not None:
            if sample.point not in self.scatters:
                color = COLORS[sample.point % len(COLORS)]
                self.scatters[sample.point] = self.p_scatter.plot(
                    [], [], pen=None, symbol="o", symbolSize=7, symbolBrush=pg.mkBrush(color + "bb"),
                    symbolPen=None)
                self._points[sample.point] = ([], [])
                self.legend.set_entries([*self.legend.entries, ("●", color, f"concurrency {sample.concurrency}")])
            xs, ys = self._points[sample.point]
            xs.append(sample.tpot_ms)
            ys.append(sample.ttft_ms)
            self.scatters[sample.point].setData(xs, ys)
            self.p_scatter.setXRange(*value_range(x for a, _ in self._points.values() for x in a), padding=0)
            self.p_scatter.setYRange(*value_range(y for _, b in self._points.values() for y in b), padding=0)
        self._ends.append((sample.t, sample.output_tokens if sample.ok else 0))
        while self._ends and self._ends[0][0] < sample.t - THROUGHPUT_WINDOW_S:
            self._ends.popleft()
        span = min(THROUGHPUT_WINDOW_S, max(sample.t, 1e-3))
        self.tps_x.append(sample.t)
        self.tps_y.append(sum(n for _, n in self._ends) / span)
        self.tps_curve.setData(self.tps_x, self.tps_y)
        self.p_tps.setXRange(*value_range(self.tps_x), padding=0)
        self.p_tps.setYRange(*value_range(self.tps_y), padding=0)

    def scatter_count(self) -> int:
        return sum(len(xs) for xs, _ in self._points.values())

    def plotted_points(self) -> int:
        """Data points drawn in the scatter plot now (what is on screen, read back from the plot itself)."""
        n = 0
        for item in self.p_scatter.listDataItems():
            x, _y = item.getData()
            n += 0 if x is None else len(x)
        return n


class ResultCharts(_Charts):
    """A run's results, or several runs overlaid (one colour per run; p99 dashed beside p50 solid)."""

    def __init__(self):
        super().__init__()
        g = bench_report.GLOSSARY
        # titles without "vs concurrency" (the x axis says it): a title sets its plot's minimum width, and two
        # columns of the longer ones did not fit the Results tab at 1024 px (the right-hand charts were cut)
        self.p_tput = _plot(self.view, 0, 0, "Output throughput", "tokens/s", "max concurrency",
                            g["throughput"])
        self.p_ttft = _plot(self.view, 0, 1, "TTFT p50 / p99", "ms", "max concurrency",
                            f"TTFT: {g['TTFT']}\np50: half the requests were faster; p99: 99 in 100 were.")
        self.p_tpot = _plot(self.view, 1, 0, "TPOT p50 / p99", "ms", "max concurrency",
                            f"TPOT: {g['TPOT']}\np50: half the requests were faster; p99: 99 in 100 were.")
        self.p_cdf = _plot(self.view, 1, 1, "E2E latency CDF", "fraction of requests", "latency (ms)",
                           f"E2EL: {g['E2EL']}\nCDF: {g['CDF']}")
        self.p_cdf.setYRange(0, 1.05, padding=0)
        self.apply_theme(themes.current())

    def plot_items(self) -> list[pg.PlotItem]:
        return [self.p_tput, self.p_ttft, self.p_tpot, self.p_cdf]

    def show_runs(self, reports: list[dict]) -> None:
        """Draw ``reports``: one run in detail (a CDF per concurrency), several overlaid (each run's CDF at
        its highest concurrency); a sweep over engine configurations counts as a run per configuration."""
        for p in self.plot_items():
            p.clear()
        reports = [r for rep in reports for r in bench_report.split_configs(rep)]  # a line per engine config
        several = len(reports) > 1
        latencies: list[float] = []
        grey = self.theme["muted"]
        runs: list[tuple[str, str, str]] = []
        cdfs: list[tuple[str, str, str]] = []
        for i, rep in enumerate(reports):
            color = COLORS[i % len(COLORS)]
            name = bench_report.label(rep) if several else ""
            if several:
                runs.append(("■", color, name))
            self._line(self.p_tput, rep, "output_throughput", color, name or "output tok/s")
            self._line(self.p_ttft, rep, "median_ttft_ms", color, f"{name} p50".strip())
            self._line(self.p_ttft, rep, "p99_ttft_ms", color, f"{name} p99".strip(), dashed=True)
            self._line(self.p_tpot, rep, "median_tpot_ms", color, f"{name} p50".strip())
            self._line(self.p_tpot, rep, "p99_tpot_ms", color, f"{name} p99".strip(), dashed=True)
            pts = sorted(rep.get("points", []), key=lambda p: bench_report.concurrency(rep, p))
            if several and pts:
                pts = pts[-1:]
            for j, point in enumerate(pts):
                lat, frac = bench_report.latency_cdf(point)
                latencies += list(lat)
                c = color if several else COLORS[j % len(COLORS)]
                conc = bench_report.concurrency(rep, point)
                sym = {"symbol": "o", "symbolSize": 6, "symbolBrush": pg.mkBrush(c), "symbolPen": None} \
                    if len(lat) == 1 else {}
                self.p_cdf.plot(lat, frac, pen=pg.mkPen(c, width=2), stepMode=None,
                                name=f"{name} @ {conc}" if several else f"concurrency {conc}", **sym)
                if not several:
                    cdfs.append(("━", c, f"CDF at concurrency {conc}"))
        self.legend.set_entries(runs + ([(SOLID, grey, "p50"), (DASHED, grey, "p99")] if reports else []) + cdfs
                                + ([("━", grey, "CDF: each run at its highest concurrency")] if several else []))
        self._scale_axes(reports, latencies)
        self.apply_theme(self.theme)

    def _scale_axes(self, reports: list[dict], latencies: list[float]) -> None:
        """Concurrency on a log scale with a tick at each value measured (1, 2, 4, 8, 16 evenly spaced, not
        bunched at the left); TTFT on a log scale too when the runs shown differ by more than 50x (one server
        queueing while another batches), so that neither line is flat at zero. Linear value axes from 0 to a
        round value above the data."""
        concs = sorted({c for rep in reports for c in bench_report.series(rep, "output_throughput")[0]} |
                       {c for rep in reports for c in bench_report.series(rep, "median_ttft_ms")[0]})
        concs = [float(c) for c in concs if c > 0]
        for p in self.plot_items()[:3]:
            p.setLogMode(x=bool(concs), y=False)
            p.getAxis("bottom").setTicks([[(float(np.log10(c)), f"{c:g}") for c in concs]] if concs else None)
        ttfts = [v for rep in reports for key in ("median_ttft_ms", "p99_ttft_ms")
                 for v in bench_report.series(rep, key)[1] if v > 0]
        log_ttft = bool(ttfts and max(ttfts) / min(ttfts) > 50)
        self.p_ttft.setLogMode(x=bool(concs), y=log_ttft)
        self.p_ttft.setLabel("left", "ms (log scale)" if log_ttft else "ms")
        for p, keys in ((self.p_tput, ("output_throughput",)), (self.p_ttft, ("median_ttft_ms", "p99_ttft_ms")),
                        (self.p_tpot, ("median_tpot_ms", "p99_tpot_ms"))):
            values = [v for rep in reports for k in keys for v in bench_report.series(rep, k)[1]]
            _set_y(p, values, log=(p is self.p_ttft and log_ttft))
            if concs:
                _set_x_log(p, concs)
            else:
                p.enableAutoRange(x=True)
        xr = value_range(latencies, from_zero=False)
        if xr is not None:
            self.p_cdf.setXRange(*xr, padding=0)
        self.p_cdf.setYRange(0, 1.05, padding=0)

    @staticmethod
    def _line(plot: pg.PlotItem, rep: dict, key: str, color: str, name: str, dashed: bool = False) -> None:
        x, y = bench_report.series(rep, key)
        if not len(x):
            return
        pen = pg.mkPen(color, width=2, style=Qt.DashLine if dashed else Qt.SolidLine)
        plot.plot(x, y, pen=pen, symbol="t" if dashed else "o", symbolSize=7, symbolBrush=pg.mkBrush(color),
                  symbolPen=None, name=name)

    def curves(self, plot: pg.PlotItem) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (x, y) data of ``plot``'s curves as given (before the axes' log scales; tests, exports)."""
        out = []
        for item in plot.listDataItems():
            d = item.getOriginalDataset()
            out.append((d[0], d[1]))
        return out

    def titled_image(self, title: str, subtitle: str = "") -> QImage:
        """The charts as they are drawn, under a title (and a line of what was measured): the PNG export."""
        shot = self.grab().toImage()  # the plots and the legend under them
        theme = getattr(self, "theme", themes.current())
        scale = shot.devicePixelRatio() or 1.0
        w = shot.width()
        pad = int(10 * scale)
        title_font = QFont()
        title_font.setPixelSize(int(17 * scale))
        title_font.setBold(True)
        sub_font = QFont()
        sub_font.setPixelSize(int(12 * scale))
        # the subtitle wraps to the width: measure it first
        probe = QImage(1, 1, QImage.Format_ARGB32)
        qp = QPainter(probe)
        qp.setFont(sub_font)
        sub_rect = qp.boundingRect(QRectF(0, 0, w - 2 * pad, 10_000), Qt.TextWordWrap, subtitle) \
            if subtitle else QRectF()
        qp.setFont(title_font)
        title_rect = qp.boundingRect(QRectF(0, 0, w - 2 * pad, 10_000), Qt.TextWordWrap, title)
        qp.end()
        head = int(pad + title_rect.height() + (pad // 2 + sub_rect.height() if subtitle else 0) + pad)
        out = QImage(w, shot.height() + head, QImage.Format_ARGB32)
        out.fill(QColor(theme["surface"]))
        p = QPainter(out)
        p.setPen(QColor(theme["text"]))
        p.setFont(title_font)
        p.drawText(QRectF(pad, pad, w - 2 * pad, title_rect.height()), Qt.TextWordWrap, title)
        if subtitle:
            p.setPen(QColor(theme["text_secondary"]))
            p.setFont(sub_font)
            p.drawText(QRectF(pad, pad + title_rect.height() + pad // 2, w - 2 * pad, sub_rect.height()),
                       Qt.TextWordWrap, subtitle)
        shot.setDevicePixelRatio(1.0)
        p.drawImage(0, head, shot)
        p.end()
        return out
