"""Issue 47: /v1/responses' conversions, no engine: Responses ``input`` items -> the chat messages the chat path
renders (instructions, input_text parts, a function_call joining the assistant turn it follows, function_call_output,
a reasoning item reaching a template that renders ``reasoning_content``), and a whole output -> Responses items.
The server round trip is tests/server/test_responses.py."""

from __future__ import annotations

import json

import pytest

from engine.errors import InvalidRequestError
from engine.server.openai import tools as T
from engine.server.openai.protocol import ChatMessage
from engine.server.openai.protocol_responses import ResponsesRequest
from engine.server.openai.serving_chat import convert_messages
from engine.server.openai.serving_responses import input_messages, output_items
from engine.tokenizer.chat_template import render_chat_template
from tests.support.chat_templates import QWEN3_TEMPLATE

ARGS = json.dumps({"city": "Paris"})
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _messages(**kw) -> list[dict]:
    return input_messages(ResponsesRequest(**kw))


def test_items_become_chat_messages():
    msgs = _messages(instructions="Be brief.", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}, {"type": "input_text", "text": "Paris"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": ARGS},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": ARGS},
        {"type": "function_call_output", "call_id": "call_a", "output": "20 degrees"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "21"}]},
        {"type": "function_call", "call_id": "call_c", "name": "get_weather", "arguments": ARGS}])

    def call(call_id: str) -> dict:
        return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}

    assert msgs == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?\nParis"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call("call_a"), call("call_b")]},
        {"role": "tool", "tool_call_id": "call_a", "content": "20 degrees"},
        {"role": "tool", "tool_call_id": "call_b", "content": "21"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_c")]}]
    assert _messages(input="Hi") == [{"role": "user", "content": "Hi"}]


def test_reasoning_items_reach_a_template_that_renders_them():
    msgs = _messages(input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should look it up."}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": ARGS},
        {"type": "function_call_output", "call_id": "call_a", "output": "20 degrees"}])
    assert msgs[1]["reasoning_content"] == "I should look it up."
    text = render_chat_template(QWEN3_TEMPLATE, convert_messages([ChatMessage.model_validate(m) for m in msgs]),
                                tools=[TOOL])
    assert "<think>\nI should look it up.\n</think>" in text and '"city": "Paris"' in text


@pytest.mark.parametrize("item, param", [
    ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
    ({"type": "web_search_call", "id": "ws_1"}, "input[0].type"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}, "input[0].content[0]"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
    ({"type": "function_call_output", "call_id": "c", "output": 5}, "input[0].output"),
    ({"role": "tool", "content": "x"}, "input[0].role"),
])
def test_bad_items_are_400s_naming_them(item, param):
    with pytest.raises(InvalidRequestError) as e:
        _messages(input=[item])
    assert e.value.param == param


def test_outputs_become_items():
    plan = T.plan_tools({"tools": [TOOL]}, None, "LlamaForCausalLM")  # a template without tools: built-in prompt
    assert plan.builtin and plan.fmt.name == "hermes"
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    items = output_items("Sure.\n" + call, "stop", plan)
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert items[0]["content"][0]["text"] == "Sure." and items[0]["status"] == "completed"
    assert items[1]["name"] == "get_weather" and json.loads(items[1]["arguments"]) == {"city": "Paris"}
    assert items[1]["call_id"].startswith("call_") and items[1]["id"].startswith("fc_")
    assert [i["type"] for i in output_items("\n" + call, "stop", plan)] == ["function_call"]  # no empty message
    cut = output_items("It is", "length", None)
    assert cut[0]["status"] == "incomplete" and cut[0]["content"][0]["text"] == "It is"
    assert output_items("", "stop", None)[0]["content"][0]["text"] == ""  # a message even when empty
