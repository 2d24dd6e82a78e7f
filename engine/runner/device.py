"""Device, dtype and thread choices."""

from __future__ import annotations

import os

import torch

from engine.cpu_features import cpu_flags, cpu_has_native_bf16  # noqa: F401 - re-exported

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from engine.errors import KestrelError
        raise KestrelError("--device cuda was requested but no CUDA GPU is visible to PyTorch")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, checkpoint_dtype: str | None) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if checkpoint_dtype in ("float16", "bfloat16"):
        return _DTYPES[checkpoint_dtype]
    return torch.bfloat16


def default_block_size(device: torch.device) -> int:
    """KV-cache block size in tokens when --block-size is not given. On a GPU 64: the prefill attention kernel
    copies a 64-key tile out of one block with one TMA load (engine/ops/varlen_attention.py); 16 elsewhere
    (finer prefix-cache reuse, and the CPU kernels gain nothing from larger blocks)."""
    return 64 if device.type == "cuda" else 16


def physical_cores() -> int:
    try:
        import psutil
        n = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unable to tell
        n = None
    n = n or os.cpu_count() or 1
    try:
        n = min(n, len(os.sched_getaffinity(0)))
    except AttributeError:
        pass
    return max(1, n)
