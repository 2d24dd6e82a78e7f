"""Structured output (issue 19) with the official openai client against the real server on SmolLM2:
response_format json_object / json_schema on chat and completions, vLLM's guided_regex / guided_choice,
streaming and not, bad schemas as OpenAI-style 400s, constrained and free requests in one batch."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False},
    "array": {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 4}},
        "required": ["colors"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "angry"]},
                                              "level": {"type": "string", "enum": ["low", "high"]}},
             "required": ["mood", "level"], "additionalProperties": False},
    "bounds": {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9}},
        "required": ["age", "score", "count"], "additionalProperties": False},
    "required": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 1000},
                                                  "ok": {"type": "boolean"}, "note": {"type": "string",
                                                                                     "maxLength": 20}},
                 "required": ["id", "ok"], "additionalProperties": False},
    "anyof": {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": 100}, {"type": "string", "maxLength": 10},
        {"type": "null"}]}}, "required": ["value"], "additionalProperties": False},
}
PROMPT = [{"role": "user", "content": "Describe a person in JSON."}]


def _rf(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def _check(text: str, finish: str, schema=None) -> None:
    if finish == "length":
        return
    assert finish == "stop", finish
    doc = json.loads(text)
    if schema is None:
        assert isinstance(doc, dict)
    else:
        jsonschema.validate(doc, schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_chat(api, name):
    for temperature in (0, 1.0):
        r = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=200, temperature=temperature,
                                        seed=7, response_format=_rf(name))
        _check(r.choices[0].message.content, r.choices[0].finish_reason, SCHEMAS[name])
        assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("name", ["nested", "anyof"])
def test_json_schema_streaming_equals_non_streaming(api, name):
    full = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=200, temperature=0,
                                       response_format=_rf(name))
    chunks = list(api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=200, temperature=0,
                                              response_format=_rf(name), stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == full.choices[0].message.content
    assert finish == [full.choices[0].finish_reason]
    _check(text, finish[0], SCHEMAS[name])


def test_json_object_chat_and_completions(api):
    r = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=200, temperature=0.7, seed=3, n=3,
                                    response_format={"type": "json_object"})
    for c in r.choices:
        _check(c.message.content, c.finish_reason)
    c = api.completions.create(model=MODEL, prompt="A JSON object describing a cat:", max_tokens=200,
                               temperature=0, extra_body={"response_format": {"type": "json_object"}})
    _check(c.choices[0].text, c.choices[0].finish_reason)
    s = api.completions.create(model=MODEL, prompt="A JSON object describing a cat:", max_tokens=200,
                               temperature=0, stream=True,
                               extra_body={"response_format": _rf("enum")})
    parts = [(x.choices[0].text, x.choices[0].finish_reason) for x in s if x.choices]
    _check("".join(t for t, _ in parts), next(f for _, f in parts if f), SCHEMAS["enum"])


def test_json_object_with_a_schema_is_the_schema(api):
    """llama.cpp's form, which instructor sends: {"type": "json_object", "schema": ...} (the schema was ignored)."""
    r = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=200, temperature=0.9, seed=5, n=4,
                                    response_format={"type": "json_object", "schema": SCHEMAS["enum"]})
    for c in r.choices:
        _check(c.message.content, c.finish_reason, SCHEMAS["enum"])
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5,
                                    response_format={"type": "json_object", "schema": "not a schema"})
    assert e.value.body["param"] == "response_format" and "'schema'" in e.value.body["message"]


def test_guided_regex_and_choice(api):
    r = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A phone number?"}],
                                    max_tokens=30, temperature=0.8, seed=1,
                                    extra_body={"guided_regex": r"[0-9]{3}-[0-9]{4}"})
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    r = api.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=10, temperature=1.0,
                               n=4, seed=2, extra_body={"guided_choice": ["yes", "no", "maybe not"]})
    assert all(c.text in ("yes", "no", "maybe not") and c.finish_reason == "stop" for c in r.choices)


def test_length_cut_reports_length(api):
    r = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5, temperature=0,
                                    response_format=_rf("nested"))
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format", "foo"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}, "response_format", "nope"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format", "schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ({"response_format": "json"}, "response_format", "type"),
    ({"guided_regex": "a(b"}, "guided_regex", "parenthesis"),
    ({"guided_choice": []}, "guided_choice", "list"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "response_format", "Only one"),
])
def test_bad_formats_are_400(api, body, param, words):
    for call in (lambda: api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5, extra_body=body),
                 lambda: api.completions.create(model=MODEL, prompt="x", max_tokens=5, extra_body=body)):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == param
        assert words.lower() in e.value.body["message"].lower()


def test_constrained_and_free_requests_in_one_batch(api):
    """Constrained rows follow their grammar, free rows are what they are alone (greedy: the same text)."""
    alone = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=40, temperature=0)
    names = sorted(SCHEMAS)

    def one(i: int):
        if i % 2:
            return "free", api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=40, temperature=0)
        name = names[(i // 2) % len(names)]
        return name, api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=200, temperature=0,
                                                 response_format=_rf(name))

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    for name, r in results:
        c = r.choices[0]
        if name == "free":
            assert c.message.content == alone.choices[0].message.content
        else:
            _check(c.message.content, c.finish_reason, SCHEMAS[name])
            assert c.finish_reason == "stop"
