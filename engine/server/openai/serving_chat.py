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
_REFUSED_MESSAGE_FIELDS = {"audio": "audio is not supported"}


def convert_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Plain {role, content} dicts; content parts joined with newlines; the 'developer' role of newer
    OpenAI models read as 'system'. Anything the template cannot take gets a 400 naming it."""
    if not messages:
        raise InvalidRequestError("'messages' must contain at least one message.", param="messages")
    if len(messages) > S.MAX_MESSAGES:
        raise InvalidRequestError(f"Too many messages: {len(messages)}, at most {S.MAX_MESSAGES}.", param="messages")
    out = []
    for i, m in enumerate(messages):
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)  # function: the deprecated form
        if role not in _ROLES:
            why = "use system, user, assistant or tool"
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
            if k == "function_call":  # the deprecated form of one tool call
                if role != "assistant" or not isinstance(v, dict):
                    raise InvalidRequestError(f"Invalid value for messages[{i}].function_call: an assistant "
                                              "message's {\"name\", \"arguments\"}.",
                                              param=f"messages[{i}].function_call")
                k, v = "tool_calls", [{"type": "function", "function": v}]
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
    """The chat template this request is rendered with: the server's ``--chat-template`` where given, else the
    model's (None: the client has no tokenizer of its own, or the model no template; the normal path then says
    so)."""
    if ctx.chat_template is not None:
        return ctx.chat_template
    tok = ctx.client.tokenizer
    if tok is None:
        return None
    try:
        return tok.get_chat_template(None, tools=[{}] if with_tools else None)
    except KestrelError:
        return None


def read_chat_template(path: str | None) -> str | None:
    """``--chat-template FILE``'s text (None without the flag); a file that cannot be read stops the server."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"--chat-template: cannot read {path}: {e.strerror}") from None
    if "{" not in text:
        raise SystemExit(f"--chat-template: {path} is not a Jinja chat template")
    return text


def tool_mode_of(ctx: S.ServerContext) -> dict:
    """What tool_choice "auto" does on the served model (GET /v1/server_info's ``tools``): the chat template's own
    tool support or Kestrel's built-in tool prompt, the parser that reads the calls, and whether a grammar takes
    over once a call opens; ``chat_template``: the model's or the server's ``--chat-template``."""
    mode = T.tool_mode(_template(ctx, True), ctx.info.architecture, ctx.tool_call_parser)
    return {**mode, "chat_template": "model" if ctx.chat_template is None else "--chat-template"}


_RESERVED_TEMPLATE_VARIABLES = {"messages", "tools", "documents", "add_generation_prompt", "chat_template"}


def template_kwargs(extra: dict) -> dict:
    """``chat_template_kwargs`` (vLLM's: variables for the chat template, e.g. Qwen3's ``enable_thinking``)."""
    kw = extra.get("chat_template_kwargs")
    if kw is None:
        return {}
    if not isinstance(kw, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kw):
        raise InvalidRequestError("Invalid value for 'chat_template_kwargs': an object of template variables.",
                                  param="chat_template_kwargs")
    bad = sorted(set(kw) & _RESERVED_TEMPLATE_VARIABLES)
    if bad:
        raise InvalidRequestError(f"Invalid value for 'chat_template_kwargs': {bad[0]!r} is set by the request "
                                  "itself.", param=f"chat_template_kwargs.{bad[0]}")
    return kw


async def _render(ctx: S.ServerContext, messages: list[dict], tools: list[dict] | None, kwargs: dict,
                  add_generation_prompt: bool) -> list[int]:
    """The prompt's ids rendered here (with the tools, template variables or the server's template; on a worker
    thread: templates are Python), then tokenized by the client in bounded chunks: a text surely over
    /tokenize's bound (S.MAX_TOKENIZE_CONTEXTS context lengths) is refused before it is tokenized whole."""
    tok = ctx.client.tokenizer
    try:
        text = await asyncio.to_thread(tok.apply_chat_template, messages, add_generation_prompt, False, tools=tools,
                                       chat_template=ctx.chat_template, **kwargs)
    except KestrelError:
        raise
    except Exception as e:  # noqa: BLE001 - typed for the caller
        raise as_request_error(e, "Internal error while applying the chat template") from None
    return await ctx.client.tokenize(text, add_special_tokens=False,
                                     most=S.MAX_TOKENIZE_CONTEXTS * ctx.info.max_model_len)


async def chat_prompt(ctx: S.ServerContext, messages: list[dict], extra: dict,
                      add_generation_prompt: bool = True) -> tuple[dict[str, Any], T.ToolPlan | None]:
    """The prompt a chat request sends (``{"messages"}`` for the client to render, or ``{"prompt_token_ids"}``
    rendered here: with the tools, template variables or ``--chat-template``) and its ToolPlan. /tokenize counts
    the same prompt."""
    template = _template(ctx, bool(extra.get("tools") or extra.get("functions")))
    plan = T.plan_tools(extra, template, ctx.info.architecture, ctx.tool_call_parser)
    kwargs = template_kwargs(extra)
    messages = fit_history(ctx, messages, template)
    tools = None
    if plan is not None:
        if plan.offered:
            tools = plan.tools
        elif plan.builtin:
            messages = T.with_builtin_tools(messages, plan)
        elif plan.choice in ("required", "named"):
            messages = T.with_tool_hint(messages, plan)
    if ctx.client.tokenizer is not None and (tools or kwargs or ctx.chat_template is not None):
        return {"prompt_token_ids": await _render(ctx, messages, tools, kwargs, add_generation_prompt)}, plan
    return {"messages": messages}, plan


async def create_chat_completion(ctx: S.ServerContext, req: ChatCompletionRequest, raw: Request) -> Response:
    ctx.check_model(req.model)
    check_fields(req)
    messages = convert_messages(req.messages)
    extra = req.model_extra or {}
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
    prompt, plan = await chat_prompt(ctx, messages, extra)
    plan = T.apply_plan(plan, params)
    if req.logprobs:
        await ctx.token_tables()
    streams = await S.start_streams(ctx.client, [prompt], params, raw)
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
        content, calls = parse_tool_calls(text, plan.fmt, plan.max_calls, plan.enforced)
    if not calls:
        return {"role": "assistant", "content": content}, finish_reason
    done = finish_reason == "stop"
    if plan.legacy:  # the deprecated functions form: one function_call
        call = calls[0]
        message = {"role": "assistant", "content": content,
                   "function_call": {"name": call.name, "arguments": call.arguments}}
        return message, ("function_call" if done else finish_reason)
    message = {"role": "assistant", "content": content, "tool_calls": [c.openai() for c in calls]}
    return message, ("tool_calls" if done else finish_reason)


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
        self.parser = None if self.named else ToolCallStream(plan.fmt, plan.max_calls, plan.enforced)
        self.legacy = plan.legacy
        self.calls = 0

    @property
    def finish_reason(self) -> str:
        return "function_call" if self.legacy else "tool_calls"

    def _head(self, call_id: str, name: str) -> dict:
        if self.legacy:
            return {"function_call": {"name": name, "arguments": ""}}
        return {"tool_calls": [{"index": self.calls, "id": call_id, "type": "function",
                                "function": {"name": name, "arguments": ""}}]}

    def _args(self, index: int, text: str) -> dict:
        if self.legacy:
            return {"function_call": {"arguments": text}}
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
            choice["finish_reason"] = td.finish_reason if td.calls and reason == "stop" else reason
            choice["stop_reason"] = last.stop_reason
        out.append(event(choice))
    return out
