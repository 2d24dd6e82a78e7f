"""`kestrel bench serve` and `kestrel bench sweep`: load tests of an OpenAI-compatible server (Kestrel's
`kestrel serve`, vLLM, SGLang, llama.cpp's server, Ollama, LM Studio...), flags named as vLLM's `bench serve`.
The datasets, arrivals, runner and metrics are engine/bench/load.py; this module reads the server (GET
/v1/models, /version, and Kestrel's /v1/server_info: model, dtype, quantization, TP size, comm strategy),
builds the requests and writes the report: one JSON holding everything that reproduces the run (the command
line, the client's hardware and versions, the server's info, dataset parameters, seed, arrival settings).

A sweep (engine/bench/sweep.py) runs the same benchmark at every combination of the lists given (``--max-concurrency 1 2 4 8 16``,
``--request-rate``, ``--random-input-len``, ``--random-output-len``), one after the other, and writes one report
with a point per combination and prints a table. With ``--engine-configs`` (the embedded engine) the sweep runs once
per engine configuration, each against Kestrel's server started on it and stopped after it
(engine/bench/sweep_configs.py); the points carry their configuration's name, and the report's
``engine_configs`` what each one was (its keys, the full EngineConfig, the server's /v1/server_info)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import shlex
import sys

from engine import envs
from engine.bench import load

DEFAULT_BASE_URL = "http://127.0.0.1:8000"  # `kestrel serve`'s default --host / --port
DATASETS = ("random", "fixed", "sharegpt", "prefix_repetition")
SWEPT = ("max_concurrency", "request_rate", "random_input_len", "random_output_len")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object, e.g. '{\"top_k\": 1}'")
    return value


def add_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    many = {"nargs": "+"} if sweep else {}
    g = p.add_argument_group("server")
    g.add_argument("--base-url", default=DEFAULT_BASE_URL,
                   help=f"Server root, without /v1 (default {DEFAULT_BASE_URL}, `kestrel serve`'s)")
    g.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or envs.KESTREL_API_KEY,
                   help="Sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY, else $KESTREL_API_KEY; a "
                        "key on the command line is visible in ps)")
    g.add_argument("--model", default=None, help="Model name in the requests (default: the first of /v1/models)")
    g.add_argument("--endpoint-type", choices=("completions", "chat"), default=None,
                   help="/v1/completions (default) or /v1/chat/completions")
    g.add_argument("--backend", choices=("openai", "openai-chat"), default=None,
                   help="vLLM's name for the same choice: openai = completions, openai-chat = chat")
    g.add_argument("--endpoint", default=None, help="Path of the API route (default: from --endpoint-type)")
    g.add_argument("--tokenizer", default=None,
                   help="A tokenizer.json (or a directory holding one) for prompt lengths in tokens (default: the "
                        "server's /tokenize and /detokenize when it has them, else word-based estimates)")
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset-name", choices=DATASETS, default="random",
                   help="random: lengths around --random-input-len / --random-output-len (--random-range-ratio); "
                        "fixed: exactly those lengths; sharegpt: --dataset-path, a ShareGPT-format JSON; "
                        "prefix_repetition: shared prefixes, to exercise prefix caching")
    d.add_argument("--dataset-path", default=None)
    d.add_argument("--num-prompts", type=int, default=100)
    d.add_argument("--random-input-len", type=int, default=1024, **many)
    d.add_argument("--random-output-len", type=int, default=128, **many)
    d.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="Lengths uniform in [len * (1 - r), len * (1 + r)]")
    d.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="Output length of every ShareGPT request (default: the reply's)")
    d.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    d.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    d.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    d.add_argument("--prefix-repetition-output-len", type=int, default=128)
    a = p.add_argument_group("load")
    a.add_argument("--request-rate", type=float, default=[math.inf] if sweep else math.inf, **many,
                   help="Requests per second (inf: all at once)")
    a.add_argument("--burstiness", type=float, default=1.0,
                   help="Shape of the gamma arrival process: 1 = Poisson, < 1 burstier, > 1 more regular")
    a.add_argument("--max-concurrency", type=int, default=None, **many, help="Most requests in flight")
    a.add_argument("--num-warmups", type=int, default=1, help="Untimed requests before the run")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--temperature", type=float, default=0.0)
    a.add_argument("--ignore-eos", action="store_true", help="Generate exactly the output length (servers that "
                                                              "accept 'ignore_eos': Kestrel, vLLM, SGLang)")
    a.add_argument("--extra-body", type=_json_object, default=None, metavar="JSON",
                   help="A JSON object merged into every request body, e.g. for a server without 'ignore_eos' "
                        "(llama.cpp's): '{\"logit_bias\": {\"2\": -100}}' keeps it from ending early")
    a.add_argument("--request-timeout", type=float, default=6 * 3600.0, help="Seconds per request")
    r = p.add_argument_group("report")
    r.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000 (ms)")
    r.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el")
    r.add_argument("--metric-percentiles", default="50,90,99")
    r.add_argument("--save-result", action="store_true", help="Write the JSON report (implied by the two below)")
    r.add_argument("--result-dir", default=None)
    r.add_argument("--result-filename", default=None)
    r.add_argument("--save-detailed", action="store_true", help="Also each request's generated text")
    r.add_argument("--label", default=None, help="A name for the run in the report")
    r.add_argument("--metadata", nargs="*", default=None, metavar="KEY=VALUE", help="Recorded in the report")
    r.add_argument("--disable-tqdm", action="store_true", help="No progress bar")
    if sweep:
        e = p.add_argument_group("engine configurations (the embedded engine, reloaded between them)")
        e.add_argument("--engine-configs", nargs="+", default=None, metavar="KEY=VALUE[,KEY=VALUE...]",
                       help="Start Kestrel's own server once per configuration (engine options named as "
                            "`kestrel serve`'s flags without dashes, e.g. prefix_caching=off, quantization=int8, "
                            "tp=2,comm_strategy=host; booleans on/off), run every sweep point against it, stop "
                            "it: one report, each point with its configuration. --base-url is not used")
        e.add_argument("--engine-common", default=None, metavar="KEY=VALUE[,KEY=VALUE...]",
                       help="Engine options of every configuration (e.g. model=path.gguf,dtype=float32,"
                            "num_threads=2); a configuration's own keys win")


# ------------------------------------------------------------------------------------------------
# the client and the server


def client_host() -> dict:
    """This machine: CPU, GPUs, driver and topology (engine.host_info.host_hardware), versions and the engine's
    view (engine.bench.report.environment) when the engine's packages import."""
    from engine.host_info import host_hardware

    try:
        from engine.bench.report import environment

        env = environment()
    except Exception:  # noqa: BLE001 - a client-only install
        env = {"python": platform.python_version()}
    env.pop("command", None)  # the report's own "command" is the bench's
    env.pop("gpus", None)  # torch's names: host_hardware has them with memory and topology
    env.update(host_hardware())
    for dist in ("httpx", "numpy", "tqdm"):
        env.setdefault("versions", {})[dist] = load_version(dist)
    return env


