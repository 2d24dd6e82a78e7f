"""Checkpoint loading: ``load_checkpoint(model)`` -> a Checkpoint with the config, the tokenizer and lazy
tensors under Hugging Face names, from the embedded default GGUF, a .gguf file, a Hugging Face directory
(single or sharded safetensors) or a repo id in the local Hugging Face cache.

Every problem surfaces as a typed engine.errors exception whose message names the file:
ModelNotFoundError (nothing there), CheckpointError (corrupt/truncated file, missing shard or tensor,
wrong shape, unsupported quantization), UnsupportedArchitectureError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint_json import read_json
from engine.config import ModelConfig
from engine.errors import CheckpointError, KestrelError, UnsupportedArchitectureError
from engine.loader.gguf import GGUFWeights, gguf_hf_config, gguf_quantization
from engine.loader.gguf_file import GGUFFile
from engine.loader.mxfp4 import Mxfp4Weights, is_mxfp4
from engine.loader.quantized import QuantizedWeights, parse_scheme
from engine.loader.resolve import default_model_path, resolve_model
from engine.loader.safetensors import SafetensorsWeights
from engine.loader.weights import WeightSource, expected_shapes, validate_weights
from engine.tokenizer import Tokenizer

__all__ = [
    "Checkpoint",
    "WeightSource",
    "default_model_path",
    "expected_shapes",
    "load_checkpoint",
    "resolve_model",
    "validate_weights",
]


@dataclass
class Checkpoint:
    path: Path  # the .gguf file or the model directory
    format: str  # "safetensors" | "gguf"
    config: ModelConfig
    hf_config: dict[str, Any]  # config.json, or its equivalent built from GGUF metadata
    generation_config: dict[str, Any]  # generation_config.json (temperature, top_p, ...) or {}
    weights: WeightSource
    tokenizer: Tokenizer
    quantization: str | None = None  # GGUF: "Q4_1", "Q4_K_M", ...; "GPTQ int4 g128", "FP8 block 128x128", ...

    @property
    def name(self) -> str:
        """A display name: the directory or file name (without .gguf)."""
        return self.path.name.removesuffix(".gguf")


def load_checkpoint(model: str | Path | None = None, *, validate: bool = True) -> Checkpoint:
    """Open a model (see the module doc); with ``validate`` every tensor name and shape is checked
    against the config up front. Tensors are read lazily through ``checkpoint.weights``."""
    path = resolve_model(model)
    if path.is_file():
        return _load_gguf(path, validate)
    return _load_safetensors_dir(path, validate)


def _config_from_hf(hf_config: dict[str, Any], path: Path) -> ModelConfig:
    try:
        return ModelConfig.from_hf(hf_config)
    except UnsupportedArchitectureError as e:
        e.args = (f"{path}: {e}",)
        raise
    except KestrelError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        what = f"lacks {e}" if isinstance(e, KeyError) else f"has an invalid value ({e})"
        raise CheckpointError(path, f"{what}; cannot build the model config") from None


def _load_safetensors_dir(path: Path, validate: bool) -> Checkpoint:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(path, "has no config.json")
    hf_config = read_json(config_file)
    qc = hf_config.get("quantization_config")
    scheme = None
    if isinstance(qc, dict) and qc.get("quant_method") and not is_mxfp4(qc):  # GPTQ / AWQ / FP8: quantized.py
        scheme = parse_scheme(qc, config_file)
    config = _config_from_hf(hf_config, config_file)
    gen_file = path / "generation_config.json"
    generation_config = read_json(gen_file) if gen_file.is_file() else {}
    stored = SafetensorsWeights(path)
    weights: WeightSource = stored if scheme is None else QuantizedWeights(
        stored, scheme, hf_config.get("torch_dtype") or hf_config.get("dtype"))
    if is_mxfp4(qc):  # gpt-oss's MXFP4 experts, dequantized at load (engine/loader/mxfp4.py)
        weights = Mxfp4Weights(stored, hf_config.get("torch_dtype") or hf_config.get("dtype"))
    if validate:
        validate_weights(weights, config, "config.json")
    tokenizer = Tokenizer.from_dir(path, generation_config=generation_config,
                                   extra_eos_token_ids=config.eos_token_ids)
    return Checkpoint(
        path=path, format="safetensors", config=config, hf_config=hf_config,
        generation_config=generation_config, weights=weights, tokenizer=tokenizer,
        quantization="MXFP4 experts (dequantized at load)" if is_mxfp4(qc) else None if scheme is None
        else scheme.name,
    )


def _load_gguf(path: Path, validate: bool) -> Checkpoint:
    gf = GGUFFile(path)
    try:
        hf_config = gguf_hf_config(gf)
    except UnsupportedArchitectureError as e:
        e.args = (f"{path}: {e}",)
        raise
    config = _config_from_hf(hf_config, path)
    weights = GGUFWeights(gf, config.num_attention_heads, config.num_key_value_heads)
    if validate:
        validate_weights(weights, config, "its GGUF metadata")
    tokenizer = Tokenizer.from_gguf(gf)
    gf.drop_tokenizer_arrays()  # the vocabulary's lists (~8 MiB of Python objects for 49k tokens): now in tokenizer
    return Checkpoint(
        path=path, format="gguf", config=config, hf_config=hf_config, generation_config={},
        weights=weights, tokenizer=tokenizer, quantization=gguf_quantization(gf),
    )
