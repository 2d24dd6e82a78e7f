"""Speculative decoding's host parts: --speculative-config parsing, n-gram prompt lookup, the grammar cut of a
proposal and the back-off (no engine: engine/spec, engine/tokenizer/grammar)."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from engine.spec.config import parse_speculative_config
from engine.spec.decoder import SpeculativeDecoder, grammar_prefix
from engine.spec.ngram import NgramProposer, ngram_proposal


def test_config_parses_vllms_names():
    c = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, '
                                 '"prompt_lookup_min": 1}')
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == ("ngram", 5, 3, 1)
    d = parse_speculative_config({"model": "/some/draft", "num_speculative_tokens": 3})
    assert (d.method, d.model, d.num_speculative_tokens) == ("draft_model", "/some/draft", 3)
    assert parse_speculative_config(None) is None and parse_speculative_config("{}") is None


@pytest.mark.parametrize("bad, says", [
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 2}', "<="),
    ('{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}', "unknown"),
    ("not json", "JSON"),
])
def test_config_refuses_with_a_reason(bad, says):
    with pytest.raises(InvalidRequestError, match=says):
        parse_speculative_config(bad)


def test_ngram_takes_what_followed_the_latest_longest_match():
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert ngram_proposal(seq, 2, 3, 1) == [7, 8]  # the latest earlier "1 2 3" is followed by 7 8
    assert ngram_proposal(seq, 10, 3, 1) == [7, 8, 5, 1, 2, 3]  # up to the sequence's end
    assert ngram_proposal([5, 6, 7, 8], 3, 3, 1) == []  # no earlier occurrence of any suffix
    assert ngram_proposal([4, 1, 5, 1], 2, 2, 1) == [5, 1]  # only the 1-gram matches
    assert ngram_proposal([4, 1, 5, 1], 2, 2, 2) == []  # ... which prompt_lookup_min 2 refuses


def test_ngram_never_matches_across_token_boundaries():
    # as int32 bytes, 256 = 00 01 00 00 and 1 = 01 00 00 00: "1, 0" would match inside "256" misaligned
    seq = [256, 0, 0, 0, 5, 1, 0]
    assert ngram_proposal(seq, 2, 2, 2) == []
    assert NgramProposer(2, 1).propose([_Req([3, 4, 3])], [2]) == [[4, 3]]


class _Req:
    def __init__(self, ids, out=(), grammar=None, max_tokens=None):
        from engine.sampling_params import SamplingParams

        self.request_id, self.prompt_token_ids, self.output_token_ids = "r", list(ids), list(out)
        self.params, self.grammar, self.pooling = SamplingParams(max_tokens=max_tokens), grammar, None
        self.num_computed_tokens = len(ids) + len(out) - 1
        self.spec_token_ids = []

    @property
    def all_token_ids(self):
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


class _FixedProposer:
    def __init__(self, d):
        self.d = d

    def propose(self, reqs, limits):
        return [self.d[:k] for k in limits]

    def remove(self, rid):
        pass


def test_proposals_are_cut_to_max_tokens_and_backed_off_after_misses():
    cfg = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4}')
    dec = SpeculativeDecoder(cfg, _FixedProposer([1, 2, 3, 4]))
    r = _Req([7, 8, 9], out=[5], max_tokens=3)  # 1 generated, 2 left: at most 1 proposal (one more is sampled)
    dec.propose([r], 100)
    assert r.spec_token_ids == [1]
    r = _Req([7, 8, 9])
    dec.propose([r], 100)
    assert r.spec_token_ids == [1, 2, 3, 4]
    dec.settle("r", 4, 1)  # nothing accepted: one step without proposals
    dec.propose([r], 100)
    assert r.spec_token_ids == []
    dec.propose([r], 100)
    assert r.spec_token_ids == [1, 2, 3, 4]
    dec.settle("r", 4, 1)
    for _ in range(2):  # two misses in a row: two steps without
        dec.propose([r], 100)
        assert r.spec_token_ids == []
    dec.propose([r], 100)
    dec.settle("r", 4, 3)  # accepted 2: reset
    dec.propose([r], 100)
    assert r.spec_token_ids == [1, 2, 3, 4]
    c = dec.counts
    assert (c.proposed, c.accepted, c.verify_steps, c.emitted) == (12, 2, 3, 5)
    assert c.acceptance_rate == pytest.approx(2 / 12) and c.tokens_per_step == pytest.approx(5 / 3)


class _ThreeTokens:
    """<eos>, a, b: enough for the regex a+b."""

    pieces = ("<eos>", "a", "b")
    all_special_ids = frozenset({0})

    def __len__(self):
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)


def test_a_proposal_is_cut_at_the_first_token_its_grammar_refuses():
    pytest.importorskip("xgrammar")
    from engine.sampling_params import StructuredOutput
    from engine.tokenizer.grammar import GrammarCache

    g = GrammarCache(_ThreeTokens(), 3, [0]).matcher(StructuredOutput("regex", "a+b"))
    assert grammar_prefix(g, [1, 1, 2, 1]) == [1, 1, 2]  # after "aab" only the stop token is allowed
    assert grammar_prefix(g, [1, 2, 0]) == [1, 2]  # the stop token ends the grammar: nothing verifiable after it
    assert grammar_prefix(g, [2, 1]) == []  # "b" cannot come first
    # the matcher is where it was: "b" is still refused, "ab" and the stop token accepted
    assert not g.accept_token(2)
    assert g.accept_token(1) and g.accept_token(2) and g.accept_token(0) and g.is_terminated()
