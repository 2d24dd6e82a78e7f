"""What this engine can do, for front ends that must not import torch (the app's Load form). Torch-free."""

from __future__ import annotations

from engine.config import COMM_STRATEGIES


def capabilities() -> dict:
    return {
        "tensor_parallel": True,  # one process per rank: GPUs, or CPU ranks sharing the cores
        "comm_strategies": list(COMM_STRATEGIES),  # all of them (auto included)
        "keeps_quantized_weights": False,  # GGUF blocks are dequantized at load (then --quantization int8 if asked)
        "notes": {"quantization": "int8 runs on the CPU kernels"},
    }
