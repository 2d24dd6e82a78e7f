"""Speculative decoding with n-gram prompt lookup on the embedded SmolLM2 (float32, the shared engine switched
with ``EngineCore.set_speculative``): greedy output identical to plain decoding, in mixed batches, with stop strings
and tokens, max_tokens, logprobs, penalties, grammars, seeds, aborts mid-step, the prefix cache (only accepted
tokens hashed) and preemption on a tiny KV cache; and the proposals actually verified (the counts)."""

from __future__ import annotations

import contextlib

import pytest

from engine import LLM, SamplingParams

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'

FRUIT = ("Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, "
         "honeydew, kiwi, lemon, mango.")
CODE = ("Copy this function, but rename total to result:\n\ndef add_all(values):\n    total = 0\n    for v in values:\n"
        "        total = total + v\n    return total\n")
CHAT = "What is the capital of France? Answer in one sentence."


@contextlib.contextmanager
def speculative(llm, config=NGRAM):
    llm.core.set_speculative(config)
    try:
        yield llm.core.spec
    finally:
        llm.core.set_speculative(None)


def chat_ids(llm, text):
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True)


def run(llm, items, abort_at=None):
    """items: (prompt ids, params, step to add it at) -> per request (tokens, text, finish, stop, logprobs)."""
    core = llm.core
    outs = {f"r{i}": [[], "", None, None, []] for i in range(len(items))}
    step = 0
    pending = list(enumerate(items))
    while pending or core.has_unfinished():
        for i, (ids, p, at) in list(pending):
            if at <= step:
                core.add_request(f"r{i}", None, p, prompt_token_ids=ids)
                pending.remove((i, (ids, p, at)))
        for d in core.step():
            o = outs[d.request_id]
            o[0] += d.token_ids
            o[1] += d.text
            o[4] += [(lp.token_id, round(lp.logprob, 3)) for lp in d.logprobs or []]
            if d.finished:
                o[2], o[3] = d.finish_reason, d.stop_reason
        step += 1
    assert core.blocks.num_free_blocks == core.blocks.num_blocks  # every block back
    return [tuple(tuple(x) if isinstance(x, list) else x for x in outs[f"r{i}"]) for i in range(len(items))]


def test_greedy_equals_plain_decoding_in_mixed_batches(smollm2_fp32):
    llm = smollm2_fp32
    g = SamplingParams(temperature=0, max_tokens=32)
    items = [(chat_ids(llm, FRUIT), g, 0), (chat_ids(llm, CODE), g, 0), (chat_ids(llm, CHAT), g, 3),
             (chat_ids(llm, CODE + "\nThen explain it."), g, 9)]  # prefills join verify steps
    plain = run(llm, items)
    with speculative(llm) as spec:
        got = run(llm, items)
        assert spec.counts.accepted > 15 and spec.counts.tokens_per_step > 1.5  # it did verify proposals
    assert got == plain


def test_interactions_equal_plain_decoding(smollm2_fp32):
    """One batch: a length cut mid-acceptance, stop strings (cut out, kept), logprobs, penalties."""
    llm = smollm2_fp32
    fruit = chat_ids(llm, FRUIT)
    items = [(fruit, SamplingParams(temperature=0, max_tokens=7), 0),
             (fruit, SamplingParams(temperature=0, max_tokens=30, stop=["cherry"]), 0),
             (fruit, SamplingParams(temperature=0, max_tokens=30, stop=["fig,"], include_stop_str_in_output=True), 1),
             (fruit, SamplingParams(temperature=0, max_tokens=24, logprobs=3), 2),
             (chat_ids(llm, CODE), SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3,
                                                  frequency_penalty=0.4), 0)]
    plain = run(llm, items)
    with speculative(llm) as spec:
        got = run(llm, items)
        assert spec.counts.accepted > 0
    assert got == plain
    assert plain[0][2] == "length" and plain[1][3] == "cherry" and plain[2][1].endswith("fig,")
    assert len(plain[3][4]) == len(plain[3][0])


