"""Where a step's GPU time goes, for the developer's GPU run (benchmarks/gpu_lab.py): torch.profiler over the
prefill and decode cases (kernels by name, the GPU's idle gaps and the host work inside them), torch's GEMM rate on
the model's linear shapes, and the prefill figures again with one optimisation off (the ablation)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from engine.bench.gpu import kestrel_batch_prefill, kestrel_prefix_hit, kestrel_ttft
from engine.bench.timing import cuda_time, linear_shapes, random_ids, run_until_done, timed_prompts

DEVICE = "cuda"


def prefill_ablation(core, rng, vocab: int, repeats: int, row) -> dict:
    """Prefill figures again with the residual add as its own kernel (not folded into the row-parallel GEMMs:
    ops.gemm.FOLD_MIN_ROWS out of reach), side by side in the same run. ``row(seconds, query_lens,
    context_lens)`` makes each entry."""
    from engine.ops import gemm

    out = {}
    saved = gemm.FOLD_MIN_ROWS
    gemm.FOLD_MIN_ROWS = 1 << 62
    try:
        out["no_fold_8192"] = row(kestrel_ttft(core, rng, vocab, [8192], repeats)["8192"], [8192], [8192])
        out["no_fold_8192_with_4096_cached"] = row(kestrel_prefix_hit(core, rng, vocab, 8192, 4096, repeats),
                                                   [4096], [8192])
        out["no_fold_64x512"] = row(kestrel_batch_prefill(core, rng, vocab, 64, 512, repeats), [512] * 64,
                                    [512] * 64)
    finally:
        gemm.FOLD_MIN_ROWS = saved
    return out


def gpu_idle(prof, wall_start_us: float | None = None) -> dict:
    """From a torch.profiler run: the time the GPU ran kernels (their intervals merged) and the longest gaps
    between them, each with the host operations that began inside it (what the GPU waited for)."""
    from torch.autograd import DeviceType

    events = prof.events()
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if getattr(e, "device_type", None) == DeviceType.CUDA)
    if not kernels:
        return {}
    busy, gaps = 0.0, []
    cur_s, cur_e = kernels[0]
    for s0, e0 in kernels[1:]:
        if s0 > cur_e:
            busy += cur_e - cur_s
            gaps.append((s0 - cur_e, cur_e, s0))
            cur_s = s0
        cur_e = max(cur_e, e0)
    busy += cur_e - cur_s
    host = [(e.time_range.start, e.name) for e in events if getattr(e, "device_type", None) == DeviceType.CPU]
    out = {"kernels_busy_ms": busy / 1e3, "first_kernel_ms": None,
           "span_ms": (cur_e - kernels[0][0]) / 1e3}
    if wall_start_us is not None:
        out["first_kernel_ms"] = (kernels[0][0] - wall_start_us) / 1e3
    top = []
    for length, a, b in sorted(gaps, reverse=True)[:8]:
        names = []
        for t, name in host:
            if a <= t < b and name not in names:
                names.append(name)
        top.append({"gap_ms": round(length / 1e3, 3), "at_ms": round((a - kernels[0][0]) / 1e3, 3),
                    "host_ops": names[:6]})
    out["gaps_over_50us_ms"] = sum(g[0] for g in gaps if g[0] > 50) / 1e3
    out["longest_gaps"] = top
    return out


def profile_cases(core, rng, vocab: int, top: int = 12, trace_dir: str | None = None,
                  only: list[str] | None = None) -> dict:
    """Where the GPU time of one step goes (torch.profiler, CUDA kernels summed by name) for a cold 1,024- and
    8,192-token prompt, the 8,192 prompt with 4,096 cached, 64 x 512 prompts, a mixed step (512 decodes beside as
    many 512-token prompts as the step's token budget takes, as in the throughput run's mixed steps) and one
    batch-1 decode step; with the wall time, the GPU's busy time and its longest idle gaps (with the host work
    inside them), and the engine's record of the case's last step (its prefill and decode tokens). trace_dir: a
    Chrome trace of each case is written there too. ``only``: the names of the cases to run (default: all)."""
    from torch.profiler import ProfilerActivity, profile

    from engine.sampling_params import SamplingParams

    # each case's prompts are drawn before the profiled call (8,192 random draws take ~8 ms of host time)
    def fresh(n: int):
        def setup():
            core.blocks.reset_prefix_cache()
            prompts = [random_ids(rng, n, vocab)]
            return lambda: timed_prompts(core, prompts)
        return setup

    def cached_4096():
        core.blocks.reset_prefix_cache()
        prefix = random_ids(rng, 4096, vocab)
        timed_prompts(core, [prefix])
        prompts = [prefix + random_ids(rng, 4096, vocab)]
        return lambda: timed_prompts(core, prompts)

    def batch_64x512():
        core.blocks.reset_prefix_cache()
        prompts = [random_ids(rng, 512, vocab) for _ in range(64)]
        return lambda: timed_prompts(core, prompts)

    def mixed_512_decodes():
        core.blocks.reset_prefix_cache()
        decoding = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        for i in range(512):
            core.add_request(f"m{i}-{time.monotonic_ns()}", None, decoding,
                             prompt_token_ids=random_ids(rng, 512, vocab))
        while not all(tr.request.output_token_ids for tr in core.requests.values()):
            core.step()
        prompts = [random_ids(rng, 512, vocab) for _ in range(64)]
        first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

        def one_step():
            for p in prompts:
                core.add_request(f"mp-{time.monotonic_ns()}", None, first, prompt_token_ids=p)
            core.step()
        return one_step

    def decode_1():
        core.blocks.reset_prefix_cache()
        core.add_request(f"p{time.monotonic_ns()}", None, SamplingParams(max_tokens=8, temperature=0.0,
                                                                         ignore_eos=True),
                         prompt_token_ids=random_ids(rng, 512, vocab))
        for _ in range(3):
            core.step()
        return lambda: core.step()

    cases = (("fresh_1024", fresh(1024)), ("fresh_8192", fresh(8192)), ("8192_with_4096_cached", cached_4096),
             ("64x512", batch_64x512), ("mixed_512_decodes_64x512", mixed_512_decodes), ("decode_batch1", decode_1))
    out = {}
    for name, setup in cases:
        if only is not None and name not in only:
            continue
        setup()()  # warm-up
        run_until_done(core)
        run_case = setup()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            with torch.profiler.record_function("bench_case_start"):
                pass
            t0 = time.perf_counter()
            run_case()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        step = core.recent_steps[-1] if core.recent_steps else None
        run_until_done(core)
        if trace_dir:
            prof.export_chrome_trace(str(Path(trace_dir) / f"trace_{name}.json"))
        start = [e.time_range.start for e in prof.events() if e.name == "bench_case_start"]
        rows = []
        for e in prof.key_averages():
            dev = getattr(e, "self_device_time_total", None)
            if dev is None:
                dev = getattr(e, "self_cuda_time_total", 0)
            if dev > 0:
                rows.append((e.key[:90], e.count, dev / 1e3))
        rows.sort(key=lambda r: -r[2])
        out[name] = {"wall_ms": wall * 1e3, "gpu_ms": sum(r[2] for r in rows),
                     "top": [{"kernel": k, "calls": c, "ms": round(ms, 3)} for k, c, ms in rows[:top]],
                     "gpu_idle": gpu_idle(prof, start[0] if start else None)}
        if step is not None:
            out[name]["last_step"] = {"prefill_tokens": step.num_prefill_tokens,
                                      "decode_tokens": step.num_decode_tokens, "ms": round(step.duration * 1e3, 2)}
        idle = out[name]["gpu_idle"]
        print(f"profile {name}: wall {wall * 1e3:.1f} ms, kernels busy {idle.get('kernels_busy_ms', 0):.1f} ms, "
              f"first kernel at {idle.get('first_kernel_ms') or 0:.1f} ms, gaps > 50 us "
              f"{idle.get('gaps_over_50us_ms', 0):.1f} ms; "
              + "; ".join(f"{r[0][:40]} {r[2]:.1f}" for r in rows[:5]), flush=True)
    return out


def linear_rates(cfg, tokens: int = 8192, repeats: int = 5) -> dict:
    """TFLOP/s of torch's GEMM on the model's linear shapes at ``tokens`` rows: the achievable rate of the
    prefill's linear layers on this GPU."""
    out = {}
    for name, (n, k) in linear_shapes(cfg).items():
        if name == "lm_head":  # one row per prompt in prefill, not ``tokens``
            continue
        x = torch.randn(tokens, k, dtype=torch.bfloat16, device=DEVICE)
        w = torch.randn(n, k, dtype=torch.bfloat16, device=DEVICE)
        t = cuda_time(lambda x=x, w=w: torch.nn.functional.linear(x, w), repeats)
        out[name] = {"ms": t * 1e3, "tflops": 2 * tokens * k * n / t / 1e12}
        del x, w
    return out
