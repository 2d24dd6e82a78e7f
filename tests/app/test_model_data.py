"""Model facts without torch: the GGUF header reader against the engine's, support checks that mirror the
engine's lists, the library over a Hugging Face cache (and deleting from it), and the fit estimate."""

from __future__ import annotations

import json
import os

import pytest

from app import fit
from app.gguf_header import GGUFHeaderError, read_gguf_header
from app.library import delete_entry, deletion_size, scan_library
from app.model_inspect import GGUF_ARCHITECTURES, GGUF_TENSOR_TYPES, inspect_model
from app.quant_scheme import SUPPORTED, describe_quantization


def test_gguf_header_matches_the_engine(smollm2_gguf):
    from engine.loader.gguf import gguf_hf_config, gguf_quantization
    from engine.loader.gguf_file import GGUFFile

    ours = read_gguf_header(smollm2_gguf)
    theirs = GGUFFile(smollm2_gguf)
    assert ours.quantization == gguf_quantization(theirs) == "Q4_1"
    cfg = gguf_hf_config(theirs)
    shape = fit.ModelShape.from_gguf_metadata(ours.metadata, ours.vocab_size)
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_dim, shape.hidden_size,
            shape.vocab_size) == (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                  cfg["head_dim"], cfg["hidden_size"], cfg["vocab_size"])
    assert ours.num_params == sum(int(__import__("math").prod(t.shape)) for t in theirs.tensors.values())


def test_support_lists_mirror_the_engine():
    from engine.loader.gguf import GGUF_ARCHITECTURES as ENGINE_ARCHS
    from engine.loader.gguf import SUPPORTED_QTYPES

    assert GGUF_ARCHITECTURES == ENGINE_ARCHS
    assert GGUF_TENSOR_TYPES == {q.name for q in SUPPORTED_QTYPES}


def test_inspect_gguf_directory_and_broken_files(smollm2_gguf, tiny_model_dir, tmp_path):
    f = inspect_model(smollm2_gguf)
    assert f.supported and f.format == "gguf" and f.architecture == "LlamaForCausalLM"
    assert f.context_length == 8192 and 130e6 < f.num_params < 140e6
    d = inspect_model(tiny_model_dir("qwen3"))
    assert d.supported and d.architecture == "Qwen3ForCausalLM" and d.num_params > 0
    assert d.generation_config["top_k"] == 20
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    b = inspect_model(bad)
    assert not b.supported and "truncated" in b.reason and "bad.gguf" not in b.reason  # the path is shown beside it, once
    with pytest.raises(GGUFHeaderError):
        read_gguf_header(bad)
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    cfg = json.loads((tiny_model_dir("llama") / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (gptq / "config.json").write_text(json.dumps(cfg))
    (gptq / "model.safetensors").write_bytes((tiny_model_dir("llama") / "model.safetensors").read_bytes())
    g = inspect_model(gptq)
    assert g.supported and g.reason == "" and g.quantization == "GPTQ"  # no group_size: the engine's per-channel
    assert g.quantization_name == "GPTQ int4 per-channel"
    other = tmp_path / "mamba"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    (other / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    m = inspect_model(other)
    assert not m.supported and "MambaForCausalLM" in m.reason


# quantization_config -> the engine's name, or None where it refuses the config
_CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
QUANT_CONFIGS = [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "GPTQ int4 g128"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True}, "GPTQ int4 g64 act-order"),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"}, "GPTQ int8 per-channel"),
    ({"quant_method": "GPTQ", "bits": 4}, "GPTQ int4 per-channel"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "AWQ int4 g128"),
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "GEMM"}, "AWQ int4 g64"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
     "FP8 block 128x128"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "FP8 per-tensor"),
    (_CT_FP8, "FP8 per-channel"),
    ({**_CT_FP8, "config_groups": {"g": {"format": "naive-quantized", "weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}}, "FP8 block 128x128"),
    # refused
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, None),
    ({"quant_method": "hqq", "nbits": 4}, None),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, None),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "backend": "llm-awq"}, None),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, None),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, None),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, None),
    ({"quant_method": "gptq", "bits": 2, "group_size": 128}, None),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, None),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "is_marlin_format": True}, None),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, None),
    ({"quant_method": "gptq", "group_size": 128}, None),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, None),
    ({"quant_method": "fp8", "fmt": "e5m2"}, None),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}, None),
    ({**_CT_FP8, "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "group"}}}},
     None),
    ({**_CT_FP8, "config_groups": {"a": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}},
                                   "b": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, None),
    ({"quant_method": "compressed-tensors"}, None),
]


