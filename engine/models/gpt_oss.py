"""gpt-oss (GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b) in one file, on the CPU.

The Llama decoder's shape (engine/models/llama.py: pre-norm halves, RMSNorm, rotate-half rope) with:
- attention: q/k/v and o biases, a learned sink logit per head in the softmax's denominator, and a sliding window of
  ``layer_window`` tokens on the layers ``layer_types`` marks "sliding_attention" (alternating, the first sliding),
  full causal attention on the others (engine/layers/sink_attention.py); YaRN rope (transformers'
  _compute_yarn_parameters, engine/layers/mla.py ``rope_frequencies``), cos / sin times its attention factor;
- a mixture-of-experts block in every layer (engine/layers/moe.py): the router is a linear with a bias, top-k over
  its logits and softmax over the chosen k (``TOPK_SOFTMAX``); each expert has biases and the clamped SwiGLU
  (``ClampedSwiGLU``: alpha 1.702, limit 7.0). The checkpoint stacks the experts, gate and up interleaved by column:
  mlp.experts.gate_up_proj [E, hidden, 2 I] (column 2j gate j, 2j + 1 up j) + gate_up_proj_bias [E, 2 I],
  down_proj [E, I, hidden] + down_proj_bias [E, hidden]; the load de-interleaves them into FusedMoE's stacks.
  Released checkpoints store them as MXFP4 (quant_method "mxfp4"): engine/loader/mxfp4.py dequantizes them at load.

Names: model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}, self_attn.sinks [heads], mlp.router.{weight,bias},
mlp.experts.*. Tensor parallelism splits heads (and their sinks) and expert widths as for Llama; the o_proj and
down_proj biases are added once (rank 0) before the all-reduce.

The GPU is refused at build (ModelLoadError): its attention kernels take no sinks or window, the fused MoE kernels
no biases or clamped SwiGLU, and this attention reads the step's context lengths on the host (no CUDA graphs).
"""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.layers.attention import AttentionMetadata
from engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine.layers.linear import QKVParallelLinear, RowParallelLinear
from engine.layers.mla import rope_frequencies
from engine.layers.moe import TOPK_SOFTMAX, ClampedSwiGLU, FusedMoE, Router, Routing
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.layers.sink_attention import SinkAttention
from engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.parallel.context import TPContext

SLIDING = "sliding_attention"


class YarnRotaryEmbedding(RotaryEmbedding):
    """RotaryEmbedding's table (rotate-half, float32 cos then sin per position) under YaRN: its inverse frequencies,
    cos and sin times the attention factor (plain rope when the config has no scaling)."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None, model_max: int):
        torch.nn.Module.__init__(self)  # (RotaryEmbedding.__init__ knows linear / llama3 scaling only)
        self.head_dim = head_dim
        self.inv_freq, self.attention_factor = rope_frequencies(head_dim, theta, scaling, model_max)
        self.register_buffer("cos_sin_cache", self._table(max_position, self.inv_freq.device), persistent=False)

    def _table(self, n: int, device: torch.device) -> torch.Tensor:
        return super()._table(n, device) * self.attention_factor


class GptOssAttention(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, rotary: RotaryEmbedding, dtype, tp: TPContext):
        super().__init__()
        hd = cfg.head_dim
        self.tp = tp
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, hd, cfg.num_attention_heads, cfg.num_key_value_heads,
                                          True, dtype, tp)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * hd, cfg.hidden_size, dtype, tp, "attention width")
        self.o_bias = torch.nn.Parameter(torch.zeros(cfg.hidden_size, dtype=dtype), requires_grad=False)
        self.q_size = self.qkv_proj.num_heads * hd
        self.kv_size = self.qkv_proj.num_kv_heads * hd
        self.heads = (self.qkv_proj.q_rows[0] // hd, self.qkv_proj.q_rows[1] // hd)  # this rank's query heads
        window = cfg.layer_window if cfg.layer_types[index] == SLIDING else None
        self.rotary = rotary
        self.attn = SinkAttention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, hd, index, window, dtype)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, reduce: bool = True,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """The attention's output [T, hidden] (this rank's partial sum unless ``reduce``); never added into
        ``residual`` (the o_proj bias comes after the GEMM)."""
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = self.o_proj(self.attn(q, k, v, meta, self.rotary), reduce=False)
        if self.tp.rank == 0:
            out = out + self.o_bias
        return self.tp.all_reduce(out) if reduce else out

    def load(self, weights, p: str) -> None:
        self.qkv_proj.load(weights, p)
        self.o_proj.load(weights, f"{p}.o_proj")
        self.o_bias.data.copy_(weights.get(f"{p}.o_proj.bias"))
        self.attn.sinks.data.copy_(weights.get_slice(f"{p}.sinks", 0, *self.heads))


class GptOssMoE(torch.nn.Module):
    """The router and the experts of one layer; LlamaMLP's face: ``forward(x, reduce, residual)``, ``load``."""

    def __init__(self, cfg: ModelConfig, dtype, tp: TPContext):
        super().__init__()
        self.tp = tp
        self.router = Router(cfg.hidden_size, cfg.num_experts, dtype,
                             Routing(top_k=cfg.num_experts_per_tok, scoring=TOPK_SOFTMAX), bias=True)
        self.experts = FusedMoE(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype, tp,
                                activation=ClampedSwiGLU(cfg.swiglu_alpha, cfg.swiglu_limit), bias=True)

    def forward(self, x: torch.Tensor, reduce: bool = True, residual: torch.Tensor | None = None) -> torch.Tensor:
        weights, ids = self.router(x)
        out = self.experts(x, weights, ids)
        return self.tp.all_reduce(out) if reduce else out

    def load(self, weights, p: str) -> None:
        self.router.load(weights, f"{p}.router.weight")
        self.router.bias.data.copy_(weights.get(f"{p}.router.bias"))
        m = self.experts
        i0, i1 = m.cols
        # this rank's gate / up columns, interleaved in the checkpoint: [E, hidden, 2 I_r] -> gate rows, up rows
        gate_up = weights.get_slice(f"{p}.experts.gate_up_proj", 2, 2 * i0, 2 * i1)
        m.w13.data.copy_(torch.cat([gate_up[..., 0::2], gate_up[..., 1::2]], dim=-1).transpose(1, 2))
        bias = weights.get_slice(f"{p}.experts.gate_up_proj_bias", 1, 2 * i0, 2 * i1)
        m.w13_bias.data.copy_(torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=-1))
        m.w2.data.copy_(weights.get_slice(f"{p}.experts.down_proj", 1, i0, i1).transpose(1, 2))
        m.w2_bias.data.copy_(weights.get(f"{p}.experts.down_proj_bias"))


