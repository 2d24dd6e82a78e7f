"""Performance, live: TTFT and TPOT of every request (points and a moving median; a request stopped after
its first token, in the chat or over HTTP, is drawn too, and again as a cross; a failed one is counted), generation tokens/s, running
and waiting requests, KV-cache use, and interconnect traffic (per-GPU PCIe TX/RX from NVML; the engine's
counted all-reduce bytes/s when it reports them, i.e. with TP > 1). Updated with every engine stats sample
(twice a second); pause, clear, export PNG and CSV.

The tokens/s figure is the engine's own (``EngineStats.generation_tokens_per_s``: every token generated, by
all running requests, counted over a sliding window of a few seconds, see ``engine.metrics.TokenRate``), so
it is right from the first tokens of a stream after an idle spell and reads 0 a few seconds after the engine
stops."""

from __future__ import annotations

import csv
import time
from collections import deque
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app import theme as themes
from app.context import AppContext

HISTORY = 3600  # samples kept per series
MEDIAN_WINDOW = 9
STOPPED = ("abort", "error")  # finish reasons of requests that did not end by themselves
COLORS = ["#ea580c", "#2563eb", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#4b5563"]


def speculative_text(stats) -> str:
    """The summary's speculative-decoding part: acceptance and tokens per verify pass ('' while it is off)."""
    if not getattr(stats, "spec_method", None):
        return ""
    proposed, steps = stats.spec_proposed_total, stats.spec_verify_steps_total
    rate = stats.spec_accepted_total / proposed if proposed else 0.0
    per_step = stats.spec_emitted_total / steps if steps else 0.0
    return f" · speculative ({stats.spec_method}): {100 * rate:.0f}% accepted, {per_step:.2f} tokens per step"


def moving_median(values: np.ndarray, window: int = MEDIAN_WINDOW) -> np.ndarray:
    """Trailing median over up to ``window`` points."""
    out = np.empty(len(values))
    for i in range(len(values)):
        out[i] = np.median(values[max(0, i - window + 1):i + 1])
    return out


def style_plots(widget: pg.GraphicsLayoutWidget, plots: list[pg.PlotItem], theme: themes.Theme) -> None:
    """Give pyqtgraph plots a theme's colours (app.theme.Theme): the background, the axes with their ticks,
    labels and grid, the titles and the legends' labels (the curves keep their colours)."""
    widget.setBackground(theme["surface"])
    for p in plots:
        for name in ("left", "bottom"):
            axis = p.getAxis(name)
            axis.setPen(theme["text_secondary"])  # the axis line, ticks and grid (drawn faint)
            axis.setTextPen(theme["text_secondary"])
        p.setTitle(p.titleLabel.text, color=theme["text"])
        legend = p.legend
        if legend is not None:
            legend.setLabelTextColor(theme["text"])
            for _sample, label in legend.items:
                label.setText(label.text, color=theme["text"])


class Series:
    def __init__(self, name: str):
        self.name = name
        self.x: deque[float] = deque(maxlen=HISTORY)
        self.y: deque[float] = deque(maxlen=HISTORY)

    def add(self, x: float, y: float) -> None:
        self.x.append(x)
        self.y.append(y)

    def clear(self) -> None:
        self.x.clear()
        self.y.clear()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.fromiter(self.x, float, len(self.x)), np.fromiter(self.y, float, len(self.y))


class PerformancePanel(QWidget):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
        self.t0 = time.monotonic()
        self.paused = False
        self.num_requests = 0
        self.num_stopped = 0  # stopped by the user or a client, or failed
        self.ttft = Series("ttft_ms")
        self.tpot = Series("tpot_ms")
        self.ttft_stopped = Series("ttft_stopped_ms")  # also in ttft / tpot: drawn again as crosses
        self.tpot_stopped = Series("tpot_stopped_ms")
        self._recorded: deque[str] = deque(maxlen=256)  # request ids plotted from the engine's records
        self._stats = None  # the last EngineStats
        self.gen_tps = Series("generation_tokens_per_s")
        self.running = Series("running")
        self.waiting = Series("waiting")
        self.kv = Series("kv_cache_percent")
        self.allreduce = Series("allreduce_MBps")
        self.pcie: dict[str, Series] = {}  # "GPU0 TX" -> series
        self._last_comm: tuple[float, float] | None = None
        self._build()
        ctx.engine.statsUpdated.connect(self.add_stats)
        ctx.engine.requestRecorded.connect(self.add_record)
        # the engine client's records cover every request (stopped and failed too, chat and HTTP); a chat
        # reply's end only counts one that has no record (refused before it reached the engine)
        ctx.engine.replyFinished.connect(self.add_reply)
        ctx.engine.replyFailed.connect(self.add_failure)
        ctx.hardware.sampled.connect(self.add_hardware)

    def _build(self) -> None:
        pg.setConfigOptions(antialias=True, background="w", foreground="#374151")
        root = QVBoxLayout(self)
        root.setContentsMargins(20, 16, 20, 16)
        head = QHBoxLayout()
        title = QLabel("Performance")
        title.setObjectName("pageTitle")
        head.addWidget(title)
        head.addStretch(1)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setCheckable(True)
        self.pause_button.toggled.connect(self.set_paused)
        clear = QPushButton("Clear")
        clear.clicked.connect(self.clear)
        png = QPushButton("Export PNG…")
        png.clicked.connect(lambda: self._ask_export("PNG image (*.png)", ".png", self.export_png))
        csv_button = QPushButton("Export CSV…")
        csv_button.clicked.connect(lambda: self._ask_export("CSV (*.csv)", ".csv", self.export_csv))
        for b in (self.pause_button, clear, png, csv_button):
            head.addWidget(b)
        root.addLayout(head)
        self.summary = QLabel("Waiting for the engine…")
        self.summary.setObjectName("hint")
        root.addWidget(self.summary)
        self.plots = pg.GraphicsLayoutWidget()
        root.addWidget(self.plots, 1)

        def plot(row: int, col: int, title: str, left: str, bottom: str = "time (s)") -> pg.PlotItem:
            p = self.plots.addPlot(row=row, col=col, title=f"<span style='font-size:10pt'>{title}</span>")
            p.showGrid(x=True, y=True, alpha=0.15)
            p.setLabel("left", left)
            p.setLabel("bottom", bottom)
            p.setMenuEnabled(False)
            return p

        self.p_ttft = plot(0, 0, "Time to first token, per request", "ms", "request #")
        self.p_ttft.addLegend(offset=(-10, 10))
        self.ttft_points = self.p_ttft.plot([], [], pen=None, symbol="o", symbolSize=6,
                                            symbolBrush=pg.mkBrush(COLORS[0] + "99"), symbolPen=None, name="request")
        self.ttft_median = self.p_ttft.plot([], [], pen=pg.mkPen(COLORS[1], width=2), name="moving median")
        self.ttft_stopped_points = self.p_ttft.plot([], [], pen=None, symbol="x", symbolSize=9,
                                                    symbolBrush=pg.mkBrush(COLORS[4]), symbolPen=pg.mkPen(COLORS[4]),
                                                    name="stopped / failed")
        self.p_tpot = plot(0, 1, "Time per output token, per request", "ms", "request #")
        self.tpot_points = self.p_tpot.plot([], [], pen=None, symbol="o", symbolSize=6,
                                            symbolBrush=pg.mkBrush(COLORS[0] + "99"), symbolPen=None)
        self.tpot_median = self.p_tpot.plot([], [], pen=pg.mkPen(COLORS[1], width=2))
        self.tpot_stopped_points = self.p_tpot.plot([], [], pen=None, symbol="x", symbolSize=9,
                                                    symbolBrush=pg.mkBrush(COLORS[4]), symbolPen=pg.mkPen(COLORS[4]))
        self.p_tps = plot(0, 2, "Generation throughput", "tokens/s")
        self.tps_curve = self.p_tps.plot([], [], pen=pg.mkPen(COLORS[2], width=2), fillLevel=0,
                                         brush=pg.mkBrush(COLORS[2] + "33"))
        self.p_req = plot(1, 0, "Requests", "count")
        self.p_req.addLegend(offset=(-10, 10))
        self.running_curve = self.p_req.plot([], [], pen=pg.mkPen(COLORS[0], width=2), name="running")
        self.waiting_curve = self.p_req.plot([], [], pen=pg.mkPen(COLORS[3], width=2), name="waiting")
        self.p_kv = plot(1, 1, "KV-cache use", "%")
        self.p_kv.setYRange(0, 100)
        self.kv_curve = self.p_kv.plot([], [], pen=pg.mkPen(COLORS[5], width=2), fillLevel=0,
                                       brush=pg.mkBrush(COLORS[5] + "33"))
        self.p_net = plot(1, 2, "Interconnect traffic", "MB/s")
        self.p_net.addLegend(offset=(-10, 10))
        self.allreduce_curve = self.p_net.plot([], [], pen=pg.mkPen(COLORS[4], width=2), name="all-reduce")
        self.pcie_curves: dict[str, pg.PlotDataItem] = {}
        self.net_note = pg.TextItem("", color="#6b7280", anchor=(0.5, 0.5))
        self.p_net.addItem(self.net_note, ignoreBounds=True)
        self._update_net_note()
        self.apply_theme(themes.current())

    def plot_items(self) -> list[pg.PlotItem]:
        return [self.p_ttft, self.p_tpot, self.p_tps, self.p_req, self.p_kv, self.p_net]

    def apply_theme(self, theme: themes.Theme) -> None:
        """The plots in the theme's colours (MainWindow calls it when the theme changes)."""
        self.theme = theme
        style_plots(self.plots, self.plot_items(), theme)
        self.net_note.setColor(theme["muted"])

    # ------------------------------------------------------------------------------------------------
    # data in

    def _tp(self) -> int:
        return self.ctx.engine.info.tensor_parallel_size if self.ctx.engine.info else 1

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def add_stats(self, stats) -> None:
        t = self._now()
        self.gen_tps.add(t, stats.generation_tokens_per_s)
        self.running.add(t, stats.num_running)
        self.waiting.add(t, stats.num_waiting)
        self.kv.add(t, 100.0 * stats.kv_usage)
        comm = getattr(stats, "comm_bytes_total", None)  # the engine counts all-reduce bytes with TP > 1
        if comm is not None and self._tp() > 1:  # TP = 1 reports 0 bytes: no line (the note says why)
            if self._last_comm is not None and t > self._last_comm[0]:
                rate = (comm - self._last_comm[1]) / (t - self._last_comm[0]) / 1e6
                self.allreduce.add(t, max(rate, 0.0))
            self._last_comm = (t, comm)
        self._stats = stats
        self._update_summary()
        self.redraw()

    def _update_summary(self) -> None:
        stats = self._stats
        if stats is None:
            return
        self.summary.setText(
            f"{stats.generation_tokens_per_s:.1f} tokens/s · {stats.num_running} running · {stats.num_waiting} "
            f"waiting · KV cache {100 * stats.kv_usage:.1f}% of {stats.num_kv_blocks:,} blocks · "
            f"prefix-cache hits {100 * stats.prefix_cache_hit_rate:.0f}% · {self._requests_text()}"
            + speculative_text(stats))

    def _requests_text(self) -> str:
        n = self.num_requests
        text = f"{n} request" + ("" if n == 1 else "s")
        return text + (f" ({self.num_stopped} stopped or failed)" if self.num_stopped else "")

    def _add_point(self, ttft: float | None, tpot: float | None, stopped: bool) -> None:
        """One request (seconds); a stopped or failed one is drawn again as a cross."""
        self.num_requests += 1
        n = self.num_requests
        self.num_stopped += stopped
        if ttft is not None:
            self.ttft.add(n, ttft * 1000)
            if stopped:
                self.ttft_stopped.add(n, ttft * 1000)
        if tpot is not None:
            self.tpot.add(n, tpot * 1000)
            if stopped:
                self.tpot_stopped.add(n, tpot * 1000)
        self._update_summary()
        self.redraw()

    def add_record(self, rec) -> None:
        """An engine.metrics.RequestRecord: one for every request, however it ended (chat and HTTP; a
        stopped or failed one has finish_reason "abort" / "error" and the timings it had)."""
        self._recorded.append(rec.request_id)
        self._add_point(rec.ttft, rec.tpot, rec.finish_reason in STOPPED)

    def add_reply(self, rid: str, stats) -> None:
        """A chat reply's end (app.workers.engine_worker.ReplyStats): a stopped one is plotted from it only
        when no engine record came for it (the record comes first)."""
        if stats.finish_reason not in STOPPED or rid in self._recorded:
            return
        tpot = 1.0 / stats.tokens_per_s if stats.tokens_per_s else None
        self._add_point(stats.ttft, tpot, True)

    def add_failure(self, rid: str, message: str) -> None:
        """A chat request that failed: counted, unless its engine record ("error") was (a refusal before
        the request reached the engine has none)."""
        if rid in self._recorded:
            return
        self._add_point(None, None, True)

    def add_hardware(self, snap) -> None:
        t = self._now()
        for g in snap.gpus:
            for label, value in ((f"GPU{g.index} TX", g.pcie_tx), (f"GPU{g.index} RX", g.pcie_rx)):
                if value is None:
                    continue
                if label not in self.pcie:
                    self.pcie[label] = Series(label.replace(" ", "_") + "_MBps")
                    color = COLORS[(len(self.pcie_curves)) % len(COLORS)]
                    style = Qt.SolidLine if label.endswith("TX") else Qt.DashLine
                    self.pcie_curves[label] = self.p_net.plot([], [], pen=pg.mkPen(color, width=2, style=style),
                                                              name=f"PCIe {label}")
                self.pcie[label].add(t, value / 1e6)
        self._update_net_note(snap)

    def _update_net_note(self, snap=None) -> None:
        has_gpu = bool(snap and snap.gpus)
        tp = self._tp()
        if has_gpu or self.allreduce.x:
            self.net_note.setText("")
            return
        text = "No NVIDIA GPU found:\nno PCIe counters to show."
        text += "\n\nThe engine's all-reduce traffic\nshows with TP > 1." if tp <= 1 else ""
        self.net_note.setText(text)
        self.net_note.setPos(0.5, 0.5)
        self.p_net.setXRange(0, 1, padding=0)
        self.p_net.setYRange(0, 1, padding=0)

    # ------------------------------------------------------------------------------------------------
    # drawing and controls

    def redraw(self) -> None:
        if self.paused:
            return
        x, y = self.ttft.arrays()
        self.ttft_points.setData(x, y)
        self.ttft_median.setData(x, moving_median(y) if len(y) else y)
        x, y = self.tpot.arrays()
        self.tpot_points.setData(x, y)
        self.tpot_median.setData(x, moving_median(y) if len(y) else y)
        self.ttft_stopped_points.setData(*self.ttft_stopped.arrays())
        self.tpot_stopped_points.setData(*self.tpot_stopped.arrays())
        self.tps_curve.setData(*self.gen_tps.arrays())
        self.running_curve.setData(*self.running.arrays())
        self.waiting_curve.setData(*self.waiting.arrays())
        self.kv_curve.setData(*self.kv.arrays())
        self.allreduce_curve.setData(*self.allreduce.arrays())
        for label, series in self.pcie.items():
            self.pcie_curves[label].setData(*series.arrays())
        if self.pcie or self.allreduce.x:
            self.p_net.enableAutoRange()

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self.pause_button.setText("Resume" if paused else "Pause")
        if not paused:
            self.redraw()

    def all_series(self) -> list[Series]:
        return [self.ttft, self.tpot, self.ttft_stopped, self.tpot_stopped, self.gen_tps, self.running, self.waiting, self.kv, self.allreduce,
                *self.pcie.values()]

    def clear(self) -> None:
        for s in self.all_series():
            s.clear()
        self.num_requests = self.num_stopped = 0
        self._recorded.clear()
        self._last_comm = None
        self.t0 = time.monotonic()
        self.redraw()

    def export_png(self, path: str | Path) -> None:
        self.plots.grab().save(str(path))

    def export_csv(self, path: str | Path) -> None:
        """One row per point: series, x (request number or seconds since start), y."""
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["series", "x", "y"])
            for s in self.all_series():
                for x, y in zip(s.x, s.y):
                    w.writerow([s.name, f"{x:.3f}", f"{y:.6g}"])

    def _ask_export(self, filter_: str, suffix: str, fn) -> None:
        name = time.strftime(f"kestrel-performance-%Y%m%d-%H%M%S{suffix}")
        path, _ = QFileDialog.getSaveFileName(self, "Export", str(Path.home() / name), filter_)
        if path:
            fn(path if path.endswith(suffix) else path + suffix)
