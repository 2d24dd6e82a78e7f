"""Mixture of experts: the router's expert choice (``Routing`` + ``select_experts``, exactly as transformers routes)
and the experts themselves (``FusedMoE``), split for tensor parallelism like the dense MLP.

Interface (what the model files and the GGUF / DeepSeek paths build on):

- ``Routing.from_config(cfg)``: the routing rule of a ModelConfig (softmax or sigmoid scores, top-k, optional
  renormalisation, DeepSeek's group-limited top-k: V2's "group_limited_greedy" (a group's score is its best expert)
  and V3's "noaux_tc" (scores plus ``e_score_correction_bias``, a group's score is the sum of its best two),
  routed_scaling_factor; gpt-oss's ``TOPK_SOFTMAX``: top-k over the logits, softmax over the chosen k).
  ``select_experts(router_logits, routing, correction_bias)`` -> (weights float32 [T, k],
  expert ids int64 [T, k]); the same torch ops in the same order as transformers' routers, so ties break as
  torch.topk breaks them there.
- ``Router(hidden, num_experts, dtype, routing)``: the replicated gate (weight [E, hidden]; ``load(weights, name)``,
  ``correction_bias`` for noaux_tc, a logit ``bias`` [E] with bias=True: gpt-oss), ``router(x)`` -> (weights, ids).
- ``FusedMoE(num_experts, hidden, intermediate, dtype, tp)``: every expert's weights stacked, ``w13`` [E, 2 I_r, H]
  (gate rows then up rows) and ``w2`` [E, H, I_r], where I_r is this rank's slice of each expert's intermediate
  dim (``tp.split``; each rank holds a slice of every expert, as MergedColumnParallelLinear / RowParallelLinear
  split the dense MLP). ``moe(x, weights, ids)`` returns this rank's partial sum [T, H]: the caller all-reduces it
  (``tp.all_reduce``), once for the routed experts and any shared expert together.
  With ``activation`` (gpt-oss's ``ClampedSwiGLU``) gate_up's product goes through it instead of SiLU-and-mul; with
  bias=True each expert has ``w13_bias`` [E, 2 I_r] and ``w2_bias`` [E, H] (added by rank 0 only: a partial sum).
  ``load(weights, names)`` reads expert e's three Hugging Face tensors ``names(e) -> (gate, up, down)`` (this rank's
  rows of gate / up, columns of down) and stacks them.
- Expert weights in another form (GGUF blocks, ...): set ``quantized_experts`` to a list of (gate_up, down) per
  expert, each anything ``ops.linear`` takes (ops.GGUFWeight / GGUFSegments, ops.Int8Weight, a float [N, K] tensor),
  and drop the float stacks (``drop_float()``). ``expert_matmul(x, e, which)`` ("gate_up" | "down") is the one place
  an expert's product is computed on the CPU path: override it (or replace ``experts_cpu``) for a native grouped
  kernel.

Computation: on the CPU the k choices of every token are sorted by expert id (a stable sort: each expert's tokens in
token order), and each expert that has tokens runs once over its rows: gate_up with SiLU-and-mul, then down (a GEMM
for a prefill, a GEMV for a decode: engine/ops' native kernels); the outputs, scaled by the routing weights, are
summed back per token. On a GPU with float stacks the same sort feeds the Triton grouped kernels of
engine/ops/fused_moe.py (one launch for gate_up, one for down, as vLLM's fused_moe), with no host synchronisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine import ops
from engine.config import ModelConfig
from engine.layers.moe_gguf import load_gguf_experts
from engine.ops import fused_moe as fused_moe_ops
from engine.parallel.context import TPContext

GROUP_BEST = "max"  # DeepSeek-V2 group_limited_greedy: a group's score is its best expert's
GROUP_TOP2_SUM = "top2_sum"  # DeepSeek-V3 noaux_tc: the sum of its best two (bias included)
TOPK_SOFTMAX = "topk_softmax"  # gpt-oss: torch.topk over the logits, then softmax over the k chosen logits


@dataclass(frozen=True)
class Routing:
    """How a router's logits become k experts and their weights (see ``select_experts``)."""

    top_k: int
    scoring: str = "softmax"  # "softmax" | "sigmoid" | TOPK_SOFTMAX
    renormalize: bool = False  # the k weights divided by their sum
    group_score: str | None = None  # None: plain top-k; GROUP_BEST | GROUP_TOP2_SUM: top-k within topk_group groups
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    sorted: bool = True  # torch.topk's sorted= as the transformers router passes it (DeepSeek's: False)
    logits_fp32: bool = False  # the router's GEMM in float32 with a float32 weight (DeepSeek), else the model's dtype

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Routing:
        deepseek = cfg.architecture.startswith("Deepseek")
        scoring, group = cfg.scoring_func, None
        if cfg.architecture == "DeepseekV3ForCausalLM" or cfg.topk_method == "noaux_tc":
            scoring, group = "sigmoid", GROUP_TOP2_SUM  # transformers' V3 router: always this rule
        elif cfg.topk_method == "group_limited_greedy":
            group = GROUP_BEST
        # transformers' DeepSeek-V2 router never renormalizes; V3's as norm_topk_prob says
        renorm = cfg.norm_topk_prob and not (deepseek and group != GROUP_TOP2_SUM)
        return cls(top_k=cfg.num_experts_per_tok, scoring=scoring, renormalize=renorm, group_score=group,
                   n_group=cfg.n_group, topk_group=cfg.topk_group,
                   routed_scaling_factor=cfg.routed_scaling_factor, sorted=not deepseek, logits_fp32=deepseek)


