"""POST /v1/chat/completions: messages through the model's chat template (applied by the EngineClient, off the
engine's loop, exactly as transformers applies it), streamed as chat.completion.chunk events or returned whole.

With ``tools`` (engine.server.openai.tools plans the request): the tools go through the template (rendered here,
on a worker thread, with the client's tokenizer), the output is read as tool calls (engine.tokenizer.tool_parsers)
and returned as OpenAI ``tool_calls`` with finish_reason "tool_calls", or streamed as tool-call deltas: a call's
first delta carries its index, id, type and name, the next its arguments; text before a call streams as content.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import InvalidRequestError, KestrelError, as_request_error
from engine.server.openai import serving as S
from engine.server.openai import tools as T
from engine.server.openai.protocol import ChatCompletionRequest, ChatMessage, check_fields
from engine.tokenizer.tool_parsers import ToolCall, ToolCallStream, new_call_id, parse_tool_calls

_ROLES = {"system", "user", "assistant", "tool"}
_REFUSED_MESSAGE_FIELDS = {"function_call": "function calling is not supported (use tool_calls)",
                           "audio": "audio is not supported"}


def convert_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Plain {role, content} dicts; content parts joined with newlines; the 'developer' role of newer
    OpenAI models read as 'system'. Anything the template cannot take gets a 400 naming it."""
    if not messages:
        raise InvalidRequestError("'messages' must contain at least one message.", param="messages")
    if len(messages) > S.MAX_MESSAGES:
        raise InvalidRequestError(f"Too many messages: {len(messages)}, at most {S.MAX_MESSAGES}.", param="messages")
    out = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        if role not in _ROLES:
            why = ("use tool (function is deprecated)" if role == "function"
                   else "use system, user, assistant or tool")
            raise InvalidRequestError(f"Unsupported role {m.role!r} in messages[{i}]: {why}.",
                                      param=f"messages[{i}].role")
        msg: dict[str, Any] = {"role": role}
        content = m.content
        if content is None:
            if role != "assistant":
                raise InvalidRequestError(f"messages[{i}].content is required.", param=f"messages[{i}].content")
            content = ""
        elif isinstance(content, list):
            if len(content) > S.MAX_CONTENT_PARTS:
                raise InvalidRequestError(f"Too many content parts in messages[{i}]: {len(content)}, at most "
                                          f"{S.MAX_CONTENT_PARTS}.", param=f"messages[{i}].content")
            texts = []
            for j, part in enumerate(content):
                if isinstance(part, str):
                    texts.append(part)
                    continue
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(
                        f"messages[{i}].content[{j}] is of type {part.type!r}: this model takes text parts only.",
                        param=f"messages[{i}].content[{j}]")
                texts.append(part.text)
            content = "\n".join(texts)
        S.check_text(content, f"messages[{i}].content")
        msg["content"] = content
        if m.name is not None:
            S.check_text(m.name, f"messages[{i}].name")
            msg["name"] = m.name
        for k, v in (m.model_extra or {}).items():
            if v is None or v == []:
                continue
            if k in _REFUSED_MESSAGE_FIELDS:
                raise InvalidRequestError(f"Unsupported field messages[{i}].{k}: {_REFUSED_MESSAGE_FIELDS[k]}.",
                                          param=f"messages[{i}].{k}")
            if k == "tool_calls":
                if role != "assistant":
                    raise InvalidRequestError(f"messages[{i}].tool_calls is only for assistant messages.",
                                              param=f"messages[{i}].tool_calls")
                msg[k] = T.check_tool_calls(v, f"messages[{i}].tool_calls")
                continue
            if isinstance(v, str):
                S.check_text(v, f"messages[{i}].{k}")
                msg[k] = v  # e.g. reasoning_content: templates may use it, as in transformers
        out.append(msg)
    return out


def fit_history(ctx: S.ServerContext, messages: list[dict], template: str | None = None) -> list[dict]:
    """Earlier tool calls and results made fit for the model's template (engine.server.openai.tools.fit_history)."""
    if not any("tool_calls" in m or "tool_call_id" in m for m in messages):
        return messages
    return T.fit_history(messages, template if template is not None else _template(ctx, False))


