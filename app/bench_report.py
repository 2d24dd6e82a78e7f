"""Reading a sweep report of `kestrel bench sweep` (the app's runs write the same structure, see
app/workers/bench_worker.py): the per-point rows the charts, tables and exports show, the latency CDF, the
comparison of two runs, and the CSV / Markdown exports. Pure functions of the report dict, so the Benchmark
panel, its tests and the library share one reading of the format."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from engine.bench.serve import NOT_REPORTED, SETUP_FIELDS, describe_setup  # torch-free, httpx-free

# (report key of a point's metrics, column title); None-safe: a metric not computed is left empty
COLUMNS = [("output_throughput", "out tok/s"), ("request_throughput", "req/s"),
           ("median_ttft_ms", "TTFT p50 ms"), ("p99_ttft_ms", "TTFT p99 ms"),
           ("median_tpot_ms", "TPOT p50 ms"), ("p99_tpot_ms", "TPOT p99 ms"),
           ("median_e2el_ms", "E2E p50 ms"), ("p99_e2el_ms", "E2E p99 ms"),
           ("completed", "ok"), ("failed", "failed")]


# one line per metric, where the metric is shown (tooltips, the captions under the charts, the Markdown export)
GLOSSARY = {
    "TTFT": "time to first token: from sending a request to its first generated token (waiting in the queue and "
            "reading the prompt).",
    "TPOT": "time per output token: the average time between tokens after the first, (end - first token) / "
            "(tokens - 1).",
    "ITL": "inter-token latency: each single gap between two streamed tokens.",
    "E2EL": "end-to-end latency: from sending a request to its last token.",
    "CDF": "cumulative distribution: the share of requests finished within each latency (the curve reaches 1 at "
           "the slowest).",
    "throughput": "output throughput: tokens generated per second by all requests together.",
}
METRIC_TIPS = {"output_throughput": GLOSSARY["throughput"],
               "request_throughput": "requests finished per second.",
               "median_ttft_ms": "TTFT, " + GLOSSARY["TTFT"] + " p50: half the requests were faster.",
               "p99_ttft_ms": "TTFT, " + GLOSSARY["TTFT"] + " p99: 99 requests in 100 were faster.",
               "median_tpot_ms": "TPOT, " + GLOSSARY["TPOT"] + " p50: half the requests were faster.",
               "p99_tpot_ms": "TPOT, " + GLOSSARY["TPOT"] + " p99: 99 requests in 100 were faster.",
               "median_e2el_ms": "E2E, " + GLOSSARY["E2EL"] + " p50.",
               "p99_e2el_ms": "E2E, " + GLOSSARY["E2EL"] + " p99.",
               "completed": "requests that finished.", "failed": "requests that failed."}
HIGHER_IS_BETTER = {"output_throughput", "request_throughput", "completed"}  # the rest: lower is better


def concurrency(report: dict, point: dict) -> int:
    """A point's max concurrency; no cap means every prompt at once, i.e. the number of prompts."""
    c = point.get("params", {}).get("max_concurrency")
    return int(c) if c else int(point.get("dataset", {}).get("num_prompts") or report["args"]["num_prompts"])


def label(report: dict) -> str:
    """What a run is called in lists and legends: its label, else the model and the date."""
    if report.get("label"):
        return str(report["label"])
    return f"{report.get('server', {}).get('model', '?')} {report.get('date', '')[:16].replace('T', ' ')}"


def setup(report: dict) -> dict[str, str]:
    """What was measured (engine.bench.serve.describe_setup): recomputed from the report, so that a report
    saved before it had a "setup" says it too, and the load options the app added are counted."""
    return describe_setup(report)


def setup_line(report: dict) -> str:
    """setup() in one line (the PNG's subtitle, the library's list)."""
    s = setup(report)
    parts = [s["model"], s["file_type"], f"quantization {s['quantization']}", s["dtype"],
             f"TP {s['tensor_parallel_size']}"]
    if s["comm_strategy"] != NOT_REPORTED and not s["comm_strategy"].startswith("none"):
        parts.append(f"comm {s['comm_strategy']}")
    parts.append(s["device"])
    return " · ".join(p for p in parts if p and NOT_REPORTED not in p) or "setup not reported by the server"


def rows(report: dict) -> list[dict]:
    """One dict per point: ``concurrency``, ``engine_config`` (the point's engine configuration in a sweep over
    them, else None) and the metrics of COLUMNS (None where absent)."""
    out = []
    for p in report.get("points", []):
        m = p.get("metrics", {})
        out.append({"concurrency": concurrency(report, p), "engine_config": _config_of(p),
                    **{k: m.get(k) for k, _ in COLUMNS}})
    return out


def _config_of(point: dict) -> str | None:
    return point.get("engine_config") or point.get("params", {}).get("engine_config")


def engine_configs(report: dict) -> list[str]:
    """The engine configurations of a `kestrel bench sweep --engine-configs` report, in sweep order ([] else)."""
    names: list[str] = []
    for p in report.get("points", []):
        c = _config_of(p)
        if c is not None and c not in names:
            names.append(c)
    return names


def split_configs(report: dict) -> list[dict]:
    """A report per engine configuration (its points only, labelled "run · config"), so that charts and
    comparisons see one line per configuration; a report without configurations as it is."""
    names = engine_configs(report)
    if not names:
        return [report]
    base = label(report)
    servers = {r.get("name"): r.get("server") for r in report.get("engine_configs") or []}
    out = []
    for n in names:
        server = {**report.get("server", {}), "kestrel": servers.get(n) or report.get("server", {}).get("kestrel")}
        out.append({**report, "label": f"{base} · {n}", "server": server,
                    "points": [p for p in report["points"] if _config_of(p) == n]})
    return out


