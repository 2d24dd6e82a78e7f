"""The checks and resolutions of a load's options against the device, the checkpoint and the native kernels
(--quantization, --kv-cache-dtype, gguf blocks, --deterministic): ModelRunner runs them before it builds anything;
TPExecutor checks a tensor-parallel size against a GGUF file's expert blocks before its workers start."""

from __future__ import annotations

import logging

import torch

from engine import ops
from engine.parallel.context import TPContext

log = logging.getLogger(__name__)


def resolve_quantization(mode: str, device: torch.device, weights) -> str:
    """--quantization as this load runs it: ``auto`` becomes gguf for a .gguf checkpoint on the CPU with the native
    kernels and a type they take (engine.config.auto_quantization), else none (a GPU dequantizes GGUF blocks and
    keeps a GPTQ / AWQ / FP8 checkpoint's own weights, float weights load as they are); other modes as given."""
    if mode != "auto":
        return mode
    resolved = auto_resolved(device, weights)
    if hasattr(weights, "matrix_types"):  # a GGUF file
        log.info("--quantization auto: %s", "the GGUF blocks kept for the CPU kernels" if resolved == "gguf" else
                 "the GGUF tensors dequantized to the model's dtype at load (--quantization none)")
    return resolved


def auto_resolved(device: torch.device, weights) -> str:
    """What --quantization auto becomes for this device and checkpoint (``resolve_quantization`` without its log
    line)."""
    from engine.config import auto_quantization

    matrix_types = getattr(weights, "matrix_types", None)  # GGUFWeights
    return auto_quantization(device.type, matrix_types() if matrix_types is not None else None, ops.native_available())


def check_quantization(device: torch.device, mode: str) -> None:
    """--quantization int8 | int4 | fp8: int8 anywhere, int4 and fp8 on a GPU, fp8 with fp8 support (sm_89+)."""
    from engine.errors import KestrelError

    if device.type == "cpu" and mode != "int8":
        raise KestrelError(f"--quantization {mode} runs on the GPU kernels; on the CPU use int8 (or gguf for a .gguf "
                           "file's blocks)")
    if mode == "fp8" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise KestrelError("--quantization fp8 needs FP8 tensor cores (compute capability 8.9+: RTX 40-series, "
                           "RTX 6000 Ada, L40, H100); use int8 or int4 on this GPU")


def resolve_kv_cache_dtype(mode: str, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype as a torch dtype: auto -> the model's dtype; fp8 -> float8_e4m3fn, on a GPU with fp8
    conversions in the prefill attention kernel (Triton's e4m3 needs compute capability 8.9+). Raises KestrelError
    for fp8 on the CPU (its native kernels read caches in the model dtype only) or an older GPU."""
    from engine.errors import KestrelError

    if mode in ("auto", None):
        return dtype
    if mode != "fp8":
        raise KestrelError(f"--kv-cache-dtype must be auto or fp8, got {mode!r}")
    if device.type != "cuda":
        raise KestrelError("fp8 KV cache needs a GPU; the CPU keeps the KV cache in the model dtype "
                           "(load with --kv-cache-dtype auto)")
    if torch.cuda.get_device_capability(device) < (8, 9):
        raise KestrelError("--kv-cache-dtype fp8 needs a GPU with fp8 support (compute capability 8.9+: RTX 40-series, "
                           "RTX 6000 Ada, L40, H100); load with --kv-cache-dtype auto on this GPU")
    return torch.float8_e4m3fn


def check_kv_cache_dtype_for_model(mode: str, model_config) -> None:
    """--kv-cache-dtype fp8 against the model, at load: multi-head latent attention (DeepSeek-V2/V3, kv_lora_rank
    set) keeps its latent cache in the model's dtype (engine/layers/mla.py), so fp8 is refused before the weights
    load rather than at the first forward step."""
    from engine.errors import KestrelError

    if mode == "fp8" and getattr(model_config, "kv_lora_rank", 0):
        raise KestrelError(f"--kv-cache-dtype fp8 is not supported for {model_config.architecture}: its multi-head "
                           "latent attention keeps the KV cache (one compressed latent row per token, already ~9x "
                           "smaller than full keys and values) in the model's dtype; load with --kv-cache-dtype auto")


def check_gguf_blocks(device: torch.device, weights) -> None:
    """--quantization gguf keeps a GGUF file's blocks for the native CPU kernels (engine/ops/gguf_quant.py)."""
    from engine.errors import KestrelError

    if device.type != "cpu":
        raise KestrelError("--quantization gguf keeps GGUF blocks for the CPU kernels; on a GPU load with "
                           "--quantization auto or none (the blocks are dequantized)")
    if not hasattr(weights, "keep_quantized"):
        raise KestrelError("--quantization gguf needs a .gguf checkpoint; this one has float weights")
    if not ops.native_available():
        raise KestrelError("--quantization gguf needs Kestrel's native CPU kernels (engine._C); build them with "
                           "`pip install -e .`")


def check_deterministic(device: torch.device, tp: TPContext) -> None:
    """--deterministic covers the native CPU kernels of one process."""
    from engine.errors import KestrelError

    if device.type != "cpu":
        raise KestrelError("--deterministic makes the CPU kernels batch-invariant; on a GPU load without it "
                           "(or with --device cpu)")
    if tp.size > 1:
        raise KestrelError("--deterministic runs with --tensor-parallel-size 1 (the all-reduce strategies are not "
                           "batch-invariant)")
    if not ops.native_available():
        raise KestrelError("--deterministic needs Kestrel's native CPU kernels (engine._C); build them with "
                           "`pip install -e .`")


def check_expert_split(config, checkpoint, device: torch.device, size: int) -> None:
    """A tensor-parallel size against a GGUF file's expert blocks, before any worker process starts (TPExecutor):
    where this load keeps the experts as blocks (--quantization gguf, or auto, on the CPU with the native kernels),
    each rank's slice of the experts' down projections must be whole blocks (engine/expert_blocks.py:
    Qwen3-30B-A3B's 768-wide Q4_K experts split over 1 or 3 ranks, not 2). Raises
    ModelLoadError with the message a rank's load would give (engine/layers/moe_gguf.py): the sizes that split and
    --quantization none."""
    from engine.errors import ModelLoadError
    from engine.expert_blocks import EXPERT_DOWN_SUFFIX, kept_block, refusal, refusal_growth, splits_on_blocks
    from engine.runner.device import resolve_dtype

    weights = checkpoint.weights
    tensors = getattr(getattr(weights, "file", None), "tensors", None)
    mode = config.quantization
    kept = device.type == "cpu" and ops.native_available() and (
        mode == "gguf" or (mode == "auto" and auto_resolved(device, weights) == "gguf"))
    if size < 2 or tensors is None or not kept:
        return
    downs = [info for name, info in tensors.items() if name.endswith(EXPERT_DOWN_SUFFIX) and len(info.shape) == 3]
    found = kept_block(info.type_name for info in downs)
    if found is None:
        return
    type_name, block = found
    width = downs[0].shape[-1]  # torch order: [experts, hidden, the experts' width]
    if splits_on_blocks(width, size, block):
        return
    dtype = resolve_dtype(config.dtype, device, checkpoint.config.torch_dtype)
    raise ModelLoadError(refusal(str(weights.path), type_name, block, width, size,
                                 refusal_growth(type_name, dtype.itemsize), str(dtype).removeprefix("torch.")))

