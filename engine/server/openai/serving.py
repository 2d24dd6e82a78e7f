"""What the chat and completions handlers share: the served-model context, request -> SamplingParams,
streams of several prompts merged, logprobs in OpenAI's shapes, SSE with client-disconnect detection. The
bounds (MAX_*, ranges) are engine.server.openai.limits', importable from here too; the body's list sizes are
checked before parsing by engine.server.openai.body_checks.precheck_body."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.errors import InvalidRequestError, KestrelError
from engine.sampling_params import SamplingParams, StructuredOutput
from engine.server.openai.errors import ModelNotServedError, kestrel_error_parts
from engine.server.openai.limits import (  # noqa: F401 - the handlers read the bounds as serving.MAX_*
    INT64_RANGE,
    MAX_CHOICES,
    MAX_CONTENT_PARTS,
    MAX_DETOKENIZE_TOKENS,
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOKENIZE_CONTEXTS,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
    check_count,
)
from engine.tokenizer.grammar import parse_spec, structured_outputs_spec

if TYPE_CHECKING:
    from engine.frontend.client import EngineClient, RequestStream
    from engine.metrics import PrometheusMetrics
    from engine.wire import RequestDelta

_json = msgspec.json.Encoder()


@dataclass
class ServerContext:
    client: EngineClient
    served_model_names: list[str]
    metrics: PrometheusMetrics | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    chat_template: str | None = None  # --chat-template: replaces the model's (engine.server.openai.serving_chat)
    tool_call_parser: str | None = None  # --tool-call-parser: the call format of a template that takes tools
    _token_strs: list[str] | None = None
    _token_bytes: list[bytes] | None = None

    @property
    def info(self):
        return self.client.info

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names:
            raise ModelNotServedError(model, self.served_model_names)

    def response_model(self, model: str | None) -> str:
        return model or self.served_model_names[0]

    async def token_tables(self) -> tuple[list[str], list[bytes]]:
        if self._token_strs is None:
            tb = await self.client.token_bytes()
            self._token_bytes = tb
            self._token_strs = [b.decode("utf-8", "replace") for b in tb]
        return self._token_strs, self._token_bytes


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def encode_json(obj: Any) -> bytes:
    return _json.encode(obj)


# ------------------------------------------------------------------------------------------------
# request -> SamplingParams


def _check_int(name: str, value: int | None, lo: int = INT64_RANGE[0], hi: int = INT64_RANGE[1]) -> None:
    if value is not None and not lo <= value <= hi:
        raise InvalidRequestError(f"Invalid value for '{name}': must be in [{lo}, {hi}].", param=name)


def _check_float(name: str, value: float | None, lo: float, hi: float, lo_open: bool = False) -> None:
    if value is None:
        return
    if not (lo < value <= hi if lo_open else lo <= value <= hi):
        lo_s = f"({lo:g}" if lo_open else f"[{lo:g}"
        raise InvalidRequestError(f"Invalid value for '{name}': {value:g} is not in {lo_s}, {hi:g}].", param=name)


def _bad_format(what: str, param: str = "response_format") -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {what}.", param=param)


def structured_output(req) -> StructuredOutput | None:
    """``response_format`` ({"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
    "strict"}}; llama.cpp's {"type": "json_object", "schema": {...}} is the schema's) or vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` -> the engine's StructuredOutput
    (at most one of them). The grammar is compiled by the engine: a schema or regex its compiler refuses comes
    back as a 400 naming the reason."""
    extra = req.model_extra or {}
    found: list[StructuredOutput] = []
    rf = extra.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
            raise _bad_format("an object with a 'type' (text, json_object or json_schema)")
        kind = rf["type"]
        if kind == "json_object":  # llama.cpp's form (what instructor sends) may carry a schema: enforce it
            schema = rf.get("schema")
            if schema is None:
                found.append(StructuredOutput("json"))
            elif not isinstance(schema, (dict, bool)):
                raise _bad_format("'schema' must be a JSON Schema object")
            else:
                found.append(StructuredOutput("json_schema", encode_json(schema).decode()))
        elif kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                raise _bad_format("type json_schema needs a 'json_schema' object with a 'schema'")
            schema = js.get("schema", {})
            if not isinstance(schema, (dict, bool)):
                raise _bad_format("'json_schema.schema' must be a JSON Schema object")
            found.append(StructuredOutput("json_schema", encode_json(schema).decode()))
        elif kind != "text":
            raise _bad_format(f"unknown type {kind!r} (text, json_object or json_schema)")
    gj = extra.get("guided_json")
    if gj is not None:
        if isinstance(gj, str):
            try:
                gj = msgspec.json.decode(gj)
            except msgspec.DecodeError:
                raise _bad_format("not valid JSON", "guided_json") from None
        if not isinstance(gj, (dict, bool)):
            raise _bad_format("a JSON Schema object", "guided_json")
        found.append(StructuredOutput("json_schema", encode_json(gj).decode()))
    for name, kind in (("guided_regex", "regex"), ("guided_choice", "choice"), ("guided_grammar", "grammar")):
        if extra.get(name) is not None:
            found.append(parse_spec(kind, extra[name]))
    so = structured_outputs_spec(extra.get("structured_outputs"))  # vLLM's newer form of the guided_* fields
    if so is not None:
        found.append(so)
    if len(found) > 1:
        raise InvalidRequestError("Only one of 'response_format', 'guided_json', 'guided_regex', 'guided_choice', "
                                  "'guided_grammar' and 'structured_outputs' may constrain the output.",
                                  param="response_format")
    return found[0] if found else None


def sampling_params(ctx: ServerContext, req, *, max_tokens: int | None, max_tokens_name: str,
                    logprobs: int | None) -> SamplingParams:
    gen = ctx.info.generation_config or {}
    vocab = ctx.info.vocab_size

    def pick(value, key: str, default):
        if value is not None:
            return value
        v = gen.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else default

    n = 1 if req.n is None else req.n
    _check_int("n", n, 1, MAX_N)
    _check_float("temperature", req.temperature, *TEMPERATURE_RANGE)
    _check_float("top_p", req.top_p, 0.0, 1.0, lo_open=True)
    _check_float("min_p", req.min_p, 0.0, 1.0)
    _check_float("presence_penalty", req.presence_penalty, -2.0, 2.0)
    _check_float("frequency_penalty", req.frequency_penalty, -2.0, 2.0)
    _check_float("repetition_penalty", req.repetition_penalty, 0.0, REPETITION_PENALTY_MAX, lo_open=True)
    stop_in = [req.stop] if isinstance(req.stop, str) else req.stop
    check_count("stop", stop_in, MAX_STOP_STRINGS)
    if stop_in and any(len(x) > MAX_STOP_CHARS for x in stop_in):
        raise InvalidRequestError(f"Invalid value for 'stop': a stop string is longer than {MAX_STOP_CHARS} "
                                  "characters.", param="stop")
    check_count("stop_token_ids", req.stop_token_ids, MAX_STOP_TOKEN_IDS)
    check_count("logit_bias", req.logit_bias, MAX_LOGIT_BIAS)
    _check_int(max_tokens_name, max_tokens, 1, INT64_RANGE[1])
    if max_tokens is not None and max_tokens > ctx.info.max_model_len:
        raise InvalidRequestError(
            f"Invalid value for '{max_tokens_name}': {max_tokens} is more than the model's context length "
            f"({ctx.info.max_model_len} tokens).", param=max_tokens_name)
    min_tokens = req.min_tokens or 0
    _check_int("min_tokens", min_tokens, 0, ctx.info.max_model_len)
    _check_int("seed", req.seed, INT64_RANGE[0], INT64_RANGE[1] - n)
    top_k = pick(req.top_k, "top_k", 0)
    _check_int("top_k", top_k, -1, INT64_RANGE[1])
    if top_k >= vocab > 0:
        top_k = 0  # keeps every token: the same as no top-k
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    stop_ids = list(req.stop_token_ids or [])
    for t in stop_ids:
        if not 0 <= t < vocab:
            raise InvalidRequestError(f"Invalid value in 'stop_token_ids': token id {t} is out of the vocabulary "
                                      f"(0..{vocab - 1}).", param="stop_token_ids")
    bias = None
    if req.logit_bias:
        bias = {}
        for k, v in req.logit_bias.items():
            if not (k.isascii() and k.isdigit()):  # int() would take " 5", "5_0" (50) and "٣" (3)
                raise InvalidRequestError(f"Invalid key in 'logit_bias': {k!r} is not a token id (ASCII digits "
                                          "only, such as \"50256\").", param="logit_bias")
            tid = int(k)
            if not 0 <= tid < vocab:
                raise InvalidRequestError(f"Invalid key in 'logit_bias': token id {tid} is out of the "
                                          f"vocabulary (0..{vocab - 1}).", param="logit_bias")
            bias[tid] = v
    return SamplingParams(
        n=n, max_tokens=max_tokens, min_tokens=min_tokens,
        temperature=float(pick(req.temperature, "temperature", 1.0)),
        top_p=float(pick(req.top_p, "top_p", 1.0)), top_k=int(top_k),
        min_p=float(pick(req.min_p, "min_p", 0.0)),
        repetition_penalty=float(pick(req.repetition_penalty, "repetition_penalty", 1.0)),
        presence_penalty=float(req.presence_penalty or 0.0), frequency_penalty=float(req.frequency_penalty or 0.0),
        seed=req.seed, stop=stop, stop_token_ids=stop_ids, ignore_eos=bool(req.ignore_eos), logprobs=logprobs,
        logit_bias=bias, include_stop_str_in_output=bool(req.include_stop_str_in_output),
        skip_special_tokens=req.skip_special_tokens is not False, structured=structured_output(req))


def check_text(value: str, param: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"'{param}' is not valid Unicode text (it holds a lone surrogate).",
                                  param=param) from None


# ------------------------------------------------------------------------------------------------
# streams


async def start_streams(client: EngineClient, prompts: list[dict], params: SamplingParams,
                        raw: Request | None = None) -> list[RequestStream]:
    """One engine request per prompt (keyword arguments of add_request); waits until the engine has
    accepted them all, so a refusal (prompt too long, ...) becomes an error response, not a broken stream.
    With ``raw``: a client that disconnects meanwhile stops the work (a long prompt's chunked tokenizing
    included) and gets ClientGone."""
    if raw is not None:
        return await unless_disconnected(raw, start_streams(client, prompts, params))
    streams: list[RequestStream] = []
    try:
        for p in prompts:
            streams.append(await client.add_request(params=params, **p))
        for s in streams:
            await s.accepted()
    except BaseException:
        for s in streams:
            s.abort()
        raise
    return streams


async def batches(streams: list[RequestStream], n: int) -> AsyncIterator[list[RequestDelta]]:
    """Deltas of all streams as they come, in batches; ``d.index`` becomes the choice index
    (prompt number x n + sample)."""
    if len(streams) == 1:
        s = streams[0]
        while batch := await s.next_batch():
            yield batch
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            while batch := await s.next_batch():
                if i:
                    for d in batch:
                        d.index += i * n
                queue.put_nowait(batch)
        except BaseException as e:
            queue.put_nowait(e)
            return
        queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            out: list = []
            while True:
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    out.extend(item)
                if queue.empty():
                    break
                item = queue.get_nowait()
            if out:
                yield out
    finally:
        for t in tasks:
            t.cancel()


def abort_all(streams: list[RequestStream]) -> None:
    for s in streams:
        s.abort()


@dataclass
class Merged:
    text: str
    logprobs: list | None
    last: RequestDelta  # the choice's latest delta: its finish state


def merge_by_choice(batch: list[RequestDelta]) -> dict[int, Merged]:
    """One entry per choice of a batch of deltas (texts and logprobs joined), for one SSE event each."""
    merged: dict[int, Merged] = {}
    for d in batch:
        m = merged.get(d.index)
        if m is None:
            merged[d.index] = Merged(d.text, list(d.logprobs) if d.logprobs else None, d)
        else:
            m.text += d.text
            if d.logprobs:
                m.logprobs = (m.logprobs or []) + list(d.logprobs)
            m.last = d
    return merged


@dataclass
class Choice:
    """One choice of a non-streamed response, gathered from its deltas."""
    text: list[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    output_tokens: int = 0
    prompt_logprobs: list | None = None  # the prompt's (SamplingParams.prompt_logprobs: /v1/completions' echo)


async def collect(streams: list[RequestStream], n: int, n_choices: int) -> tuple[list[Choice], int]:
    """Runs the streams to the end; returns the choices and the number of prompt tokens served from the
    prefix cache. The streams are aborted however this ends (a client gone, an engine error)."""
    choices = [Choice() for _ in range(n_choices)]
    cached = 0
    try:
        async for batch in batches(streams, n):
            for d in batch:
                c = choices[d.index]
                if d.text:
                    c.text.append(d.text)
                if d.logprobs:
                    c.logprobs.extend(d.logprobs)
                if d.prompt_logprobs:
                    c.prompt_logprobs = d.prompt_logprobs
                if d.finished:
                    c.finish_reason, c.stop_reason, c.output_tokens = d.finish_reason, d.stop_reason, \
                        d.num_output_tokens
                    cached = max(cached, d.num_cached_tokens)
    finally:
        abort_all(streams)
    return choices, cached


# ------------------------------------------------------------------------------------------------
# logprobs


def chat_logprobs(ctx: ServerContext, lps, top_n: int) -> list[dict]:
    strs, bts = ctx._token_strs, ctx._token_bytes
    out = []
    for lp in lps:
        tops = [{"token": strs[t], "logprob": v, "bytes": list(bts[t])} for t, v in lp.top[:top_n]]
        out.append({"token": strs[lp.token_id], "logprob": lp.logprob, "bytes": list(bts[lp.token_id]),
                    "top_logprobs": tops})
    return out


def completion_logprobs(ctx: ServerContext, lps, top_n: int, offset: int) -> tuple[dict, int]:
    strs = ctx._token_strs
    tokens, values, tops, offsets = [], [], [], []
    for lp in lps:
        s = strs[lp.token_id]
        tokens.append(s)
        values.append(lp.logprob)
        top = {strs[t]: v for t, v in lp.top[:top_n]}
        top.setdefault(s, lp.logprob)
        tops.append(top)
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}, offset


# ------------------------------------------------------------------------------------------------
# responses


def usage(streams: list[RequestStream], completion_tokens: int, cached: int) -> dict:
    prompt = sum(s.num_prompt_tokens or 0 for s in streams)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}


def sse_error(err: BaseException) -> bytes:
    if isinstance(err, KestrelError):
        _, body = kestrel_error_parts(err)
    else:
        body = {"error": {"message": f"Internal server error ({type(err).__name__}).", "type": "internal_error",
                          "param": None, "code": None}}
    return b"data: " + encode_json(body) + b"\n\ndata: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """Server-sent events that stop (and so abort the engine request, through the body iterator's
    cleanup) as soon as the client disconnects, whatever the ASGI server's spec version: uvicorn's h11
    protocol drops writes to a closed connection silently, so waiting for a failed write is not enough."""

    media_type = "text/event-stream"

    def __init__(self, content, on_close=None, **kw):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, headers=headers, **kw)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    finally:
                        tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.on_close is not None:
                self.on_close()


class ClientGone(KestrelError):
    """The client disconnected before its answer was ready (nginx's 499: nobody reads it)."""

    status_code = 499
    error_type = "client_closed_request"


async def until_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """Run ``work``; if the client disconnects first, cancel it (its cleanup aborts the engine requests)."""
    try:
        return await unless_disconnected(request, work)
    except ClientGone:
        return Response(status_code=499)


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled and ClientGone raised."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    raise ClientGone("The client disconnected.")
