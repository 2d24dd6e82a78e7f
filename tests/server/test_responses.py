"""Issue 47: POST /v1/responses (stateless) with the official openai client (``client.responses``) against the real
server on the default model. The Responses request goes the chat route's way, so the chat route is the reference:
the same conversation (instructions, text, items with a function call and its output) gives the same greedy
output and the same prompt token count. Then: tool_choice required / named give function_call items whose
arguments validate, text.format json_schema output validates, the streamed events come in the documented order
with consecutive sequence numbers and end with the same response as the unstreamed one, and what the server
cannot honour (store: true, previous_response_id, hosted tools, bad values) is a 400 naming the field."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL
from tests.server.test_tool_calling import SCHEMAS

TOOLS = [{"type": "function", "name": name, "description": desc, "parameters": SCHEMAS[name], "strict": True}
         for name, desc in (("get_weather", "The current weather in a city"), ("search", "Search the web"))]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
ASK = "What is the weather in Paris?"
ANSWER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "degrees": {"type": "integer", "minimum": -50, "maximum": 60}},
          "required": ["city", "degrees"], "additionalProperties": False}


def _check_calls(resp, names=("get_weather", "search")) -> list:
    calls = [o for o in resp.output if o.type == "function_call"]
    assert calls
    for c in calls:
        assert c.name in names and c.call_id.startswith("call_") and c.id.startswith("fc_")
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    return calls


def test_text_input_matches_chat(api):
    r = api.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=12,
                             temperature=0)
    chat = api.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}])
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    cut = chat.choices[0].finish_reason == "length"
    assert r.status == ("incomplete" if cut else "completed")
    assert (r.incomplete_details.reason == "max_output_tokens") if cut else r.incomplete_details is None


def test_items_with_a_function_call_round_trip_match_chat(api):
    """A user message (input_text parts), the model's function_call and its function_call_output: the prompt the
    chat route renders for the same conversation, the same greedy answer."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": json.dumps({"city": "Paris", "unit": "celsius"})},
             {"type": "function_call_output", "call_id": "call_1", "output": "22 degrees and sunny"}]
    r = api.responses.create(model=MODEL, input=items, tools=TOOLS, max_output_tokens=16, temperature=0)
    chat = api.chat.completions.create(model=MODEL, tools=CHAT_TOOLS, max_tokens=16, temperature=0, messages=[
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees and sunny"}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    msg = chat.choices[0].message
    assert r.output_text == (msg.content or "")
    assert len([o for o in r.output if o.type == "function_call"]) == len(msg.tool_calls or [])
    # the other input forms of the same turn: a message item typed as such, content as plain text
    items[0] = {"type": "message", "role": "user", "content": ASK}
    again = api.responses.create(model=MODEL, input=items, tools=TOOLS, max_output_tokens=16, temperature=0)
    assert again.output_text == r.output_text and again.usage.input_tokens == r.usage.input_tokens


def test_tool_choice_required_and_named_give_valid_arguments(api):
    r = api.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", temperature=1.0,
                             max_output_tokens=120, parallel_tool_calls=False)
    assert len(_check_calls(r)) == 1 and r.status == "completed"
    assert r.tool_choice == "required" and r.parallel_tool_calls is False
    named = api.responses.create(model=MODEL, input=ASK, tools=TOOLS, max_output_tokens=120, temperature=0,
                                 tool_choice={"type": "function", "name": "search"})
    assert [c.name for c in _check_calls(named)] == ["search"]
    assert not [o for o in named.output if o.type == "message"]


def test_text_format_json_schema_output_validates(api):
    fmt = {"type": "json_schema", "name": "weather", "schema": ANSWER, "strict": True}
    for seed in (1, 2):
        r = api.responses.create(model=MODEL, input="Weather in Oslo as JSON.", text={"format": fmt},
                                 max_output_tokens=60, temperature=1.0, extra_body={"seed": seed})
        assert r.status == "completed" and r.text.format.type == "json_schema"
        jsonschema.validate(json.loads(r.output_text), ANSWER)


def _events(stream) -> list:
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_stream_text_events_in_order_and_same_response(api):
    kw = dict(model=MODEL, input="Say hello.", max_output_tokens=12, temperature=0)
    full = api.responses.create(**kw)
    events = _events(api.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    last = "response.completed" if full.status == "completed" else "response.incomplete"
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done", "response.output_item.done", last]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert text == events[kinds.index("response.output_text.done")].text == full.output_text == done.output_text
    assert done.id == events[0].response.id and done.usage.input_tokens == full.usage.input_tokens
    assert events[2].item.id == events[-2].item.id == done.output[0].id


def test_stream_function_call_events(api):
    kw = dict(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_output_tokens=120, temperature=0)
    events = _events(api.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert "response.output_text.delta" not in kinds
    added, done = events[2].item, events[-2].item
    assert added.type == done.type == "function_call" and added.status == "in_progress" and added.arguments == ""
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == events[-3].arguments == done.arguments
    jsonschema.validate(json.loads(args), SCHEMAS[done.name])
    assert events[-1].response.output[0].call_id == done.call_id == added.call_id
    # the SDK's helper reads such a stream into its final response (it takes response.completed only)
    with api.responses.stream(**kw) as s:
        final = s.get_final_response()
    assert [(o.name, o.arguments) for o in final.output] == [(done.name, done.arguments)]


def test_stream_named_function_arguments_stream_as_written(api):
    events = _events(api.responses.create(model=MODEL, input=ASK, tools=TOOLS, max_output_tokens=120,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          temperature=0, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1  # streamed as generated, not at once
    jsonschema.validate(json.loads("".join(deltas)), SCHEMAS["get_weather"])


def _few_shot_items() -> list[dict]:
    """Three earlier turns that called get_weather, as Responses items, then the question (the model imitates)."""
    items: list[dict] = []
    for i, city in enumerate(["London", "Rome", "Berlin"]):
        items += [{"role": "user", "content": f"What is the weather in {city}?"},
                  {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
                   "arguments": json.dumps({"city": city, "unit": "celsius"})},
                  {"type": "function_call_output", "call_id": f"call_{i}", "output": "20 degrees"},
                  {"role": "assistant", "content": [{"type": "output_text", "text": f"It is 20 degrees in {city}."}]}]
    return items + [{"role": "user", "content": ASK}]


def test_auto_calls_stream_and_match_the_unstreamed_response(api):
    """tool_choice "auto" (the built-in tool prompt, the grammar once a call opens): the calls the model makes come
    back as function_call items, streamed as the same items."""
    kw = dict(model=MODEL, input=_few_shot_items(), tools=TOOLS, max_output_tokens=60, temperature=0)
    full = api.responses.create(**kw)
    _check_calls(full)
    events = _events(api.responses.create(**kw, stream=True))
    done = events[-1].response
    assert [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in done.output] == \
        [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in full.output]
    items_done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.id for i in items_done] == [o.id for o in done.output]
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == list(range(len(done.output)))


@pytest.mark.parametrize("kw, param", [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]}, "tools[0].parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 10**9}, "max_output_tokens"),
    ({"temperature": 3.0}, "temperature"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(api, kw, param):
    kw = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        api.responses.create(**kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


def test_wrong_types_are_422_and_unknown_model_404(api):
    with pytest.raises(openai.UnprocessableEntityError):
        api.responses.create(model=MODEL, input=5)
    with pytest.raises(openai.NotFoundError):
        api.responses.create(model="gpt-4o", input="hi")
