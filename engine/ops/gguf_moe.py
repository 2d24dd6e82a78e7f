"""A mixture of experts' routed step on GGUF experts in one native call (csrc/cpu/moe.cpp ``moe_experts``): the
router's softmax top-k (optional) and every chosen expert's gate_up -> SiLU-and-mul -> down on the GGUF kernels,
grouped by expert, the outputs weighted and summed per token. One call instead of ~15 torch ops and three native
calls per active expert: at batch 1 a Qwen3-MoE-shape layer's routed part is then a few GEMVs over the active
experts' blocks, and the CPU decode tape (engine/runner/cpu_tape.py) records and replays it like any native call.

``GGUFExpertTable`` holds the experts' pointer arrays (built once at load); ``moe_experts`` checks and calls.
``reference.moe_experts``-style arithmetic: engine/layers/moe.py's FusedMoE.experts_cpu (the test compares them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.ops.gguf_quant import GGUFWeight
from engine.ops.native import dtype_code, mode, native_lib


@dataclass(frozen=True)
class GGUFExpertTable:
    """The E experts of one layer as GGUF blocks of one type per projection: int64 arrays of each expert's gate_up
    [2I, H] and down [H, I] data addresses (the weights themselves stay referenced here)."""

    gate_up: tuple[GGUFWeight, ...]
    down: tuple[GGUFWeight, ...]
    w13: torch.Tensor  # int64 [E]
    w2: torch.Tensor  # int64 [E]

    @property
    def intermediate(self) -> int:
        return self.gate_up[0].data.shape[0] // 2

    @property
    def hidden(self) -> int:
        return self.gate_up[0].k

    @classmethod
    def build(cls, experts) -> GGUFExpertTable | None:
        """From FusedMoE.quantized_experts ((gate_up, down) per expert); None unless every gate_up is a GGUFWeight
        of one type and shape, and every down too (a GGUFSegments or mixed types take the per-expert path), or
        engine._C lacks the op."""
        if native_lib is None or not hasattr(native_lib, "moe_experts") or not experts:
            return None
        gu, dn = [e[0] for e in experts], [e[1] for e in experts]
        for ws in (gu, dn):
            if not all(isinstance(w, GGUFWeight) and w.qtype == ws[0].qtype and w.shape == ws[0].shape for w in ws):
                return None
        if gu[0].shape[0] % 2 or dn[0].shape != (gu[0].k, gu[0].shape[0] // 2):
            return None
        ptrs = lambda ws: torch.tensor([w.data.data_ptr() for w in ws], dtype=torch.int64)  # noqa: E731
        return cls(tuple(gu), tuple(dn), ptrs(gu), ptrs(dn))


def moe_experts(x: torch.Tensor, table: GGUFExpertTable, top_k: int, *, logits: torch.Tensor | None = None,
                renormalize: bool = False, ids: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """out [T, H] (x's dtype) = sum over each token's k experts of weight * down(silu(gate(x)) * up(x)). Either
    ``logits`` [T, E] (x's dtype: softmax over the experts in float32, the top k, ties to the lower expert,
    ``renormalize``: divided by their sum) or ``ids`` (int64 [T, k]) with ``weights`` (float32 [T, k]). x [T, H] on
    the CPU, rows may be strided (last dim contiguous)."""
    T, H = x.shape
    E = table.w13.shape[0]
    dt = dtype_code(x.dtype)
    if dt is None or not x.is_cpu or x.stride(1) != 1 or H != table.hidden:
        raise ValueError(f"moe_experts: x must be a CPU float32 / bfloat16 / float16 [T, {table.hidden}] with "
                         f"contiguous rows, got {x.dtype} {tuple(x.shape)}")
    if logits is not None:
        if logits.dtype != x.dtype or logits.shape != (T, E) or not logits.is_contiguous():
            raise ValueError(f"moe_experts: logits must be a contiguous [{T}, {E}] of x's dtype")
        ids = torch.empty(T, top_k, dtype=torch.int64)
        weights = torch.empty(T, top_k, dtype=torch.float32)
        route = 2 if renormalize else 1
    else:
        if ids is None or weights is None or ids.shape != (T, top_k) or weights.shape != (T, top_k):
            raise ValueError("moe_experts: give logits, or ids and weights of shape [T, k]")
        ids = ids.to(torch.int64).contiguous()
        weights = weights.to(torch.float32).contiguous()
        route = 0
    out = torch.empty(T, H, dtype=x.dtype)
    g, d = table.gate_up[0], table.down[0]
    native_lib.moe_experts(dt | mode.flags, out.data_ptr(), x.data_ptr(), x.stride(0), T, H, table.intermediate,
                           top_k, 0 if logits is None else logits.data_ptr(), E, route, ids.data_ptr(),
                           weights.data_ptr(), table.w13.data_ptr(), g.data.shape[1], g.qtype,
                           table.w2.data_ptr(), d.data.shape[1], d.qtype)
    return out
