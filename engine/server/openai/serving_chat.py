"""POST /v1/chat/completions: messages through the model's chat template (applied by the EngineClient, off the
engine's loop, exactly as transformers applies it), streamed as chat.completion.chunk events or returned whole."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import InvalidRequestError
from engine.server.openai import serving as S
from engine.server.openai.protocol import ChatCompletionRequest, ChatMessage, check_fields

_ROLES = {"system", "user", "assistant"}
_REFUSED_MESSAGE_FIELDS = {"tool_calls": "tool calling is not supported",
                           "tool_call_id": "tool calling is not supported",
                           "function_call": "function calling is not supported",
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
            why = "tool calling is not supported" if role in ("tool", "function") else "use system, user or assistant"
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
            if isinstance(v, str):
                S.check_text(v, f"messages[{i}].{k}")
                msg[k] = v  # e.g. reasoning_content: templates may use it, as in transformers
        out.append(msg)
    return out


async def create_chat_completion(ctx: S.ServerContext, req: ChatCompletionRequest, raw: Request) -> Response:
    ctx.check_model(req.model)
    check_fields(req)
    messages = convert_messages(req.messages)
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
    if req.logprobs:
        await ctx.token_tables()
    streams = await S.start_streams(ctx.client, [{"messages": messages}], params)
    rid = S.new_id("chatcmpl")
    model = ctx.response_model(req.model)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return S.SSEResponse(_stream(ctx, streams, params.n, rid, model, bool(req.logprobs), top_n, include_usage),
                             on_close=lambda: S.abort_all(streams))
    return await S.until_disconnect(raw, _full(ctx, streams, params.n, rid, model, bool(req.logprobs), top_n))


async def _full(ctx, streams, n, rid, model, logprobs: bool, top_n: int) -> Response:
    gathered, cached = await S.collect(streams, n, n)
    choices = [{"index": i, "message": {"role": "assistant", "content": "".join(c.text)},
                "logprobs": {"content": S.chat_logprobs(ctx, c.logprobs, top_n)} if logprobs else None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for i, c in enumerate(gathered)]
    body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": S.usage(streams, sum(c.output_tokens for c in gathered), cached)}
    return Response(S.encode_json(body), media_type="application/json")


async def _stream(ctx, streams, n, rid, model, logprobs: bool, top_n: int, include_usage: bool):
    created = int(time.time())
    enc = S.encode_json
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    if include_usage:
        head["usage"] = None

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
