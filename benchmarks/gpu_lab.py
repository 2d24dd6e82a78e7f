"""The developer's GPU run: `kestrel bench gpu` (engine/bench/gpu.py) with every variant sweep of the lab on top,
one JSON report as the command wrote it before issue 46 (the keys of docs/benchmarks/bench_gpu_*.json):

- before the engine loads: the prefill attention kernels alone with their candidate tilings ("kernels",
  benchmarks/attention_kernels.py), the skinny linear kernels against cuBLAS ("skinny_gemm_gb_s") and the paged
  decode attention kernel alone ("decode_attention", benchmarks/decode.py);
- beside the engine's prefill figures: the same TTFTs with SDPA for every prefill step ("ttft_sdpa") and with the
  residual add as its own kernel ("prefill_ablation", benchmarks/gpu_profile.py);
- beside its decode figures: each batch's step against its graph replay and eager ("decode_breakdown"),
  torch.profiler over the prefill and decode cases ("profile") and torch's GEMM rate on the linear shapes
  ("linear_rates_8192"); the decode variants of the older reports ("decode_variants") were deleted with their
  switches (issue 46);
- after the throughput run: TPOT and throughput with the synchronous step loop ("sync_loop").

    python -m benchmarks.gpu_lab --out bench_gpu.json [kestrel bench gpu's options] [--skip PART ...]
        [--trace-dir DIR]

Run from the repository root (benchmarks/ is not installed with the package). The stages that compare settings
on one loaded engine switch its configuration and switch it back (the SDPA stage: ModelRunner.use_prefill_attention;
the ablation: engine.ops.gemm.FOLD_MIN_ROWS); no stage sets an environment variable.
"""

from __future__ import annotations

import argparse
import sys

import torch

from engine.bench import gpu

LAB_PARTS = ("kernels", "skinny", "attention", "sdpa", "ablation", "breakdown", "profile", "sync")


