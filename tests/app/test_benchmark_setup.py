"""The Benchmark panel before and around a run (issue 45 rows 8, 11, 14): presets by device, the time estimate shown
before Run (a guess, then scaled by a saved run of the same model), the form remembered across a restart of the
app, the metrics explained where they are shown, Run in view at 1024x700, and charts that read at a glance (one
point on a sensible axis, legends off the plot area, "1 point")."""

from __future__ import annotations

import math

import pytest

from app import bench_estimate, bench_report
from app.widgets.bench_charts import nice_ceil, value_range
from tests.app.test_benchmark_reports import _point, _report


def test_presets_estimate_and_the_form_remembered(make_window, qtbot):
    w = make_window(autoload=False)
    panel = w.panels["benchmark"]
    # no GPU on a test machine without one, no model loaded: the CPU preset, sized to finish in about a minute
    assert w.ctx.num_gpus == 0
    cpu = bench_estimate.PRESETS["cpu"]
    assert panel.preset.currentData() == "cpu"
    spec = panel.spec(check_target=False)
    assert (spec.input_len, spec.output_len, spec.num_prompts, tuple(spec.concurrencies)) == (
        cpu.input_len, cpu.output_len, cpu.num_prompts, cpu.concurrencies)
    text = panel.estimate_label.text()
    assert text.startswith("Estimate: about ") and f"{cpu.num_prompts * len(cpu.concurrencies)} requests" in text
    assert "rough guess" in text and 20 <= panel.estimate.seconds <= 90  # "about a minute" on 2 CPU cores

    panel.apply_preset("gpu")  # the GPU preset on a CPU server: said to take far longer, before Run
    assert panel.concurrencies.text() == "1,2,4,8,16" and panel.num_prompts.value() == 100
    assert panel.estimate.seconds > 5 * 60 and "500 requests" in panel.estimate_label.text()
    panel.preset.setCurrentIndex(panel.preset.findData("cpu"))  # chosen in the combo
    assert panel.input_len.value() == cpu.input_len and panel.estimate.seconds < 90

    panel.output_len.setValue(32)  # a size changed by hand: Custom, and the estimate follows
    assert panel.preset.currentData() == bench_estimate.CUSTOM
    assert panel.estimate.seconds < bench_estimate.estimate(
        bench_estimate_spec(cpu), "cpu").seconds
    panel.url.setText("http://127.0.0.1:9999")
    panel.concurrencies.setText("1, 3")
    panel.label.setText("remembered")
    panel.api_key.setText("secret")
    panel.seed.setValue(7)

    # a restart of the app (a second window on the same data folder): the form as it was left, the key not kept
    p2 = make_window(autoload=False).panels["benchmark"]
    assert p2.preset.currentData() == bench_estimate.CUSTOM and p2.output_len.value() == 32
    assert p2.url.text() == "http://127.0.0.1:9999" and p2.concurrencies.text() == "1, 3"
    assert p2.label.text() == "remembered" and p2.seed.value() == 7 and p2.api_key.text() == ""
    assert "secret" not in str(p2.ctx.store.pref("benchmark"))
    assert p2.estimate_label.text().startswith("Estimate: about ")


def bench_estimate_spec(preset):
    from app.workers.bench_worker import BenchSpec

    return BenchSpec(base_url="http://x", input_len=preset.input_len, output_len=preset.output_len,
                     num_prompts=preset.num_prompts, concurrencies=list(preset.concurrencies))


def test_the_estimate_is_scaled_by_a_saved_run_of_the_same_model():
    from app.workers.bench_worker import BenchSpec

    past = _report([_point(1, 10.0), _point(2, 18.0)])
    past["server"]["base_url"] = "http://h:1"
    for p in past["points"]:
        p["metrics"].update(duration=30.0, total_input_tokens=2 * 100, total_output_tokens=2 * 50)
    spec = BenchSpec(base_url="http://h:1", input_len=100, output_len=50, num_prompts=2, concurrencies=[1, 2])
    guess = bench_estimate.estimate(spec, "cpu")
    scaled = bench_estimate.estimate(spec, "cpu", past)
    # the same sizes as the saved run: the estimate is what it took (2 points of 30 s and their overhead)
    assert scaled.seconds == pytest.approx(2 * (30.0 + bench_estimate.OVERHEAD_S), rel=1e-6)
    assert scaled.seconds > 5 * guess.seconds and "scaled from your run" in scaled.basis
    twice = BenchSpec(base_url="http://h:1", input_len=100, output_len=50, num_prompts=4, concurrencies=[1, 2])
    assert bench_estimate.estimate(twice, "cpu", past).seconds > 1.4 * scaled.seconds
    assert bench_estimate.estimate(spec, "cuda:0").seconds < guess.seconds
    assert [bench_estimate.duration_text(s) for s in (3, 44, 70, 600, 4000)] == ["5 s", "45 s", "1 min", "10 min",
                                                                                 "1 h 7 min"]


