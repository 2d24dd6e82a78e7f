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


def cpu_has_native_bf16() -> bool:
    """Whether dtype "auto" picks bfloat16 over float32 on the CPU."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