def test_stop_token_cuts_the_accepted_run(smollm2_fp32):
    llm = smollm2_fp32
    ids = chat_ids(llm, FRUIT)
    probe = run(llm, [(ids, SamplingParams(temperature=0, max_tokens=16), 0)])[0][0]
    stop_tok = probe[12]  # somewhere in the repeated list, where proposals are accepted in runs
    p = SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_tok])
    plain = run(llm, [(ids, p, 0)])
    with speculative(llm):
        assert run(llm, [(ids, p, 0)]) == plain
    assert plain[0][3] == stop_tok and len(plain[0][0]) <= 13


def test_a_grammar_is_honoured(smollm2_fp32):
    pytest.importorskip("xgrammar")
    from engine.sampling_params import StructuredOutput

    llm = smollm2_fp32
    so = StructuredOutput("regex", "(apple, banana, cherry, ){2}(date|fig)")
    p = SamplingParams(temperature=0, max_tokens=40, structured=so)
    items = [(chat_ids(llm, FRUIT), p, 0)]
    plain = run(llm, items)
    with speculative(llm) as spec:
        got = run(llm, items)
        assert spec.counts.accepted > 0
    assert got == plain and got[0][1].startswith("apple, banana, cherry, apple")


def test_seeded_sampling_repeats(smollm2_fp32):
    llm = smollm2_fp32
    p = SamplingParams(temperature=0.3, top_p=0.9, max_tokens=20, seed=11)
    items = [(chat_ids(llm, FRUIT), p, 0), (chat_ids(llm, CODE), p, 0)]
    with speculative(llm) as spec:
        a = run(llm, items)
        b = run(llm, items)
        assert spec.counts.accepted > 0
    assert a == b


def test_abort_mid_step_frees_everything(smollm2_fp32):
    llm = smollm2_fp32
    core = llm.core
    with speculative(llm) as spec:
        core.add_request("a", None, SamplingParams(temperature=0, max_tokens=200),
                         prompt_token_ids=chat_ids(llm, FRUIT))
        while spec.counts.verify_steps < 3:
            core.step()
        assert core.requests["a"].request.spec_token_ids is not None
        core.abort("a")
        assert not core.has_unfinished() and core.step() == []
        assert core.blocks.num_free_blocks == core.blocks.num_blocks and not spec.backoff


def test_prefix_cache_only_ever_holds_accepted_tokens(smollm2_fp32):
    llm = smollm2_fp32
    blocks = llm.core.blocks
    blocks.reset_prefix_cache()
    items = [(chat_ids(llm, FRUIT), SamplingParams(temperature=0.9, max_tokens=32, seed=3), 0),
             (chat_ids(llm, CODE), SamplingParams(temperature=0, max_tokens=32), 0)]
    with speculative(llm) as spec:
        outs = run(llm, items)
        assert spec.counts.proposed > spec.counts.accepted > 0  # some proposals were rejected
        sequences = [list(ids) + list(o[0]) for (ids, _, _), o in zip(items, outs)]
        by_key = {b.key: b for b in blocks.blocks if b.key is not None}
        assert len(by_key) > 5
        for b in by_key.values():  # each cached block's chain of tokens is a prefix of a real sequence
            chain = []
            k = b.key
            while k != blocks.root_key:
                chain[:0] = by_key[k].tokens
                k = by_key[k].parent_key
            assert any(s[:len(chain)] == chain for s in sequences)
        # a request sharing the prefix reuses those blocks and decodes as without the cache
        again = run(llm, items[1:])
    assert again == outs[1:]


@pytest.fixture(scope="module")
def tiny_cache():
    llm = LLM(dtype="float32", quantization="none", num_kv_blocks=12, block_size=16, speculative_config=NGRAM)
    yield llm
    llm.close()


def test_preemption_on_a_tiny_kv_cache(tiny_cache, smollm2_fp32):
    g = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)  # each needs ~115 of its 192 tokens
    items = [(chat_ids(smollm2_fp32, t), g, 0) for t in (FRUIT, CODE, FRUIT + " Then say done.")]
    got = run(tiny_cache, items)
    assert tiny_cache.core.scheduler.num_preemptions > 0 and tiny_cache.core.spec.counts.accepted > 0
    assert got == run(smollm2_fp32, items)
