"""`kestrel bench gpu`: Kestrel against HF transformers on one GPU, and both against the GPU's limits.

One command, one JSON report (written after every measurement, so a run cut short keeps what it measured) and a
printed table. The Llama-3-8B shape in bf16 with random weights (no download). In one process, one after the
other: the GPU's measured copy bandwidth and bf16 GEMM rate; the attention kernels alone; Kestrel (TP=1); then HF
transformers (eager, SDPA) on the same shape.

Figures (Kestrel; HF where it has the concept):
- TTFT of cold 1,024 / 4,096 / 8,192-token prompts (Kestrel with the Triton varlen kernel, and with SDPA);
- an 8,192-token prompt whose first 4,096 tokens are a prefix-cache hit; the 8,192-token prompt in 2,048-token
  chunks; 64 prompts of 512 tokens submitted together (one step);
- TPOT at batch 1 / 8 / 64 after 512-token prompts (median decode step);
- Kestrel's throughput on 1,024 requests of 512 prompt and 256 output tokens, all submitted at once.
Each figure as a share of its limit: prefill FLOPs (linear layers + causal attention + the LM head rows) at the
measured GEMM rate; decode bytes (weights + the KV cache read) at the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.bench.decode import decode_breakdown, linear_shapes, measure_skinny
from engine.bench.timing import (
    cuda_time,
    decode_step_times,
    random_ids,
    run_until_done,
    timed_prompts,
    triton_compiles,
    ttft_runs,
)

SHAPE = "llama3-8b"
DEVICE = "cuda"


def _candidates():
    from engine.ops.varlen_attention import KernelConfig

    return [KernelConfig(128, 64, 4, 4, tma=True), KernelConfig(128, 64, 8, 3, tma=True),
            KernelConfig(64, 64, 4, 3, tma=True), KernelConfig(64, 32, 4, 3, tma=True), KernelConfig(64, 64, 4, 2),
            KernelConfig(64, 128, 4, 2), KernelConfig(32, 64, 4, 2)]


# ---------------------------------------------------------------------------------------------------
# limits


def measure_limits() -> dict:
    n = 1 << 30  # 2 GiB of bf16 each way
    src = torch.empty(n, dtype=torch.bfloat16, device=DEVICE)
    dst = torch.empty_like(src)
    t = cuda_time(lambda d=dst, s=src: d.copy_(s), 10)
    copy_bw = 2 * src.numel() * 2 / t  # bytes read + written per second
    del src, dst
    return {"copy_bytes_per_s": copy_bw, **gemm_rates()}


def gemm_rates(sustain_s: float = 1.5) -> dict:
    """bf16 GEMM rate (8,192^3) in a burst of 10 calls, the shares' basis, and sustained: the calls of the last
    second of ``sustain_s`` back to back. An H200 measured 782 TFLOP/s in a burst at the start of a run and 675
    after it; long prefill steps run at the sustained clocks."""
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device=DEVICE)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=DEVICE)
    flop = 2 * m ** 3
    burst = cuda_time(lambda a=a, b=b: a @ b, 10)
    calls = max(10, int(1.0 / burst))
    for _ in range(max(0, int((sustain_s - 1.0) / burst))):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        a @ b
    end.record()
    end.synchronize()
    sustained = start.elapsed_time(end) / 1e3 / calls
    del a, b
    torch.cuda.empty_cache()
    return {"bf16_gemm_flop_per_s": flop / burst, "bf16_gemm_sustained_flop_per_s": flop / sustained}


# ---------------------------------------------------------------------------------------------------
# model arithmetic


def model_numbers(cfg) -> dict:
    """Parameter and byte counts of the shape that the limits need."""
    h, inter, L, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    layer_linear = h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * inter
    return {"linear_params": L * layer_linear, "head_params": v * h, "embed_params": v * h,
            "kv_bytes_per_token": 2 * L * nkv * hd * 2, "layers": L, "heads": nh, "head_dim": hd}


def prefill_flops(nums: dict, query_lens: list[int], context_lens: list[int]) -> float:
    from engine.ops.varlen_attention import flops as attention_flops

    tokens = sum(query_lens)
    linear = 2.0 * nums["linear_params"] * tokens + 2.0 * nums["head_params"] * len(query_lens)
    attention = nums["layers"] * attention_flops(query_lens, context_lens, nums["heads"], nums["head_dim"])
    return linear + attention


def decode_bytes(nums: dict, batch: int, context: int) -> float:
    weights = 2.0 * (nums["linear_params"] + nums["head_params"])
    return weights + batch * context * nums["kv_bytes_per_token"]


# ---------------------------------------------------------------------------------------------------
# the attention kernels alone


def measure_kernels(repeats: int = 5) -> dict:
    """TFLOP/s of the varlen kernel (each configuration, sm_89's forced on this GPU too) and of SDPA's flash
    backend on the 8B shape's attention (32 heads, 8 KV heads, head size 128): fresh 8,192; 4,096 new on
    4,096 cached; 64 x 512. The cache has the engine's GPU block size (TMA loads on sm_90); the same cache seen
    as blocks of 16 tokens gives the pointer-load path ("_blocks16")."""
    import torch.nn.functional as F

    from engine.ops import varlen_attention as va
    from engine.runner.device import default_block_size

    CANDIDATES = _candidates()
    nh, nkv, hd, bs = 32, 8, 128, default_block_size(torch.device(DEVICE))
    cases = {"fresh_8192": [(8192, 0)], "8192_with_4096_cached": [(4096, 4096)], "64x512": [(512, 0)] * 64}
    out: dict = {}
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for name, seqs in cases.items():
        qlens = [q for q, _ in seqs]
        ctxs = [q + p for q, p in seqs]
        nblocks = sum(-(-c // bs) for c in ctxs)
        kc = torch.randn(nblocks, bs, nkv, hd, generator=g, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        perm = torch.randperm(nblocks, generator=g, device=DEVICE).to(torch.int32)
        width = max(-(-c // bs) for c in ctxs)
        rows, i = [], 0
        for c in ctxs:
            nb = -(-c // bs)
            rows.append(torch.nn.functional.pad(perm[i:i + nb], (0, width - nb)))
            i += nb
        bt = torch.stack(rows)
        sl = torch.tensor(ctxs, dtype=torch.int32, device=DEVICE)
        qsl = torch.tensor([0] + list(itertools.accumulate(qlens)), dtype=torch.int32, device=DEVICE)
        q = torch.randn(sum(qlens), nh, hd, generator=g, device="cuda", dtype=torch.bfloat16)
        o = torch.empty_like(q)
        fl = va.flops(qlens, ctxs, nh, hd)
        res = {}
        split = bs // 16  # the same cache as blocks of 16 tokens
        caches = {bs: (kc, vc, bt), 16: (kc.view(-1, 16, nkv, hd), vc.view(-1, 16, nkv, hd),
                                         (bt[:, :, None] * split + torch.arange(split, device=DEVICE,
                                                                                 dtype=torch.int32)).flatten(1))}
        configs = {f"triton_{t}": (va.config_for(q.device, hd, t), bs) for t in ("sm90", "sm89")}
        configs["triton_sm90_short"] = (va.config_for(q.device, hd, "sm90", short=True), bs)
        configs["triton_sm90_blocks16"] = (va.config_for(q.device, hd, "sm90"), 16)
        configs.update({f"candidate_{c.block_m}x{c.block_n}_w{c.num_warps}_s{c.num_stages}{'_tma' * c.tma}": (c, bs)
                        for c in CANDIDATES})
        for label, (cfg, block) in configs.items():
            k_, v_, bt_ = caches[block]
            plan = va.VarlenPlan.build(qlens, ctxs, cfg.block_m, q.device)
            try:
                t = cuda_time(lambda args=(q, k_, v_, bt_, sl, qsl, plan), o=o, cfg=cfg: va.varlen_paged_attention(
                    *args, hd ** -0.5, out=o, config=cfg), repeats)
            except Exception as e:  # noqa: BLE001 - a candidate that does not fit this GPU is a line in the report
                res[label] = {"error": str(e)[:200]}
                continue
            res[label] = {"ms": t * 1e3, "tflops": fl / t / 1e12, "config": vars(cfg), "block_size": block,
                          "tma": va.tma_descriptors(k_, v_, cfg, hd) is not None}
        if all(p == 0 for _, p in seqs):  # SDPA (flash) on the same tokens, dense 4-D inputs per prompt
            n = qlens[0]
            qd = q.view(len(qlens), n, nh, hd).transpose(1, 2)
            kd = torch.randn(len(qlens), nkv, n, hd, generator=g, device="cuda", dtype=torch.bfloat16)
            vd = torch.randn_like(kd)
            t = cuda_time(lambda qd=qd, kd=kd, vd=vd: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True,
                                                                                      enable_gqa=True), repeats)
            res["sdpa"] = {"ms": t * 1e3, "tflops": fl / t / 1e12}
        out[name] = res
        del kc, vc, q, o
        torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------------------
# Kestrel


def kestrel_ttft(core, rng, vocab: int, lengths: list[int], repeats: int, chunk: int | None = None) -> dict:
    """Median seconds from submission to the first token of one prompt of each length (cold: prefix cache
    reset); with ``chunk`` the step budget is cut to that many tokens (chunked prefill)."""
    return {str(n): statistics.median(ttft_runs(core, n, repeats, rng, chunk)) for n in lengths}


def kestrel_prefix_hit(core, rng, vocab: int, total: int, cached: int, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        core.blocks.reset_prefix_cache()
        prefix = random_ids(rng, cached, vocab)
        timed_prompts(core, [prefix])  # fills the prefix cache
        times.append(timed_prompts(core, [prefix + random_ids(rng, total - cached, vocab)]))
    return statistics.median(times[1:])


def kestrel_batch_prefill(core, rng, vocab: int, n: int, length: int, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        core.blocks.reset_prefix_cache()
        times.append(timed_prompts(core, [random_ids(rng, length, vocab) for _ in range(n)]))
    return statistics.median(times[1:])


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


def kestrel_tpot(core, rng, vocab: int, batch: int, prompt: int, steps: int) -> float:
    """Median seconds of a decode step with every one of ``batch`` requests decoding."""
    return statistics.median(decode_step_times(core, batch, prompt, steps, rng).step_seconds)


def kestrel_throughput(core, rng, vocab: int, n: int, prompt: int, output: int) -> dict:
    from engine.sampling_params import SamplingParams

    core.blocks.reset_prefix_cache()
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_stats()
    t0 = time.perf_counter()
    for _ in range(n):
        core.add_request(f"x{time.monotonic_ns()}", None, params, prompt_token_ids=random_ids(rng, prompt, vocab))
    t_added = time.perf_counter()
    steps = 0
    kinds = {"decode": [0, 0.0, 0], "mixed": [0, 0.0, 0]}  # steps, seconds, decode rows
    log = []  # every step: kind, ms, decode rows, prefill tokens (where the time goes, step by step)
    last = core.recent_steps[-1] if core.recent_steps else None
    with triton_compiles() as compiles:
        while core.has_unfinished():
            core.step()
            steps += 1
            st = core.recent_steps[-1] if core.recent_steps else None
            if st is not None and st is not last:  # a step that ran (an empty one records nothing)
                last = st
                name = "mixed" if st.num_prefill_tokens else "decode"
                k = kinds[name]
                k[0] += 1
                k[1] += st.duration
                k[2] += st.num_decode_tokens
                log.append([name[0], round(st.duration * 1e3, 2), st.num_decode_tokens, st.num_prefill_tokens])
    dt = time.perf_counter() - t0
    mem1 = torch.cuda.memory_stats()
    mixed_ms = sorted(x[1] for x in log if x[0] == "m")
    decode_ms = sorted(x[1] for x in log if x[0] == "d")
    return {"seconds": dt, "output_tok_s": n * output / dt, "total_tok_s": n * (prompt + output) / dt,
            "steps": steps, "preemptions": core.scheduler.num_preemptions,
            "async_scheduling": core.async_scheduling, "add_requests_s": round(t_added - t0, 3),
            # where the time went: steps with a prefill chunk (and the decodes beside it) against decode-only steps
            "by_step_kind": {name: {"steps": c, "seconds": round(sec, 3), "mean_ms": round(1e3 * sec / max(1, c), 2),
                                    "mean_decode_batch": round(rows / max(1, c), 1)}
                             for name, (c, sec, rows) in kinds.items()},
            "mixed_ms_min_median_max": [mixed_ms[0], mixed_ms[len(mixed_ms) // 2], mixed_ms[-1]] if mixed_ms else [],
            "decode_ms_min_median_max": [decode_ms[0], decode_ms[len(decode_ms) // 2], decode_ms[-1]]
            if decode_ms else [],
            # the caching allocator during the run: cudaMalloc / cudaFree calls and retries after freeing its cache
            "allocator": {key: mem1.get(key, 0) - mem0.get(key, 0)
                          for key in ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms")},
            # Triton kernels built during the run (a long step at the same moment was waiting for one)
            "triton_compiles": compiles,
            "step_log": log}


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


# ---------------------------------------------------------------------------------------------------
# HF transformers


def hf_model(cfg):
    import transformers

    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rope_theta=cfg.rope_theta,
        max_position_embeddings=16384, rms_norm_eps=1e-5, tie_word_embeddings=False)
    hf_cfg._attn_implementation = "sdpa"
    with torch.device(DEVICE):
        model = transformers.LlamaForCausalLM._from_config(hf_cfg, dtype=torch.bfloat16)
    return model.eval()


def _hf_kwargs(model) -> dict:
    import inspect

    params = inspect.signature(model.forward).parameters
    if "logits_to_keep" in params:
        return {"logits_to_keep": 1}
    if "num_logits_to_keep" in params:
        return {"num_logits_to_keep": 1}
    return {}


@torch.inference_mode()
def hf_prefill(model, rng, vocab: int, batch: int, length: int, repeats: int) -> float:
    kw = _hf_kwargs(model)
    times = []
    for _ in range(repeats + 1):
        ids = torch.tensor([random_ids(rng, length, vocab) for _ in range(batch)], device=DEVICE)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(ids, use_cache=True, **kw).logits
        logits[:, -1].argmax(-1).tolist()
        times.append(time.perf_counter() - t0)
        del logits
    return statistics.median(times[1:])


@torch.inference_mode()
def hf_tpot(model, rng, vocab: int, batch: int, prompt: int, steps: int) -> float:
    kw = _hf_kwargs(model)
    ids = torch.tensor([random_ids(rng, prompt, vocab) for _ in range(batch)], device=DEVICE)
    out = model(ids, use_cache=True, **kw)
    cache = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(nxt, past_key_values=cache, use_cache=True, **kw)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        nxt.tolist()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


# ---------------------------------------------------------------------------------------------------


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - the report says unknown
        return None


def run(args) -> dict:
    from engine.bench.report import environment
    from engine.bench.tp import make_core, random_checkpoint

    report: dict = {"benchmark": "gpu", "command": " ".join(sys.argv), "environment": environment(),
                    "args": vars(args).copy()}
    try:
        import transformers
        import triton

        report["environment"]["versions"] = {"triton": triton.__version__, "transformers": transformers.__version__}
    except ImportError as e:
        report["environment"]["versions"] = {"missing": str(e)}
    report["environment"]["torch"] = torch.__version__
    report["environment"]["driver"] = _driver_version()
    report["environment"]["gpu"] = torch.cuda.get_device_name()
    report["environment"]["capability"] = list(torch.cuda.get_device_capability())

    def save() -> None:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))

    lim = report["limits"] = measure_limits()
    save()
    print(f"limits: copy {lim['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 GEMM "
          f"{lim['bf16_gemm_flop_per_s'] / 1e12:.0f} TFLOP/s (sustained "
          f"{lim['bf16_gemm_sustained_flop_per_s'] / 1e12:.0f}; the shares use the burst rate)", flush=True)
    if "kernels" not in args.skip:
        report["kernels"] = measure_kernels()
        save()
        for name, res in report["kernels"].items():
            print(f"attention {name}: " + ", ".join(f"{k} {v['tflops']:.0f}" for k, v in res.items() if "tflops" in v)
                  + " TFLOP/s", flush=True)

    rng = random.Random(args.seed)
    ckpt = random_checkpoint(SHAPE, seed=args.seed, max_position=16384)
    cfg = ckpt.config
    if "skinny" not in args.skip:
        report["skinny_gemm_gb_s"] = measure_skinny(cfg)
        save()
        for name, r in report["skinny_gemm_gb_s"].items():
            print(f"linear {name}: cuBLAS {r['cublas']:.0f}, GEMV {r.get('default', float('nan')):.0f} GB/s, best "
                  f"{r['best']} {r[r['best']]:.0f}", flush=True)
    if "attention" not in args.skip:
        from engine.bench.decode import measure_decode_attention

        report["decode_attention"] = measure_decode_attention(cfg)
        save()
        for name, r in report["decode_attention"].items():
            print(f"decode attention {name}: graphs {r['graphs']['us']:.1f} us {r['graphs']['gb_s']:.0f} GB/s, eager "
                  f"{r['eager']['us']:.1f} us {r['eager']['gb_s']:.0f} GB/s "
                  f"({100 * r['graphs']['gb_s'] * 1e9 / lim['copy_bytes_per_s']:.0f}% of copy); graphs' splits "
                  f"{r['graphs_splits']}, by splits: " + ", ".join(
                      f"{k} {v['gb_s']:.0f}" for k, v in r["graphs_by_splits"].items()) + " GB/s; by tokens per step: "
                  + ", ".join(f"{k} {v['gb_s']:.0f}" for k, v in r["graphs_by_tokens_per_step"].items()) + " GB/s",
                  flush=True)
    nums = model_numbers(cfg)
    vocab = cfg.vocab_size
    gemm, copy = lim["bf16_gemm_flop_per_s"], lim["copy_bytes_per_s"]

    def prefill_row(seconds: float, qlens: list[int], ctxs: list[int]) -> dict:
        limit = prefill_flops(nums, qlens, ctxs) / gemm
        return {"ms": seconds * 1e3, "limit_ms": limit * 1e3, "share_of_limit": limit / seconds}

    def decode_row(seconds: float, batch: int, context: int) -> dict:
        limit = decode_bytes(nums, batch, context) / copy
        return {"ms": seconds * 1e3, "limit_ms": limit * 1e3, "share_of_limit": limit / seconds}

    k = report["kestrel"] = {}
    if "kestrel" not in args.skip:
        t0 = time.perf_counter()
        core = make_core(ckpt, dtype="bfloat16", device="cuda", max_model_len=16384,
                         max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                         enable_prefix_caching=True, gpu_memory_utilization=0.9)
        k["load_s"] = time.perf_counter() - t0
        k["num_kv_blocks"] = core.blocks.num_blocks
        k["activation_peak_gib"] = (core.runner.activation_peak_bytes or 0) / 2**30
        print(f"Kestrel loaded in {k['load_s']:.1f} s, {k['num_kv_blocks']} KV blocks, activation peak "
              f"{k['activation_peak_gib']:.2f} GiB", flush=True)
        if core.runner.graphs is not None:  # no local reference: it would keep the core's memory after shutdown
            g = core.runner.graphs
            k["cuda_graphs"] = {"sizes": g.sizes, "capture_s": g.capture_seconds, "pool_mib": g.pool_bytes / 2**20}
            print(f"decode CUDA graphs: {len(g.sizes)} batch sizes up to {g.max_size}, captured in "
                  f"{g.capture_seconds:.2f} s, pool {g.pool_bytes / 2**20:.0f} MiB", flush=True)
            del g
        save()
        try:
            import os

            for backend in ("triton", "sdpa"):
                os.environ["KESTREL_PREFILL_ATTENTION"] = "auto" if backend == "triton" else "sdpa"
                ttft = kestrel_ttft(core, rng, vocab, args.ttft, args.repeats)
                k[f"ttft_{backend}"] = {n: prefill_row(s, [int(n)], [int(n)]) for n, s in ttft.items()}
                save()
                print(f"Kestrel ({backend}) TTFT: " + ", ".join(
                    f"{n} {r['ms']:.1f} ms ({100 * r['share_of_limit']:.0f}%)" for n, r in k[f"ttft_{backend}"].items()),
                    flush=True)
            os.environ["KESTREL_PREFILL_ATTENTION"] = "auto"
            s = kestrel_prefix_hit(core, rng, vocab, 8192, 4096, args.repeats)
            k["ttft_8192_with_4096_cached"] = prefill_row(s, [4096], [8192])
            s = kestrel_ttft(core, rng, vocab, [8192], args.repeats, chunk=2048)["8192"]
            k["ttft_8192_chunked_2048"] = prefill_row(s, [8192], [8192])
            if "8192" in k["ttft_triton"]:
                k["ttft_8192_chunked_2048"]["vs_cold"] = s * 1e3 / k["ttft_triton"]["8192"]["ms"]
            s = kestrel_batch_prefill(core, rng, vocab, 64, 512, args.repeats)
            k["prefill_64x512"] = prefill_row(s, [512] * 64, [512] * 64)
            save()
            if "ablation" not in args.skip:
                k["prefill_ablation"] = prefill_ablation(core, rng, vocab, args.repeats, prefill_row)
                save()
                print("Kestrel prefill with one optimisation off: " + ", ".join(
                    f"{name} {r['ms']:.1f} ms ({100 * r['share_of_limit']:.1f}%)"
                    for name, r in k["prefill_ablation"].items()), flush=True)
            print(f"Kestrel: 8192 with 4096 cached {k['ttft_8192_with_4096_cached']['ms']:.1f} ms, chunked "
                  f"{k['ttft_8192_chunked_2048']['ms']:.1f} ms, 64x512 {k['prefill_64x512']['ms']:.1f} ms", flush=True)
            k["tpot"] = {}
            for b in args.batch:
                s = kestrel_tpot(core, rng, vocab, b, 512, args.tpot_steps)
                k["tpot"][str(b)] = decode_row(s, b, 512 + args.tpot_steps // 2)
                save()
                print(f"Kestrel TPOT batch {b}: {s * 1e3:.2f} ms", flush=True)
            k["decode_breakdown"] = {}
            for b in args.batch:
                d = k["decode_breakdown"][str(b)] = decode_breakdown(core, rng, b)
                d["eager"] = decode_row(d["eager_step_ms"] / 1e3, b, 512 + 8)
                save()
                print(f"decode batch {b}: step {d['step_ms']:.2f} ms, graph replay on the GPU "
                      f"{d.get('replay_gpu_ms', float('nan')):.2f} ms, host {d.get('host_ms', float('nan')):.2f} ms; "
                      f"eager step {d['eager_step_ms']:.2f} ms", flush=True)
                prof = d.get("replay_profile", {})
                if "span_us" in prof:
                    print(f"  replay b{b}: {prof['span_us']:.0f} us first to last kernel, {prof['kernels_per_replay']:.0f} "
                          f"kernels, gaps {prof['gaps_us']:.0f} us; " + ", ".join(
                              f"{g} {us:.0f}" for g, us in prof["by_group_us"].items()), flush=True)
            if "variants" not in args.skip:
                from engine.bench.decode import decode_variants

                k["decode_variants"] = decode_variants(core, rng, args.batch)
                save()
                for name, res in k["decode_variants"].items():
                    print(f"decode variant {name}: " + ", ".join(
                        f"b{b} TPOT {r['tpot_ms']:.2f} ms (replay {r['replay_gpu_ms']:.2f})" for b, r in res.items()),
                        flush=True)
            if "profile" not in args.skip:
                k["profile"] = profile_cases(core, rng, vocab, trace_dir=args.trace_dir)
                k["linear_rates_8192"] = linear_rates(cfg)
                save()
                print("linear layers at 8192 rows: " + ", ".join(
                    f"{n} {r['tflops']:.0f}" for n, r in k["linear_rates_8192"].items()) + " TFLOP/s", flush=True)
            if args.throughput_requests:
                k["throughput"] = kestrel_throughput(core, rng, vocab, args.throughput_requests, 512, 256)
                save()
                print_throughput("Kestrel throughput", k["throughput"])
            if "sync" not in args.skip and core.async_scheduling:
                # the same measurements with the synchronous step loop: what launching ahead is worth
                core.async_scheduling = False
                try:
                    k["sync_loop"] = {"tpot": {}}
                    for b in args.batch:
                        s = kestrel_tpot(core, rng, vocab, b, 512, args.tpot_steps)
                        k["sync_loop"]["tpot"][str(b)] = decode_row(s, b, 512 + args.tpot_steps // 2)
                        save()
                        print(f"Kestrel TPOT batch {b}, synchronous loop: {s * 1e3:.2f} ms", flush=True)
                    if args.throughput_requests:
                        k["sync_loop"]["throughput"] = kestrel_throughput(core, rng, vocab, args.throughput_requests,
                                                                          512, 256)
                        save()
                        print_throughput("Kestrel throughput, synchronous loop", k["sync_loop"]["throughput"])
                finally:
                    core.async_scheduling = True
        finally:
            core.shutdown()
            del core
            gc.collect()
            torch.cuda.empty_cache()
        lim["after_kestrel"] = gemm_rates()  # the same GPU warm: how far the limit moved during the run
        save()
        print(f"bf16 GEMM after Kestrel's measurements: {lim['after_kestrel']['bf16_gemm_flop_per_s'] / 1e12:.0f} "
              f"TFLOP/s (sustained {lim['after_kestrel']['bf16_gemm_sustained_flop_per_s'] / 1e12:.0f})", flush=True)

    hf = report["hf"] = {}
    if "hf" not in args.skip:
        model = hf_model(cfg)
        for n in args.ttft:
            hf.setdefault("ttft", {})[str(n)] = prefill_row(hf_prefill(model, rng, vocab, 1, n, args.repeats), [n], [n])
            save()
        hf["prefill_64x512"] = prefill_row(hf_prefill(model, rng, vocab, 64, 512, args.repeats), [512] * 64,
                                           [512] * 64)
        save()
        for b in args.batch:
            hf.setdefault("tpot", {})[str(b)] = decode_row(hf_tpot(model, rng, vocab, b, 512, args.tpot_steps), b,
                                                           512 + args.tpot_steps // 2)
            save()
        print("HF done", flush=True)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    best = best_gemm_shares(report)
    save()
    print_table(report)
    if best:
        k = report["kestrel"]
        print(f"against the fastest GEMM of the run ({best / 1e12:.0f} TFLOP/s): " + ", ".join(
            f"{name} {100 * r['share_of_best_gemm']:.1f}%" for name, r in (
                *((f"TTFT {n}", r) for n, r in k.get("ttft_triton", {}).items()),
                ("cached", k.get("ttft_8192_with_4096_cached")), ("chunked", k.get("ttft_8192_chunked_2048")),
                ("64x512", k.get("prefill_64x512"))) if r), flush=True)
    return report


def print_throughput(title: str, t: dict) -> None:
    print(f"{title}: {t['output_tok_s']:.0f} output tok/s; " + ", ".join(
        f"{name} steps {v['steps']} x {v['mean_ms']:.1f} ms (decode batch {v['mean_decode_batch']:.0f})"
        for name, v in t["by_step_kind"].items()) + f"; mixed steps min / median / max {t['mixed_ms_min_median_max']} "
        f"ms; allocator {t['allocator']}", flush=True)
    compiles = t.get("triton_compiles", [])
    if compiles:
        print(f"  Triton kernels built during the run: {len(compiles)}, {sum(c['seconds'] for c in compiles):.2f} s: "
              + ", ".join(f"{c['kernel']} at {c['at_s']:.1f} s ({c['seconds']:.2f} s)" for c in compiles[:8]),
              flush=True)


def best_gemm_shares(report: dict) -> float | None:
    """The fastest bf16 GEMM seen anywhere in the run (the burst probes before and after Kestrel, and the model's
    own linear shapes at 8,192 rows, which can outrun the 8,192^3 probe), and every prefill row's share against it
    (``share_of_best_gemm``) beside the share against the burst probe: the stricter reading of the limit."""
    lim = report.get("limits", {})
    k, hf = report.get("kestrel", {}), report.get("hf", {})
    burst = lim.get("bf16_gemm_flop_per_s")
    if not burst:
        return None
    rates = [burst, lim.get("after_kestrel", {}).get("bf16_gemm_flop_per_s", 0)]
    rates += [r["tflops"] * 1e12 for r in k.get("linear_rates_8192", {}).values()]
    best = lim["best_gemm_flop_per_s"] = max(rates)
    rows = [r for key in ("ttft_triton", "ttft_sdpa", "prefill_ablation") for r in k.get(key, {}).values()]
    rows += [k[key] for key in ("ttft_8192_with_4096_cached", "ttft_8192_chunked_2048", "prefill_64x512") if key in k]
    rows += list(hf.get("ttft", {}).values()) + ([hf["prefill_64x512"]] if "prefill_64x512" in hf else [])
    for r in rows:
        r["share_of_best_gemm"] = r["limit_ms"] * burst / best / r["ms"]
    return best


def print_table(report: dict) -> None:
    k, hf = report.get("kestrel", {}), report.get("hf", {})

    def cell(row) -> str:
        if not row:
            return "-"
        return f"{row['ms']:9.2f} ms {100 * row['share_of_limit']:4.0f}%"

    rows = []
    for n in report["args"]["ttft"]:
        n = str(n)
        rows.append((f"TTFT {n}", k.get("ttft_triton", {}).get(n), k.get("ttft_sdpa", {}).get(n),
                     hf.get("ttft", {}).get(n)))
    rows.append(("TTFT 8192, 4096 cached", k.get("ttft_8192_with_4096_cached"), None, None))
    rows.append(("TTFT 8192, chunks of 2048", k.get("ttft_8192_chunked_2048"), None, None))
    rows.append(("64 x 512 prefill", k.get("prefill_64x512"), None, hf.get("prefill_64x512")))
    for name, r in k.get("prefill_ablation", {}).items():
        rows.append((f"  {name}", r, None, None))
    for b in report["args"]["batch"]:
        rows.append((f"TPOT batch {b}", k.get("tpot", {}).get(str(b)), None, hf.get("tpot", {}).get(str(b))))
    for b, d in k.get("decode_breakdown", {}).items():
        rows.append((f"TPOT batch {b}, eager", d.get("eager"), None, None))
    print(f"{'':34s} {'Kestrel (Triton)':>20s} {'Kestrel (SDPA)':>20s} {'HF transformers':>20s}   (share of limit)")
    for name, a, b, c in rows:
        print(f"{name:34s} {cell(a):>20s} {cell(b):>20s} {cell(c):>20s}")
    if k.get("throughput"):
        t = k["throughput"]
        print(f"throughput 1024 x (512 in, 256 out): {t['output_tok_s']:.0f} output tok/s in {t['seconds']:.1f} s")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="bench_gpu.json", help="the JSON report")
    p.add_argument("--ttft", nargs="+", type=int, default=[1024, 4096, 8192])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tpot-steps", type=int, default=32)
    p.add_argument("--throughput-requests", type=int, default=1024, help="0 skips the throughput run")
    p.add_argument("--max-num-batched-tokens", type=int, default=32768)
    p.add_argument("--max-num-seqs", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["kernels", "skinny", "attention", "kestrel", "hf", "profile", "variants", "ablation",
                            "sync"])
    p.add_argument("--trace-dir", default=None, help="write a Chrome trace of each profiled case there")


def main(args) -> int:
    if not torch.cuda.is_available():
        print("kestrel bench gpu needs a CUDA GPU", file=sys.stderr)
        return 2
    run(args)
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(parser)
    raise SystemExit(main(parser.parse_args()))
