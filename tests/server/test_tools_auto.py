"""Issue 47: tool calling "auto" on every model, with the official openai client against the real server on the
default model (SmolLM2-135M, whose chat template takes no tools): the built-in tool prompt and its hermes parser,
the grammar that takes over once the model opens a call, a structured answer together with tools, the agent loop
(a call forced with "required", then "auto" turns with the tool result in the history), D1 (max_tokens cutting
between two "required" calls), D3 (/tokenize counts the tools), the deprecated ``functions`` / ``function_call``,
``chat_template_kwargs``, and ``--chat-template`` / ``--tool-call-parser`` (a second server).

A 135M model rarely calls a tool under "auto" on its own; the tests that need calls show it a few earlier turns
that called (the calls are rendered in the built-in format), which it then imitates: what is asserted holds
whatever the model writes (no 4xx / 5xx; every call returned validates)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL
from tests.server.test_tool_calling import ASK, SCHEMAS, TOOLS, _check_call, _streamed

ANSWER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "degrees": {"type": "integer", "minimum": -50, "maximum": 60}},
          "required": ["city", "degrees"], "additionalProperties": False}
# a unit the model never saw in the history below: only the grammar makes its calls use it
KELVIN = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "unit": {"type": "string", "enum": ["kelvin"]}},
          "required": ["city", "unit"], "additionalProperties": False}
KELVIN_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather",
                                                  "parameters": KELVIN}}]


def _call(i: int, city: str) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}


def _few_shot() -> list[dict]:
    """Three earlier turns that called get_weather, then the question."""
    hist: list[dict] = []
    for i, city in enumerate(["London", "Rome", "Berlin"]):
        hist += [{"role": "user", "content": f"What is the weather in {city}?"},
                 {"role": "assistant", "content": None, "tool_calls": [_call(i, city)]},
                 {"role": "tool", "tool_call_id": f"call_{i}", "content": "20 degrees"},
                 {"role": "assistant", "content": f"It is 20 degrees in {city}."}]
    return hist + ASK


def test_server_info_says_which_tool_mode_applies(http):
    tools = http.get("/v1/server_info").json()["tools"]
    assert tools == {"auto": "builtin_prompt", "parser": "hermes", "grammar": True, "chat_template": "model"}


def test_auto_on_a_template_without_tools_is_200(api):
    r = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=40, temperature=1.0,
                                    seed=1, n=4)
    plain = api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 100  # the built-in prompt carries the schemas
    for c in r.choices:
        assert c.finish_reason in ("stop", "length", "tool_calls")
        assert "<tool_call>" not in (c.message.content or "")
        for call in c.message.tool_calls or []:
            _check_call(call)
    calls, content, finish = _streamed(api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                                                   max_tokens=40, temperature=0, stream=True))
    assert finish and finish[0] in ("stop", "length", "tool_calls")


def test_auto_calls_validate_streaming_or_not(api):
    kw = dict(model=MODEL, messages=_few_shot(), tools=TOOLS, max_tokens=60, temperature=0)
    full = api.chat.completions.create(**kw).choices[0]
    assert full.finish_reason == "tool_calls" and full.message.content is None
    for call in full.message.tool_calls:
        _check_call(call)
    calls, content, finish = _streamed(api.chat.completions.create(**kw, stream=True))
    assert finish == ["tool_calls"] and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [(t.function.name, t.function.arguments)
                                                           for t in full.message.tool_calls]


def test_auto_grammar_takes_over_once_a_call_opens(api):
    # the history called with unit "celsius"; the only unit the schema allows is "kelvin": once the model opens
    # <tool_call> the grammar writes a valid call (without it, the model copies "celsius": invalid arguments)
    r = api.chat.completions.create(model=MODEL, messages=_few_shot(), tools=KELVIN_TOOLS, max_tokens=60,
                                    temperature=0.7, seed=2, n=6)
    called = [c for c in r.choices if c.message.tool_calls]
    assert called  # the model imitates the history
    for c in r.choices:
        assert c.finish_reason in ("stop", "length", "tool_calls")
        assert "<tool_call>" not in (c.message.content or "")  # an opened call is always a complete, valid call
        for call in c.message.tool_calls or []:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), KELVIN)


def test_agent_loop_required_then_auto_with_the_result(api):
    """Turn 1 forces a call (as frameworks do with tool_choice "required"), the tool's result goes back, then
    "auto" turns complete with 200 (plain answers or valid calls)."""
    first = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                        max_tokens=150, temperature=0, parallel_tool_calls=False).choices[0]
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    _check_call(call)
    history = ASK + [first.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    for turn in range(2):
        r = api.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=40, temperature=0)
        c = r.choices[0]
        assert c.finish_reason in ("stop", "length", "tool_calls")
        for tc in c.message.tool_calls or []:
            _check_call(tc)
        history = history + [c.message.model_dump(exclude_none=True)]
        for tc in c.message.tool_calls or []:
            history.append({"role": "tool", "tool_call_id": tc.id, "content": "18 degrees"})
        if not c.message.tool_calls:
            history.append({"role": "user", "content": "Thanks. And tomorrow?"})


def test_structured_answer_with_tools_is_a_call_or_the_schema(api):
    """response_format json_schema with tools under "auto": the output is tool calls or the schema's JSON (it was a
    grammar of the schema alone: no call possible)."""
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    as_json = [{"role": "user", "content": "It is 18 degrees in Paris. Give the answer as JSON."}]
    outs = []
    for messages in (ASK, as_json, _few_shot()):
        c = api.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, response_format=rf,
                                        max_tokens=80, temperature=0).choices[0]
        outs.append(c)
        if c.message.tool_calls:  # a 135M model may go on calling until max_tokens: each call still validates
            assert c.finish_reason in ("tool_calls", "length") and c.message.content is None
            for call in c.message.tool_calls:
                _check_call(call)
        else:
            assert c.finish_reason == "stop"
            jsonschema.validate(json.loads(c.message.content), ANSWER)
    # both branches are live: the request for JSON gets the schema's JSON, the history that called gets a call
    assert outs[1].message.tool_calls is None and outs[2].message.tool_calls


def test_d1_required_cut_between_two_calls_returns_the_complete_calls(api):
    """D1: max_tokens cutting "required"'s output between two calls returned the grammar's raw JSON as content;
    now the complete calls are tool_calls (finish_reason "length") and nothing is content."""
    ask = [{"role": "user", "content": "What is the weather in Paris and in Rome? Call get_weather once for each."}]
    kw = dict(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required", temperature=1.0, seed=3, n=16)
    api.chat.completions.create(**{**kw, "n": 1}, max_tokens=1)  # the prompt's prefix cached for both runs below
    probe = api.chat.completions.create(**kw, max_tokens=120, logprobs=True)
    cut_at = {}
    for i, c in enumerate(probe.choices):
        if len(c.message.tool_calls or []) >= 2:
            text = ""
            for k, t in enumerate(c.logprobs.content):
                text += t.token
                if text.count('"parameters"') == 2:  # inside the second call
                    cut_at[i] = k + 1
                    break
    assert cut_at, "no sample wrote two calls"
    cut = api.chat.completions.create(**kw, max_tokens=min(cut_at.values()))
    lengths = 0
    for i, c in enumerate(cut.choices):
        assert c.message.content is None or '"name"' not in c.message.content, c.message.content
        for call in c.message.tool_calls or []:
            _check_call(call)
        if c.finish_reason == "length" and c.message.tool_calls:
            lengths += 1
    assert lengths >= 1
    i = min(cut_at, key=cut_at.get)
    c = cut.choices[i]
    first = probe.choices[i].message.tool_calls[0]
    if c.finish_reason == "length":  # the same sample as the probe's (seeded, the same batch)
        assert [(t.function.name, t.function.arguments) for t in c.message.tool_calls] == [
            (first.function.name, first.function.arguments)]


def test_d1_streaming_cut_is_no_raw_json(api):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for max_tokens in (6, 12):  # cut inside the first call: no calls, and no raw JSON either
        kw = dict(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=max_tokens,
                  temperature=0)
        full = api.chat.completions.create(**kw).choices[0]
        assert full.finish_reason == "length" and full.message.content is None and not full.message.tool_calls
        calls, content, finish = _streamed(api.chat.completions.create(**kw, stream=True))
        assert calls == [] and content == "" and finish == ["length"]


def test_d3_tokenize_counts_the_tools(api, http):
    body = {"model": MODEL, "messages": ASK}
    without = http.post("/tokenize", json=body).json()["count"]
    counted = http.post("/tokenize", json={**body, "tools": TOOLS}).json()["count"]
    used = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=1).usage.prompt_tokens
    assert counted == used and counted > without + 100
    forced = http.post("/tokenize", json={**body, "tools": TOOLS, "tool_choice": "required"}).json()["count"]
    assert forced == api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                 max_tokens=1).usage.prompt_tokens
    r = http.post("/tokenize", json={**body, "tools": [{"type": "function"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function"


LEGACY = [{"name": "get_weather", "description": "The current weather in a city", "parameters": SCHEMAS["get_weather"]}]


def test_legacy_functions_map_onto_tools(api):
    r = api.chat.completions.create(model=MODEL, messages=ASK, functions=LEGACY, function_call={"name": "get_weather"},
                                    max_tokens=60, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "function_call" and c.message.tool_calls is None
    assert c.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(c.message.function_call.arguments), SCHEMAS["get_weather"])
    # streamed: function_call deltas, the name first, then the arguments
    name, args, finish = "", "", []
    for chunk in api.chat.completions.create(model=MODEL, messages=ASK, functions=LEGACY, max_tokens=60,
                                             function_call={"name": "get_weather"}, temperature=0, stream=True):
        d = chunk.choices[0].delta
        if d.function_call:
            name += d.function_call.name or ""
            args += d.function_call.arguments or ""
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
    assert name == "get_weather" and args == c.message.function_call.arguments and finish == ["function_call"]
    # the deprecated history (an assistant function_call, a "function" message) and function_call "auto"
    history = ASK + [{"role": "assistant", "content": None, "function_call": {"name": "get_weather",
                                                                              "arguments": c.message.function_call.arguments}},
                     {"role": "function", "name": "get_weather", "content": "18 degrees"}]
    for choice in ("auto", "none", None):
        extra = {} if choice is None else {"function_call": choice}
        r = api.chat.completions.create(model=MODEL, messages=history, functions=LEGACY, max_tokens=20,
                                        temperature=0, **extra)
        assert r.choices[0].finish_reason in ("stop", "length", "function_call")
        assert r.choices[0].message.tool_calls is None
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=ASK, functions=LEGACY, tools=TOOLS, max_tokens=5)
    assert e.value.body["param"] == "functions"
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=ASK, functions=LEGACY, max_tokens=5,
                                    function_call={"name": "nope"})
    assert e.value.body["param"] == "tool_choice"


def test_chat_template_kwargs_are_accepted(api, http):
    kw = {"enable_thinking": False}
    r = api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0,
                                    extra_body={"chat_template_kwargs": kw})
    plain = api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    # SmolLM2's template reads no such variable: the same prompt, the same answer
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens
    assert r.choices[0].message.content == plain.choices[0].message.content
    body = {"model": MODEL, "messages": ASK}
    assert http.post("/tokenize", json={**body, "chat_template_kwargs": kw}).json()["count"] == \
        http.post("/tokenize", json=body).json()["count"]
    for bad, param in (({"messages": []}, "chat_template_kwargs.messages"), (["x"], "chat_template_kwargs")):
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5,
                                        extra_body={"chat_template_kwargs": bad})
        assert e.value.body["param"] == param


# -- --chat-template FILE and --tool-call-parser: a template that takes tools (hermes) ---------------------------

TEMPLATE = """{%- if tools %}<|im_start|>system
TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>
{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% if greeting is defined %}{{ greeting }}{% endif %}{% endif %}"""


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    import httpx
    from openai import OpenAI

    from engine.server.openai.serving_chat import read_chat_template
    from tests.server.conftest import make_server

    path = tmp_path_factory.mktemp("template") / "tools.jinja"
    path.write_text(TEMPLATE)
    srv = make_server(chat_template=read_chat_template(str(path)), tool_call_parser="hermes")
    with httpx.Client(base_url=srv.url, timeout=600) as h:
        yield OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=600), h
    srv.stop()


def test_chat_template_flag_and_parser(templated):
    api, http = templated
    assert http.get("/v1/server_info").json()["tools"] == {
        "auto": "chat_template", "parser": "hermes", "grammar": True, "chat_template": "--chat-template"}
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "chat_template_kwargs": {"greeting": "Hello"}}
    ids = http.post("/tokenize", json=body).json()["tokens"]
    text = http.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    assert "TOOLS:get_weather;search;" in text and text.endswith("assistant\nHello")
    r = api.chat.completions.create(model=MODEL, messages=_few_shot(), tools=TOOLS, max_tokens=60, temperature=0)
    assert r.usage.prompt_tokens == len(http.post("/tokenize", json={
        "model": MODEL, "messages": _few_shot(), "tools": TOOLS}).json()["tokens"])
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    for call in c.message.tool_calls or []:
        _check_call(call)


def test_d1_parser_keeps_the_complete_calls_of_a_cut_grammar_output():
    from engine.tokenizer.tool_parsers import FORMATS, ToolCallStream, parse_tool_calls

    cut = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}, {"name'
    content, calls = parse_tool_calls(cut, FORMATS["json_array"])  # not enforced: the text as the model wrote it
    assert content == cut and calls == []
    content, calls = parse_tool_calls(cut, FORMATS["json_array"], drop_incomplete=True)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})]
    hermes = 'Let me check.\n<tool_call>\n{"name": "search", "arguments": {"query": "x", "limit": 2}}\n</tool_call>\n' \
             '<tool_call>\n{"name": "get_weather", "argu'
    stream = ToolCallStream(FORMATS["hermes"], drop_incomplete=True)
    events = [e for ch in hermes for e in stream.feed(ch)] + stream.finish()
    assert "".join(e for e in events if isinstance(e, str)) == "Let me check."
    assert [e.name for e in events if not isinstance(e, str)] == ["search"]


def test_auto_refuses_a_parameter_schema_its_grammar_cannot_enforce(api):
    # the same 400 as under "required" (issue 47's D2), never a call whose arguments may break the schema
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}, "required": ["a"]}}}]
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice=choice, max_tokens=5)
        assert e.value.body["param"] == "tools" and "not" in e.value.body["message"], e.value.body


def test_structural_tag_schemas_are_checked_like_json_schemas():
    from engine.errors import InvalidRequestError
    from engine.sampling_params import StructuredOutput
    from engine.server.openai.tools import ToolPlan, auto_grammar
    from engine.tokenizer.grammar import enforceable_tag
    from engine.tokenizer.tool_parsers import FORMATS

    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}}}]
    plan = ToolPlan("auto", bad, offered=False, parallel=True, fmt=FORMATS["hermes"], builtin=True)
    with pytest.raises(InvalidRequestError) as e:
        enforceable_tag(auto_grammar(plan, None))
    assert e.value.param == "tools" and "not" in str(e.value)
    plan.tools = TOOLS
    answer = StructuredOutput("json_schema", json.dumps({"allOf": [{"type": "object"}]}))
    spec = json.loads(enforceable_tag(auto_grammar(plan, answer)))  # allOf folded in the answer's branch
    assert "allOf" not in json.dumps(spec) and spec["format"]["type"] == "or"
