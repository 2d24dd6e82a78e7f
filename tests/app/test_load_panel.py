"""The Load panel: a form derived from EngineConfig, options this machine or engine lacks disabled with the
reason, settings kept per model, load progress / cancel, and a failed load explained in place."""

from __future__ import annotations

import dataclasses
import json

import pytest
from PySide6.QtCore import Qt

from app import fit
from app.library import EMBEDDED_KEY
from engine.config import EngineConfig
from tests.app.test_model_data import llama8b_counts, llama8b_tensors


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
        tp_editor = main.editors["tensor_parallel_size"]
        assert tp_editor.maximum() == 8  # any size may be typed; one that does not split the model is explained
        assert "splits into (CPU ranks share the cores): 1, 3" in tp_editor.toolTip()
        assert main.field_note("tensor_parallel_size") == ""
        assert not main.is_field_enabled("comm_strategy")
        assert main.disabled_reason("comm_strategy") == "applies with tensor-parallel size 2 or more"
        tp_editor.stepUp()  # 2 does not split the heads: on to 3, and the note beside the field says why
        assert load.form.values()["tensor_parallel_size"] == 3
        note = main.field_note("tensor_parallel_size")
        assert note == ("2 is not possible: its 9 attention heads do not divide into 2 equal groups. Using 3; sizes "
                        "that work here: 1, 3."), note
        assert not main.reasons["tensor_parallel_size"].isHidden() and main.reasons["tensor_parallel_size"].text() == note
        assert main.is_field_enabled("comm_strategy")
        # no GPU: only the strategies the CPU ranks can run (NCCL and the second stream's overlap need GPUs)
        assert not main.is_choice_enabled("comm_strategy", "nccl")
        assert "needs NVIDIA GPUs" in main.editors["comm_strategy"].itemText(1)
        assert not main.is_choice_enabled("comm_strategy", "overlap")
        assert main.is_choice_enabled("comm_strategy", "host") and main.is_choice_enabled("comm_strategy", "int8")
        tp_editor.setValue(5)  # typed: 5 does not split the 9 heads either, and nothing larger does
        assert load.form.values()["tensor_parallel_size"] == 3
        assert main.field_note("tensor_parallel_size").startswith("5 is not possible: its 9 attention heads")
        load.form.set_value("kv_cache_memory_gib", 1.0)  # another option changed: the note stays
        assert main.field_note("tensor_parallel_size").startswith("5 is not possible")
        tp_editor.stepDown()  # and back past 2 to 1
        assert load.form.values()["tensor_parallel_size"] == 1
        assert main.field_note("tensor_parallel_size").startswith("2 is not possible")
        assert not main.is_field_enabled("comm_strategy")
        load.form.set_value("kv_cache_memory_gib", None)
    assert [main.editors["comm_strategy"].itemData(i) for i in range(5)] == ["auto", "nccl", "int8", "host", "overlap"]
    if w.ctx.num_gpus == 0:  # this machine: no GPU
        assert not main.is_choice_enabled("device", "cuda")
        assert "no NVIDIA GPU" in main.editors["device"].itemText(main.editors["device"].findData("cuda"))
        assert not main.is_field_enabled("gpu_memory_utilization")
        assert main.is_field_enabled("kv_cache_memory_gib")
        assert "of RAM" in load.estimate.text()
    # quantization: a form field like the others; int8 is a CPU feature
    assert [main.editors["quantization"].itemData(i) for i in range(3)] == ["auto", "none", "int8"]
    if w.ctx.num_gpus == 0:
        assert main.is_choice_enabled("quantization", "int8")
        assert "stay as their blocks" in load.estimate.text()  # auto on the CPU: the GGUF blocks kept
        load.form.set_value("quantization", "none")
        assert "Q4_1 weights are dequantized" in load.estimate.text()
        before = load.estimate.text()
        load.form.set_value("quantization", "int8")
        qtbot.waitUntil(lambda: load.estimate.text() != before, timeout=5_000)
        assert "quantized to int8" in load.estimate.text()
        assert load.config().quantization == "int8"
    # on a machine with a GPU (device auto -> cuda): int8 stays (the GPU has its own int8 kernels), GGUF blocks are
    # off, with the reason, and a chosen gguf goes back to auto
    load.form.set_value("quantization", "gguf")
    monkeypatch.setattr(type(w.ctx), "num_gpus", property(lambda self: 1))
    load.form.set_value("device", "auto")
    load._apply_availability()
    assert not main.is_field_enabled("tensor_parallel_size")  # one GPU: nothing to split over
    assert main.disabled_reason("tensor_parallel_size") == "needs two or more GPUs (found 1)"
    assert main.is_choice_enabled("quantization", "int8")
    assert not main.is_choice_enabled("quantization", "gguf")
    assert load.form.values()["quantization"] == "auto"
    combo = main.editors["quantization"]
    assert "run on the CPU" in combo.itemText(combo.findData("gguf"))

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
    # the worker sets its state before its queued signals reach the panel: wait for the message itself
    qtbot.waitUntil(lambda: "Loaded" in load.message.text(), timeout=10_000)
    assert load.message.objectName() == "okBox"
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
    # the state is set in the worker thread before its queued loadCancelled reaches the panel
    qtbot.waitUntil(lambda: "cancelled" in load.message.text(), timeout=10_000)
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
    warning = load.model_warning.text()
    assert not load.model_warning.isHidden() and "not a GGUF file (it starts with" in warning, warning
    assert str(junk) not in warning  # the path is in the summary above, once
    assert not load.load_button.isEnabled() and "not a GGUF file" in load.load_button.toolTip()
    # issue 45: the summary does not call it a GGUF file with no quantization, and the estimate's words do not
    # nest brackets ("... can read (not a GGUF file (it starts with ...))")
    summary = load.summary.text()
    assert "Format: not a model file" in summary and "Format: GGUF" not in summary, summary
    assert "Quantization" not in summary, summary
    assert text.startswith("Cannot tell how much memory this needs. This is not a model file Kestrel can read: "
                           "not a GGUF file (it starts with "), text
    assert "((" not in text and "))" not in text and "(not a GGUF" not in text, text
    # a real model still gets its estimate
    qtbot.waitUntil(lambda: load.model_combo.findData(EMBEDDED_KEY) >= 0, timeout=30_000)
    load.select_key(EMBEDDED_KEY)
    qtbot.waitUntil(lambda: "GiB" in load.estimate.text() or "MiB" in load.estimate.text(), timeout=30_000)
    assert "Format: GGUF" in load.summary.text() and "Quantization: Q4_1" in load.summary.text()


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


