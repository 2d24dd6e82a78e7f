"""The Load panel: a form derived from EngineConfig, options this machine or engine lacks disabled with the
reason, settings kept per model, load progress / cancel, and a failed load explained in place."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt

from app.library import EMBEDDED_KEY
from engine.config import EngineConfig


def test_form_has_an_editor_for_every_engine_option(make_window):
    w = make_window(autoload=False)
    load = w.panels["load"]
    editors = {**load.form.main.editors, **load.form.advanced.editors}
    assert set(editors) == {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}
    defaults = EngineConfig()
    for name, value in load.form.values().items():
        assert value == getattr(defaults, name), name
    for f in dataclasses.fields(EngineConfig):  # the field's help is the tooltip
        if f.name != "model":
            assert f.metadata["help"] in editors[f.name].toolTip()


def test_unavailable_options_are_disabled_with_the_reason(make_window, qtbot, monkeypatch):
    w = make_window(autoload=False)
    load = w.panels["load"]
    qtbot.waitUntil(lambda: w.ctx.hardware_snapshot is not None and load.model_combo.count() > 0, timeout=30_000)
    main = load.form.main
    if w.ctx.num_gpus == 0:  # this machine: tensor parallelism on the CPU (the ranks are processes sharing the cores)
        # the embedded SmolLM2-135M has 9 attention heads and 3 KV heads: TP 1 or 3 (up to the form's 8)
        assert main.is_field_enabled("tensor_parallel_size")
        assert main.editors["tensor_parallel_size"].maximum() == 3
        assert "splits into (CPU ranks share the cores): 1, 3" in main.editors["tensor_parallel_size"].toolTip()
        assert not main.is_field_enabled("comm_strategy")
        assert main.disabled_reason("comm_strategy") == "applies with tensor-parallel size 2 or more"
        main.editors["tensor_parallel_size"].stepUp()  # 2 does not split the heads: on to 3
        assert load.form.values()["tensor_parallel_size"] == 3
        assert main.is_field_enabled("comm_strategy")
        main.editors["tensor_parallel_size"].stepDown()  # and back past 2 to 1
        assert load.form.values()["tensor_parallel_size"] == 1
        assert not main.is_field_enabled("comm_strategy")
    assert [main.editors["comm_strategy"].itemData(i) for i in range(5)] == ["auto", "nccl", "int8", "host", "overlap"]
    if w.ctx.num_gpus == 0:  # this machine: no GPU
        assert not main.is_choice_enabled("device", "cuda")
        assert "no NVIDIA GPU" in main.editors["device"].itemText(main.editors["device"].findData("cuda"))
        assert not main.is_field_enabled("gpu_memory_utilization")
        assert main.is_field_enabled("kv_cache_memory_gib")
        assert "of RAM" in load.estimate.text()
    # quantization: a form field like the others; int8 is a CPU feature
    assert [main.editors["quantization"].itemData(i) for i in range(2)] == ["none", "int8"]
    if w.ctx.num_gpus == 0:
        assert main.is_choice_enabled("quantization", "int8")
        assert "Q4_1 weights are dequantized" in load.estimate.text()
        before = load.estimate.text()
        load.form.set_value("quantization", "int8")
        qtbot.waitUntil(lambda: load.estimate.text() != before, timeout=5_000)
        assert "quantized to int8" in load.estimate.text()
        assert load.config().quantization == "int8"
    # on a machine with a GPU (device auto -> cuda): int8 is off, with the reason, and a chosen int8 goes back
    monkeypatch.setattr(type(w.ctx), "num_gpus", property(lambda self: 1))
    load.form.set_value("device", "auto")
    load._apply_availability()
    assert not main.is_field_enabled("tensor_parallel_size")  # one GPU: nothing to split over
    assert main.disabled_reason("tensor_parallel_size") == "needs two or more GPUs (found 1)"
    assert not main.is_choice_enabled("quantization", "int8")
    assert load.form.values()["quantization"] == "none"
    assert "run on the CPU" in main.editors["quantization"].itemText(1)

def test_settings_are_kept_per_model(make_window, qtbot, tmp_path):
    w = make_window(autoload=False)
    w.ctx.core_factory = "tests.server.fake_engine:FakeCore"
    load = w.panels["load"]
    qtbot.waitUntil(lambda: load.model_combo.findData(EMBEDDED_KEY) >= 0, timeout=30_000)
    load.select_key(EMBEDDED_KEY)
    load.form.set_value("dtype", "float32")
    load.form.set_value("max_model_len", 2048)
    qtbot.mouseClick(load.load_button, Qt.LeftButton)  # loading saves the model's settings
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready", timeout=60_000)

    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\0" * 60)
    load.select_path(other)
    assert load.form.values()["dtype"] == "auto" and load.form.values()["max_model_len"] is None
    assert not load.model_warning.isHidden()  # not a readable model: said up front
    load.select_key(EMBEDDED_KEY)
    values = load.form.values()
    assert values["dtype"] == "float32" and values["max_model_len"] == 2048
    config = load.config()
    assert config.model is None and config.dtype == "float32" and config.max_model_len == 2048


def test_load_progress_success_and_saved_settings(make_window, qtbot):
    w = make_window(autoload=False)
    load = w.panels["load"]
    qtbot.waitUntil(lambda: load.model_combo.findData(EMBEDDED_KEY) >= 0, timeout=30_000)
    load.select_key(EMBEDDED_KEY)
    load.form.set_value("max_num_seqs", 7)
    w.ctx.core_factory = "tests.server.fake_engine:FakeCore"
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready", timeout=60_000)
    assert "Loaded" in load.message.text() and load.message.objectName() == "okBox"
    assert w.ctx.store.model_settings(EMBEDDED_KEY)["engine"]["max_num_seqs"] == 7
    assert w.ctx.engine.config.max_num_seqs == 7
    assert w.ctx.store.pref("last_model")["key"] == EMBEDDED_KEY
    qtbot.mouseClick(load.unload_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "empty", timeout=30_000)
    assert not w.chat.send_button.isEnabled()


def test_failed_load_is_explained_in_place(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "load_error")
    w = make_window(autoload=False)
    w.ctx.core_factory = "tests.server.fake_engine:FakeCore"
    load = w.panels["load"]
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: bool(load.error_text()), timeout=60_000)
    assert "broken.gguf: truncated" in load.error_text()
    assert w.ctx.engine.state == "failed" and load.load_button.isEnabled()
    assert "could not be loaded" in w.engine_label.text()


def test_cancel_loading(make_window, qtbot, monkeypatch):
    w = make_window(autoload=False)
    w.ctx.core_factory = "tests.app.slow_core:SlowLoadingCore"
    load = w.panels["load"]
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "loading" and not load.cancel_button.isHidden(), timeout=30_000)
    assert not load.progress.isHidden()
    qtbot.mouseClick(load.cancel_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "empty", timeout=30_000)
    assert "cancelled" in load.message.text()
    assert load.progress.isHidden()


def test_loaded_message_says_int8(make_window, qtbot):
    """Issue 14 item 5: int8 weights are named in the Load panel's "Loaded" message, as in the status bar."""
    w = make_window(engine_settings={"quantization": "int8"})
    load = w.panels["load"]
    qtbot.waitUntil(lambda: load.message.text().startswith("Loaded"), timeout=30_000)
    text = load.message.text()
    assert "int8 weights" in text and f"{w.ctx.engine.info.dtype} activations" in text, text
    w2 = make_window(engine_settings={"quantization": "none"})
    msg = w2.panels["load"].message
    qtbot.waitUntil(lambda: msg.text().startswith("Loaded"), timeout=30_000)
    assert "int8" not in msg.text()


