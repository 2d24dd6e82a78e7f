"""The format-independent face of a checkpoint's tensors, and the up-front check of their names and
shapes against the model config (so a bad checkpoint fails at load, naming the tensor, not deep
inside a matmul)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.errors import CheckpointError


class WeightSource(ABC):
    """Lazy access to a checkpoint's tensors by Hugging Face name (``model.layers.0.self_attn.q_proj.weight``).

    Shapes are exactly the Hugging Face ones ([out, in] for linears). Nothing is read until ``get`` /
    ``get_slice`` is called, so each tensor-parallel rank reads only its own slices.
    """

    path: Path

    @abstractmethod
    def names(self) -> list[str]:
        """Every tensor name the checkpoint holds (Hugging Face names)."""

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape, without reading its data."""

    @abstractmethod
    def get(self, name: str) -> torch.Tensor:
        """The whole tensor on the CPU (safetensors: the stored dtype; GGUF: dequantized float32)."""

    @abstractmethod
    def get_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """``get(name).narrow(dim, start, stop - start)``, reading only that slice where the format allows."""

    def dtype(self, name: str) -> torch.dtype:
        """The dtype ``get`` returns for this tensor."""
        return torch.float32

    def __contains__(self, name: str) -> bool:
        return name in set(self.names())

    def close(self) -> None:
        """Release file handles / memory maps (optional; they are also released when garbage-collected)."""

    # helpers shared by the implementations
    def _missing(self, name: str) -> CheckpointError:
        return CheckpointError(self.path, f"has no tensor named {name!r}")

    def _check_slice(self, name: str, dim: int, start: int, stop: int) -> tuple[int, ...]:
        shape = self.shape(name)
        if not -len(shape) <= dim < len(shape):
            raise ValueError(f"dim {dim} is out of range for tensor {name} of shape {shape}")
        dim %= len(shape)
        if not 0 <= start <= stop <= shape[dim]:
            raise ValueError(f"slice [{start}:{stop}] is out of range for dim {dim} of {name} (shape {shape})")
        return shape


