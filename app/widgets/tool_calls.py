"""How the chat shows an assistant message that calls tools: each call as a short heading with the function's
name and its arguments as an indented JSON block, instead of the raw ``<tool_call>{...}</tool_call>`` (Qwen,
Hermes), ``[TOOL_CALLS][...]`` (Mistral) or bare ``{"name": ..., "parameters": ...}`` (Llama 3) text the model
wrote. The calls are found by the engine's own parser (engine.tokenizer.tool_parsers, torch-free), so the chat
and the server agree on what a call is; text around the calls is kept as it was."""

from __future__ import annotations

import json

from engine.tokenizer.tool_parsers import FORMATS, ToolCall, parse_tool_calls

# the formats of the families Kestrel runs; the grammar-only json_array form is not looked for (a JSON answer
# in the chat is an answer, not a call)
_LOOKED_FOR = ("hermes", "mistral", "llama3_json")


def find_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text around the calls, the calls) of the first format that finds any; (text, []) otherwise."""
    for name in _LOOKED_FOR:
        content, calls = parse_tool_calls(text, FORMATS[name])
        if calls:
            return content or "", calls
    return text, []


def readable_tool_calls(text: str) -> str:
    """The message as Markdown for the message view: unchanged without tool calls, else its text followed by
    one block per call."""
    content, calls = find_tool_calls(text)
    if not calls:
        return text
    parts = [content.strip()] if content.strip() else []
    for call in calls:
        try:
            args = json.dumps(json.loads(call.arguments), indent=2, ensure_ascii=False)
        except ValueError:
            args = call.arguments
        parts.append(f"**Tool call:** `{call.name}`\n\n```json\n{args}\n```")
    return "\n\n".join(parts)
