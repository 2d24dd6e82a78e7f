"""Reading a sweep report of `kestrel bench sweep` (the app's runs write the same structure, see
app/workers/bench_worker.py): the per-point rows the charts, tables and exports show, the latency CDF, the
comparison of two runs, and the CSV / Markdown exports. Pure functions of the report dict, so the Benchmark
panel, its tests and the library share one reading of the format."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

# (report key of a point's metrics, column title); None-safe: a metric not computed is left empty
COLUMNS = [("output_throughput", "out tok/s"), ("request_throughput", "req/s"),
           ("median_ttft_ms", "TTFT p50 ms"), ("p99_ttft_ms", "TTFT p99 ms"),
           ("median_tpot_ms", "TPOT p50 ms"), ("p99_tpot_ms", "TPOT p99 ms"),
           ("median_e2el_ms", "E2E p50 ms"), ("p99_e2el_ms", "E2E p99 ms"),
           ("completed", "ok"), ("failed", "failed")]


def concurrency(report: dict, point: dict) -> int:
    """A point's max concurrency; no cap means every prompt at once, i.e. the number of prompts."""
    c = point.get("params", {}).get("max_concurrency")
    return int(c) if c else int(point.get("dataset", {}).get("num_prompts") or report["args"]["num_prompts"])


def label(report: dict) -> str:
    """What a run is called in lists and legends: its label, else the model and the date."""
    if report.get("label"):
        return str(report["label"])
    return f"{report.get('server', {}).get('model', '?')} {report.get('date', '')[:16].replace('T', ' ')}"


def rows(report: dict) -> list[dict]:
    """One dict per point: ``concurrency`` and the metrics of COLUMNS (None where absent)."""
    out = []
    for p in report.get("points", []):
        m = p.get("metrics", {})
        out.append({"concurrency": concurrency(report, p), **{k: m.get(k) for k, _ in COLUMNS}})
    return out


def series(report: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(concurrency, metric) over the points that have the metric, ordered by concurrency."""
    pts = sorted((r["concurrency"], r[key]) for r in rows(report) if r.get(key) is not None)
    return np.array([c for c, _ in pts], float), np.array([v for _, v in pts], float)


def latency_cdf(point: dict) -> tuple[np.ndarray, np.ndarray]:
    """E2E latency (ms, sorted) of a point's successful requests and the fraction at or below each."""
    lat = np.sort(np.array([r["e2el"] * 1000 for r in point.get("requests", []) if r.get("success")], float))
    return lat, np.arange(1, len(lat) + 1) / max(1, len(lat))


def delta_pct(a: float | None, b: float | None) -> float | None:
    """(b - a) / a in %, None when either is missing or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a * 100.0


def compare(a: dict, b: dict) -> list[dict]:
    """Side by side at every concurrency both runs measured: ``concurrency``, and per metric key of COLUMNS
    a tuple (value in a, value in b, delta in % from a to b)."""
    ra = {r["concurrency"]: r for r in rows(a)}
    rb = {r["concurrency"]: r for r in rows(b)}
    out = []
    for c in sorted(set(ra) & set(rb)):
        cells = {k: (ra[c][k], rb[c][k], delta_pct(ra[c][k], rb[c][k])) for k, _ in COLUMNS}
        out.append({"concurrency": c, **cells})
    return out


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.2f}" if math.isfinite(v) else str(v)
    return str(v)


def write_csv(report: dict, path: str | Path) -> None:
    """One row per sweep point: concurrency and the metrics of COLUMNS (keys as in the JSON report)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["max_concurrency", *(k for k, _ in COLUMNS)])
        for r in rows(report):
            w.writerow([r["concurrency"], *(_cell(r[k]) for k, _ in COLUMNS)])


def markdown(report: dict) -> str:
    """A Markdown report: what ran, against what, the command that re-runs it, and the table of points."""
    ds = (report.get("points") or [{}])[0].get("dataset", {})
    server = report.get("server", {})
    client = report.get("client", {})
    lines = [f"# Benchmark: {label(report)}", "",
             f"- Date: {report.get('date', '')}",
             f"- Target: {server.get('base_url', '')} (model `{server.get('model', '')}`, "
             f"{server.get('endpoint', '')})",
             f"- Dataset: {ds.get('name', '')}, {ds.get('num_prompts', '')} prompts"
             + (f", input {ds['input_len']} / output {ds['output_len']} tokens" if "input_len" in ds else ""),
             f"- Seed: {report.get('seed', '')}",
             f"- Client: {client.get('cpu', '')}, {client.get('logical_cpus', '')} logical CPUs"
             + "".join(f", {g['name']}" for g in client.get("gpus") or []),
             "", "Re-run with:", "", "```", report.get("command", ""), "```", "",
             "| concurrency | " + " | ".join(t for _, t in COLUMNS) + " |",
             "|---:|" + "---:|" * len(COLUMNS)]
    for r in rows(report):
        lines.append(f"| {r['concurrency']} | " + " | ".join(_cell(r[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"
