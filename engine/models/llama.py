"""The Llama family in one file: Llama 2/3/3.1/3.2, Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm),
SmolLM2 (tied embeddings). Differences between them are config flags, not subclasses."""

from __future__ import annotations

import torch

from engine import ops
from engine.config import ModelConfig
from engine.layers.attention import Attention, AttentionMetadata
from engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine.layers.linear import LinearBase, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models import overlap
from engine.parallel.context import TPContext


class LlamaAttention(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, rotary: RotaryEmbedding, dtype, tp: TPContext):
        super().__init__()
        hd = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, hd, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, cfg.attention_bias, dtype, tp)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * hd, cfg.hidden_size, dtype, tp,
                                        "attention width")
        self.q_size = self.qkv_proj.num_heads * hd
        self.kv_size = self.qkv_proj.num_kv_heads * hd
        self.head_dim = hd
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.rotary = rotary
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, hd, index)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, reduce: bool = True,
                residual: torch.Tensor | None = None) -> torch.Tensor | None:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            T = qkv.shape[0]
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(T, self.q_size)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(T, self.kv_size)
        return self.o_proj(self.attn(q, k, v, meta, self.rotary), reduce, residual)

    def load(self, weights, prefix: str) -> None:
        self.qkv_proj.load(weights, prefix)
        self.o_proj.load(weights, f"{prefix}.o_proj")
        if self.q_norm is not None:
            self.q_norm.load(weights, f"{prefix}.q_norm.weight")
            self.k_norm.load(weights, f"{prefix}.k_norm.weight")


class LlamaMLP(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, dtype, tp: TPContext, intermediate_size: int | None = None):
        super().__init__()
        inter = intermediate_size or cfg.intermediate_size  # (a MoE model's shared expert: its own width)
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, inter, ["gate_proj", "up_proj"], dtype, tp)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, dtype, tp, "intermediate size")

    def load(self, weights, prefix: str) -> None:
        self.gate_up_proj.load(weights, prefix)
        self.down_proj.load(weights, f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor, reduce: bool = True, residual: torch.Tensor | None = None
                ) -> torch.Tensor | None:
        # (at one row inside the decode graphs, the activation is the gate_up GEMV's epilogue: ops.gemm)
        return self.down_proj(ops.linear_silu_and_mul(x, self.gate_up_proj.matmul_weight), reduce, residual)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, rotary: RotaryEmbedding, dtype, tp: TPContext,
                 mlp: torch.nn.Module | None = None):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, index, rotary, dtype, tp)
        # the dense MLP, or what a relative puts in its place (a mixture-of-experts block: engine/models/moe_block.py)
        # with the same forward(x, reduce, residual) and load(weights, prefix)
        self.mlp = mlp if mlp is not None else LlamaMLP(cfg, dtype, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    # The layer in two halves, each ending in a row-parallel all-reduce. The plain forward runs them back to
    # back; micro-batch overlap (engine/models/overlap.py) interleaves two micro-batches' halves with
    # reduce=False and issues the all-reduces itself. One decoder either way. A half's output is None when its
    # last GEMM added it into the residual itself (one rank, a prefill: RowParallelLinear.forward); the next
    # norm then reads the residual alone.
    def attention_half(self, x, residual, meta: AttentionMetadata, reduce: bool = True):
        """(input norm with the residual add) -> self-attention. Returns (output, residual); with
        reduce=False the output is this rank's partial sum."""
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        return self.self_attn(x, meta, reduce, residual), residual

    def mlp_half(self, x, residual, reduce: bool = True):
        """(post-attention norm with the residual add) -> MLP. Returns (output, residual)."""
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x, reduce, residual), residual

    def forward(self, x, residual, meta: AttentionMetadata):
        x, residual = self.attention_half(x, residual, meta)
        return self.mlp_half(x, residual)

    def load(self, weights, prefix: str, mlp_prefix: str = "mlp") -> None:
        """Layer ``prefix`` (model.layers.N) of the checkpoint: the attention's and the MLP's own load, the two
        norms. Relatives whose attention and MLP keep that load(weights, prefix) (DeepSeek's) inherit it."""
        self.self_attn.load(weights, f"{prefix}.self_attn")
        self.mlp.load(weights, f"{prefix}.{mlp_prefix}")
        self.input_layernorm.load(weights, f"{prefix}.input_layernorm.weight")
        self.post_attention_layernorm.load(weights, f"{prefix}.post_attention_layernorm.weight")


class LlamaForCausalLM(torch.nn.Module):
    mlp_prefix = "mlp"  # the checkpoint's name of a layer's MLP (Mixtral: block_sparse_moe)

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, tp: TPContext, max_position: int):
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        rotary = RotaryEmbedding(cfg.head_dim, max(max_position, 1), cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, tp)
        self.layers = torch.nn.ModuleList(
            LlamaDecoderLayer(cfg, i, rotary, dtype, tp, self.make_mlp(cfg, i, dtype, tp))
            for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else ParallelLMHead(
            cfg.vocab_size, cfg.hidden_size, dtype, tp)
        self.rotary = rotary

    def make_mlp(self, cfg: ModelConfig, index: int, dtype, tp: TPContext) -> torch.nn.Module:
        """Layer ``index``'s MLP: the dense one here; MoE relatives return their expert block where it has one."""
        return LlamaMLP(cfg, dtype, tp)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.layers]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Returns the final hidden states [T, hidden]."""
        return self.hidden_states(self.embed_tokens(input_ids), meta)

    def hidden_states(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The decoder layers and the final norm over token embeddings x [T, hidden]."""
        if self.tp.overlaps(x.shape[0]):  # TP, comm strategy overlap: two micro-batches
            return overlap.overlapped_layers(self.layers, self.norm, x, meta, self.tp.comm)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, meta)
        x, _ = self.norm(x, residual)
        return x

    def quantize_int8(self) -> tuple[int, int]:
        """Weight-only int8 for every linear layer whose K allows it, and the LM head (whose float rows stay
        only when they are also the token embedding). Returns (quantized, linear layers)."""
        return self._quantize(lambda m: m.quantize_int8(), self.lm_head.quantize_head_int8)

    def quantize_weights(self, mode: str) -> tuple[int, int]:
        """--quantization int8 | int4 | fp8 on a GPU (LinearBase.quantize: done while loading under quantized_load,
        then a no-op; ParallelLMHead.quantize_head). Returns (quantized, linear layers)."""
        return self._quantize(lambda m: m.quantize(mode), lambda: self.lm_head.quantize_head(mode))

    def _quantize(self, linear, head) -> tuple[int, int]:
        """``linear(m)`` on every linear layer, then ``head()``; the head's float rows are dropped unless they
        are also the token embedding."""
        linears = [m for m in self.modules() if isinstance(m, LinearBase)]
        for m in linears:
            linear(m)
        lm = self.lm_head
        if head() and lm is not self.embed_tokens:
            lm.weight.data = torch.empty(0, dtype=lm.weight.dtype, device=lm.weight.device)
        return sum(m.quant is not None for m in linears), len(linears)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return ParallelLMHead.logits(self.lm_head, hidden)

    def load_weights(self, weights) -> None:
        self.embed_tokens.load(weights, "model.embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            layer.load(weights, f"model.layers.{i}", self.mlp_prefix)
        self.norm.load(weights, "model.norm.weight")
        if not self.cfg.tie_word_embeddings:
            self.lm_head.load(weights, "lm_head.weight")
        finished = getattr(weights, "loaded", None)  # GGUFWeights: the file's pages and the load's free heap go
        if finished is not None:
            finished()
