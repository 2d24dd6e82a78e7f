"""Embedding pooling (issue 19): the sentence-transformers configuration read by engine/loader/pooling.py, and
the engine's pooled vectors (engine.llm.LLM.embed) against transformers' hidden states pooled by hand, with
prompts cut into several prefill chunks (mean pooling summed across steps) and a batch that shares steps."""

from __future__ import annotations

import json

import pytest
import torch

from engine.loader.pooling import pooling_for


def _st_dir(d, pooling: dict, extra_modules=(), normalize=True):
    modules = [{"path": "", "type": "sentence_transformers.models.Transformer"},
               {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    modules += [{"path": "", "type": f"sentence_transformers.models.{m}"} for m in extra_modules]
    if normalize:
        modules.append({"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (d / "modules.json").write_text(json.dumps(modules))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return d


def test_pooling_config(tmp_path):
    assert pooling_for(None, "mean") == pooling_for(tmp_path, "mean")  # no modules.json: --pooling, normalised
    p = pooling_for(tmp_path, "mean")
    assert (p.mode, p.normalize, p.source, p.unsupported) == ("mean", True, "--pooling", None)
    with pytest.raises(ValueError):
        pooling_for(None, "max")

    cases = [
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, (), True, ("cls", True, None)),
        ({"pooling_mode_lasttoken": True}, (), False, ("last", False, None)),
        ({"pooling_mode": "mean"}, (), True, ("mean", True, None)),  # sentence-transformers >= 3's spelling
        ({"pooling_mode_max_tokens": True}, (), True, ("last", True, "pooling_mode_max_tokens")),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, (), True, ("cls", True, "one pooling")),
        ({"pooling_mode_mean_tokens": True}, ("Dense",), True, ("mean", True, "Dense module")),
    ]
    for i, (cfg, extra, norm, (mode, normalize, why)) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        p = pooling_for(_st_dir(d, cfg, extra, norm), "mean")
        assert p.source == "sentence-transformers" and p.normalize == normalize, (cfg, p)
        if why is None:
            assert p.mode == mode and p.unsupported is None, (cfg, p)
        else:
            assert why in p.unsupported, (cfg, p)


def _by_hand(model, ids: list[int], mode: str) -> torch.Tensor:
    with torch.no_grad():
        h = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]  # after the final norm
    v = {"mean": h.mean(0), "cls": h[0], "last": h[-1]}[mode]
    return torch.nn.functional.normalize(v, dim=0)


@pytest.mark.parametrize("mode", ["mean", "last"])
def test_embed_matches_transformers_across_chunks(tiny_model_dir, hf_reference, mode):
    """``--pooling`` on a plain decoder directory; a 16-token step budget cuts the long prompts into chunks and
    puts several inputs into one step."""
    from engine import LLM

    d = tiny_model_dir("qwen2")
    llm = LLM(str(d), dtype="float32", pooling=mode, max_num_batched_tokens=16)
    texts = ["a short one", "a much longer text that takes more than one prefill chunk of sixteen tokens " * 2,
             "x", "another text of middling length, for the batch"]
    got = torch.tensor(llm.embed(texts))
    ref = hf_reference(d)
    for text, g in zip(texts, got):
        want = _by_hand(ref, llm.tokenizer.encode(text), mode)
        assert torch.nn.functional.cosine_similarity(g, want, dim=0) >= 0.9999
        torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-4)
    alone = torch.tensor(llm.embed(texts[1]))[0]
    assert (alone - got[1]).abs().max() < 1e-5  # batch-invariant to float rounding
    assert llm.core.blocks.usage == 0.0 and not llm.core.requests and not llm.core.runner.pooling_state


def test_deterministic_default_model_is_bitwise_batch_invariant():
    """With --deterministic (batch-invariant CPU kernels) the default model's embedding of an input is the same
    bits alone and in a batch that shares its steps with longer inputs."""
    from engine import LLM

    llm = LLM(dtype="float32", deterministic=True, pooling="mean")
    texts = ["hello world", "a longer input, so that the step holds more than sixteen tokens in all " * 2]
    batch = llm.embed(texts)
    assert [llm.embed(t)[0] for t in texts] == batch
