"""The FastAPI app of the OpenAI-compatible server, built around a running EngineClient (the GUI's own
client can be passed in: one loaded model serves both).

Routes: GET /v1/models; POST /v1/chat/completions, /v1/completions (streaming or not); POST /tokenize,
/detokenize; GET /health, /version, /metrics (Prometheus); the schema at /openapi.json.
Safety: with an API key every /v1 route (and /tokenize, /detokenize) needs ``Authorization: Bearer KEY``,
compared in constant time; CORS only for the origins given; request bodies over ``max_request_bytes`` get 413.
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
from engine.client import EngineClient
from engine.errors import EngineDeadError, EngineShuttingDownError, InvalidRequestError
from engine.metrics import PrometheusMetrics
from engine.server.args import DEFAULT_MAX_REQUEST_BYTES
from engine.server.openai import errors, protocol
from engine.server.openai import serving as S
from engine.server.openai.serving_chat import convert_messages, create_chat_completion
from engine.server.openai.serving_completions import create_completion

log = logging.getLogger(__name__)

_PROTECTED = ("/v1/", "/tokenize", "/detokenize")


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
            scheme, _, token = auth.partition(b" ")
            ok = hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"
            if not ok:
                msg = ("Missing API key: send 'Authorization: Bearer <key>'." if not auth
                       else "Incorrect API key provided.")
                resp = errors.error_response(401, msg, "invalid_request_error", None, "invalid_api_key",
                                             headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a body over the limit: by Content-Length up front, else while it is read."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

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
                    await self._reject(scope, receive, send)
                    return
                break
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, f"Request body larger than {self.limit} bytes.")
            return msg

        await self.app(scope, limited, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        resp = errors.error_response(413, f"Request body larger than {self.limit} bytes.",
                                     headers={"Connection": "close"})
        await resp(scope, receive, send)


def build_app(client: EngineClient, *, served_model_names: list[str] | None = None, api_key: str | None = None,
              allowed_origins: list[str] | None = None,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    info = client.info
    names = list(served_model_names or []) or [info.name]
    metrics = PrometheusMetrics(names[0])
    client.add_listener(metrics.observe)
    ctx = S.ServerContext(client, names, metrics)
    app = FastAPI(title="Kestrel OpenAI-compatible API", version=engine.__version__,
                  description=f"Serving {', '.join(names)} ({info.path}).")
    app.state.ctx = ctx
    errors.install(app)

    err = {"model": protocol.ErrorResponse}
    common = {400: err, 401: err, 404: err, 422: err, 503: err}

    @app.get("/v1/models", response_model=protocol.ModelList, responses={401: err})
    async def list_models() -> dict:
        return {"object": "list", "data": [
            {"id": n, "object": "model", "created": ctx.created, "owned_by": "kestrel", "root": info.path,
             "max_model_len": info.max_model_len} for n in names]}

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

    @app.post("/tokenize", response_model=protocol.TokenizeResponse, responses=common)
    async def tokenize(req: protocol.TokenizeRequest) -> dict:
        ctx.check_model(req.model)
        protocol.check_fields(req)
        if (req.prompt is None) == (req.messages is None):
            raise InvalidRequestError("Give either 'prompt' or 'messages'.", param="prompt")
        if req.messages is not None:
            ids = await client.tokenize(messages=convert_messages(req.messages),
                                        add_generation_prompt=req.add_generation_prompt is not False)
        else:
            S.check_text(req.prompt, "prompt")
            ids = await client.tokenize(req.prompt, add_special_tokens=req.add_special_tokens is not False)
        return {"tokens": ids, "count": len(ids), "max_model_len": info.max_model_len}

    @app.post("/detokenize", response_model=protocol.DetokenizeResponse, responses=common)
    async def detokenize(req: protocol.DetokenizeRequest) -> dict:
        ctx.check_model(req.model)
        protocol.check_fields(req)
        bad = next((t for t in req.tokens if not 0 <= t < info.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"Token id {bad} is out of the vocabulary (0..{info.vocab_size - 1}).",
                                      param="tokens")
        return {"prompt": await client.detokenize(req.tokens)}

    @app.get("/health", response_model=protocol.HealthResponse, responses={503: {"model": protocol.HealthResponse}})
    async def health() -> Response:
        try:
            await client.health()
        except EngineShuttingDownError as e:
            return JSONResponse({"status": "shutting_down", "reason": str(e)}, 503)
        except EngineDeadError as e:
            return JSONResponse({"status": "dead", "reason": str(e)}, 503)
        return JSONResponse({"status": "ok", "reason": None})

    @app.get("/version", response_model=protocol.VersionResponse)
    async def version() -> dict:
        return {"version": engine.__version__}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        stats = None
        if client.is_alive:
            try:
                stats = await asyncio.wait_for(client.stats(), 10)
            except (asyncio.TimeoutError, EngineDeadError):
                stats = None
        metrics.update(stats, healthy=client.is_alive)
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    app.add_middleware(BodyLimitMiddleware, limit=max_request_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=False)
    return app
