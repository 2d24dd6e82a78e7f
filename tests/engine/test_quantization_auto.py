"""--quantization auto, the default of the CLI, the server, the offline API and the app's Load form: a .gguf file's
blocks kept for the native CPU kernels where they run (as --quantization gguf), everything else as --quantization
none does it (a GPU dequantizes GGUF blocks and keeps a GPTQ / AWQ / FP8 checkpoint's own codes; float weights stay
float). engine.config.auto_quantization decides (torch-free, for the app), engine/runner/model_runner.py
resolve_quantization applies it to a load; ``none`` still expands a GGUF file to the dtype."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.config import GGUF_KERNEL_TYPES, QUANTIZATIONS, EngineConfig, auto_quantization
from engine.layers.linear import LinearBase
from engine.runner.load_checks import resolve_quantization


def _linears(llm: LLM) -> list[LinearBase]:
    return [m for m in llm.core.runner.model.modules() if isinstance(m, LinearBase)]


# -- the option ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"], ["serve"], ["bench", "offline"]])
def test_auto_is_the_default_of_every_command_and_none_expands(command):
    from engine.cli import build_parser

    parser = build_parser()
    assert EngineConfig.from_cli_args(parser.parse_args(command)).quantization == "auto"
    assert EngineConfig.from_cli_args(parser.parse_args([*command, "--quantization", "none"])).quantization == "none"
    with pytest.raises(SystemExit):  # not a choice: argparse says so
        parser.parse_args([*command, "--quantization", "blocks"])
    assert EngineConfig().quantization == "auto"
    field = next(f for f in EngineConfig.__dataclass_fields__.values() if f.name == "quantization")
    assert field.metadata["choices"] == list(QUANTIZATIONS) and QUANTIZATIONS[0] == "auto"


def test_the_kernel_type_names_are_the_kernels_types():
    """engine.config's torch-free names (what auto and the app look at) are the native kernels' types."""
    from engine.ops.gguf_quant import TYPES

    assert set(GGUF_KERNEL_TYPES) == {name for name, *_ in TYPES.values()}


@pytest.mark.parametrize("device, types, native, want", [
    ("cpu", {"Q4_1", "Q8_0", "F32"}, True, "gguf"),   # the embedded model
    ("cpu", {"Q4_K", "Q6_K"}, True, "gguf"),          # a Q4_K_M file
    ("cpu", {"Q2_K", "Q6_K"}, True, "gguf"),          # one type with a kernel: kept, the other dequantized
    ("cpu", {"Q2_K", "IQ4_XS"}, True, "none"),        # no type with a kernel: nothing to keep
    ("cpu", {"F16", "F32"}, True, "none"),            # a float GGUF file
    ("cpu", {"Q4_1"}, False, "none"),                 # no engine._C: its blocks could not run
    ("cuda", {"Q4_1", "Q8_0"}, True, "none"),         # a GPU dequantizes GGUF blocks (as before)
    ("cpu", None, True, "none"),                      # a Hugging Face checkpoint: as it is (GPTQ / AWQ / FP8 own)
    ("cuda", None, True, "none"),
])
def test_auto_rules(device, types, native, want):
    assert auto_quantization(device, types, native) == want


def test_resolve_follows_the_device_and_the_checkpoint(smollm2_gguf, tiny_model_dir):
    """The embedded model's GGUF weights: blocks on the CPU, dequantized on a GPU (the device is only named here:
    resolving needs no GPU). Float safetensors: none on both. A mode given is kept as given."""
    from engine import ops
    from engine.loader import load_checkpoint

    gguf = load_checkpoint(smollm2_gguf).weights
    assert gguf.matrix_types() == {"Q4_1", "Q8_0"}  # the layers' type, the token table's
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_quantization("auto", cpu, gguf) == ("gguf" if ops.native_available() else "none")
    assert resolve_quantization("auto", gpu, gguf) == "none"
    flat = load_checkpoint(tiny_model_dir("llama")).weights
    assert resolve_quantization("auto", cpu, flat) == resolve_quantization("auto", gpu, flat) == "none"
    for mode in QUANTIZATIONS[1:]:
        assert resolve_quantization(mode, cpu, gguf) == mode == resolve_quantization(mode, gpu, flat)


# -- loads -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def default_engine():
    llm = LLM(dtype="float32", kv_cache_memory_gib=0.02)
    yield llm
    llm.close()


def test_default_load_keeps_the_embedded_models_blocks(default_engine, smollm2_gguf, smollm2_fp32):
    """No option: the embedded Q4_1 model's linear weights stay the file's blocks (the same bits as asking for
    --quantization gguf); --quantization none expands them to float weights, as the default did before."""
    from engine.loader.gguf_file import GGUFFile

    from engine.cli import weights_words

    runner = default_engine.core.runner
    assert default_engine.config.quantization == "auto" and runner.quantization == "gguf"
    assert weights_words(default_engine) == ", Q4_1 blocks kept"  # `kestrel chat` says so
    layers = _linears(default_engine)
    assert layers and all(m.gguf is not None and m.weight.numel() == 0 for m in layers)
    gf = GGUFFile(smollm2_gguf)
    try:
        block_bytes = sum(t.nbytes for n, t in gf.tensors.items() if n.startswith("blk.") and len(t.shape) == 2)
    finally:
        gf.close()
    assert sum(m.gguf.nbytes for m in layers) == block_bytes
    ids = default_engine.tokenizer.encode("The capital of France is a city famous for its museums, and")
    got = default_engine.core.score(ids)
    with LLM(dtype="float32", kv_cache_memory_gib=0.02, quantization="gguf") as asked:
        assert torch.equal(asked.core.score(ids), got)
    expanded = smollm2_fp32  # LLM(dtype="float32", quantization="none"): the session's
    assert expanded.config.quantization == "none"
    assert expanded.core.runner.quantization == "none" and weights_words(expanded) == ", Q4_1 dequantized"
    assert all(m.gguf is None and m.weight.numel() > 0 for m in _linears(expanded))
    floats = expanded.core.score(ids)
    assert not torch.equal(floats, got)  # the blocks' kernels (activations quantized per block) really ran
    assert (floats.argmax(-1) == got.argmax(-1)).float().mean() >= 0.9


def test_auto_on_other_checkpoints(tiny_model_dir, tiny_gguf):
    """auto keeps a quantized .gguf file's blocks and loads float checkpoints (safetensors, or an F32 .gguf) as they
    are."""
    from engine.cli import weights_words

    for path, want in ((tiny_model_dir("llama"), "none"), (tiny_gguf("llama", "F32"), "none"),
                       (tiny_gguf("llama", "Q8_0"), "gguf")):
        with LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02) as llm:
            assert llm.core.runner.quantization == want, path
            assert weights_words(llm) == {"none": "", "gguf": ", Q8_0 blocks kept"}[want], path
            assert all((m.gguf is not None) == (want == "gguf") for m in _linears(llm)), path
