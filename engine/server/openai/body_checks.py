"""Checks of a request body's JSON text before anything parses it: nesting depth, unpaired UTF-16 surrogates and,
on the routes that take lists (PRECHECKED_PATHS: /v1/responses' ``input`` items as chat's messages), the lists'
sizes (precheck_body).

Python's json module (FastAPI's parser) recurses once per nesting level and fails with RecursionError near 1,000
levels, which would be a 500; a ``\\ud800`` escape without its pair parses into a str that cannot be encoded, which
fails later (UnicodeEncodeError, another 500) wherever the text is written out. Both are client errors: 400 here,
naming what is wrong, on every route that takes a JSON body (engine/server/openai/app.py BodyLimitMiddleware).

Both checks are linear in the body and cheap when nothing is wrong: a body with fewer opening brackets than the
depth limit cannot be too deep, and one without a surrogate escape skips the surrogate scan.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from engine.errors import InvalidRequestError, PromptTooLongError
from engine.server.openai.limits import (
    MAX_CHOICES,
    MAX_CONTENT_PARTS,
    MAX_DETOKENIZE_TOKENS,
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    check_count,
)

MAX_JSON_DEPTH = 128  # nesting levels of objects and arrays (a tool's JSON schema needs a dozen)

# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or a low one not preceded by a high one; the
# backslash must itself be unescaped: preceded by an even number of backslashes.
_HIGH = rb"\\u[dD][89abAB][0-9a-fA-F]{2}"
_LOW = rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}"
_LONE_SURROGATE = re.compile(rb"(?<!\\)(?:\\\\)*(" + _HIGH + rb"(?!" + _LOW + rb")|(?<!" + _HIGH + rb")" + _LOW + rb")")
_ANY_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def json_depth(body: bytes) -> int:
    """The deepest nesting of objects and arrays in ``body`` (JSON text; brackets inside strings do not count). On
    text that is not JSON the figure is meaningless but finite: the parser refuses it afterwards. Vectorised (numpy
    releases the GIL on large arrays): ~30 ms for 10 MB, where a regular expression over 200,000 strings took ~1 s."""
    a = np.frombuffer(body, dtype=np.uint8)
    brackets = np.flatnonzero((a == 0x5B) | (a == 0x5D) | (a == 0x7B) | (a == 0x7D))
    if brackets.size == 0:
        return 0
    quotes = np.flatnonzero(a == 0x22)
    if quotes.size:
        quotes = _string_quotes(a, quotes)
    outside = np.searchsorted(quotes, brackets) % 2 == 0  # an even number of string quotes before it
    kinds = a[brackets[outside]]
    if kinds.size == 0:
        return 0
    steps = np.where((kinds == 0x5B) | (kinds == 0x7B), 1, -1).astype(np.int32)
    return int(steps.cumsum().max())


def _string_quotes(a: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """The quotes that open or close strings: those after an even run of backslashes (an escaped quote follows an
    odd one). Runs are measured only behind the quotes that follow a backslash, a step back at a time; a run past
    64 backslashes (a hostile body) takes the whole-array measure instead."""
    cand = quotes[(quotes > 0) & (a[np.maximum(quotes - 1, 0)] == 0x5C)]
    if cand.size == 0:
        return quotes
    run = np.ones(cand.size, dtype=np.int64)
    active = np.ones(cand.size, dtype=bool)
    for k in range(2, 66):
        prev = cand - k
        active &= (prev >= 0) & (a[np.maximum(prev, 0)] == 0x5C)
        if not active.any():
            break
        run += active
    else:
        idx = np.arange(a.size, dtype=np.int64)
        last_other = np.maximum.accumulate(np.where(a == 0x5C, -1, idx))  # the last non-backslash at or before i
        run = cand - 1 - last_other[cand - 1]
    return np.setdiff1d(quotes, cand[run % 2 == 1], assume_unique=True)


def lone_surrogate(body: bytes) -> str | None:
    """The first unpaired surrogate escape in ``body`` (e.g. "\\ud800"), or None."""
    if not _ANY_SURROGATE.search(body):
        return None
    m = _LONE_SURROGATE.search(body)
    return m.group(1).decode("ascii") if m else None


def check_json_body(body: bytes) -> None:
    """InvalidRequestError (400) for a body nested deeper than MAX_JSON_DEPTH or holding an unpaired surrogate."""
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
        depth = json_depth(body)
        if depth > MAX_JSON_DEPTH:
            raise InvalidRequestError(f"The request body nests objects and arrays {depth} levels deep; at most "
                                      f"{MAX_JSON_DEPTH} are accepted.")
    bad = lone_surrogate(body)
    if bad is not None:
        raise InvalidRequestError(f"The request body holds the escape {bad}: half of a UTF-16 surrogate pair "
                                  "without its other half, which is not a character. Send text as valid Unicode.")


# ------------------------------------------------------------------------------------------------
# the sizes of the body's lists (engine.server.openai.limits), before it is parsed


class _Body(msgspec.Struct):
    """The list-valued fields of a request, left undecoded (msgspec.Raw) to be counted cheaply."""

    messages: msgspec.Raw = msgspec.Raw()
    prompt: msgspec.Raw = msgspec.Raw()
    stop: msgspec.Raw = msgspec.Raw()
    stop_token_ids: msgspec.Raw = msgspec.Raw()
    logit_bias: msgspec.Raw = msgspec.Raw()
    tokens: msgspec.Raw = msgspec.Raw()
    input: msgspec.Raw = msgspec.Raw()  # /v1/responses


class _Message(msgspec.Struct):
    """A chat message, or a /v1/responses input item (a message's ``content``, a function_call_output's
    ``output``: text or a list of parts)."""
    content: msgspec.Raw = msgspec.Raw()
    output: msgspec.Raw = msgspec.Raw()


def _first(raw: msgspec.Raw) -> bytes:
    return bytes(memoryview(raw)[:1]) if len(raw) else b""


def _items(raw: msgspec.Raw) -> list[msgspec.Raw] | None:
    return msgspec.json.decode(raw, type=list[msgspec.Raw]) if _first(raw) == b"[" else None


PRECHECKED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize"})


def _precheck_input(raw: msgspec.Raw) -> None:
    """/v1/responses' ``input`` items: their number and their parts' (the errors of serving_responses's
    ``input_messages``, which checks them again after parsing)."""
    items = _items(raw)
    if items is None:
        return
    if len(items) > MAX_MESSAGES:
        raise InvalidRequestError(f"Too many items in 'input': {len(items)}, at most {MAX_MESSAGES}.", param="input")
    for i, item in enumerate(items):
        if _first(item) != b"{":
            continue
        fields = msgspec.json.decode(item, type=_Message)
        for name in ("content", "output"):
            parts = _items(getattr(fields, name))
            if parts is not None and len(parts) > MAX_CONTENT_PARTS:
                param = f"input[{i}].{name}"
                raise InvalidRequestError(f"Too many content parts in '{param}': {len(parts)}, at most "
                                          f"{MAX_CONTENT_PARTS}.", param=param)


def precheck_body(path: str, body: bytes, max_model_len: int) -> None:
    """Refuse a body whose lists are over their bounds before it is parsed: pydantic takes ~1 s (on the event
    loop, stalling every stream) to build 200,000 message objects only to have them refused. The errors are
    the ones the handlers would raise; a body that is not a JSON object of the expected shape is left to them
    (422)."""
    try:
        b = msgspec.json.decode(body, type=_Body)
        messages = _items(b.messages)
        if messages is not None:
            if len(messages) > MAX_MESSAGES:
                raise InvalidRequestError(f"Too many messages: {len(messages)}, at most {MAX_MESSAGES}.",
                                          param="messages")
            for i, raw in enumerate(messages):
                if _first(raw) == b"{":
                    parts = _items(msgspec.json.decode(raw, type=_Message).content)
                    if parts is not None and len(parts) > MAX_CONTENT_PARTS:
                        raise InvalidRequestError(f"Too many content parts in messages[{i}]: {len(parts)}, at most "
                                                  f"{MAX_CONTENT_PARTS}.", param=f"messages[{i}].content")
        if path == "/v1/responses":
            _precheck_input(b.input)
        prompt = _items(b.prompt) if path == "/v1/completions" else None
        if prompt:
            if _first(prompt[0]) not in (b"[", b'"'):  # token ids
                if len(prompt) >= max_model_len:
                    raise PromptTooLongError(len(prompt), max_model_len)
            elif len(prompt) > MAX_CHOICES:
                raise InvalidRequestError(f"Too many prompts: {len(prompt)}, at most {MAX_CHOICES}.", param="prompt")
            else:
                for raw in prompt:
                    ids = _items(raw)
                    if ids is not None and len(ids) >= max_model_len:
                        raise PromptTooLongError(len(ids), max_model_len)
        for name, most in (("stop", MAX_STOP_STRINGS), ("stop_token_ids", MAX_STOP_TOKEN_IDS),
                           ("tokens", MAX_DETOKENIZE_TOKENS)):
            items = _items(getattr(b, name))
            if items is not None and len(items) > most:
                raise InvalidRequestError(f"Too many entries in '{name}': {len(items)}, at most {most}.", param=name)
        if _first(b.logit_bias) == b"{":
            bias = msgspec.json.decode(b.logit_bias, type=dict[str, msgspec.Raw])
            check_count("logit_bias", bias, MAX_LOGIT_BIAS)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