def expected_shapes(config: ModelConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """``(required, optional)``: the tensors a Llama-family model of this config must have, and the ones
    it may have (o_proj / mlp biases of Llama with attention_bias / mlp_bias, a saved lm_head of a tied
    model), each with its Hugging Face shape."""
    h, hd = config.hidden_size, config.head_dim
    q_out, kv_out = config.num_attention_heads * hd, config.num_key_value_heads * hd
    inter, vocab = config.intermediate_size, config.vocab_size
    required: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    optional: dict[str, tuple[int, ...]] = {}
    (optional if config.tie_word_embeddings else required)["lm_head.weight"] = (vocab, h)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        if config.architecture == "GptOssForCausalLM":
            required.update(_gpt_oss_shapes(config, p))
            continue
        if config.kv_lora_rank:  # multi-head latent attention (DeepSeek): its projections in place of q/k/v
            required.update(_mla_shapes(config, p + "self_attn."))
        else:
            required.update({
                p + "self_attn.q_proj.weight": (q_out, h),
                p + "self_attn.k_proj.weight": (kv_out, h),
                p + "self_attn.v_proj.weight": (kv_out, h),
                p + "self_attn.o_proj.weight": (h, q_out),
            })
        required.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
        required.update(_moe_shapes(config, p) if config.is_moe_layer(i) else {
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
        qkv_bias = {
            p + "self_attn.q_proj.bias": (q_out,),
            p + "self_attn.k_proj.bias": (kv_out,),
            p + "self_attn.v_proj.bias": (kv_out,),
        }
        (required if config.attention_bias else optional).update(qkv_bias)
        if config.qk_norm:
            required.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        optional.update({
            p + "self_attn.o_proj.bias": (h,),
            p + "mlp.gate_proj.bias": (inter,),
            p + "mlp.up_proj.bias": (inter,),
            p + "mlp.down_proj.bias": (h,),
        })
    return required, optional


def _mla_shapes(config: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """The attention tensors of a DeepSeek layer (engine/models/deepseek.py), prefix ``p`` = "...self_attn."."""
    h, heads, rank = config.hidden_size, config.num_attention_heads, config.kv_lora_rank
    rope, q_rank = config.qk_rope_head_dim, config.q_lora_rank
    qk = config.qk_nope_head_dim + rope
    shapes = {
        p + "kv_a_proj_with_mqa.weight": (rank + rope, h),
        p + "kv_a_layernorm.weight": (rank,),
        p + "kv_b_proj.weight": (heads * (config.qk_nope_head_dim + config.v_head_dim), rank),
        p + "o_proj.weight": (h, heads * config.v_head_dim),
    }
    if q_rank:
        shapes.update({p + "q_a_proj.weight": (q_rank, h), p + "q_a_layernorm.weight": (q_rank,),
                       p + "q_b_proj.weight": (heads * qk, q_rank)})
    else:
        shapes[p + "q_proj.weight"] = (heads * qk, h)
    return shapes


def _moe_shapes(config: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """The tensors of a layer's mixture-of-experts block (engine/models/moe_block.py), prefix ``p`` = "...layers.i.":
    the router, every expert's three projections (Mixtral: block_sparse_moe.experts.N.w1 / w3 / w2; Qwen MoE and
    DeepSeek: mlp.experts.N.gate_proj / up_proj / down_proj), the shared expert(s)."""
    h, n, inter = config.hidden_size, config.num_experts, config.moe_intermediate_size
    mixtral = config.architecture == "MixtralForCausalLM"
    m = p + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    shapes: dict[str, tuple[int, ...]] = {m + "gate.weight": (n, h)}
    for e in range(n):
        x = f"{m}experts.{e}."
        shapes.update({x + names[0] + ".weight": (inter, h), x + names[1] + ".weight": (inter, h),
                       x + names[2] + ".weight": (h, inter)})
    shared, name = config.shared_expert_intermediate_size, "shared_expert."
    if config.n_shared_experts:
        shared, name = config.n_shared_experts * inter, "shared_experts."
    if shared:
        shapes.update({m + name + "gate_proj.weight": (shared, h), m + name + "up_proj.weight": (shared, h),
                       m + name + "down_proj.weight": (h, shared)})
    if config.shared_expert_intermediate_size:
        shapes[m + "shared_expert_gate.weight"] = (1, h)
    if config.topk_method == "noaux_tc":
        shapes[m + "gate.e_score_correction_bias"] = (n,)
    return shapes


def _gpt_oss_shapes(config: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """The tensors of a gpt-oss layer (engine/models/gpt_oss.py), prefix ``p`` = "model.layers.i.": biased q/k/v/o,
    the sinks, the biased router and the stacked experts (transformers' layout; an MXFP4 checkpoint's shown so by
    engine/loader/mxfp4.py)."""
    h, hd, n, inter = config.hidden_size, config.head_dim, config.num_experts, config.moe_intermediate_size
    q_out, kv_out = config.num_attention_heads * hd, config.num_key_value_heads * hd
    a, m = p + "self_attn.", p + "mlp."
    return {a + "q_proj.weight": (q_out, h), a + "q_proj.bias": (q_out,), a + "k_proj.weight": (kv_out, h),
            a + "k_proj.bias": (kv_out,), a + "v_proj.weight": (kv_out, h), a + "v_proj.bias": (kv_out,),
            a + "o_proj.weight": (h, q_out), a + "o_proj.bias": (h,), a + "sinks": (config.num_attention_heads,),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            m + "router.weight": (n, h), m + "router.bias": (n,),
            m + "experts.gate_up_proj": (n, h, 2 * inter), m + "experts.gate_up_proj_bias": (n, 2 * inter),
            m + "experts.down_proj": (n, inter, h), m + "experts.down_proj_bias": (n, h)}


def validate_weights(weights: WeightSource, config: ModelConfig, config_name: str = "config.json") -> None:
    """Raise a CheckpointError naming the first problems if a tensor is missing or has the wrong shape."""
    required, optional = expected_shapes(config)
    present = set(weights.names())
    missing = [name for name in required if name not in present]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(
            weights.path,
            f"missing tensor(s) {', '.join(missing[:3])}{more}; the checkpoint is incomplete or does not "
            f"match {config_name}",
        )
    wrong = []
    for name, shape in {**required, **optional}.items():
        if name in present and tuple(weights.shape(name)) != shape:
            wrong.append(f"{name} has shape {tuple(weights.shape(name))} but {config_name} implies {shape}")
    if wrong:
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise CheckpointError(weights.path, "; ".join(wrong[:3]) + more)
