"""Which pre-quantized Hugging Face checkpoints Kestrel loads: a config.json's quantization_config read into a
``QuantScheme`` (GPTQ, AWQ, FP8 and llm-compressor's compressed-tensors FP8), or a ``SchemeError`` naming the field
it cannot load. The one copy of these rules, without torch (standard library only): engine/loader/quantized.py
reads the weights by them (its ``parse_scheme`` turns a SchemeError into a CheckpointError), and the app's process
(which must not import torch) describes checkpoints by them (app/quant_scheme.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.constants import FP8_BLOCK

METHODS = ("gptq", "awq", "fp8", "compressed-tensors", "mxfp4")  # the quant_method values Kestrel loads
SUPPORTED = ('gptq (4 or 8 bits), awq (4 bits, version "gemm"), fp8 (per tensor or 128 x 128 blocks), '
             'compressed-tensors float-quantized FP8 (per tensor, channel or 128 x 128 block) and mxfp4 (gpt-oss '
             'experts, dequantized at load: engine/loader/mxfp4.py)')


class SchemeError(ValueError):
    """A quantization_config Kestrel cannot load. ``field``: the quantization_config field at fault (None when
    it is not one field); ``value``: what the config gives for it."""

    def __init__(self, message: str, field: str | None = None, value: Any = None):
        super().__init__(message)
        self.field, self.value = field, value


@dataclass(frozen=True)
class QuantScheme:
    """A config.json's quantization_config in Kestrel's terms."""
    method: str                    # "gptq" | "awq" | "fp8" | "mxfp4"
    bits: int = 8
    group: int = -1                # integer formats: K positions per group; -1: all of K (per output channel)
    act_order: bool = False        # GPTQ desc_act (the g_idx tensors then say each position's group)
    zero_offset: int = 0           # added to the stored zeros: 1 for GPTQ v1 checkpoints
    fp8_scale: str = ""            # "tensor" | "channel" | "block"
    scale_names: tuple[str, ...] = ()  # fp8: the scale tensor's suffixes, the first present is used

    @property
    def name(self) -> str:
        if self.method == "mxfp4":
            return "MXFP4 experts"
        if self.method == "fp8":
            return {"tensor": "FP8 per-tensor", "channel": "FP8 per-channel",
                    "block": f"FP8 block {FP8_BLOCK}x{FP8_BLOCK}"}[self.fp8_scale]
        groups = "per-channel" if self.group == -1 else f"g{self.group}"
        return f"{self.method.upper()} int{self.bits} {groups}" + (" act-order" if self.act_order else "")

    @property
    def default_dtype_name(self) -> str:
        """The compute dtype when config.json names none: "bfloat16" for FP8, "float16" for GPTQ / AWQ."""
        return "bfloat16" if self.method in ("fp8", "mxfp4") else "float16"


def _unsupported(field: str, value: Any, supported: str) -> SchemeError:
    return SchemeError(f"quantization_config.{field} = {value!r} is not supported; {supported}", field, value)


def _group_size(qc: dict, *keys: str) -> int:
    group = next((qc[k] for k in keys if k in qc), -1)
    if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or group > 0):
        raise _unsupported(keys[0], group, "a positive group size, or -1 for one group per output channel")
    return group


def _is_block(block: Any) -> bool:
    return isinstance(block, (list, tuple)) and list(block) == [FP8_BLOCK, FP8_BLOCK]


def parse_scheme(qc: Any) -> QuantScheme:
    """The scheme of a quantization_config; SchemeError naming the field when Kestrel cannot load it."""
    if not isinstance(qc, dict):
        raise SchemeError("quantization_config is not a JSON object")
    method = str(qc.get("quant_method", "")).lower()
    parse = {"gptq": _parse_gptq, "awq": _parse_awq, "fp8": _parse_fp8, "compressed-tensors": _parse_compressed,
             "mxfp4": lambda qc: QuantScheme("mxfp4", bits=4, group=32)}
    if method not in parse:
        raise _unsupported("quant_method", qc.get("quant_method"),
                           f"Kestrel loads {SUPPORTED}; use the unquantized model or a GGUF file")
    return parse[method](qc)


def _parse_gptq(qc: dict) -> QuantScheme:
    bits = qc.get("bits")
    if bits not in (4, 8) or isinstance(bits, bool):
        raise _unsupported("bits", bits, "GPTQ checkpoints of 4 or 8 bits are")
    fmt = str(qc.get("checkpoint_format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2") or qc.get("is_marlin_format"):
        raise _unsupported("checkpoint_format", "marlin" if qc.get("is_marlin_format") else fmt,
                           'GPTQ checkpoints in the "gptq" or "gptq_v2" layout are (not Marlin\'s repacked one)')
    return QuantScheme("gptq", bits, _group_size(qc, "group_size"), bool(qc.get("desc_act", False)),
                       zero_offset=1 if fmt == "gptq" else 0)


def _parse_awq(qc: dict) -> QuantScheme:
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4 or isinstance(bits, bool):
        raise _unsupported("bits", bits, "AWQ checkpoints of 4 bits are")
    layout = "llm-awq" if qc.get("backend") == "llm-awq" else str(qc.get("version") or qc.get("format") or "gemm")
    if layout.lower() != "gemm":
        raise _unsupported("version", layout, 'AWQ checkpoints in the "gemm" layout are (AutoAWQ\'s default; '
                           'the gemv / marlin / exllama / llm-awq layouts pack the weights differently)')
    if not qc.get("zero_point", True):
        raise _unsupported("zero_point", False, "AWQ checkpoints with zero points are")
    return QuantScheme("awq", 4, _group_size(qc, "group_size", "q_group_size"))


def _parse_fp8(qc: dict) -> QuantScheme:
    if str(qc.get("fmt", "e4m3")).lower() != "e4m3":
        raise _unsupported("fmt", qc.get("fmt"), "FP8 checkpoints of e4m3 values are")
    if qc.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
        raise _unsupported("activation_scheme", qc.get("activation_scheme"), '"dynamic" or "static" is')
    block = qc.get("weight_block_size")
    if block is None:
        return QuantScheme("fp8", fp8_scale="tensor", scale_names=("weight_scale", "weight_scale_inv"))
    if not _is_block(block):
        raise _unsupported("weight_block_size", block, f"[{FP8_BLOCK}, {FP8_BLOCK}] blocks or none "
                           "(per-tensor scales) are")
    return QuantScheme("fp8", fp8_scale="block", scale_names=("weight_scale_inv", "weight_scale"))


def _parse_compressed(qc: dict) -> QuantScheme:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise SchemeError("quantization_config (compressed-tensors) has no config_groups", "config_groups", groups)
    ok = ("compressed-tensors checkpoints of FP8 weights (format float-quantized, weights num_bits 8 type float, "
          "strategy tensor / channel / block [128, 128]) are; int-quantized ones (pack-quantized W4A16 / W8A16) "
          "are not yet")
    strategies = set()
    for key, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        fmt = (group.get("format") or qc.get("format")) if isinstance(group, dict) else None
        if fmt not in ("float-quantized", "naive-quantized"):
            raise _unsupported(f"config_groups.{key}.format", fmt, ok)
        if not isinstance(weights, dict) or (weights.get("num_bits"), weights.get("type")) != (8, "float"):
            what = None if not isinstance(weights, dict) else f"{weights.get('num_bits')}-bit {weights.get('type')}"
            raise _unsupported(f"config_groups.{key}.weights", what, ok)
        strategy = weights.get("strategy")
        if strategy not in ("tensor", "channel", "block") or (
                strategy == "block" and not _is_block(weights.get("block_structure"))):
            raise _unsupported(f"config_groups.{key}.weights.strategy", strategy
                               if strategy != "block" else f"block {weights.get('block_structure')}", ok)
        strategies.add(strategy)
    if len(strategies) > 1:
        raise _unsupported("config_groups", sorted(strategies), "one weight strategy for all groups is")
    return QuantScheme("fp8", fp8_scale=strategies.pop(), scale_names=("weight_scale",))
