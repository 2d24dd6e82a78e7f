"""DeepSeek-V2 / V3 from GGUF files (llama.cpp's ``deepseek2``: engine/loader/gguf_deepseek.py), written by the test
the way llama.cpp's converter writes them (tests/support/gguf_deepseek_writer.py) from tiny random transformers
models: V2 without q_lora_rank and with group_limited_greedy routing and routed scaling; V3 with q_lora_rank, YaRN,
noaux_tc routing (sigmoid, the correction bias) and norm_topk_prob. One dense layer, then two MoE layers (8 experts,
2 per token, 4 groups of which 2 are kept, one shared expert); hidden and expert width 256 (K-quant rows).

- float32 files, V2 with kv_b_proj split into attn_k_b / attn_v_b (newer files), V3 with attn_kv_b and the older
  key_length keys: logits within 1e-4 of transformers at every prompt position, 8 greedy tokens equal to
  transformers' greedy choices (its argmax after each prefix, from one forward pass: generate()'s tokens, cheaper).
- quantized files (V2: experts Q8_0, V3: experts Q4_K; every other matrix Q8_0), against transformers on the values
  the file holds: dequantized at load (``--quantization none``) logits within 1e-4 and greedy tokens equal to
  transformers'; the experts kept as the file's blocks (``--quantization gguf``), routed by
  transformers' rule in torch and run by the native op (engine/layers/moe_gguf.py routed_native): logits within 8%
  of the largest |logit| at >= 90% of the positions and argmax agreement >= 75% (tests/engine/test_moe_gguf.py's
  bounds: the kernels quantize the activations per block, as llama.cpp does).
- a deepseek2 file without kv_lora_rank fails at load naming the key."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import CheckpointError
from engine.layers.moe import FusedMoE
from engine.layers.moe_gguf import expert_bytes, routed_native
from engine.loader.gguf import gguf_hf_config
from engine.loader.gguf_file import GGUFFile
from engine.models.moe_block import MoEBlock
from engine.ops import GGUFWeight
from tests.support.gguf_deepseek_writer import build_deepseek_model, write_deepseek_gguf
from tests.support.gguf_moe_writer import dequantized_reference

# (version, expert type or None for float32, kv_b split)
FILES = {"v2-f32-split": ("v2", None, True), "v3-f32-kv_b": ("v3", None, False),
         "v2-Q8_0": ("v2", "Q8_0", True), "v3-Q4_K": ("v3", "Q4_K", True)}
GREEDY = SamplingParams(max_tokens=8, min_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def models():
    return {v: build_deepseek_model(v, seed=i) for i, v in enumerate(("v2", "v3"))}


@pytest.fixture(scope="module")
def gguf_file(models, tmp_path_factory, smollm2_gguf):
    """``gguf_file(key) -> (path, transformers reference on the file's values)``, written once per module."""
    made: dict[str, tuple] = {}

    def make(key: str):
        if key not in made:
            version, qtype, split = FILES[key]
            work = tmp_path_factory.mktemp(key)
            path, deq = write_deepseek_gguf(models[version], work / f"{key}.gguf", qtype, smollm2_gguf, work,
                                            split_kv_b=split)
            made[key] = (path, models[version] if qtype is None else dequantized_reference(models[version], deq,
                                                                                           work))
        return made[key]

    return make


def _prompt(n: int = 37) -> list[int]:
    return torch.randint(3, 4096, (n,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.mark.parametrize("key", ["v2-f32-split", "v3-f32-kv_b"])
def test_config_from_the_metadata(key, gguf_file, models):
    path, _ = gguf_file(key)
    hf = models[FILES[key][0]].config
    gf = GGUFFile(path)
    try:
        cfg = gguf_hf_config(gf)
    finally:
        gf.close()
    assert cfg["architectures"] == hf.architectures
    for name in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
                 "num_attention_heads", "num_key_value_heads", "intermediate_size"):
        assert cfg[name] == getattr(hf, name), name
    if key.startswith("v2"):
        assert cfg["topk_method"] == "group_limited_greedy" and cfg["scoring_func"] == "softmax"
    else:
        assert cfg["topk_method"] == "noaux_tc" and cfg["scoring_func"] == "sigmoid"
        scaling = hf.rope_parameters
        assert {k: cfg["rope_scaling"][k] for k in ("rope_type", "factor", "mscale", "mscale_all_dim",
                                                    "original_max_position_embeddings")} == {
            k: scaling[k] for k in ("rope_type", "factor", "mscale", "mscale_all_dim",
                                    "original_max_position_embeddings")}


@pytest.mark.parametrize("key", ["v2-f32-split", "v3-f32-kv_b"])
def test_float_file_matches_transformers(key, gguf_file):
    path, hf = gguf_file(key)
    ids = _prompt()
    with LLM(str(path), dtype="float32", quantization="none", kv_cache_memory_gib=0.02) as llm:
        assert type(llm.core.runner.model).__name__ == "DeepseekForCausalLM"
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        got = llm.core.score(ids)
        print(f"{key}: max |logit diff| {float((got - ref).abs().max()):.3g}")
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        gen = llm.generate([ids], GREEDY)[0].outputs[0].token_ids
    assert gen == _greedy(hf, ids, gen)


def _greedy(ref, ids: list[int], gen: list[int]) -> list[int]:
    """transformers' greedy token after each prefix ids + gen[:i], from one forward pass over ids + gen (equal to
    its generate() wherever gen agrees with it: the same prefixes)."""
    with torch.no_grad():
        return ref(torch.tensor([ids + gen])).logits[0, len(ids) - 1:-1].argmax(-1).tolist()


@pytest.mark.parametrize("key", ["v2-Q8_0", "v3-Q4_K"])
def test_quantized_file_dequantized_equals_transformers(key, gguf_file):
    path, ref = gguf_file(key)
    ids = _prompt()
    with LLM(str(path), dtype="float32", quantization="none", kv_cache_memory_gib=0.02) as llm:
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].float()
        got = llm.core.score(ids)
        print(f"{key} dequantized: max |logit diff| {float((got - want).abs().max()):.3g}")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        gen = llm.generate([ids], GREEDY)[0].outputs[0].token_ids
    assert gen == _greedy(ref, ids, gen)


@pytest.mark.parametrize("key", ["v2-Q8_0", "v3-Q4_K"])
def test_experts_kept_as_blocks(key, gguf_file):
    path, ref = gguf_file(key)
    qtype = FILES[key][1]
    with LLM(str(path), dtype="float32", quantization="gguf", kv_cache_memory_gib=0.02) as llm:
        model = llm.core.runner.model
        moes = [m for m in model.modules() if isinstance(m, FusedMoE)]
        assert len(moes) == 2
        for m in moes:
            assert m.w13.numel() == 0 and m.gguf_table is not None and len(m.quantized_experts) == 8
            assert {(type(gu), gu.type_name, dn.type_name) for gu, dn in m.quantized_experts} == {
                (GGUFWeight, qtype, qtype)}
        gf = GGUFFile(path)
        try:
            assert sum(map(expert_bytes, moes)) == sum(t.nbytes for n, t in gf.tensors.items() if "_exps." in n)
        finally:
            gf.close()
        # the one-call routed step with transformers' routing (groups, scaling, sigmoid + bias) given to the op
        # equals the per-expert path on the same blocks
        block = next(m for m in model.modules() if isinstance(m, MoEBlock))
        x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3))
        weights, chosen = block.gate(x)
        torch.testing.assert_close(routed_native(block.experts, block.gate, x),
                                   block.experts.experts_cpu(x, weights, chosen), atol=1e-5, rtol=1e-4)
        ids = _prompt()
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].float()
        got = llm.core.score(ids)
        diff = (got - want).abs().max(-1).values
        agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        print(f"{key} blocks: max |diff| / max |logit| {float(diff.max() / want.abs().max()):.3g}, "
              f"argmax agreement {agree:.2f}")
        assert float((diff <= 0.08 * want.abs().max()).float().mean()) >= 0.9
        assert agree >= 0.75


def test_missing_key_is_named(models, tmp_path, smollm2_gguf):
    path, _ = write_deepseek_gguf(models["v2"], tmp_path / "no-rank.gguf", None, smollm2_gguf, tmp_path,
                                  omit=frozenset({"attention.kv_lora_rank"}), tensors=False)
    with pytest.raises(CheckpointError, match=r"lacks 'deepseek2\.attention\.kv_lora_rank'"):
        LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02)
