"""Tools and tool-call history through real chat templates of each family (Qwen 2.5, Llama 3.1, Mistral v0.3):
Kestrel's rendering equals transformers', the assistant's earlier call renders in the format the parser reads
back, tool results reach the prompt; and the server's plan for a request follows what the template can take."""

from __future__ import annotations

import json

import pytest

from engine.server.openai import tools as tools_mod
from engine.tokenizer import render_chat_template
from engine.tokenizer.tool_parsers import parse_tool_calls, tool_format_for
from tests.support import chat_templates as T

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]
ARGS = {"city": "Zürich", "unit": "celsius"}
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}

# template, the text that opens the assistant's call turn, the text that closes it
FAMILIES = {
    "qwen2.5": (T.QWEN25_TOOLS_TEMPLATE, "<|im_start|>assistant", "<|im_end|>"),
    "llama3.1": (T.LLAMA31_TOOLS_TEMPLATE, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistral": (T.MISTRAL_TOOLS_TEMPLATE, "[/INST]", "</s>"),
}


def _conversation(template: str) -> list[dict]:
    """A user turn, the assistant's call and the tool's result, as the chat handler passes them on."""
    calls = tools_mod.check_tool_calls([{"id": "call_0123456789abcdef01234567", "type": "function",
                                         "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}],
                                       "messages[1].tool_calls")
    messages = [{"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_0123456789abcdef01234567", "content": "18 degrees"}]
    return tools_mod.fit_history(messages, template)


def _transformers(template: str, messages: list[dict], tools) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template, add_generation_prompt=True,
                                        **SPECIAL)
    return rendered[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tools_render_as_transformers_renders_them(family):
    template = FAMILIES[family][0]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"}]
    if family == "mistral":
        messages = messages[1:]
    got = render_chat_template(template, messages, tools=TOOLS, **SPECIAL)
    assert got == _transformers(template, messages, TOOLS)
    assert "get_weather" in got and "The current weather in a city" in got and '"fahrenheit"' in got
    assert got != render_chat_template(template, messages, **SPECIAL)  # without tools: no functions offered


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tool_calls_and_results_go_back_through_the_template(family):
    template, opener, closer = FAMILIES[family]
    messages = _conversation(template)
    got = render_chat_template(template, messages, tools=TOOLS, **SPECIAL)
    assert got == _transformers(template, messages, TOOLS)
    assert "18 degrees" in got
    start = got.rindex(opener, 0, got.index("18 degrees")) + len(opener)
    turn = got[start:got.index(closer, start)]
    content, calls = parse_tool_calls(turn, tool_format_for(template))  # what the model learnt to write
    assert not content and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]


def test_mistral_gets_nine_character_call_ids():
    messages = _conversation(T.MISTRAL_TOOLS_TEMPLATE)
    call_id = messages[1]["tool_calls"][0]["id"]
    assert len(call_id) == 9 and call_id.isalnum() and messages[2]["tool_call_id"] == call_id


def test_a_template_without_tool_calls_sees_the_call_as_text():
    # written as the built-in tool prompt asks (issue 47), so the model sees the format it is asked to use
    messages = _conversation(T.LLAMA2_TEMPLATE)
    content, calls = parse_tool_calls(messages[1]["content"], tool_format_for("<tool_call>"))
    assert "tool_calls" not in messages[1] and messages[1]["content"].startswith("<tool_call>\n") and not content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]


@pytest.mark.parametrize("template, takes", [
    (T.QWEN25_TOOLS_TEMPLATE, True), (T.LLAMA31_TOOLS_TEMPLATE, True), (T.MISTRAL_TOOLS_TEMPLATE, True),
    (T.MISTRAL_TEMPLATE, False), (T.LLAMA2_TEMPLATE, False), (None, False),
])
def test_plan_follows_what_the_template_takes(template, takes):
    assert tools_mod.template_takes_tools(template) is takes
    if takes:
        plan = tools_mod.plan_tools({"tools": TOOLS}, template, None)
        assert plan.choice == "auto" and plan.offered and plan.fmt == tool_format_for(template)
        assert plan.structured is None and plan.max_calls is None
    else:  # issue 47: the built-in tool prompt (it was a 400) and its hermes parser
        plan = tools_mod.plan_tools({"tools": TOOLS}, template, None)
        assert plan.choice == "auto" and plan.builtin and not plan.offered and plan.fmt.name == "hermes"
        assert plan.structured is None and plan.max_calls is None
        prompt = tools_mod.with_builtin_tools([{"role": "user", "content": "hi"}], plan)
        assert prompt[0]["role"] == "system" and json.dumps(TOOLS[0]) in prompt[0]["content"]
        grammar = tools_mod.auto_grammar(plan, None)
        assert grammar.kind == "structural_tag" and json.loads(grammar.spec)["format"]["triggers"] == ["<tool_call>"]
    named = tools_mod.plan_tools({"tools": TOOLS, "tool_choice": {"type": "function", "function": {
        "name": "get_weather"}}}, template, None)
    assert named.offered is takes and json.loads(named.structured.spec) == TOOLS[0]["function"]["parameters"]
    required = tools_mod.plan_tools({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
                                    template, None)
    schema = json.loads(required.structured.spec)
    assert required.fmt.name == "json_array" and required.max_calls == 1 and schema["maxItems"] == 1
    assert schema["items"]["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert tools_mod.plan_tools({"tools": TOOLS, "tool_choice": "none"}, template, None).parses is False
