"""A pre-quantized Hugging Face checkpoint's quantization in words, from its config.json's quantization_config,
without torch: the name the engine gives it ("GPTQ int4 g128", "AWQ int4 g128", "FP8 block 128x128") or, when the
engine cannot load it, why (in plain words, with what it does load).

The rules are the engine's own, engine/quant_scheme.py (torch-free, unlike engine.loader). What is the app's is
``complete=False``: the Hub's summary of a config (``model_info().config``) may leave fields out, and a field that
is not there is then not known rather than its default, so it neither names a group size nor refuses.
"""

from __future__ import annotations

from typing import Any

from engine.quant_scheme import FP8_BLOCK, SchemeError, parse_scheme

SUPPORTED = ("GPTQ (4 or 8 bits), AWQ (4 bits, GEMM layout) and FP8 checkpoints (per tensor, per channel or "
             f"{FP8_BLOCK}x{FP8_BLOCK} blocks, llm-compressor's compressed-tensors FP8 included)")
_ADVICE = f"Kestrel loads {SUPPORTED}; use the unquantized model or a GGUF file."
_LABELS = {"gptq": "GPTQ", "awq": "AWQ", "fp8": "FP8", "compressed-tensors": "compressed-tensors",
           "bitsandbytes": "bitsandbytes", "hqq": "HQQ", "eetq": "EETQ", "aqlm": "AQLM", "quanto": "Quanto",
           "exl2": "EXL2", "torchao": "torchao", "mxfp4": "MXFP4", "bitnet": "BitNet", "higgs": "HIGGS",
           "vptq": "VPTQ", "fbgemm_fp8": "FBGEMM FP8"}
# The Hub's summary may leave out a field that the name depends on (or that the engine refuses when missing):
# method -> (the field's keys, a value that parses, the part of the name that value gives, dropped again).
_UNKNOWN = {"gptq": ((("bits",), 4, " int4"), (("group_size",), -1, " per-channel")),
            "awq": ((("bits", "w_bit"), 4, " int4"), (("group_size", "q_group_size"), -1, " per-channel")),
            "fp8": ((("weight_block_size",), None, " per-tensor"),)}


def describe_quantization(qc: Any, complete: bool = True) -> tuple[str | None, str | None]:
    """``(name, None)`` for a quantization the engine loads (``name``: engine.quant_scheme's QuantScheme.name);
    ``(label, reason)`` for one it refuses (``label``: the method, e.g. "GPTQ", "bitsandbytes"); ``(None, None)``
    for plain float weights (no quantization_config naming a quant_method, as the engine's loader reads it)."""
    if not isinstance(qc, dict) or not qc.get("quant_method"):
        return None, None
    method = str(qc["quant_method"]).lower()
    label = _LABELS.get(method, str(qc["quant_method"]))
    if not complete and method == "compressed-tensors" and "config_groups" not in qc:
        return "compressed-tensors", None  # the Hub left the scheme out: known once the config.json is read
    filled = [(keys, value, part) for keys, value, part in _UNKNOWN.get(method, ()) if not complete
              and not any(k in qc for k in keys)]
    try:
        name = parse_scheme({**qc, **{keys[0]: value for keys, value, _ in filled}}).name
    except SchemeError as e:
        if e.field == "quant_method":
            return label, f"{label}-quantized checkpoints cannot be loaded. {_ADVICE}"
        return label, f"This {label} checkpoint cannot be loaded: {e}. {_ADVICE}"
    for _, _, part in filled:
        name = name.replace(part, "")
    return name, None


def quantization_method(name: str | None) -> str | None:
    """The method of a name from describe_quantization: "GPTQ", "AWQ" or "FP8" (compressed-tensors FP8 is FP8)."""
    return name.split()[0] if name else None