def load_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def server_info(http, base_url: str) -> dict:
    """What the server says about itself: /v1/models, /version, /health and Kestrel's /v1/server_info (each
    None when the server has no such route)."""
    out: dict = {"base_url": base_url}
    for key, path in (("models", "/v1/models"), ("version", "/version"), ("health", "/health"),
                      ("kestrel", "/v1/server_info")):
        try:
            r = http.get(base_url + path, timeout=30)
            out[key] = r.json() if r.status_code == 200 else None
        except Exception:  # noqa: BLE001 - unreachable or not JSON
            out[key] = None
    return out


# ------------------------------------------------------------------------------------------------
# one run


def _endpoint(args) -> tuple[str, str]:
    kind = args.endpoint_type or {"openai-chat": "chat", "openai": "completions"}.get(args.backend or "",
                                                                                      "completions")
    path = args.endpoint or ("/v1/chat/completions" if kind == "chat" else "/v1/completions")
    return kind, path


def build_dataset(args, tok: load.Tokenizer, input_len: int, output_len: int) -> tuple[list, dict]:
    n, seed = args.num_prompts, args.seed
    name = args.dataset_name
    if name in ("random", "fixed"):
        ratio = 0.0 if name == "fixed" else args.random_range_ratio
        params = {"input_len": input_len, "output_len": output_len, "range_ratio": ratio}
        samples = load.random_dataset(tok, n, input_len, output_len, ratio, seed)
    elif name == "sharegpt":
        if not args.dataset_path:
            raise ValueError("--dataset-name sharegpt needs --dataset-path")
        params = {"path": os.path.abspath(args.dataset_path), "output_len": args.sharegpt_output_len}
        samples = load.sharegpt_dataset(tok, args.dataset_path, n, args.sharegpt_output_len, seed)
    else:
        params = {"prefix_len": args.prefix_repetition_prefix_len, "suffix_len": args.prefix_repetition_suffix_len,
                  "num_prefixes": args.prefix_repetition_num_prefixes,
                  "output_len": args.prefix_repetition_output_len}
        samples = load.prefix_dataset(tok, n, params["prefix_len"], params["suffix_len"], params["num_prefixes"],
                                      params["output_len"], seed)
    return samples, {"name": name, "num_prompts": n, "seed": seed, "tokenizer": tok.kind, **params}


