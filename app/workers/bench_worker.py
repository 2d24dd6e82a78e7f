"""Runs a benchmark sweep (engine/bench/load.py's datasets, requests and metrics, as `kestrel bench sweep`) on
a thread of its own, with an asyncio loop per point, and reports it as queued signals: each finished request
(TTFT, TPOT, E2E latency), progress, each finished sweep point, the report, or an error in words.

A sweep is described by a ``BenchSpec``, which is also the command line that re-runs it: the spec becomes the
argv of `kestrel bench sweep`, parsed by the command's own argument parser (engine.bench.serve.add_args), so
the app's report and the command's carry the same arguments and keys. Each point runs through the command's own
``serve.measure_point`` (its dataset, schedule and metrics), with a callback that draws every request as it ends;
Stop cancels the point's task, mid-point."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal, Slot

from app.workers import stop_thread, thread_for

DATASETS = {"random": "Random", "prefix_repetition": "Shared prefix", "sharegpt": "ShareGPT file"}


@dataclass
class BenchSpec:
    base_url: str
    model: str | None = None  # None: the first of the server's /v1/models
    api_key: str | None = None  # sent, never written to the command line or the report
    dataset: str = "random"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    dataset_path: str | None = None
    num_prompts: int = 100
    concurrencies: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    seed: int = 0
    num_warmups: int = 1
    endpoint_type: str = "completions"
    ignore_eos: bool = True  # every request generates its output length: comparable points
    label: str | None = None

    def argv(self) -> list[str]:
        """`kestrel bench sweep` arguments that run this sweep (the API key left out: the command reads it
        from $OPENAI_API_KEY)."""
        a = ["bench", "sweep", "--base-url", self.base_url]
        if self.model:
            a += ["--model", self.model]
        a += ["--endpoint-type", self.endpoint_type, "--dataset-name", self.dataset,
              "--num-prompts", str(self.num_prompts)]
        if self.dataset == "random":
            a += ["--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len)]
            if self.range_ratio:
                a += ["--random-range-ratio", f"{self.range_ratio:g}"]
        elif self.dataset == "prefix_repetition":
            a += ["--prefix-repetition-prefix-len", str(self.prefix_len),
                  "--prefix-repetition-suffix-len", str(self.suffix_len),
                  "--prefix-repetition-num-prefixes", str(self.num_prefixes),
                  "--prefix-repetition-output-len", str(self.output_len)]
        else:
            a += ["--dataset-path", self.dataset_path or ""]
        a += ["--max-concurrency", *(str(c) for c in self.concurrencies), "--seed", str(self.seed),
              "--num-warmups", str(self.num_warmups)]
        if self.ignore_eos:
            a.append("--ignore-eos")
        if self.label:
            a += ["--label", self.label]
        return a

    def command(self) -> str:
        return shlex.join(["kestrel", *self.argv()])

    def args(self) -> argparse.Namespace:
        """The argv parsed by `kestrel bench sweep`'s own parser: the same defaults, the same checks."""
        from engine.bench import serve

        p = argparse.ArgumentParser(prog="kestrel bench sweep", exit_on_error=False)
        serve.add_args(p, sweep=True)
        ns = p.parse_args(self.argv()[2:])
        ns.api_key = self.api_key
        ns.command, ns.bench_command = "bench", "sweep"  # as engine.cli's subparsers record them
        ns.disable_tqdm = True
        serve.check_args(ns)
        return ns


@dataclass(frozen=True)
class RequestSample:
    """One finished request, as the live charts draw it."""
    point: int  # index of the sweep point
    concurrency: int | None
    t: float  # seconds since the sweep started, at the request's end
    ttft_ms: float
    tpot_ms: float | None  # None with fewer than two output tokens
    e2el_ms: float
    output_tokens: int
    ok: bool
    error: str = ""


class BenchStopped(Exception):
    pass


def plain_error(base: str, status: int | None, listing: dict | None, model: str | None) -> str | None:
    """Why the server cannot be benchmarked as asked, in words (None: it can), from its answer to GET
    /v1/models: ``status`` None when nothing answered."""
    if status is None:
        return (f"Cannot reach {base}: nothing answered there. Is the server running, and is the URL right "
                f"(without /v1)?")
    if status in (401, 403):
        return "The server refused the API key (HTTP %d): check the key." % status
    served = [m.get("id") for m in (listing or {}).get("data", []) if isinstance(m, dict)]
    if status != 200 and model is None:
        return f"{base} did not list its models (/v1/models answered HTTP {status}); type the model name."
    if model and served and model not in served:
        return f"The server has no model named “{model}”. It serves: {', '.join(served)}."
    return None


def probe(base: str, api_key: str | None) -> tuple[int | None, dict | None]:
    """GET /v1/models: (status, JSON body) or (None, None) when nothing answered."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base}/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError:
        return None, None
    try:
        body = r.json()
    except ValueError:
        body = None
    return r.status_code, body if isinstance(body, dict) else None


def request_error(msg: str) -> str:
    """A failed request's error in words."""
    if msg.startswith("HTTP 401") or msg.startswith("HTTP 403"):
        return "The server refused the API key (HTTP 401/403)."
    if msg.startswith("HTTP 404"):
        return f"The server answered 404: wrong URL or model name ({msg[9:160]})"
    if "ConnectError" in msg or "ConnectionRefused" in msg:
        return "The connection to the server failed (did it stop?)."
    return msg[:300]


