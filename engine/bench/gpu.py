"""`kestrel bench gpu`: Kestrel against HF transformers on one GPU, and both against the GPU's limits.

One command, one JSON report (written after every measurement, so a run cut short keeps what it measured) and a
printed table. The Llama-3-8B shape in bf16 with random weights (no download). In one process, one after the
other: the GPU's measured copy bandwidth and bf16 GEMM rate; Kestrel (TP=1, as configured: the report's "config"
records its resolved kernel and comm configuration); then HF transformers (eager, SDPA) on the same shape.

Figures (Kestrel; HF where it has the concept):
- TTFT of cold 1,024 / 4,096 / 8,192-token prompts;
- an 8,192-token prompt whose first 4,096 tokens are a prefix-cache hit; the 8,192-token prompt in 2,048-token
  chunks; 64 prompts of 512 tokens submitted together (one step);
- TPOT at batch 1 / 8 / 64 after 512-token prompts (median decode step);
- Kestrel's throughput on 1,024 requests of 512 prompt and 256 output tokens, all submitted at once.
Each figure as a share of its limit: prefill FLOPs (linear layers + causal attention + the LM head rows) at the
measured GEMM rate; decode bytes (weights + the KV cache read) at the measured copy bandwidth.

The developer's variant sweeps (kernel candidates, SDPA against the Triton kernel, ablations, decode breakdowns,
profiles) run on top of this one from the repository: ``python -m benchmarks.gpu_lab`` (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.bench.timing import cuda_time, decode_step_times, random_ids, timed_prompts, triton_compiles, ttft_runs

SHAPE = "llama3-8b"
DEVICE = "cuda"


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


class Stages:
    """Hooks for more measurements inside the run, each given what it needs and the report's ``save``; the user
    command runs none of them. The developer's GPU run (benchmarks/gpu_lab.py: kernel candidates, SDPA prefill,
    ablations, decode breakdowns, profiles, the synchronous loop) fills them in."""

    def before_engine(self, report: dict, cfg, save) -> None:
        """After the limits, before the engine loads: kernels alone on the shape ``cfg`` (the model's config)."""

    def prefill(self, core, rng, vocab: int, k: dict, prefill_row, save) -> None:
        """After the engine's prefill figures (``k`` is the report's "kestrel" section)."""

    def decode(self, core, rng, vocab: int, k: dict, decode_row, save) -> None:
        """After the engine's TPOT figures."""

    def after_throughput(self, core, rng, vocab: int, k: dict, decode_row, save) -> None:
        """After the throughput run, before the engine shuts down."""


def run(args, stages: Stages | None = None) -> dict:
    """The engine as configured (its kernel and comm configuration recorded in the report) against the GPU's
    measured limits and against HF transformers on the same shape."""
    from engine.bench.report import environment, resolved_config
    from engine.bench.tp import make_core, random_checkpoint

    stages = stages or Stages()
    report: dict = {"benchmark": "gpu", "command": " ".join(sys.argv), "environment": environment(),
                    "args": {k: v for k, v in vars(args).items() if not callable(v)}}
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
    rng = random.Random(args.seed)
    ckpt = random_checkpoint(SHAPE, seed=args.seed, max_position=16384)
    cfg = ckpt.config
    stages.before_engine(report, cfg, save)
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
        report["config"] = resolved_config(core)
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
            ttft = kestrel_ttft(core, rng, vocab, args.ttft, args.repeats)
            k["ttft"] = {n: prefill_row(s, [int(n)], [int(n)]) for n, s in ttft.items()}
            save()
            print("Kestrel TTFT: " + ", ".join(f"{n} {r['ms']:.1f} ms ({100 * r['share_of_limit']:.0f}%)"
                                               for n, r in k["ttft"].items()), flush=True)
            s = kestrel_prefix_hit(core, rng, vocab, 8192, 4096, args.repeats)
            k["ttft_8192_with_4096_cached"] = prefill_row(s, [4096], [8192])
            s = kestrel_ttft(core, rng, vocab, [8192], args.repeats, chunk=2048)["8192"]
            k["ttft_8192_chunked_2048"] = prefill_row(s, [8192], [8192])
            if "8192" in k["ttft"]:
                k["ttft_8192_chunked_2048"]["vs_cold"] = s * 1e3 / k["ttft"]["8192"]["ms"]
            s = kestrel_batch_prefill(core, rng, vocab, 64, 512, args.repeats)
            k["prefill_64x512"] = prefill_row(s, [512] * 64, [512] * 64)
            save()
            print(f"Kestrel: 8192 with 4096 cached {k['ttft_8192_with_4096_cached']['ms']:.1f} ms, chunked "
                  f"{k['ttft_8192_chunked_2048']['ms']:.1f} ms, 64x512 {k['prefill_64x512']['ms']:.1f} ms", flush=True)
            stages.prefill(core, rng, vocab, k, prefill_row, save)
            k["tpot"] = {}
            for b in args.batch:
                s = kestrel_tpot(core, rng, vocab, b, 512, args.tpot_steps)
                k["tpot"][str(b)] = decode_row(s, b, 512 + args.tpot_steps // 2)
                save()
                print(f"Kestrel TPOT batch {b}: {s * 1e3:.2f} ms", flush=True)
            stages.decode(core, rng, vocab, k, decode_row, save)
            if args.throughput_requests:
                k["throughput"] = kestrel_throughput(core, rng, vocab, args.throughput_requests, 512, 256)
                save()
                print_throughput("Kestrel throughput", k["throughput"])
            stages.after_throughput(core, rng, vocab, k, decode_row, save)
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
                *((f"TTFT {n}", r) for n, r in _ttft(k).items()),
                ("cached", k.get("ttft_8192_with_4096_cached")), ("chunked", k.get("ttft_8192_chunked_2048")),
                ("64x512", k.get("prefill_64x512"))) if r), flush=True)
    return report


