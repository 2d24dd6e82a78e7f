"""DeepSeek-V2 / V3 GGUF files: llama.cpp's ``deepseek2`` architecture (V3, and models built like it, are written
under the same name with sigmoid expert gating). The Hugging Face config (DeepseekV2Config / DeepseekV3Config keys)
from the metadata llama.cpp's converter writes, and the tensor names it gives.

The converter (convert_hf_to_gguf.py, DeepseekV2Model) writes, beside the usual keys:

- ``attention.kv_lora_rank``, ``attention.q_lora_rank`` (absent: no q bottleneck, as V2-Lite), ``rope.dimension_count``
  (qk_rope_head_dim), ``attention.head_count_kv`` 1 (MLA as MQA: ignored here, every head has its own keys);
  newer files ``attention.key_length_mla`` / ``value_length_mla`` (qk_nope + qk_rope, v_head_dim) with key_length /
  value_length the latent's widths (kv_lora_rank + qk_rope, kv_lora_rank), older ones key_length / value_length only
  (qk_nope + qk_rope, v_head_dim);
- ``leading_dense_block_count`` (first_k_dense_replace), ``expert_feed_forward_length``, ``expert_count``,
  ``expert_used_count``, ``expert_shared_count``, ``expert_weights_scale`` (routed_scaling_factor, absent: 1),
  ``expert_weights_norm`` (norm_topk_prob, absent: false), ``expert_gating_func`` (1 softmax, 2 sigmoid; absent:
  softmax, as llama.cpp reads V2 files written before the key), ``expert_group_count`` / ``expert_group_used_count``
  (n_group / topk_group);
- YaRN: ``rope.scaling.type`` / ``factor`` / ``original_context_length`` and ``rope.scaling.yarn_log_multiplier`` =
  0.1 x mscale_all_dim (llama.cpp takes mscale = mscale_all_dim, as DeepSeek's own configs have them).

Routing as transformers runs it (engine/layers/moe.py): sigmoid gating is DeepseekV3ForCausalLM (noaux_tc: the
correction bias ``exp_probs_b``, a group's score the sum of its best two); softmax is DeepseekV2ForCausalLM,
group-limited (a group's score its best expert) when the file has more than one expert group.

Tensors: no q/k row permutation (llama.cpp permutes llama-arch files only). ``attn_kv_b`` (older files) is
kv_b_proj; newer files split it for the absorbed form into ``attn_k_b`` ([heads, kv_lora_rank, qk_nope]: each head's
key rows transposed) and ``attn_v_b`` ([heads, v_head_dim, kv_lora_rank]): ``join_kv_b`` puts kv_b_proj back together.
The shared experts are ``ffn_*_shexp`` (mlp.shared_experts.*), the routed ones the usual 3-D ``ffn_*_exps``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.constants import GGUF_DEEPSEEK_V3_ARCHITECTURE
from engine.errors import CheckpointError
from engine.loader.gguf_file import GGUFTensorInfo

DEEPSEEK2 = "deepseek2"
SIGMOID_GATING = 2  # gguf.ExpertGatingFuncType.SIGMOID (1: SOFTMAX)

# blk.N.<part> -> model.layers.N.<name>, the parts that differ from the Llama / Qwen MoE names
BLOCK_NAMES = {
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
K_B, V_B = "attn_k_b.weight", "attn_v_b.weight"
KV_B_NAME = "model.layers.{}.self_attn.kv_b_proj.weight"


def deepseek2_config(path: Path, metadata: dict[str, Any], cfg: dict[str, Any]) -> None:
    """Complete ``cfg`` (gguf_hf_config's common keys) into a DeepseekV2/V3 config from a deepseek2 file's
    metadata; a CheckpointError naming the key when one the model needs is missing."""

    def md(key: str, default: Any = None) -> Any:
        return metadata.get(f"{DEEPSEEK2}.{key}", default)

    def need(key: str) -> Any:
        value = md(key)
        if value is None:
            raise CheckpointError(path, f"GGUF metadata lacks '{DEEPSEEK2}.{key}' (needed for DeepSeek's "
                                        "multi-head latent attention / experts)")
        return value

    rank, rope = int(need("attention.kv_lora_rank")), int(need("rope.dimension_count"))
    if md("attention.key_length_mla") is not None:  # newer files: key_length / value_length are the latent's
        qk, v = int(md("attention.key_length_mla")), int(need("attention.value_length_mla"))
    else:
        qk, v = int(need("attention.key_length")), int(need("attention.value_length"))
    if qk <= rope:
        raise CheckpointError(path, f"GGUF metadata gives a key length of {qk} for a rope part of {rope}: no "
                                    "non-rope key dimensions")
    heads = cfg["num_attention_heads"]
    gating = int(md("expert_gating_func", 1))  # 0 (none) or absent: softmax, as llama.cpp reads such files
    if gating not in (0, 1, SIGMOID_GATING):
        raise CheckpointError(path, f"GGUF metadata's {DEEPSEEK2}.expert_gating_func is {gating}; Kestrel routes "
                                    "DeepSeek experts by softmax (1) or sigmoid (2) only")
    sigmoid = gating == SIGMOID_GATING
    if sigmoid:
        cfg.update(architectures=[GGUF_DEEPSEEK_V3_ARCHITECTURE], model_type="deepseek_v3")
    cfg.update(num_key_value_heads=heads, head_dim=rope, kv_lora_rank=rank, q_lora_rank=md("attention.q_lora_rank"),
               qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope, v_head_dim=v, rope_interleave=True,
               first_k_dense_replace=int(md("leading_dense_block_count", 0)))
    if cfg["q_lora_rank"] is not None:
        cfg["q_lora_rank"] = int(cfg["q_lora_rank"])
    if not md("expert_count"):
        return  # a dense deepseek2 file: every layer an MLP
    groups = int(md("expert_group_count") or 1)
    cfg.update(n_routed_experts=int(need("expert_count")), num_experts_per_tok=int(need("expert_used_count")),
               moe_intermediate_size=int(need("expert_feed_forward_length")),
               n_shared_experts=int(md("expert_shared_count", 0)),
               routed_scaling_factor=float(md("expert_weights_scale") or 1.0),
               norm_topk_prob=bool(md("expert_weights_norm", False)), n_group=groups,
               topk_group=int(md("expert_group_used_count") or 1), moe_layer_freq=1,
               scoring_func="sigmoid" if sigmoid else "softmax",
               topk_method="noaux_tc" if sigmoid else "group_limited_greedy" if groups > 1 else "greedy")


def yarn_scaling(metadata: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
    """A deepseek2 file's YaRN rope_scaling (``scaling``: type, factor, original context) with DeepSeek's mscale
    keys: mscale = mscale_all_dim = yarn_log_multiplier / 0.1 (rounded to 6 digits: the float32 of the key), and the
    beta_fast / beta_slow the file gives."""
    out = dict(scaling)
    log_mul = metadata.get(f"{DEEPSEEK2}.rope.scaling.yarn_log_multiplier")
    if log_mul:
        out["mscale"] = out["mscale_all_dim"] = round(float(log_mul) / 0.1, 6)
    for key in ("beta_fast", "beta_slow"):
        value = metadata.get(f"{DEEPSEEK2}.rope.scaling.yarn_{key}")
        if value:
            out[key] = float(value)
    return out


def kv_b_parts(path: Path, tensors: dict[str, GGUFTensorInfo]) -> dict[str, tuple[str, str, tuple[int, int]]]:
    """kv_b_proj's Hugging Face name -> (attn_k_b, attn_v_b GGUF names, kv_b_proj's shape [heads * (qk_nope +
    v_head), kv_lora_rank]) for each layer stored split (and not also as attn_kv_b); ``tensors``: GGUFFile.tensors.
    A CheckpointError when the two parts' shapes ([heads, rank, qk_nope], [heads, v_head, rank]) do not fit."""
    out = {}
    for name, k_b in tensors.items():
        if not (name.startswith("blk.") and name.endswith("." + K_B)):
            continue
        layer = name[4:-len(K_B) - 1]
        v_name = f"blk.{layer}.{V_B}"
        v_b = tensors.get(v_name)
        if v_b is None or f"blk.{layer}.attn_kv_b.weight" in tensors:
            continue
        if len(k_b.shape) != 3 or len(v_b.shape) != 3 or v_b.shape[0] != k_b.shape[0] or v_b.shape[2] != k_b.shape[1]:
            raise CheckpointError(path, f"{name} {k_b.shape} and {v_name} {v_b.shape} do not split one kv_b_proj "
                                        "([heads, kv_lora_rank, qk_nope] and [heads, v_head_dim, kv_lora_rank])")
        heads, rank, nope = k_b.shape
        out[KV_B_NAME.format(layer)] = (name, v_name, (heads * (nope + v_b.shape[1]), rank))
    return out


def join_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """kv_b_proj [heads * (qk_nope + v_head), rank] from attn_k_b [heads, rank, qk_nope] and attn_v_b [heads,
    v_head, rank]: each head's key rows (k_b transposed back) then its value rows, as the converter split them."""
    heads, rank, _ = k_b.shape
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, rank).contiguous()
