"""The random-weight Llama-shape GGUF files `kestrel bench offline --gguf-models` writes for itself
(engine/bench/gguf_models.py), at a small shape: what is in them, that they are written once and reused, and that
both of Kestrel's GGUF loads read them."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from engine.bench import gguf_models
from engine.bench.gguf_models import BENCH_MODELS, LlamaShape, RandomLlama, ensure_random_llama, small_shape


def test_default_shape_is_a_1b_llama():
    s = BENCH_MODELS["llama-1b-q4_0"].shape
    assert (s.hidden, s.layers, s.intermediate, s.heads, s.kv_heads) == (2048, 16, 5632, 32, 8)
    assert BENCH_MODELS["llama-1b-q4_0"].qtype == "Q4_0" and BENCH_MODELS["llama-1b-q8_0"].qtype == "Q8_0"
    params = s.linear_params() + 49152 * s.hidden  # + the (tied) embedding of SmolLM2's vocabulary
    assert 0.75e9 < params < 1.1e9


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_random_llama_file(tmp_path, qtype):
    from engine.loader.gguf import gguf_hf_config, gguf_quantization
    from engine.loader.gguf_file import GGUFFile

    shape = small_shape(seed=3)
    spec = RandomLlama(qtype, shape)
    path = ensure_random_llama(spec, tmp_path)
    assert path.parent == tmp_path and path.name == spec.file_name() and qtype in path.name
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    gf = GGUFFile(path)
    try:
        cfg = gguf_hf_config(gf)
        assert gguf_quantization(gf) == qtype
        assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"],
                cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (128, 2, 256, 4, 2)
        assert cfg["tie_word_embeddings"] and cfg["vocab_size"] == len(gf.metadata["tokenizer.ggml.tokens"])
        qt = GGMLQuantizationType[qtype]
        block, size = GGML_QUANT_SIZES[qt]
        names = set(gf.tensors)
        assert len(names) == 1 + 1 + 9 * shape.layers and "output.weight" not in names
        expect = {"blk.1.attn_q.weight": (128, 128), "blk.1.attn_k.weight": (64, 128), "blk.1.attn_v.weight": (64, 128),
                  "blk.0.ffn_up.weight": (256, 128), "blk.0.ffn_down.weight": (128, 256),
                  "token_embd.weight": (cfg["vocab_size"], 128)}
        for name, (rows, cols) in expect.items():
            t = gf.tensors[name]
            assert t.type_name == qtype and t.nbytes == rows * cols // block * size, name
            values = quants.dequantize(gf.raw(name), qt).reshape(rows, cols)
            assert abs(values.std() - shape.std) < 0.1 * shape.std and abs(values.mean()) < 0.1 * shape.std, name
        for name, t in gf.tensors.items():
            if len(t.shape) == 1:
                assert t.type_name == "F32" and np.all(gf.raw(name).view(np.float32) == 1.0), name
            else:
                assert t.type_name == qtype, name
        q = quants.dequantize(gf.raw("blk.0.attn_q.weight"), qt)
        k = quants.dequantize(gf.raw("blk.0.attn_k.weight"), qt)
        assert not np.allclose(q[:64], k)  # every tensor its own draw
    finally:
        gf.close()


def test_written_once_then_reused(tmp_path, monkeypatch):
    spec = RandomLlama("Q4_0", small_shape())
    first = ensure_random_llama(spec, tmp_path)
    data, mtime = first.read_bytes(), first.stat().st_mtime_ns
    monkeypatch.setattr(gguf_models, "write_random_llama", lambda *a, **k: pytest.fail("rewritten"))
    assert ensure_random_llama(spec, tmp_path) == first and first.stat().st_mtime_ns == mtime
    # same spec elsewhere: the same bytes (seeded); another seed: another file name and other values
    monkeypatch.undo()
    again = ensure_random_llama(spec, tmp_path / "b")
    assert again.read_bytes() == data
    other = ensure_random_llama(RandomLlama("Q4_0", small_shape(seed=1)), tmp_path)
    assert other != first and other.read_bytes() != data


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    def boom(path, spec, tokenizer_source=None):
        path.write_bytes(b"GGUF partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_models, "write_random_llama", boom)
    with pytest.raises(KeyboardInterrupt):
        ensure_random_llama(RandomLlama("Q8_0", small_shape()), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_model_path_names(tmp_path, smollm2_gguf):
    assert gguf_models.model_path("smollm2") == smollm2_gguf
    assert gguf_models.model_path(str(smollm2_gguf)) == smollm2_gguf
    with pytest.raises(ValueError, match="neither a .gguf file nor one of smollm2"):
        gguf_models.model_path("llama-70b", tmp_path)
    with pytest.raises(ValueError, match="multiples of 32"):
        gguf_models.write_random_llama(tmp_path / "x.gguf", RandomLlama("Q4_0", LlamaShape(hidden=100, heads=4)))


def test_both_kestrel_loads_read_it(tmp_path):
    from engine import LLM, SamplingParams
    from engine.layers.linear import LinearBase

    path = ensure_random_llama(RandomLlama("Q8_0", small_shape()), tmp_path)
    outs = []
    for quantization in ("gguf", "none"):
        llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02, quantization=quantization)
        try:
            linears = [m for m in llm.core.runner.model.modules() if isinstance(m, LinearBase)]
            assert all((m.gguf is not None) == (quantization == "gguf") for m in linears)
            outs.append(llm.generate([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]],
                                     SamplingParams(max_tokens=4, temperature=0))[0].outputs[0].token_ids)
        finally:
            llm.close()
    assert len(outs[0]) == len(outs[1]) == 4