def _ttft(k: dict) -> dict:
    """The engine's TTFT rows as configured ("ttft_triton" in reports before issue 46)."""
    return k.get("ttft") or k.get("ttft_triton") or {}


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
    rows = [r for key in ("ttft", "ttft_triton", "ttft_sdpa", "prefill_ablation") for r in k.get(key, {}).values()]
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
        rows.append((f"TTFT {n}", _ttft(k).get(n), k.get("ttft_sdpa", {}).get(n), hf.get("ttft", {}).get(n)))
    rows.append(("TTFT 8192, 4096 cached", k.get("ttft_8192_with_4096_cached"), None, None))
    rows.append(("TTFT 8192, chunks of 2048", k.get("ttft_8192_chunked_2048"), None, None))
    rows.append(("64 x 512 prefill", k.get("prefill_64x512"), None, hf.get("prefill_64x512")))
    for name, r in k.get("prefill_ablation", {}).items():
        rows.append((f"  {name}", r, None, None))
    for b in report["args"]["batch"]:
        rows.append((f"TPOT batch {b}", k.get("tpot", {}).get(str(b)), None, hf.get("tpot", {}).get(str(b))))
    for b, d in k.get("decode_breakdown", {}).items():
        rows.append((f"TPOT batch {b}, eager", d.get("eager"), None, None))
    print(f"{'':34s} {'Kestrel':>20s} {'Kestrel (SDPA)':>20s} {'HF transformers':>20s}   (share of limit)")
    for name, a, b, c in rows:
        print(f"{name:34s} {cell(a):>20s} {cell(b):>20s} {cell(c):>20s}")
    if k.get("throughput"):
        t = k["throughput"]
        print(f"throughput 1024 x (512 in, 256 out): {t['output_tok_s']:.0f} output tok/s in {t['seconds']:.1f} s")


def add_args(p: argparse.ArgumentParser, skips: tuple[str, ...] = ()) -> None:
    """The command's options; ``skips``: more parts --skip may name (benchmarks/gpu_lab.py's)."""
    p.add_argument("--out", default="bench_gpu.json", help="the JSON report")
    p.add_argument("--ttft", nargs="+", type=int, default=[1024, 4096, 8192])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tpot-steps", type=int, default=32)
    p.add_argument("--throughput-requests", type=int, default=1024, help="0 skips the throughput run")
    p.add_argument("--max-num-batched-tokens", type=int, default=32768)
    p.add_argument("--max-num-seqs", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", default=[], choices=["kestrel", "hf", *skips])


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
