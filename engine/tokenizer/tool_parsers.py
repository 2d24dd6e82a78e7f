"""Tool calls in a model's output: the formats of the families Kestrel runs, parsed whole or as a stream.

Formats (``ToolFormat``), chosen from the chat template's text (``tool_format_for``):

- ``hermes`` (Qwen 2.5 / Qwen 3, Hermes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, repeated.
- ``llama3_json`` (Llama 3.1 / 3.2 / 3.3): ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>``, several separated by ``;``; without the tag only at the start of the output.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``. ``[TOOL_CALLS]`` and ``<|python_tag|>``
  are special tokens that the detokenizer drops by default, so the bare form at the start of the output counts too.
- ``json_array``: the output of a grammar-enforced ``tool_choice: "required"`` (``[{"name": ..., "parameters":
  ...}]``, no marker).

``ToolCallStream`` is one parser for all of them: ``feed`` text deltas, ``finish`` at the end; it returns content
(text before, between and after calls) and complete ``ToolCall`` objects. Text that may be the start of a call
(a marker's prefix, the opening ``{`` or ``[`` of a bare call, whitespace before a call) is held back until the
parser knows. A call is returned only once its JSON object is complete and names a function, so a stream and a
whole parse of the same text give the same calls. Malformed JSON ends call parsing: that text and everything
after it is returned as content, exactly as the model wrote it. With ``drop_incomplete`` (the calls were enforced
by a grammar, so an unfinished one was cut by ``max_tokens`` or a stop string) an unfinished call region at the end
gives the calls completed in it and nothing else: never the grammar's raw JSON as content.
``parse_tool_calls`` is the whole-text face.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

__all__ = ["FORMATS", "ToolCall", "ToolCallStream", "ToolFormat", "new_call_id", "parse_tool_calls",
           "tool_format_for"]


def new_call_id() -> str:
    """An OpenAI-style tool-call id: ``call_`` and 24 random hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object
    id: str = field(default_factory=new_call_id)

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes its calls: ``marker`` opens calls anywhere in the output; ``bare`` opens them without
    the marker at the very start of the output; ``body`` is the shape after the opener ("wrapped": one object then
    ``close``; "semicolon": objects separated by ``;``; "array": a JSON array of objects)."""

    name: str
    marker: str | None
    bare: str | None
    body: str
    close: str | None = None


FORMATS = {
    "hermes": ToolFormat("hermes", "<tool_call>", None, "wrapped", "</tool_call>"),
    "llama3_json": ToolFormat("llama3_json", "<|python_tag|>", "{", "semicolon"),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", "[", "array"),
    "json_array": ToolFormat("json_array", None, "[", "array"),
}


def tool_format_for(template: str | None, architecture: str | None = None) -> ToolFormat | None:
    """The tool-call format a chat template teaches its model, from the template's text (the markers it writes),
    else from the model's architecture; None when neither tells."""
    t = template or ""
    if "<tool_call>" in t:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    if "<|python_tag|>" in t or "<|start_header_id|>" in t:
        return FORMATS["llama3_json"]
    arch = (architecture or "").lower()
    if arch.startswith("qwen"):
        return FORMATS["hermes"]
    if arch.startswith("mistral"):
        return FORMATS["mistral"]
    return None


class _ObjectScanner:
    """Finds where the JSON object or array opening at ``start`` closes (strings and escapes respected), resuming
    where the last look stopped: a long call arriving token by token is scanned once, not once per token."""

    __slots__ = ("start", "i", "depth", "in_str", "esc", "done")

    def __init__(self, start: int) -> None:
        self.start, self.i, self.depth, self.in_str, self.esc = start, start, 0, False, False
        self.done: int | None = None

    def end(self, text: str) -> int | None:
        """The index after the closing bracket; None while it is not in ``text`` yet."""
        if self.done is not None:
            return self.done
        i, depth, in_str, esc = self.i, self.depth, self.in_str, self.esc
        n = len(text)
        while i < n:
            c = text[i]
            i += 1
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self.done = i
                    return i
        self.i, self.depth, self.in_str, self.esc = i, depth, in_str, esc
        return None


