"""Mixtral (8x7B, 8x22B): the Llama decoder with a mixture-of-experts block in every layer's MLP place (softmax
router, top-2, weights renormalized; each expert a SiLU-gated MLP, w1 = gate, w3 = up, w2 = down)."""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.moe_block import MoEBlock
from engine.parallel.context import TPContext


class MixtralForCausalLM(LlamaForCausalLM):
    mlp_prefix = "block_sparse_moe"

    def make_mlp(self, cfg: ModelConfig, index: int, dtype, tp: TPContext) -> torch.nn.Module:
        return MoEBlock(cfg, dtype, tp, expert_names=("w1", "w3", "w2"))
