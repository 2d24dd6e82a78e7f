"""MXFP4 expert weights (gpt-oss's released checkpoints: quantization_config ``quant_method: "mxfp4"``), dequantized at
load to the compute dtype (the CPU path: no MXFP4 kernel runs here).

The format (OCP Microscaling, FP4 E2M1 elements, E8M0 scales, blocks of 32 along the input dimension K), as the
checkpoints store a [E, N, K] expert stack (N output rows, K inputs):
- ``<name>_blocks`` uint8 [E, N, K / 32, 16]: two FP4 codes a byte, element 2i in the low nibble of byte i and
  element 2i + 1 in the high one; a code is sign (bit 3), exponent (bits 2-1, bias 1) and one mantissa bit (bit 0),
  i.e. the values of ``FP4_VALUES``.
- ``<name>_scales`` uint8 [E, N, K / 32]: the block's power of two, 2^(s - 127).

``Mxfp4Weights`` wraps the directory's SafetensorsWeights and shows each such pair under the Hugging Face float name
``<name>`` in transformers' layout [E, K, N] (GptOssExperts.gate_up_proj [E, hidden, 2 * intermediate], down_proj
[E, intermediate, hidden]); ``get`` / ``get_slice`` return it dequantized (computed in float32, where every MXFP4
value is exact, and rounded once to ``compute_dtype``: the checkpoint's torch_dtype until the model runner sets the
engine's). Every other tensor passes through as stored.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from engine.loader.safetensors import SafetensorsWeights
from engine.loader.weights import WeightSource

log = logging.getLogger(__name__)

MXFP4_METHOD = "mxfp4"
BLOCK = 32  # elements per scale
SCALE_BIAS = 127  # E8M0: 2^(s - 127)
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"
# FP4 E2M1 by code (bit 3: sign; then 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def is_mxfp4(quantization_config: Any) -> bool:
    """Whether a config.json's quantization_config names MXFP4 (gpt-oss's released checkpoints)."""
    return (isinstance(quantization_config, dict)
            and str(quantization_config.get("quant_method", "")).lower() == MXFP4_METHOD)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks uint8 [..., G, 16] and scales uint8 [..., G] -> [..., G * 32] in ``dtype`` (the stored layout: the
    last dimension is K). Computed in float32 (exact: a code times a power of two), then rounded once."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)} "
                         f"(blocks [..., G, {BLOCK // 2}], scales [..., G])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()  # [..., G, 32], element order
    values = lut[codes]
    exponent = scales.to(torch.int32) - SCALE_BIAS
    values = torch.ldexp(values, exponent.unsqueeze(-1))
    return values.flatten(-2).to(dtype)


class Mxfp4Weights(WeightSource):
    """A checkpoint whose ``*_blocks`` / ``*_scales`` pairs read as float tensors (the module doc)."""

    def __init__(self, stored: SafetensorsWeights, checkpoint_dtype: str | None):
        self.stored = stored
        self.path = stored.path
        self.compute_dtype = _DTYPES.get(str(checkpoint_dtype), torch.bfloat16)  # the runner sets the engine's
        names = stored.names()
        present = set(names)
        self.packed = {n.removesuffix(BLOCKS_SUFFIX) for n in names
                       if n.endswith(BLOCKS_SUFFIX) and n.removesuffix(BLOCKS_SUFFIX) + SCALES_SUFFIX in present}
        hidden = {p + s for p in self.packed for s in (BLOCKS_SUFFIX, SCALES_SUFFIX)}
        self._names = [n for n in names if n not in hidden] + sorted(self.packed)
        self._announced = False

    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self.packed or (name in self.stored and not name.endswith((BLOCKS_SUFFIX, SCALES_SUFFIX)))

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.packed:
            return self.stored.shape(name)
        *lead, n, groups, half = self.stored.shape(name + BLOCKS_SUFFIX)
        return (*lead, groups * half * 2, n)  # transformers' [E, K, N]

    def dtype(self, name: str) -> torch.dtype:
        return self.compute_dtype if name in self.packed else self.stored.dtype(name)

    def get(self, name: str) -> torch.Tensor:
        if name not in self.packed:
            return self.stored.get(name)
        if not self._announced:
            self._announced = True
            packed = sum(math.prod(self.stored.shape(p + BLOCKS_SUFFIX)) for p in self.packed)
            log.info("MXFP4 checkpoint: %d expert tensors (%.2f GiB of 4-bit codes) dequantized to %s at load (no "
                     "MXFP4 kernel on this path: %dx their size in memory)", len(self.packed), packed / 2**30,
                     str(self.compute_dtype).removeprefix("torch."), torch.finfo(self.compute_dtype).bits // 4)
        w = dequantize_mxfp4(self.stored.get(name + BLOCKS_SUFFIX), self.stored.get(name + SCALES_SUFFIX),
                             self.compute_dtype)
        return w.transpose(-1, -2).contiguous()  # [E, N, K] -> transformers' [E, K, N]

    def get_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        if name not in self.packed:
            return self.stored.get_slice(name, dim, start, stop)
        self._check_slice(name, dim, start, stop)
        return self.get(name).narrow(dim, start, stop - start).contiguous()

    def close(self) -> None:
        self.stored.close()