def _template(ctx: S.ServerContext, with_tools: bool) -> str | None:
    """The chat template this request is rendered with (None: the client has no tokenizer of its own, or the
    model no template; the normal path then says so)."""
    tok = ctx.client.tokenizer
    if tok is None:
        return None
    try:
        return tok.get_chat_template(None, tools=[{}] if with_tools else None)
    except KestrelError:
        return None


async def _render_with_tools(ctx: S.ServerContext, messages: list[dict], tools: list[dict]) -> list[int]:
    """The prompt's ids with the tools rendered by the model's template (on a worker thread: templates are
    Python, tokenizing a long conversation takes a while)."""
    tok = ctx.client.tokenizer
    try:
        return await asyncio.to_thread(tok.apply_chat_template, messages, True, True, tools=tools)
    except KestrelError:
        raise
    except Exception as e:  # noqa: BLE001 - typed for the caller
        raise as_request_error(e, "Internal error while applying the chat template") from None


async def create_chat_completion(ctx: S.ServerContext, req: ChatCompletionRequest, raw: Request) -> Response:
    ctx.check_model(req.model)
    check_fields(req)
    messages = convert_messages(req.messages)
    extra = req.model_extra or {}
    template = _template(ctx, bool(extra.get("tools")))
    plan = T.plan_tools(extra, template, ctx.info.architecture)
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise InvalidRequestError("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
        if not 0 <= req.top_logprobs <= 20:
            raise InvalidRequestError("Invalid value for 'top_logprobs': must be in [0, 20].", param="top_logprobs")
    top_n = (req.top_logprobs or 0) if req.logprobs else 0
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    params = S.sampling_params(ctx, req, max_tokens=max_tokens, max_tokens_name=name,
                               logprobs=top_n if req.logprobs else None)
    messages = fit_history(ctx, messages, template)
    prompt: dict[str, Any] = {"messages": messages}
    if plan is not None:
        if plan.structured is not None:
            params.structured = plan.structured
        if plan.offered:
            prompt = {"prompt_token_ids": await _render_with_tools(ctx, messages, plan.tools)}
        elif plan.choice in ("required", "named"):
            prompt = {"messages": T.with_tool_hint(messages, plan)}
        if not plan.parses:
            plan = None
    if req.logprobs:
        await ctx.token_tables()
    streams = await S.start_streams(ctx.client, [prompt], params)
    rid = S.new_id("chatcmpl")
    model = ctx.response_model(req.model)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return S.SSEResponse(_stream(ctx, streams, params.n, rid, model, bool(req.logprobs), top_n, include_usage,
                                     plan), on_close=lambda: S.abort_all(streams))
    return await S.until_disconnect(raw, _full(ctx, streams, params.n, rid, model, bool(req.logprobs), top_n, plan))


def _message(text: str, finish_reason: str | None, plan: T.ToolPlan | None) -> tuple[dict, str | None]:
    """A choice's whole output -> its assistant message (with tool_calls where the output holds calls) and
    finish_reason ("tool_calls" for calls that ended normally)."""
    if plan is None:
        return {"role": "assistant", "content": text}, finish_reason
    if plan.choice == "named":
        content, calls = None, [ToolCall(plan.name, text)]
    else:
        content, calls = parse_tool_calls(text, plan.fmt, plan.max_calls)
    if not calls:
        return {"role": "assistant", "content": content}, finish_reason
    message = {"role": "assistant", "content": content, "tool_calls": [c.openai() for c in calls]}
    return message, ("tool_calls" if finish_reason == "stop" else finish_reason)


async def _full(ctx, streams, n, rid, model, logprobs: bool, top_n: int,
                plan: T.ToolPlan | None = None) -> Response:
    gathered, cached = await S.collect(streams, n, n)
    choices = []
    for i, c in enumerate(gathered):
        message, finish = _message("".join(c.text), c.finish_reason, plan)
        choices.append({"index": i, "message": message,
                        "logprobs": {"content": S.chat_logprobs(ctx, c.logprobs, top_n)} if logprobs else None,
                        "finish_reason": finish, "stop_reason": c.stop_reason})
    body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": S.usage(streams, sum(c.output_tokens for c in gathered), cached)}
    return Response(S.encode_json(body), media_type="application/json")


class _ToolDeltas:
    """One choice's output as OpenAI chat deltas: content, and per call a delta with its index, id, type and name
    followed by its arguments (a named function's arguments stream as the model writes them)."""

    def __init__(self, plan: T.ToolPlan) -> None:
        self.named = plan.name if plan.choice == "named" else None
        self.parser = None if self.named else ToolCallStream(plan.fmt, plan.max_calls)
        self.calls = 0

    def _head(self, call_id: str, name: str) -> dict:
        return {"tool_calls": [{"index": self.calls, "id": call_id, "type": "function",
                                "function": {"name": name, "arguments": ""}}]}

    def _args(self, index: int, text: str) -> dict:
        return {"tool_calls": [{"index": index, "function": {"arguments": text}}]}

    def deltas(self, text: str, finished: bool) -> list[dict]:
        out: list[dict] = []
        if self.named is not None:
            if self.calls == 0:
                out.append(self._head(new_call_id(), self.named))
                self.calls = 1
            if text:
                out.append(self._args(0, text))
            return out
        events = self.parser.feed(text) if text else []
        if finished:
            events += self.parser.finish()
        for e in events:
            if isinstance(e, str):
                out.append({"content": e})
            else:
                out.append(self._head(e.id, e.name))
                out.append(self._args(self.calls, e.arguments))
                self.calls += 1
        return out


async def _stream(ctx, streams, n, rid, model, logprobs: bool, top_n: int, include_usage: bool,
                  plan: T.ToolPlan | None = None):
    created = int(time.time())
    enc = S.encode_json
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    if include_usage:
        head["usage"] = None
    tool_deltas = [_ToolDeltas(plan) for _ in range(n)] if plan is not None else None

    def event(choice: dict) -> bytes:
        return b"data: " + enc({**head, "choices": [choice]}) + b"\n\n"

    completion_tokens = 0
    cached = 0
    try:
        yield b"".join(event({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}) for i in range(n))
        async for batch in S.batches(streams, n):
            out = []
            for i, m in S.merge_by_choice(batch).items():
                text, lps, last = m.text, m.logprobs, m.last
                if tool_deltas is not None:
                    out.extend(_tool_events(ctx, event, tool_deltas[i], i, m, logprobs, top_n))
                    if last.finished:
                        completion_tokens += last.num_output_tokens
                        cached = max(cached, last.num_cached_tokens)
                    continue
                if not last.finished and not text and not (logprobs and lps):
                    continue
                choice = {"index": i, "delta": {"content": text} if text or not last.finished else {},
                          "logprobs": {"content": S.chat_logprobs(ctx, lps or [], top_n)} if logprobs else None,
                          "finish_reason": last.finish_reason if last.finished else None}
                if last.finished:
                    choice["stop_reason"] = last.stop_reason
                    completion_tokens += last.num_output_tokens
                    cached = max(cached, last.num_cached_tokens)
                out.append(event(choice))
            if out:
                yield b"".join(out)
        if include_usage:
            yield b"data: " + enc({**head, "choices": [], "usage": S.usage(streams, completion_tokens, cached)}) \
                + b"\n\n"
        yield b"data: [DONE]\n\n"
    except Exception as e:
        yield S.sse_error(e)
    finally:
        S.abort_all(streams)


def _tool_events(ctx, event, td: _ToolDeltas, i: int, m: S.Merged, logprobs: bool, top_n: int) -> list[bytes]:
    """The SSE events of one choice's merged deltas when tools are in play: the logprobs ride on the first event,
    the finish_reason ("tool_calls" once a call was returned and the output ended normally) on the last."""
    last = m.last
    deltas = td.deltas(m.text, last.finished)
    if logprobs and m.logprobs and not deltas:
        deltas = [{}]
    if last.finished and not deltas:
        deltas = [{}]
    out = []
    for k, delta in enumerate(deltas):
        choice = {"index": i, "delta": delta,
                  "logprobs": ({"content": S.chat_logprobs(ctx, m.logprobs or [], top_n)} if k == 0 else None)
                  if logprobs else None, "finish_reason": None}
        if last.finished and k == len(deltas) - 1:
            reason = last.finish_reason
            choice["finish_reason"] = "tool_calls" if td.calls and reason == "stop" else reason
            choice["stop_reason"] = last.stop_reason
        out.append(event(choice))
    return out