@pytest.mark.parametrize("qc, name", QUANT_CONFIGS, ids=lambda v: None if isinstance(v, dict) else str(v))
def test_quantization_descriptions_are_the_engines(qc, name):
    """One set of rules (engine/quant_scheme.py): the app names what the engine loads by the engine's name, and
    refuses what it refuses, with what Kestrel loads."""
    from engine.quant_scheme import SchemeError, parse_scheme

    try:
        engine_name = parse_scheme(qc).name
    except SchemeError:
        engine_name = None
    assert engine_name == name
    ours, reason = describe_quantization(qc)
    if name is None:
        assert ours and reason and reason.endswith(f"Kestrel loads {SUPPORTED}; use the unquantized model or a "
                                                   "GGUF file."), reason
    else:
        assert (ours, reason) == (name, None)


def test_the_torch_free_rules_block_is_the_kernels():
    from engine.quant_scheme import FP8_BLOCK
    from engine.weight_quant import FP8_BLOCK as KERNEL_FP8_BLOCK

    assert FP8_BLOCK == KERNEL_FP8_BLOCK


def _quantized_dir(tiny_model_dir, root, qc):
    d = root / "m"
    d.mkdir()
    cfg = json.loads((tiny_model_dir("llama") / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    (d / "model.safetensors").write_bytes((tiny_model_dir("llama") / "model.safetensors").read_bytes())
    return d


@pytest.mark.parametrize("qc, name, method", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "GPTQ int4 g128", "GPTQ"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "AWQ int4 g128",
     "AWQ"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "FP8 block 128x128",
     "FP8"),
    (_CT_FP8, "FP8 per-channel", "FP8"),  # app.fit's method: FP8, kept quantized on an FP8 GPU
])
def test_a_prequantized_checkpoint_is_loadable_with_its_name(qc, name, method, tiny_model_dir, tmp_path):
    f = inspect_model(_quantized_dir(tiny_model_dir, tmp_path, qc))
    assert f.supported and f.reason == "" and f.readable
    assert (f.quantization_name, f.quantization) == (name, method)
    assert fit.prequantized_method(f) == method


@pytest.mark.parametrize("qc, label, why", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes",
     "bitsandbytes-quantized checkpoints cannot be loaded."),
    ({"quant_method": "hqq", "nbits": 4}, "HQQ", "HQQ-quantized checkpoints cannot be loaded."),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "AWQ",
     "This AWQ checkpoint cannot be loaded: quantization_config.version = 'gemv' is not supported; AWQ checkpoints "
     "in the \"gemm\" layout are (AutoAWQ's default;"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ",
     "This GPTQ checkpoint cannot be loaded: quantization_config.bits = 3 is not supported; GPTQ checkpoints of 4 "
     "or 8 bits are."),
])
def test_an_unsupported_quantization_is_refused_with_the_reason(qc, label, why, tiny_model_dir, tmp_path):
    f = inspect_model(_quantized_dir(tiny_model_dir, tmp_path, qc))
    assert not f.supported and f.readable
    assert f.quantization_name == label and f.quantization == str(qc["quant_method"]).upper()
    assert f.reason.startswith(why), f.reason
    assert f.reason.endswith("Kestrel loads GPTQ (4 or 8 bits), AWQ (4 bits, GEMM layout) and FP8 checkpoints (per "
                             "tensor, per channel or 128x128 blocks, llm-compressor's compressed-tensors FP8 "
                             "included); use the unquantized model or a GGUF file."), f.reason
    assert "yet" not in f.reason


