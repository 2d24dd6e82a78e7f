"""The fused MoE path compiled on a GPU (engine/ops/fused_moe.py; tests/unit/test_moe.py runs it in the
interpreter): the grouped kernels against a per-expert torch reference at Qwen3-30B-A3B's expert shape (128
experts of 768, top-8, hidden 2048) for a decode, a small batch and a prefill, bf16 and fp32; a CUDA graph captures
it (no host synchronisation) and replays it on new routing; the tiny MoE models on the GPU against transformers."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine.ops import fused_moe as fm
from tests.support.tiny_models import MOE_ARCHS


def _reference(x, w13, w2, weights, ids):
    """Per expert on its tokens, in float32."""
    T, k = ids.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = x[tok].float() @ w13[e].float().t()
        a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        out.index_add_(0, tok, (a @ w2[e].float().t()) * weights[tok, slot, None])
    return out


def _problem(T, E=128, k=8, H=2048, inter=768, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, H, device="cuda", generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * inter, H, device="cuda", generator=g) * H ** -0.5).to(dtype)
    w2 = (torch.randn(E, H, inter, device="cuda", generator=g) * inter ** -0.5).to(dtype)
    logits = torch.randn(T, E, device="cuda", generator=g)
    weights, ids = torch.softmax(logits, -1).topk(k, dim=-1)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("T", [1, 16, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_moe_cuda_equals_reference(T, dtype):
    x, w13, w2, weights, ids = _problem(T, dtype=dtype)
    out = fm.fused_moe(x, w13, w2, weights, ids)
    ref = _reference(x, w13, w2, weights, ids)
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert err <= (1e-4 if dtype == torch.float32 else 2e-2), err


def test_fused_moe_in_a_cuda_graph():
    x, w13, w2, weights, ids = _problem(4, E=16, k=2, H=256, inter=128)
    fm.fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fm.fused_moe(x, w13, w2, weights, ids)
    x2, _, _, weights2, ids2 = _problem(4, E=16, k=2, H=256, inter=128, seed=1)
    x.copy_(x2)
    weights.copy_(weights2)
    ids.copy_(ids2)
    graph.replay()
    ref = _reference(x, w13, w2, weights, ids)
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() <= 2e-2


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_models_on_the_gpu_match_transformers(arch, tiny_model_dir, hf_reference):
    from engine.llm import LLM

    path = tiny_model_dir(arch)
    hf = hf_reference(path)
    with LLM(str(path), dtype="float32", device="cuda", kv_cache_memory_gib=0.25) as llm:
        ids = torch.randint(3, llm.core.model_config.vocab_size, (37,),
                            generator=torch.Generator().manual_seed(0)).tolist()
        ours = llm.core.score(ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours.cpu(), ref, atol=1e-3, rtol=1e-3)
