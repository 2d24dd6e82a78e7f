"""The Chat panel's bits of issue 19: the per-conversation output format (plain text / JSON object / JSON schema,
the schema editor saying what is wrong), sent as the engine's structured output and honoured by the real model,
and assistant messages with tool calls shown readably; the Server panel's examples (tool call, JSON schema,
embeddings)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from app.sampling import OutputFormat, schema_problem
from app.widgets.output_format import EXAMPLE_SCHEMA, OutputFormatEditor
from app.widgets.tool_calls import readable_tool_calls
from tests.app.helpers import REPLY_TIMEOUT_MS, set_sampling

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "population": {"type": "integer", "minimum": 0}},
          "required": ["city", "population"], "additionalProperties": False}


@pytest.mark.parametrize("text, words", [
    ("", "Write a JSON schema"),
    ('{"type": "object",\n "properties": {"a": }}', "line 2, column"),
    ("[1, 2]", "not an array"),
    ('{"type": "strng"}', '"strng": use one of'),
    ('{"properties": {"a": {"items": {"type": "lst"}}}}', "properties.a.items"),
    ('{"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": false}', '"b"'),
    ('{"enum": []}', "non-empty list"),
])
def test_schema_problems_say_what_and_where(text, words):
    why = schema_problem(text)
    assert why is not None and words in why, why


def test_formats_become_structured_output():
    assert OutputFormat().structured() is None and schema_problem(json.dumps(SCHEMA)) is None
    assert OutputFormat("json_object").structured().kind == "json"
    s = OutputFormat("json_schema", json.dumps(SCHEMA, indent=2)).structured()
    assert s.kind == "json_schema" and json.loads(s.spec) == SCHEMA
    with pytest.raises(ValueError, match="Not valid JSON"):
        OutputFormat("json_schema", "{").structured()
    assert OutputFormat.from_dict(OutputFormat("json_schema", "{}").to_dict()) == OutputFormat("json_schema", "{}")
    assert OutputFormat.from_dict({"kind": "yaml"}) == OutputFormat()  # unknown kinds fall back to plain text


def test_editor_validates_as_typed(qtbot):
    ed = OutputFormatEditor()
    qtbot.addWidget(ed)
    assert ed.schema.isHidden() and ed.value() == OutputFormat()
    with qtbot.waitSignal(ed.changed):
        ed.kind.setCurrentIndex(ed.kind.findData("json_schema"))
    assert not ed.schema.isHidden() and ed.schema.toPlainText() == EXAMPLE_SCHEMA  # a start to edit
    assert ed.problem() is None and ed.status.text() == "The schema is valid."
    ed.schema.setPlainText('{"type": "object", "properties": {"a": {"type": "strng"}}}')
    assert "properties.a" in ed.status.text() and ed.status.objectName() == "messageError"
    with qtbot.assertNotEmitted(ed.changed):
        ed.set_value(OutputFormat("json_object"))
    assert ed.value().kind == "json_object" and ed.schema.isHidden()


def test_tool_calls_shown_readably():
    hermes = 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    shown = readable_tool_calls(hermes)
    assert shown.startswith("Let me check.") and "<tool_call>" not in shown
    assert '**Tool call:** `get_weather`' in shown and '"city": "Paris"' in shown
    mistral = readable_tool_calls('[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]')
    assert "`a`" in mistral and "`b`" in mistral and "[TOOL_CALLS]" not in mistral
    assert "`add`" in readable_tool_calls('{"name": "add", "parameters": {"x": 1, "y": 2}}')  # Llama 3, bare
    for plain in ("Just text.", '{"name": "Bob", "age": 3}', "<tool_call>{broken"):
        assert readable_tool_calls(plain) == plain


def test_chat_keeps_a_format_per_conversation_and_shows_tool_calls(make_window, qtbot):
    w = make_window()
    chat = w.chat
    assert chat.send("first")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    first = chat.conversation.id
    chat.output_format.kind.setCurrentIndex(chat.output_format.kind.findData("json_schema"))
    chat.output_format.schema.setPlainText(json.dumps(SCHEMA))
    second = chat.new_conversation().id
    assert chat.output_format.value() == OutputFormat()  # a new conversation starts with plain text
    chat.open_conversation(first)
    assert chat.output_format.value() == OutputFormat("json_schema", json.dumps(SCHEMA))
    chat.open_conversation(second)
    assert chat.output_format.value().kind == "text"

    # a broken schema is refused in place, nothing reaches the engine
    chat.open_conversation(first)
    chat.output_format.schema.setPlainText('{"type": "objct"}')
    n = len(w.ctx.store.messages(first))
    assert not chat.send("again")
    assert chat.pending is None
    error = chat.notice.text()
    assert error.startswith("Not sent: Output format:") and '"objct"' in error
    assert len(w.ctx.store.messages(first)) == n  # nothing added (issue 45: no two user turns in a row)

    # an assistant message holding a tool call is shown readably (and kept as written)
    raw = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    w.ctx.store.add_message(second, "assistant", raw)
    chat.open_conversation(second)
    body = chat.message_widgets()[-1].body.text()
    assert "get_weather" in body and "Oslo" in body and "<tool_call>" not in body
    assert w.ctx.store.messages(second)[-1].content == raw


def test_json_schema_reply_on_the_real_model(make_window, qtbot):
    """The output format reaches the engine's structured output: SmolLM2's reply follows the schema."""
    w = make_window(fake=False, engine_settings={"dtype": "float32"})
    chat = w.chat
    set_sampling(w, max_tokens=60, temperature=0)
    chat.output_format.kind.setCurrentIndex(chat.output_format.kind.findData("json_schema"))
    chat.output_format.schema.setPlainText(json.dumps(SCHEMA))
    assert chat.send("Name a big city and its population.")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    reply = w.ctx.store.messages(chat.conversation.id)[-1]
    assert reply.role == "assistant" and reply.finish_reason == "stop", reply
    jsonschema.validate(json.loads(reply.content), SCHEMA)


def test_server_panel_offers_the_examples(make_window):
    w = make_window()
    panel = w.panels["server"]
    combo = panel.snippet_kind
    assert [combo.itemData(i) for i in range(combo.count())] == ["chat", "tools", "json_schema", "embeddings"]
    combo.setCurrentIndex(combo.findData("tools"))
    assert '"tools"' in panel.curl.toPlainText() and "tool_calls" in panel.python.toPlainText()
    combo.setCurrentIndex(combo.findData("json_schema"))
    assert '"json_schema"' in panel.curl.toPlainText() and "response_format" in panel.python.toPlainText()
    combo.setCurrentIndex(combo.findData("embeddings"))
    assert "/v1/embeddings" in panel.curl.toPlainText() and "client.embeddings.create" in panel.python.toPlainText()
    compile(panel.python.toPlainText(), "snippet", "exec")
