"""Mixture-of-experts models in the app (issue 48, fit and UI): the memory estimate counts every expert, the speed
note the active ones ("1.44 B total, 0.38 B active"), the Library's Parameters column and the Load panel's summary
show experts and active parameters. On a small random Qwen3-MoE GGUF that the benchmark's writer makes
(engine/bench/gguf_moe_models.py), under pytest-qt."""

from __future__ import annotations

import pytest

from app import fit

# Qwen3-30B-A3B's config.json (the numbers that matter here)
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "tie_word_embeddings": False, "max_position_embeddings": 40960}


def test_qwen3_30b_a3b_counts_all_experts_and_reads_eight():
    shape = fit.ModelShape.from_hf_config(QWEN3_30B_A3B)
    assert (shape.num_experts, shape.experts_used, shape.intermediate_size) == (128, 8, 768)
    split = fit.param_split(shape, None)
    assert 30.0e9 < split.total < 31.0e9  # Qwen publishes 30.5B
    active = fit.active_params(shape, split.total)
    assert 3.0e9 < active < 3.5e9  # and 3.3B activated
    assert fit.params_text(split.total, shape) == (f"{fit.human_count(split.total)} total, {fit.human_count(active)} "
                                                  "active (128 experts, 8 per token)")
    # memory: every expert, in the dtype (dequantized) or as the file's blocks; speed: the active share
    wb = fit.weights_bytes(split.total, "bfloat16", None, False, "none", shape)
    assert wb.total == 2 * split.total
    assert fit.active_weight_bytes(wb.total, shape, split.total) == int(wb.total * active / split.total)
    dense = fit.ModelShape.from_hf_config({**QWEN3_30B_A3B, "num_experts": None})
    assert dense.num_experts is None and fit.params_text(1_240_000_000, dense) == "1.24 B"
    assert fit.moe_speed_note(dense, 10**9, 2 * 10**9) == ""


def test_mixtral_gguf_metadata():
    md = {"general.architecture": "llama", "llama.block_count": 32, "llama.embedding_length": 4096,
          "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8, "llama.feed_forward_length": 14336,
          "llama.expert_count": 8, "llama.expert_used_count": 2, "llama.context_length": 32768}
    shape = fit.ModelShape.from_gguf_metadata(md, 32000)
    assert (shape.num_experts, shape.experts_used, shape.intermediate_size) == (8, 2, 14336)
    total = fit.param_split(shape, None).total
    assert 46.0e9 < total < 47.5e9 and 12.5e9 < fit.active_params(shape, total) < 13.2e9  # 46.7B / 12.9B


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    from engine.bench.gguf_models import ensure_random_llama
    from engine.bench.gguf_moe_models import RandomQwen3Moe, small_moe_shape

    return ensure_random_llama(RandomQwen3Moe("Q8_0", small_moe_shape()), tmp_path_factory.mktemp("moe"))


def test_library_and_load_panel_show_experts(moe_gguf, make_window, qtbot, tmp_path):
    from app.model_inspect import inspect_model

    facts = inspect_model(moe_gguf)
    assert facts.supported and facts.architecture == "Qwen3MoeForCausalLM"
    words = fit.params_text(facts.num_params, facts.shape)
    assert words.endswith("active (4 experts, 2 per token)"), words

    w = make_window(autoload=False)
    lib = w.ctx.library
    lib.add_file(str(moe_gguf))
    qtbot.waitUntil(lambda: lib.scanned and any(e.model_ref == str(moe_gguf) for e in lib.entries), timeout=30_000)
    w.show_panel("models")
    tab = w.panels["models"].library_tab
    assert tab.select_key(str(moe_gguf))
    row = tab.table.currentRow()
    cells = [tab.table.item(row, c).text() for c in range(tab.table.columnCount())]
    assert words in cells, cells

    load = w.panels["load"]
    w.show_panel("load")
    load.select_path(moe_gguf)
    assert f"Parameters: {words}" in load.summary.text()
    text = load.estimate.text()
    assert "Mixture of experts: all 4 experts are in memory; a token reads 2 (" in text, text
    grab = w.grab()
    path = tmp_path / "load_moe.png"
    import os
    if os.environ.get("GGUF48_SHOT"):
        path = __import__("pathlib").Path(os.environ["GGUF48_SHOT"])
    assert grab.save(str(path)) and path.stat().st_size > 0
