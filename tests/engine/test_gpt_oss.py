"""gpt-oss (engine/models/gpt_oss.py) against transformers, float32 on the CPU.

A tiny random GptOssConfig written with transformers: 2 layers (the first sliding with a window of 8 tokens, the
second full), 4 heads over 2 KV heads, 4 experts top-2, YaRN rope (transformers' default for gpt-oss). Weights drawn
so that every part counts: sinks of about +-1 (a head's sink takes a visible share next to ~8 keys), router weights
well apart (no near-tie in the top-k), expert biases large enough that the SwiGLU clamp at 7 cuts some values. The
experts' weights are MXFP4 values (the test's packer, tests/support/mxfp4.py, applied and undone), so the same model
is also written as an MXFP4 checkpoint (*_blocks / *_scales, quant_method mxfp4) that must load to the same logits.
Prompts longer and shorter than the window; greedy decodes run past it.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.layers.moe import TOPK_SOFTMAX, FusedMoE
from engine.layers.sink_attention import SinkAttention
from engine.loader.mxfp4 import Mxfp4Weights, dequantize_mxfp4
from engine.models.gpt_oss import GptOssForCausalLM
from engine.parallel.context import SINGLE
from tests.support.mxfp4 import pack_mxfp4

LOGIT_BOUND = 1e-4
WINDOW = 8
VOCAB = 49152
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, head_dim=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=WINDOW, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=2,
            tie_word_embeddings=False)
GREEDY = SamplingParams(max_tokens=12, min_tokens=12, temperature=0)
EXPERT_MATRICES = ("gate_up_proj", "down_proj")


def _mxfp4_values(w: torch.Tensor) -> torch.Tensor:
    """transformers' [E, K, N] expert weight rounded to MXFP4 (packed in the checkpoint's [E, N, K] layout)."""
    return dequantize_mxfp4(*pack_mxfp4(w.transpose(1, 2))).transpose(1, 2).contiguous()


def _build():
    from transformers import GptOssConfig, GptOssForCausalLM as HFGptOss

    config = GptOssConfig(**TINY)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    torch.manual_seed(0)
    model = HFGptOss(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("sinks"):
                p.copy_(noise)
            elif "router" in name:
                p.copy_(0.5 * noise)
            elif name.endswith("gate_up_proj_bias"):
                p.copy_(4.0 * noise)  # some gate / up values past the clamp at +-7
            elif name.endswith(EXPERT_MATRICES):
                p.copy_(_mxfp4_values(0.3 * noise))
            elif "self_attn" in name:
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.05 * noise)
    return model


def _to_mxfp4(src, dest) -> None:
    """The float checkpoint src rewritten as an MXFP4 one in dest (the released checkpoints' form)."""
    shutil.copytree(src, dest)
    tensors = load_file(str(dest / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(EXPERT_MATRICES)]:
        blocks, scales = pack_mxfp4(tensors.pop(name).transpose(1, 2))  # [E, K, N] -> the stored [E, N, K]
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dest / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dest / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory, smollm2_tokenizer_dir):
    """(float directory, MXFP4 directory, transformers model)."""
    model = _build()
    root = tmp_path_factory.mktemp("gpt_oss")
    model.save_pretrained(str(root / "float"))
    for f in smollm2_tokenizer_dir.iterdir():
        shutil.copy(f, root / "float" / f.name)
    _to_mxfp4(root / "float", root / "mxfp4")
    return root / "float", root / "mxfp4", model


@pytest.fixture(scope="module")
def engine(gpt_oss):
    return LLM(str(gpt_oss[0]), dtype="float32", kv_cache_memory_gib=0.02)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    long = torch.randint(3, VOCAB, (37,), generator=g).tolist()  # over four windows
    return [long, long[5:11], long[20:33]]  # one shorter than the window; three: a decode bucket with padding


def _reference(hf, ids: list[int]) -> tuple[torch.Tensor, list[int]]:
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
        tokens = hf.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
    return logits, tokens[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def reference(gpt_oss):
    return [_reference(gpt_oss[2], ids) for ids in _prompts()]


def test_config_and_model_parts(gpt_oss, engine):
    cfg = engine.core.model_config
    assert cfg.layer_types == ["sliding_attention", "full_attention"] and cfg.layer_window == WINDOW
    assert cfg.sliding_window is None  # (it would cap every layer's context at the window)
    assert cfg.num_experts == 4 and cfg.num_experts_per_tok == 2 and cfg.moe_intermediate_size == 32
    model = engine.core.runner.model
    assert isinstance(model, GptOssForCausalLM)
    attn = model.attention_layers()
    assert all(isinstance(a, SinkAttention) for a in attn)
    assert [a.sliding_window for a in attn] == [WINDOW, None]
    assert isinstance(model.layers[0].mlp.experts, FusedMoE)
    assert model.layers[0].mlp.router.routing.scoring == TOPK_SOFTMAX


def test_logits_and_greedy_match_transformers(engine, reference):
    """Every prompt position's logits within LOGIT_BOUND of transformers', and the greedy tokens transformers'
    generate() gives (decodes past the window), the two prompts batched together."""
    prompts = _prompts()
    for ids, (ref, _) in zip(prompts, reference):
        ours = engine.core.score(ids)
        print(f"gpt-oss, {len(ids)} tokens: max |logit diff| {float((ours - ref).abs().max()):.3g} "
              f"(bound {LOGIT_BOUND})")
        torch.testing.assert_close(ours, ref, atol=LOGIT_BOUND, rtol=LOGIT_BOUND)
    out = engine.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in out] == [tokens for _, tokens in reference]


def test_chunked_prefill_and_prefix_cache_equal_transformers(gpt_oss, reference):
    """Prefill chunks of 5 tokens (each chunk over a cached prefix, windows straddling chunks), then the same
    prompts again on prefix-cache hits: transformers' tokens both times."""
    llm = LLM(str(gpt_oss[0]), dtype="float32", kv_cache_memory_gib=0.02, max_num_batched_tokens=5)
    want = [tokens for _, tokens in reference]
    prompts = _prompts()
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == want
    hits = llm.core.blocks.prefix_hits
    again = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == want
    assert llm.core.blocks.prefix_hits > hits and again[0].num_cached_tokens >= 32


def test_mxfp4_checkpoint_loads_to_the_same_logits(gpt_oss, engine):
    mx = LLM(str(gpt_oss[1]), dtype="float32", kv_cache_memory_gib=0.02)
    assert mx.core.checkpoint.quantization == "MXFP4 experts (dequantized at load)"
    assert isinstance(mx.core.checkpoint.weights, Mxfp4Weights)
    a, b = engine.core.runner.model.layers[1].mlp.experts, mx.core.runner.model.layers[1].mlp.experts
    assert torch.equal(a.w13, b.w13) and torch.equal(a.w2, b.w2)
    ids = _prompts()[0]
    torch.testing.assert_close(mx.core.score(ids), engine.core.score(ids), atol=0, rtol=0)


def test_sinks_and_window_change_the_output(gpt_oss, reference):
    """The comparison above fails with the sinks dropped (a sink of -inf takes no share) or the window removed."""
    llm = LLM(str(gpt_oss[0]), dtype="float32", kv_cache_memory_gib=0.02, enable_prefix_caching=False)
    ids, (ref, _) = _prompts()[0], reference[0]
    attn = llm.core.runner.model.attention_layers()
    kept = [a.sinks.data.clone() for a in attn]
    for a in attn:
        a.sinks.data.fill_(float("-inf"))
    assert float((llm.core.score(ids) - ref).abs().max()) > 100 * LOGIT_BOUND
    for a, s in zip(attn, kept):
        a.sinks.data.copy_(s)
    attn[0].sliding_window = None
    assert float((llm.core.score(ids) - ref).abs().max()) > 100 * LOGIT_BOUND
    attn[0].sliding_window = WINDOW
    torch.testing.assert_close(llm.core.score(ids), ref, atol=LOGIT_BOUND, rtol=LOGIT_BOUND)


@pytest.mark.timeout(900)
def test_tp2_equals_transformers(gpt_oss, reference):
    """Heads (and their sinks) and expert widths split over two ranks, the o_proj / down_proj biases added once:
    transformers' greedy tokens."""
    llm = LLM(str(gpt_oss[0]), dtype="float32", kv_cache_memory_gib=0.02, tensor_parallel_size=2,
              comm_strategy="host")
    assert llm.core.runner.tp.size == 2 and llm.core.runner.model.layers[0].self_attn.attn.num_heads == 2
    assert [o.outputs[0].token_ids for o in llm.generate(_prompts(), GREEDY)] == [t for _, t in reference]


def test_gpu_refused_at_build(gpt_oss):
    """Off the CPU the model refuses to build, naming the reason (built here under the meta device)."""
    cfg = ModelConfig.from_hf(json.loads((gpt_oss[0] / "config.json").read_text()))
    with torch.device("meta"), pytest.raises(ModelLoadError, match="runs on the CPU only"):
        GptOssForCausalLM(cfg, torch.float32, SINGLE, 64)


def test_fit_counts_the_experts(gpt_oss):
    from app.fit import ModelShape

    shape = ModelShape.from_hf_config(json.loads((gpt_oss[0] / "config.json").read_text()))
    assert (shape.num_experts, shape.experts_used, shape.intermediate_size) == (4, 2, 32)
    assert shape.inactive_params() == 2 * 2 * 3 * 64 * 32  # per layer: 2 unused experts x 3 matrices


def test_load_panel_takes_the_mxfp4_checkpoint(gpt_oss):
    """The app's checks pass the MXFP4 folder (engine/quant_scheme.py names it) and its estimate counts every expert
    at the dtype's width (a pre-quantized checkpoint: the files' packed codes are not the parameter count)."""
    from app import fit
    from app.model_inspect import inspect_model

    facts = inspect_model(gpt_oss[1])
    assert facts.supported, facts.reason
    assert facts.quantization_name == "MXFP4 experts" and fit.prequantized_method(facts) == "MXFP4"
    w = fit.weights_bytes(facts.num_params, "float32", facts.size_bytes, False, "auto", facts.shape,
                          prequantized=fit.prequantized_method(facts))
    held = sum(p.numel() for p in gpt_oss[2].parameters()) * 4
    assert abs(w.total - held) <= 0.01 * held