def test_run_stays_in_view_at_1024x700_and_the_metrics_are_explained(make_window, qtbot):
    w = make_window(autoload=False)
    panel = w.panels["benchmark"]
    w.show_panel("benchmark")
    w.resize(1024, 700)
    qtbot.wait(50)
    assert panel.width() <= 1024
    for b in (panel.run_button, panel.stop_button, panel.progress, panel.estimate_label):
        assert b.isVisible()
        seen = b.visibleRegion().boundingRect()
        assert seen.size() == b.size(), f"{b} is partly hidden: {seen} of {b.size()}"
        top_left = b.mapTo(w, b.rect().topLeft())
        assert 0 <= top_left.y() and top_left.y() + b.height() <= w.height()
    assert not panel.form_scroll.isAncestorOf(panel.run_button)  # the form scrolls, Run does not
    assert panel.form_scroll.widget().minimumSizeHint().width() <= panel.form_scroll.viewport().width()
    # the metrics in words where they are shown: the captions, the charts' tooltips, the comparison's metrics
    for word in ("TTFT: time to first token", "TPOT: time per output token", "CDF:", "E2E:"):
        assert word in panel.results_caption.text()
    assert "time to first token" in panel.live_caption.text() and "time per output token" in panel.live_caption.text()
    assert "time to first token" in panel.charts.p_ttft.toolTip() and "time per output" in panel.charts.p_tpot.toolTip()
    assert "end-to-end" in panel.charts.p_cdf.toolTip() and "cumulative" in panel.charts.p_cdf.toolTip()
    assert "time to first token" in panel.live.p_scatter.toolTip()


def test_charts_read_at_a_glance(make_window, tmp_path):
    w = make_window(autoload=False)
    panel = w.panels["benchmark"]
    one = _report([_point(4, 203.0)], label="single")
    one["points"][0]["metrics"]["median_tpot_ms"] = one["points"][0]["metrics"]["p99_tpot_ms"] = 203.0
    one["points"][0]["requests"] = [{"success": True, "e2el": 0.2030}]
    panel.show_report(one)
    c = panel.charts
    for p in c.plot_items():
        assert p.legend is None  # no legend over the plot area: the legend is a line under the plots
    assert [n for _, _, n in c.legend.entries] == ["p50", "p99", "CDF at concurrency 4"]
    # one point, or a flat line: the value axis from 0 to a round value above it, not 202.6-203.4
    lo, hi = c.p_tpot.viewRange()[1]
    assert lo == 0 and 203 < hi <= 250 and hi == nice_ceil(hi)
    lo, hi = c.p_tput.viewRange()[1]
    assert lo == 0 and 203 < hi <= 250
    x_lo, x_hi = c.p_tput.viewRange()[0]  # log concurrency: the point in the middle, not on an edge
    assert x_lo < math.log10(4) < x_hi and x_hi - x_lo >= 0.4
    lo, hi = c.p_cdf.viewRange()[0]  # the CDF's latency axis padded around the data by >= 10 %
    assert lo <= 203 * 0.9 and hi >= 203 * 1.1 and hi - lo < 203
    assert value_range([5.0, 5.0]) == (0.0, 6.0) and value_range([]) is None
    assert value_range([200.0, 210.0], from_zero=False) == (150.0, 250.0)

    panel.library.save(one)
    panel.refresh_library()
    assert "1 point " in panel.runs.item(0).text() + " " and "1 points" not in panel.runs.item(0).text()

    # the live scatter: TTFT on y, TPOT on x, as its title says; axes from 0
    from app.workers.bench_worker import RequestSample

    panel.live.reset()
    panel.live.add(RequestSample(0, 1, 0.5, ttft_ms=300.0, tpot_ms=20.0, e2el_ms=500.0, output_tokens=8, ok=True))
    (x, y), = [item.getData() for item in panel.live.p_scatter.listDataItems()]
    assert list(x) == [20.0] and list(y) == [300.0]
    assert panel.live.p_scatter.viewRange()[1][0] == 0 and panel.live.p_scatter.viewRange()[1][1] >= 300
    assert panel.live.plotted_points() == 1 and [n for *_, n in panel.live.legend.entries] == ["concurrency 1"]

    # the PNG carries a title: the run and what was measured
    one["server"]["kestrel"].update(format="gguf", quantization="Q4_1", dtype="float32", device="cpu")
    panel.show_report(one)
    panel.export_png(tmp_path / "one.png")
    from PySide6.QtGui import QImage

    img = QImage(str(tmp_path / "one.png"))
    assert img.height() > c.grab().height() + 20
    assert "gguf Q4_1" in bench_report.setup_line(one) and "float32" in bench_report.setup_line(one)
