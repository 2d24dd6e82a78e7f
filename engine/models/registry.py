"""Architecture name -> model class."""

from __future__ import annotations

from engine.config import SUPPORTED_ARCHITECTURES, ModelConfig
from engine.errors import UnsupportedArchitectureError
from engine.models.deepseek import DeepseekForCausalLM
from engine.models.gpt_oss import GptOssForCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.models.mixtral import MixtralForCausalLM
from engine.models.qwen_moe import QwenMoeForCausalLM

_MODELS = {arch: LlamaForCausalLM for arch in SUPPORTED_ARCHITECTURES}
_MODELS.update(MixtralForCausalLM=MixtralForCausalLM, Qwen2MoeForCausalLM=QwenMoeForCausalLM,
               Qwen3MoeForCausalLM=QwenMoeForCausalLM)
_MODELS.update(DeepseekV2ForCausalLM=DeepseekForCausalLM, DeepseekV3ForCausalLM=DeepseekForCausalLM)
_MODELS.update(GptOssForCausalLM=GptOssForCausalLM)


def model_class(cfg: ModelConfig):
    try:
        return _MODELS[cfg.architecture]
    except KeyError:
        raise UnsupportedArchitectureError(cfg.architecture, list(_MODELS)) from None