def select_experts(router_logits: torch.Tensor, routing: Routing, correction_bias: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) of router logits [T, E], computed as transformers'
    routers compute them (Mixtral / Qwen MoE / DeepSeek-V2 / DeepSeek-V3), op for op in float32: scores (softmax,
    or sigmoid), plus ``correction_bias`` for the choice only; with a group rule, the experts of all but the
    best ``topk_group`` of ``n_group`` groups masked out (V2: to 0, V3: to -inf); torch.topk; the weights are the
    chosen experts' scores, renormalized (V3 adds 1e-20 to the sum) and scaled by routed_scaling_factor."""
    if routing.scoring == TOPK_SOFTMAX:  # transformers' GptOssTopKRouter, in the logits' dtype
        values, ids = torch.topk(router_logits, k=routing.top_k, dim=-1)
        return torch.softmax(values, dim=-1).float(), ids
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if routing.scoring == "softmax" else logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if routing.group_score is not None:
        T, E = choice.shape
        grouped = choice.view(T, routing.n_group, E // routing.n_group)
        if routing.group_score == GROUP_BEST:
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=routing.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, routing.n_group, E // routing.n_group).reshape(-1, E)
        fill = 0.0 if routing.group_score == GROUP_BEST else float("-inf")
        choice = choice.masked_fill(~score_mask.bool(), fill)
    ids = torch.topk(choice, k=routing.top_k, dim=-1, sorted=routing.sorted)[1]
    weights = scores.gather(1, ids)
    if routing.renormalize:
        denominator = weights.sum(dim=-1, keepdim=True)
        if routing.scoring == "sigmoid":
            denominator = denominator + 1e-20
        weights = weights / denominator
    if routing.routed_scaling_factor != 1.0:
        weights = weights * routing.routed_scaling_factor
    return weights, ids


class Router(torch.nn.Module):
    """The gate: logits = x @ weight^T (replicated on every rank), then ``select_experts``."""

    def __init__(self, hidden_size: int, num_experts: int, dtype: torch.dtype, routing: Routing,
                 correction_bias: bool = False, bias: bool = False):
        super().__init__()
        self.routing = routing
        wdtype = torch.float32 if routing.logits_fp32 else dtype
        self.weight = torch.nn.Parameter(torch.empty(num_experts, hidden_size, dtype=wdtype), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(num_experts, dtype=wdtype), requires_grad=False) if bias else None
        self.correction_bias = torch.nn.Parameter(torch.zeros(num_experts, dtype=torch.float32),
                                                  requires_grad=False) if correction_bias else None

    def load(self, weights, name: str, bias_name: str | None = None) -> None:
        self.weight.data.copy_(weights.get(name))
        if self.correction_bias is not None and bias_name is not None:
            self.correction_bias.data.copy_(weights.get(bias_name))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x if x.dtype == self.weight.dtype else x.to(self.weight.dtype), self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return select_experts(self.logits(x), self.routing, self.correction_bias)


@dataclass(frozen=True)
class ClampedSwiGLU:
    """gpt-oss's expert activation (transformers' GptOssExperts._apply_gate) on gate_up [n, 2 I] laid out as the
    stacks are (gate columns, then up columns): gate clamped above at ``limit``, up to [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate)."""

    alpha: float = 1.702
    limit: float = 7.0

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


def sort_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts): the flattened [T * k] choices' positions sorted by expert id (stable: each expert's rows in
    token order; a position p is token p // k's choice p % k), and each expert's number of rows [E]."""
    flat = ids.reshape(-1)
    return torch.argsort(flat, stable=True), torch.bincount(flat, minlength=num_experts)


