"""The one-call routed step on GGUF experts (engine/ops/gguf_moe.py -> csrc/cpu/moe.cpp moe_experts) against its
references: the per-expert path it replaces (engine/layers/moe.py FusedMoE.experts_cpu on the same GGUF blocks,
routing by select_experts) within float summation order, and plain torch on the dequantized experts within the
activations' per-block int8 rounding. Decode (1 row) and prefill (many rows per expert) sizes, Q8_0 and Q4_K,
given routing and the op's own softmax top-k (with and without renormalisation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.bench.gguf_moe_models import random_blocks
from engine.layers.moe import FusedMoE, Routing, select_experts
from engine.ops import GGUFWeight
from engine.ops.gguf_moe import GGUFExpertTable, moe_experts
from engine.parallel.context import TPContext

E, H, INTER, K = 6, 256, 256, 2
QTYPES = {"Q8_0": 8, "Q4_K": 12}


def _experts(qtype: str, seed: int):
    rng = np.random.default_rng(seed)
    make = lambda n, k: GGUFWeight.from_blocks(  # noqa: E731
        random_blocks(qtype, n * k, 0.05, rng).reshape(n, -1), QTYPES[qtype], k)
    return [(make(2 * INTER, H), make(H, INTER)) for _ in range(E)]


def _per_expert_path(experts, x, weights, ids):
    moe = FusedMoE(E, H, INTER, x.dtype, TPContext())
    moe.quantized_experts = experts
    moe.drop_float()
    return moe.experts_cpu(x, weights, ids)


@pytest.mark.parametrize("qtype", list(QTYPES))
@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("renormalize", [False, True])
def test_one_call_equals_the_per_expert_path(qtype, rows, renormalize):
    experts = _experts(qtype, seed=rows)
    table = GGUFExpertTable.build(experts)
    assert table is not None and table.intermediate == INTER and table.hidden == H
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, H, generator=g)
    logits = torch.randn(rows, E, generator=g)
    weights, ids = select_experts(logits, Routing(top_k=K, renormalize=renormalize))
    want = _per_expert_path(experts, x, weights, ids)
    routed = moe_experts(x, table, K, logits=logits, renormalize=renormalize)  # the op's own routing
    given = moe_experts(x, table, K, ids=ids, weights=weights)
    torch.testing.assert_close(given, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(routed, want, atol=1e-5, rtol=1e-5)
    # plain torch on the dequantized experts: the kernels quantize x per block of 32 (llama.cpp's Q8 activations)
    ref = torch.zeros(rows, H)
    for t in range(rows):
        for j in range(K):
            gu, dn = experts[int(ids[t, j])]
            h = gu.dequantize() @ x[t]
            a = torch.nn.functional.silu(h[:INTER]) * h[INTER:]
            ref[t] += weights[t, j] * (dn.dequantize() @ a)
    assert float((routed - ref).abs().max()) <= 0.03 * float(ref.abs().max())


def test_bfloat16_and_strided_rows():
    experts = _experts("Q8_0", seed=7)
    table = GGUFExpertTable.build(experts)
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(5, 2 * H, generator=g).to(torch.bfloat16)
    x = wide[:, :H]  # rows 2H apart
    logits = torch.randn(5, E, generator=g).to(torch.bfloat16)
    weights, ids = select_experts(logits, Routing(top_k=K, renormalize=True))
    want = _per_expert_path(experts, x.contiguous(), weights, ids)
    got = moe_experts(x, table, K, logits=logits, renormalize=True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_mixed_types_take_the_per_expert_path():
    experts = _experts("Q8_0", seed=1)
    other = _experts("Q4_K", seed=2)
    assert GGUFExpertTable.build(experts[:-1] + other[-1:]) is None
    with pytest.raises(ValueError):
        moe_experts(torch.randn(2, H + 32), GGUFExpertTable.build(experts), K, logits=torch.randn(2, E))
