"""The FastAPI app of the OpenAI-compatible server, built around a running EngineClient (the GUI's own
client can be passed in: one loaded model serves both).

Routes: GET /v1/models, /v1/models/{id}, /v1/server_info (model, dtype, quantization, TP, comm strategy and auto's
start-up all-reduce table, engine options, the host's CPU / GPUs / driver / PCIe topology: for benchmark
reports); POST /v1/chat/completions, /v1/completions (streaming or not), /v1/embeddings; POST /tokenize,
/detokenize; GET /health, /version, /metrics (Prometheus); the schema at /openapi.json.
Safety: with an API key every /v1 route (and /tokenize, /detokenize) needs ``Authorization: Bearer KEY``,
compared in constant time, and /metrics without it shows only whether the engine is up (no model name, no
traffic); CORS only for the origins given; request bodies over ``max_request_bytes`` get 413, bodies that
stall for ``body_timeout`` seconds 408; with ``allowed_hosts`` (a list, even empty) only loopback Host names
and those are answered (engine.server.guard.HostCheckMiddleware). Neither the schema nor any open route shows
the model's path.
While the engine restarts (engine.frontend.client.RestartPolicy) or after it died, /health says so (503, "restarting"
or "dead", with the restarts so far), /v1/models answers 503 like every generation route, and /metrics
reports kestrel_engine_healthy 0 and kestrel_engine_restarts_total.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import engine
from engine.frontend.client import EngineClient
from engine.errors import (
    EngineDeadError,
    EngineRestartingError,
    EngineShuttingDownError,
    InvalidRequestError,
    KestrelError,
    PromptTooLongError,
)
from engine.host_info import host_hardware
from engine.metrics import PrometheusMetrics
from engine.server.args import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_REQUEST_BYTES
from engine.server.guard import HostCheckMiddleware
from engine.server.memory import return_large_blocks
from engine.server.openai import errors, protocol
from engine.server.openai.body_checks import PRECHECKED_PATHS, check_json_body, precheck_body
from engine.server.openai import serving as S
from engine.server.openai.serving_chat import chat_prompt, convert_messages, create_chat_completion, tool_mode_of
from engine.server.openai.serving_completions import create_completion
from engine.server.openai.serving_embeddings import create_embedding
from engine.server.openai.protocol_responses import ResponseObject, ResponsesRequest
from engine.server.openai.serving_responses import create_response

log = logging.getLogger(__name__)

_PROTECTED = ("/v1/", "/tokenize", "/detokenize")


def bearer_ok(auth: bytes | None, key: bytes) -> bool:
    """``Authorization: Bearer KEY``, the key compared in constant time."""
    scheme, _, token = (auth or b"").partition(b" ")
    return hmac.compare_digest(token.strip(), key) and scheme.lower() == b"bearer"


class APIKeyMiddleware:
    """401 unless ``Authorization: Bearer KEY`` (constant-time comparison) on the protected routes."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.key = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"].startswith(_PROTECTED):
            auth = b""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    auth = value
                    break
            if not bearer_ok(auth, self.key):
                msg = ("Missing API key: send 'Authorization: Bearer <key>'." if not auth
                       else "Incorrect API key provided.")
                resp = errors.error_response(401, msg, "invalid_request_error", None, "invalid_api_key",
                                             headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


BODY_CHECK_INLINE_BYTES = 1 << 20


class BodyLimitMiddleware:
    """413 for a body over the limit: by Content-Length up front, else while it is read. 408 (and the
    connection closed) when the body stalls for ``timeout`` seconds or takes more than four times that in all:
    a client cannot hold a connection open by sending its body a byte at a time. A POST's body is read here
    whole and refused (400) before anything parses it when it nests too deep or holds an unpaired surrogate
    (``body_checks.check_json_body``); for the routes that take lists (``body_checks.PRECHECKED_PATHS``)
    ``precheck(path, body)`` may refuse it too (a KestrelError); then it is handed on as it came."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float = DEFAULT_BODY_TIMEOUT_S, precheck=None):
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.precheck = precheck

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    too_big = int(value) > self.limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(scope, receive, send, 413, f"Request body larger than {self.limit} bytes.")
                    return
                break
        seen = 0
        done = False
        deadline = asyncio.get_running_loop().time() + 4 * self.timeout

        async def limited() -> Message:
            nonlocal seen, done
            if done:  # after the body only a disconnect can come: wait for it as long as it takes
                return await receive()
            wait = min(self.timeout, deadline - asyncio.get_running_loop().time())
            try:
                msg = await asyncio.wait_for(receive(), max(wait, 0.001))
            except asyncio.TimeoutError:
                raise HTTPException(408, f"The request body was not received in time (it stalled for "
                                         f"{self.timeout:g} s or took over {4 * self.timeout:g} s).",
                                    headers={"Connection": "close"}) from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, f"Request body larger than {self.limit} bytes.")
                if not msg.get("more_body", False):
                    done = True
            else:
                done = True
            return msg

        if scope["method"] != "POST":
            await self.app(scope, limited, send)
            return
        chunks = []
        try:
            while True:
                msg = await limited()
                if msg["type"] != "http.request":
                    return  # the client left while sending
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body", False):
                    break
        except HTTPException as e:
            await self._reject(scope, receive, send, e.status_code, str(e.detail), close=e.status_code == 408)
            return
        body = b"".join(chunks)
        del chunks
        try:
            if len(body) > BODY_CHECK_INLINE_BYTES:  # ~0.1 s a 10 MB body: off the event loop, the streams go on
                await asyncio.to_thread(check_json_body, body)
            else:
                check_json_body(body)
            if self.precheck is not None and scope["path"] in PRECHECKED_PATHS:
                self.precheck(scope["path"], body)
        except KestrelError as e:
            await errors.kestrel_error_response(e)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed, body
            if not replayed:
                replayed = True
                out, body = body, b""
                return {"type": "http.request", "body": out, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _reject(scope: Scope, receive: Receive, send: Send, status: int, message: str,
                      close: bool = True) -> None:
        resp = errors.error_response(status, message, headers={"Connection": "close"} if close else None)
        await resp(scope, receive, send)


def build_app(client: EngineClient, *, served_model_names: list[str] | None = None, api_key: str | None = None,
              allowed_origins: list[str] | None = None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
              allowed_hosts: list[str] | None = None, body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
              chat_template: str | None = None, tool_call_parser: str | None = None) -> FastAPI:
    return_large_blocks()  # 10 MiB bodies refused 15 times: RSS flat instead of +90 MiB (engine/server/memory.py)
    info = client.info
    names = list(served_model_names or []) or [info.name]
    metrics = PrometheusMetrics(names[0])
    client.add_listener(metrics.observe)
    ctx = S.ServerContext(client, names, metrics, chat_template=chat_template, tool_call_parser=tool_call_parser)
    app = FastAPI(title="Kestrel OpenAI-compatible API", version=engine.__version__,
                  description="An OpenAI-compatible API served by Kestrel (GET /v1/models lists the model).")
    app.state.ctx = ctx
    errors.install(app)
    key = api_key.encode("utf-8") if api_key else None

    def authorized(raw: Request) -> bool:
        return key is None or bearer_ok(raw.headers.get("authorization", "").encode("latin-1"), key)

    err = {"model": protocol.ErrorResponse}
    common = {400: err, 401: err, 404: err, 422: err, 503: err}

    def card(name: str) -> dict:
        i = ctx.info
        return {"id": name, "object": "model", "created": ctx.created, "owned_by": "kestrel", "root": i.name,
                "max_model_len": i.max_model_len}

    @app.get("/v1/models", response_model=protocol.ModelList, responses={401: err, 503: err})
    async def list_models() -> dict:
        await client.health()  # while the engine is down, no model is served: 503 saying why
        return {"object": "list", "data": [card(n) for n in names]}

    @app.get("/v1/models/{model_id:path}", response_model=protocol.ModelCard, responses={401: err, 404: err, 503: err})
    async def retrieve_model(model_id: str) -> dict:
        ctx.check_model(model_id)
        await client.health()
        return card(model_id)

    @app.post("/v1/chat/completions", response_model=None,
              responses={200: {"model": protocol.ChatCompletionResponse,
                               "content": {"text/event-stream": {}}}, **common})
    async def chat_completions(req: protocol.ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(ctx, req, raw)

    @app.post("/v1/completions", response_model=None,
              responses={200: {"model": protocol.CompletionResponse,
                               "content": {"text/event-stream": {}}}, **common})
    async def completions(req: protocol.CompletionRequest, raw: Request) -> Response:
        return await create_completion(ctx, req, raw)

    @app.post("/v1/embeddings", response_model=protocol.EmbeddingResponse, responses=common)
    async def embeddings(req: protocol.EmbeddingRequest, raw: Request) -> Response:
        return await create_embedding(ctx, req, raw)

    @app.post("/v1/responses", response_model=None,
              responses={200: {"model": ResponseObject, "content": {"text/event-stream": {}}}, **common})
    async def responses(req: ResponsesRequest, raw: Request) -> Response:
        return await create_response(ctx, req, raw)

    @app.post("/tokenize", response_model=protocol.TokenizeResponse, responses=common)
    async def tokenize(req: protocol.TokenizeRequest) -> dict:
        ctx.check_model(req.model)
        protocol.check_fields(req)
        if (req.prompt is None) == (req.messages is None):
            raise InvalidRequestError("Give either 'prompt' or 'messages'.", param="prompt")
        limit = S.MAX_TOKENIZE_CONTEXTS * ctx.info.max_model_len
        ids = None
        if req.messages is not None:  # the prompt the chat route would send: tools, template variables included
            prompt, _ = await chat_prompt(ctx, convert_messages(req.messages), dict(req.model_extra or {}),
                                          add_generation_prompt=req.add_generation_prompt is not False)
            ids = prompt.get("prompt_token_ids")
            text = "" if ids is not None else await client.apply_chat_template(
                prompt["messages"], add_generation_prompt=req.add_generation_prompt is not False)
            special = False
        else:
            S.check_text(req.prompt, "prompt")
            text, special = req.prompt, req.add_special_tokens is not False
        at_least = client.prompt_lower_bound(text)
        try:
            if at_least > limit:
                raise PromptTooLongError(at_least, ctx.info.max_model_len, at_least=True)
            if ids is None:  # counted in chunks first: a text surely over the limit is not tokenized whole
                ids = await client.tokenize(text, add_special_tokens=special, most=limit)
        except PromptTooLongError as err:
            err.args = (f"/tokenize counts texts of up to {S.MAX_TOKENIZE_CONTEXTS} context lengths ({limit} "
                        f"tokens; this model's context is {ctx.info.max_model_len} tokens), and this one has at "
                        f"least {err.prompt_len} tokens. Count a shorter text.",)
            raise
        return {"tokens": ids, "count": len(ids), "max_model_len": ctx.info.max_model_len}

    @app.post("/detokenize", response_model=protocol.DetokenizeResponse, responses=common)
    async def detokenize(req: protocol.DetokenizeRequest) -> dict:
        ctx.check_model(req.model)
        protocol.check_fields(req)
        if len(req.tokens) > S.MAX_DETOKENIZE_TOKENS:
            raise InvalidRequestError(f"Too many tokens: at most {S.MAX_DETOKENIZE_TOKENS} per request.",
                                      param="tokens")
        vocab = ctx.info.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"Token id {bad} is out of the vocabulary (0..{vocab - 1}).",
                                      param="tokens")
        return {"prompt": await client.detokenize(req.tokens)}

    @app.get("/health", response_model=protocol.HealthResponse, responses={503: {"model": protocol.HealthResponse}})
    async def health(raw: Request) -> Response:
        restarts = int(getattr(client, "restarts", 0) or 0)
        try:
            await client.health()
        except EngineShuttingDownError as e:
            status, reason = "shutting_down", str(e)
        except EngineDeadError as e:
            announced = getattr(client, "state", None) == "restarting"  # the supervisor's detail says when
            status = "restarting" if announced or isinstance(e, EngineRestartingError) else "dead"
            reason = (getattr(client, "state_detail", None) if announced else None) or str(e)
        else:
            return JSONResponse({"status": "ok", "reason": None, "restarts": restarts})
        if not authorized(raw):
            reason = None  # why it died may name files: for the key's holders only
        headers = {"Retry-After": "5"} if status == "restarting" else None
        return JSONResponse({"status": status, "reason": reason, "restarts": restarts}, 503, headers=headers)

    hardware: dict = {}

    @app.get("/v1/server_info", response_model=protocol.ServerInfo, responses={401: err})
    async def server_info() -> dict:
        if not hardware:
            hardware.update(await asyncio.to_thread(host_hardware))  # NVML: once, off the loop
        i, cfg = ctx.info, getattr(client, "config", None)
        opts = ("quantization", "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
                "num_threads", "deterministic")  # quantization: the load option (--quantization), not the checkpoint's
        engine_config = {k: getattr(cfg, k) for k in opts if cfg is not None and hasattr(cfg, k)}
        if "quantization" in engine_config:  # auto with what it resolved to: "auto (Q4_1 blocks kept)"
            engine_config["quantization"] = i.quantization_text(engine_config["quantization"])
        tp = int(i.tensor_parallel_size or 1)
        table = None
        if tp > 1 and client.is_alive:  # auto's start-up measurements, kept in the engine's stats
            try:
                table = (await asyncio.wait_for(client.stats(recent=1), 10)).comm_table
            except (asyncio.TimeoutError, EngineDeadError):
                table = None
        return {"engine": "kestrel", "version": engine.__version__, "served_model_names": names, "model": i.name,
                "architecture": i.architecture, "format": i.format, "quantization": i.quantization,
                "dtype": i.dtype, "device": i.device, "max_model_len": i.max_model_len, "vocab_size": i.vocab_size,
                "num_kv_blocks": i.num_kv_blocks, "block_size": i.block_size, "tensor_parallel_size": tp,
                "comm_strategy": getattr(cfg, "comm_strategy", None) if tp > 1 else None,
                "comm_table": list(table) if table else None,
                "engine_config": engine_config, "host": hardware, "tools": tool_mode_of(ctx)}

    @app.get("/version", response_model=protocol.VersionResponse)
    async def version() -> dict:
        return {"version": engine.__version__}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus(raw: Request) -> Response:
        if not authorized(raw):
            return Response(PrometheusMetrics.public_page(client.is_alive), media_type=PrometheusMetrics.CONTENT_TYPE)
        stats = None
        if client.is_alive:
            try:
                stats = await asyncio.wait_for(client.stats(), 10)
            except (asyncio.TimeoutError, EngineDeadError):
                stats = None
        metrics.update(stats, healthy=client.is_alive, restarts=int(getattr(client, "restarts", 0) or 0),
                       restarting=getattr(client, "state", None) == "restarting",
                       hangs=int(getattr(client, "hangs", 0) or 0), heartbeat_age=getattr(client, "heartbeat_age", None))
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    app.add_middleware(BodyLimitMiddleware, limit=max_request_bytes, timeout=body_timeout,
                       precheck=lambda path, body: precheck_body(path, body, ctx.info.max_model_len))
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=False)
    if allowed_hosts is not None:
        app.add_middleware(HostCheckMiddleware, extra=list(allowed_hosts))  # outermost: before anything else
    return app
