"""Benchmark: load-test an OpenAI-compatible endpoint (the local server started from the Server panel, or
any URL) with a sweep over max concurrency, as `kestrel bench sweep` does; see it while it runs (TTFT vs TPOT
of every request, output throughput) and when done (throughput, TTFT and TPOT p50/p99 against concurrency,
the latency CDF). Every finished run is saved in the library (app.bench_runs); runs there can be reopened,
overlaid on one set of charts, compared two at a time (deltas in %), and exported as PNG, CSV, JSON and
Markdown; reports written by `kestrel bench serve` / `sweep` are imported into it ("Import report…"). A sweep
over engine configurations (`--engine-configs`) is drawn as a line per configuration. When the run's server is
Kestrel's at TP > 1, the all-reduce strategies auto measured at start-up are shown as a table (and exported in
the Markdown and JSON). Each run shows the one command line that re-runs it from a terminal.

Before a run: presets by device (a CPU preset that finishes in about a minute with a small model, a GPU one as
the usual serving benchmark; app.bench_estimate), the time the sweep will take (a guess, scaled by a saved run of
the same model), and the form as it was last left (Store.pref "benchmark"; not the API key). Every report,
export and library entry says what was measured: model, file type, load options, device, versions
(app.bench_report.setup); Run and Stop stay in view under the scrolling form.

The run itself is app.workers.bench_worker.BenchWorker on a thread of its own: the panel only draws. Its widgets
are built in app.panels.benchmark_view, its library of runs is app.panels.benchmark_library."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QTableWidgetItem, QWidget

from app import bench_estimate, bench_report
from app import theme as themes
from app.bench_runs import RunLibrary, write_report
from app.context import AppContext
from app.panels.benchmark_library import RunLibraryMixin
from app.panels.benchmark_view import BenchmarkViewMixin
from app.widgets.bench_charts import points_text
from app.workers.bench_worker import BenchSpec, BenchWorker, parse_concurrencies

LOCAL, CUSTOM = "local", "custom"
PREFS = "benchmark"  # the form as last set (Store.pref), restored at start


class BenchmarkPanel(BenchmarkViewMixin, RunLibraryMixin, QWidget):
    def __init__(self, ctx: AppContext, library: RunLibrary | None = None):
        super().__init__()
        self.ctx = ctx
        self.library = library or RunLibrary()
        self.worker = BenchWorker()
        self.report: dict | None = None  # the run shown on the Results tab (the last one, or one reopened)
        self.local_url: str | None = ctx.server.url
        self.local_model: str | None = None
        self._build()
        self.worker.started.connect(self._on_started)
        self.worker.requestDone.connect(self._on_request)
        self.worker.progress.connect(self._on_progress)
        self.worker.pointDone.connect(self._on_point)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        ctx.server.started.connect(self._on_server_started)
        ctx.server.stopped.connect(self._on_server_stopped)
        ctx.engine.loaded.connect(self._on_engine_loaded)
        self._show_target()
        self._restore_prefs()
        self.refresh_library()

    # ------------------------------------------------------------------------------------------------
    # presets, the estimate, the form remembered

    def target_device(self) -> str:
        """The device of the server benchmarked, as well as the app knows it: the loaded model's for the local
        server; else a saved run's against the same URL; else this machine's (a GPU if it has one)."""
        info = getattr(self.ctx.engine, "info", None)
        if self.local_radio.isChecked() and info is not None and getattr(info, "device", ""):
            return info.device
        past = self._history()
        dev = ((past or {}).get("server", {}).get("kestrel") or {}).get("device")
        if dev:
            return dev
        if not self.local_radio.isChecked() or info is None:
            return "cuda" if self.ctx.num_gpus else "cpu"
        return info.device or "cpu"

    def _history(self) -> dict | None:
        """The newest saved run against the server and model the form names (None when there is none)."""
        local = self.local_radio.isChecked()
        url = (self.local_url if local else self.url.text().strip()) or ""
        model = (self.local_model if local else self.model.text().strip()) or None
        for e in getattr(self, "_entries", None) or []:
            if e.base_url.rstrip("/") != url.rstrip("/") or (model and e.model != model):
                continue
            cache = self.__dict__.setdefault("_history_cache", {})
            if e.path not in cache:
                try:
                    cache[e.path] = self.library.load(e.path)
                except ValueError:
                    cache[e.path] = None
            r = cache[e.path]
            if r is not None and bench_estimate.report_points(r):
                return r
        return None

    def apply_preset(self, key: str) -> None:
        """Fill the sizes from a preset (bench_estimate.PRESETS); the combo shows it."""
        preset = bench_estimate.PRESETS.get(key)
        self._applying = True
        try:
            i = self.preset.findData(key if preset else bench_estimate.CUSTOM)
            self.preset.setCurrentIndex(i)
            if preset is not None:
                self.dataset.setCurrentIndex(self.dataset.findData(preset.dataset))
                self.input_len.setValue(preset.input_len)
                self.output_len.setValue(preset.output_len)
                self.num_prompts.setValue(preset.num_prompts)
                self.concurrencies.setText(",".join(str(c) for c in preset.concurrencies))
        finally:
            self._applying = False
        self._on_form_changed()

    def _on_preset(self, _index: int) -> None:
        if not self._applying:
            self.apply_preset(self.preset.currentData())

    def _on_size_edited(self, *_a) -> None:
        if self._applying:
            return
        key = self.preset.currentData()
        p = bench_estimate.PRESETS.get(key)
        if p is not None and not self._matches(p):
            self._applying = True
            self.preset.setCurrentIndex(self.preset.findData(bench_estimate.CUSTOM))
            self._applying = False
        self._on_form_changed()

    def _matches(self, p: bench_estimate.Preset) -> bool:
        try:
            concs = tuple(parse_concurrencies(self.concurrencies.text()))
        except ValueError:
            return False
        return (self.dataset.currentData(), self.input_len.value(), self.output_len.value(),
                self.num_prompts.value(), concs) == (p.dataset, p.input_len, p.output_len, p.num_prompts,
                                                     p.concurrencies)

    def _on_form_changed(self, *_a) -> None:
        if self._applying or getattr(self, "_restoring", False):
            return
        self.update_estimate()
        self._save_prefs()

    def update_estimate(self) -> None:
        """The time the sweep in the form will take, said under the form (before Run)."""
        try:
            spec = self.spec(check_target=False)
        except ValueError as e:
            self.estimate_label.setText(f"Estimate: — ({e})")
            return
        est = bench_estimate.estimate(spec, self.target_device(), self._history())
        self.estimate_label.setText("Estimate: " + est.text()[0].lower() + est.text()[1:])
        self.estimate_label.setToolTip("Each point sends its prompts in waves of its concurrency; the time per "
                                       "token grows a little with the batch. A run of the same model scales "
                                       "the guess to what it measured.")
        self.estimate = est

    def _prefs(self) -> dict:
        return {"preset": self.preset.currentData(), "target": LOCAL if self.local_radio.isChecked() else CUSTOM,
                "url": self.url.text(), "model": self.model.text(), "dataset": self.dataset.currentData(),
                "input_len": self.input_len.value(), "output_len": self.output_len.value(),
                "range_ratio": round(self.range_ratio.value(), 2), "prefix_len": self.prefix_len.value(),
                "suffix_len": self.suffix_len.value(), "num_prefixes": self.num_prefixes.value(),
                "dataset_path": self.dataset_path.text(), "num_prompts": self.num_prompts.value(),
                "seed": self.seed.value(), "concurrencies": self.concurrencies.text(), "label": self.label.text()}

    def _save_prefs(self) -> None:
        """The form as it is now, remembered across restarts (the API key is not: it is a secret)."""
        self.ctx.store.set_pref(PREFS, self._prefs())

    def _restore_prefs(self) -> None:
        p = self.ctx.store.pref(PREFS) or {}
        self._restoring = True
        try:
            if not p:  # first use: the preset of the device the server runs on
                self.apply_preset("gpu" if bench_estimate.device_kind(self.target_device()) == "cuda" else "cpu")
                return
            self._applying = True
            try:
                i = self.preset.findData(p.get("preset", bench_estimate.CUSTOM))
                self.preset.setCurrentIndex(i if i >= 0 else self.preset.findData(bench_estimate.CUSTOM))
                j = self.dataset.findData(p.get("dataset", "random"))
                self.dataset.setCurrentIndex(max(j, 0))
                for name in ("input_len", "output_len", "prefix_len", "suffix_len", "num_prefixes",
                             "num_prompts", "seed"):
                    if isinstance(p.get(name), int):
                        getattr(self, name).setValue(p[name])
                if isinstance(p.get("range_ratio"), (int, float)):
                    self.range_ratio.setValue(float(p["range_ratio"]))
                for name in ("url", "model", "dataset_path", "concurrencies", "label"):
                    if isinstance(p.get(name), str):
                        getattr(self, name).setText(p[name])
                if p.get("target") == LOCAL and self.local_url is not None:
                    self.local_radio.setChecked(True)
            finally:
                self._applying = False
        finally:
            self._restoring = False
            self.update_estimate()

    def _on_engine_loaded(self, _info) -> None:
        self.update_estimate()

    # ------------------------------------------------------------------------------------------------
    # target and dataset

    def _show_target(self) -> None:
        local = self.local_radio.isChecked()
        for w in (self.url, self.model):  # the API key stays: the local server's, when it was given one
            w.setEnabled(not local)
        self.local_radio.setEnabled(self.local_url is not None)
        if self.local_url is None:
            self.local_note.setText("Not running: start the endpoint in the Server panel.")
            if local:
                self.custom_radio.setChecked(True)
        else:
            self.local_note.setText(f"{self.local_url} · {self.local_model or ''}")

    def _on_server_started(self, url: str, model: str) -> None:
        self.local_url, self.local_model = url, model
        self.local_radio.setEnabled(True)
        if not self.worker.running:
            self.local_radio.setChecked(True)
        self._show_target()
        self.update_estimate()

    def _on_server_stopped(self, _why: str) -> None:
        self.local_url = self.local_model = None
        self._show_target()

    def _show_dataset(self) -> None:
        kind = self.dataset.currentData()
        shown = {"random": {"input_len", "range_ratio", "output_len"},
                 "prefix_repetition": {"prefix_len", "suffix_len", "num_prefixes", "output_len"},
                 "sharegpt": {"dataset_path"}}[kind]
        form = self._rows["input_len"].parentWidget().layout()
        for name, w in self._rows.items():
            form.setRowVisible(w, name in shown)

    def _browse_dataset(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "ShareGPT dataset", str(Path.home()), "JSON (*.json)")
        if path:
            self.dataset_path.setText(path)

    def spec(self, check_target: bool = True) -> BenchSpec:
        """The sweep the form describes; ValueError in words when it cannot run (``check_target`` False: the
        sizes only, for the estimate)."""
        if self.local_radio.isChecked():
            if self.local_url is None and check_target:
                raise ValueError("The local server is not running: start it in the Server panel.")
            url, key, model = self.local_url or "", self.api_key.text().strip() or None, self.local_model
        else:
            url, key, model = self.url.text().strip(), self.api_key.text().strip() or None, \
                self.model.text().strip() or None
            if check_target and not url.startswith(("http://", "https://")):
                raise ValueError("The URL starts with http:// or https://, e.g. http://127.0.0.1:8000")
        kind = self.dataset.currentData()
        if check_target and kind == "sharegpt" and not Path(self.dataset_path.text()).is_file():
            raise ValueError("Choose a ShareGPT-format JSON file for the dataset.")
        return BenchSpec(base_url=url, api_key=key, model=model, dataset=kind,
                         input_len=self.input_len.value(),
                         output_len=self.output_len.value(), range_ratio=round(self.range_ratio.value(), 2),
                         prefix_len=self.prefix_len.value(), suffix_len=self.suffix_len.value(),
                         num_prefixes=self.num_prefixes.value(),
                         dataset_path=self.dataset_path.text() or None,
                         num_prompts=self.num_prompts.value(),
                         concurrencies=parse_concurrencies(self.concurrencies.text()), seed=self.seed.value(),
                         label=self.label.text().strip() or None)

    # ------------------------------------------------------------------------------------------------
    # running

    def run(self) -> None:
        if self.worker.running:
            return
        try:
            spec = self.spec()
        except ValueError as e:
            self._say(str(e), error=True)
            return
        self.live.reset()
        self._run_local = self.local_url is not None and spec.base_url == self.local_url
        self._save_prefs()
        self.progress.setRange(0, 0)  # busy until the worker knows the total
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.tabs.setCurrentWidget(self.live_tab)
        self._say(f"Contacting {spec.base_url}…")
        self.worker.run(spec)

    def stop(self) -> None:
        if self.worker.running:
            self._say("Stopping…")
            self.worker.stop()

    def _on_started(self, command: str, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(0)
        self.command.setText(command)
        self._say("Running…")

    def _on_request(self, sample) -> None:
        self.live.add(sample)

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setValue(done)
        self._say(f"Running: {done} / {total} requests")

    def _on_point(self, point: dict) -> None:
        m = point["metrics"]
        self._say(f"Concurrency {point['params']['max_concurrency']}: {m['completed']} ok, "
                  f"{m['output_throughput']:.1f} output tok/s")

    def load_options(self) -> dict | None:
        """How the app loaded the model its own server serves (the report's "load"): the load options the
        server's /v1/server_info may not tell, the file name and its type. None without a loaded model."""
        cfg, info = getattr(self.ctx.engine, "config", None), getattr(self.ctx.engine, "info", None)
        if cfg is None or info is None:
            return None
        return {"model": info.name, "file": Path(info.path).name if info.path else None, "format": info.format,
                "file_quantization": info.quantization,
                "quantization": info.quantization_text(cfg.quantization),  # auto: "auto (Q4_1 blocks kept)"
                "dtype": info.dtype or cfg.dtype, "requested_dtype": cfg.dtype, "device": info.device,
                "tensor_parallel_size": info.tensor_parallel_size,
                "comm_strategy": cfg.comm_strategy if info.tensor_parallel_size > 1 else None,
                "source": "the app's loaded model (Load panel)"}

    def _on_finished(self, report: dict) -> None:
        self._idle()
        if getattr(self, "_run_local", False):
            load = self.load_options()
            if load is not None:
                report["load"] = load
        report["setup"] = bench_report.setup(report)
        path = self.library.save(report)
        self.refresh_library()
        self.show_report(report)
        failed = sum(p["metrics"]["failed"] for p in report["points"])
        note = " (stopped: the points finished are kept)" if report.get("metadata", {}).get("stopped") else ""
        errors = f"; {failed} requests failed: {report['points'][0]['errors'][:1]}" if failed else ""
        self._say(f"Done{note}: {points_text(len(report['points']))}, saved as {path.name}{errors}")
        self.tabs.setCurrentIndex(1)

    def _on_failed(self, message: str) -> None:
        self._idle()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self._say(message, error=True)

    def _idle(self) -> None:
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    def _say(self, text: str, error: bool = False) -> None:
        self.message.setObjectName("messageError" if error else "hint")
        self.message.setStyleSheet("")  # re-polish for the object name
        self.message.style().unpolish(self.message)
        self.message.style().polish(self.message)
        self.message.setText(text)

    # ------------------------------------------------------------------------------------------------
    # results

    def show_report(self, report: dict) -> None:
        self.report = report
        self._overlaid = None
        where = report.get("server", {}).get("base_url", "")
        self.results_title.setText(f"{bench_report.label(report)} · {where}")
        self.results_title.setToolTip(bench_report.setup_line(report))
        self.command.setText(report.get("command", ""))
        self.command.setCursorPosition(0)  # show where it starts: "kestrel bench sweep ..."
        self.charts.show_runs([report])
        self.show_comm_table(report)
        for b in self.export_buttons:
            b.setEnabled(True)

    def show_comm_table(self, report: dict | None) -> None:
        """auto's start-up all-reduce measurements of the run's server (TP > 1): latency per strategy and
        message size, the choice in bold; hidden when the report has none."""
        table = bench_report.comm_table(report or {})
        self.comm_box.setVisible(bool(table))
        t = self.comm_table
        t.setRowCount(0)
        if not table:
            t.setColumnCount(0)
            return
        info = (report.get("server", {}).get("kestrel") or {})
        self.comm_box.setTitle(f"All-reduce strategies measured at start-up (TP {info.get('tensor_parallel_size')}, "
                               f"{info.get('comm_strategy')})")
        names = bench_report.comm_strategies(table)
        t.setColumnCount(len(names) + 2)
        t.setHorizontalHeaderLabels(["message", *(f"{n} µs" for n in names), "chosen"])
        t.setRowCount(len(table))
        for i, row in enumerate(table):
            cells = [bench_report.size_text(int(row["bytes"]))]
            for n in names:
                v = row.get("latency_us", {}).get(n)
                ok = row.get("ok", {}).get(n, True)
                cells.append("" if v is None else f"{v:.1f}" + ("" if ok else " ✗"))
            cells.append(str(row.get("choice", "")))
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment((Qt.AlignLeft if j == len(cells) - 1 else Qt.AlignRight) | Qt.AlignVCenter)
                if 0 < j < len(cells) - 1 and names[j - 1] == row.get("choice"):
                    f = item.font()
                    f.setBold(True)
                    item.setFont(f)
                t.setItem(i, j, item)
        t.resizeColumnsToContents()

    def copy_command(self) -> None:
        QGuiApplication.clipboard().setText(self.command.text())

    def export_png(self, path: str | Path) -> None:
        """The charts shown, under a title: the run's name (or the runs overlaid) and what was measured."""
        self.png_title().save(str(path))

    def png_title(self):
        shown = getattr(self, "_overlaid", None) or ([self.report] if self.report else [])
        if len(shown) > 1:
            title = "Benchmark: " + " vs ".join(bench_report.label(r) for r in shown)
            sub = "\n".join(f"{bench_report.label(r)}: {bench_report.setup_line(r)}" for r in shown)
        elif shown:
            r = shown[0]
            title = f"Benchmark: {bench_report.label(r)} · {r.get('server', {}).get('base_url', '')}"
            sub = bench_report.setup_line(r) + f" · {r.get('date', '')[:16].replace('T', ' ')}"
        else:
            title, sub = "Benchmark", ""
        return self.charts.titled_image(title, sub)

    def export_csv(self, path: str | Path) -> None:
        bench_report.write_csv(self.report, path)

    def export_json(self, path: str | Path) -> None:
        write_report({**self.report, "setup": bench_report.setup(self.report)}, path)

    def export_markdown(self, path: str | Path) -> None:
        Path(path).write_text(bench_report.markdown(self.report))

    def _ask_export(self, filter_: str, suffix: str, fn) -> None:
        if self.report is None:
            return
        name = time.strftime(f"kestrel-bench-%Y%m%d-%H%M%S{suffix}")
        path, _ = QFileDialog.getSaveFileName(self, "Export", str(Path.home() / name), filter_)
        if path:
            fn(path if path.endswith(suffix) else path + suffix)

    # ------------------------------------------------------------------------------------------------

    def apply_theme(self, theme: themes.Theme) -> None:
        self.live.apply_theme(theme)
        self.charts.apply_theme(theme)
        self._update_comparison()  # the better / worse colours of the theme

    def shutdown(self) -> None:
        self.worker.shutdown()
