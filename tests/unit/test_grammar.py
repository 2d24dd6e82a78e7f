"""Structured output's plumbing: StructuredOutput across the IPC codecs, the grammar cache on a tiny vocabulary
(bad specs as InvalidRequestError naming the field), stop-token termination."""

from __future__ import annotations

import json

import pytest

from engine import wire
from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams, StructuredOutput

xgrammar = pytest.importorskip("xgrammar")


def test_structured_params_cross_the_process_boundary():
    so = StructuredOutput("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
    msg = wire.AddRequest(["c0"], [SamplingParams(max_tokens=50, structured=so), SamplingParams()],
                         prompt_token_ids=[1, 2])
    back = wire.engine_decoder().decode(wire.encoder().encode(msg))
    assert back.params[0].structured == so and back.params[1].structured is None


def test_unknown_kind_is_refused():
    with pytest.raises(InvalidRequestError):
        StructuredOutput("yaml", "")


class _TinyTokenizer:
    """Seven tokens: enough for a regex, a choice and a JSON object."""

    pieces = ("<eos>", "a", "b", "{", "}", '"', ":")
    all_special_ids = frozenset({0})

    def __len__(self):
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)


def _cache():
    from engine.tokenizer.grammar import GrammarCache

    return GrammarCache(_TinyTokenizer(), 7, [0])


def test_regex_and_choice_end_at_the_stop_token():
    from engine.tokenizer.grammar import fill_bitmask

    cache = _cache()
    so = StructuredOutput("regex", "a+b")
    assert cache.compile(so) is not None
    g = cache.matcher(so)
    allowed = fill_bitmask([g])[0, 0].item()
    assert allowed & 0b11 == 0b10  # 'a' allowed, EOS not yet
    for tok in (1, 1, 2):
        assert g.accept_token(tok) and not g.is_terminated()
    assert fill_bitmask([g])[0, 0].item() & 0b1111111 == 0b1  # only EOS now
    assert g.accept_token(0) and g.is_terminated()
    c = cache.matcher(StructuredOutput("choice", json.dumps(["ab", "b"])))
    assert c.accept_token(2) and c.accept_token(0) and c.is_terminated()


@pytest.mark.parametrize("so, param", [
    (StructuredOutput("json_schema", '{"type": "foo"}'), "response_format"),
    (StructuredOutput("regex", "a("), "guided_regex"),
])
def test_bad_specs_name_their_field(so, param):
    with pytest.raises(InvalidRequestError) as e:
        _cache().matcher(so)
    assert e.value.param == param and "/project/" not in str(e.value)
