"""Decode-side measurements of the developer's GPU run (benchmarks/gpu_lab.py, on top of `kestrel bench gpu`): the
skinny linear kernels against cuBLAS on the model's own shapes, where a decode step's time goes (the graph replay on
the GPU against the whole step, so the host's share shows as the difference; the same step eager) and the paged
decode attention kernel alone.

The decode variants this module captured graphs under (cuBLAS for one-row linears, plain launches, PDL for the GEMV
only, 0 / 1 early GEMV tiles, the fused SiLU) and the decode kernel's 1 / 4 tokens per lane group were deleted with
their switches in issue 46, having lost their measurements (docs/benchmarks/gpu_decode_2026-12-04.md,
gpu_decode_2026-12-05.md, gpu_decode_2026-12-06.md: "decode_variants", "graphs_by_tokens_per_step")."""

from __future__ import annotations

import functools
import statistics

import torch

from engine.bench.timing import cuda_time, decode_step_times, graph_time, linear_shapes


def _rate(gbytes: float, weights: list, call) -> float:
    """GB/s of call(w) over the weights, graph-timed."""
    return gbytes / graph_time([lambda w=w: call(w) for w in weights])


def skinny_candidates() -> list:
    from engine.ops.skinny_gemm import SkinnyConfig

    return [SkinnyConfig(n, k, w, s) for n, k, w, s in
            ((8, 512, 4, 3), (4, 1024, 4, 3), (16, 256, 4, 3), (8, 256, 4, 4), (16, 512, 8, 3), (4, 512, 4, 4))]