def _as_call(obj_text: str) -> ToolCall | None:
    """A call object ({"name", "arguments" | "parameters"}) -> ToolCall (arguments re-serialized compactly, so
    a stream and a whole parse agree); None if it is not one."""
    try:
        obj = json.loads(obj_text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = "arguments" if "arguments" in obj else "parameters"
    if key not in obj:  # {"name": ...} alone is more likely an answer in JSON than a call
        return None
    args = obj[key]
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _held_prefix(text: str, marker: str | None) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    if not marker:
        return 0
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


_WS = " \t\r\n"


class _Incomplete(Exception):
    """More text is needed to decide."""


class _Malformed(Exception):
    """What follows the opener is not a call in the format."""


class ToolCallStream:
    """Incremental parser of one choice's output: ``feed(delta) -> events``, ``finish() -> events``; an event is
    a content string or a complete ToolCall. ``max_calls`` (``parallel_tool_calls: false``: 1) drops calls after
    that many."""

    def __init__(self, fmt: ToolFormat, max_calls: int | None = None, drop_incomplete: bool = False) -> None:
        self.fmt = fmt
        self.max_calls = max_calls
        self.drop_incomplete = drop_incomplete
        self.buf = ""
        self.pos = 0  # start of the text not yet returned (as content or as calls)
        self.at_start = True  # nothing but whitespace so far: a bare opener may still start calls
        self.plain = False  # malformed calls were seen: the rest is content
        self.calls_seen = False
        self.num_calls = 0
        self._region: int | None = None  # start of the call region being read (waiting for more text)
        self._scanners: dict[int, _ObjectScanner] = {}  # by object start, for the region being read

    def feed(self, text: str) -> list:
        self.buf += text
        return self._advance(final=False)

    def finish(self) -> list:
        return self._advance(final=True)

    # -- the machine -------------------------------------------------------------------------------
    def _advance(self, final: bool) -> list:
        out: list = []
        while self.pos < len(self.buf):
            if self.plain:
                out.append(self.buf[self.pos:])
                self.pos = len(self.buf)
                break
            at = self._region if self._region is not None else self._find_opener(out, final)
            if at is None:
                break
            try:
                calls, end = self._parse_region(at, final)
            except _Incomplete:
                self._region = at
                break
            except _Malformed:
                self.plain = True  # from the region's start (whitespace before it included) on: content
                self._region = None
                self._scanners.clear()
                continue
            self._region = None
            self._scanners.clear()
            self.calls_seen = True
            for c in calls:
                self.num_calls += 1
                if self.max_calls is None or self.num_calls <= self.max_calls:
                    out.append(c)
            self.pos = end
        return [e for e in out if not isinstance(e, str) or e]

    def _find_opener(self, out: list, final: bool) -> int | None:
        """Appends the content before the next call region to ``out``; returns the region's start (whitespace
        before the opener included), or None when no opener is in sight: then content is returned up to what
        may still become one (a marker's prefix, trailing whitespace)."""
        text = self.buf[self.pos:]
        stripped = text.lstrip(_WS)
        marker = self.fmt.marker
        if self.at_start and self.fmt.bare:
            if not final and (not stripped or (marker and marker.startswith(stripped))):
                return None  # the marker, which may begin like the bare opener ("[TOOL_CALLS]" and "["), or not
            if stripped[:1] == self.fmt.bare and not (marker and stripped.startswith(marker)):
                self.at_start = False
                return self.pos
        if stripped:
            self.at_start = False
        i = text.find(marker) if marker else -1
        if i >= 0:
            body = text[:i].rstrip(_WS)
            out.append(body)
            self.pos += len(body)
            return self.pos
        if final:
            out.append(text if not self.calls_seen or stripped else "")
            self.pos = len(self.buf)
            return None
        body = text[:len(text) - _held_prefix(text, marker)].rstrip(_WS)
        out.append(body)
        self.pos += len(body)
        return None

    def _parse_region(self, at: int, final: bool) -> tuple[list[ToolCall], int]:
        """The calls of the region that opens at ``at``; returns them and the index after the region. At the end
        of the output an unfinished region is malformed, or (``drop_incomplete``) its complete calls."""
        calls: list[ToolCall] = []
        try:
            return self._region_calls(at, final, calls)
        except _Incomplete:
            if not final:
                raise
            if self.drop_incomplete:
                return calls, len(self.buf)
            raise _Malformed from None

    def _region_calls(self, at: int, final: bool, calls: list[ToolCall]) -> tuple[list[ToolCall], int]:
        fmt, buf = self.fmt, self.buf
        i = self._skip_ws(at, final)
        if fmt.marker and buf.startswith(fmt.marker, i):
            i = self._skip_ws(i + len(fmt.marker), final)
        array = fmt.body == "array" and buf[i] == "["
        if array:
            i = self._skip_ws(i + 1, final)
        while True:
            if buf[i] != "{":
                raise _Malformed
            scanner = self._scanners.get(i)
            if scanner is None:
                scanner = self._scanners[i] = _ObjectScanner(i)
            end = scanner.end(buf)
            if end is None:
                raise _Incomplete
            call = _as_call(buf[i:end])
            if call is None:
                raise _Malformed
            calls.append(call)
            i = end
            if i >= len(buf) or not buf[i:].strip(_WS):  # the output may end here
                if final:
                    return calls, len(buf)
                raise _Incomplete
            j = self._skip_ws(i, final)
            if fmt.body == "wrapped":
                if buf.startswith(fmt.close, j):
                    return calls, j + len(fmt.close)
                if fmt.close.startswith(buf[j:]):
                    if final:
                        return calls, len(buf)
                    raise _Incomplete
                raise _Malformed
            if buf[j] == (";" if fmt.body == "semicolon" else ","):
                i = self._skip_ws(j + 1, final)
                continue
            if array:
                if buf[j] == "]":
                    return calls, j + 1
                raise _Malformed
            return calls, i  # text after the calls is content

    def _skip_ws(self, i: int, final: bool) -> int:
        while i < len(self.buf) and self.buf[i] in _WS:
            i += 1
        if i >= len(self.buf):
            raise _Incomplete
        return i


def parse_tool_calls(text: str, fmt: ToolFormat, max_calls: int | None = None,
                     drop_incomplete: bool = False) -> tuple[str | None, list[ToolCall]]:
    """The whole output -> (content, calls). Without calls the content is the text unchanged; with calls it is
    the text around them (None when that is empty)."""
    stream = ToolCallStream(fmt, max_calls, drop_incomplete)
    events = stream.feed(text) + stream.finish()
    content = "".join(e for e in events if isinstance(e, str))
    calls = [e for e in events if isinstance(e, ToolCall)]
    if stream.calls_seen:
        return (content or None), calls
    return content, calls
