"""The Benchmark panel's library of runs (app.panels.benchmark.BenchmarkPanel mixes this in): the saved runs
listed, reopened, deleted and imported, the ticked ones overlaid on one set of charts and two compared (deltas in
%, better / worse by the theme's colours)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QFileDialog, QHeaderView, QListWidgetItem, QTableWidgetItem

from app import bench_report
from app import theme as themes
from app.widgets.bench_charts import points_text


class RunLibraryMixin:
    """For BenchmarkPanel only: uses its library (app.bench_runs.RunLibrary), its Library tab's widgets and
    show_report."""

    def refresh_library(self) -> None:
        ticked = set(self.ticked_paths())
        self.runs.blockSignals(True)
        self.runs.clear()
        self._entries = self.library.entries()
        self._history_cache = {}  # reports read for the estimate, read again after a change
        for e in self._entries:
            item = QListWidgetItem(f"{e.label}  ·  {points_text(e.points)}  ·  {e.date[:16].replace('T', ' ')}\n"
                                   f"{e.setup}")
            item.setData(Qt.UserRole, str(e.path))
            details = "\n".join(f"{title}: {(e.details or {}).get(key, '')}"
                                for key, title in bench_report.SETUP_FIELDS)
            item.setToolTip(f"{details}\n\nRe-run: {e.command}")
            item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
            item.setCheckState(Qt.Checked if str(e.path) in ticked else Qt.Unchecked)
            self.runs.addItem(item)
        self.runs.blockSignals(False)
        self._update_comparison()
        if hasattr(self, "estimate_label"):
            self.update_estimate()  # a new run of the same model makes the estimate exact

    def ticked_paths(self) -> list[str]:
        return [self.runs.item(i).data(Qt.UserRole) for i in range(self.runs.count())
                if self.runs.item(i).checkState() == Qt.Checked]

    def set_ticked(self, paths: list[str]) -> None:
        for i in range(self.runs.count()):
            item = self.runs.item(i)
            item.setCheckState(Qt.Checked if item.data(Qt.UserRole) in paths else Qt.Unchecked)

    def _on_run_ticked(self, _item) -> None:
        self._update_comparison()

    def _load(self, path: str) -> dict | None:
        try:
            return self.library.load(path)
        except ValueError as e:
            self._say(str(e), error=True)
            return None

    def _open_item(self, item) -> None:
        report = self._load(item.data(Qt.UserRole))
        if report is not None:
            self.show_report(report)
            self.tabs.setCurrentIndex(1)

    def _open_selected(self) -> None:
        item = self.runs.currentItem()
        if item is not None:
            self._open_item(item)

    def _delete_selected(self) -> None:
        item = self.runs.currentItem()
        if item is not None:
            self.library.delete(item.data(Qt.UserRole))
            self.refresh_library()

    def import_report(self, path: str | Path) -> Path | None:
        """Add a report made by the command line to the library and show it; None (said in words) when the
        file is not a report."""
        try:
            dest = self.library.import_file(path)
        except ValueError as e:
            self._say(str(e), error=True)
            return None
        self.refresh_library()
        for i in range(self.runs.count()):
            if self.runs.item(i).data(Qt.UserRole) == str(dest):
                self.runs.setCurrentRow(i)
        report = self._load(str(dest))
        if report is not None:
            self.show_report(report)
            self._say(f"Imported {bench_report.label(report)!r} into the library.")
        return dest

    def _ask_import(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Import benchmark reports", str(Path.home()),
                                                "JSON report (*.json)")
        for p in paths:
            self.import_report(p)

    def show_overlay(self) -> None:
        """The ticked runs on one set of charts (the Results tab)."""
        reports = [r for r in (self._load(p) for p in self.ticked_paths()) if r is not None]
        if not reports:
            self._say("Tick the runs to overlay in the Library.", error=True)
            return
        self.charts.show_runs(reports)
        self._overlaid = reports
        self.show_comm_table(reports[0] if len(reports) == 1 else None)
        self.results_title.setText("Overlay: " + ", ".join(bench_report.label(r) for r in reports))
        if len(reports) == 1:
            self.show_report(reports[0])
        else:
            self.command.setText("")
            for b in self.export_buttons[1:]:
                b.setEnabled(False)  # CSV / JSON / Markdown are of one run; the PNG is of what is shown
            self.export_buttons[0].setEnabled(True)
        self.tabs.setCurrentIndex(1)

    def _update_comparison(self) -> None:
        """The two ticked runs side by side, the older as A and the newer as B: a row per concurrency and
        metric, Δ = new vs old in %, green where B is better, red where it is worse (higher throughput, lower
        latency); five columns that fit the width, no sideways scrolling."""
        paths = self.ticked_paths()
        table = self.compare_table
        table.setRowCount(0)
        if len(paths) != 2:
            self.compare_title.setText("Comparison: tick two runs.")
            table.setColumnCount(0)
            return
        a, b = self._load(paths[0]), self._load(paths[1])
        if a is None or b is None:
            return
        if (str(a.get("date", "")), paths[0]) > (str(b.get("date", "")), paths[1]):
            a, b = b, a  # A the older run, B the newer
        when = lambda r: str(r.get("date", ""))[:16].replace("T", " ")  # noqa: E731
        self.compare_title.setText(f"A (older) = {bench_report.label(a)}, {when(a)}   ·   B (newer) = "
                                   f"{bench_report.label(b)}, {when(b)}   ·   Δ = new vs old, (B − A) / A: "
                                   f"green better, red worse")
        self.compare_title.setWordWrap(True)
        theme = themes.current()
        rows = bench_report.compare(a, b)
        cols = ["concurrency", "metric", "A (older)", "B (newer)", "Δ new vs old"]
        table.setColumnCount(len(cols))
        table.setHorizontalHeaderLabels(cols)
        metrics = bench_report.COLUMNS[:6]
        table.setRowCount(len(rows) * len(metrics))
        i = 0
        for r in rows:
            for key, title in metrics:
                va, vb, d = r[key]
                verdict = bench_report.verdict(key, d)
                cells = [str(r["concurrency"]), title, _fmt(va), _fmt(vb),
                         "" if d is None else f"{d:+.1f}%" + {"better": " better", "worse": " worse"}.get(verdict, "")]
                for j, text in enumerate(cells):
                    item = QTableWidgetItem(text)
                    item.setTextAlignment((Qt.AlignLeft if j == 1 else Qt.AlignRight) | Qt.AlignVCenter)
                    if j == 1:
                        item.setToolTip(bench_report.METRIC_TIPS.get(key, ""))
                    if j == 4 and verdict in ("better", "worse"):
                        item.setForeground(QColor(theme["ok_text" if verdict == "better" else "error_text"]))
                        item.setData(Qt.UserRole, verdict)
                    table.setItem(i, j, item)
                i += 1
        header = table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeToContents)
        table.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)


def _fmt(v) -> str:
    return "" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)
