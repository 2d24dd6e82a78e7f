"""GGUF experts kept as their blocks: a ``FusedMoE``'s experts read from a GGUF file's 3-D expert tensors
(llama.cpp's ``ffn_{gate,up,down}_exps``, exposed per expert by engine/loader/gguf.py under the checkpoint's
per-expert names) as ``ops.GGUFWeight`` blocks (Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K), one
(gate_up, down) pair per expert in ``FusedMoE.quantized_experts``, computed on by the same native kernels as the
dense GGUF linears (``ops.linear`` -> ``gguf_linear``). The float stacks are never filled: the model takes about
the file's size in memory, and a decode reads only its active experts' blocks."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine import ops
from engine.expert_blocks import refusal, splits_on_blocks
from engine.ops.gguf_moe import GGUFExpertTable, moe_experts
from engine.ops.gguf_quant import fuse_rows


def load_gguf_experts(moe, weights, names: Callable[[int], tuple[str, str, str]]) -> bool:
    """Fill ``moe.quantized_experts`` (engine/layers/moe.py's FusedMoE) with GGUF blocks: expert e's gate and up
    rows of this rank stacked (gate then up, as ``w13``), its down columns of this rank; then drop the float
    stacks. False, with ``moe`` untouched, when the source keeps no blocks (not a GGUF, ``--quantization none``,
    a GPU, a type without a kernel): the caller loads float weights. Raises ModelLoadError, with ``moe`` untouched,
    when this rank's down columns are not whole blocks (``_check_column_split``)."""
    get = getattr(weights, "quantized_slice", None)
    if get is None or moe.w13.device.type != "cpu":
        return False
    i0, i1 = moe.cols
    kinds = ops.GGUFWeight.KERNEL_TYPES
    _check_column_split(moe, weights, names(0)[2], kinds)
    experts = []
    for e in range(moe.num_experts):
        gate, up, down = names(e)
        got = [get(gate, 0, i0, i1, kinds), get(up, 0, i0, i1, kinds), get(down, 1, i0, i1, kinds)]
        if any(g is None for g in got):
            return False
        gate_w, up_w, down_w = (ops.GGUFWeight.from_blocks(*g) for g in got)
        gate_up = fuse_rows([gate_w, up_w])
        want_gu, want_down = (2 * moe.intermediate, moe.hidden_size), (moe.hidden_size, moe.intermediate)
        if tuple(gate_up.shape) != want_gu or tuple(down_w.shape) != want_down:
            raise ValueError(f"{gate}: GGUF expert blocks of shapes {tuple(gate_up.shape)} / {tuple(down_w.shape)} "
                             f"do not fit this rank's expert {want_gu} / {want_down}")
        experts.append((gate_up, down_w))
    moe.quantized_experts = experts
    moe.gguf_table = GGUFExpertTable.build(experts)  # the one-call routed step (routed_native), where it applies
    moe.drop_float()
    return True


def _check_column_split(moe, weights, down: str, kinds) -> None:
    """Refuse, before any weight loads, tensor parallelism whose per-rank slice of the experts' width is not a whole
    number of the down projections' blocks (a K-quant's 256 columns: Qwen3-30B-A3B's 768 at TP=2): those blocks
    cannot be split per rank, and dequantizing the experts instead (what such a load did before, silently) takes
    several times the file's memory and computes other values than one rank does on the blocks (other greedy
    tokens, seen). The message (engine/expert_blocks.py, shared with the check before a TP engine's workers start)
    names the sizes that split on block boundaries and --quantization none (the experts dequantized, on purpose)."""
    column_block = getattr(weights, "column_block", None)
    found = column_block(down, kinds) if column_block is not None else None
    width, size = moe.intermediate * moe.tp.size, moe.tp.size
    if found is None or splits_on_blocks(width, size, found[1]):
        return
    from engine.errors import ModelLoadError

    type_name, block, type_size = found
    growth = moe.w13.element_size() * block / type_size
    raise ModelLoadError(refusal(str(getattr(weights, "path", "the GGUF file")), type_name, block, width, size, growth,
                                 str(moe.w13.dtype).removeprefix("torch.")))


def routed_native(moe, router, x: torch.Tensor) -> torch.Tensor | None:
    """The routed experts' output [T, H] (this rank's partial sum) in one native call (engine/ops/gguf_moe.py),
    for GGUF experts of one type per projection: under a plain softmax top-k router (Mixtral, Qwen2/3-MoE) the
    router's logits by the native linear, then the op's own softmax top-k; under any other rule (DeepSeek's
    group limits, sigmoid with the correction bias, routed scaling) ``router(x)`` chooses in torch, exactly as
    transformers, and the op takes its ids and weights. None without such experts or for another scoring (the
    caller routes with ``router(x)`` and runs ``moe(x, weights, ids)``)."""
    table = getattr(moe, "gguf_table", None)
    r = router.routing
    if table is None or not x.is_cpu or x.stride(-1) != 1 or r.scoring not in ("softmax", "sigmoid"):
        return None
    if (r.scoring != "softmax" or r.group_score is not None or r.routed_scaling_factor != 1.0 or r.logits_fp32
            or router.correction_bias is not None or router.weight.dtype != x.dtype):
        weights, ids = router(x)
        return moe_experts(x, table, r.top_k, ids=ids, weights=weights)
    return moe_experts(x, table, r.top_k, logits=router.logits(x), renormalize=r.renormalize)


def expert_bytes(moe) -> int:
    """The bytes of a FusedMoE's GGUF expert blocks (0 when it holds float stacks)."""
    if moe.quantized_experts is None:
        return 0
    return sum(gu.nbytes + dn.nbytes for gu, dn in moe.quantized_experts)
