"""Load checks of MoE / MLA models that refuse up front (issue 48): a tensor-parallel size that does not divide an
expert width, a shared expert's or the dense layers' width, or DeepSeek's heads (engine.executor.tp_executor
check_tp_size, run before any rank builds the model), and --kv-cache-dtype fp8 with multi-head latent attention
(engine.runner.load_checks, run by ModelRunner before the weights load). No engine is built."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, ModelConfig
from engine.errors import KestrelError, ModelLoadError
from engine.executor.tp_executor import check_tp_size

# DeepSeek-V2-Lite's config.json (as tests/unit/test_mla.py writes it)
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 102400, "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "topk_method": "greedy"}
QWEN2_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 256, "hidden_size": 64,
             "intermediate_size": 128, "moe_intermediate_size": 96, "shared_expert_intermediate_size": 36,
             "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "num_experts": 4,
             "num_experts_per_tok": 2}
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 256, "hidden_size": 64, "head_dim": 16,
             "intermediate_size": 512, "moe_intermediate_size": 36, "num_hidden_layers": 2,
             "num_attention_heads": 8, "num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2}


def test_tp_size_refused_for_a_width_it_does_not_divide():
    qwen3 = ModelConfig.from_hf(QWEN3_MOE)  # its dense intermediate_size (512) divides by 8, the experts' 36 not
    check_tp_size(qwen3, 4)
    with pytest.raises(ModelLoadError, match=r"tensor_parallel_size=8 does not divide the model's expert width "
                                             r"\(moe_intermediate_size\) 36$"):
        check_tp_size(qwen3, 8)
    qwen2 = ModelConfig.from_hf(QWEN2_MOE)  # experts 96 and dense 128 divide by 8, the shared expert's 36 not
    check_tp_size(qwen2, 4)
    with pytest.raises(ModelLoadError, match=r"shared expert width \(shared_expert_intermediate_size\) 36$"):
        check_tp_size(qwen2, 8)
    # DeepSeek: the first layer's dense MLP (first_k_dense_replace) is split too
    deepseek = ModelConfig.from_hf({**DEEPSEEK_V2_LITE, "intermediate_size": 100, "moe_intermediate_size": 64})
    check_tp_size(deepseek, 4)
    with pytest.raises(ModelLoadError, match=r"does not divide the model's dense layers' intermediate size 100$"):
        check_tp_size(deepseek, 8)
    v2_lite = ModelConfig.from_hf(DEEPSEEK_V2_LITE)
    for size in (1, 2, 4, 8):
        check_tp_size(v2_lite, size)
    with pytest.raises(ModelLoadError, match="does not divide the model's 16 attention heads"):
        check_tp_size(v2_lite, 3)
    # a dense model: its intermediate size, as before
    dense = ModelConfig.from_hf({**QWEN3_MOE, "architectures": ["Qwen3ForCausalLM"], "num_experts": 0,
                                 "intermediate_size": 36})
    with pytest.raises(ModelLoadError, match=r"does not divide the model's intermediate size 36$"):
        check_tp_size(dense, 8)


def test_fp8_kv_cache_refused_at_load_for_latent_attention():
    from engine.runner.load_checks import check_kv_cache_dtype_for_model
    from engine.runner.model_runner import ModelRunner

    mla = ModelConfig.from_hf(DEEPSEEK_V2_LITE)
    check_kv_cache_dtype_for_model("auto", mla)
    check_kv_cache_dtype_for_model("fp8", ModelConfig.from_hf(QWEN3_MOE))  # full K and V: the device decides
    with pytest.raises(KestrelError, match="--kv-cache-dtype fp8 is not supported for DeepseekV2ForCausalLM: its "
                                           "multi-head latent attention"):
        check_kv_cache_dtype_for_model("fp8", mla)
    # ModelRunner refuses it first, before the device's checks and the weights (none given here)
    with pytest.raises(KestrelError, match="not supported for DeepseekV2ForCausalLM"):
        ModelRunner(EngineConfig(device="cpu", kv_cache_dtype="fp8"), mla, None, 64)
