"""Every ``KESTREL_*`` environment variable, in one table: its default, how its text is read, what it means.

Modelled on vLLM's envs.py: ``from engine import envs`` then ``envs.KESTREL_X`` reads os.environ at that
moment (module ``__getattr__``), so a test's ``monkeypatch.setenv`` is seen and nothing is frozen at import.
An unset (or, except for flags, empty) variable gives the default; a default of None means "unset: the
reader picks" (its doc says how). A value that cannot be read raises ValueError naming the variable.

Torch-free, imports nothing of the engine: the app, the installer's checks and the native build may read it.
Some variables are read elsewhere and only listed here (the doc says who): the native module (csrc/),
the native build (csrc/CMakeLists.txt), the installer scripts (installer/*.sh), the app (app/paths.py) and
the test fake engine (tests/server/fake_engine.py). Variables the engine *sets* for child processes
(NCCL_*, GLOO_*, PYTHONPATH, ...) are not in this table.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["ENV_VARS", "describe", "is_set"]


def _flag(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return text

    return parse


def _str(text: str) -> str:
    return text


# name -> (default, parser, doc)
ENV_VARS: dict[str, tuple[Any, Callable[[str], Any], str]] = {
    # -- native kernels (engine/ops, csrc) ------------------------------------------------------------------
    "KESTREL_REQUIRE_NATIVE": (
        False, _flag,
        ("A missing native module (engine._C) is an ImportError instead of the slow torch fallback "
         "(engine/ops).")),
    "KESTREL_CPU_ISA": (
        "auto", _str,
        ("Force the CPU kernel level: auto, scalar, avx2, avx512, avx512bf16; a level this build or CPU "
         "lacks falls back to the best one with a warning. Read by the native module (csrc/cpu/dispatch.cpp) "
         "when it is imported.")),
    "KESTREL_GGUF_ISA": (
        "auto", _str,
        ("Force the level of the GGUF quantized-weight kernels: auto (the best one at or below the CPU linear "
         "level), scalar, avx2, avxvnni, avx512vnni; an unavailable one means auto. Read by the native module "
         "(csrc/cpu/gguf_dispatch.cpp) at its first GGUF call.")),
    "KESTREL_CPU_AMX": (
        "auto", _choice("auto", "on", "off"),
        ("CPU linear layers of many rows (prefill) in bfloat16 on torch's oneDNN GEMM, which uses the AMX "
         "matrix units: auto (where the CPU has AMX-BF16), on or off (the native kernels at every size, to "
         "compare) (engine/ops/gemm.py, engine/ops/gguf_quant.py).")),
    "KESTREL_PREFILL_ATTENTION": (
        "auto", _choice("auto", "triton", "sdpa"),
        ("Attention of steps with a prefill chunk: auto (CUDA: cuDNN through SDPA for fresh prompts of one "
         "length, cuDNN over a long chunk's own keys with the Triton kernel adding its cached prefix, the "
         "Triton varlen kernel for every other step when Triton is there; CPU: SDPA), triton (the Triton kernel "
         "for every step with a prefill; on the CPU through Triton's interpreter, for tests) or sdpa (torch SDPA "
         "per chunk) (engine/layers/attention.py).")),
    "KESTREL_SKINNY_GEMM": (
        "auto", _choice("auto", "off"),
        ("Linear layers of one row inside the decode CUDA graphs: auto (the Triton GEMV kernel) or off (cuBLAS) "
         "(engine/ops/skinny_gemm.py).")),
    "KESTREL_PDL": (
        "auto", _choice("auto", "gemv", "off"),
        ("Programmatic dependent launch on sm_90+ (a kernel launched while the one before it runs, waiting for its "
         "output): auto (the one-row GEMV of the decode CUDA graphs and every CUDA kernel of csrc/cuda), gemv (the "
         "GEMV only) or off (plain launches). Read by engine/ops/skinny_gemm.py and, at each launch, by "
         "csrc/cuda/common.cuh (kestrel bench gpu compares the settings).")),
    "KESTREL_GEMV_EARLY": (
        2, int,
        ("Weight tiles each program of the one-row GEMV loads before it waits for the kernel before it (PDL): "
         "0, 1 or 2 (engine/ops/skinny_gemm.py; kestrel bench gpu compares them).")),
    "KESTREL_FUSED_SILU": (
        "auto", _choice("auto", "off"),
        ("The MLP's SiLU-gated activation in the epilogue of the one-row gate_up GEMV inside the decode CUDA graphs: "
         "auto (one kernel) or off (the GEMV, then silu_and_mul) (engine/ops/skinny_gemm.py; kestrel bench gpu "
         "compares them).")),
    "KESTREL_CUDA_DECODE_U": (
        None, _str,
        ("Tokens each lane group of the CUDA decode attention kernel loads per step when 4 query heads share a KV "
         "head: 4 (more loads in flight per warp), 2 (128 registers: four blocks per SM) or 1 (five); unset: the "
         "kernel's default. Read by csrc/cuda/attention.cu at each launch (kestrel bench gpu compares both).")),
    "KESTREL_INT_MMA": (
        "auto", _choice("auto", "off"),
        ("Integer GPU weights (GPTQ / AWQ checkpoints, --quantization int8 | int4): auto (packed for the tensor-core "
         "kernels of csrc/cuda/int_gemm.cu where engine._C has them and K and the group are multiples of 16: H100, "
         "2026-12-07, batch-1 decode int4 1.61x / int8 1.27x bf16 where the Triton kernels gave 0.75x / 0.71x) or "
         "off (the Triton kernels' layout). Read at load (engine/ops/int_mma.py).")),
    "KESTREL_INT_MMA_WARPS": (
        None, _str,
        ("Warps per block of the tensor-core kernel for integer weights (1..16, each taking a share of K); unset: "
         "enough to put ~16 warps on every SM. Read by csrc/cuda/int_gemm.cu at each launch (kestrel bench quant "
         "--int-warps compares them).")),
    # -- CPU runtime ------------------------------------------------------------------------------------------
    "KESTREL_OMP_PASSIVE": (
        True, _flag,
        ("The engine process sets OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads sleep instead of spinning into the "
         "next decode step's GEMVs) unless the user chose a policy; 0 keeps OpenMP's default (engine/__init__.py).")),
    "KESTREL_OMP_WAIT_POLICY_SET": (
        False, _flag,
        ("Set by the engine, not the user: marks that OMP_WAIT_POLICY came from KESTREL_OMP_PASSIVE, so the "
         "bench's llama.cpp peer drops it again (engine/bench/llamacpp_peer.py).")),
    "KESTREL_GEMM_THREADS": (
        "auto", _choice("auto", "pool", "openmp"),
        ("Threads of the CPU GEMM regime (prefill: the float GEMM, the GGUF panels and their dequantization): pool "
         "(the linear kernels' own workers, as decode uses), openmp (an OpenMP region per call) or auto (the pool "
         "when OMP_WAIT_POLICY is passive, as the engine sets it, else OpenMP). Read by csrc/cpu/gemm_pool.cpp at "
         "each call, so a benchmark compares both in one process.")),
    # -- tensor parallelism (its communication's tuning is a CommConfig: engine/parallel/comm/config.py) ---------
    "KESTREL_LOG_LEVEL": (
        "WARNING", _str,
        ("Logging level of the TP rank processes: read by rank 0 when it starts them, handed to each in its boot "
         "data (engine/executor/tp_executor.py).")),
    # -- server ----------------------------------------------------------------------------------------------
    "KESTREL_API_KEY": (
        None, _str,
        ("The API key of `kestrel serve` when --api-key is not given (engine/server/serve.py). Secret: "
         "describe() shows only whether it is set.")),
    # -- app -------------------------------------------------------------------------------------------------
    "KESTREL_DATA_DIR": (
        None, _str,
        ("The app's data directory (conversations, settings, models folder). Unset: the platform's user data "
         "folder. Read by app/paths.py.")),
    # -- build and install (read outside Python) -------------------------------------------------------------
    "KESTREL_CUDA_ARCHS": (
        None, _str,
        ("GPU targets of the native build, e.g. 89 (default: CMake's native detection). Read by the native "
         "build (csrc/CMakeLists.txt).")),
    "KESTREL_DISABLE_CUDA": (
        False, _flag,
        "Build the native module without the CUDA kernels. Read by the native build (csrc/CMakeLists.txt)."),
    "KESTREL_VENV": (
        None, _str,
        ("The virtual environment of the installer scripts (default: .venv in the checkout). Read by "
         "installer/*.sh.")),
    "KESTREL_TORCH_INDEX": (
        None, _str,
        "An extra package index for PyTorch (e.g. its CPU-only index). Read by installer/setup.sh."),
    "KESTREL_BIN_DIR": (
        None, _str,
        ("Where installer/install-desktop.sh links `kestrel` (default: ~/.local/bin); uninstall.sh removes the "
         "link from there.")),
    # -- tests -----------------------------------------------------------------------------------------------
    "KESTREL_TEST_TOKENIZER_DIR": (
        None, _str, ("Tests only: a saved SmolLM2 tokenizer directory the tiny test models use instead of one made "
                     "from the embedded GGUF, for machines without that package (tests/conftest.py, "
                     "scripts/gpu_run.sh).")),
    "KESTREL_FAKE": (
        "", _str,
        ("Behaviour of the test fake engine core: slow, crash_step, load_error, ... Read by "
         "tests/server/fake_engine.py.")),
    "KESTREL_INSTALL_VENV": (
        None, _str,
        ("Tests only: an existing virtualenv for the install tier (tests/install) to set up again with "
         "installer/setup.sh instead of a fresh one (only what changed is redone).")),
    "KESTREL_INSTALL_SHOTS": (
        None, _str,
        "Tests only: where the install tier (tests/install) saves its screenshots (default /tmp/shots/install)."),
}

_SECRET = frozenset({"KESTREL_API_KEY"})


def _read(name: str) -> Any:
    default, parse, _doc = ENV_VARS[name]
    text = os.environ.get(name)
    if text is None or (text == "" and parse is not _flag):
        return default
    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={text!r}: {e}") from None


def __getattr__(name: str) -> Any:
    if name in ENV_VARS:
        return _read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *ENV_VARS])


def is_set(name: str) -> bool:
    """Whether the variable is in the environment (even empty)."""
    if name not in ENV_VARS:
        raise KeyError(name)
    return name in os.environ


def describe(only_set: bool = False) -> dict[str, dict[str, Any]]:
    """The variables with their current values, for reports: name -> {value, default, set, doc}.
    ``only_set`` keeps those present in the environment. A secret's value reads "<set>"; a value that
    cannot be read is reported as its text with an "error"."""
    out: dict[str, dict[str, Any]] = {}
    for name, (default, _parse, doc) in ENV_VARS.items():
        present = name in os.environ
        if only_set and not present:
            continue
        error = None
        try:
            value = _read(name)
        except ValueError as e:
            value, error = os.environ[name], str(e)
        if name in _SECRET and present:
            value = "<set>"
        row: dict[str, Any] = {"value": value, "default": default, "set": present, "doc": doc}
        if error:
            row["error"] = error
        out[name] = row
    return out