# ---------------------------------------------------------------------------------------------------------------
# GPU quantization: the choices per device and GPU, and the memory estimate for an 8B Llama on (faked) GPUs


class FakeGPUs:
    """The hardware probe's snapshots with these GPUs instead of this machine's: ``set((24, (8, 9)), ...)`` gives
    GPUs of 24 GiB and compute capability 8.9 (None: unknown, as where NVML cannot say)."""

    def __init__(self, monkeypatch):
        from app.hardware import GPUInfo, HardwareProbe

        self.spec: list[tuple[float, tuple[int, int] | None]] = []
        real = HardwareProbe.snapshot

        def snapshot(probe, pcie_throughput: bool = True):
            snap = real(probe, pcie_throughput=False)
            gpus = []
            for i, (gib, cc) in enumerate(self.spec):
                g = GPUInfo(index=i, name="NVIDIA GeForce RTX 4090", memory_used=0, memory_total=int(gib * fit.GIB))
                if cc is not None:
                    g.compute_capability = cc
                gpus.append(g)
            snap.gpus, snap.peer_matrix, snap.gpu_message = gpus, None, ""
            return snap

        monkeypatch.setattr(HardwareProbe, "snapshot", snapshot)

    def set(self, qtbot, window, *spec) -> None:
        self.spec = list(spec)

        def seen():
            snap = window.ctx.hardware_snapshot
            return snap is not None and [(g.memory_total, getattr(g, "compute_capability", None))
                                         for g in snap.gpus] == [(int(gib * fit.GIB), cc) for gib, cc in spec]

        qtbot.waitUntil(seen, timeout=10_000)
        window.panels["load"]._apply_availability()


