"""The prefill attention kernels alone on the Llama-3-8B shape's attention (32 heads, 8 KV heads, head size 128):
the Triton varlen kernel in each of its configurations and a list of candidate tilings, beside SDPA's flash
backend. A kernel-candidate sweep of the developer's GPU run (benchmarks/gpu_lab.py); its numbers chose
engine/ops/varlen_attention.py's configurations (docs/benchmarks/gpu_prefill_2026-12-02.md).

    python -m benchmarks.attention_kernels [--repeats 5] [--out attention_kernels.json]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from engine.bench.timing import cuda_time

DEVICE = "cuda"


def _candidates():
    from engine.ops.varlen_attention import KernelConfig

    return [KernelConfig(128, 64, 4, 4, tma=True), KernelConfig(128, 64, 8, 3, tma=True),
            KernelConfig(64, 64, 4, 3, tma=True), KernelConfig(64, 32, 4, 3, tma=True), KernelConfig(64, 64, 4, 2),
            KernelConfig(64, 128, 4, 2), KernelConfig(32, 64, 4, 2)]


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="attention_kernels.json")
    args = p.parse_args(argv)
    res = measure_kernels(args.repeats)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    for name, r in res.items():
        print(f"attention {name}: " + ", ".join(f"{k} {v['tflops']:.0f}" for k, v in r.items() if "tflops" in v)
              + " TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
