"""The Load panel's fit arithmetic for MLA and MoE shapes (issue 48, app/fit.py): DeepSeek-V2/V3's KV cache counted
as the engine holds it (one latent row of kv_lora_rank + qk_rope_head_dim per token and layer, whole on every rank:
31,104 bytes a token for DeepSeek-V2-Lite in bf16, as tests/unit/test_mla.py asserts against 276,480 expanded),
and the TP sizes offered (fit.tp_sizes, the Load panel's list) limited to those that divide every split width."""

from __future__ import annotations

from app import fit
from tests.unit.test_tp_and_kv_load_checks import DEEPSEEK_V2_LITE, QWEN2_MOE, QWEN3_MOE


def test_deepseek_v2_lite_kv_bytes_are_the_latent_rows():
    shape = fit.ModelShape.from_hf_config(DEEPSEEK_V2_LITE)
    assert shape.kv_latent_size == 512 + 64
    for tp in (1, 2, 4):
        assert shape.kv_bytes_per_token(2, tp) == 27 * 576 * 2 == 31_104
    est = fit.estimate(10 * fit.GIB, shape, 8192, 1, "bfloat16", 24 * fit.GIB)
    assert est.kv_cache == 31_104 * 8192
    # the same shape from a GGUF file's llama.cpp keys
    md = {"general.architecture": "deepseek2", "deepseek2.block_count": 27, "deepseek2.embedding_length": 2048,
          "deepseek2.attention.head_count": 16, "deepseek2.attention.head_count_kv": 16,
          "deepseek2.attention.key_length": 192, "deepseek2.attention.kv_lora_rank": 512,
          "deepseek2.rope.dimension_count": 64, "deepseek2.expert_count": 64,
          "deepseek2.expert_feed_forward_length": 1408, "deepseek2.feed_forward_length": 10944}
    assert fit.ModelShape.from_gguf_metadata(md, 102400).kv_bytes_per_token(2) == 31_104
    # a model with full K and V is unchanged: 2 x layers x KV heads per rank x head size x bytes
    qwen = fit.ModelShape.from_hf_config(QWEN3_MOE)
    assert qwen.kv_latent_size is None and qwen.kv_bytes_per_token(2, 2) == 2 * 2 * 2 * 16 * 2


def test_tp_sizes_leave_out_sizes_a_split_width_refuses():
    qwen3 = fit.ModelShape.from_hf_config(QWEN3_MOE)  # experts 36 wide
    assert fit.tp_sizes(8, qwen3) == [1, 2, 4]
    assert fit.tp_misfit(8, qwen3) == "its expert width (36) does not divide by 8"
    qwen2 = fit.ModelShape.from_hf_config(QWEN2_MOE)  # experts 96, the shared expert 36
    assert fit.tp_sizes(8, qwen2) == [1, 2, 4] and fit.tp_choices(8, qwen2) == [1, 2, 4]
    assert fit.tp_misfit(8, qwen2) == "its shared expert width (36) does not divide by 8"
    deepseek = fit.ModelShape.from_hf_config({**DEEPSEEK_V2_LITE, "intermediate_size": 100,
                                              "moe_intermediate_size": 64})  # the first layer's dense MLP: 100
    assert fit.tp_sizes(8, deepseek) == [1, 2, 4]
    assert fit.tp_misfit(8, deepseek) == "its dense MLP width (100) does not divide by 8"
    assert fit.tp_sizes(8, fit.ModelShape.from_hf_config(DEEPSEEK_V2_LITE)) == [1, 2, 4, 8]  # 16 heads
