"""What the CPU is and can do, read from /proc/cpuinfo. No torch here: the GUI asks the same questions at
start-up."""

from __future__ import annotations

import functools
import platform


@functools.lru_cache(maxsize=None)
def cpu_model_name() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) ..."); elsewhere than Linux what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# The CPU kernel levels and the /proc/cpuinfo flags each needs, as csrc/cpu_features.h defines them for the native
# dispatchers (tests/unit/test_cpu_features.py parses the header and checks the two agree).
_AVX2 = ("avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq")
CPU_LEVELS: dict[str, tuple[str, ...]] = {
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512bf16": (*_AVX512, "avx512_bf16", "avx512_vnni"),  # the CPU linear kernels' bf16 dot product
    "avxvnni": (*_AVX2, "avx_vnni"),  # GGUF kernels
    "avx512vnni": (*_AVX512, "avx512_vnni"),  # GGUF kernels
}


def cpu_levels(flags: frozenset[str] | None = None) -> list[str]:
    """The levels of CPU_LEVELS this CPU has (``flags``: cpuinfo flags, default this machine's), in table order. The
    native module offers those of them its compiler could build (engine.ops.available_isas, gguf_isas)."""
    have = cpu_flags() if flags is None else flags
    return [level for level, need in CPU_LEVELS.items() if set(need) <= have]


def cpu_has_native_bf16() -> bool:
    """Whether dtype "auto" picks bfloat16 over float32 on the CPU."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
