"""The developer's quantization run: `kestrel bench quant` (engine/bench/quant.py) with the kernel-candidate sweeps
on top, in one report: the Triton fp8 kernel's other tile shapes (``{mode}_cfg_m..n..k..w..s..``) and the integer
tensor-core kernel at forced warps per block (``{mode}_engine_cfg_w{warps}``, KernelConfig.int_mma_warps applied
through engine.ops.configure and restored), beside the shapes' standard timings.

    python -m benchmarks.quant_lab --out bench_quant.json [kestrel bench quant's options] [--candidates]
        [--int-warps 4 8 16]

Run from the repository root (benchmarks/ is not installed with the package).
"""

from __future__ import annotations

import argparse
import sys

import torch

from engine.bench import quant


def fp8_candidates(m: int) -> list:
    """The Triton fp8 kernel's tile shapes tried besides its default (one-row and 16-row calls)."""
    from engine.ops.quant_linear_triton import QuantConfig

    if m > 16:
        return []
    return [QuantConfig(16, 64, 128, 4, 4), QuantConfig(16, 32, 128, 4, 4)]


def more_kernels(candidates: bool, int_warps: list[int]):
    """kernel_rates' ``more``: the candidates and forced warps of each shape and row count."""
    from engine import ops
    from engine.kernel_config import resolve
    from engine.ops import quant_linear_triton as kern
    from engine.ops.quant_linear import quant_linear

    kc = resolve(ops.device_facts("cuda"))

    def more(timed, forms, m, x, y, nbytes):
        for mode in ("int8", "int4"):
            qs = forms.get(mode)
            if not qs or qs[0] is None or qs[0].layout != "mma":
                continue
            for warps in int_warps:  # the kernel's warps per block forced (captured into the graph)
                ops.configure(kc.replace(int_mma_warps=warps))
                try:
                    timed(f"{mode}_engine_cfg_w{warps}", qs, lambda w: quant_linear(x, w, out=y), nbytes(qs[0]))
                finally:
                    ops.configure(kc)
        qs = forms.get("fp8")
        if candidates and qs and qs[0] is not None:
            for c in fp8_candidates(m):
                timed(f"fp8_cfg_m{c.block_m}n{c.block_n}k{c.block_k}w{c.num_warps}s{c.num_stages}", qs,
                      lambda w, c=c: kern.fused(x, w, out=y, config=c), nbytes(qs[0]))
    return more


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    quant.add_args(p)
    p.add_argument("--candidates", action="store_true", help="also time the Triton fp8 kernel's other tile shapes")
    p.add_argument("--int-warps", nargs="*", type=int, default=[],
                   help="also time the integer tensor-core kernel at these warps per block (KernelConfig.int_mma_warps)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.quant_lab needs a CUDA GPU", file=sys.stderr)
        return 2
    quant.run(args, more_kernels(args.candidates, args.int_warps))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
