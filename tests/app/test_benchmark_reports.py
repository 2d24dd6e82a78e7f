"""The Benchmark panel on reports it did not run itself (no server needed): a sweep over engine configurations
(`kestrel bench sweep --engine-configs`) drawn as a line per configuration and exported with the configuration
column; a TP > 1 server's start-up all-reduce table (/v1/server_info ``comm_table``) shown as a table and
written into the Markdown export (and kept in the JSON)."""

from __future__ import annotations

import csv
import json

from app import bench_report
from app.bench_runs import read_report

TABLE = [{"bytes": 2048, "latency_us": {"host": 11.5, "nccl": 40.0}, "ok": {"host": True, "nccl": True},
          "max_err_ratio": {"host": 0.0, "nccl": 0.0}, "choice": "host"},
         {"bytes": 8 << 20, "latency_us": {"host": 900.0, "nccl": 650.0, "int8": 300.0},
          "ok": {"host": True, "nccl": True, "int8": False}, "max_err_ratio": {}, "choice": "nccl"}]


def _point(conc: int, tput: float, config: str | None = None) -> dict:
    params = {"max_concurrency": conc, "request_rate": "inf", "random_input_len": 8, "random_output_len": 4}
    if config:
        params["engine_config"] = config
    m = {"output_throughput": tput, "request_throughput": tput / 4, "median_ttft_ms": 10.0 * conc,
         "p99_ttft_ms": 20.0 * conc, "median_tpot_ms": 5.0, "p99_tpot_ms": 6.0, "median_e2el_ms": 30.0,
         "p99_e2el_ms": 40.0, "completed": 2, "failed": 0}
    reqs = [{"success": True, "e2el": 0.03}, {"success": True, "e2el": 0.04}]
    p = {"params": params, "dataset": {"num_prompts": 2}, "metrics": m, "requests": reqs}
    if config:
        p["engine_config"] = config
    return p


def _report(points, label: str = "cfg", **extra) -> dict:
    return {"benchmark": "sweep", "label": label, "date": "2026-12-02T01:00:00+00:00",
            "command": "kestrel bench sweep --engine-configs a b", "args": {"num_prompts": 2},
            "server": {"base_url": "embedded", "model": "m", "kestrel": {"tensor_parallel_size": 1}}, "seed": 0,
            "points": points, **extra}


def test_a_sweep_over_engine_configurations_is_a_line_per_configuration(make_window, tmp_path):
    rep = _report([_point(1, 10.0, "prefix_caching=on"), _point(2, 18.0, "prefix_caching=on"),
                   _point(1, 9.0, "prefix_caching=off"), _point(2, 15.0, "prefix_caching=off")],
                  engine_configs=[{"name": "prefix_caching=on", "server": {"tensor_parallel_size": 1}},
                                  {"name": "prefix_caching=off", "server": {"tensor_parallel_size": 1}}])
    assert bench_report.engine_configs(rep) == ["prefix_caching=on", "prefix_caching=off"]
    parts = bench_report.split_configs(rep)
    assert [p["label"] for p in parts] == ["cfg · prefix_caching=on", "cfg · prefix_caching=off"]
    assert [len(p["points"]) for p in parts] == [2, 2]
    w = make_window(autoload=False)
    panel = w.panels["benchmark"]
    panel.show_report(rep)
    lines = panel.charts.curves(panel.charts.p_tput)
    assert [(list(x), list(y)) for x, y in lines] == [([1, 2], [10.0, 18.0]), ([1, 2], [9.0, 15.0])]
    assert panel.comm_box.isHidden()
    # concurrency on a log scale, a tick per value measured; TTFT linear while the lines are comparable
    axis = panel.charts.p_tput.getAxis("bottom")
    assert axis.logMode and [t for _, t in axis._tickLevels[0]] == ["1", "2"]
    assert not panel.charts.p_ttft.getAxis("left").logMode and panel.charts.p_ttft.getAxis("bottom").logMode
    slow = _report([_point(1, 1.0), _point(2, 1.0)], label="queueing")
    for p in slow["points"]:
        p["metrics"]["median_ttft_ms"] *= 1000  # 100x the other run's: log scale, both lines readable
    panel.charts.show_runs([rep, slow])
    assert panel.charts.p_ttft.getAxis("left").logMode and "log" in panel.charts.p_ttft.getAxis("left").labelText
    assert not panel.charts.p_tpot.getAxis("left").logMode
    panel.show_report(rep)
    panel.export_csv(tmp_path / "cfg.csv")
    with open(tmp_path / "cfg.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["engine_config"], r["max_concurrency"]) for r in rows] == [
        ("prefix_caching=on", "1"), ("prefix_caching=on", "2"), ("prefix_caching=off", "1"),
        ("prefix_caching=off", "2")]
    panel.export_markdown(tmp_path / "cfg.md")
    md = (tmp_path / "cfg.md").read_text()
    assert "| engine config | concurrency |" in md and "| prefix_caching=off | 2 |" in md


def test_the_comm_strategy_table_is_shown_and_exported(make_window, tmp_path):
    rep = _report([_point(1, 10.0), _point(2, 18.0)])
    rep["server"]["kestrel"] = {"tensor_parallel_size": 2, "comm_strategy": "auto", "comm_table": TABLE}
    w = make_window(autoload=False)
    panel = w.panels["benchmark"]
    panel.show_report(rep)
    t = panel.comm_table
    assert not panel.comm_box.isHidden() and "TP 2" in panel.comm_box.title()
    headers = [t.horizontalHeaderItem(j).text() for j in range(t.columnCount())]
    assert headers == ["message", "host µs", "nccl µs", "int8 µs", "chosen"]
    assert [t.item(i, 0).text() for i in range(t.rowCount())] == ["2 KiB", "8 MiB"]
    assert t.item(0, 1).text() == "11.5" and t.item(0, 1).font().bold() and not t.item(0, 2).font().bold()
    assert t.item(1, 3).text() == "300.0 ✗" and t.item(1, 4).text() == "nccl" and t.item(1, 2).font().bold()
    assert t.item(0, 3).text() == ""  # int8 not measured at 2 KiB

    panel.export_markdown(tmp_path / "tp.md")
    md = (tmp_path / "tp.md").read_text()
    assert "All-reduce strategies measured at start-up (TP 2, comm strategy auto)" in md
    assert "| message | host us | nccl us | int8 us | chosen |" in md
    assert "| 2 KiB | 11.5 | 40.0 |  | host |" in md
    assert "| 8 MiB | 900.0 | 650.0 | 300.0 (failed) | nccl |" in md
    panel.export_json(tmp_path / "tp.json")
    assert read_report(tmp_path / "tp.json")["server"]["kestrel"]["comm_table"] == json.loads(json.dumps(TABLE))

    panel.show_report(_report([_point(1, 10.0)]))  # a TP 1 run: no table
    assert panel.comm_box.isHidden() and panel.comm_table.rowCount() == 0