def measure_skinny(cfg, rows_list=(1, 8, 16), dtype=torch.bfloat16) -> dict:
    """GB/s of weight streamed by cuBLAS and, at one row, by the GEMV kernel (the default configuration and each
    candidate) on every linear shape of the model, at each row count; which is fastest."""
    from engine.ops import skinny_gemm

    out: dict = {}
    for name, (N, K) in linear_shapes(cfg).items():
        copies = max(1, min(8, -(-(256 << 20) // (N * K * 2))))  # >= 256 MiB of weights: past the L2 cache
        ws = [torch.randn(N, K, dtype=dtype, device="cuda") * 0.02 for _ in range(copies)]
        for rows in rows_list:
            x = torch.randn(rows, K, dtype=dtype, device="cuda")
            y = torch.empty(rows, N, dtype=dtype, device="cuda")
            gbytes = (N * K + rows * (K + N)) * 2 / 1e9

            res = {"cublas": _rate(gbytes, ws, lambda w, x=x, y=y: torch.mm(x, w.t(), out=y))}
            if rows == 1:
                res["default"] = _rate(gbytes, ws, lambda w, x=x, y=y: skinny_gemm.skinny_linear(x, w, out=y))
            for c in skinny_candidates() if rows == 1 else []:
                key = f"n{c.block_n}_k{c.block_k}_w{c.num_warps}_s{c.num_stages}"
                try:
                    res[key] = _rate(gbytes, ws,
                                     lambda w, c=c, x=x, y=y: skinny_gemm.skinny_linear(x, w, out=y, config=c))
                except Exception as e:  # noqa: BLE001 - a configuration that does not compile or fit: say so
                    res[key] = f"failed: {type(e).__name__}: {str(e)[:120]}"
            numeric = {k: v for k, v in res.items() if isinstance(v, float)}
            res["best"] = max(numeric, key=numeric.get)
            out[f"{name}_{N}x{K}_m{rows}"] = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items()}
    torch.cuda.empty_cache()
    return out


def decode_breakdown(core, rng, batch: int, prompt: int = 512, steps: int = 16) -> dict:
    """One batch's decode step: the whole step (median, graphs as configured), the graph replay alone on the GPU
    (its bucket, the inputs of the last step) and its kernels by group (profile_replay), the host's share (their
    difference: the sampler's kernels and, with async scheduling, the host work the step launched ahead does not
    hide), and the same step eager (graphs set aside)."""
    runner = core.runner
    out: dict = {}
    step = statistics.median(decode_step_times(core, batch, prompt, steps, rng).step_seconds)
    out["step_ms"] = step * 1e3
    graphs = runner.graphs
    bucket = graphs.bucket(batch) if graphs is not None else None
    if bucket is not None and bucket in graphs.graphs:
        gpu = cuda_time(graphs.graphs[bucket].replay, 20, warmups=2)
        out.update(bucket=bucket, replay_gpu_ms=gpu * 1e3, host_ms=(step - gpu) * 1e3)
        out["replay_profile"] = profile_replay(graphs.graphs[bucket])
    runner.graphs = None
    try:
        eager = statistics.median(decode_step_times(core, batch, prompt, steps, rng).step_seconds)
    finally:
        runner.graphs = graphs
    out["eager_step_ms"] = eager * 1e3
    return out


KERNEL_GROUPS = (  # (group, substrings of the kernel names it takes), first match wins
    ("gemv (Triton)", ("gemv_kernel",)),
    ("GEMM (cuBLAS)", ("nvjet", "gemm", "cutlass", "xmma", "gemv")),
    ("decode attention", ("paged_decode", "decode_attention", "merge")),
    ("rope + cache write", ("rotary", "cache")),
    ("norm", ("rms_norm",)),
    ("silu_and_mul", ("silu",)),
)


def kernel_group(name: str) -> str:
    low = name.lower()
    for group, keys in KERNEL_GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def profile_replay(graph, replays: int = 5) -> dict:
    """Where a graph replay's GPU time goes (torch.profiler; the kernels of a replay are reported one by one): per
    replay, the time from its first kernel's start to its last kernel's end, the kernels' summed time by group and
    by name (top 12), their count, and the gaps between consecutive kernels (launch latency and the ramps that a
    graph of small dependent kernels pays at every edge)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
            torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if getattr(e, "device_type", None) == DeviceType.CUDA)
    if not kernels:
        return {"error": "the profiler saw no kernels of the replays"}
    # replays are separated by a host synchronisation: split at gaps much longer than any inside a replay
    runs, cur = [], [kernels[0]]
    for k in kernels[1:]:
        if k[0] - cur[-1][1] > 200:  # microseconds
            runs.append(cur)
            cur = []
        cur.append(k)
    runs.append(cur)
    n = len(runs)
    span = sum(r[-1][1] - r[0][0] for r in runs) / n
    busy = sum(e - s for s, e, _ in kernels) / n
    by_group: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for s, e, name in kernels:
        by_group[kernel_group(name)] = by_group.get(kernel_group(name), 0.0) + (e - s) / n
        by_name[name[:80]] = by_name.get(name[:80], 0.0) + (e - s) / n
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {"replays": n, "span_us": round(span, 1), "kernels_us": round(busy, 1),
            "gaps_us": round(span - busy, 1), "kernels_per_replay": round(len(kernels) / n, 1),
            "by_group_us": {k: round(v, 1) for k, v in sorted(by_group.items(), key=lambda kv: -kv[1])},
            "top_kernels_us": {k: round(v, 1) for k, v in top}}


def measure_decode_attention(cfg, batches=(1, 64, 256), contexts=(512, 4096, 16384), block_size: int = 64,
                             width_tokens: int = 16384, dtype=torch.bfloat16) -> dict:
    """GB/s of the paged decode attention kernel (keys and values read once) at each batch and context, as the
    decode graphs call it (a table ``width_tokens`` wide, the graphs' partitions) and as an eager step calls it
    (partitions sized to the step): graph-timed over disjoint copies of the caches (>= 256 MiB in all, past the
    L2 cache), scrambled block tables."""
    from engine import ops
    from engine.runner.cuda_graphs import partition_tokens

    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out: dict = {}
    for b in batches:
        for ctx in contexts:
            blocks = b * -(-ctx // block_size)
            nbytes = 2 * b * ctx * nkv * hd * 2
            copies = max(1, min(16, -(-(256 << 20) // nbytes)))
            kc = torch.randn(copies * blocks, block_size, nkv, hd, dtype=dtype, device="cuda")
            vc = torch.randn_like(kc)
            width = -(-width_tokens // block_size)
            tables = []
            for c in range(copies):
                perm = torch.randperm(blocks, device="cuda", dtype=torch.int32) + c * blocks
                t = torch.zeros(b, width, dtype=torch.int32, device="cuda")
                t[:, :blocks // b] = perm.view(b, -1)
                tables.append(t)
            lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
            q = torch.randn(b, nh, hd, dtype=dtype, device="cuda")
            o = torch.empty_like(q)
            res = {}
            graphs_part = partition_tokens(b, nkv, sms)
            for mode, part, tabs in (("graphs", graphs_part, tables),
                                     ("eager", 0, [t[:, :blocks // b].contiguous() for t in tables])):
                sec = graph_time([functools.partial(ops.paged_decode_attention, q, kc, vc, t, lens, hd ** -0.5,
                                                     out=o, part_tokens=part) for t in tabs])
                res[mode] = {"us": round(sec * 1e6, 2), "gb_s": round(nbytes / sec / 1e9, 1)}
            # the graphs' partitions per context against other counts (partition_tokens' choice is the -splits)
            res["graphs_by_splits"] = {}
            for splits in (1, 2, 4, 8, 16, 32):
                sec = graph_time([functools.partial(ops.paged_decode_attention, q, kc, vc, t, lens, hd ** -0.5,
                                                     out=o, part_tokens=-splits) for t in tables])
                res["graphs_by_splits"][splits] = {"us": round(sec * 1e6, 2), "gb_s": round(nbytes / sec / 1e9, 1)}
            out[f"b{b}_ctx{ctx}"] = {"bytes": nbytes, "graphs_splits": -graphs_part, **res}
            del kc, vc, tables
            torch.cuda.empty_cache()
    return out
