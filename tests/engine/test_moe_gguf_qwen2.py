"""Qwen2-MoE from GGUF (llama.cpp's ``qwen2moe``): q/k/v biases, a shared expert (``ffn_{gate,up,down}_shexp``)
scaled by sigmoid(x . ``ffn_gate_inp_shexp``), the routed top-2 not renormalized (norm_topk_prob False, as
llama.cpp runs these files). The file is written by the test from a tiny random Qwen2MoeForCausalLM
(tests/support/gguf_moe_writer.py: hidden and expert width 256, shared expert 512, 4 experts, 2 layers).

- F32 file: logits within 1e-4 of transformers (the model itself: the file holds its values exactly), greedy tokens
  equal to transformers' ``generate``.
- Q8_0 file, ``--quantization none`` (dequantized at load): logits within 1e-4 of transformers on the file's values.
- Q8_0 file, ``--quantization gguf``: the experts and the shared expert kept as the file's blocks, the bounds of
  tests/engine/test_moe_gguf.py (logits within 8% of the largest |logit| at >= 90% of the positions, argmax
  agreement >= 75%, decode teacher-forced near the reference's maximum at >= 75% of the steps)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.layers.moe import FusedMoE
from engine.layers.moe_gguf import expert_bytes
from engine.models.moe_block import MoEBlock
from engine.ops import GGUFWeight
from tests.support.gguf_moe_writer import build_moe_model, dequantized_reference, write_moe_gguf


@pytest.fixture(scope="module")
def qwen2_moe():
    return build_moe_model("qwen2_moe", seed=3)


@pytest.fixture(scope="module")
def f32_file(qwen2_moe, tmp_path_factory, smollm2_gguf):
    work = tmp_path_factory.mktemp("qwen2moe-f32")
    path, _ = write_moe_gguf(qwen2_moe, work / "qwen2moe.F32.gguf", "F32", smollm2_gguf, work)
    return path


@pytest.fixture(scope="module")
def q8_file(qwen2_moe, tmp_path_factory, smollm2_gguf):
    work = tmp_path_factory.mktemp("qwen2moe-q8")
    path, deq = write_moe_gguf(qwen2_moe, work / "qwen2moe.Q8_0.gguf", "Q8_0", smollm2_gguf, work)
    return path, dequantized_reference(qwen2_moe, deq, work)


def _prompt(n: int = 37) -> list[int]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def _blocks(llm) -> list[MoEBlock]:
    return [m for m in llm.core.runner.model.modules() if isinstance(m, MoEBlock)]


@pytest.mark.parametrize("shared_length", [True, False])
def test_config_from_the_metadata(qwen2_moe, q8_file, tmp_path, smollm2_gguf, shared_length):
    """The Qwen2-MoE keys of the file's config; without expert_shared_feed_forward_length (early files) the shared
    expert's width is read from ffn_up_shexp's rows."""
    from engine.loader.gguf import gguf_hf_config
    from engine.loader.gguf_file import GGUFFile

    path = q8_file[0] if shared_length else write_moe_gguf(qwen2_moe, tmp_path / "no-shared-length.gguf", "Q8_0",
                                                           smollm2_gguf, tmp_path, shared_length=False)[0]
    gf = GGUFFile(path)
    try:
        assert ("qwen2moe.expert_shared_feed_forward_length" in gf.metadata) == shared_length
        cfg = gguf_hf_config(gf)
    finally:
        gf.close()
    assert cfg["architectures"] == ["Qwen2MoeForCausalLM"] and cfg["model_type"] == "qwen2_moe"
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (4, 2, 256)
    assert cfg["shared_expert_intermediate_size"] == 512 and cfg["norm_topk_prob"] is False
    assert cfg["attention_bias"] is True and cfg["decoder_sparse_step"] == 1 and cfg["mlp_only_layers"] == []


def test_f32_file_equals_transformers(f32_file, qwen2_moe):
    with LLM(str(f32_file), dtype="float32", kv_cache_memory_gib=0.05) as llm:
        assert type(llm.core.runner.model).__name__ == "QwenMoeForCausalLM"
        blocks = _blocks(llm)
        assert len(blocks) == 2
        for i, b in enumerate(blocks):
            assert b.shared_expert is not None and not b.gate.routing.renormalize
            want = qwen2_moe.model.layers[i].mlp.shared_expert_gate.weight
            torch.testing.assert_close(b.shared_expert_gate.data, want, atol=0, rtol=0)
        ids = _prompt()
        with torch.no_grad():
            want = qwen2_moe(torch.tensor([ids])).logits[0].float()
        got = llm.core.score(ids)
        print(f"qwen2moe F32: max |logit diff| {float((got - want).abs().max()):.3g}")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        out = llm.generate([ids[:9]], SamplingParams(max_tokens=12, min_tokens=12, temperature=0))
        with torch.no_grad():
            ref = qwen2_moe.generate(torch.tensor([ids[:9]]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
        assert out[0].outputs[0].token_ids == ref[0, 9:].tolist()


def test_q8_dequantized_equals_transformers(q8_file):
    path, ref = q8_file
    with LLM(str(path), dtype="float32", quantization="none", kv_cache_memory_gib=0.05) as llm:
        ids = _prompt()
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].float()
        got = llm.core.score(ids)
        print(f"qwen2moe Q8_0 dequantized: max |logit diff| {float((got - want).abs().max()):.3g}")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_q8_blocks_kept_close_to_transformers(q8_file):
    path, ref = q8_file
    from engine.loader.gguf_file import GGUFFile

    with LLM(str(path), dtype="float32", quantization="gguf", kv_cache_memory_gib=0.05) as llm:
        moes = [m for m in llm.core.runner.model.modules() if isinstance(m, FusedMoE)]
        assert len(moes) == 2
        for m in moes:
            assert m.w13.numel() == 0 and m.w2.numel() == 0 and len(m.quantized_experts) == 4
            assert {gu.type_name for gu, _ in m.quantized_experts} == {"Q8_0"}
            assert all(isinstance(dn, GGUFWeight) and dn.type_name == "Q8_0" for _, dn in m.quantized_experts)
        for b in _blocks(llm):  # the shared expert's linears kept as blocks too, its gate a float row
            for lin in (b.shared_expert.gate_up_proj, b.shared_expert.down_proj):
                assert isinstance(lin.matmul_weight, GGUFWeight) and lin.matmul_weight.type_name == "Q8_0"
            assert b.shared_expert_gate.dtype == torch.float32
        gf = GGUFFile(path)
        try:
            file_expert_bytes = sum(t.nbytes for n, t in gf.tensors.items() if "_exps." in n)
            assert {n.split(".", 2)[2] for n in gf.tensors if "shexp" in n} == {
                "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight"}
        finally:
            gf.close()
        assert sum(expert_bytes(m) for m in moes) == file_expert_bytes
        ids = _prompt()
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].float()
        got = llm.core.score(ids)
        diff = (got - want).abs().max(-1).values
        agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        print(f"qwen2moe Q8_0 blocks: max |diff| / max |logit| {float(diff.max() / want.abs().max()):.3g}, "
              f"argmax agreement {agree:.2f}")
        assert float((diff <= 0.08 * want.abs().max()).float().mean()) >= 0.9
        assert agree >= 0.75
        out = llm.generate([ids[:9]], SamplingParams(max_tokens=12, min_tokens=12, temperature=0))
        gen = out[0].outputs[0].token_ids
        with torch.no_grad():
            steps = ref(torch.tensor([ids[:9] + gen])).logits[0].float()[8:-1]
        chosen = steps.gather(1, torch.tensor(gen).unsqueeze(1)).squeeze(1)
        near = (steps.max(dim=1).values - chosen) <= 0.08 * steps.abs().max()
        assert float(near.float().mean()) >= 0.75