def test_the_hub_summary_of_a_config_may_leave_fields_out():
    """model_info().config may carry only part of quantization_config: what is not there is not assumed."""
    assert describe_quantization({"quant_method": "gptq", "bits": 4}, complete=False) == ("GPTQ int4", None)
    assert describe_quantization({"quant_method": "awq"}, complete=False) == ("AWQ", None)
    assert describe_quantization({"quant_method": "fp8"}, complete=False) == ("FP8", None)
    assert describe_quantization({"quant_method": "compressed-tensors"}, complete=False) == ("compressed-tensors",
                                                                                              None)
    lacking = ({"quant_method": "GPTQ", "bits": 4}, {"quant_method": "gptq", "group_size": 128},
               {"quant_method": "fp8", "activation_scheme": "static"}, {"quant_method": "compressed-tensors"})
    for qc, _ in QUANT_CONFIGS:  # a config with the fields its name depends on reads the same either way
        if qc not in lacking:
            assert describe_quantization(qc, complete=False) == describe_quantization(qc), qc
    assert describe_quantization(lacking[0], complete=False) == ("GPTQ int4", None)  # group size not known
    assert describe_quantization(lacking[1], complete=False) == ("GPTQ g128", None)  # bits not known
    assert describe_quantization(lacking[2], complete=False) == ("FP8", None)  # block size not known
    assert describe_quantization({"quant_method": "awq", "w_bit": 4, "desc_act": True}, complete=False) == (
        "AWQ int4", None)
    assert describe_quantization({"quant_method": "fp8", "fmt": "e5m2"}, complete=False)[1].startswith(
        "This FP8 checkpoint cannot be loaded: quantization_config.fmt = 'e5m2' is not supported")
    assert describe_quantization({"quant_method": "gptq", "bits": 3}, complete=False)[1].startswith(
        "This GPTQ checkpoint cannot be loaded: quantization_config.bits = 3 is not supported")
    assert describe_quantization(None) == describe_quantization({"bits": 4}) == (None, None)


def _hf_repo(cache, repo_id, files: dict[str, bytes], commit="c0ffee"):
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    for name, data in files.items():
        blob = repo / "blobs" / f"blob-{abs(hash(name))}"
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, (snap / name).parent), snap / name)
    return repo


def test_library_scans_the_cache_the_models_folder_and_added_files(smollm2_gguf, tiny_model_dir, tmp_path):
    cache, models = tmp_path / "hub", tmp_path / "models"
    models.mkdir()
    gguf = smollm2_gguf.read_bytes()
    _hf_repo(cache, "org/two-quants", {"m-Q4_1.gguf": gguf, "m-Q8_0.gguf": gguf[:1000], "README.md": b"hi"})
    tiny = tiny_model_dir("llama")
    _hf_repo(cache, "org/tiny", {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()})
    (models / "local.gguf").write_bytes(gguf)
    loose = tmp_path / "elsewhere.gguf"
    loose.write_bytes(gguf)
    entries = scan_library(cache, models, [str(loose), str(tmp_path / "gone.gguf")])
    by_name = {e.name: e for e in entries}
    assert set(by_name) == {"SmolLM2-135M-Instruct.Q4_1", "org/two-quants · m-Q4_1.gguf",
                            "org/two-quants · m-Q8_0.gguf", "org/tiny", "local", "elsewhere"}
    assert by_name["SmolLM2-135M-Instruct.Q4_1"].source == "embedded" and not by_name[
        "SmolLM2-135M-Instruct.Q4_1"].deletable
    assert by_name["org/tiny"].model_ref.endswith("snapshots/c0ffee") and by_name["org/tiny"].facts.supported
    assert by_name["org/two-quants · m-Q4_1.gguf"].key == "hf:org/two-quants/m-Q4_1.gguf"
    assert by_name["elsewhere"].source == "added" and not by_name["elsewhere"].deletable
    assert not by_name["org/two-quants · m-Q8_0.gguf"].facts.supported  # truncated header

    # deleting one GGUF of a repo frees its blob only; the last one takes the repo with it
    q4 = by_name["org/two-quants · m-Q4_1.gguf"]
    assert deletion_size(q4, cache) == len(gguf)
    assert delete_entry(q4, cache) == len(gguf)
    left = {e.name for e in scan_library(cache, models, [])}
    assert "org/two-quants · m-Q4_1.gguf" not in left and "org/two-quants · m-Q8_0.gguf" in left
    q8 = by_name["org/two-quants · m-Q8_0.gguf"]
    assert delete_entry(q8, cache) == 1000 + 2  # with README.md: the whole repo goes
    assert not (cache / "models--org--two-quants").exists()
    freed = delete_entry(by_name["org/tiny"], cache)
    assert freed == sum(p.stat().st_size for p in tiny.iterdir() if p.is_file())
    assert delete_entry(by_name["local"], cache) == len(gguf) and not (models / "local.gguf").exists()
    with pytest.raises(PermissionError):
        delete_entry(by_name["elsewhere"], cache)
    assert loose.exists()


