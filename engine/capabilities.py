"""What this engine can do, for front ends that must not import torch (the app's Load form). Torch-free."""

from __future__ import annotations

import importlib.util

from engine.config import COMM_STRATEGIES


def capabilities() -> dict:
    return {
        "tensor_parallel": True,  # one process per rank: GPUs, or CPU ranks sharing the cores
        "comm_strategies": list(COMM_STRATEGIES),  # all of them (auto included)
        # --quantization auto (the default) keeps a GGUF file's blocks on the CPU where the native kernels are built
        # (engine.config.auto_quantization); a GPU dequantizes them at load
        "keeps_quantized_weights": importlib.util.find_spec("engine._C") is not None,
        "notes": {"quantization": "int8 runs on the CPU kernels"},
    }
