"""The Load panel's parameter counts for DeepSeek-V2/V3 GGUF files (issue 48, app/fit.py ModelShape.from_gguf_metadata):
llama.cpp's deepseek2 keys give the same total and active parameters as the tiny transformers model they describe
(its parameters counted), as its config.json does: the shared experts (expert_shared_count x
expert_feed_forward_length; deepseek2 files have no expert_shared_feed_forward_length), the leading dense layers
(leading_dense_block_count, feed_forward_length wide, no experts to leave out of the active count) and multi-head
latent attention's projections and norms; its KV per token is the latent row."""

from __future__ import annotations

import pytest

from app import fit

BASE = dict(vocab_size=320, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            intermediate_size=96, moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2,
            kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=256,
            tie_word_embeddings=False)
CASES = {  # V2-Lite's form (no q bottleneck), V2's (q_lora_rank), V3's (sigmoid router with groups)
    "v2-lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                dict(q_lora_rank=None, n_shared_experts=2, first_k_dense_replace=1)),
    "v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(q_lora_rank=40, n_shared_experts=1,
                                                             first_k_dense_replace=2)),
    "v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(q_lora_rank=40, n_shared_experts=1,
                                                             first_k_dense_replace=1, n_group=2, topk_group=1)),
}


def _model(case):
    import torch
    import transformers

    config_cls, model_cls, extra = CASES[case]
    config = getattr(transformers, config_cls)(**BASE, **extra)
    torch.manual_seed(0)
    return config, getattr(transformers, model_cls)(config)


def _gguf_metadata(cfg, newer_keys: bool) -> dict:
    """The keys llama.cpp's convert_hf_to_gguf.py writes for this config (newer files: key_length / value_length
    are the latent's widths, the heads' in *_mla)."""
    a = "deepseek2"
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    md = {"general.architecture": a, f"{a}.block_count": cfg.num_hidden_layers,
          f"{a}.embedding_length": cfg.hidden_size, f"{a}.feed_forward_length": cfg.intermediate_size,
          f"{a}.attention.head_count": cfg.num_attention_heads, f"{a}.context_length": cfg.max_position_embeddings,
          f"{a}.attention.kv_lora_rank": cfg.kv_lora_rank, f"{a}.rope.dimension_count": cfg.qk_rope_head_dim,
          f"{a}.leading_dense_block_count": cfg.first_k_dense_replace, f"{a}.expert_count": cfg.n_routed_experts,
          f"{a}.expert_used_count": cfg.num_experts_per_tok, f"{a}.expert_shared_count": cfg.n_shared_experts,
          f"{a}.expert_feed_forward_length": cfg.moe_intermediate_size}
    if cfg.q_lora_rank:
        md[f"{a}.attention.q_lora_rank"] = cfg.q_lora_rank
    if newer_keys:
        md.update({f"{a}.attention.head_count_kv": 1,
                   f"{a}.attention.key_length": cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                   f"{a}.attention.value_length": cfg.kv_lora_rank, f"{a}.attention.key_length_mla": qk,
                   f"{a}.attention.value_length_mla": cfg.v_head_dim})
    else:
        md.update({f"{a}.attention.head_count_kv": cfg.num_attention_heads, f"{a}.attention.key_length": qk,
                   f"{a}.attention.value_length": cfg.v_head_dim})
    return md


@pytest.mark.parametrize("case", list(CASES))
def test_deepseek_gguf_metadata_counts_the_models_parameters(case):
    cfg, model = _model(case)
    total = sum(p.numel() for p in model.parameters())
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    unrouted = moe_layers * (cfg.n_routed_experts - cfg.num_experts_per_tok) * 3 * cfg.hidden_size * (
        cfg.moe_intermediate_size)
    shapes = {"config.json": fit.ModelShape.from_hf_config(cfg.to_dict())}
    shapes |= {f"gguf ({form})": fit.ModelShape.from_gguf_metadata(_gguf_metadata(cfg, form == "newer"),
                                                                   cfg.vocab_size) for form in ("older", "newer")}
    for where, shape in shapes.items():
        assert fit.param_split(shape, None).total == total, where
        assert fit.active_params(shape, total) == total - unrouted, where
        # with the files' count: the linear layers the shape says leave exactly the tables and the norms
        split = fit.param_split(shape, total)
        assert (split.embedding, split.lm_head, split.rest) == (
            cfg.vocab_size * cfg.hidden_size, cfg.vocab_size * cfg.hidden_size, shape.norm_params()), where
        assert shape.kv_bytes_per_token(2) == cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2
        assert shape.dense_intermediate_size == cfg.intermediate_size, where  # a width TP must divide
    gguf = shapes["gguf (newer)"]
    assert gguf.shared_intermediate_size == cfg.n_shared_experts * cfg.moe_intermediate_size
    assert gguf.dense_layers == cfg.first_k_dense_replace
    assert fit.params_text(total, gguf).endswith(f"active ({cfg.n_routed_experts} experts, 2 per token)")


@pytest.mark.parametrize("version, split_kv_b", [("v2", False), ("v3", True)])
def test_a_written_deepseek2_gguf_reads_as_its_tensors(version, split_kv_b, smollm2_gguf, tmp_path):
    """A deepseek2 GGUF written as llama.cpp's converter writes it (tests/support/gguf_deepseek_writer.py: older
    key_length / attn_kv_b form for V2, newer *_mla keys with attn_k_b / attn_v_b for V3), read as the Library and
    the Load panel read it (app.model_inspect): the shape's total is the file's tensors' count (less V3's correction
    bias, a buffer in transformers), which is the model's parameter count."""
    from app.model_inspect import inspect_model
    from tests.support.gguf_deepseek_writer import build_deepseek_model, write_deepseek_gguf

    model = build_deepseek_model(version)
    cfg = model.config
    path, _ = write_deepseek_gguf(model, tmp_path / f"{version}.gguf", None, smollm2_gguf, tmp_path,
                                  split_kv_b=split_kv_b)
    facts = inspect_model(path)
    total = sum(p.numel() for p in model.parameters())
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    bias = moe_layers * cfg.n_routed_experts if version == "v3" else 0  # exp_probs_b.bias
    assert facts.num_params == total + bias
    assert fit.param_split(facts.shape, None).total == total
    unrouted = moe_layers * (cfg.n_routed_experts - cfg.num_experts_per_tok) * 3 * cfg.hidden_size * (
        cfg.moe_intermediate_size)
    assert fit.active_params(facts.shape, total) == total - unrouted
