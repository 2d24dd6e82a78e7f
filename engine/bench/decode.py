"""Decode-side measurements for `kestrel bench gpu` (engine/bench/gpu.py): the skinny linear kernels against cuBLAS
on the model's own shapes, and where a decode step's time goes (the graph replay on the GPU against the whole step,
so the host's share shows as the difference; the same step eager)."""

from __future__ import annotations

import statistics

import torch

from engine.bench.timing import cuda_time, decode_step_times


def _graph_time(fns, calls: int = 24) -> float:
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


def _rate(gbytes: float, weights: list, call) -> float:
    """GB/s of call(w) over the weights, graph-timed."""
    return gbytes / _graph_time([lambda w=w: call(w) for w in weights])


def linear_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer of the shape at TP=1, and the LM head."""
    hd = cfg.head_dim
    return {"qkv": ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd, cfg.hidden_size),
            "o": (cfg.hidden_size, cfg.num_attention_heads * hd), "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
            "down": (cfg.hidden_size, cfg.intermediate_size), "lm_head": (cfg.vocab_size, cfg.hidden_size)}


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
    (its bucket, the inputs of the last step), the host's share (their difference: the step does not overlap them
    yet), and the same step eager (graphs set aside)."""
    runner = core.runner
    out: dict = {}
    step = statistics.median(decode_step_times(core, batch, prompt, steps, rng).step_seconds)
    out["step_ms"] = step * 1e3
    graphs = runner.graphs
    bucket = graphs.bucket(batch) if graphs is not None else None
    if bucket is not None and bucket in graphs.graphs:
        gpu = cuda_time(graphs.graphs[bucket].replay, 20, warmups=2)
        out.update(bucket=bucket, replay_gpu_ms=gpu * 1e3, host_ms=(step - gpu) * 1e3)
    runner.graphs = None
    try:
        eager = statistics.median(decode_step_times(core, batch, prompt, steps, rng).step_seconds)
    finally:
        runner.graphs = graphs
    out["eager_step_ms"] = eager * 1e3
    return out