class GptOssDecoderLayer(LlamaDecoderLayer):
    """LlamaDecoderLayer's two halves over gpt-oss's attention and expert block."""

    def __init__(self, cfg: ModelConfig, index: int, rotary: RotaryEmbedding, dtype, tp: TPContext):
        torch.nn.Module.__init__(self)  # the parts are gpt-oss's: nothing of LlamaDecoderLayer.__init__ applies
        self.self_attn = GptOssAttention(cfg, index, rotary, dtype, tp)
        self.mlp = GptOssMoE(cfg, dtype, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class GptOssForCausalLM(LlamaForCausalLM):
    """The model-level parts (forward, hidden_states, the logits, int8 quantization of the linear layers) are
    LlamaForCausalLM's: the layers, the rope and the weight names differ."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, tp: TPContext, max_position: int):
        torch.nn.Module.__init__(self)
        device = torch.get_default_device()  # the runner builds the model under its device
        if device.type != "cpu":
            raise ModelLoadError(
                f"{cfg.architecture} (gpt-oss) runs on the CPU only: the GPU attention kernels take no attention "
                "sinks or per-layer sliding window, and the fused MoE kernels no expert biases or clamped SwiGLU. "
                "Load it with --device cpu.")
        if len(cfg.layer_types) != cfg.num_hidden_layers:
            raise ModelLoadError(f"{cfg.architecture}: layer_types names {len(cfg.layer_types)} layers, the model "
                                 f"has {cfg.num_hidden_layers}")
        self.cfg = cfg
        self.tp = tp
        rotary = YarnRotaryEmbedding(cfg.head_dim, max(max_position, 1), cfg.rope_theta, cfg.rope_scaling,
                                     cfg.max_position_embeddings)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, tp)
        self.layers = torch.nn.ModuleList(
            GptOssDecoderLayer(cfg, i, rotary, dtype, tp) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else ParallelLMHead(
            cfg.vocab_size, cfg.hidden_size, dtype, tp)
        self.rotary = rotary  # (the runner resizes its table to the served positions)

    def load_weights(self, weights) -> None:
        self.embed_tokens.load(weights, "model.embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}"
            layer.self_attn.load(weights, f"{p}.self_attn")
            layer.mlp.load(weights, f"{p}.mlp")
            layer.input_layernorm.load(weights, f"{p}.input_layernorm.weight")
            layer.post_attention_layernorm.load(weights, f"{p}.post_attention_layernorm.weight")
        self.norm.load(weights, "model.norm.weight")
        if not self.cfg.tie_word_embeddings:
            self.lm_head.load(weights, "lm_head.weight")
