"""`kestrel bench quant`: GPU quantization against bf16 in one run (Llama-3-8B shape, random weights, one GPU).

1. Kernels, on each linear shape of the model at 1 and 16 rows, graph-timed over weights past the L2 cache: bf16
   (cuBLAS, and the one-row GEMV of the decode graphs) against the engine's integer path (``{mode}_engine``: the
   tensor-core kernels of csrc/cuda/int_gemm.cu on the "mma" layout, where engine._C has them), the Triton fused
   dequantize-and-multiply kernel for fp8 weights (engine/ops/quant_linear_kernel.py), torch's built-ins where they
   run (tinygemm's ``_weight_int4pack_mm`` for int4 groups of 128, ``_scaled_mm`` for fp8 with x quantized per token),
   each as microseconds and GB/s of the bytes it must read.
2. The engine per mode (--quantization none / int8 / int4 / fp8) and KV-cache dtype (--kv-cache-dtypes auto fp8:
   each mode with each; a mode with an fp8 KV cache is reported as "<mode>+kv_fp8"): its weights' bytes, the KV
   blocks and tokens that fit (gpu_memory_utilization 0.9), TPOT at batch 1 and 16 (512-token prompts, CUDA
   graphs), TTFT of 8,192 tokens; the ratios to bf16 (quantization none, KV auto), and each step against the copy
   bandwidth's limit for its bytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import torch

MODES = ("none", "int8", "int4", "fp8")
KV_CACHE_DTYPES = ("auto", "fp8")


def _bytes(w) -> int:
    return w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes


def kernel_rates(cfg, rows=(1, 16), more=None) -> dict:
    """The kernels of each mode per linear shape and row count (the docstring's 1.). ``more(timed, forms, m, x, y,
    nbytes)``: more timings of each shape and row count (benchmarks/quant_lab.py's kernel candidates)."""
    from engine.bench.timing import graph_time, linear_shapes
    from engine.layers.linear import quantize_for_gpu
    from engine.ops import int_mma
    from engine.ops import quant_linear_triton as kern
    from engine.ops import skinny_gemm
    from engine.ops.quant_linear import quant_linear

    fp8 = torch.cuda.get_device_capability() >= (8, 9)
    out: dict = {}
    for name, (n, k) in linear_shapes(cfg).items():
        copies = max(2, min(8, -(-(512 << 20) // (n * k * 2))))  # >= 512 MiB of bf16 weights: past the L2 cache
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(copies)]
        engine_forms = {mode: [quantize_for_gpu(w, mode) for w in ws] for mode in ("int8", "int4")}
        forms = {"bf16": ws, **engine_forms}  # (the Triton integer kernels on "chunk" were deleted: issue 46)
        if fp8:
            forms["fp8"] = [quantize_for_gpu(w, "fp8") for w in ws]
        tiny = _tinygemm_forms(forms["int4"]) if forms["int4"][0] is not None else None
        for m in rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            io = m * (k + n) * 2
            res: dict = {}

            def timed(key, weights, call, nbytes):
                try:
                    t = graph_time([lambda w=w: call(w) for w in weights])
                    res[key] = {"us": round(t * 1e6, 2), "gb_s": round((nbytes + io) / t / 1e9, 1)}
                except Exception as e:  # noqa: BLE001 - a variant that does not compile or run here: say so
                    res[key] = f"failed: {type(e).__name__}: {str(e)[:160]}"

            timed("bf16_cublas", ws, lambda w: torch.mm(x, w.t(), out=y), _bytes(ws[0]))
            if m == 1:
                timed("bf16_gemv", ws, lambda w: skinny_gemm.skinny_linear(x, w, out=y), _bytes(ws[0]))
            for mode, qs in engine_forms.items():
                if qs[0] is not None and qs[0].layout == "mma":
                    timed(f"{mode}_engine", qs, lambda w: quant_linear(x, w, out=y), _bytes(qs[0]))
                    if m > 16:  # what the engine would do past SLICED_MAX_M: the whole weight, then cuBLAS
                        timed(f"{mode}_dequant_gemm", qs,
                              lambda w: torch.mm(x, int_mma.dequantize(w, x.dtype).t(), out=y), _bytes(qs[0]))
            for mode in ("fp8",):  # the Triton fused kernel: fp8 weights only now
                qs = forms.get(mode)
                if not qs or qs[0] is None:
                    continue
                timed(f"{mode}_fused", qs, lambda w: kern.fused(x, w, out=y), _bytes(qs[0]))
            if tiny is not None:
                packed, sz = tiny
                timed("int4_tinygemm", list(zip(packed, sz)),
                      lambda p: torch._weight_int4pack_mm(x, p[0], 128, p[1]), _bytes(packed[0]) + _bytes(sz[0]))
            if fp8:
                xs = x if m % 16 == 0 else torch.nn.functional.pad(x, (0, 0, 0, 16 - m % 16))
                timed("fp8_scaled_mm", forms["fp8"], lambda w: kern.fp8_scaled_mm(xs, w), _bytes(forms["fp8"][0]))
            if more is not None:
                more(timed, forms, m, x, y, _bytes)
            numeric = {key: v["us"] for key, v in res.items() if isinstance(v, dict)}
            res["fastest"] = min(numeric, key=numeric.get)
            out[f"{name}_{n}x{k}_m{m}"] = res
            print(f"{name} {n}x{k} m={m}: " + ", ".join(
                f"{key} {v['us']:.1f} us {v['gb_s']:.0f} GB/s" for key, v in res.items()
                if isinstance(v, dict) and "_cfg_" not in key) + f"; fastest {res['fastest']}", flush=True)
        del ws, forms, engine_forms, tiny
        torch.cuda.empty_cache()
    return out


def _tinygemm_forms(int4: list):
    """tinygemm's layout of the same int4 codes (groups of 128): w = (q - 8) * scale + zero with zero = scale *
    (8 - our zero point). None where torch lacks it (a build without the CUDA int4 kernels)."""
    if not hasattr(torch, "_weight_int4pack_mm"):
        return None
    packed, sz = [], []
    try:
        for w in int4:
            if w.group != 128:
                return None
            c = w.codes().to(torch.int32)
            u8 = (c[:, ::2] << 4 | c[:, 1::2]).to(torch.uint8)
            packed.append(torch._convert_weight_to_int4pack(u8.contiguous(), 8))
            s = w.scales.float()
            zero = s * (8 - w.zeros.float())
            sz.append(torch.stack([s, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16))
        x = torch.randn(3, int4[0].k, dtype=torch.bfloat16, device="cuda")
        ref = x.float() @ int4[0].dequantize().t()
        got = torch._weight_int4pack_mm(x, packed[0], 128, sz[0]).float()
        if (got - ref).abs().max() > 2e-2 * ref.abs().max():  # the layout assumed above does not hold: say so
            print(f"tinygemm: its result differs from the reference by {(got - ref).abs().max():.3g}; not timed",
                  flush=True)
            return None
    except Exception as e:  # noqa: BLE001
        print(f"tinygemm unavailable: {type(e).__name__}: {str(e)[:160]}", flush=True)
        return None
    return packed, sz


def weight_bytes(model) -> int:
    """Bytes of the model's weights as held: float parameters and buffers left, plus quantized forms."""
    from engine.layers.linear import LinearBase

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for m in model.modules():
        q = getattr(m, "quant", None) if isinstance(m, LinearBase) else getattr(m, "head_quant", None)
        if q is not None:
            total += q.nbytes
    return total


def engine_modes(ckpt, args, report, save) -> dict:
    from engine.bench.gpu import kestrel_tpot, kestrel_ttft, model_numbers
    from engine.bench.report import resolved_config
    from engine.bench.tp import make_core

    rng = random.Random(args.seed)
    vocab = ckpt.config.vocab_size
    copy = report["limits"]["copy_bytes_per_s"]
    kv_per_token = model_numbers(ckpt.config)["kv_bytes_per_token"]
    res = report["engine"] = {}
    runs = [(mode, kv) for mode in args.modes for kv in getattr(args, "kv_cache_dtypes", ["auto"])]
    for quant, kv_dtype in runs:
        mode = quant if kv_dtype == "auto" else f"{quant}+kv_{kv_dtype}"
        t0 = time.perf_counter()
        try:
            core = make_core(ckpt, dtype="bfloat16", device="cuda", quantization=quant, max_model_len=16384,
                             max_num_batched_tokens=16384, max_num_seqs=max(args.batch), enable_prefix_caching=False,
                             gpu_memory_utilization=0.9, kv_cache_dtype=kv_dtype)
        except Exception as e:  # noqa: BLE001 - a mode this GPU refuses (fp8 below sm_89): recorded, the rest runs
            res[mode] = {"error": f"{type(e).__name__}: {e}"}
            save()
            continue
        r = res[mode] = {"load_s": time.perf_counter() - t0, "quantization": quant, "kv_cache_dtype": kv_dtype,
                         "config": resolved_config(core)}
        try:
            r["weight_bytes"] = weight_bytes(core.runner.model)
            r["kv_blocks"] = core.blocks.num_blocks
            r["kv_tokens"] = core.blocks.num_blocks * core.runner.block_size
            r["kv_bytes"] = core.blocks.num_blocks * core.runner.kv_bytes_per_block()
            kv_elem = torch.tensor([], dtype=core.runner.kv_cache_dtype).element_size()
            r["tpot"] = {}
            for b in args.batch:
                try:
                    s = kestrel_tpot(core, rng, vocab, b, 512, args.tpot_steps)
                except Exception as e:  # noqa: BLE001 - recorded; the other batch sizes and modes still run
                    r.setdefault("errors", {})[str(b)] = f"{type(e).__name__}: {e}"
                    print(f"{mode} b{b}: {r['errors'][str(b)]}", flush=True)
                    save()
                    continue
                kv = b * (512 + args.tpot_steps // 2) * kv_per_token * kv_elem // 2  # kv_per_token: 2-byte elements
                r["tpot"][str(b)] = {"ms": s * 1e3, "tok_s": b / s, "limit_ms": (r["weight_bytes"] + kv) / copy * 1e3}
                save()
            s = kestrel_ttft(core, rng, vocab, [args.prefill], args.repeats)[str(args.prefill)]
            r["ttft"] = {str(args.prefill): {"ms": s * 1e3, "tok_s": args.prefill / s}}
            save()
            print(f"{mode}: weights {r['weight_bytes'] / 2**30:.2f} GiB, KV {r['kv_tokens']} tokens in "
                  f"{r['kv_bytes'] / 2**30:.2f} GiB, " + ", ".join(
                f"b{b} {v['ms']:.2f} ms ({v['tok_s']:.0f} tok/s, {100 * v['limit_ms'] / v['ms']:.0f}% of its limit)"
                for b, v in r["tpot"].items()) + f", TTFT {args.prefill} {r['ttft'][str(args.prefill)]['ms']:.1f} ms",
                flush=True)
        finally:
            core.shutdown()
            del core
            gc.collect()
            torch.cuda.empty_cache()
    base = res.get("none", {})
    for mode, r in res.items():
        if mode == "none" or "tpot" not in r or "tpot" not in base:
            continue
        r["vs_bf16"] = {f"tpot_b{b}": base["tpot"][b]["ms"] / v["ms"] for b, v in r["tpot"].items() if b in base["tpot"]}
        r["vs_bf16"]["prefill"] = base["ttft"][str(args.prefill)]["ms"] / r["ttft"][str(args.prefill)]["ms"]
        r["vs_bf16"]["weight_bytes"] = r["weight_bytes"] / base["weight_bytes"]
        r["vs_bf16"]["kv_tokens"] = r["kv_tokens"] / base["kv_tokens"]
        print(f"{mode} vs bf16: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["vs_bf16"].items()), flush=True)
    save()
    return res


def run(args, more_kernels=None) -> dict:
    """``more_kernels``: kernel_rates' ``more`` (benchmarks/quant_lab.py)."""
    from engine.bench.gpu import SHAPE, measure_limits
    from engine.bench.report import environment
    from engine.bench.tp import random_checkpoint

    report: dict = {"benchmark": "quant", "command": " ".join(sys.argv), "environment": environment(),
                    "args": vars(args).copy()}
    report["environment"].update(torch=torch.__version__, gpu=torch.cuda.get_device_name(),
                                 capability=list(torch.cuda.get_device_capability()))

    def save() -> None:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))

    report["limits"] = measure_limits()
    save()
    print(f"copy {report['limits']['copy_bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    ckpt = random_checkpoint(SHAPE, seed=args.seed, max_position=16384)
    if "kernels" not in args.skip:
        report["kernels"] = kernel_rates(ckpt.config, tuple(args.rows), more_kernels)
        save()
    if "engine" not in args.skip:
        engine_modes(ckpt, args, report, save)
    return report


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="bench_quant.json", help="the JSON report")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"], choices=list(KV_CACHE_DTYPES),
                   help="run each mode with each KV-cache dtype (--kv-cache-dtype); fp8 runs report as <mode>+kv_fp8")
    p.add_argument("--batch", nargs="+", type=int, default=[1, 16])
    p.add_argument("--rows", nargs="+", type=int, default=[1, 16], help="rows of x in the kernel measurements")
    p.add_argument("--prefill", type=int, default=8192, help="TTFT prompt length")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tpot-steps", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", default=[], choices=["kernels", "engine"])


def main(args) -> int:
    if not torch.cuda.is_available():
        print("kestrel bench quant needs a CUDA GPU", file=sys.stderr)
        return 2
    run(args)
    print(f"report: {args.out}")
    return 0
