"""POST /v1/responses: OpenAI's Responses API, stateless (as Ollama and LM Studio serve it), on the chat path.

The request becomes a chat request and goes the chat route's way (engine.server.openai.serving_chat
``chat_prompt``: the chat template, the tools through the template or the built-in tool prompt, the tool
grammars and parsers of engine.server.openai.tools; ``convert_messages`` checks the messages):

- ``instructions`` -> a system message first; ``input`` text -> one user message; ``input`` items -> messages:
  ``message`` items (text, or input_text / output_text / refusal parts), ``function_call`` -> the assistant's
  ``tool_calls`` (calls that follow an assistant message join it), ``function_call_output`` -> a ``tool`` message,
  ``reasoning`` -> the next assistant message's ``reasoning_content`` (templates that have it render it, as in
  transformers; others leave it out); ``item_reference`` and hosted-tool items are 400s (nothing is stored).
- ``tools`` in the Responses shape (``{"type": "function", "name", "description", "parameters", "strict"}``) ->
  chat's; ``tool_choice`` ``{"type": "function", "name"}`` -> chat's named choice; ``text.format`` -> chat's
  ``response_format``; ``max_output_tokens`` -> max_tokens. A 400 names the Responses field, not chat's.
- The output: a ``message`` item (``output_text``) and one ``function_call`` item per call; status ``incomplete``
  (``incomplete_details.reason`` "max_output_tokens") when the output was cut; ``usage`` in input / output
  tokens. Streamed as the documented events, each with its ``sequence_number``: response.created,
  response.in_progress, per item response.output_item.added, for text response.content_part.added,
  response.output_text.delta ..., response.output_text.done, response.content_part.done, for a call
  response.function_call_arguments.delta ... / .done, then response.output_item.done; response.completed (or
  response.incomplete) with the whole response last. An engine error mid-stream is an ``error`` event.
"""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import InvalidRequestError, KestrelError
from engine.server.openai import serving as S
from engine.server.openai import tools as T
from engine.server.openai.errors import kestrel_error_parts
from engine.server.openai.protocol import ChatMessage
from engine.server.openai.protocol_responses import ResponsesRequest, check_response_fields
from engine.server.openai.serving_chat import chat_prompt, convert_messages
from engine.tokenizer.tool_parsers import ToolCall, ToolCallStream, new_call_id, parse_tool_calls

_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}