class LabStages(gpu.Stages):
    def __init__(self, args):
        self.args = args
        self.skip = set(args.skip)

    def before_engine(self, report, cfg, save):
        self.cfg = cfg
        lim = report["limits"]
        if "kernels" not in self.skip:
            from benchmarks.attention_kernels import measure_kernels

            report["kernels"] = measure_kernels()
            save()
            for name, res in report["kernels"].items():
                print(f"attention {name}: " + ", ".join(f"{k} {v['tflops']:.0f}" for k, v in res.items()
                                                        if "tflops" in v) + " TFLOP/s", flush=True)
        if "skinny" not in self.skip:
            from benchmarks.decode import measure_skinny

            report["skinny_gemm_gb_s"] = measure_skinny(cfg)
            save()
            for name, r in report["skinny_gemm_gb_s"].items():
                print(f"linear {name}: cuBLAS {r['cublas']:.0f}, GEMV {r.get('default', float('nan')):.0f} GB/s, "
                      f"best {r['best']} {r[r['best']]:.0f}", flush=True)
        if "attention" not in self.skip:
            from benchmarks.decode import measure_decode_attention

            report["decode_attention"] = measure_decode_attention(cfg)
            save()
            for name, r in report["decode_attention"].items():
                print(f"decode attention {name}: graphs {r['graphs']['us']:.1f} us {r['graphs']['gb_s']:.0f} GB/s, "
                      f"eager {r['eager']['us']:.1f} us {r['eager']['gb_s']:.0f} GB/s "
                      f"({100 * r['graphs']['gb_s'] * 1e9 / lim['copy_bytes_per_s']:.0f}% of copy); graphs' splits "
                      f"{r['graphs_splits']}, by splits: " + ", ".join(
                          f"{k} {v['gb_s']:.0f}" for k, v in r["graphs_by_splits"].items()) + " GB/s", flush=True)

    def prefill(self, core, rng, vocab, k, prefill_row, save):
        if "sdpa" not in self.skip:
            chosen = core.runner.attention.name  # the model's backend, chosen at start-up
            core.runner.use_prefill_attention("sdpa")
            try:
                ttft = gpu.kestrel_ttft(core, rng, vocab, self.args.ttft, self.args.repeats)
            finally:
                core.runner.use_prefill_attention(chosen)
            k["ttft_sdpa"] = {n: prefill_row(s, [int(n)], [int(n)]) for n, s in ttft.items()}
            save()
            print("Kestrel (SDPA) TTFT: " + ", ".join(f"{n} {r['ms']:.1f} ms ({100 * r['share_of_limit']:.0f}%)"
                                                      for n, r in k["ttft_sdpa"].items()), flush=True)
        if "ablation" not in self.skip:
            from benchmarks.gpu_profile import prefill_ablation

            k["prefill_ablation"] = prefill_ablation(core, rng, vocab, self.args.repeats, prefill_row)
            save()
            print("Kestrel prefill with one optimisation off: " + ", ".join(
                f"{name} {r['ms']:.1f} ms ({100 * r['share_of_limit']:.1f}%)"
                for name, r in k["prefill_ablation"].items()), flush=True)

    def decode(self, core, rng, vocab, k, decode_row, save):
        from benchmarks.decode import decode_breakdown

        if "breakdown" not in self.skip:
            k["decode_breakdown"] = {}
            for b in self.args.batch:
                d = k["decode_breakdown"][str(b)] = decode_breakdown(core, rng, b)
                d["eager"] = decode_row(d["eager_step_ms"] / 1e3, b, 512 + 8)
                save()
                print(f"decode batch {b}: step {d['step_ms']:.2f} ms, graph replay on the GPU "
                      f"{d.get('replay_gpu_ms', float('nan')):.2f} ms, host {d.get('host_ms', float('nan')):.2f} ms; "
                      f"eager step {d['eager_step_ms']:.2f} ms", flush=True)
                prof = d.get("replay_profile", {})
                if "span_us" in prof:
                    print(f"  replay b{b}: {prof['span_us']:.0f} us first to last kernel, "
                          f"{prof['kernels_per_replay']:.0f} kernels, gaps {prof['gaps_us']:.0f} us; " + ", ".join(
                              f"{g} {us:.0f}" for g, us in prof["by_group_us"].items()), flush=True)
        if "profile" not in self.skip:
            from benchmarks.gpu_profile import linear_rates, profile_cases

            k["profile"] = profile_cases(core, rng, vocab, trace_dir=self.args.trace_dir)
            k["linear_rates_8192"] = linear_rates(self.cfg)
            save()
            print("linear layers at 8192 rows: " + ", ".join(
                f"{n} {r['tflops']:.0f}" for n, r in k["linear_rates_8192"].items()) + " TFLOP/s", flush=True)

    def after_throughput(self, core, rng, vocab, k, decode_row, save):
        if "sync" in self.skip or not core.async_scheduling:
            return
        args = self.args
        core.async_scheduling = False  # the same measurements with the synchronous loop: what launching ahead is worth
        try:
            k["sync_loop"] = {"tpot": {}}
            for b in args.batch:
                s = gpu.kestrel_tpot(core, rng, vocab, b, 512, args.tpot_steps)
                k["sync_loop"]["tpot"][str(b)] = decode_row(s, b, 512 + args.tpot_steps // 2)
                save()
                print(f"Kestrel TPOT batch {b}, synchronous loop: {s * 1e3:.2f} ms", flush=True)
            if args.throughput_requests:
                k["sync_loop"]["throughput"] = gpu.kestrel_throughput(core, rng, vocab, args.throughput_requests,
                                                                      512, 256)
                save()
                gpu.print_throughput("Kestrel throughput, synchronous loop", k["sync_loop"]["throughput"])
        finally:
            core.async_scheduling = True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu.add_args(p, skips=LAB_PARTS)
    p.add_argument("--trace-dir", default=None, help="write a Chrome trace of each profiled case there")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.gpu_lab needs a CUDA GPU", file=sys.stderr)
        return 2
    gpu.run(args, LabStages(args))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
