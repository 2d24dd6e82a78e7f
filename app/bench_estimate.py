"""How long a benchmark sweep will take, said before Run, and the presets of the Benchmark panel.

The estimate models each sweep point as waves of ``concurrency`` requests: a wave reads its prompts (``c x
input`` tokens at a prefill rate) and then generates ``output - 1`` more tokens at a time per output token that
grows slowly with the batch. The rates are a rough guess per device (a small model such as the embedded SmolLM2
135M); once a run of the same model is in the library, the guess is scaled by how long that run really took
against what the same model predicted for it, and the panel says which of the two the estimate is."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.bench_report import concurrency, label

# (prefill tokens/s, TPOT s at concurrency 1, TPOT growth per doubling of concurrency): a small model
RATES = {"cpu": (1700.0, 0.015, 0.15), "cuda": (20000.0, 0.008, 0.05)}
OVERHEAD_S = 1.0  # per point: the warm-up request, the dataset, the connection


@dataclass(frozen=True)
class Preset:
    key: str
    title: str
    dataset: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrencies: tuple[int, ...]
    tip: str


PRESETS = {
    "cpu": Preset("cpu", "CPU: quick", "random", 256, 64, 16, (1, 2, 4, 8),
                  "256 tokens in, 64 out, 16 prompts at concurrency 1, 2, 4, 8: about a minute for a small model "
                  "(the embedded SmolLM2 135M) on 2 CPU cores"),
    "gpu": Preset("gpu", "GPU: full sweep", "random", 1024, 128, 100, (1, 2, 4, 8, 16),
                  "1024 tokens in, 128 out, 100 prompts at concurrency 1, 2, 4, 8, 16 (500 requests): the "
                  "usual serving benchmark, sized for a GPU server"),
}
CUSTOM = "custom"


def device_kind(device: str | None) -> str:
    """'cuda' for a GPU device name ("cuda", "cuda:0"), else 'cpu'."""
    return "cuda" if (device or "").startswith(("cuda", "gpu")) else "cpu"


def predict(points: list[tuple[int, int, float, float]], device: str) -> float:
    """Seconds for ``points`` of (concurrency, requests, input tokens, output tokens) on ``device``."""
    prefill, tpot1, growth = RATES[device_kind(device)]
    total = 0.0
    for c, n, inp, out in points:
        c = max(1, min(int(c), int(n))) if n else 1
        tpot = tpot1 * (1 + growth * math.log2(c))
        wave = c * max(inp, 1) / prefill + max(out - 1, 0) * tpot
        total += math.ceil(n / c) * wave + OVERHEAD_S
    return total


def spec_points(spec) -> list[tuple[int, int, float, float]]:
    """A BenchSpec's points (app.workers.bench_worker.BenchSpec); ShareGPT lengths guessed as 256 / 128."""
    if spec.dataset == "random":
        inp, out = spec.input_len, spec.output_len
    elif spec.dataset == "prefix_repetition":
        inp, out = spec.prefix_len + spec.suffix_len, spec.output_len
    else:
        inp, out = 256, 128
    return [(c, spec.num_prompts, float(inp), float(out)) for c in spec.concurrencies]


def report_points(report: dict) -> list[tuple[int, int, float, float, float]]:
    """A saved run's points as (concurrency, requests, mean input, mean output tokens, seconds it took)."""
    out = []
    for p in report.get("points", []):
        m = p.get("metrics", {})
        n = int(m.get("completed", 0) or 0) + int(m.get("failed", 0) or 0)
        if not n or not m.get("duration"):
            continue
        out.append((concurrency(report, p), n, (m.get("total_input_tokens") or 0) / n,
                    (m.get("total_output_tokens") or 0) / n, float(m["duration"])))
    return out


@dataclass(frozen=True)
class Estimate:
    seconds: float
    requests: int
    basis: str  # where the rates come from, in words

    def text(self) -> str:
        return f"About {duration_text(self.seconds)} for {self.requests} requests ({self.basis})."


def estimate(spec, device: str | None, history: dict | None = None) -> Estimate:
    """How long ``spec`` takes on a server on ``device`` ("cpu", "cuda:0"...); ``history``: a saved run of the
    same model on the same server, whose real durations scale the guess."""
    dev = device_kind(device)
    guess = predict(spec_points(spec), dev)
    requests = spec.num_prompts * len(spec.concurrencies)
    if history:
        past = report_points(history)
        predicted = predict([p[:4] for p in past], dev)
        if past and predicted > 0:
            scale = sum(p[4] + OVERHEAD_S for p in past) / predicted
            return Estimate(guess * scale, requests, f"scaled from your run “{label(history)}”")
    what = "a GPU server" if dev == "cuda" else "a CPU server"
    return Estimate(guess, requests, f"a rough guess for a small model on {what}; a first run makes it exact")


def duration_text(seconds: float) -> str:
    """10 s, 50 s, 1 min, 12 min, 1 h 20 min: rounded as a person would say it."""
    s = max(1.0, seconds)
    if s < 55:
        return f"{max(5, int(round(s / 5.0)) * 5)} s"
    if s < 90:
        return "1 min"
    m = s / 60
    if m < 60:
        return f"{int(round(m))} min"
    h, rest = divmod(int(round(m)), 60)
    return f"{h} h" + (f" {rest} min" if rest else "")
