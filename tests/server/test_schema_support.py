"""JSON Schema keywords the output grammar passes over are refused (400 naming them), never served silently
(issue 47 D2: a strict schema with allOf got 200 and 0 of 8 valid outputs; a pattern's lookahead was dropped with a
log line); allOf that folds exactly into its parent (pydantic's described nested model) is folded and enforced."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import xgrammar as xgr
from xgrammar import testing as xgr_testing

from engine.tokenizer.schema_support import UNENFORCED, merge_all_of, unenforced
from tests.server.conftest import MODEL

# keyword -> (a schema using it, a document that breaks only that keyword)
BREAKS = {
    "allOf": ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, 1),
    "not": ({"type": "integer", "not": {"const": 3}}, 3),
    "if": ({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}, 7),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}, [2]),
    "dependentRequired": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}, {"a": 1}),
    "dependentSchemas": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1}),
    "lookaround": ({"type": "string", "pattern": "^(?=b)[ab]+$"}, "ab"),
}


def grammar_accepts(schema, doc) -> bool:
    g = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    return xgr_testing._is_grammar_accept_string(g, json.dumps(doc))


@pytest.mark.parametrize("keyword", sorted(BREAKS))
def test_each_refused_keyword_is_really_not_enforced_by_the_grammar(keyword):
    schema, doc = BREAKS[keyword]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)  # the document does break the schema
    assert grammar_accepts(schema, doc), f"xgrammar now enforces {keyword}: drop it from UNENFORCED"
    assert unenforced(schema), keyword


def test_every_listed_keyword_has_its_measurement():
    assert set(UNENFORCED) - {"then", "else"} <= set(BREAKS)


def test_enforced_keywords_pass_and_nested_ones_are_found():
    ok = {"type": "object", "properties": {"a": {"anyOf": [{"type": "integer", "minimum": 2}, {"type": "null"}]},
                                           "b": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
          "required": ["a"], "additionalProperties": False}
    assert unenforced(ok) == []
    nested = {"type": "object", "properties": {"not": {"type": "integer"},  # a property named "not" is no keyword
                                               "x": {"type": "array", "items": {"uniqueItems": True}}},
              "$defs": {"d": {"not": {"const": 1}}}}
    found = unenforced(nested)
    assert len(found) == 2, found
    assert "#/properties/x/items" in found[0] and "#/$defs/d" in found[1]


def test_all_of_folds_where_exact():
    pydantic_style = {"type": "object", "properties": {"pet": {"allOf": [{"$ref": "#/$defs/Pet"}],
                                                               "description": "the pet"}},
                      "$defs": {"Pet": {"type": "object", "properties": {"name": {"type": "string"}},
                                        "required": ["name"]}}}
    folded = merge_all_of(pydantic_style)
    assert folded["properties"]["pet"] == {"$ref": "#/$defs/Pet", "description": "the pet"}
    assert unenforced(folded) == []
    two = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                     {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    assert merge_all_of(two) == {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                                 "required": ["a", "b"]}
    clash = {"allOf": [{"type": "integer"}, {"type": "string"}]}
    assert merge_all_of(clash) == clash and unenforced(clash)


def test_the_server_refuses_an_unenforceable_schema_and_enforces_a_folded_one(api):
    messages = [{"role": "user", "content": "Describe a pet as JSON."}]
    clash = {"type": "object", "properties": {"n": {"allOf": [{"type": "integer"}, {"minimum": 3}]}},
             "required": ["n"]}
    # allOf [{integer}, {minimum}] folds (no clash) and is enforced; "not" cannot be
    refused = {"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 3}}}, "required": ["n"]}
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": refused, "strict": True}})
    assert e.value.body["param"] == "response_format" and "'not' at #/properties/n" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=messages, max_tokens=20,
                                    extra_body={"guided_json": BREAKS["lookaround"][0]})
    assert "lookaround" in e.value.body["message"]
    r = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=1.0, seed=2, n=4,
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"name": "n", "schema": clash, "strict": True}})
    for c in r.choices:
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.message.content), clash)