def write_llama8b(root, gptq: bool = False):
    """An 8B Llama folder: its config.json and a safetensors header naming every tensor (no data: the panel reads
    headers only). ``gptq``: a GPTQ int4 checkpoint of ~5.7 GB (a sparse file), its linear layers packed."""
    root.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
           "intermediate_size": 14336, "vocab_size": 128256, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
           "tie_word_embeddings": False}
    tensors = llama8b_tensors()
    if gptq:
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
        packed = {}
        for name, (n, k) in ((n, s) for n, s in tensors.items() if "_proj." in n):
            base = name.removesuffix(".weight")
            packed.update({f"{base}.qweight": [k // 8, n], f"{base}.scales": [k // 128, n],
                           f"{base}.qzeros": [k // 128, n // 8]})
        tensors = {**{n: s for n, s in tensors.items() if "_proj." not in n}, **packed}
    (root / "config.json").write_text(json.dumps(cfg))
    header = {name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()}
    blob = json.dumps(header).encode()
    path = root / "model.safetensors"
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        if gptq:
            f.truncate(5_700_000_000)
    return root


def select_model(qtbot, window, path) -> None:
    """Pick a model folder with Browse, and wait for the library's rescan that follows (it reselects the model, and
    with it the model's saved settings: the options set after this are not reset)."""
    load = window.panels["load"]
    entry = load.select_path(path)
    qtbot.waitUntil(lambda: window.ctx.library.find(entry.key) is not None, timeout=30_000)
    assert load.current_key() == entry.key


def expected_gib(quant: str, tp: int, context: int, tied: bool = False) -> tuple[str, str]:
    """(weights, total) per GPU in GiB as the panel writes them, from the parameter counts: the linear layers at
    bf16 2 / int8 1 / int4 0.5 + 3/128 / fp8 1 bytes a weight, the LM head in int8 when quantized (1 byte; a tied one
    an int8 copy), the rest (token table, norms) in bf16, all split over ``tp`` GPUs; KV: K and V of 32 layers x 8/tp
    heads x 128 in bf16 per token; 1 GiB overhead."""
    linear, other = llama8b_counts(tied)
    table = 128256 * 4096
    if quant == "none":
        weights = 2 * (linear + other)
    else:
        per_param = {"int8": 1, "int4": 0.5 + 3 / 128, "fp8": 1}[quant]
        weights = int(linear * per_param) + table + 2 * (other - (0 if tied else table))
    weights = -(-weights // tp)
    total = weights + 2 * 32 * (8 // tp) * 128 * 2 * context + fit.GIB
    return f"{weights / fit.GIB:.1f} GiB", f"{total / fit.GIB:.1f} GiB"


def estimate_text(load) -> str:
    """The estimate as read (the panel keeps each size on one line with a no-break space before its unit)."""
    return load.estimate.text().replace("\u00a0", " ")


def choices(main) -> dict[str, bool]:
    combo = main.editors["quantization"]
    return {combo.itemData(i): main.is_choice_enabled("quantization", combo.itemData(i)) for i in range(combo.count())}


def test_quantization_choices_follow_the_device_and_the_gpu(make_window, qtbot, monkeypatch, tmp_path):
    gpus = FakeGPUs(monkeypatch)
    gpus.spec = [(24, (8, 6)), (24, (8, 6))]  # two RTX 3090-class GPUs: no FP8 tensor cores
    w = make_window(autoload=False)
    load, main = w.panels["load"], w.panels["load"].form.main
    gpus.set(qtbot, w, (24, (8, 6)), (24, (8, 6)))
    select_model(qtbot, w, write_llama8b(tmp_path / "llama-8b"))
    combo = main.editors["quantization"]
    assert choices(main) == {"auto": True, "none": True, "int8": True, "int4": True, "fp8": False, "gguf": False}
    fp8_text = combo.itemText(combo.findData("fp8"))
    assert fit.FP8_REASON in fp8_text and fit.FP8_REASON == ("needs FP8 tensor cores (compute capability 8.9+: "
                                                             "RTX 40-series, RTX 6000 Ada, L40, H100)")
    assert "run on the CPU" in combo.itemText(combo.findData("gguf"))
    assert combo.itemText(combo.findData("int4")).startswith("int4 (GPU: 4-bit weights, groups of 128")
    # int4 chosen, then the CPU: back to auto; on the CPU int4 and fp8 are off (GPU kernels), gguf is on
    load.form.set_value("quantization", "int4")
    assert load.config().quantization == "int4"
    load.form.set_value("device", "cpu")
    assert load.form.values()["quantization"] == "auto"
    assert choices(main) == {"auto": True, "none": True, "int8": True, "int4": False, "fp8": False, "gguf": True}
    assert "runs on the GPU kernels" in combo.itemText(combo.findData("int4"))
    assert "runs on the GPU kernels" in combo.itemText(combo.findData("fp8"))
    # gguf chosen on the CPU, then the GPU: back to auto; int8 is on both and stays
    load.form.set_value("quantization", "gguf")
    load.form.set_value("device", "cuda")
    assert load.form.values()["quantization"] == "auto"
    load.form.set_value("quantization", "int8")
    load.form.set_value("device", "cpu")
    assert load.form.values()["quantization"] == "int8"
    load.form.set_value("device", "auto")  # auto: the GPUs
    assert load.form.values()["quantization"] == "int8"
    # Hopper: fp8 on, without a reason
    gpus.set(qtbot, w, (80, (9, 0)), (80, (9, 0)))
    assert choices(main)["fp8"] and combo.itemText(combo.findData("fp8")) == combo.itemData(
        combo.findData("fp8"), Qt.UserRole + 1)
    load.form.set_value("quantization", "fp8")
    assert "fp8 (e4m3)" in estimate_text(load) and "could not be read" not in estimate_text(load)
    # an Ada GPU 0 and an Ampere GPU 1: fp8 on at TP 1 (GPU 0 alone), off at TP 2, and a chosen fp8 goes back
    gpus.set(qtbot, w, (24, (8, 9)), (24, (8, 6)))
    assert load.form.values()["tensor_parallel_size"] == 1 and choices(main)["fp8"]
    assert load.form.values()["quantization"] == "fp8"
    load.form.set_value("tensor_parallel_size", 2)
    assert not choices(main)["fp8"] and load.form.values()["quantization"] == "auto"
    # a GPU whose compute capability is unknown: fp8 stays on, and the estimate says what it needs
    load.form.set_value("tensor_parallel_size", 1)
    gpus.set(qtbot, w, (24, None))
    assert choices(main)["fp8"]
    load.form.set_value("quantization", "fp8")
    text = estimate_text(load)
    assert "needs FP8 tensor cores (compute capability 8.9+" in text and "could not be read" in text, text


@pytest.mark.parametrize("tp", [1, 4])
def test_estimate_for_an_8b_llama_by_quantization(make_window, qtbot, monkeypatch, tmp_path, tp):
    gpus = FakeGPUs(monkeypatch)
    spec = [(24, (8, 9))] * 4
    gpus.spec = spec
    w = make_window(autoload=False)
    load = w.panels["load"]
    gpus.set(qtbot, w, *spec)
    select_model(qtbot, w, write_llama8b(tmp_path / "llama-8b"))
    load.form.set_value("tensor_parallel_size", tp)
    assert load.form.values()["tensor_parallel_size"] == tp
    where = "one 24 GiB GPU" if tp == 1 else "4 x 24 GiB"
    per = "" if tp == 1 else " per GPU"
    for quant in ("none", "int8", "int4", "fp8"):
        load.form.set_value("quantization", quant)
        weights, total = expected_gib(quant, tp, 8192)  # the model's 128k capped at the engine's 8192
        text = estimate_text(load)
        assert text.startswith(f"Fits on {where} with an 8k context: ~{total}{per} of the 21.6 GiB the engine "
                               "may use (90%)."), (quant, text)
        assert f"weights {weights} (" in text, (quant, text)
        if quant != "none":
            linear, other = llama8b_counts()
            table = 128256 * 4096
            linear_bytes = int(linear * (0.5 + 3 / 128)) if quant == "int4" else linear
            assert (f"{quant} linear layers {-(-linear_bytes // tp) / fit.GIB:.1f} GiB, int8 LM head "
                    f"{-(-table // tp) / fit.GIB:.1f} GiB, bfloat16 embeddings "
                    f"{-(-2 * (other - table) // tp) / fit.GIB:.1f} GiB)") in text, text
            assert "the token embeddings stay bfloat16" in text
    load.form.set_value("quantization", "int4")
    load.form.set_value("max_model_len", 16384)
    assert estimate_text(load).startswith(f"Fits on {where} with a 16k context: ~{expected_gib('int4', tp, 16384)[1]}")
    assert "KV cache " + f"{2 * 32 * (8 // tp) * 128 * 2 * 16384 / fit.GIB:.1f} GiB for one 16k sequence" in \
        estimate_text(load)


def test_estimate_says_what_does_not_fit_and_what_would(make_window, qtbot, monkeypatch, tmp_path):
    gpus = FakeGPUs(monkeypatch)
    gpus.spec = [(16, (8, 9))]
    w = make_window(autoload=False)
    load = w.panels["load"]
    gpus.set(qtbot, w, (16, (8, 9)))
    select_model(qtbot, w, write_llama8b(tmp_path / "llama-8b"))
    # bf16 on one 16 GiB card: int8 or fp8 would fit, no context is short enough
    text = estimate_text(load)
    assert text.startswith(f"Does not fit: needs ~{expected_gib('none', 1, 8192)[1]}, the GPU has 16 GiB "
                           "(14.4 GiB at the 90% share); try int8 or fp8.\n"), text
    # bf16 with a 64k context on one 24 GiB card: int8 / fp8, or a context the KV cache has room for
    gpus.set(qtbot, w, (24, (8, 9)))
    load.form.set_value("max_model_len", 65536)
    linear, other = llama8b_counts()
    room = int(24 * fit.GIB * 0.9) - 2 * (linear + other) - fit.GIB
    longest = room // (2 * 32 * 8 * 128 * 2)
    text = estimate_text(load)
    assert text.startswith(f"Does not fit: needs ~{expected_gib('none', 1, 65536)[1]}, the GPU has 24 GiB "
                           f"(21.6 GiB at the 90% share); try int8 or fp8, or a context of at most "
                           f"{longest // 1024}k tokens.\n"), text
    assert longest // 1024 == 45
    # two 16 GiB Ampere cards (no fp8), bf16 at TP 1: int8, or both GPUs
    gpus.set(qtbot, w, (16, (8, 6)), (16, (8, 6)))
    load.form.set_value("max_model_len", 8192)
    text = estimate_text(load)
    assert "the GPU has 16 GiB (14.4 GiB at the 90% share); try int8, or tensor-parallel size 2.\n" in text, text
    load.form.set_value("tensor_parallel_size", 2)
    assert estimate_text(load).startswith(f"Fits on 2 x 16 GiB with an 8k context: "
                                           f"~{expected_gib('none', 2, 8192)[1]} per GPU")
    # one 7 GiB card: int4 alone is not enough at 8k, int4 with a shorter context is
    gpus.set(qtbot, w, (7, (8, 9)))
    text = estimate_text(load)
    table = 128256 * 4096
    room = int(7 * fit.GIB * 0.9) - int(linear * (0.5 + 3 / 128)) - table - 2 * (other - table) - fit.GIB
    assert f"; try int4 with a context of at most {room // (2 * 32 * 8 * 128 * 2) // 1024}k tokens." in text, text
    gpus.set(qtbot, w, (4, (8, 9)))
    assert "it needs more or larger GPUs (or a smaller model)." in estimate_text(load)
    # two 8 GiB cards at TP 2: per GPU, in the GPUs' terms
    gpus.set(qtbot, w, (8, (8, 9)), (8, (8, 9)))
    load.form.set_value("tensor_parallel_size", 2)
    text = estimate_text(load)
    assert text.startswith(f"Does not fit: needs ~{expected_gib('none', 2, 8192)[1]} per GPU, the GPUs have 8 GiB "
                           "(7.2 GiB at the 90% share); try int8 or fp8.\nPer GPU: weights "), text
    load.form.set_value("quantization", "int4")
    assert estimate_text(load).startswith(f"Fits on 2 x 8 GiB with an 8k context: ~{expected_gib('int4', 2, 8192)[1]} "
                                          "per GPU of the 7.2 GiB the engine may use (90%).")


def test_estimate_for_a_gptq_checkpoint(make_window, qtbot, monkeypatch, tmp_path):
    gpus = FakeGPUs(monkeypatch)
    gpus.spec = [(24, (8, 9))]
    w = make_window(autoload=False)
    load = w.panels["load"]
    gpus.set(qtbot, w, (24, (8, 9)))
    select_model(qtbot, w, write_llama8b(tmp_path / "llama-8b-gptq", gptq=True))
    files = (tmp_path / "llama-8b-gptq" / "model.safetensors").stat().st_size + \
        (tmp_path / "llama-8b-gptq" / "config.json").stat().st_size
    text = estimate_text(load)
    assert "The checkpoint's GPTQ int4 weights stay quantized on the GPU (about the files' size)." in text, text
    assert f"weights {files / fit.GIB:.1f} GiB (about the files' size)" in text
    load.form.set_value("device", "cpu")
    load.form.set_value("dtype", "bfloat16")
    linear, other = llama8b_counts()  # the real parameters, not the packed words the files count
    text = estimate_text(load)
    assert f"weights {2 * (linear + other) / fit.GIB:.1f} GiB" in text, text
    assert (f"The checkpoint's GPTQ int4 weights are dequantized to bfloat16 on the CPU: "
            f"~{2 * (linear + other) / files:.1f}x the files' size.") in text
    # int4 asked for on the GPU: the checkpoint's layers stay as they are
    load.form.set_value("device", "cuda")
    load.form.set_value("quantization", "int4")
    text = estimate_text(load)
    assert f"weights {files / fit.GIB:.1f} GiB (about the files' size)" in text
    assert "stay quantized on the GPU (about the files' size); int4 applies only to layers the checkpoint keeps in " \
           "float." in text, text
    # an FP8 checkpoint on a GPU without FP8 tensor cores: dequantized
    fp8_dir = write_llama8b(tmp_path / "llama-8b-fp8")
    cfg = json.loads((fp8_dir / "config.json").read_text())
    (fp8_dir / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8"}}))
    gpus.set(qtbot, w, (24, (8, 6)))
    select_model(qtbot, w, fp8_dir)
    text = estimate_text(load)
    assert text.startswith("Fits on one 24 GiB GPU") and f"weights {2 * (linear + other) / fit.GIB:.1f} GiB" in text
    assert "The checkpoint's FP8 weights are dequantized to bfloat16 on this GPU (no FP8 tensor cores)" in text, text
    gpus.set(qtbot, w, (24, (9, 0)))
    assert "The checkpoint's FP8 weights stay quantized on the GPU" in estimate_text(load)


def test_cpu_estimate_follows_the_tensor_parallel_size(make_window, qtbot):
    """Issue 45 row 15: each CPU rank is a process with its own KV-cache pool and overhead, and holds a share of the
    KV heads (more tokens per pool): the estimate counts them for the TP size chosen."""
    w = make_window(autoload=False)
    load = w.panels["load"]
    qtbot.waitUntil(lambda: w.ctx.hardware_snapshot is not None and load.model_combo.findData(EMBEDDED_KEY) >= 0,
                    timeout=30_000)
    if w.ctx.num_gpus:
        pytest.skip("the CPU estimate: this machine has a GPU")
    load.select_key(EMBEDDED_KEY)
    load.form.set_value("kv_cache_memory_gib", 1.0)
    load.form.set_value("max_model_len", 2048)
    one = load.estimate.text().replace("\u00a0", " ")
    assert "(float32, CPU)" in one or "(bfloat16, CPU)" in one, one
    facts = load.entry(EMBEDDED_KEY).facts
    dtype = "float32" if "float32" in one else "bfloat16"
    tokens1 = fit.GIB // facts.shape.kv_bytes_per_token(fit.DTYPE_BYTES[dtype], 1)
    assert f"KV cache 1.0 GiB (room for about {tokens1:,} tokens" in one, one
    load.form.set_value("tensor_parallel_size", 3)
    three = load.estimate.text().replace("\u00a0", " ")
    tokens3 = fit.GIB // facts.shape.kv_bytes_per_token(fit.DTYPE_BYTES[dtype], 3)
    assert abs(tokens3 - 3 * tokens1) <= 3  # SmolLM2's 3 KV heads: one per rank
    assert f"CPU, 3 ranks" in three, three
    assert (f"KV cache 3 x 1.0 GiB (one pool per rank; each holds 1 of the 3 KV heads, so room for about "
            f"{tokens3:,} tokens") in three, three
    assert "overhead 3 x 0.5 GiB" in three, three

    def total(text: str) -> float:
        return float(text.split("About ")[1].split(" GiB")[0])

    assert total(three) - total(one) == pytest.approx(2 * 1.5, abs=0.11)  # two more pools and overheads


def test_fp8_kv_cache_follows_the_device_and_halves_the_estimates_kv(make_window, qtbot, monkeypatch, tmp_path):
    """--kv-cache-dtype fp8: off with the reason on the CPU and on GPUs without FP8 support (a chosen fp8 goes back to
    auto); on an Ada GPU it is on, and the estimate's KV cache for the same context halves."""
    gpus = FakeGPUs(monkeypatch)
    gpus.spec = [(48, (8, 9))]
    w = make_window(autoload=False)
    load, main = w.panels["load"], w.panels["load"].form.advanced  # the KV dtype is an advanced field
    gpus.set(qtbot, w, (48, (8, 9)))
    select_model(qtbot, w, write_llama8b(tmp_path / "llama-8b"))
    load.form.set_value("device", "cuda")
    load.form.set_value("max_model_len", 32768)
    assert main.is_choice_enabled("kv_cache_dtype", "fp8")
    before = estimate_text(load)
    assert "KV cache 4 GiB for one 32k" in before.replace(".0 GiB", " GiB"), before
    load.form.set_value("kv_cache_dtype", "fp8")
    after = estimate_text(load)
    assert "KV cache in fp8 2 GiB" in after.replace(".0 GiB", " GiB"), after
    load.form.set_value("device", "cpu")
    assert not main.is_choice_enabled("kv_cache_dtype", "fp8")
    assert "needs a GPU" in main.editors["kv_cache_dtype"].itemText(main.editors["kv_cache_dtype"].findData("fp8"))
    assert load.form.values()["kv_cache_dtype"] == "auto"
    load.form.set_value("device", "cuda")
    gpus.set(qtbot, w, (24, (8, 6)))  # an Ampere GPU: no FP8
    assert not main.is_choice_enabled("kv_cache_dtype", "fp8")
