"""Speculative decoding with a draft model: a tiny random target (tests/support/tiny_models.py) with a tinier
random draft of the same vocabulary, written with transformers here: greedy output identical to plain decoding
(whatever the draft proposes: low acceptance with a random draft, full with the target as its own draft, which
exercises the draft's KV rollback), the draft's work (each token's KV once: its prompt as a prefill with the
target's, the rest as decode rows, a finished request's KV taken by the next prompt that starts alike), and a
draft with another tokenizer refused at load with a clear error."""

from __future__ import annotations

import json

import pytest

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError
from tests.support.tiny_models import build_tiny_model, write_tokenizer

TINIER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=2048, rms_norm_eps=1e-5)


def _save(root, name, tokenizer_dir, **kw):
    dest = root / name
    if not dest.exists():
        dest.mkdir()
        build_tiny_model("llama", **kw).save_pretrained(str(dest))
        (dest / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
        write_tokenizer(dest, tokenizer_dir, "llama")
    return dest


@pytest.fixture(scope="module")
def models(tiny_model_dir, smollm2_tokenizer_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafts")
    return {"target": tiny_model_dir("llama"),
            "tinier": _save(root, "tinier", smollm2_tokenizer_dir, dims=TINIER, seed=7),
            "other_vocab": _save(root, "other_vocab", smollm2_tokenizer_dir, dims=TINIER, vocab_size=1000)}


def _spec(path, k=3):
    return json.dumps({"model": str(path), "num_speculative_tokens": k})


PROMPTS = [[1, 450, 4995, 338, 263, 7, 8, 9], [1, 17, 18, 19, 17, 18, 19, 17], list(range(100, 160))]


def _tokens(llm, params):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def target(models):
    llm = LLM(models["target"], dtype="float32", num_kv_blocks=64, block_size=16)
    yield llm
    llm.close()


@pytest.mark.parametrize("draft", ["tinier", "target"])
def test_greedy_equals_plain_decoding(models, target, draft):
    g = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = _tokens(target, g)
    target.core.set_speculative(_spec(models[draft]))
    try:
        got = _tokens(target, g)
        c = target.core.spec.counts
    finally:
        target.core.set_speculative(None)
    assert got == plain
    assert c.proposed > 0
    if draft == "target":  # its own draft: every proposal is the target's greedy token
        assert c.accepted == c.proposed and c.tokens_per_step > 3


def test_the_draft_computes_each_token_once(models, target):
    """The draft's runner processes each prompt once, as a prefill in the target's prefill step, and every later
    token as decode rows: no re-prefill of a prompt in a proposal step, no token's KV computed twice (its own draft:
    nothing rejected). The second round of the same prompts (the target's prefix cache has them) takes the finished
    requests' draft KV: only each prompt's last token is prefilled, and every proposal is still accepted."""
    g = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    target.core.set_speculative(_spec(models["target"]))
    try:
        draft, counts = target.core.spec.proposer, target.core.spec.counts
        for prefilled in (sum(len(p) for p in PROMPTS), len(PROMPTS)):
            computed, prefill = draft.tokens_computed, draft.prefill_tokens
            outs = [o.outputs[0].token_ids for o in target.generate(PROMPTS, g)]
            computed, prefill = draft.tokens_computed - computed, draft.prefill_tokens - prefill
            assert prefill == prefilled
            assert prefilled < computed <= sum(len(p) + len(o) for p, o in zip(PROMPTS, outs))
            assert counts.accepted == counts.proposed > 0
        assert not draft.seqs and len(draft.retained) == len(PROMPTS)  # finished: their KV kept, the rest free
        assert len(draft.free_blocks) + sum(len(s.block_ids) for s in draft.retained.values()) == draft.runner.num_blocks
    finally:
        target.core.set_speculative(None)


def test_a_draft_with_another_vocabulary_is_refused(models, target):
    with pytest.raises(ModelLoadError, match="same tokenizer"):
        target.core.set_speculative(_spec(models["other_vocab"]))
    assert target.core.spec is None