def test_fit_estimate():
    # Llama-3-8B-like: 32 layers, 8 KV heads of 128
    shape = fit.ModelShape(num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096,
                           vocab_size=128256, max_context=8192)
    assert shape.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    weights = fit.weights_in_memory(8_030_000_000, "bfloat16", 4_900_000_000, keeps_quantized=False)
    assert weights == 16_060_000_000
    assert fit.weights_in_memory(8_030_000_000, "bfloat16", 4_900_000_000, keeps_quantized=True) == 4_900_000_000
    # --quantization auto keeps GGUF blocks only on the CPU; none and a GPU dequantize them
    assert fit.weights_in_memory(8_030_000_000, "bfloat16", 4_900_000_000, True, gpu=True) == 16_060_000_000
    assert fit.weights_in_memory(8_030_000_000, "bfloat16", 4_900_000_000, True, "none") == 16_060_000_000
    assert fit.weights_in_memory(8_030_000_000, "bfloat16", 4_900_000_000, False, "gguf") == 4_900_000_000
    gpu16 = int(16 * fit.GIB * 0.9)  # a 16 GiB card, 90% for the engine
    one = fit.estimate(weights, shape, 8192, 1, "bfloat16", gpu16)
    assert one.kv_cache == 131072 * 8192 == fit.GIB and one.fits is False
    two = fit.estimate(weights, shape, 8192, 2, "bfloat16", gpu16)
    assert two.weights == weights // 2 and two.kv_cache == fit.GIB // 2 and two.fits is True
    eight = fit.estimate(weights, shape, 8192, 16, "bfloat16", None)
    assert eight.kv_cache == 2 * 32 * 1 * 128 * 2 * 8192  # 8 KV heads over 16 ranks: replicated, 1 per rank
    assert eight.fits is None
    assert fit.tp_choices(8, shape) == [1, 2, 4, 8] and fit.tp_choices(0) == [1]
    odd = fit.ModelShape(30, 9, 3, 64, 576, 49152)
    assert fit.tp_choices(8, odd) == [1]
    assert "per GPU" in two.describe() and fit.gib(1.5 * fit.GIB) == "1.5 GiB"


# Llama-3-8B's shape, and its parameters counted tensor by tensor (independently of app.fit's formulas)
LLAMA8B = {"hidden": 4096, "layers": 32, "ffn": 14336, "vocab": 128256, "heads": 32, "kv_heads": 8, "head_dim": 128}