class FusedMoE(torch.nn.Module):
    """Every expert of one layer, stacked (see the module doc for the interface)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype,
                 tp: TPContext, what: str = "MoE intermediate size", activation: ClampedSwiGLU | None = None,
                 bias: bool = False):
        super().__init__()
        self.tp = tp
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.cols = tp.split(intermediate_size, what)  # this rank's [start, stop) of every expert's width
        inter = self.cols[1] - self.cols[0]
        self.intermediate = inter
        self.w13 = torch.nn.Parameter(torch.empty(num_experts, 2 * inter, hidden_size, dtype=dtype),
                                      requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.empty(num_experts, hidden_size, inter, dtype=dtype), requires_grad=False)
        self.activation = activation  # None: SiLU-and-mul
        self.w13_bias = torch.nn.Parameter(torch.zeros(num_experts, 2 * inter, dtype=dtype),
                                           requires_grad=False) if bias else None
        self.w2_bias = torch.nn.Parameter(torch.zeros(num_experts, hidden_size, dtype=dtype),
                                          requires_grad=False) if bias else None
        # per expert (gate_up, down) in any form ops.linear takes, when not the float stacks (GGUF blocks, ...)
        self.quantized_experts: list[tuple[Any, Any]] | None = None

    def load(self, weights, names: Callable[[int], tuple[str, str, str]]) -> None:
        """Expert e's gate / up rows and down columns of this rank from the tensors ``names(e)`` (a GGUF file's
        blocks kept as they are where the source and device allow: engine/layers/moe_gguf.py)."""
        if load_gguf_experts(self, weights, names):
            return
        i0, i1 = self.cols
        inter = self.intermediate
        for e in range(self.num_experts):
            gate, up, down = names(e)
            self.w13.data[e, :inter].copy_(self._checked(weights.get_slice(gate, 0, i0, i1), (inter, None), gate))
            self.w13.data[e, inter:].copy_(self._checked(weights.get_slice(up, 0, i0, i1), (inter, None), up))
            self.w2.data[e].copy_(self._checked(weights.get_slice(down, 1, i0, i1), (None, inter), down))

    def _checked(self, w: torch.Tensor, rows_cols: tuple[int | None, int | None], name: str) -> torch.Tensor:
        rows, cols = rows_cols
        want = (rows or self.hidden_size, cols or self.hidden_size)
        if tuple(w.shape) != want:
            raise ValueError(f"{name}: shape {tuple(w.shape)} does not fit this rank's expert slice {want}")
        return w

    def drop_float(self) -> None:
        """Free the float stacks (the experts then compute from ``quantized_experts``)."""
        for p in (self.w13, self.w2):
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def expert_weight(self, e: int, which: str):
        """Expert e's "gate_up" [2 I_r, H] or "down" [H, I_r] weight, in a form ops.linear takes."""
        if self.quantized_experts is not None:
            return self.quantized_experts[e][0 if which == "gate_up" else 1]
        return self.w13[e] if which == "gate_up" else self.w2[e]

    def expert_matmul(self, x: torch.Tensor, e: int, which: str) -> torch.Tensor:
        """Expert e on its rows x: "gate_up" -> silu(gate) * up [n, I_r]; "down" -> [n, H]."""
        w = self.expert_weight(e, which)
        if which == "down":
            return ops.linear(x, w, self.w2_bias[e] if self.w2_bias is not None and self.tp.rank == 0 else None)
        if self.activation is None and self.w13_bias is None:
            return ops.linear_silu_and_mul(x, w)
        gate_up = ops.linear(x, w, None if self.w13_bias is None else self.w13_bias[e])
        return ops.silu_and_mul(gate_up) if self.activation is None else self.activation(gate_up)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum over the chosen experts [T, H] of x [T, H] (not reduced over the ranks)."""
        plain = self.activation is None and self.w13_bias is None  # (the fused kernels: SiLU-and-mul, no biases)
        if x.is_cuda and plain and self.quantized_experts is None and fused_moe_ops.available():
            return fused_moe_ops.fused_moe(x, self.w13, self.w2, weights, ids)
        return self.experts_cpu(x, weights, ids)

    def experts_cpu(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Grouped by expert: each expert with rows runs gate_up and down once over all of them."""
        T, k = ids.shape
        order, counts = sort_by_expert(ids, self.num_experts)
        rows = order // k  # the token of each sorted choice
        xs = x.index_select(0, rows)
        out = torch.empty(T * k, self.hidden_size, dtype=x.dtype, device=x.device)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                seg = slice(start, start + n)
                out[seg] = self.expert_matmul(self.expert_matmul(xs[seg], e, "gate_up"), e, "down")
                start += n
        # as transformers: the expert's output times its float32 weight, cast back, summed per token
        scaled = (out * weights.reshape(-1)[order].unsqueeze(1)).to(x.dtype)
        return torch.zeros(T, self.hidden_size, dtype=x.dtype, device=x.device).index_add_(0, rows, scaled)
