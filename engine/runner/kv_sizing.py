"""KV-cache sizing: the bytes of a block, the blocks of a configured count or memory size, and on a GPU the blocks
its measured free memory leaves (ModelRunner.num_kv_blocks_that_fit)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.errors import KestrelError

log = logging.getLogger(__name__)

CPU_DEFAULT_KV_GIB = 2.0
ACTIVATION_MARGIN_BYTES = 256 << 20  # allocator fragmentation, cuBLAS workspaces


def kv_bytes(layers: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
             tensors: int = 2) -> int:
    """Bytes of one block of keys and values over every layer, in the cache's element type. ``tensors``: 2 (keys
    and values), or 1 for a multi-head latent attention cache (one latent row per token: engine/layers/mla.py)."""
    elem = torch.tensor([], dtype=dtype).element_size()  # 1 for fp8: twice the blocks
    return tensors * layers * block_size * kv_heads * head_dim * elem


def fixed_kv_blocks(config, device: torch.device, per_block: Callable[[], int]) -> int | None:
    """The configured number of KV blocks, or those of a fixed memory size (CPU, or --kv-cache-memory-gib) at
    per_block() bytes each; None where the GPU's free memory decides."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    if device.type == "cpu" or config.kv_cache_memory_gib is not None:
        gib = config.kv_cache_memory_gib or CPU_DEFAULT_KV_GIB
        return max(1, int(gib * 2**30) // per_block())
    return None


def gpu_kv_blocks(config, device: torch.device, per_block: int, peak: int | None, reserve: int) -> int:
    """The blocks of ``per_block`` bytes in what remains of gpu_memory_utilization x the GPU's memory after what is
    allocated now (the weights), the decode graphs' pool (``reserve``) and the activation peak of the largest step
    (``peak``, measured by a profiling forward; None: TP ranks, which cannot run a forward alone, keep 10% of the
    budget for activations). KestrelError where nothing is left."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    budget = total * config.gpu_memory_utilization - (total - free) - reserve
    if peak is None:
        return max(1, int(budget * 0.9) // per_block)
    blocks = int(budget - peak - ACTIVATION_MARGIN_BYTES) // per_block
    log.info("GPU memory: %.2f GiB for the KV cache (%d blocks) after weights and a %.2f GiB activation peak",
             blocks * per_block / 2**30, blocks, peak / 2**30)
    if blocks < 1:
        raise KestrelError(
            f"no GPU memory left for the KV cache: the weights use {(total - free) / 2**30:.1f} GiB and the "
            f"largest step needs {peak / 2**30:.1f} GiB of activations, against "
            f"{config.gpu_memory_utilization:.0%} of {total / 2**30:.1f} GiB; lower --max-num-batched-tokens "
            "or raise --gpu-memory-utilization")
    return blocks
