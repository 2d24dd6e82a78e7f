"""Tensor-parallel benchmark: one command, one JSON report.

GPU (the x2 machine; the default when CUDA is there):

    python -m engine.bench.tp --out tp_report.json

For each interconnect mode - NVLink (default) and PCIe (NCCL_P2P_DISABLE=1: the GPUs talk through host
memory, like AD102 cards without peer access; the engine's own strategies never use peer access) - in a
fresh process each: the Llama-3-8B shape in bf16 with random weights (no download; every rank generates
only its own slices), TP=1 as the baseline and TP=2 with every strategy (nccl, host, int8, auto, overlap;
one TP=2 engine, the strategy switched on every rank between measurements):
  - TTFT of 1024 / 4096 / 8192-token prompts (one request, one prefill step, median of --repeats);
  - TPOT at batch 1, 16 and 64 (128-token prompts, median decode step);
  - the all-reduce latency table by message size of nccl / host / int8 on the live group, and auto's own
    start-up table (what it chose per size).
The report ends with the issue's targets in PCIe mode (auto 4096-TTFT vs nccl and vs TP=1, batch-1 TPOT
TP=2 vs TP=1).

CPU (``--device cpu``, the dev box): the all-reduce latency table of host / int8 against gloo at TP=2 (bf16
and fp32), the step channel's cost, and decode tokens/s TP=1 vs TP=2 on a random model whose heads split in
two, and TP=1 vs TP=3 on the embedded SmolLM2-135M (9 heads).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

from engine.bench.report import resolved_config
from engine.bench.timing import decode_step_times, ttft_runs
from engine.loader.weights import WeightSource

# ---------------------------------------------------------------------------------------------------
# random-weight checkpoints (also loaded by the TP workers through Checkpoint.tp_factory)

SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0),
    # a CPU model whose heads split in two (SmolLM2's 9 do not): ~0.2 B parameters
    "cpu-small": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64, rope_theta=10000.0),
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=10000.0),
}


class RandomWeights(WeightSource):
    """Deterministic random bf16 tensors made of tiles cut from one random pool (memcpy speed: 16 GB of
    Llama-3-8B weights in seconds, not minutes); a slice is built from the tiles it covers only, so a
    tensor-parallel rank makes only its own shard and all ranks agree on every value."""

    TR, TC = 256, 1024

    def __init__(self, config, seed: int = 0, std: float = 0.02):
        from engine.loader.weights import expected_shapes

        self.path = Path(f"random-{config.hidden_size}x{config.num_hidden_layers}")
        self._shapes = expected_shapes(config)[0]
        g = torch.Generator().manual_seed(seed)
        self._pool = (torch.randn(1 << 22, generator=g) * std).to(torch.bfloat16)
        self._seed = seed

    def names(self) -> list[str]:
        return list(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._shapes:
            raise self._missing(name)
        return self._shapes[name]

    def dtype(self, name: str) -> torch.dtype:
        return torch.bfloat16

    def get(self, name: str) -> torch.Tensor:
        return self.get_slice(name, 0, 0, self.shape(name)[0])

    def _tile(self, name: str, i: int, j: int, n: int) -> torch.Tensor:
        off = zlib.crc32(f"{self._seed}:{name}:{i}:{j}".encode()) % (self._pool.numel() - n)
        return self._pool[off:off + n]

    def get_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        shape = self._check_slice(name, dim, start, stop)
        if len(shape) == 1:
            v = self._tile(name, 0, 0, shape[0])[start:stop].clone()
            return (v.float() * 5 + 1).to(torch.bfloat16) if "norm" in name else v
        R, C = shape
        r0, r1, c0, c1 = (start, stop, 0, C) if dim % 2 == 0 else (0, R, start, stop)
        out = torch.empty(r1 - r0, c1 - c0, dtype=torch.bfloat16)
        for ti in range(r0 // self.TR, -(-r1 // self.TR)):
            for tj in range(c0 // self.TC, -(-c1 // self.TC)):
                tile = self._tile(name, ti, tj, self.TR * self.TC).view(self.TR, self.TC)
                a0, a1 = max(r0, ti * self.TR), min(r1, (ti + 1) * self.TR)
                b0, b1 = max(c0, tj * self.TC), min(c1, (tj + 1) * self.TC)
                out[a0 - r0:a1 - r0, b0 - c0:b1 - c0] = tile[a0 - ti * self.TR:a1 - ti * self.TR,
                                                             b0 - tj * self.TC:b1 - tj * self.TC]
        return out


class NullTokenizer:
    """The bench drives the engine with token ids; nothing is ever decoded."""

    eos_token_ids: list[int] = []
    bos_token_id = None
    chat_template = None

    def __init__(self, vocab: int):
        self._vocab = vocab

    def __len__(self) -> int:
        return self._vocab


class NullDetokenizer:
    def __init__(self, tokenizer, prompt_ids=(), skip_special_tokens: bool = True):
        pass

    def add(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


def random_checkpoint(shape: str = "llama3-8b", seed: int = 0, max_position: int = 16384):
    from engine.config import ModelConfig
    from engine.loader import Checkpoint

    dims = SHAPES[shape]
    cfg = ModelConfig(architecture="LlamaForCausalLM", max_position_embeddings=max_position,
                      torch_dtype="bfloat16", rms_norm_eps=1e-5, **dims)
    ckpt = Checkpoint(path=Path(f"random-{shape}"), format="random", config=cfg, hf_config={},
                      generation_config={}, weights=RandomWeights(cfg, seed), tokenizer=NullTokenizer(cfg.vocab_size))
    ckpt.tp_factory = ("engine.bench.tp:random_checkpoint", {"shape": shape, "seed": seed,
                                                             "max_position": max_position})
    return ckpt


def make_core(checkpoint, **options):
    from engine.config import EngineConfig
    from engine.core.core import EngineCore

    core = EngineCore(EngineConfig(model=str(checkpoint.path), **options), checkpoint=checkpoint)
    core._detok_cls = NullDetokenizer
    return core


# ---------------------------------------------------------------------------------------------------
# measurements on an EngineCore


def measure_ttft(core, length: int, repeats: int, seed: int = 0) -> dict:
    times = ttft_runs(core, length, repeats, random.Random(seed + length))
    return {"ms": statistics.median(times) * 1e3, "runs_ms": [round(t * 1e3, 3) for t in times]}


def measure_tpot(core, batch: int, prompt_len: int = 128, steps: int = 32, seed: int = 1) -> dict:
    d = decode_step_times(core, batch, prompt_len, steps, random.Random(seed + batch))
    out = {"ms": statistics.median(d.step_seconds) * 1e3 if d.step_seconds else None, "steps": len(d.step_seconds)}
    if d.comm_seconds:
        out["comm_ms"] = statistics.median(d.comm_seconds) * 1e3
    return out


def measure_engine(core, lengths, batches, repeats, tpot_steps: int = 32) -> dict:
    res = {"ttft": {}, "tpot": {}}
    for L in lengths:
        res["ttft"][str(L)] = measure_ttft(core, L, repeats)
        print(f"    TTFT {L:5d}: {res['ttft'][str(L)]['ms']:9.2f} ms", flush=True)
    for b in batches:
        res["tpot"][str(b)] = measure_tpot(core, b, steps=tpot_steps)
        print(f"    TPOT bs{b:<3d}: {res['tpot'][str(b)]['ms']:9.3f} ms", flush=True)
    return res


# ---------------------------------------------------------------------------------------------------
# GPU


def _gpu_mode(args) -> dict:
    """One interconnect mode (the environment was set by the parent). The partial result is written to
    args._json after every measurement, so a run cut short still reports what it measured."""
    from engine.parallel.comm.auto import GPU_SIZES

    lengths = [int(x) for x in args.ttft]
    batches = [int(x) for x in args.batch]
    opts = dict(dtype="bfloat16", device="cuda", max_model_len=max(lengths) + 256,
                max_num_batched_tokens=max(max(lengths), 128 * max(batches)), kv_cache_memory_gib=args.kv_gib,
                enable_prefix_caching=False, max_num_seqs=max(256, max(batches)))
    out: dict = {"mode": args._child,
                 "env": {k: os.environ.get(k) for k in ("NCCL_P2P_DISABLE", "NCCL_NVLS_ENABLE")}}

    def save() -> None:
        if args._json:
            Path(args._json).write_text(json.dumps(out, indent=1, default=str))

    if "tp1" not in args.skip:
        print(f"[{args._child}] TP=1", flush=True)
        t0 = time.perf_counter()
        core = make_core(random_checkpoint(args.shape), tensor_parallel_size=1, **opts)
        out["tp1_load_s"] = time.perf_counter() - t0
        out["tp1_config"] = resolved_config(core)
        out["tp1"] = measure_engine(core, lengths, batches, args.repeats, args.tpot_steps)
        save()
        del core
        gc.collect()
        torch.cuda.empty_cache()
    print(f"[{args._child}] TP=2", flush=True)
    t0 = time.perf_counter()
    core = make_core(random_checkpoint(args.shape), tensor_parallel_size=2, comm_strategy="auto", **opts)
    out["tp2_load_s"] = time.perf_counter() - t0
    out["tp2_config"] = resolved_config(core)  # the kernel and comm configuration rank 0 resolved (workers get it)
    ex = core.executor
    out["tp2_startup"] = ex.startup_times
    print(f"[{args._child}] TP=2 up in {out['tp2_load_s']:.1f} s: {ex.startup_times}", flush=True)
    try:
        out["comm"] = ex.comm.describe()
        out["auto_table"] = ex.comm.table
        save()
        out["allreduce_table"] = ex.benchmark(GPU_SIZES, ["nccl", "host", "int8"], torch.bfloat16)
        out["step_channel"] = ex.ping(200)
        out["tp2"] = {}
        save()
        for s in args.strategies:
            print(f"[{args._child}] TP=2 {s}", flush=True)
            ex.set_strategy(s)
            before = {k: dict(v) for k, v in core.stats().comm_by_strategy.items()}
            out["tp2"][s] = measure_engine(core, lengths, batches, args.repeats, args.tpot_steps)
            after = core.stats().comm_by_strategy
            out["tp2"][s]["comm_by_strategy"] = {
                k: {f: v[f] - before.get(k, {}).get(f, 0) for f in v} for k, v in after.items()}
            save()
    finally:
        core.shutdown()
        save()
    return out


def _targets(modes: dict) -> dict:
    pcie = modes.get("pcie")
    if not pcie or "tp2" not in pcie:
        return {}
    t = {}
    tp2 = pcie["tp2"]
    try:
        auto4k = tp2["auto"]["ttft"]["4096"]["ms"]
        t["pcie_ttft4096_auto_vs_nccl_speedup"] = tp2["nccl"]["ttft"]["4096"]["ms"] / auto4k
        t["pcie_ttft4096_auto_over_tp1"] = auto4k / pcie["tp1"]["ttft"]["4096"]["ms"]
        t["pcie_tpot_bs1_auto_over_tp1"] = tp2["auto"]["tpot"]["1"]["ms"] / pcie["tp1"]["tpot"]["1"]["ms"]
        row = min(pcie["allreduce_table"], key=lambda r: abs(r["bytes"] - 16384))
        t["pcie_allreduce_16KiB_us"] = row["latency_us"]
        t["goals"] = {"ttft4096 auto >= 1.5x nccl": t["pcie_ttft4096_auto_vs_nccl_speedup"] >= 1.5,
                      "ttft4096 auto <= 0.7x tp1": t["pcie_ttft4096_auto_over_tp1"] <= 0.7,
                      "tpot bs1 auto <= 0.7x tp1": t["pcie_tpot_bs1_auto_over_tp1"] <= 0.7,
                      "16KiB all-reduce <= 10 us (host)": row["latency_us"].get("host", 1e9) <= 10}
    except (KeyError, TypeError, ZeroDivisionError):
        pass
    return t


def _gpu_main(args) -> dict:
    base_env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
                    PYTHONUNBUFFERED="1")
    modes = {}
    for mode in args.modes:
        env = dict(base_env)
        if mode == "pcie":
            env["NCCL_P2P_DISABLE"] = "1"
        else:
            env.pop("NCCL_P2P_DISABLE", None)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            tmp = f.name
        cmd = [sys.executable, "-m", "engine.bench.tp", "--_child", mode, "--_json", tmp, "--shape", args.shape,
               "--repeats", str(args.repeats), "--kv-gib", str(args.kv_gib), "--ttft", *map(str, args.ttft),
               "--batch", *map(str, args.batch), "--strategies", *args.strategies, "--skip", *args.skip,
               "--tpot-steps", str(args.tpot_steps)]
        print(f"== mode {mode}: {' '.join(cmd)}", flush=True)
        rc = subprocess.call(cmd, env=env)
        try:
            modes[mode] = json.loads(Path(tmp).read_text())
        except (OSError, ValueError):
            modes[mode] = {"error": f"exit code {rc}"}
        finally:
            Path(tmp).unlink(missing_ok=True)
    return {"modes": modes, "targets": _targets(modes)}


# ---------------------------------------------------------------------------------------------------
# CPU


def _cpu_main(args) -> dict:
    from engine.bench.comm_group import run_group

    sizes = [2 << 10, 8 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20]
    rep: dict = {"allreduce": {}}
    for dt in ("bfloat16", "float32"):
        print(f"all-reduce latency (p50, us; back-to-back calls), TP=2, {dt}", flush=True)
        rows = run_group(2, "engine.bench.comm_group:latency_table", {"sizes": sizes, "dtype": dt})[0]
        rep["allreduce"][dt] = rows
        for r in rows:
            print(f"  {r['bytes']:>9d} B  " + "  ".join(f"{k} {r[k]['p50']:9.1f}" for k in ("gloo", "host", "int8"))
                  + f"   gloo/host {r['gloo']['p50'] / r['host']['p50']:5.1f}x", flush=True)
    rep["barrier"] = run_group(2, "engine.bench.comm_group:ping", {})[0]
    from engine.sampling_params import SamplingParams

    def decode_rate(core, n=48) -> dict:
        r = [measure_tpot(core, 1, prompt_len=64, steps=n, seed=s) for s in range(3)]
        ms = statistics.median(x["ms"] for x in r)
        return {"tpot_ms": ms, "tok_s": 1e3 / ms, "runs_tpot_ms": [round(x["ms"], 3) for x in r]}

    rep["decode"] = {}
    opts = dict(dtype=args.cpu_dtype, device="cpu", max_model_len=1024, enable_prefix_caching=False)
    for tp in (1, 2):
        core = make_core(random_checkpoint(args.cpu_shape, max_position=1024), tensor_parallel_size=tp,
                         comm_strategy=args.cpu_strategy, **opts)
        try:
            rep["decode"][f"{args.cpu_shape}_tp{tp}"] = res = decode_rate(core)
            res["config"] = resolved_config(core)
            if tp > 1:
                res["step_channel"] = core.executor.ping(200)
                res["comm_by_strategy"] = core.stats().comm_by_strategy
            print(f"decode {args.cpu_shape} {args.cpu_dtype} TP={tp}: {res['tok_s']:.1f} tok/s", flush=True)
        finally:
            core.shutdown()
    from engine.llm import LLM

    for tp in (1, 3):
        llm = LLM(dtype=args.cpu_dtype, tensor_parallel_size=tp, comm_strategy=args.cpu_strategy,
                  max_model_len=1024, enable_prefix_caching=False)
        try:
            rep["decode"][f"smollm2_tp{tp}"] = res = decode_rate(llm.core)
            res["config"] = resolved_config(llm.core)
            print(f"decode SmolLM2-135M {args.cpu_dtype} TP={tp}: {res['tok_s']:.1f} tok/s", flush=True)
        finally:
            llm.core.shutdown()
    del SamplingParams
    return rep


# ---------------------------------------------------------------------------------------------------


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--out", default="tp_report.json", help="the JSON report")
    p.add_argument("--modes", nargs="+", default=["nvlink", "pcie"], choices=["nvlink", "pcie"])
    p.add_argument("--strategies", nargs="+", default=["nccl", "host", "int8", "auto", "overlap"])
    p.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    p.add_argument("--ttft", nargs="+", type=int, default=[1024, 4096, 8192])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 16, 64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tpot-steps", type=int, default=32, help="decode steps timed per TPOT figure")
    p.add_argument("--kv-gib", type=float, default=8.0)
    p.add_argument("--skip", nargs="*", default=[], help="parts to skip (tp1)")
    p.add_argument("--cpu-shape", default="cpu-small", choices=sorted(SHAPES))
    p.add_argument("--cpu-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--cpu-strategy", default="host")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_json", default=None, help=argparse.SUPPRESS)


def main(args) -> int:
    from engine.bench.report import environment

    if args._child:
        _gpu_mode(args)
        return 0
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "cpu"
    t0 = time.time()
    report = {"benchmark": "tensor parallelism", "device": device, "environment": environment(),
              "args": {k: v for k, v in vars(args).items() if not k.startswith("_")}}
    report.update(_gpu_main(args) if device == "cuda" else _cpu_main(args))
    report["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"report: {args.out}")
    if report.get("targets"):
        print(json.dumps(report["targets"], indent=1))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(parser)
    raise SystemExit(main(parser.parse_args()))
