"""The kernel configuration: every choice of kernel the engine makes, typed, resolved once at start-up.

What used to be ``KESTREL_*`` environment switches read per layer per step (Python) or per launch (``getenv`` in
csrc) is one frozen value here: :func:`resolve` turns the settings a user may choose (``EngineConfig``, or a test /
benchmark building a ``KernelConfig`` itself) and the facts of the device into concrete choices, the engine applies
them once (``engine.ops.configure``: the native module's one-time ``configure`` call), hands them to the layers and
ops that take them as parameters, passes them to its TP workers (``to_dict`` / ``from_dict``: plain JSON types) and
records them in every benchmark report.

Only choices that won a measurement survive as defaults; the alternatives kept are those a user or a test needs
(attention backend, ISA levels for the tests and for CPUs a level misbehaves on). Variants that lost (the CUDA
decode kernel's U = 1 / 4, plain launches where PDL is there, the GEMV's EARLY 0 / 1, the unfused SiLU, cuBLAS for
one-row linears in the graphs, the Triton integer GEMM) were deleted with their switches (issue 46).

Torch-free and engine-free (the app, the TP executor and the reports import it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceFacts", "KernelConfig", "resolve", "PREFILL_ATTENTION", "CPU_ISAS", "GGUF_ISAS", "CPU_AMX",
           "GEMM_THREADS", "INT_MMA_MAX_WARPS"]

# The choices of each field ("auto" first: the measured default, resolved per device).
PREFILL_ATTENTION = ("auto", "triton", "sdpa")
CPU_ISAS = ("auto", "scalar", "avx2", "avx512", "avx512bf16")  # csrc/cpu/dispatch.cpp levels
GGUF_ISAS = ("auto", "scalar", "avx2", "avxvnni", "avx512vnni")  # csrc/cpu/gguf_dispatch.cpp levels
CPU_AMX = ("auto", "on", "off")
GEMM_THREADS = ("auto", "pool", "openmp")
INT_MMA_MAX_WARPS = 16  # csrc/cuda/int_gemm.cu kMaxWarps


@dataclass(frozen=True)
class DeviceFacts:
    """What :func:`resolve` needs to know of the machine. ``engine.ops.device_facts(device)`` measures them (torch
    side); tests build them by hand."""

    device_type: str = "cpu"  # "cpu" or "cuda"
    cuda_capability: tuple[int, int] | None = None  # (major, minor) of the GPU; None on the CPU
    cpu_flags: frozenset[str] = frozenset()  # /proc/cpuinfo flags (engine/cpu_features.py)
    omp_passive: bool = True  # OMP_WAIT_POLICY is passive (the engine sets it: engine/__init__.py)
    triton: bool = False  # Triton is importable (and the device is a GPU it compiles for)


@dataclass(frozen=True)
class KernelConfig:
    """One field per kernel choice. "auto" values are resolved by :func:`resolve`; a resolved config has none left
    except ``prefill_attention`` on CUDA, whose "auto" is itself a measured policy (below)."""

    # Attention of steps with a prefill chunk (the backend chosen at start-up, engine/layers/attention.py):
    # auto (CUDA with Triton: cuDNN through SDPA for fresh prompts of one length, the Triton varlen kernel for every
    # other prefill step, docs/benchmarks/gpu_prefill_2026-12-02.md; elsewhere resolved to sdpa), triton (the Triton
    # kernel for every prefill step; on the CPU through Triton's interpreter, for tests) or sdpa (torch SDPA per chunk).
    prefill_attention: str = "auto"
    # The CPU linear kernels' level (csrc/cpu/dispatch.cpp): auto (the best this build and CPU have) or one of
    # CPU_ISAS; a level the build or CPU lacks falls back to the best one with a warning.
    cpu_isa: str = "auto"
    # The GGUF kernels' level (csrc/cpu/gguf_dispatch.cpp): auto (the best at or below the linear level) or one of
    # GGUF_ISAS; an unavailable one means auto.
    gguf_isa: str = "auto"
    # bfloat16 CPU linears of many rows (prefill) on torch's oneDNN GEMM (AMX tiles): resolved "on" where the CPU has
    # AMX-BF16 (docs/benchmarks/cpu_amx_prefill_2026-12-02.md: ~1.5-2 TFLOP/s against ~200 GFLOP/s for the native
    # avx512bf16 GEMM from 16 rows), else "off" (the native kernels at every size).
    cpu_amx: str = "auto"
    # Threads of the CPU GEMM regime (prefill): resolved "pool" (the linear kernels' workers) when OpenMP's policy is
    # passive, as the engine sets it (docs/benchmarks/cpu_gguf_models_2026-12-04.md: pool 1.47x / 0.99x llama.cpp
    # against openmp 1.57x / 1.15x TTFT / TPOT ratio on the 2-core VM, Q4_0 1B), else "openmp" (a region per call).
    gemm_threads: str = "auto"
    # Warps per block of the per-tile integer tensor-core kernel (csrc/cuda/int_gemm.cu, integer groups of 16 / 32;
    # the x-sharing kernel of int_gemm_wide.cuh picks its own shape by its measured rule): 0 = enough to put ~16
    # warps on every SM (the measured default, docs/benchmarks/gpu_quant_2026-12-07.md); 1..16 fixes it (the lab's
    # benchmarks/quant_lab.py --int-warps compares them).
    int_mma_warps: int = 0
    # Programmatic dependent launch of the CUDA kernels and the one-row GEMV (resolved: sm_90+). Measured on the H200
    # (docs/benchmarks/gpu_decode_2026-12-06.md): batch-1 TPOT 4.55 ms plain, 4.46 ms every kernel PDL, 4.32 ms with
    # the GEMV's two early weight tiles; not a choice, recorded so a report says what ran.
    pdl: bool = False

    def __post_init__(self) -> None:
        _check("prefill_attention", self.prefill_attention, PREFILL_ATTENTION)
        _check("cpu_isa", self.cpu_isa, CPU_ISAS)
        _check("gguf_isa", self.gguf_isa, GGUF_ISAS)
        _check("cpu_amx", self.cpu_amx, CPU_AMX)
        _check("gemm_threads", self.gemm_threads, GEMM_THREADS)
        if not isinstance(self.int_mma_warps, int) or not 0 <= self.int_mma_warps <= INT_MMA_MAX_WARPS:
            raise ValueError(f"KernelConfig.int_mma_warps={self.int_mma_warps!r}: expected 0..{INT_MMA_MAX_WARPS}")

    def replace(self, **changes: Any) -> KernelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (for TP workers and benchmark reports)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"KernelConfig: unknown fields {sorted(unknown)}")
        return cls(**data)


def _check(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"KernelConfig.{name}={value!r}: expected one of {', '.join(allowed)}")


def resolve(facts: DeviceFacts, engine_config: Any = None, base: KernelConfig | None = None) -> KernelConfig:
    """The concrete kernel configuration for this device: ``base`` (a test's or a benchmark's choices; default all
    "auto"), overridden by the EngineConfig fields of the same name a user set (not None), each "auto" then replaced
    by the measured default of ``facts`` (the comments of KernelConfig cite the measurements)."""
    kc = base or KernelConfig()
    if engine_config is not None:
        chosen = {f.name: getattr(engine_config, f.name) for f in dataclasses.fields(KernelConfig)
                  if f.name != "pdl" and getattr(engine_config, f.name, None) is not None}
        if chosen:
            kc = kc.replace(**chosen)
    changes: dict[str, Any] = {}
    cuda = facts.device_type == "cuda"
    if kc.prefill_attention == "auto" and not (cuda and facts.triton):
        changes["prefill_attention"] = "sdpa"  # the CPU, or a GPU without Triton: SDPA per chunk
    if kc.cpu_amx == "auto":
        changes["cpu_amx"] = "on" if "amx_bf16" in facts.cpu_flags else "off"
    if kc.gemm_threads == "auto":
        changes["gemm_threads"] = "pool" if facts.omp_passive else "openmp"
    pdl = bool(cuda and facts.cuda_capability is not None and facts.cuda_capability[0] >= 9)
    if kc.pdl != pdl:
        changes["pdl"] = pdl
    return kc.replace(**changes) if changes else kc