def llama8b_tensors(tied: bool = False) -> dict[str, list[int]]:
    h, f, v, hd = LLAMA8B["hidden"], LLAMA8B["ffn"], LLAMA8B["vocab"], LLAMA8B["head_dim"]
    q, kv = LLAMA8B["heads"] * hd, LLAMA8B["kv_heads"] * hd
    out = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    for i in range(LLAMA8B["layers"]):
        p = f"model.layers.{i}"
        out.update({f"{p}.self_attn.q_proj.weight": [q, h], f"{p}.self_attn.k_proj.weight": [kv, h],
                    f"{p}.self_attn.v_proj.weight": [kv, h], f"{p}.self_attn.o_proj.weight": [h, q],
                    f"{p}.mlp.gate_proj.weight": [f, h], f"{p}.mlp.up_proj.weight": [f, h],
                    f"{p}.mlp.down_proj.weight": [h, f],
                    f"{p}.input_layernorm.weight": [h], f"{p}.post_attention_layernorm.weight": [h]})
    if not tied:
        out["lm_head.weight"] = [v, h]
    return out


def llama8b_counts(tied: bool = False) -> tuple[int, int]:
    """(linear parameters, everything else) of the 8B Llama."""
    linear = other = 0
    for name, shape in llama8b_tensors(tied).items():
        n = 1
        for d in shape:
            n *= d
        if "_proj." in name:
            linear += n
        else:
            other += n
    return linear, other


def llama8b_shape(tied: bool | None = None) -> fit.ModelShape:
    s = LLAMA8B
    return fit.ModelShape(num_layers=s["layers"], num_attention_heads=s["heads"], num_kv_heads=s["kv_heads"],
                          head_dim=s["head_dim"], hidden_size=s["hidden"], vocab_size=s["vocab"], max_context=8192,
                          intermediate_size=s["ffn"], tie_word_embeddings=tied)


