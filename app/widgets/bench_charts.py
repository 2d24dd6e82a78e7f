"""The Benchmark panel's plots (pyqtgraph, in the theme's colours like the Performance panel's): the live view
of a running sweep (TTFT and TPOT of each request as it finishes, coloured by sweep point, and the output
throughput over time) and the results of one run or several overlaid (output throughput, TTFT p50/p99 and TPOT
p50/p99 against concurrency on a log scale of concurrency, and the E2E latency CDF)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pyqtgraph as pg

from app import bench_report
from app import theme as themes
from app.panels.performance import COLORS, style_plots

THROUGHPUT_WINDOW_S = 2.0  # the live throughput line: output tokens of the requests ended in the last 2 s


def _plot(widget: pg.GraphicsLayoutWidget, row: int, col: int, title: str, left: str,
          bottom: str) -> pg.PlotItem:
    p = widget.addPlot(row=row, col=col, title=f"<span style='font-size:10pt'>{title}</span>")
    p.showGrid(x=True, y=True, alpha=0.15)
    p.setLabel("left", left)
    p.setLabel("bottom", bottom)
    p.setMenuEnabled(False)
    return p


class LiveCharts(pg.GraphicsLayoutWidget):
    """TTFT against TPOT per request (one colour per sweep point) and output tokens/s over the run."""

    def __init__(self):
        super().__init__()
        self.p_scatter = _plot(self, 0, 0, "TTFT vs TPOT, per request", "TPOT (ms)", "TTFT (ms)")
        self.p_scatter.addLegend(offset=(-10, 10))
        self.p_tps = _plot(self, 0, 1, "Output throughput", "tokens/s", "time (s)")
        self.tps_curve = self.p_tps.plot([], [], pen=pg.mkPen(COLORS[2], width=2), fillLevel=0,
                                         brush=pg.mkBrush(COLORS[2] + "33"))
        self.scatters: dict[int, pg.PlotDataItem] = {}
        self._points: dict[int, tuple[list[float], list[float]]] = {}
        self._ends: deque[tuple[float, int]] = deque()  # (time, output tokens) of the last window's requests
        self.tps_x: list[float] = []
        self.tps_y: list[float] = []
        self.apply_theme(themes.current())

    def apply_theme(self, theme: themes.Theme) -> None:
        style_plots(self, [self.p_scatter, self.p_tps], theme)

    def clear(self) -> None:
        for item in self.scatters.values():
            self.p_scatter.removeItem(item)
        if self.p_scatter.legend is not None:
            self.p_scatter.legend.clear()
        self.scatters.clear()
        self._points.clear()
        self._ends.clear()
        self.tps_x, self.tps_y = [], []
        self.tps_curve.setData([], [])

    def add(self, sample) -> None:
        """A finished request (app.workers.bench_worker.RequestSample)."""
        if sample.ok and sample.tpot_ms is not None:
            if sample.point not in self.scatters:
                color = COLORS[sample.point % len(COLORS)]
                self.scatters[sample.point] = self.p_scatter.plot(
                    [], [], pen=None, symbol="o", symbolSize=7, symbolBrush=pg.mkBrush(color + "bb"),
                    symbolPen=None, name=f"concurrency {sample.concurrency}")
                self._points[sample.point] = ([], [])
            xs, ys = self._points[sample.point]
            xs.append(sample.ttft_ms)
            ys.append(sample.tpot_ms)
            self.scatters[sample.point].setData(xs, ys)
        self._ends.append((sample.t, sample.output_tokens if sample.ok else 0))
        while self._ends and self._ends[0][0] < sample.t - THROUGHPUT_WINDOW_S:
            self._ends.popleft()
        span = min(THROUGHPUT_WINDOW_S, max(sample.t, 1e-3))
        self.tps_x.append(sample.t)
        self.tps_y.append(sum(n for _, n in self._ends) / span)
        self.tps_curve.setData(self.tps_x, self.tps_y)

    def scatter_count(self) -> int:
        return sum(len(xs) for xs, _ in self._points.values())


class ResultCharts(pg.GraphicsLayoutWidget):
    """A run's results, or several runs overlaid (one colour per run; p99 dashed beside p50 solid)."""

    def __init__(self):
        super().__init__()
        self.p_tput = _plot(self, 0, 0, "Output throughput vs concurrency", "tokens/s", "max concurrency")
        self.p_ttft = _plot(self, 0, 1, "TTFT p50 / p99 vs concurrency", "ms", "max concurrency")
        self.p_tpot = _plot(self, 1, 0, "TPOT p50 / p99 vs concurrency", "ms", "max concurrency")
        self.p_cdf = _plot(self, 1, 1, "E2E latency CDF", "fraction of requests", "latency (ms)")
        for p in self.plot_items()[:3]:  # lines rise to the right: the legend top left
            p.addLegend(offset=(10, 10))
        self.p_cdf.addLegend(offset=(-10, -10))  # CDFs rise to the top: the legend bottom right
        self.p_cdf.setYRange(0, 1)
        self.apply_theme(themes.current())

    def plot_items(self) -> list[pg.PlotItem]:
        return [self.p_tput, self.p_ttft, self.p_tpot, self.p_cdf]

    def apply_theme(self, theme: themes.Theme) -> None:
        self.theme = theme
        style_plots(self, self.plot_items(), theme)

    def show_runs(self, reports: list[dict]) -> None:
        """Draw ``reports``: one run in detail (a CDF per concurrency), several overlaid (each run's CDF at
        its highest concurrency); a sweep over engine configurations counts as a run per configuration."""
        for p in self.plot_items():
            p.clear()
            if p.legend is not None:
                p.legend.clear()
        reports = [r for rep in reports for r in bench_report.split_configs(rep)]  # a line per engine config
        several = len(reports) > 1
        for i, rep in enumerate(reports):
            color = COLORS[i % len(COLORS)]
            name = bench_report.label(rep) if several else ""
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
                c = color if several else COLORS[j % len(COLORS)]
                conc = bench_report.concurrency(rep, point)
                self.p_cdf.plot(lat, frac, pen=pg.mkPen(c, width=2), stepMode=None,
                                name=f"{name} @ {conc}" if several else f"concurrency {conc}")
        self._scale_axes(reports)
        self.apply_theme(self.theme)

    def _scale_axes(self, reports: list[dict]) -> None:
        """Concurrency on a log scale with a tick at each value measured (1, 2, 4, 8, 16 evenly spaced, not
        bunched at the left); TTFT on a log scale too when the runs shown differ by more than 50x (one server
        queueing while another batches), so that neither line is flat at zero."""
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
        for p in self.plot_items()[:3]:
            p.enableAutoRange()

    @staticmethod
    def _line(plot: pg.PlotItem, rep: dict, key: str, color: str, name: str, dashed: bool = False) -> None:
        x, y = bench_report.series(rep, key)
        if not len(x):
            return
        from PySide6.QtCore import Qt

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
