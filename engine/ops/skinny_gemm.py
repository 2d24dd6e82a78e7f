"""Linear layers of one row on CUDA (batch-1 decode): a Triton GEMV that streams the weight once at close to the
copy bandwidth, faster than cuBLAS's kernels on these shapes. Measured inside CUDA graphs on the H200, Llama-3-8B
shapes, weights read from memory (not L2): 3.63 against 3.33 TB/s (qkv 6144 x 4096), 3.00 / 2.67 (o, 4096 x 4096),
4.21 / 4.16 (gate_up), 3.84 / 3.77 (down), 4.41 / 4.27 (LM head); at 8 and 16 rows cuBLAS was faster (3.7 against
3.0 TB/s on down), so those stay with cuBLAS (`python -m benchmarks.gpu_lab`, benchmarks/decode.py, measures both).

The kernel: fp32 FMAs into a [BLOCK_N, BLOCK_K] tile, one reduction over K at the end (no shuffle per tile).

Launched as a programmatic dependent (PDL, sm_90+): the kernels before it in a decode step (norms, silu_and_mul,
decode attention: csrc/cuda/common.cuh ``launch`` / ``dependent_entry``) let it launch as they start, so its
programs are resident and waiting (griddepcontrol.wait) when they finish, instead of launching after. The
weights do not depend on that kernel: a resident program loads its first two weight tiles into registers before it
waits, so the weight stream of a layer's GEMV begins under the norm, attention or activation kernel before it.
Measured on the H200 (b1 TPOT, graphs; docs/benchmarks/gpu_decode_2026-12-05.md): 4.28 / 4.35 / 4.44 ms with 2 / 1 / 0 tiles in one run;
tiles prefetched into L2 (``prefetch.global.L2``) instead were slower (4.79 ms with three, 5.62 with seven). Every
kernel PDL against plain launches: 4.46 against 4.55 ms (docs/benchmarks/gpu_decode_2026-12-06.md). The losing
variants (plain launches, 0 or 1 early tiles: KESTREL_PDL, KESTREL_GEMV_EARLY) were deleted (issue 46).

The MLP's gate_up projection takes the same kernel with the SiLU-gated activation in its epilogue
(``skinny_silu_and_mul``, through ``ops.linear_silu_and_mul``): one kernel less per layer; H100, b1 TPOT 5.67 / 5.68
against 5.74 / 5.73 ms in two runs (docs/benchmarks/gpu_decode_2026-12-06.md); the unfused path's switch
(KESTREL_FUSED_SILU) was deleted (issue 46).

When: inside ``for_graphs()`` (the decode CUDA graphs' warm-up and capture; tests and benchmarks): there a launch
costs nothing and only the kernel's speed counts, while eagerly Triton's Python launcher costs more than cuBLAS's.
(cuBLAS inside the graphs too, KESTREL_SKINNY_GEMM=off, lost on every shape above and was deleted: issue 46.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch



@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


GEMV_CONFIG = SkinnyConfig(8, 512, 4, 3)  # within 2% of the best candidate on every 8B shape (H200)

_depth = 0  # for_graphs() nesting with the kernels enabled


@contextlib.contextmanager
def for_graphs() -> Iterator[None]:
    """Within: linear calls with one row take the GEMV kernel."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def wanted(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``linear`` hands this call to the GEMV kernel: within for_graphs(), CUDA, a 2-D x of one row with a
    contiguous last dim, a contiguous bf16 / fp16 weight of x's dtype (bias too)."""
    return bool(_depth and x.is_cuda and x.dim() == 2 and x.shape[0] == 1
                and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype and weight.dim() == 2
                and weight.shape[1] == x.shape[1] and weight.is_contiguous() and x.stride(1) == 1
                and weight.device == x.device
                and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()
                                      and bias.shape == (weight.shape[0],))))


def wanted_gated(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear_silu_and_mul`` takes the fused kernel (skinny_silu_and_mul): as ``wanted`` (no bias), an
    even number of rows."""
    return weight.dim() == 2 and weight.shape[0] % 2 == 0 and wanted(
        x, weight, None)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, config: SkinnyConfig | None = None) -> torch.Tensor:
    """y = x @ weight^T + bias for x [1, K] (last dim contiguous), weight [N, K] contiguous; returns ``out`` ([1, N],
    contiguous) or a new tensor. Triton (CUDA, or the interpreter on the CPU in tests)."""
    return _launch(x, weight, bias, out, config, gated=False)


def skinny_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
                        config: SkinnyConfig | None = None) -> torch.Tensor:
    """silu_and_mul(x @ weight^T) in one kernel for x [1, K], weight [2I, K] = [gate; up] (the MLP's gate_up
    projection): [1, I], each value rounded as the two ops round it (the projection, silu, the product). Saves the
    activation kernel and its launch between the projection and down_proj in each layer of a decode step."""
    if weight.shape[0] % 2:
        raise ValueError(f"skinny_silu_and_mul: the weight has {weight.shape[0]} rows; gate + up need an even number")
    return _launch(x, weight, None, out, config, gated=True)


def _launch(x, weight, bias, out, config, gated: bool) -> torch.Tensor:
    from engine.ops import skinny_gemm_kernel as kern

    M, K = x.shape
    N = weight.shape[0]
    if M != 1:
        raise ValueError(f"skinny_linear: x has {M} rows; the GEMV takes one")
    if out is None:
        out = torch.empty(1, N // 2 if gated else N, dtype=x.dtype, device=x.device)
    cfg = config or GEMV_CONFIG
    rows = cfg.block_n // 2 if gated else cfg.block_n  # outputs per program
    grid = (-(-(N // 2 if gated else N) // rows),)
    pdl_on = pdl(x.device)
    kern.gemv_kernel[grid](x, weight, bias if bias is not None else weight, out, N, K, HAS_BIAS=bias is not None,
                           EVEN_K=K % cfg.block_k == 0, PDL=pdl_on, GATED=gated,
                           BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
                           num_stages=cfg.num_stages, **({"launch_pdl": True} if pdl_on else {}))
    return out


_SM90: dict[int, bool] = {}  # CUDA device index -> compute capability >= 9.0


def pdl(device: torch.device) -> bool:
    """Whether the GEMV launches as a programmatic dependent here: CUDA sm_90+ (KernelConfig.pdl records it)."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM90:
        _SM90[index] = torch.cuda.get_device_capability(index) >= (9, 0)
    return _SM90[index]
