"""engine/loader/gguf_deepseek.py on metadata alone (no file, no engine): the DeepseekV2/V3 config from each form of
the keys llama.cpp's converter writes, the defaults of the optional ones, the named error for a missing one, YaRN's
mscale, and kv_b_proj split and joined as the converter splits it. The end-to-end loads against transformers are
tests/engine/test_gguf_deepseek.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.errors import CheckpointError
from engine.loader.gguf_deepseek import deepseek2_config, join_kv_b, kv_b_parts, yarn_scaling
from engine.loader.gguf_file import GGUFTensorInfo

PATH = Path("model.gguf")
# DeepSeek-V2-Lite as a newer converter writes it (no q_lora_rank, one expert group, softmax gating absent)
V2_LITE = {"attention.kv_lora_rank": 512, "rope.dimension_count": 64, "attention.key_length": 576,
           "attention.value_length": 512, "attention.key_length_mla": 192, "attention.value_length_mla": 128,
           "leading_dense_block_count": 1, "feed_forward_length": 10944, "expert_feed_forward_length": 1408,
           "expert_count": 64, "expert_used_count": 6, "expert_shared_count": 2, "expert_weights_scale": 1.0,
           "expert_group_count": 1, "expert_group_used_count": 1}
# DeepSeek-V3 (sigmoid gating, 8 groups of which 4 are kept, q_lora_rank, renormalized and scaled weights)
V3 = {**V2_LITE, "attention.q_lora_rank": 1536, "expert_count": 256, "expert_used_count": 8, "expert_shared_count": 1,
      "expert_feed_forward_length": 2048, "expert_weights_scale": 2.5, "expert_weights_norm": True,
      "expert_gating_func": 2, "expert_group_count": 8, "expert_group_used_count": 4, "leading_dense_block_count": 3}


def _config(keys: dict) -> dict:
    cfg = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "num_attention_heads": 16,
           "num_key_value_heads": 1, "head_dim": 576}
    deepseek2_config(PATH, {f"deepseek2.{k}": v for k, v in keys.items()}, cfg)
    return cfg


def test_v2_lite_keys():
    cfg = _config(V2_LITE)
    assert cfg["architectures"] == ["DeepseekV2ForCausalLM"]
    assert (cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
            cfg["v_head_dim"], cfg["head_dim"], cfg["num_key_value_heads"]) == (None, 512, 128, 64, 128, 64, 16)
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_shared_experts"], cfg["moe_intermediate_size"],
            cfg["first_k_dense_replace"]) == (64, 6, 2, 1408, 1)
    assert (cfg["scoring_func"], cfg["topk_method"], cfg["norm_topk_prob"], cfg["routed_scaling_factor"]) == (
        "softmax", "greedy", False, 1.0)


def test_v3_keys_and_v2_groups():
    cfg = _config(V3)
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert (cfg["q_lora_rank"], cfg["scoring_func"], cfg["topk_method"], cfg["n_group"], cfg["topk_group"],
            cfg["norm_topk_prob"], cfg["routed_scaling_factor"], cfg["first_k_dense_replace"]) == (
        1536, "sigmoid", "noaux_tc", 8, 4, True, 2.5, 3)
    v2 = _config({**V3, "expert_gating_func": 1})  # DeepSeek-V2 (full): softmax, group-limited
    assert v2["architectures"] == ["DeepseekV2ForCausalLM"] and v2["topk_method"] == "group_limited_greedy"
    with pytest.raises(CheckpointError, match="expert_gating_func is 3"):  # sqrt-softplus (later models)
        _config({**V3, "expert_gating_func": 3})


def test_older_key_lengths_and_a_dense_file():
    old = {k: v for k, v in V2_LITE.items() if not k.endswith("_mla")}
    old.update({"attention.key_length": 192, "attention.value_length": 128})  # before key_length_mla existed
    cfg = _config(old)
    assert (cfg["qk_nope_head_dim"], cfg["v_head_dim"]) == (128, 128)
    dense = _config({k: v for k, v in V2_LITE.items() if not k.startswith("expert_")})
    assert "n_routed_experts" not in dense and dense["kv_lora_rank"] == 512


@pytest.mark.parametrize("key", ["attention.kv_lora_rank", "rope.dimension_count", "expert_used_count",
                                 "expert_feed_forward_length", "attention.value_length_mla"])
def test_a_missing_key_is_named(key):
    with pytest.raises(CheckpointError, match=f"lacks 'deepseek2.{key}'"):
        _config({k: v for k, v in V2_LITE.items() if k != key})


def test_yarn_mscale_from_the_log_multiplier():
    scaling = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}
    md = {"deepseek2.rope.scaling.yarn_log_multiplier": float(torch.tensor(0.1 * 0.707)),  # as float32 stores it
          "deepseek2.rope.scaling.yarn_beta_fast": 32.0}
    assert yarn_scaling(md, scaling) == {**scaling, "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32.0}
    assert yarn_scaling({}, scaling) == scaling


def test_kv_b_split_and_joined_as_the_converter_does():
    heads, nope, v, rank = 3, 4, 5, 6
    kv_b = torch.randn(heads * (nope + v), rank)
    # convert_hf_to_gguf.py: view [heads, nope + v, rank], split, k_b transposed to [heads, rank, nope]
    k_b, v_b = kv_b.view(heads, nope + v, rank).split([nope, v], dim=1)
    assert torch.equal(join_kv_b(k_b.transpose(1, 2), v_b), kv_b)
    info = lambda name, shape: GGUFTensorInfo(name, shape, 0, 0, 0)  # noqa: E731
    tensors = {f"blk.{i}.{name}": info(name, shape) for i in (0, 1) for name, shape in (
        ("attn_k_b.weight", (heads, rank, nope)), ("attn_v_b.weight", (heads, v, rank)))}
    tensors["blk.1.attn_kv_b.weight"] = info("kv", (heads * (nope + v), rank))  # both forms: attn_kv_b is read
    assert kv_b_parts(PATH, tensors) == {"model.layers.0.self_attn.kv_b_proj.weight": (
        "blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight", (heads * (nope + v), rank))}
    tensors["blk.0.attn_v_b.weight"] = info("v", (heads, v, rank + 1))
    with pytest.raises(CheckpointError, match="do not split one kv_b_proj"):
        kv_b_parts(PATH, tensors)
