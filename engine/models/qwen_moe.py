"""Qwen MoE: Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B: q/k/v biases, a shared expert scaled by
sigmoid(x . shared_expert_gate)) and Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B: per-head q/k norms, no shared expert).
A layer is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers (else the dense MLP of
intermediate_size); the router is a softmax top-k, renormalized when norm_topk_prob."""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM, LlamaMLP
from engine.models.moe_block import MoEBlock
from engine.parallel.context import TPContext


class QwenMoeForCausalLM(LlamaForCausalLM):
    def make_mlp(self, cfg: ModelConfig, index: int, dtype, tp: TPContext) -> torch.nn.Module:
        if not cfg.is_moe_layer(index):
            return LlamaMLP(cfg, dtype, tp)
        shared = cfg.shared_expert_intermediate_size
        return MoEBlock(cfg, dtype, tp, shared_intermediate=shared, shared_gate=shared > 0)