def test_garbage_file_is_no_model_and_no_estimate(make_window, qtbot, tmp_path):
    """Issue 14 item 6: a file that is not a model gets no "it fits" from the memory pre-check."""
    import os

    from app import fit
    from app.model_inspect import inspect_model

    junk = tmp_path / "holiday-photos.gguf"
    junk.write_bytes(os.urandom(3 * 2**20))
    facts = inspect_model(junk)
    assert not facts.readable and not facts.supported
    assert fit.can_estimate(facts)[0] is False
    empty_dir = tmp_path / "not-a-model"
    empty_dir.mkdir()
    (empty_dir / "config.json").write_text("[1, 2]")
    assert not inspect_model(empty_dir).readable

    w = make_window(autoload=False)
    load = w.panels["load"]
    load.select_path(junk)
    text = load.estimate.text()
    assert "Cannot tell" in text and "not a model file" in text, text
    assert "fits" not in text and "GiB" not in text
    assert not load.model_warning.isHidden() and "bad magic" in load.model_warning.text()
    # a real model still gets its estimate
    qtbot.waitUntil(lambda: load.model_combo.findData(EMBEDDED_KEY) >= 0, timeout=30_000)
    load.select_key(EMBEDDED_KEY)
    qtbot.waitUntil(lambda: "GiB" in load.estimate.text() or "MiB" in load.estimate.text(), timeout=30_000)


def test_sampling_settings_are_per_model_as_the_readme_says(make_window, qtbot):
    """Issue 14 item 6: sampling settings are stored per model (every conversation with it uses them), and the
    README says so."""
    from pathlib import Path

    w = make_window()
    chat = w.chat
    a = chat.new_conversation()
    chat.sampling.temperature.setValue(1.35)
    key = w.ctx.model_key
    qtbot.waitUntil(lambda: (w.ctx.store.model_settings(key).get("sampling") or {}).get("temperature") == 1.35,
                    timeout=10_000)
    b = chat.new_conversation()
    assert b.id != a.id and chat.sampling.temperature.value() == 1.35
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    assert "sampling settings per model" in readme and "sampling settings per conversation" not in readme
