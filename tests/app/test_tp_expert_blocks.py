"""The Load panel offers only the tensor-parallel sizes the engine takes for a GGUF mixture-of-experts whose experts
the CPU keeps as blocks (issue 48: engine/expert_blocks.py, the rule the engine refuses other sizes by before its
workers start): a random Qwen3-MoE file (engine/bench/gguf_moe_models.py) with 768-wide Q4_K experts, as
Qwen3-30B-A3B's, and 6 attention / KV heads, splits over 1 and 3 CPU ranks, not 2 (384 columns a rank: 1.5 blocks
of 256) nor 6; the field's note says why; under quantization "none" (experts dequantized) 2 and 6 work. Real
widgets under pytest-qt, no device."""

from __future__ import annotations

import pytest

from app import fit
from app.model_inspect import inspect_model

WIDTH = 768


@pytest.fixture(scope="module")
def q4k_moe(tmp_path_factory):
    from engine.bench.gguf_models import ensure_random_llama
    from engine.bench.gguf_moe_models import RandomQwen3Moe, small_moe_shape

    shape = small_moe_shape(expert_ffn=WIDTH, layers=1, experts=2, heads=6, kv_heads=6, head_dim=128, seed=5)
    return ensure_random_llama(RandomQwen3Moe("Q4_K", shape), tmp_path_factory.mktemp("tp-blocks"))


def test_fit_reads_the_experts_blocks(q4k_moe):
    shape = inspect_model(q4k_moe).shape
    assert shape.intermediate_size == WIDTH and shape.expert_down_types == ("Q4_K",)
    block = fit.expert_block(shape, "auto", on_gpu=False)
    assert block == ("Q4_K", 256) and fit.expert_block(shape, "gguf", on_gpu=False) == block
    assert fit.tp_sizes(8, shape, block) == [1, 3]
    assert fit.tp_sizes(8, shape) == [1, 2, 3, 6]  # heads and width alone
    for off in (fit.expert_block(shape, "none", False), fit.expert_block(shape, "int8", False),
                fit.expert_block(shape, "auto", True)):  # dequantized, or a GPU: no block constraint
        assert off is None
    assert fit.tp_misfit(2, shape, block).startswith("its experts' Q4_K blocks (256 columns each) would be split: "
                                                     "2 ranks take 384 of the 768 columns each")


def test_load_panel_offers_only_the_sizes_the_engine_takes(q4k_moe, make_window, qtbot):
    w = make_window(autoload=False)
    load = w.panels["load"]
    w.show_panel("load")
    load.select_path(q4k_moe)
    form = load.form
    assert load.ctx.capabilities.tensor_parallel and load.ctx.num_gpus == 0  # CPU ranks
    form.set_value("quantization", "auto")
    form.set_value("tensor_parallel_size", 2)
    assert form.values()["tensor_parallel_size"] == 3  # stepped on to the next size that splits the blocks
    note = form.main.field_note("tensor_parallel_size")
    assert note.startswith("2 is not possible: its experts' Q4_K blocks (256 columns each) would be split"), note
    assert "sizes that work here: 1, 3." in note
    assert "1, 3" in form.main.editors["tensor_parallel_size"].toolTip()
    # quantization "none": the experts dequantized at load, every size that divides the heads and width works
    form.set_value("quantization", "none")
    form.set_value("tensor_parallel_size", 2)
    assert form.values()["tensor_parallel_size"] == 2 and form.main.is_field_enabled("tensor_parallel_size")
    form.set_value("tensor_parallel_size", 6)
    assert form.values()["tensor_parallel_size"] == 6
    # back to the blocks (gguf): 6 (128 columns a rank) is refused in turn
    form.set_value("quantization", "gguf")
    assert form.values()["tensor_parallel_size"] in (1, 3)
    assert "its experts' Q4_K blocks" in form.main.field_note("tensor_parallel_size")


def test_field_off_with_the_reason_when_only_the_blocks_refuse(make_window, qtbot, tmp_path):
    """4 heads, 768-wide Q4_K experts: 2 and 4 divide both, but neither splits the blocks; no size but 1 is left,
    so the field is off and its reason names the blocks; under "none" it is on again."""
    from engine.bench.gguf_models import ensure_random_llama
    from engine.bench.gguf_moe_models import RandomQwen3Moe, small_moe_shape

    path = ensure_random_llama(RandomQwen3Moe("Q4_K", small_moe_shape(expert_ffn=WIDTH, layers=1, experts=2,
                                                                      seed=5)), tmp_path)
    w = make_window(autoload=False)
    load = w.panels["load"]
    w.show_panel("load")
    load.select_path(path)
    main = load.form.main
    assert not main.is_field_enabled("tensor_parallel_size")
    reason = main.disabled_reason("tensor_parallel_size")
    assert reason.startswith("this model (4 attention heads, 2 KV heads, expert width 768) does not split over 2 to ")
    assert ": its experts' Q4_K blocks (256 columns each) would be split: 2 ranks take 384" in reason, reason
    load.form.set_value("quantization", "none")
    assert main.is_field_enabled("tensor_parallel_size")
