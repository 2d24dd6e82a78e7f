"""DeepSeek-V2 / V3 in one file: multi-head latent attention (engine/layers/mla.py: a paged cache of latents, decode
absorbed, prefill expanded) and mixture-of-experts blocks with shared experts (engine/models/moe_block.py on
engine/layers/moe.py: V2's softmax with greedy / group-limited top-k, V3's sigmoid with the correction bias and its
top-2-sum group limit, as transformers routes). The first first_k_dense_replace layers keep a dense MLP. V2 and V3
differ in config values (ModelConfig: scoring_func, topk_method, rope_interleave, ...), not in subclasses.

Tensor parallelism: the attention heads are split over the ranks (q_proj / q_b_proj rows, kv_b_proj's heads,
o_proj's columns); the down-projections q_a_proj and kv_a_proj_with_mqa and the latent cache are replicated on every
rank; the experts split like the dense MLP (engine/layers/moe.py FusedMoE), one all-reduce for the routed and shared
experts together.

Names are transformers' (and DeepSeek's own checkpoints'): model.layers.N.self_attn.{q_proj | q_a_proj,
q_a_layernorm, q_b_proj}, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; mlp.{gate_proj, up_proj, down_proj}
(dense), mlp.gate.weight (+ e_score_correction_bias, V3), mlp.experts.E.{gate,up,down}_proj, mlp.shared_experts.*.
"""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.layers.attention import AttentionMetadata
from engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from engine.layers.mla import LatentAttention, LatentRope, softmax_scale
from engine.layers.norm import RMSNorm
from engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from engine.models.moe_block import MoEBlock
from engine.parallel.context import SINGLE, TPContext

# transformers' DeepseekV2/V3 RMSNorm default: q_a_layernorm and kv_a_layernorm take no eps from the config
LATENT_NORM_EPS = 1e-6


class DeepseekAttention(torch.nn.Module):
    """MLA projections around LatentAttention: q (direct, or through the q_lora_rank bottleneck), the latent and
    the shared rope key from kv_a_proj_with_mqa, rope on the rope parts, o_proj."""

    def __init__(self, cfg: ModelConfig, index: int, rope: LatentRope, dtype, tp: TPContext):
        super().__init__()
        if cfg.attention_bias:
            raise ValueError("DeepSeek attention with attention_bias is not supported")
        H = cfg.num_attention_heads
        self.heads = tp.split(H, "number of attention heads")
        self.num_heads = self.heads[1] - self.heads[0]
        self.nope, self.rope_dim, self.rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        qk = self.nope + self.rope_dim
        hidden = cfg.hidden_size
        self.q_lora_rank = cfg.q_lora_rank
        if self.q_lora_rank:
            self.q_a_proj = MergedColumnParallelLinear(hidden, self.q_lora_rank, ["q_a_proj"], dtype, SINGLE)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS, dtype)
            self.q_b_proj = MergedColumnParallelLinear(self.q_lora_rank, H * qk, ["q_b_proj"], dtype, tp)
        else:
            self.q_proj = MergedColumnParallelLinear(hidden, H * qk, ["q_proj"], dtype, tp)
        self.kv_a_proj_with_mqa = MergedColumnParallelLinear(hidden, self.rank + self.rope_dim,
                                                             ["kv_a_proj_with_mqa"], dtype, SINGLE)
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS, dtype)
        self.o_proj = RowParallelLinear(H * cfg.v_head_dim, hidden, dtype, tp, "attention width")
        self.rope = rope
        self.attn = LatentAttention(self.num_heads, self.rank, self.nope, self.rope_dim, cfg.v_head_dim,
                                    softmax_scale(qk, cfg.rope_scaling), index, dtype)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, reduce: bool = True,
                residual: torch.Tensor | None = None) -> torch.Tensor | None:
        T = x.shape[0]
        if self.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q_nope, q_pe = q.view(T, self.num_heads, self.nope + self.rope_dim).split([self.nope, self.rope_dim], -1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())
        out = self.attn(q_nope, self.rope(meta.positions, q_pe), latent, self.rope(meta.positions, k_pe), meta)
        return self.o_proj(out, reduce, residual)

    def load(self, weights, p: str) -> None:
        if self.q_lora_rank:
            self.q_a_proj.load(weights, p)
            self.q_a_layernorm.load(weights, f"{p}.q_a_layernorm.weight")
            self.q_b_proj.load(weights, p)
        else:
            self.q_proj.load(weights, p)
        self.kv_a_proj_with_mqa.load(weights, p)
        self.kv_a_layernorm.load(weights, f"{p}.kv_a_layernorm.weight")
        self.attn.load_kv_b(weights, f"{p}.kv_b_proj.weight", self.heads)
        self.o_proj.load(weights, f"{p}.o_proj")


class DeepseekDecoderLayer(LlamaDecoderLayer):
    """LlamaDecoderLayer's two halves (norm, attention; norm, MLP: micro-batch overlap runs them the same way) over
    DeepSeek's attention and its dense MLP or expert block."""

    def __init__(self, cfg: ModelConfig, index: int, rope: LatentRope, dtype, tp: TPContext):
        torch.nn.Module.__init__(self)  # the parts are DeepSeek's: nothing of LlamaDecoderLayer.__init__ applies
        self.self_attn = DeepseekAttention(cfg, index, rope, dtype, tp)
        # routed experts + the shared experts (one MLP of n_shared_experts x the expert width, always on, unscaled)
        self.mlp = MoEBlock(cfg, dtype, tp, shared_intermediate=cfg.moe_intermediate_size * cfg.n_shared_experts,
                            correction_bias=cfg.topk_method == "noaux_tc", shared_name="shared_experts",
                            ) if cfg.is_moe_layer(index) else LlamaMLP(cfg, dtype, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class DeepseekForCausalLM(LlamaForCausalLM):
    """DeepseekV2ForCausalLM / DeepseekV3ForCausalLM. The model-level parts (forward, hidden_states, the logits,
    quantization, load_weights: each layer's LlamaDecoderLayer.load over DeepseekAttention.load and the MLP's) are
    LlamaForCausalLM's: only the layers differ."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, tp: TPContext, max_position: int):
        torch.nn.Module.__init__(self)  # the layers are DeepSeek's: nothing of LlamaForCausalLM.__init__ applies
        if not cfg.kv_lora_rank:
            raise ValueError(f"{cfg.architecture}: kv_lora_rank is missing (multi-head latent attention)")
        self.cfg = cfg
        self.tp = tp
        rope = LatentRope(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings,
                          cfg.rope_interleave)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, tp)
        self.layers = torch.nn.ModuleList(
            DeepseekDecoderLayer(cfg, i, rope, dtype, tp) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else ParallelLMHead(
            cfg.vocab_size, cfg.hidden_size, dtype, tp)
        self.latent_rope = rope  # (not ``rotary``: the runner resizes a Llama rotary table; this one has none)