class Target:
    """The server, its model and the tokenizer used for the prompts, read once for a run or a sweep."""

    def __init__(self, args):
        import httpx

        self.args = args
        self.base = args.base_url.rstrip("/").removesuffix("/v1")
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.http = httpx.Client(headers=self.headers, timeout=600)
        self.info = server_info(self.http, self.base)
        models = [m["id"] for m in (self.info.get("models") or {}).get("data", [])]
        if args.model is None and not models:
            raise RuntimeError(f"{self.base}: no model from /v1/models (is the server up?); give --model")
        self.model = args.model or models[0]
        self.kind, self.path = _endpoint(args)
        vocab = (self.info.get("kestrel") or {}).get("vocab_size")
        self.tok = (load.Tokenizer.from_file(args.tokenizer) if args.tokenizer
                    else load.Tokenizer.probe_server(self.http, self.base, self.model, vocab))

    def close(self) -> None:
        self.http.close()


def run_point(target: Target, args, *, max_concurrency, request_rate: float, input_len: int, output_len: int,
              desc: str = "") -> dict:
    """One benchmark run: its dataset, arrivals, results and metrics (a dict of the report)."""
    return asyncio.run(measure_point(target, args, max_concurrency=max_concurrency, request_rate=request_rate,
                                     input_len=input_len, output_len=output_len, desc=desc))


async def measure_point(target: Target, args, *, max_concurrency, request_rate: float, input_len: int,
                        output_len: int, desc: str = "", on_result=None) -> dict:
    """run_point in a running event loop: ``on_result`` sees each request's result as it ends, and cancelling the
    awaiting task stops the point (the app's Benchmark panel, app/workers/bench_worker.py)."""
    samples, dataset = build_dataset(args, target.tok, input_len, output_len)
    extra = getattr(args, "extra_body", None)
    bodies = [load.request_body(target.kind, target.model, s, ignore_eos=args.ignore_eos,
                                temperature=args.temperature, extra=extra) for s in samples]
    delays = load.arrival_delays(len(bodies), request_rate, args.burstiness, args.seed)
    warm = load.request_body(target.kind, target.model, load.SampleRequest("Hello", 1, 4),
                             temperature=args.temperature, extra=extra)
    results, duration = await load.run_load(
        target.base + target.path, bodies, delays=delays, max_concurrency=max_concurrency, headers=target.headers,
        num_warmups=args.num_warmups, warmup_body=warm, disable_progress=args.disable_tqdm,
        timeout=args.request_timeout, desc=desc, on_result=on_result)
    for r, s in zip(results, samples):
        if r.success and not r.usage_reported:
            r.prompt_len = s.prompt_len
    metrics = load.compute_metrics(
        results, duration, goodput=load.parse_goodput(args.goodput),
        percentile_metrics=tuple(m for m in args.percentile_metrics.split(",") if m),
        percentiles=tuple(float(p) for p in args.metric_percentiles.split(",") if p))
    errors = sorted({r.error for r in results if not r.success})
    return {"dataset": dataset,
            "arrivals": {"request_rate": request_rate, "burstiness": args.burstiness,
                         "max_concurrency": max_concurrency, "num_warmups": args.num_warmups, "seed": args.seed},
            "metrics": metrics, "usage_reported": all(r.usage_reported for r in results if r.success),
            "errors": errors[:10],
            "requests": load.per_request(results, bodies, samples, with_text=args.save_detailed)}


