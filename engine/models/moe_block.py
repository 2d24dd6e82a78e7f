"""The mixture-of-experts block that takes the dense MLP's place in a decoder layer (LlamaDecoderLayer's ``mlp``):
the router, the routed experts (engine/layers/moe.py: Router, FusedMoE) and the shared expert where the family has
one (Qwen2-MoE: one, scaled by sigmoid(x . gate); DeepSeek: n_shared_experts of them as one MLP, unscaled).
Same face as LlamaMLP: ``forward(x, reduce, residual)`` and ``load(weights, prefix)``."""

from __future__ import annotations

import torch

from engine import ops
from engine.config import ModelConfig
from engine.layers.moe import FusedMoE, Router, Routing
from engine.layers.moe_gguf import routed_native
from engine.models.llama import LlamaMLP
from engine.parallel.context import TPContext


class MoEBlock(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, dtype, tp: TPContext, *, shared_intermediate: int = 0,
                 shared_gate: bool = False, correction_bias: bool = False,
                 expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                 shared_name: str = "shared_expert", routing: Routing | None = None):
        """``expert_names``: the checkpoint's names of an expert's gate, up and down projections (Mixtral: w1, w3,
        w2); ``shared_name``: the shared expert's (DeepSeek: shared_experts); ``correction_bias``: the router's
        e_score_correction_bias (DeepSeek-V3)."""
        super().__init__()
        self.tp = tp
        self.expert_names = expert_names
        self.shared_name = shared_name
        self.gate = Router(cfg.hidden_size, cfg.num_experts, dtype, routing or Routing.from_config(cfg),
                           correction_bias)
        self.experts = FusedMoE(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype, tp)
        self.shared_expert = LlamaMLP(cfg, dtype, tp, shared_intermediate) if shared_intermediate else None
        self.shared_expert_gate = torch.nn.Parameter(torch.empty(1, cfg.hidden_size, dtype=dtype),
                                                     requires_grad=False) if shared_gate else None

    def forward(self, x: torch.Tensor, reduce: bool = True, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output [T, H], summed over the ranks unless ``reduce`` is False (one all-reduce for the
        routed and the shared experts together: both are this rank's partial sums)."""
        out = routed_native(self.experts, self.gate, x)  # GGUF experts: route and run in one native call
        if out is None:
            weights, ids = self.gate(x)
            out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(x, reduce=False)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(ops.linear(x, self.shared_expert_gate)) * shared
            out = out + shared
        return self.tp.all_reduce(out) if reduce else out

    def load(self, weights, prefix: str) -> None:
        bias = f"{prefix}.gate.e_score_correction_bias"
        self.gate.load(weights, f"{prefix}.gate.weight", bias)
        g, u, d = self.expert_names
        self.experts.load(weights, lambda e: (f"{prefix}.experts.{e}.{g}.weight", f"{prefix}.experts.{e}.{u}.weight",
                                              f"{prefix}.experts.{e}.{d}.weight"))
        if self.shared_expert is not None:
            self.shared_expert.load(weights, f"{prefix}.{self.shared_name}")
        if self.shared_expert_gate is not None:
            self.shared_expert_gate.data.copy_(weights.get(f"{prefix}.shared_expert_gate.weight"))
