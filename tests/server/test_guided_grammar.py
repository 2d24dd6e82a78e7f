"""``guided_grammar`` (an EBNF / GBNF grammar, compiled by xgrammar) and vLLM's ``structured_outputs`` object (json,
regex, choice, grammar, json_object) on chat and completions (issue 47: they were 400 "Unknown parameter"), through
the official openai client's extra_body on the shared server; a bad grammar is a 400 naming the problem."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL

# a GBNF-style grammar: a greeting, then one to three lower-case words
GRAMMAR = 'root ::= ("hello" | "goodbye") " " word (" " word){0,2}\nword ::= [a-z]{1,8}'
PATTERN = re.compile(r"(hello|goodbye) [a-z]{1,8}( [a-z]{1,8}){0,2}")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def _chat(api, extra: dict, **kw):
    return api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say something."}],
                                       max_tokens=40, temperature=1.0, seed=3, extra_body=extra, **kw)


def test_guided_grammar_on_chat_and_completions(api):
    r = _chat(api, {"guided_grammar": GRAMMAR})
    assert PATTERN.fullmatch(r.choices[0].message.content), r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    c = api.completions.create(model=MODEL, prompt="Greeting:", max_tokens=40, temperature=1.0, seed=4, n=3,
                               extra_body={"guided_grammar": GRAMMAR})
    for choice in c.choices:
        assert PATTERN.fullmatch(choice.text), choice.text


@pytest.mark.parametrize("so, check", [
    ({"grammar": GRAMMAR}, lambda t: PATTERN.fullmatch(t)),
    ({"regex": "[0-9]{3}-[0-9]{4}"}, lambda t: re.fullmatch("[0-9]{3}-[0-9]{4}", t)),
    ({"choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
    ({"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ({"json": json.dumps(SCHEMA), "disable_any_whitespace": True},
     lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ({"json_object": True}, lambda t: isinstance(json.loads(t), dict)),
])
def test_structured_outputs(api, so, check):
    r = _chat(api, {"structured_outputs": so}, max_completion_tokens=80)
    text = r.choices[0].message.content
    assert check(text), text
    c = api.completions.create(model=MODEL, prompt="Answer:", max_tokens=80, temperature=1.0, seed=5,
                               extra_body={"structured_outputs": so})
    assert check(c.choices[0].text), c.choices[0].text


@pytest.mark.parametrize("extra, param, words", [
    ({"guided_grammar": "root ::= foo"}, "guided_grammar", 'Rule "foo" is not defined'),
    ({"guided_grammar": 'start ::= "a"'}, "guided_grammar", 'root rule'),
    ({"guided_grammar": 'root ::= "a" |'}, "guided_grammar", "line 1"),
    ({"guided_grammar": ""}, "guided_grammar", "non-empty"),
    ({"structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs.grammar", "not defined"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "Only one"),
    ({"structured_outputs": {"lark": "x"}}, "structured_outputs.lark", "Unknown parameter"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty"),
    ({"structured_outputs": "json"}, "structured_outputs", "an object"),
    ({"guided_grammar": GRAMMAR, "guided_regex": "a"}, "response_format", "Only one"),
])
def test_bad_grammar_is_a_400_naming_it(api, extra, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(api, extra)
    err = e.value.body
    assert err["param"] == param and words in err["message"], err


def test_grammar_with_required_tools_is_refused(api):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        _chat(api, {"guided_grammar": GRAMMAR}, tools=tools, tool_choice="required")
