"""`kestrel bench sweep`: `kestrel bench serve` (engine/bench/serve.py) over lists of concurrencies, request rates,
input and output lengths, one report with a table per point; with --engine-configs, the sweep once per engine
configuration against Kestrel's server started on it (engine/bench/sweep_configs.py)."""

from __future__ import annotations

import itertools
import sys

from engine.bench import serve


def main_sweep(args) -> int:
    return serve.guarded(_main_sweep, args)




def sweep_points(args) -> list[dict]:
    """Every combination of the swept lists, in the order given (concurrency outermost)."""
    lists = [getattr(args, k) if getattr(args, k) is not None else [None] for k in serve.SWEPT]
    return [dict(zip(serve.SWEPT, combo)) for combo in itertools.product(*lists)]


def sweep_table(points: list[dict]) -> str:
    configs = any("engine_config" in p["params"] for p in points)  # a sweep over engine configurations
    head = ["conc", "rate", "in", "out", "ok", "fail", "req/s", "out tok/s", "TTFT mean", "TTFT p99", "TPOT mean",
            "TPOT p99", "ITL p99", "E2E p99"]
    widths = [10] * len(head)
    if configs:
        head.insert(0, "config")
        widths.insert(0, max([10, *(len(str(p["params"].get("engine_config", ""))) for p in points)]))
    lines = [" ".join(f"{h:>{w}}" for h, w in zip(head, widths))]
    for p in points:
        m, q = p["metrics"], p["params"]
        cells = [q["max_concurrency"] or "-", q["request_rate"], q["random_input_len"], q["random_output_len"],
                 m["completed"], m["failed"], f"{m['request_throughput']:.2f}", f"{m['output_throughput']:.1f}"]
        if configs:
            cells.insert(0, q.get("engine_config", "-"))
        for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms"):
            cells.append(f"{m[key]:.1f}" if key in m else "-")
        lines.append(" ".join(f"{c!s:>{w}}" for c, w in zip(cells, widths)))
    return "\n".join(lines)


def run_points(target: serve.Target, args, combos: list[dict], points: list[dict], extra: dict | None = None,
                prefix: str = "") -> None:
    for i, q in enumerate(combos):
        desc = f"{prefix}point {i + 1}/{len(combos)}"
        point = serve.run_point(target, args, max_concurrency=q["max_concurrency"], request_rate=q["request_rate"],
                          input_len=q["random_input_len"], output_len=q["random_output_len"], desc=desc)
        points.append({"params": {**q, **(extra or {})}, **(extra or {}), **point})
        m = point["metrics"]
        print(f"{desc}: {q} -> {m['completed']} ok, {m['output_throughput']:.1f} out tok/s", flush=True)


def _main_sweep(args) -> int:
    if getattr(args, "engine_configs", None):
        return _main_config_sweep(args)
    if getattr(args, "engine_common", None):
        raise ValueError("--engine-common goes with --engine-configs")
    target = serve.Target(args)
    points: list[dict] = []
    try:
        report = serve.report_header(target, args, "sweep")
        report["sweep"] = {k: getattr(args, k) for k in serve.SWEPT}
        run_points(target, args, sweep_points(args), points)
    finally:
        target.close()
    return finish_sweep(report, points, args)


def finish_sweep(report: dict, points: list[dict], args) -> int:
    report["points"] = points
    print(sweep_table(points))
    path = serve.write_report(report, args, "sweep")
    if path:
        print(f"report written to {path}")
    failed_configs = [c for c in report.get("engine_configs", []) if c.get("error")]
    return 0 if points and all(p["metrics"]["completed"] for p in points) and not failed_configs else 1


def _main_config_sweep(args) -> int:
    """The sweep once per engine configuration, each against Kestrel's server started on it
    (engine/bench/sweep_configs.py)."""
    import copy

    from engine.bench import sweep_configs

    if any(a == "--base-url" or a.startswith("--base-url=") for a in serve.argv_tail(args)):
        raise ValueError("--engine-configs starts Kestrel's own server per configuration: leave out --base-url")
    specs = sweep_configs.parse(args.engine_configs, args.engine_common)
    combos = sweep_points(args)
    report: dict | None = None
    records: list[dict] = []
    points: list[dict] = []
    for ci, spec in enumerate(specs):
        rec = sweep_configs.record(spec)
        records.append(rec)
        print(f"engine configuration {ci + 1}/{len(specs)}: {spec.name} (starting the server)", flush=True)
        try:
            with sweep_configs.served(spec, args.model) as (url, load_s):
                rec["startup_seconds"] = round(load_s, 3)
                run_args = copy.copy(args)
                run_args.base_url = url
                target = serve.Target(run_args)
                try:
                    if report is None:
                        report = serve.report_header(target, args, "sweep")
                    rec["server"] = target.info.get("kestrel")
                    run_points(target, run_args, combos, points, {"engine_config": spec.name},
                                prefix=f"[{spec.name}] ")
                finally:
                    target.close()
        except Exception as e:
            from engine.errors import KestrelError

            if not isinstance(e, (KestrelError, RuntimeError, OSError, TimeoutError, ValueError)):
                raise
            rec["error"] = f"{type(e).__name__}: {e}"
            print(f"error: engine configuration {spec.name!r}: {rec['error']}", file=sys.stderr, flush=True)
    if report is None:
        raise RuntimeError("no engine configuration could start: " + "; ".join(r["error"] for r in records))
    report["server"]["base_url"] = "embedded: Kestrel's server started per engine configuration"
    report["sweep"] = {**{k: getattr(args, k) for k in serve.SWEPT}, "engine_configs": [s.name for s in specs]}
    report["engine_configs"] = records
    return finish_sweep(report, points, args)