def _bad(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {what}.", param=param)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ------------------------------------------------------------------------------------------------
# request -> chat


def _text_of(content: Any, param: str) -> str:
    """A message's or a tool output's content: text, or a list of text parts (joined by newlines)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(param, "text or a list of input_text parts")
    if len(content) > S.MAX_CONTENT_PARTS:
        raise InvalidRequestError(f"Too many content parts in '{param}': {len(content)}, at most "
                                  f"{S.MAX_CONTENT_PARTS}.", param=param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise _bad(f"{param}[{j}]", f"a part of type {kind!r}: this model takes text parts only "
                                        "(input_text, output_text)")
    return "\n".join(texts)


def _string(item: dict, key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequestError(f"Missing required parameter: '{param}.{key}' (a string).", param=f"{param}.{key}")
    return value


def input_messages(req: ResponsesRequest) -> list[dict]:
    """``instructions`` and ``input`` as chat messages (plain dicts, in the shape chat requests send)."""
    msgs: list[dict] = []
    if req.instructions is not None:
        msgs.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*msgs, {"role": "user", "content": req.input}]
    if not req.input:
        raise InvalidRequestError("'input' must contain at least one item.", param="input")
    if len(req.input) > S.MAX_MESSAGES:
        raise InvalidRequestError(f"Too many items in 'input': {len(req.input)}, at most {S.MAX_MESSAGES}.",
                                  param="input")
    reasoning: str | None = None
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{where}.role", f"{role!r} (one of user, system, developer, assistant)")
            msg: dict[str, Any] = {"role": role, "content": _text_of(item.get("content"), f"{where}.content")}
            if role == "assistant" and reasoning is not None:
                msg["reasoning_content"], reasoning = reasoning, None
            msgs.append(msg)
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":  # the turn's text and its calls: one message
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning is not None:
                    msg["reasoning_content"], reasoning = reasoning, None
                msgs.append(msg)
        elif kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                         "content": _text_of(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = _text_of(parts, f"{where}.content")
        elif kind == "item_reference":
            raise InvalidRequestError(f"Unsupported item type 'item_reference' in '{where}': this server is "
                                      "stateless and keeps no items; send the item itself.", param=f"{where}.type")
        else:
            raise InvalidRequestError(f"Unsupported item type {kind!r} in '{where}': message, function_call, "
                                      "function_call_output and reasoning items are served here.",
                                      param=f"{where}.type")
    return msgs


def _chat_tools(tools: list[dict]) -> list[dict]:
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise InvalidRequestError(f"Unsupported tool type {kind!r} in 'tools[{i}]': only function tools are "
                                      "served here (hosted tools such as web_search are OpenAI's).",
                                      param=f"tools[{i}].type")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise InvalidRequestError("Missing required parameter: 'tool_choice.name'.", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice", "'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...} (hosted "
                              "tools and allowed_tools are not served here)")


def _response_format(text: dict | None) -> dict | None:
    """``text.format`` -> chat's ``response_format``."""
    if text is None:
        return None
    for key, value in text.items():
        if key != "format" and value is not None:
            raise InvalidRequestError(f"Unsupported parameter 'text.{key}'.", param=f"text.{key}")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise _bad("text.format", "an object with a 'type' (text, json_object or json_schema)")
    kind = fmt["type"]
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise _bad("text.format.type", f"{kind!r} (text, json_object or json_schema)")
    if "schema" not in fmt:
        raise InvalidRequestError("Missing required parameter: 'text.format.schema'.", param="text.format.schema")
    js = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": js}


def _responses_param(param: str | None) -> str | None:
    """A chat field's name, as the Responses request calls it."""
    if param is None:
        return None
    if param.startswith("response_format"):
        return "text.format" + param[len("response_format"):].replace(".json_schema", "", 1)
    if param.startswith("max_tokens"):
        return "max_output_tokens"
    if param.startswith("tools["):
        return param.replace(".function.", ".", 1).replace(".function", "", 1)
    if param.startswith("tool_choice.function."):
        return "tool_choice." + param[len("tool_choice.function."):]
    return param


def _renamed(e: InvalidRequestError) -> InvalidRequestError:
    old = getattr(e, "param", None)
    new = _responses_param(old)
    if new != old:
        e.args = (str(e).replace(f"'{old}", f"'{new}"),)
        e.param = new
    return e


def _sampling_request(req: ResponsesRequest, response_format: dict | None) -> SimpleNamespace:
    """The fields serving.sampling_params reads, from a Responses request."""
    return SimpleNamespace(
        n=1, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, seed=req.seed, stop=req.stop, stop_token_ids=None,
        logit_bias=None, min_tokens=0, ignore_eos=False, include_stop_str_in_output=False, skip_special_tokens=True,
        model_extra={"response_format": response_format} if response_format else {})


async def create_response(ctx: S.ServerContext, req: ResponsesRequest, raw: Request) -> Response:
    ctx.check_model(req.model)
    check_response_fields(req)
    try:
        messages = convert_messages([ChatMessage.model_validate(m) for m in input_messages(req)])
        rf = _response_format(req.text)
        extra: dict[str, Any] = {"tools": _chat_tools(req.tools) if req.tools else None,
                                 "tool_choice": _chat_tool_choice(req.tool_choice),
                                 "parallel_tool_calls": req.parallel_tool_calls, "response_format": rf}
        extra = {k: v for k, v in extra.items() if v is not None}
        params = S.sampling_params(ctx, _sampling_request(req, rf), max_tokens=req.max_output_tokens,
                                   max_tokens_name="max_tokens", logprobs=None)
        prompt, plan = await chat_prompt(ctx, messages, extra)
    except InvalidRequestError as e:
        raise _renamed(e) from None
    plan = T.apply_plan(plan, params)
    try:
        streams = await S.start_streams(ctx.client, [prompt], params)
    except InvalidRequestError as e:
        raise _renamed(e) from None
    shape = _Shape(req, ctx.response_model(req.model), params)
    if req.stream:
        return S.SSEResponse(_stream(streams, shape, plan), on_close=lambda: S.abort_all(streams))
    return await S.until_disconnect(raw, _full(streams, shape, plan))


# ------------------------------------------------------------------------------------------------
# output -> Responses items


class _Shape:
    """What every form of one response carries: its id, the request's settings echoed back."""

    def __init__(self, req: ResponsesRequest, model: str, params) -> None:
        self.id = _item_id("resp")
        self.created = int(time.time())
        fmt = (req.text or {}).get("format") or {"type": "text"}
        self.fields = {
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "max_tool_calls": None,
            "model": model, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
            "store": False, "temperature": params.temperature, "text": {"format": fmt},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": req.tools or [],
            "top_p": params.top_p, "truncation": "disabled", "user": req.user, "metadata": req.metadata or {}}

    def body(self, status: str, output: list[dict], usage: dict | None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "background": False, "error": None, "incomplete_details": incomplete, **self.fields,
                "output": output, "usage": usage}


def _usage(streams, output_tokens: int, cached: int) -> dict:
    u = S.usage(streams, output_tokens, cached)
    return {"input_tokens": u["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"]}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def output_items(text: str, finish_reason: str | None, plan: T.ToolPlan | None) -> list[dict]:
    """A whole output -> its items: the text as a message (left out when only whitespace surrounds calls), then
    one function_call per call."""
    status = _status(finish_reason)
    if plan is None:
        content, calls = text, []
    elif plan.choice == "named":
        content, calls = None, [ToolCall(plan.name, text)]
    else:
        content, calls = parse_tool_calls(text, plan.fmt, plan.max_calls, plan.enforced)
    items = []
    if content is not None and (content.strip() or not calls):
        items.append(_message_item(_item_id("msg"), content, status))
    items += [_call_item(_item_id("fc"), c.id, c.name, c.arguments, "completed") for c in calls]
    return items


async def _full(streams, shape: _Shape, plan: T.ToolPlan | None) -> Response:
    gathered, cached = await S.collect(streams, 1, 1)
    c = gathered[0]
    body = shape.body(_status(c.finish_reason), output_items("".join(c.text), c.finish_reason, plan),
                      _usage(streams, c.output_tokens, cached))
    return Response(S.encode_json(body), media_type="application/json")


class _Events:
    """Server-sent events numbered in order (``sequence_number``), each named by its type."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + S.encode_json(body) + b"\n\n"


class _ItemStream:
    """One output's text and calls as Responses items and their events. Whitespace before the text is held until
    text comes (a call after it leaves no empty message); a named function's arguments stream as written."""

    def __init__(self, plan: T.ToolPlan | None, ev: _Events) -> None:
        self.ev = ev
        self.items: list[dict] = []
        self.named = plan.name if plan is not None and plan.choice == "named" else None
        self.parser = ToolCallStream(plan.fmt, plan.max_calls, plan.enforced) if plan and not self.named else None
        self.msg: dict | None = None  # the open message item and its text so far
        self.pending = ""
        self.call: dict | None = None  # the named function's open call

    def feed(self, text: str, finished: bool, finish_reason: str | None) -> list[bytes]:
        out: list[bytes] = []
        if self.named is not None:
            out += self._named(text)
        else:
            events = (self.parser.feed(text) if text else []) if self.parser else ([text] if text else [])
            if finished and self.parser:
                events += self.parser.finish()
            for e in events:
                out += self._text(e) if isinstance(e, str) else self._whole_call(e)
        if finished:
            status = _status(finish_reason)
            if self.call is not None:
                out += self._close_call(status)
            elif self.msg is None and not self.items:
                out += self._open_message()
            if self.msg is not None:
                out += self._close_message(status)
        return out

    def _index(self) -> int:
        return len(self.items)

    def _open_message(self) -> list[bytes]:
        self.msg = {"id": _item_id("msg"), "text": self.pending}
        self.pending = ""
        i, mid = self._index(), self.msg["id"]
        out = [self.ev("response.output_item.added", output_index=i, item=_message_item(mid, None, "in_progress")),
               self.ev("response.content_part.added", item_id=mid, output_index=i, content_index=0,
                       part=_text_part(""))]
        if self.msg["text"]:
            out.append(self._delta(self.msg["text"]))
        return out

    def _delta(self, text: str) -> bytes:
        return self.ev("response.output_text.delta", item_id=self.msg["id"], output_index=self._index(),
                       content_index=0, delta=text, logprobs=[])

    def _text(self, text: str) -> list[bytes]:
        if self.msg is None:
            if not text.strip():
                self.pending += text
                return []
            self.pending += text
            return self._open_message()
        self.msg["text"] += text
        return [self._delta(text)]

    def _close_message(self, status: str) -> list[bytes]:
        mid, text, i = self.msg["id"], self.msg["text"], self._index()
        item = _message_item(mid, text, status)
        self.msg = None
        self.items.append(item)
        return [self.ev("response.output_text.done", item_id=mid, output_index=i, content_index=0, text=text,
                        logprobs=[]),
                self.ev("response.content_part.done", item_id=mid, output_index=i, content_index=0,
                        part=_text_part(text)),
                self.ev("response.output_item.done", output_index=i, item=item)]

    def _open_call(self, call_id: str, name: str) -> list[bytes]:
        self.call = {"id": _item_id("fc"), "call_id": call_id, "name": name, "arguments": ""}
        item = _call_item(self.call["id"], call_id, name, "", "in_progress")
        return [self.ev("response.output_item.added", output_index=self._index(), item=item)]

    def _arguments(self, text: str) -> bytes:
        self.call["arguments"] += text
        return self.ev("response.function_call_arguments.delta", item_id=self.call["id"],
                       output_index=self._index(), delta=text)

    def _close_call(self, status: str) -> list[bytes]:
        c, i = self.call, self._index()
        item = _call_item(c["id"], c["call_id"], c["name"], c["arguments"], status)
        self.call = None
        self.items.append(item)
        return [self.ev("response.function_call_arguments.done", item_id=c["id"], output_index=i, name=c["name"],
                        arguments=c["arguments"]),
                self.ev("response.output_item.done", output_index=i, item=item)]

    def _whole_call(self, call: ToolCall) -> list[bytes]:
        out = self._close_message("completed") if self.msg is not None else []
        self.pending = ""
        out += self._open_call(call.id, call.name)
        if call.arguments:
            out.append(self._arguments(call.arguments))
        return out + self._close_call("completed")

    def _named(self, text: str) -> list[bytes]:
        out = self._open_call(new_call_id(), self.named) if self.call is None and not self.items else []
        if text:
            out.append(self._arguments(text))
        return out


async def _stream(streams, shape: _Shape, plan: T.ToolPlan | None):
    ev = _Events()
    items = _ItemStream(plan, ev)
    try:
        yield ev("response.created", response=shape.body("in_progress", [], None)) + \
            ev("response.in_progress", response=shape.body("in_progress", [], None))
        async for batch in S.batches(streams, 1):
            m = S.merge_by_choice(batch)[0]
            last = m.last
            out = items.feed(m.text, last.finished, last.finish_reason)
            if last.finished:
                status = _status(last.finish_reason)
                body = shape.body(status, items.items,
                                  _usage(streams, last.num_output_tokens, last.num_cached_tokens))
                out.append(ev("response.completed" if status == "completed" else "response.incomplete",
                              response=body))
            if out:
                yield b"".join(out)
    except Exception as e:  # noqa: BLE001 - reported to the client as the stream's last event
        if isinstance(e, KestrelError):
            detail = kestrel_error_parts(e)[1]["error"]
        else:
            detail = {"message": f"Internal server error ({type(e).__name__}).", "type": "internal_error"}
        yield ev("error", code=detail.get("code") or detail["type"], message=detail["message"],
                 param=detail.get("param"))
    finally:
        S.abort_all(streams)
