"""Tool calls parsed from fixed model outputs of each family (engine.tokenizer.tool_parsers), whole and streamed
in every chunking: text before a call kept as content, several calls, malformed JSON falling back to content,
text that may begin a call held back until decided; and the format chosen from the chat template's text."""

from __future__ import annotations

import json
import random

import pytest

from engine.tokenizer.tool_parsers import FORMATS, ToolCallStream, parse_tool_calls, tool_format_for
from tests.support import chat_templates as T

W = {"city": "Paris", "unit": "celsius"}
S = {"query": "a } tricky \" string", "limit": 3}

# (format, output, content, calls)
CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
               '"celsius"}}\n</tool_call>', "Let me check.", [("get_weather", W)]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"query": "a } tricky \\" string", '
               '"limit": 3}}\n</tool_call>', None, [("get_weather", W), ("search", S)]),
    ("hermes", '<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris", "unit": "celsius"}}', "<think>\nThe user wants weather.\n</think>",
     [("get_weather", W)]),  # the output ended (EOS) before </tool_call>
    ("hermes", '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"a } tricky \\\\\\" string\\", '
               '\\"limit\\": 3}"}\n</tool_call>\nDone.', "\nDone.", [("search", S)]),  # arguments as a JSON string
    ("hermes", "If a < b and <tool> is a tag, no call here.", "If a < b and <tool> is a tag, no call here.", []),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>', []),
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
     'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', []),  # cut by max_tokens
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', None,
     [("get_weather", W)]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
                    '{"name": "search", "parameters": {"query": "a } tricky \\" string", "limit": 3}}', None,
     [("get_weather", W), ("search", S)]),
    ("llama3_json", 'I will look it up.<|python_tag|>{"name": "search", "arguments": {"query": "a } tricky \\" '
                    'string", "limit": 3}}', "I will look it up.", [("search", S)]),
    ("llama3_json", '{"answer": 42, "name": "Bob"}', '{"answer": 42, "name": "Bob"}', []),  # JSON, not a call
    ("llama3_json", "The weather is {sunny}.", "The weather is {sunny}.", []),
    ("llama3_json", '  {"name": "get_weather", "parameters": {"city": "Paris",}}',
     '  {"name": "get_weather", "parameters": {"city": "Paris",}}', []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
                '{"name": "search", "arguments": {"query": "a } tricky \\" string", "limit": 3}}]', None,
     [("get_weather", W), ("search", S)]),
    ("mistral", '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]', None,
     [("get_weather", W)]),  # [TOOL_CALLS] is a special token: dropped by the detokenizer
    ("mistral", 'Checking.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
                '"celsius"}}]',
     "Checking.", [("get_weather", W)]),
    ("mistral", "[1, 2] are the numbers.", "[1, 2] are the numbers.", []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}] oops',
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}] oops', []),
    ("json_array", '[{"name":"get_weather","parameters":{"city":"Paris","unit":"celsius"}},{"name":"search",'
                   '"parameters":{"query":"a } tricky \\" string","limit":3}}]', None,
     [("get_weather", W), ("search", S)]),
]


def _chunkings(text: str):
    yield [text]
    yield list(text)
    rng = random.Random(len(text))
    for _ in range(3):
        parts, i = [], 0
        while i < len(text):
            n = rng.randint(1, 7)
            parts.append(text[i:i + n])
            i += n
        yield parts


def _calls(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("fmt, text, content, calls", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_whole_output(fmt, text, content, calls):
    got_content, got_calls = parse_tool_calls(text, FORMATS[fmt])
    assert got_content == content
    assert _calls(got_calls) == calls
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in got_calls)
    assert len({c.id for c in got_calls}) == len(got_calls)
    for c in got_calls:
        assert c.openai() == {"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}


@pytest.mark.parametrize("fmt, text, content, calls", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_streamed_output_equals_whole(fmt, text, content, calls):
    for parts in _chunkings(text):
        stream = ToolCallStream(FORMATS[fmt])
        events = [e for p in parts for e in stream.feed(p)] + stream.finish()
        assert "".join(e for e in events if isinstance(e, str)) == (content or "")
        assert _calls([e for e in events if not isinstance(e, str)]) == calls


def test_content_streams_before_the_call_and_the_call_is_held_until_complete():
    text = CASES[0][1]
    stream = ToolCallStream(FORMATS["hermes"])
    cut = text.index("<tool_call>") + 5  # "...check.\n<tool": may still become a marker
    assert stream.feed(text[:cut]) == ["Let me check."]
    end = text.index("}}") + 1
    assert stream.feed(text[cut:end]) == []  # the object is not closed yet
    events = stream.feed(text[end:])
    assert _calls(events) == [("get_weather", W)] and stream.finish() == []


def test_plain_text_streams_unchanged_and_whitespace_waits():
    stream = ToolCallStream(FORMATS["llama3_json"])
    assert stream.feed("  ") == []  # may precede a bare call
    assert stream.feed("Hello ") == ["  Hello"]
    assert stream.feed("world\n") == [" world"]
    assert stream.finish() == ["\n"]


def test_parallel_tool_calls_false_keeps_the_first():
    content, calls = parse_tool_calls(CASES[1][1], FORMATS["hermes"], max_calls=1)
    assert content is None and _calls(calls) == [("get_weather", W)]
    content, calls = parse_tool_calls(CASES[-1][1], FORMATS["json_array"], max_calls=1)
    assert _calls(calls) == [("get_weather", W)]


@pytest.mark.parametrize("template, fmt", [
    (T.QWEN25_TOOLS_TEMPLATE, "hermes"), (T.QWEN2_TEMPLATE, "hermes"), (T.QWEN3_TEMPLATE, "hermes"),
    (T.LLAMA31_TOOLS_TEMPLATE, "llama3_json"), (T.LLAMA3_TEMPLATE, "llama3_json"),
    (T.MISTRAL_TOOLS_TEMPLATE, "mistral"), (T.LLAMA2_TEMPLATE, None),
])
def test_format_from_the_template(template, fmt):
    got = tool_format_for(template)
    assert (got.name if got else None) == fmt


def test_format_from_the_architecture_when_the_template_does_not_tell():
    assert tool_format_for("{{ messages }}", "qwen2").name == "hermes"
    assert tool_format_for("{{ messages }}", "mistral").name == "mistral"
    assert tool_format_for("{{ messages }}", "llama") is None
