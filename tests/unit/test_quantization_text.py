"""The load option --quantization as reports and the app show it (engine.wire.ModelInfo.quantization_text): auto
with what it resolved to in the engine (ModelInfo.quantization_mode), any other option as it is."""

from __future__ import annotations

from engine.wire import ModelInfo


def info(**kw) -> ModelInfo:
    return ModelInfo(name="m", path="/m", **kw)


def test_auto_says_what_it_resolved_to():
    assert info(format="gguf", quantization="Q4_1", quantization_mode="gguf").quantization_text("auto") == \
        "auto (Q4_1 blocks kept)"
    assert info(format="gguf", quantization="Q4_1", quantization_mode="none").quantization_text("auto") == \
        "auto (Q4_1 dequantized)"
    assert info(format="safetensors", quantization="GPTQ", quantization_mode="none").quantization_text("auto") == \
        "auto (GPTQ as stored)"
    assert info(format="safetensors", quantization_mode="none").quantization_text("auto") == "auto (none)"


def test_other_options_and_an_engine_that_does_not_say_are_left_as_they_are():
    resolved = info(format="gguf", quantization="Q4_1", quantization_mode="gguf")
    assert resolved.quantization_text("gguf") == "gguf"
    assert info(quantization_mode="int8").quantization_text("int8") == "int8"
    assert info().quantization_text("auto") == "auto"  # a stand-in core: no quantization_mode
    assert info().quantization_text(None) == "none"
