"""Architecture name -> model class."""

from __future__ import annotations

from engine.config import SUPPORTED_ARCHITECTURES, ModelConfig
from engine.errors import UnsupportedArchitectureError
from engine.models.llama import LlamaForCausalLM

_MODELS = {arch: LlamaForCausalLM for arch in SUPPORTED_ARCHITECTURES}


def model_class(cfg: ModelConfig):
    try:
        return _MODELS[cfg.architecture]
    except KeyError:
        raise UnsupportedArchitectureError(cfg.architecture, list(_MODELS)) from None
