"""Timing an EngineCore step by step, shared by `kestrel bench gpu` (engine/bench/gpu.py), `kestrel bench quant`
and the tensor-parallel benchmark (engine/bench/tp.py): TTFT of one cold prompt, the decode step time of a batch (TPOT), and the helpers
under them (random prompts, running a set of prompts to the end). Greedy, EOS ignored, so every request runs to
its max_tokens; the prefix cache is reset before each measurement so prompts are computed, not found."""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from engine.sampling_params import SamplingParams


def cuda_time(fn, repeats: int, warmups: int = 1) -> float:
    """Median seconds of fn() on the GPU: events around each call, after ``warmups`` calls."""
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def graph_time(fns, calls: int = 24) -> float:
    """Seconds per call of ``calls`` calls cycling through fns, captured in one CUDA graph and replayed: the GPU's
    time without the host's launch cost (which an event pair around one small eager launch would measure instead),
    the calls spread over distinct weights so that they come from memory, not the L2 cache."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    t = cuda_time(graph.replay, 10, warmups=2) / calls
    del graph
    return t


def linear_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer of the shape at TP=1, and the LM head."""
    hd = cfg.head_dim
    return {"qkv": ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd, cfg.hidden_size),
            "o": (cfg.hidden_size, cfg.num_attention_heads * hd), "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
            "down": (cfg.hidden_size, cfg.intermediate_size), "lm_head": (cfg.vocab_size, cfg.hidden_size)}


@contextlib.contextmanager
def triton_compiles() -> Iterator[list[dict]]:
    """Within: every Triton kernel variant built (compiled, or read from Triton's disk cache) is appended to the
    yielded list as {"kernel", "at_s" (since entering), "seconds"}: a step that ran long for a compile shows here.
    Nothing is recorded where Triton is missing or too old to have knobs.runtime hooks (< 3.4)."""
    found: list[dict] = []
    try:
        from triton import knobs
        runtime = knobs.runtime
        saved = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    except (ImportError, AttributeError):
        yield found
        return
    t0 = time.perf_counter()
    began: list[float] = []

    def before(**kw):  # called before every in-memory cache miss; returning a true value would skip the compile
        began.append(time.perf_counter())
        return None

    def after(**kw):
        fn = kw.get("fn")
        name = (getattr(fn, "name", None) or str(kw.get("repr", "?")).split("[")[0]).rsplit(".", 1)[-1]
        now = time.perf_counter()
        start = began.pop() if began else now
        found.append({"kernel": name, "at_s": round(start - t0, 3), "seconds": round(now - start, 3)})
        return None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = before, after
    try:
        yield found
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = saved


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    """n random token ids in [10, vocab) (the low ids are often special tokens)."""
    return [rng.randrange(10, vocab) for _ in range(n)]


def sync(core) -> None:
    """Wait for the core's device (CUDA) before reading the clock."""
    if core.runner.device.type == "cuda":
        torch.cuda.synchronize()


def run_until_done(core) -> None:
    while core.has_unfinished():
        core.step()


def timed_prompts(core, prompts: list[list[int]], max_tokens: int = 1) -> float:
    """Seconds from submitting all the prompts together to the end of the last one (max_tokens each)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    sync(core)
    t0 = time.perf_counter()
    for p in prompts:
        core.add_request(f"bench-{time.monotonic_ns()}", None, params, prompt_token_ids=p)
    run_until_done(core)
    return time.perf_counter() - t0


def ttft_runs(core, length: int, repeats: int, rng: random.Random, chunk: int | None = None) -> list[float]:
    """Seconds from submission to the first token of one cold prompt of ``length`` random tokens, ``repeats``
    times after one warm-up run (cuBLAS heuristics, allocator), which is dropped. With ``chunk`` the step budget
    is cut to that many tokens for the measurement (chunked prefill)."""
    vocab = core.model_config.vocab_size
    sched = core.scheduler
    saved = sched.max_num_batched_tokens
    if chunk:
        sched.max_num_batched_tokens = chunk
    times = []
    try:
        for _ in range(repeats + 1):
            core.blocks.reset_prefix_cache()
            times.append(timed_prompts(core, [random_ids(rng, length, vocab)]))
    finally:
        sched.max_num_batched_tokens = saved
    return times[1:]


@dataclass
class DecodeTimes:
    step_seconds: list[float] = field(default_factory=list)  # each step with the whole batch decoding
    comm_seconds: list[float] = field(default_factory=list)  # tensor parallelism: rank 0's comm time in them


def decode_step_times(core, batch: int, prompt_len: int, steps: int, rng: random.Random) -> DecodeTimes:
    """Submit ``batch`` prompts of ``prompt_len`` random tokens for ``steps + 1`` tokens each and time every step
    in which all of them decode (the prefill steps, and the last one that finishes them, do not count)."""
    vocab = core.model_config.vocab_size
    core.blocks.reset_prefix_cache()
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        core.add_request(f"tpot-{batch}-{i}-{time.monotonic_ns()}", None, params,
                         prompt_token_ids=random_ids(rng, prompt_len, vocab))
    out = DecodeTimes()
    preempted = core.scheduler.num_preemptions
    while core.has_unfinished():
        decoding = all(r.request.output_token_ids for r in core.requests.values())
        t0 = time.perf_counter()
        core.step()
        dt = time.perf_counter() - t0
        if decoding and len(core.requests) == batch:
            out.step_seconds.append(dt)
            if core.executor is not None and core.recent_comm_steps:
                out.comm_seconds.append(core.recent_comm_steps[-1].seconds)
    if not out.step_seconds:
        raise RuntimeError(
            f"no step had all {batch} requests decoding together ({core.scheduler.num_preemptions - preempted} "
            f"preemptions; the KV cache holds {core.blocks.num_blocks} blocks of {core.blocks.block_size} tokens, "
            f"the batch needs {batch} x {prompt_len + steps + 1} tokens)")
    return out
