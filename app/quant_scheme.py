"""A pre-quantized Hugging Face checkpoint's quantization in words, from its config.json's quantization_config,
without torch: the name the engine gives it ("GPTQ int4 g128", "AWQ int4 g128", "FP8 block 128x128") or, when the
engine cannot load it, why (in plain words, with what it does load).

A mirror of engine/loader/quantized.py's ``parse_scheme`` rules (that module imports torch, and so does anything
under engine.loader; the app's process must not): tests/app/test_model_data.py checks that the two agree on what
they accept and on the names.

``complete=False`` reads the Hub's summary of a config (``model_info().config``), which may leave fields out: a
field that is not there is then not known rather than its default, so it neither names a group size nor refuses.
"""

from __future__ import annotations

from typing import Any

FP8_BLOCK = 128  # engine.weight_quant.FP8_BLOCK
SUPPORTED = ("GPTQ (4 or 8 bits), AWQ (4 bits, GEMM layout) and FP8 checkpoints (per tensor, per channel or "
             f"{FP8_BLOCK}x{FP8_BLOCK} blocks, llm-compressor's compressed-tensors FP8 included)")
_ADVICE = f"Kestrel loads {SUPPORTED}; use the unquantized model or a GGUF file."
_LABELS = {"gptq": "GPTQ", "awq": "AWQ", "fp8": "FP8", "compressed-tensors": "compressed-tensors",
           "bitsandbytes": "bitsandbytes", "hqq": "HQQ", "eetq": "EETQ", "aqlm": "AQLM", "quanto": "Quanto",
           "exl2": "EXL2", "torchao": "torchao", "mxfp4": "MXFP4", "bitnet": "BitNet", "higgs": "HIGGS",
           "vptq": "VPTQ", "fbgemm_fp8": "FBGEMM FP8"}


class _Refused(Exception):
    """Why a config cannot be loaded; its message finishes "This <label> checkpoint cannot be loaded: ..."."""


def describe_quantization(qc: Any, complete: bool = True) -> tuple[str | None, str | None]:
    """``(name, None)`` for a quantization the engine loads (``name`` is engine.loader.quantized's
    QuantScheme.name); ``(label, reason)`` for one it refuses (``label``: the method, e.g. "GPTQ",
    "bitsandbytes"); ``(None, None)`` for plain float weights (no quantization_config naming a quant_method, as
    the engine's loader reads it)."""
    if not isinstance(qc, dict) or not qc.get("quant_method"):
        return None, None
    method = str(qc["quant_method"]).lower()
    label = _LABELS.get(method, str(qc["quant_method"]))
    parse = {"gptq": _gptq, "awq": _awq, "fp8": _fp8, "compressed-tensors": _compressed}.get(method)
    if parse is None:
        return label, f"{label}-quantized checkpoints cannot be loaded. {_ADVICE}"
    try:
        return parse(qc, complete), None
    except _Refused as e:
        return label, f"This {label} checkpoint cannot be loaded: {e}. {_ADVICE}"


def quantization_method(name: str | None) -> str | None:
    """The method of a name from describe_quantization: "GPTQ", "AWQ" or "FP8" (compressed-tensors FP8 is FP8)."""
    return name.split()[0] if name else None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bits(bits: Any) -> str:
    return "its config gives no number of bits" if bits is None else f"it has {bits}-bit weights"


def _groups(qc: dict, complete: bool, *keys: str) -> str:
    """" g128" / " per-channel" (the engine's -1, and its default when the config names none) / "" (not known)."""
    key = next((k for k in keys if k in qc), None)
    if key is None:
        return " per-channel" if complete else ""
    group = qc[key]
    if not _int(group) or not (group == -1 or group > 0):
        raise _Refused(f"its group size ({key} {group}) is neither a positive number nor -1 (one group per "
                       "output channel)")
    return " per-channel" if group == -1 else f" g{group}"


def _gptq(qc: dict, complete: bool) -> str:
    bits = qc.get("bits")
    if (complete or "bits" in qc) and (bits not in (4, 8) or not _int(bits)):
        raise _Refused(f"{_bits(bits)} (GPTQ loads with 4 or 8)")
    fmt = str(qc.get("checkpoint_format") or "gptq").lower()
    if qc.get("is_marlin_format"):
        fmt = "marlin"
    if fmt not in ("gptq", "gptq_v2"):
        raise _Refused(f"its weights are packed in the {fmt} layout (GPTQ loads in its own gptq / gptq_v2 "
                       "layouts, not Marlin's repacked one)")
    groups = _groups(qc, complete, "group_size")
    width = f" int{bits}" if "bits" in qc else ""
    return f"GPTQ{width}{groups}" + (" act-order" if qc.get("desc_act") else "")