def comm_table(report: dict) -> list[dict]:
    """auto's start-up all-reduce table as the server reported it (/v1/server_info ``comm_table``; TP > 1):
    one row per message size with ``bytes``, ``latency_us`` and ``ok`` by strategy and the ``choice``.
    [] when the server is not Kestrel's, TP is 1, or the strategy was fixed."""
    info = report.get("server", {}).get("kestrel") or {}
    return list(info.get("comm_table") or [])


def comm_strategies(table: list[dict]) -> list[str]:
    names: list[str] = []
    for row in table:
        for n in row.get("latency_us", {}):
            if n not in names:
                names.append(n)
    return names


def size_text(nbytes: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= k:
            return f"{nbytes / k:g} {unit}"
    return f"{nbytes} B"


def comm_table_markdown(table: list[dict]) -> list[str]:
    """The table as Markdown lines: a row per message size, the latency of each strategy (us; "failed" where it
    missed the correctness check) and the one chosen."""
    if not table:
        return []
    names = comm_strategies(table)
    lines = ["| message | " + " | ".join(f"{n} us" for n in names) + " | chosen |",
             "|---:|" + "---:|" * len(names) + ":---|"]
    for row in table:
        cells = []
        for n in names:
            v = row.get("latency_us", {}).get(n)
            ok = row.get("ok", {}).get(n, True)
            cells.append("" if v is None else f"{v:.1f}" + ("" if ok else " (failed)"))
        lines.append(f"| {size_text(int(row['bytes']))} | " + " | ".join(cells) + f" | {row.get('choice', '')} |")
    return lines


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


def verdict(key: str, delta: float | None, tolerance_pct: float = 1.0) -> str:
    """Whether a change of ``delta`` % in metric ``key`` is "better", "worse" or "same" (within the
    tolerance; "" when there is no delta): throughput up is better, latency down is better."""
    if delta is None:
        return ""
    if abs(delta) < tolerance_pct:
        return "same"
    up = delta > 0
    return "better" if up == (key in HIGHER_IS_BETTER) else "worse"


def compare(a: dict, b: dict) -> list[dict]:
    """Side by side at every concurrency both runs measured: ``concurrency``, and per metric key of COLUMNS
    a tuple (value in a, value in b, delta in % from a to b). For a sweep over engine configurations, pass the
    reports of split_configs (else the last configuration at a concurrency is the one compared)."""
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
    """One row per sweep point: concurrency and the metrics of COLUMNS (keys as in the JSON report), then the
    run's label, date and what was measured (setup(): the same on every row, so that each row stands alone)."""
    configs = bool(engine_configs(report))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        su = setup(report)
        w.writerow([*(["engine_config"] if configs else []), "max_concurrency", *(k for k, _ in COLUMNS),
                    "label", "date", *(k for k, _ in SETUP_FIELDS)])
        for r in rows(report):
            w.writerow([*([r["engine_config"]] if configs else []), r["concurrency"],
                        *(_cell(r[k]) for k, _ in COLUMNS), label(report), report.get("date", ""),
                        *(su[k] for k, _ in SETUP_FIELDS)])


def markdown(report: dict) -> str:
    """A Markdown report: what ran, against what, the command that re-runs it, and the table of points."""
    ds = (report.get("points") or [{}])[0].get("dataset", {})
    server = report.get("server", {})
    client = report.get("client", {})
    lines = [f"# Benchmark: {label(report)}", "",
             f"- Date: {report.get('date', '')}",
             (f"- Target: {server.get('base_url', '')} (model `{server.get('model', '')}`, "
              f"{server.get('endpoint', '')})"),
             f"- Dataset: {ds.get('name', '')}, {ds.get('num_prompts', '')} prompts"
             + (f", input {ds['input_len']} / output {ds['output_len']} tokens" if "input_len" in ds else ""),
             f"- Seed: {report.get('seed', '')}",
             f"- Client: {client.get('cpu', '')}, {client.get('logical_cpus', '')} logical CPUs"
             + "".join(f", {g['name']}" for g in client.get("gpus") or []),
             "", "## What was measured", ""]
    su = setup(report)
    lines += [f"- {title}: {su[key]}" for key, title in SETUP_FIELDS]
    lines += ["", "Re-run with:", "", "```", report.get("command", ""), "```", ""]
    configs = bool(engine_configs(report))
    lines += ["| " + ("engine config | " if configs else "") + "concurrency | "
              + " | ".join(t for _, t in COLUMNS) + " |",
              "|" + (":---|" if configs else "") + "---:|" + "---:|" * len(COLUMNS)]
    for r in rows(report):
        lines.append("| " + (f"{r['engine_config']} | " if configs else "") + f"{r['concurrency']} | "
                     + " | ".join(_cell(r[k]) for k, _ in COLUMNS) + " |")
    table = comm_table(report)
    if table:
        info = report.get("server", {}).get("kestrel") or {}
        lines += ["", (f"All-reduce strategies measured at start-up (TP {info.get('tensor_parallel_size', '?')}, "
                       f"comm strategy {info.get('comm_strategy', '?')}):"), "", *comm_table_markdown(table)]
    lines += ["", "Metrics: " + "; ".join(f"**{n}**: {GLOSSARY[n]}" for n in ("TTFT", "TPOT", "E2EL"))
              + " p50 / p99: half / 99 in 100 of the requests were faster."]
    return "\n".join(lines) + "\n"