def report_header(target: Target, args, benchmark: str) -> dict:
    """The head of a report: what reproduces it (the command, arguments, hosts, server, sampling, seed)."""
    argv = ["kestrel", *(argv_tail(args) or ["bench", benchmark])]
    head = {"benchmark": benchmark, "label": args.label,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(argv), "args": {k: v for k, v in vars(args).items()
                                                  if k not in ("func", "api_key", "_argv") and not callable(v)},
            "metadata": dict(kv.split("=", 1) for kv in (args.metadata or []) if "=" in kv),
            "client": client_host(),
            "server": {**target.info, "endpoint": target.path, "endpoint_type": target.kind, "model": target.model},
            "sampling": {"temperature": args.temperature, "ignore_eos": args.ignore_eos, "stream": True,
                         "extra_body": getattr(args, "extra_body", None)},
            "goodput_slos_ms": load.parse_goodput(args.goodput), "seed": args.seed}
    head["setup"] = describe_setup(head)
    return head


NOT_REPORTED = "not reported"

# the keys of describe_setup(), in the order reports and exports write them, with their titles
SETUP_FIELDS = [("model", "Model"), ("file_type", "File type"), ("quantization", "Quantization (load option)"),
                ("dtype", "Dtype"), ("tensor_parallel_size", "TP size"), ("comm_strategy", "Comm strategy"),
                ("device", "Device"), ("server_version", "Server version"), ("client_versions", "Client versions")]


def describe_setup(report: dict) -> dict[str, str]:
    """What was measured, as text (NOT_REPORTED where neither the server nor the app said): the model, its file
    type (format and the file's own quantization, e.g. "gguf Q4_1"), the load options (quantization, dtype, TP
    size, comm strategy), the device and the versions. From the server's /v1/server_info (Kestrel's) and, for
    a run of the app against its own server, the load options the app gave (the report's "load"). Written
    into every report as "setup"; the app's exports and library show it."""
    server = report.get("server") or {}
    k = server.get("kestrel") or {}
    load = report.get("load") or {}
    ec = k.get("engine_config") or {}
    host = k.get("host") or {}
    client = report.get("client") or {}

    def first(*values) -> str:
        for v in values:
            if v not in (None, ""):
                return str(v)
        return NOT_REPORTED

    file_type = " ".join(str(v) for v in (k.get("format") or load.get("format"),
                                          k.get("quantization") or load.get("file_quantization")) if v)
    tp = k.get("tensor_parallel_size") or load.get("tensor_parallel_size")
    comm = k.get("comm_strategy") or load.get("comm_strategy")
    if comm is None and tp is not None and int(tp) == 1:
        comm = "none (TP 1)"
    device = first(k.get("device"), load.get("device"))
    gpus = [g.get("name") for g in host.get("gpus") or [] if isinstance(g, dict) and g.get("name")]
    if device.startswith("cuda") and gpus:
        device += f" ({', '.join(dict.fromkeys(gpus))})"
    elif device == "cpu" and host.get("cpu"):
        device += f" ({host['cpu']}, {host.get('logical_cpus', '?')} logical CPUs)"
    versions = client.get("versions") or {}
    client_v = ", ".join(f"{n} {versions[n]}" for n in ("kestrel", "torch", "httpx") if versions.get(n))
    if client.get("python"):
        client_v = f"Python {client['python']}" + (f", {client_v}" if client_v else "")
    other = server.get("version") if isinstance(server.get("version"), dict) else {}
    return {"model": first(server.get("model"), k.get("model"), load.get("model")),
            "file_type": first(file_type),
            "quantization": first(ec.get("quantization"), load.get("quantization")),
            "dtype": first(k.get("dtype"), load.get("dtype")),
            "tensor_parallel_size": first(tp), "comm_strategy": first(comm), "device": device,
            "server_version": first(("Kestrel " + str(k["version"])) if k.get("version") else None,
                                    other.get("version")),
            "client_versions": first(client_v)}