def test_fit_weights_by_quantization_for_an_8b_llama():
    linear, other = llama8b_counts()
    assert linear + other == 8_030_261_248  # Llama-3-8B's published count
    shape = llama8b_shape()
    split = fit.param_split(shape, linear + other)
    assert (split.linear, split.embedding + split.lm_head + split.rest) == (linear, other)
    assert split.lm_head == split.embedding == 128256 * 4096
    assert fit.param_split(shape, None).total == linear + other  # from the shape alone: the same
    # bytes per linear parameter: GPU int8 1 (a scale + zero per channel), int4 0.5 + 3/128, fp8 1; the LM head in
    # int8 under each (engine/layers/embedding.py quantize_head); the token table and norms in bf16
    table = 128256 * 4096
    expected = {"none": 2 * linear + 2 * other, "int8": linear + table + 2 * (other - table),
                "int4": int(linear * (0.5 + 3 / 128)) + table + 2 * (other - table),
                "fp8": linear + table + 2 * (other - table)}
    gpu16 = int(24 * fit.GIB * 0.9)
    for quant, want in expected.items():
        got = fit.weights_bytes(linear + other, "bfloat16", 4_900_000_000, False, quant, shape, gpu=True)
        assert got.total == want, quant
        assert not got.from_file and got.head == (0 if quant == "none" else table)
        for tp in (1, 4):
            est = fit.estimate(got.total, shape, 8192, tp, "bfloat16", gpu16, gpu=True)
            assert est.weights == -(-want // tp)  # the linear layers, embedding and LM head all split over the ranks
            assert est.kv_cache == 2 * 32 * (8 // tp) * 128 * 2 * 8192
            assert est.total == -(-want // tp) + est.kv_cache + fit.GIB
    assert expected["int4"] / fit.GIB == pytest.approx(4.87, abs=0.01)
    assert expected["none"] / expected["int4"] == pytest.approx(3.07, abs=0.01)
    # int8 on the CPU: the linear layers and the LM head in int8 + an fp32 scale per 32, the token table in bf16
    cpu = fit.weights_bytes(linear + other, "bfloat16", None, False, "int8", shape, gpu=False)
    assert cpu.total == int((linear + table) * (1 + 4 / 32)) + 2 * (other - table)
    # without a shape the old rule: every parameter in int8 + scale, or in the dtype
    assert fit.weights_in_memory(linear + other, "bfloat16", None, False, "int8") == int((linear + other) * 1.125)
    assert fit.weights_in_memory(linear + other, "float32", None, False, "int4", None, True) == \
        int((linear + other) * 0.5234375)
    # GGUF blocks kept, and a GGUF file without the blocks kept: the file's size / the dequantized parameters
    assert fit.weights_in_memory(linear + other, "bfloat16", 4_900_000_000, False, "gguf", shape) == 4_900_000_000
    assert fit.weights_in_memory(linear + other, "bfloat16", 4_900_000_000, True, "auto", shape) == 4_900_000_000


def test_fit_tied_embeddings_count_once():
    linear, other = llama8b_counts(tied=True)
    table = 128256 * 4096
    for shape in (llama8b_shape(tied=True), llama8b_shape(tied=None)):  # said by the config, or told by the count
        split = fit.param_split(shape, linear + other)
        assert split.lm_head == 0 and split.embedding == table
        # the head's int8 copy beside the bf16 table (which the count holds once)
        assert fit.weights_in_memory(linear + other, "bfloat16", None, False, "int4", shape, gpu=True) == \
            int(linear * (0.5 + 3 / 128)) + table + 2 * other
    assert fit.param_split(llama8b_shape(tied=True), None).total == linear + other
    cfg = {"num_attention_heads": 32, "hidden_size": 4096, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "vocab_size": 128256, "intermediate_size": 14336, "tie_word_embeddings": True}
    assert fit.ModelShape.from_hf_config(cfg).tie_word_embeddings is True
    assert fit.ModelShape.from_hf_config({**cfg, "tie_word_embeddings": None}).tie_word_embeddings is None


def test_fit_prequantized_checkpoints_and_fp8_capability():
    linear, other = llama8b_counts()
    shape, files = llama8b_shape(), 5_700_000_000
    packed = linear // 8 + other  # a GPTQ int4 checkpoint's element count: int32 words of 8 codes
    for quant in ("none", "int8", "int4", "fp8"):  # kept quantized on a GPU, whatever the mode
        gpu = fit.weights_bytes(packed, "bfloat16", files, False, quant, shape, gpu=True, prequantized="GPTQ")
        assert gpu.total == files and gpu.from_file
    cpu = fit.weights_bytes(packed, "bfloat16", files, False, "none", shape, gpu=False, prequantized="GPTQ")
    assert cpu.total == 2 * (linear + other)  # dequantized on the CPU: the shape's count, not the packed one
    assert fit.weights_bytes(packed, "bfloat16", files, False, "none", None, gpu=False, prequantized="GPTQ") is None
    # an FP8 checkpoint: kept on an FP8 GPU (or one of unknown capability), dequantized on an older one
    assert fit.weights_in_memory(packed, "bfloat16", files, False, "none", shape, True, "FP8") == files
    older = fit.weights_bytes(packed, "bfloat16", files, False, "none", shape, True, "FP8", fp8_ok=False)
    assert older.total == 2 * (linear + other) and not older.from_file

    class Facts:
        format, quantization = "safetensors", "GPTQ"

    assert fit.prequantized_method(Facts) == "GPTQ"
    Facts.format = "gguf"
    assert fit.prequantized_method(Facts) is None
    assert fit.fp8_supported([(8, 9)]) is True and fit.fp8_supported([(9, 0), (10, 0)]) is True
    assert fit.fp8_supported([(8, 6)]) is False and fit.fp8_supported([(9, 0), (8, 0)]) is False
    assert fit.fp8_supported([None]) is None and fit.fp8_supported([(9, 0), None]) is None
    assert fit.fp8_supported([None, (7, 5)]) is False
    # the longest context beside the weights: bf16 8B on one 24 GiB GPU at 90%
    cap = int(24 * fit.GIB * 0.9)
    w = 2 * (linear + other)
    assert fit.max_context(cap, w, shape, 1, "bfloat16") == (cap - w - fit.GIB) // (2 * 32 * 8 * 128 * 2)
    assert fit.context_words(16384) == "16k" and fit.context_words(3000) == "3,000-token"
    assert fit.gib_round(23.99 * fit.GIB) == "24 GiB" and fit.gib_round(7.8 * fit.GIB) == "7.8 GiB"
