"""Per-call timings of the native kernels against their pure-torch references, at decode sizes.

    python -m benchmarks.ops_bench [--device cpu|cuda] [--dtype bf16|fp32|fp16|all] [--threads N] [--isa LEVEL]
    python -m benchmarks.ops_bench --prefill-rows 9 16 32 64 512 [--threads N]

Prints one line per (kernel, shape, dtype): microseconds per call through the Python face (what the
model pays) for the native kernel and for the reference, best of several repeats (these machines are
noisy). Shapes default to SmolLM2-135M's (hidden 576, 9 heads / 3 kv heads of 64, intermediate 1536).

``--prefill-rows``: the CPU linear calls of many rows in bfloat16 (SmolLM2's and a 1B Llama's shapes), float
weights and Q4_0 GGUF blocks, on the native kernels (KernelConfig.cpu_amx off) and on the route to torch's oneDNN
GEMM (on; the AMX tiles where the CPU has them): the measurement behind engine/ops/gemm.py's and gguf_quant.py's
AMX_MIN_M.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time

import torch
import torch.nn.functional as F

from engine import ops
from engine.ops import reference

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _time_us(fn, device: str, min_time: float = 0.05, repeats: int = 5) -> float:
    for _ in range(3):
        fn()
    n = 1
    while True:  # calibrate the number of calls per repeat
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if dt >= min_time / repeats or n >= 1 << 20:
            break
        n *= 2
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def _cases(dtype: torch.dtype, device: str, ctx: int, batch: int):
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    H, I, nh, nkv, hd, bs = 576, 1536, 9, 3, 64, 16
    x, w, r = rnd(1, H), rnd(H), rnd(1, H)
    yield "rms_norm T=1 H=576", (lambda: ops.rms_norm(x, w, 1e-5)), (lambda: reference.rms_norm(x, w, 1e-5))
    yield ("fused_add_rms_norm T=1 H=576", (lambda: ops.fused_add_rms_norm(x, r, w, 1e-5)),
           (lambda: reference.fused_add_rms_norm(x, r, w, 1e-5)))
    gu = rnd(1, 2 * I)
    yield "silu_and_mul T=1 I=1536", (lambda: ops.silu_and_mul(gu)), (lambda: reference.silu_and_mul(gu))
    qkv = rnd(1, (nh + 2 * nkv) * hd)
    q, k = qkv[:, : nh * hd], qkv[:, nh * hd : (nh + nkv) * hd]
    v = qkv[:, (nh + nkv) * hd :]
    cache = torch.randn(max(4096, ctx), hd, generator=g).to(device)
    pos = torch.tensor([ctx - 1], device=device)
    yield ("rotary_embedding T=1 9+3 heads", (lambda: ops.rotary_embedding(pos, q, k, hd, cache, True)),
           (lambda: reference.rotary_embedding(pos, q, k, hd, cache, True)))
    blocks_per_seq = (ctx + bs - 1) // bs
    nb = batch * blocks_per_seq + 1
    kc, vc = rnd(nb, bs, nkv, hd), rnd(nb, bs, nkv, hd)
    slots = torch.tensor([5], device=device)
    k3, v3 = k.view(1, nkv, hd), v.view(1, nkv, hd)
    yield ("reshape_and_cache T=1 3x64", (lambda: ops.reshape_and_cache(k3, v3, kc, vc, slots)),
           (lambda: reference.reshape_and_cache(k3, v3, kc, vc, slots)))
    # linear: the torch column is F.linear in the dtype (what the layers called before ops.linear); the
    # weights stay in cache between calls here, unlike in a model step (one pass over 270 MB).
    for k_in, n_out, what in ((H, (nh + 2 * nkv) * hd, "qkv"), (H, 2 * I, "gate_up"), (I, H, "down"),
                              (H, 49152, "lm_head")):
        xl, wl = rnd(batch, k_in), rnd(n_out, k_in)
        yield (f"linear M={batch} {k_in}->{n_out} ({what})", (lambda xl=xl, wl=wl: ops.linear(xl, wl)),
               (lambda xl=xl, wl=wl: F.linear(xl, wl)))
    bt = torch.randperm(nb - 1, generator=g)[: batch * blocks_per_seq].view(batch, -1).int().to(device)
    cl = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    qd = rnd(batch, nh, hd)
    yield (f"paged_decode_attention B={batch} 9/3 heads hd=64 ctx={ctx}",
           (lambda: ops.paged_decode_attention(qd, kc, vc, bt, cl, hd**-0.5)),
           (lambda: reference.paged_decode_attention(qd, kc, vc, bt, cl, hd**-0.5)))


_PREFILL_SHAPES = (("smollm2 qkv", 960, 576), ("smollm2 gate_up", 3072, 576), ("smollm2 down", 576, 1536),
                   ("smollm2 lm_head", 49152, 576), ("1b qkv", 3072, 2048), ("1b gate_up", 11264, 2048),
                   ("1b down", 2048, 5632))


@contextlib.contextmanager
def _amx_setting(value: str | None):
    """KernelConfig.cpu_amx (engine/kernel_config.py) set to ``value`` ("on" / "off"; None: auto, the CPU's flag)
    within, applied through engine.ops.configure; this process's resolved configuration again after."""
    from engine.kernel_config import resolve

    base = resolve(ops.device_facts("cpu"))
    ops.configure(base.replace(cpu_amx=value or "auto"))
    try:
        yield
    finally:
        ops.configure(base)


def _amx_on_this_cpu() -> bool:
    with _amx_setting(None):
        return ops.native.amx_bf16()


def prefill_rows(rows: list[int]) -> None:
    """Milliseconds per bfloat16 linear call of each M in ``rows``, native against the oneDNN route."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    from engine.ops import GGUFWeight

    rng = np.random.default_rng(0)
    print(f"# {'shape (N x K)':26s} {'M':>5s} {'bf16 native':>12s} {'bf16 oneDNN':>12s} {'Q4_0 native':>12s} "
          f"{'Q4_0 oneDNN':>12s}  (ms per call)")
    for name, n, k in _PREFILL_SHAPES:
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        q4 = GGUFWeight.from_blocks(quants.quantize(w, GGMLQuantizationType.Q4_0), 2, k)
        wb = q4.dequantize(torch.bfloat16).contiguous()
        for m in rows:
            x = torch.randn(m, k, dtype=torch.bfloat16)
            t = {}
            for setting in ("off", "on"):
                with _amx_setting(setting):
                    t["bf16", setting] = _time_us(lambda: ops.linear(x, wb), "cpu", min_time=0.2) / 1e3
                    t["q4", setting] = _time_us(lambda: ops.linear(x, q4), "cpu", min_time=0.2) / 1e3
            print(f"  {name + f' ({n} x {k})':26s} {m:5d} {t['bf16', 'off']:12.3f} {t['bf16', 'on']:12.3f} "
                  f"{t['q4', 'off']:12.3f} {t['q4', 'on']:12.3f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="all", choices=[*_DTYPES, "all"])
    ap.add_argument("--threads", type=int, default=None, help="threads for the native CPU kernels")
    ap.add_argument("--isa", default=None, help="force a CPU ISA level (scalar, avx2, avx512)")
    ap.add_argument("--ctx", type=int, default=512, help="context length for decode attention")
    ap.add_argument("--batch", type=int, default=1, help="sequences for decode attention")
    ap.add_argument("--prefill-rows", type=int, nargs="+", default=None, metavar="M",
                    help="instead: bfloat16 linear calls of these many rows, native against torch's oneDNN GEMM")
    args = ap.parse_args(argv)
    if args.threads:
        ops.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    if args.prefill_rows:
        print(f"# benchmarks.ops_bench --prefill-rows: native={ops.native_available()} linear={ops.linear_isa()} "
              f"gguf={ops.gguf_isa()} amx_bf16 on this CPU={_amx_on_this_cpu()} torch={torch.__version__} "
              f"threads={torch.get_num_threads()} cpu={platform.processor() or platform.machine()}")
        prefill_rows(args.prefill_rows)
        return
    if args.isa and ops.native_available():
        from engine import _C

        _C.force_isa(args.isa)
    print(f"# benchmarks.ops_bench: native={ops.native_available()} isa={ops.cpu_isa()} device={args.device} "
          f"torch={torch.__version__} threads={torch.get_num_threads()} cpu={platform.processor() or platform.machine()}")
    print(f"# {'kernel':48s} {'dtype':9s} {'native us':>10s} {'torch us':>10s} {'speedup':>8s}")
    dtypes = list(_DTYPES.values()) if args.dtype == "all" else [_DTYPES[args.dtype]]
    for dtype in dtypes:
        for name, native, ref in _cases(dtype, args.device, args.ctx, args.batch):
            tn = _time_us(native, args.device)
            tr = _time_us(ref, args.device)
            print(f"  {name:48s} {str(dtype).split('.')[-1]:9s} {tn:10.2f} {tr:10.2f} {tr / tn:7.1f}x")


if __name__ == "__main__":
    main()
