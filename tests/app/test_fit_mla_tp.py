"""The Load panel's fit arithmetic for MLA and MoE shapes (issue 48, app/fit.py): DeepSeek-V2/V3's KV cache counted
as the engine holds it (one latent row of kv_lora_rank + qk_rope_head_dim per token and layer, whole on every rank:
31,104 bytes a token for DeepSeek-V2-Lite in bf16, as tests/unit/test_mla.py asserts against 276,480 expanded),
and the TP sizes offered (fit.tp_sizes, the Load panel's list) limited to those that divide every split width."""

from __future__ import annotations

from app import fit
from tests.unit.test_tp_and_kv_load_checks import DEEPSEEK_V2_LITE, QWEN2_MOE, QWEN3_MOE


def test_deepseek_v2_lite_kv_bytes_are_the_latent_rows():
    shape = fit.ModelShape.from_hf_config(DEEPSEEK_V2_LITE)
    assert shape.kv_latent_size == 512 + 64
    for tp in (1, 2, 4):
        assert shape.kv_bytes_per_token(2, tp) == 27 * 576 * 2 == 31_104
    est = fit.estimate(10 * fit.GIB, shape, 8192, 1, "bfloat16", 24 * fit.GIB)
    assert est.kv_cache == 31_104 * 8192
    # the same shape from a GGUF file's llama.cpp keys
    md = {"general.architecture": "deepseek2", "deepseek2.block_count": 27, "deepseek2.embedding_length": 2048,
          "deepseek2.attention.head_count": 16, "deepseek2.attention.head_count_kv": 16,
          "deepseek2.attention.key_length": 192, "deepseek2.attention.kv_lora_rank": 512,
          "deepseek2.rope.dimension_count": 64, "deepseek2.expert_count": 64,
          "deepseek2.expert_feed_forward_length": 1408, "deepseek2.feed_forward_length": 10944}
    assert fit.ModelShape.from_gguf_metadata(md, 102400).kv_bytes_per_token(2) == 31_104
    # a model with full K and V is unchanged: 2 x layers x KV heads per rank x head size x bytes
    qwen = fit.ModelShape.from_hf_config(QWEN3_MOE)
    assert qwen.kv_latent_size is None and qwen.kv_bytes_per_token(2, 2) == 2 * 2 * 2 * 16 * 2


def test_tp_sizes_leave_out_sizes_a_split_width_refuses():
    qwen3 = fit.ModelShape.from_hf_config(QWEN3_MOE)  # experts 36 wide
    assert fit.tp_sizes(8, qwen3) == [1, 2, 4]
    assert fit.tp_misfit(8, qwen3) == "its expert width (36) does not divide by 8"
    qwen2 = fit.ModelShape.from_hf_config(QWEN2_MOE)  # experts 96, the shared expert 36
    assert fit.tp_sizes(8, qwen2) == [1, 2, 4] and fit.tp_choices(8, qwen2) == [1, 2, 4]
    assert fit.tp_misfit(8, qwen2) == "its shared expert width (36) does not divide by 8"
    deepseek = fit.ModelShape.from_hf_config({**DEEPSEEK_V2_LITE, "intermediate_size": 100,
                                              "moe_intermediate_size": 64})  # the first layer's dense MLP: 100
    assert fit.tp_sizes(8, deepseek) == [1, 2, 4]
    assert fit.tp_misfit(8, deepseek) == "its dense MLP width (100) does not divide by 8"
    assert fit.tp_sizes(8, fit.ModelShape.from_hf_config(DEEPSEEK_V2_LITE)) == [1, 2, 4, 8]  # 16 heads


def test_load_panel_turns_off_fp8_kv_for_latent_attention(make_window, qtbot, monkeypatch, tmp_path):
    """On an Ada GPU the Load panel offers --kv-cache-dtype fp8 for a Llama, not for a DeepSeek-V2-Lite folder (the
    engine refuses it at load), with the reason; and a TP size its widths refuse is not offered."""
    import json

    from tests.app.test_load_panel import FakeGPUs, select_model, write_llama8b

    gpus = FakeGPUs(monkeypatch)
    gpus.spec = [(48, (8, 9))] * 8
    w = make_window(autoload=False)
    load, adv = w.panels["load"], w.panels["load"].form.advanced
    gpus.set(qtbot, w, *gpus.spec)
    select_model(qtbot, w, write_llama8b(tmp_path / "llama-8b"))
    load.form.set_value("device", "cuda")
    assert adv.is_choice_enabled("kv_cache_dtype", "fp8")
    load.form.set_value("kv_cache_dtype", "fp8")
    root = tmp_path / "deepseek-v2-lite"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({**DEEPSEEK_V2_LITE, "intermediate_size": 100,
                                                  "moe_intermediate_size": 64, "torch_dtype": "bfloat16"}))
    blob = json.dumps({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [102400, 2048],
                                                     "data_offsets": [0, 0]}}).encode()
    (root / "model.safetensors").write_bytes(len(blob).to_bytes(8, "little") + blob)
    select_model(qtbot, w, root)
    load.form.set_value("device", "cuda")
    assert not adv.is_choice_enabled("kv_cache_dtype", "fp8")
    editor = adv.editors["kv_cache_dtype"]
    assert fit.MLA_FP8_KV_REASON in editor.itemText(editor.findData("fp8"))
    assert load.form.values()["kv_cache_dtype"] == "auto"
    load.form.set_value("tensor_parallel_size", 8)  # the first layer's dense MLP (100) does not split 8 ways
    assert load.form.values()["tensor_parallel_size"] != 8
    assert "its dense MLP width (100) does not divide by 8" in load.form.main.field_note("tensor_parallel_size")
    # an MoE whose expert width (35) no TP size divides: the field is off, and the reason names the width
    odd = tmp_path / "qwen3-moe-odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({**QWEN3_MOE, "moe_intermediate_size": 35, "torch_dtype": "bfloat16"}))
    (odd / "model.safetensors").write_bytes(len(blob).to_bytes(8, "little") + blob)
    select_model(qtbot, w, odd)
    load.form.set_value("device", "cuda")
    assert not load.form.main.is_field_enabled("tensor_parallel_size")
    assert load.form.main.disabled_reason("tensor_parallel_size") == (
        "this model (8 attention heads, 4 KV heads, expert width 35) does not split over 2 to 8 GPUs")