def _awq(qc: dict, complete: bool) -> str:
    known = "bits" in qc or "w_bit" in qc
    bits = qc.get("bits", qc.get("w_bit"))
    if (complete or known) and (bits != 4 or not _int(bits)):
        raise _Refused(f"{_bits(bits)} (AWQ loads with 4)")
    layout = "llm-awq" if qc.get("backend") == "llm-awq" else str(qc.get("version") or qc.get("format") or "gemm")
    if layout.lower() != "gemm":
        raise _Refused(f"its weights are packed in the {layout} layout (AWQ loads in AutoAWQ's default GEMM "
                       "layout; gemv, marlin, exllama and llm-awq pack the weights differently)")
    if not qc.get("zero_point", True):
        raise _Refused("it has no zero points (AWQ loads with zero points)")
    return f"AWQ{' int4' if known else ''}{_groups(qc, complete, 'group_size', 'q_group_size')}"


def _fp8(qc: dict, complete: bool) -> str:
    if str(qc.get("fmt", "e4m3")).lower() != "e4m3":
        raise _Refused(f"its values are {qc.get('fmt')} (FP8 loads as e4m3)")
    if qc.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
        raise _Refused(f"its activation scheme is {qc.get('activation_scheme')} (FP8 loads with dynamic or static)")
    if "weight_block_size" not in qc and not complete:
        return "FP8"
    block = qc.get("weight_block_size")
    if block is None:
        return "FP8 per-tensor"
    if not isinstance(block, (list, tuple)) or list(block) != [FP8_BLOCK, FP8_BLOCK]:
        raise _Refused(f"its weights are scaled in {block} blocks (FP8 loads with one scale per tensor or per "
                       f"{FP8_BLOCK}x{FP8_BLOCK} block)")
    return f"FP8 block {FP8_BLOCK}x{FP8_BLOCK}"


_CT_OK = ("compressed-tensors loads FP8 weights (float-quantized, 8-bit float, scaled per tensor, per channel or "
          f"per {FP8_BLOCK}x{FP8_BLOCK} block), not yet integer ones (pack-quantized W4A16 / W8A16)")


def _compressed(qc: dict, complete: bool) -> str:
    groups = qc.get("config_groups")
    if "config_groups" not in qc and not complete:
        return "compressed-tensors"  # the Hub left the scheme out: known once the config.json is read
    if not isinstance(groups, dict) or not groups:
        raise _Refused(f"its config names no quantization groups (config_groups); {_CT_OK}")
    strategies = set()
    for key, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        fmt = (group.get("format") or qc.get("format")) if isinstance(group, dict) else None
        if fmt not in ("float-quantized", "naive-quantized"):
            raise _Refused(f"its group {key} is in the {fmt} format; {_CT_OK}")
        if not isinstance(weights, dict) or (weights.get("num_bits"), weights.get("type")) != (8, "float"):
            what = "no weights" if not isinstance(weights, dict) else \
                f"{weights.get('num_bits')}-bit {weights.get('type')} weights"
            raise _Refused(f"its group {key} has {what}; {_CT_OK}")
        strategy = weights.get("strategy")
        structure = weights.get("block_structure")
        if strategy not in ("tensor", "channel", "block") or (strategy == "block" and (
                not isinstance(structure, (list, tuple)) or list(structure) != [FP8_BLOCK, FP8_BLOCK])):
            what = f"blocks of {structure}" if strategy == "block" else f"strategy {strategy}"
            raise _Refused(f"its group {key} scales the weights by {what}; {_CT_OK}")
        strategies.add(strategy)
    if len(strategies) > 1:
        raise _Refused(f"its groups scale the weights differently ({', '.join(sorted(strategies))}); one strategy "
                       "for all groups loads")
    strategy = strategies.pop()
    return {"tensor": "FP8 per-tensor", "channel": "FP8 per-channel"}.get(strategy,
                                                                            f"FP8 block {FP8_BLOCK}x{FP8_BLOCK}")
