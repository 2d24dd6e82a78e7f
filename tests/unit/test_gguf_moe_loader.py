"""Mixture-of-experts GGUF files (llama.cpp's names) as the loader reads them: the random Qwen3-MoE file that
`kestrel bench offline --gguf-models qwen3moe-*` writes (engine/bench/gguf_moe_models.py), its config, and each
expert's matrix under the checkpoint's per-expert name, as values (get) and as blocks (quantized_slice); Mixtral's
names on a llama-arch file with experts. No engine is built."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from engine.bench.gguf_models import BENCH_MODELS, ensure_random_llama
from engine.bench.gguf_moe_models import RandomQwen3Moe, active_weight_bytes, random_blocks, small_moe_shape
from engine.loader.gguf import GGUFWeights, expert_names, gguf_hf_config, gguf_quantization, hf_name
from engine.loader.gguf_file import GGUFFile


def test_default_shape_is_qwen3_moe_like():
    spec = BENCH_MODELS["qwen3moe-q4_k"]
    s = spec.shape
    assert (s.layers, s.hidden, s.experts, s.experts_used, s.head_dim) == (24, 1024, 32, 4, 128)
    assert BENCH_MODELS["qwen3moe-q8_0"].qtype == "Q8_0" and spec.qtype == "Q4_K"
    assert 1.3e9 < s.params(49152) < 1.6e9 and 0.25e9 < s.active_params(49152) < 0.35e9


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_random_blocks_have_the_asked_spread(qtype):
    rng = np.random.default_rng(0)
    values = quants.dequantize(random_blocks(qtype, 256 * 512, 0.02, rng), GGMLQuantizationType[qtype])
    assert abs(values.std() - 0.02) < 0.002 and abs(values.mean()) < 0.002


@pytest.fixture(scope="module", params=["Q8_0", "Q4_K"])
def moe_file(request, tmp_path_factory):
    spec = RandomQwen3Moe(request.param, small_moe_shape(seed=2))
    path = ensure_random_llama(spec, tmp_path_factory.mktemp("moe"))
    gf = GGUFFile(path)
    yield spec, gf
    gf.close()


def test_config_of_a_qwen3moe_file(moe_file):
    spec, gf = moe_file
    s = spec.shape
    cfg = gguf_hf_config(gf)
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (4, 2, 256)
    assert cfg["norm_topk_prob"] is True and cfg["head_dim"] == 64 and not cfg["tie_word_embeddings"]
    assert gguf_quantization(gf) == {"Q8_0": "Q8_0", "Q4_K": "Q4_K_S"}[spec.qtype]
    total, active = active_weight_bytes(gf.tensors, gf.metadata)
    experts = sum(t.nbytes for n, t in gf.tensors.items() if "_exps." in n)
    assert total == sum(t.nbytes for t in gf.tensors.values() if len(t.shape) >= 2)
    table = gf.tensors["token_embd.weight"]
    assert active == total - experts // 2 - table.nbytes + table.nbytes // table.shape[0]


def test_each_expert_is_its_part_of_the_3d_tensor(moe_file):
    spec, gf = moe_file
    qt = GGMLQuantizationType[spec.qtype]
    w = GGUFWeights(gf, 4, 2)
    names = w.names()
    assert "model.layers.1.mlp.gate.weight" in names and w.shape("model.layers.1.mlp.gate.weight") == (4, 256)
    for proj, gguf_name, shape in (("gate_proj", "ffn_gate_exps", (256, 256)), ("down_proj", "ffn_down_exps",
                                                                               (256, 256))):
        whole = quants.dequantize(gf.raw(f"blk.1.{gguf_name}.weight"), qt)
        assert whole.shape == (4, *shape)
        for e in range(4):
            name = f"model.layers.1.mlp.experts.{e}.{proj}.weight"
            assert w.shape(name) == shape and w.quant_type(name) == spec.qtype
            assert np.array_equal(w.get(name).numpy(), whole[e]), name
        assert not np.array_equal(whole[0], whole[1])
    w.keep_quantized = True
    blocks, qtype, k = w.quantized_slice("model.layers.0.mlp.experts.3.up_proj.weight", 0, 64, 128, {8, 12})
    raw = gf.raw("blk.0.ffn_up_exps.weight")
    assert qtype == int(qt) and k == 256 and np.array_equal(blocks, raw[3, 64:128])


def test_mixtral_names():
    assert hf_name("blk.3.ffn_gate_inp.weight", mixtral=True) == "model.layers.3.block_sparse_moe.gate.weight"
    assert hf_name("blk.3.ffn_gate_inp.weight") == "model.layers.3.mlp.gate.weight"
    assert expert_names("blk.0.ffn_down_exps.weight", 2, mixtral=True) == [
        "model.layers.0.block_sparse_moe.experts.0.w2.weight", "model.layers.0.block_sparse_moe.experts.1.w2.weight"]
    assert expert_names("blk.0.ffn_up_exps.weight", 1) == ["model.layers.0.mlp.experts.0.up_proj.weight"]
    assert hf_name("blk.0.ffn_gate_inp_shexp.weight") == "model.layers.0.mlp.shared_expert_gate.weight"
    assert expert_names("blk.0.attn_q.weight", 2) is None
