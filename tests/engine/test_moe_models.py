"""Mixture-of-experts models against transformers: tiny random Mixtral, Qwen2-MoE (shared expert with its gate, a
dense layer by mlp_only_layers, q/k/v biases) and Qwen3-MoE (q/k norms, norm_topk_prob, tied embeddings), written
with transformers (float32, CPU) and loaded from their safetensors (experts.N.w1/w2/w3, experts.N.gate_proj/...
stacked at load): every position's logits within 1e-4 of transformers', and greedy tokens that are transformers'
argmax at every step (teacher-forced: random tiny models have near-flat distributions, so a token within float32
noise of the max counts). The per-arch bound and the largest difference seen are printed (-s)."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.layers.moe import FusedMoE
from tests.support.tiny_models import MOE_ARCHS

LOGIT_BOUND = 1e-4


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_logits_and_greedy_match_transformers(arch, tiny_model_dir, hf_reference):
    path = tiny_model_dir(arch)
    hf = hf_reference(path)
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.05)
    model = llm.core.runner.model
    assert type(model).__name__ == {"mixtral": "MixtralForCausalLM"}.get(arch, "QwenMoeForCausalLM")
    moe_layers = [i for i, layer in enumerate(model.layers) if hasattr(layer.mlp, "experts")]
    assert moe_layers == ([0] if arch == "qwen2_moe" else [0, 1])  # qwen2_moe: mlp_only_layers=[1]
    assert isinstance(model.layers[0].mlp.experts, FusedMoE)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, llm.core.model_config.vocab_size, (37,), generator=g).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = llm.core.score(ids)
    print(f"{arch}: max |logit diff| {float((ours - ref).abs().max()):.3g} (bound {LOGIT_BOUND})")
    torch.testing.assert_close(ours, ref, atol=LOGIT_BOUND, rtol=LOGIT_BOUND)
    out = llm.generate([ids, ids[:11]], SamplingParams(max_tokens=16, min_tokens=16, temperature=0))
    for prompt, o in zip((ids, ids[:11]), out):
        gen = o.outputs[0].token_ids
        with torch.no_grad():
            steps = hf(torch.tensor([prompt + gen])).logits[0].float()[len(prompt) - 1:-1]
        chosen = steps.gather(1, torch.tensor(gen).unsqueeze(1)).squeeze(1)
        assert (chosen >= steps.max(dim=1).values - 1e-5).all(), arch
