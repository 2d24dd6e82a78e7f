"""Every error as an OpenAI error object: ``{"error": {"message", "type", "param", "code"}}`` with the
status the engine's typed error carries (engine.errors: 400 invalid parameter / prompt too long, 404 unknown
model, 503 engine dead, restarting (with Retry-After) or shutting down), 400 for a Host that is not served,
401 for a missing or wrong API key, 408 for a body that stalls, 413 for a body over the limit, 422 for a
malformed body (wrong JSON types included: no coercion)."""

from __future__ import annotations

import logging

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from engine.errors import KestrelError, PromptTooLongError

log = logging.getLogger(__name__)

_HTTP_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
               503: "service_unavailable"}


class ModelNotServedError(KestrelError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str, served: list[str]):
        super().__init__(f"The model `{model}` does not exist. This server serves: {', '.join(served)}.")
        self.param = "model"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str | None = None, param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> Response:
    body = error_body(message, type_ or _HTTP_TYPES.get(status, "error"), param, code)
    return Response(msgspec.json.encode(body), status, headers=headers, media_type="application/json")


def kestrel_error_parts(err: KestrelError) -> tuple[int, dict]:
    code = getattr(err, "code", None)
    if code is None and isinstance(err, PromptTooLongError):
        code = "context_length_exceeded"
    param = getattr(err, "param", None)
    return err.status_code, error_body(str(err), err.error_type, param, code)


def kestrel_error_response(err: KestrelError) -> Response:
    status, body = kestrel_error_parts(err)
    if status >= 500:
        log.warning("%s: %s", type(err).__name__, err)
    retry = getattr(err, "retry_after", None)
    headers = {"Retry-After": str(retry)} if retry else None
    return Response(msgspec.json.encode(body), status, headers=headers, media_type="application/json")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    parts = []
    first_param = None
    for e in errs[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        first_param = first_param or where
        parts.append(f"{where}: {e.get('msg')}")
    more = f" (and {len(errs) - 5} more)" if len(errs) > 5 else ""
    return "Malformed request body: " + "; ".join(parts) + more, first_param


def install(app: FastAPI) -> None:
    @app.exception_handler(KestrelError)
    async def _kestrel(_: Request, exc: KestrelError) -> Response:
        return kestrel_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        message, param = _validation_message(exc)
        return error_response(422, message, "invalid_request_error", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> Response:
        log.exception("internal error")
        return error_response(500, f"Internal server error ({type(exc).__name__}).", "internal_error")