def argv_tail(args) -> list[str]:
    """The command line as given (the API key masked)."""
    tail = list(getattr(args, "_argv", None) or sys.argv[1:])
    for i, a in enumerate(tail):
        if a == "--api-key" and i + 1 < len(tail):
            tail[i + 1] = "REDACTED"
        elif a.startswith("--api-key="):
            tail[i] = "--api-key=REDACTED"
    return tail


def _json_default(o):
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    return str(o)


def write_report(report: dict, args, benchmark: str) -> str | None:
    """The report as JSON where --save-result / --result-filename / --result-dir say; its path, or None."""
    if not (args.save_result or args.result_filename or args.result_dir):
        return None
    name = args.result_filename or (f"kestrel-bench-{benchmark}-"
                                    f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    path = os.path.join(args.result_dir, name) if args.result_dir else name
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(json_safe(report), f, indent=2, default=_json_default)
    return path


def json_safe(o):
    """inf (an unlimited request rate) as the string "inf": JSON has no infinity (the app's saved runs too)."""
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o


def print_summary(point: dict) -> None:
    m = point["metrics"]
    rows = [("Successful requests", m["completed"]), ("Failed requests", m["failed"]),
            ("Benchmark duration (s)", f"{m['duration']:.2f}"), ("Total input tokens", m["total_input_tokens"]),
            ("Total generated tokens", m["total_output_tokens"]),
            ("Request throughput (req/s)", f"{m['request_throughput']:.2f}")]
    if "request_goodput" in m:
        rows.append(("Request goodput (req/s)", f"{m['request_goodput']:.2f}"))
    rows += [("Output token throughput (tok/s)", f"{m['output_throughput']:.2f}"),
             ("Total token throughput (tok/s)", f"{m['total_token_throughput']:.2f}")]
    for key, v in m.items():
        if key.endswith("_ms"):
            stat, name = key[:-3].split("_", 1)
            rows.append((f"{stat.capitalize()} {name.upper()} (ms)", f"{v:.2f}"))
    print("=" * 50)
    for k, v in rows:
        print(f"{k:<36}{v:>14}")
    print("=" * 50)
    for e in point["errors"]:
        print(f"error: {e}", file=sys.stderr)


def check_args(args) -> None:
    """ValueError for what argparse cannot check."""
    load.parse_goodput(args.goodput)
    bad = set(args.percentile_metrics.split(",")) - {"ttft", "tpot", "itl", "e2el", ""}
    if bad:
        raise ValueError(f"--percentile-metrics takes ttft, tpot, itl, e2el, not {', '.join(sorted(bad))}")
    for p in args.metric_percentiles.split(","):
        if p and not 0 <= float(p) <= 100:
            raise ValueError(f"--metric-percentiles: {p} is not in [0, 100]")
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be at least 1")
    if args.dataset_name == "sharegpt" and not (args.dataset_path and os.path.isfile(args.dataset_path)):
        raise ValueError(f"--dataset-name sharegpt needs --dataset-path to a JSON file (got {args.dataset_path!r})")


def guarded(run, args) -> int:
    """``run(args)`` after check_args; a ValueError or RuntimeError is an error line and exit status 2."""
    try:
        check_args(args)
        return run(args)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(args) -> int:
    return guarded(_main, args)


def _main(args) -> int:
    target = Target(args)
    try:
        report = report_header(target, args, "serve")
        point = run_point(target, args, max_concurrency=args.max_concurrency, request_rate=args.request_rate,
                          input_len=args.random_input_len, output_len=args.random_output_len)
    finally:
        target.close()
    report.update(point)
    print_summary(point)
    path = write_report(report, args, "serve")
    if path:
        print(f"report written to {path}")
    return 0 if point["metrics"]["completed"] else 1
