"""Tool calling (issue 19) with the official openai client against the real server on SmolLM2, whose chat
template takes no tools: tool_choice "required" and a named function are enforced by the grammar (the arguments
validate against the function's schema, streaming and not), "auto" goes through the built-in tool prompt
(tests/server/test_tools_auto.py), "none" is plain chat, tool
results go back through the template, and bad tool definitions are OpenAI-style 400s naming the field.
(Parsing each family's format and rendering tools through real templates: tests/unit/test_tool_parsers.py.)"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 30},
    "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["query", "limit"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
TOOLS = [{"type": "function", "function": {"name": name, "description": desc, "parameters": SCHEMAS[name]}}
         for name, desc in (("get_weather", "The current weather in a city"), ("search", "Search the web"))]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _check_call(call) -> None:
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) > len("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _streamed(chunks) -> tuple[list[dict], str, list[str]]:
    """(calls, content, finish reasons) from chat chunks, checking the OpenAI delta protocol on the way: a call's
    first delta has its index, id, type and name; later deltas only add argument text."""
    calls: list[dict] = []
    content, finish = "", []
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index == len(calls):
                assert tc.id and tc.id.startswith("call_") and tc.type == "function" and tc.function.name
                calls.append({"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""})
            else:
                assert tc.index == len(calls) - 1 and tc.id is None and not tc.function.name
                calls[-1]["arguments"] += tc.function.arguments or ""
        if c.choices[0].finish_reason:
            finish.append(c.choices[0].finish_reason)
    return calls, content, finish


def test_named_function_is_enforced(api):
    r = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=100,
                                    temperature=1.0, seed=5, n=2)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None
        assert len(c.message.tool_calls) == 1 and c.message.tool_calls[0].function.name == "get_weather"
        _check_call(c.message.tool_calls[0])
    assert r.choices[0].message.tool_calls[0].id != r.choices[1].message.tool_calls[0].id


def test_named_function_streams_its_arguments(api):
    full = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=100,
                                       temperature=0)
    chunks = list(api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED,
                                              max_tokens=100, temperature=0, stream=True))
    calls, content, finish = _streamed(chunks)
    assert content == "" and finish == ["tool_calls"]
    expected = full.choices[0].message.tool_calls[0].function
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", expected.arguments)]
    arg_deltas = sum(1 for c in chunks if c.choices and c.choices[0].delta.tool_calls
                     and c.choices[0].delta.tool_calls[0].id is None)
    assert arg_deltas > 1  # the arguments arrive as the model writes them, not in one piece


def test_required_choice(api):
    r = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=150,
                                    temperature=0, parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    _check_call(c.message.tool_calls[0])
    r = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80,
                                    temperature=1.0, seed=11, n=2)
    for c in r.choices:
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        for call in c.message.tool_calls:
            _check_call(call)
    assert any(c.finish_reason == "tool_calls" for c in r.choices)


def test_required_choice_streaming_equals_non_streaming(api):
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=150, temperature=0)
    full = api.chat.completions.create(**kw).choices[0]
    calls, content, finish = _streamed(api.chat.completions.create(**kw, stream=True))
    assert finish == [full.finish_reason] == ["tool_calls"] and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [(t.function.name, t.function.arguments)
                                                            for t in full.message.tool_calls]
    for t in full.message.tool_calls:
        _check_call(t)


def test_tool_results_go_back_through_the_template(api, http):
    call = {"id": "call_abc123", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_abc123", "content": "18 degrees, sunny"}]
    r = api.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=20,
                                    temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    # SmolLM2's template knows no tool calls: the call reaches the model as the assistant's text
    ids = http.post("/tokenize", json={"model": MODEL, "messages": history}).json()["tokens"]
    text = http.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    assert '"get_weather"' in text and "tool\n18 degrees, sunny" in text


def test_auto_without_template_support_uses_the_builtin_prompt_and_none_is_plain_chat(api):
    # issue 47: "auto" on a template that takes no tools was a 400; it is the built-in tool prompt now (its own
    # tests: tests/server/test_tools_auto.py)
    auto = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=5)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
    for call in auto.choices[0].message.tool_calls or []:
        _check_call(call)
    plain = api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0)
    none = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=12,
                                       temperature=0)
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].finish_reason == plain.choices[0].finish_reason


def _fn(**kw) -> list[dict]:
    return [{"type": "function", "function": kw}]


@pytest.mark.parametrize("body, param, words", [
    ({"tools": _fn(parameters=WEATHER)}, "tools[0].function.name", "missing"),
    ({"tools": _fn(name="bad name!", parameters=WEATHER)}, "tools[0].function.name", "letters"),
    ({"tools": _fn(name="f", parameters={"type": "foo"})}, "tools[0].function.parameters", "foo"),
    ({"tools": _fn(name="f", parameters={"type": "object", "properties": {"a": 3}})},
     "tools[0].function.parameters.properties.a", "object"),
    ({"tools": _fn(name="f", parameters={"type": "array"})}, "tools[0].function.parameters", "object"),
    ({"tools": _fn(name="f", parameters={"type": "object", "required": "a"})}, "tools[0].function.parameters",
     "required"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "missing"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type", "retrieval"),
    ({"tools": {"name": "f"}}, "tools", "list"),
    ({"tools": _fn(name="f") + _fn(name="f")}, "tools[1].function.name", "twice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "always"),
    ({"tools": TOOLS, "tool_choice": ["auto"]}, "tool_choice", "required"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name", "missing"),
    ({"tool_choice": "required"}, "tool_choice", "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "response_format"),
    ({"tools": _fn(name="f", parameters={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}),
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools[0].function.parameters", "nope"),
])
def test_bad_tools_are_400(api, body, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, extra_body=body)
    assert e.value.body["param"] == param, e.value.body
    assert words.lower() in e.value.body["message"].lower(), e.value.body


def test_bad_tool_messages_and_completions_are_400(api):
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, max_tokens=5, messages=ASK + [
            {"role": "assistant", "tool_calls": [{"id": "x", "type": "function",
                                                  "function": {"arguments": "{}"}}]}])
    assert e.value.body["param"] == "messages[1].tool_calls[0]"
    with pytest.raises(openai.BadRequestError) as e:
        api.completions.create(model=MODEL, prompt="x", max_tokens=5, extra_body={"tools": TOOLS})
    assert e.value.body["param"] == "tools"


# -- tool_choice "auto" end to end: a tiny Qwen2 model whose template takes tools --------------------------------
# Its random weights write no calls of their own, so a regex (guided_regex) makes it write what a Qwen model
# writes: the tools still go through its template and the output through the hermes parser, as in real use.

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
SECOND = '<tool_call>\n{"name": "search", "arguments": {"query": "rain", "limit": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen_api(tiny_model_dir):
    from openai import OpenAI

    from tests.server.conftest import make_server

    srv = make_server(engine={"model": str(tiny_model_dir("qwen2")), "kv_cache_memory_gib": 0.05})
    yield OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    srv.stop()


def _forced(output: str) -> dict:
    import re

    return {"guided_regex": re.escape(output).replace("\\\n", "\\n")}


def test_auto_parses_the_models_calls(qwen_api):
    kw = dict(model=MODEL, messages=ASK, max_tokens=150, temperature=0)
    plain = qwen_api.chat.completions.create(**kw, extra_body=_forced("Checking."))
    two = "Checking.\n" + CALL + "\n" + SECOND
    r = qwen_api.chat.completions.create(**kw, tools=TOOLS, extra_body=_forced(two))
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tools went through the template
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Checking."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}), ("search", {"query": "rain", "limit": 2})]
    for t in c.message.tool_calls:
        _check_call(t)
    calls, content, finish = _streamed(qwen_api.chat.completions.create(
        **kw, tools=TOOLS, stream=True, extra_body=_forced(two)))
    assert content == "Checking." and finish == ["tool_calls"]
    assert [(x["name"], x["arguments"]) for x in calls] == [(t.function.name, t.function.arguments)
                                                           for t in c.message.tool_calls]
    one = qwen_api.chat.completions.create(**kw, tools=TOOLS, parallel_tool_calls=False,
                                           extra_body=_forced(CALL + "\n" + SECOND))
    assert [t.function.name for t in one.choices[0].message.tool_calls] == ["get_weather"]
    assert plain.choices[0].message.content == "Checking." and plain.choices[0].message.tool_calls is None


def test_auto_without_a_call_and_with_a_broken_one_is_content(qwen_api):
    kw = dict(model=MODEL, messages=ASK, max_tokens=150, temperature=0, tools=TOOLS)
    broken = CALL.replace('"city": "Paris"', "city: Paris")
    for output in ("It is sunny <b>today</b>.", broken):
        r = qwen_api.chat.completions.create(**kw, extra_body=_forced(output))
        assert r.choices[0].message.content == output and r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason == "stop"
        calls, content, finish = _streamed(qwen_api.chat.completions.create(**kw, stream=True,
                                                                            extra_body=_forced(output)))
        assert content == output and calls == [] and finish == ["stop"]