class BenchWorker(QObject):
    """``run(spec)`` starts a sweep (one at a time), ``stop()`` ends it; everything else is signals."""

    started = Signal(str, int)  # command line, total requests of the sweep
    requestDone = Signal(object)  # RequestSample
    progress = Signal(int, int)  # requests done, total
    pointDone = Signal(object)  # the point's dict, as in the report's "points"
    finished = Signal(object)  # the report (stopped: the points done so far, metadata "stopped": true)
    failed = Signal(str)  # a reason in words; nothing was measured

    _run = Signal(object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._stop_asked = False
        self._thread = thread_for(self, "bench")
        self._run.connect(self._execute)
        self._thread.start()

    # GUI side
    def run(self, spec: BenchSpec) -> None:
        if self.running:
            return
        self.running = True
        self._stop_asked = False
        self._run.emit(spec)

    def stop(self) -> None:
        """End the run: requests in flight are cancelled; the points finished are kept."""
        self._stop_asked = True
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)

    def shutdown(self) -> None:
        self.stop()
        stop_thread(self._thread, 30000)

    # the bench thread
    @Slot(object)
    def _execute(self, spec: BenchSpec) -> None:
        try:
            report = self._sweep(spec)
        except Exception as e:  # noqa: BLE001 - any failure becomes words in the panel
            self.running = False
            self.failed.emit(str(e) or type(e).__name__)
            return
        self.running = False
        self.finished.emit(report)

    def _sweep(self, spec: BenchSpec) -> dict:
        from engine.bench import serve

        try:
            args = spec.args()
        except (argparse.ArgumentError, ValueError) as e:
            raise ValueError(f"Invalid settings: {e}") from None
        args._argv = spec.argv()
        base = args.base_url.rstrip("/").removesuffix("/v1")
        why = plain_error(base, *probe(base, spec.api_key), spec.model)
        if why:
            raise RuntimeError(why)
        target = serve.Target(args)
        try:
            report = self._header(target, args, spec)
            total = len(spec.concurrencies) * spec.num_prompts
            self.started.emit(report["command"], total)
            done = [0]
            t_start = time.perf_counter()
            points = report["points"]
            for i, conc in enumerate(spec.concurrencies):
                if self._stop_asked:
                    break
                point = self._point(target, args, serve, i, conc, done, total, t_start)
                if point is None:
                    break
                points.append(point)
                self.pointDone.emit(point)
        finally:
            target.close()
        report["metadata"]["stopped"] = len(report["points"]) < len(spec.concurrencies)
        if not report["points"]:
            raise RuntimeError("Stopped before the first point finished: nothing measured.")
        if all(p["metrics"]["completed"] == 0 for p in report["points"]):
            errs = [e for p in report["points"] for e in p["errors"]]
            why = request_error(errs[0]) if errs else "no reason given"
            raise RuntimeError(f"Every request failed: {why}")
        return report

    def _point(self, target, args, serve, i: int, conc: int, done: list, total: int, t_start: float):
        """One sweep point through `kestrel bench sweep`'s own measure_point; None when stopped."""

        def on_result(r) -> None:
            done[0] += 1
            many = r.success and r.output_tokens > 1
            tpot = (r.e2el - r.ttft) / (r.output_tokens - 1) * 1000 if many else None
            self.requestDone.emit(RequestSample(i, conc, time.perf_counter() - t_start, r.ttft * 1000, tpot,
                                                r.e2el * 1000, r.output_tokens, r.success, r.error))
            self.progress.emit(done[0], total)

        q = {"max_concurrency": conc, "request_rate": args.request_rate[0],
             "random_input_len": args.random_input_len[0], "random_output_len": args.random_output_len[0]}

        async def go():
            self._task = asyncio.current_task()
            return await serve.measure_point(target, args, max_concurrency=conc, request_rate=q["request_rate"],
                                             input_len=q["random_input_len"], output_len=q["random_output_len"],
                                             on_result=on_result)

        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            point = loop.run_until_complete(go())
        except asyncio.CancelledError:
            return None
        finally:
            self._loop = self._task = None
            loop.close()
        return {"params": q, **point}

    @staticmethod
    def _header(target, args, spec: BenchSpec) -> dict:
        """The report's head, as `kestrel bench sweep` writes it (engine/bench/serve.py report_header)."""
        from engine.bench import serve

        head = serve.report_header(target, args, "sweep")
        head["command"] = spec.command()
        head["metadata"] = {"client": "kestrel app"}
        head["sweep"] = {k: getattr(args, k) for k in serve.SWEPT}
        head["points"] = []
        return head


def parse_concurrencies(text: str) -> list[int]:
    """ "1,2,4 8" -> [1, 2, 4, 8]; ValueError in words for anything else."""
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise ValueError("Give at least one concurrency, e.g. 1,2,4,8")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"Concurrencies are whole numbers separated by commas, not “{text}”") from None
    if any(v < 1 for v in values):
        raise ValueError("Each concurrency must be at least 1")
    return values

