"""The endpoint's request log: every HTTP request served, with its time, method, route, status, generated
tokens and latency (until the last byte). Plain asyncio / ASGI, no Qt (the server worker turns entries
into signals).

Tokens are exact: the server app gets a ``TrackingClient`` (a thin stand-in for the EngineClient) that notes
which engine requests each HTTP request starts, and the EngineClient's finished-request records give their
token counts. A request that did not finish by itself (its record says "abort" or "error": a stream the HTTP
client stopped reading or dropped, an engine failure mid-stream) counts the tokens its response was handed,
which the TrackingClient's streams note as they go (the record's count includes tokens that reached the
client but not the response); a response's ``usage`` comes first when it has one.

Each entry says why a request did not succeed (``detail``): the error message of a 4xx / 5xx answer (the
OpenAI error object's ``message``, or a plain ``detail``), an error event in a stream that had started with
200, or that the client closed the connection before the response was complete: such a request is logged
with status 499 ("client closed request", as nginx does), whatever status its response had started with.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

_MAX_JSON = 4 << 20
log = logging.getLogger(__name__)


@dataclass
class LogEntry:
    time: float  # wall clock, time.time()
    method: str
    path: str
    status: int
    tokens: int | None
    latency: float  # seconds
    client: str = ""
    detail: str = ""  # why it did not succeed, in words ("" when it did)

    @property
    def failed(self) -> bool:
        return self.status >= 400 or bool(self.detail)


CLIENT_CLOSED = 499  # the status logged for a request whose client left before its response was complete


@dataclass
class _Tracker:
    """The engine requests one HTTP request started, and the tokens they generated."""

    pending: set[str] = field(default_factory=set)
    tokens: int = 0
    finished: int = 0
    handed: dict[str, int] = field(default_factory=dict)  # engine request id -> tokens handed to the response

    @property
    def started(self) -> bool:
        return bool(self.pending) or self.finished > 0

    def count(self, usage_tokens: int | None) -> int | None:
        """The HTTP request's generated tokens: the engine's records when every engine request it started
        finished; else the response's usage, else the records plus the tokens handed out by the others."""
        if not self.started:
            return usage_tokens
        if not self.pending:
            return self.tokens
        if usage_tokens is not None:
            return usage_tokens
        return self.tokens + sum(self.handed.get(cid, 0) for cid in self.pending)


class _CountedStream:
    """An EngineClient RequestStream that notes, per engine request, the tokens of the deltas it hands out.
    Everything else is the stream's own."""

    def __init__(self, stream, tracker: _Tracker):
        self._stream = stream
        self._tracker = tracker

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    async def next_batch(self):
        batch = await self._stream.next_batch()
        handed = self._tracker.handed
        for d in batch:
            n = handed.get(d.request_id, 0) + len(d.token_ids)
            handed[d.request_id] = max(n, d.num_output_tokens or 0)
        return batch

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while batch := await self.next_batch():
            for d in batch:
                yield d

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        self._stream.abort()


_current: contextvars.ContextVar[_Tracker | None] = contextvars.ContextVar("kestrel_request_tracker", default=None)


class TrackingClient:
    """Stands in for an EngineClient in the server app: everything is the client's own, except that
    ``add_request`` notes the engine request ids under the HTTP request being served."""

    def __init__(self, client):
        self._client = client
        # weak: an engine request whose record never comes (a stand-in client) leaves no entry once its HTTP
        # request is done
        self._owners: weakref.WeakValueDictionary[str, _Tracker] = weakref.WeakValueDictionary()
        client.add_listener(self._on_record)

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    async def add_request(self, *args, **kwargs):
        stream = await self._client.add_request(*args, **kwargs)
        tracker = _current.get()
        if tracker is None:
            return stream
        for cid in stream.child_ids:
            tracker.pending.add(cid)
            self._owners[cid] = tracker
        return _CountedStream(stream, tracker)

    def _on_record(self, rec) -> None:
        tracker = self._owners.pop(rec.request_id, None)
        if getattr(rec, "finish_reason", None) in ("abort", "error"):
            return  # stays pending: counted by the tokens its response was handed (or the response's usage)
        if tracker is not None:
            tracker.pending.discard(rec.request_id)
            tracker.tokens += rec.num_output_tokens
            tracker.finished += 1

    def close(self) -> None:
        """Stop listening to the client (when the server stops)."""
        try:
            self._client.remove_listener(self._on_record)
        except ValueError:
            pass
        self._owners.clear()


class RequestLogMiddleware:
    def __init__(self, app, on_entry: Callable[[LogEntry], None]):
        self.app = app
        self.on_entry = on_entry

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.time()
        t0 = time.perf_counter()
        sniffer = _UsageSniffer()
        tracker = _Tracker()
        token = _current.set(tracker)
        complete = False  # the response's last body part was sent
        gone = False  # the client disconnected before that

        async def sending(message) -> None:
            nonlocal complete
            if message["type"] == "http.response.start":
                sniffer.status = message["status"]
                for name, value in message.get("headers", []):
                    if name.lower() == b"content-type":
                        sniffer.content_type = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                sniffer.feed(message.get("body", b""))
                if not message.get("more_body", False):
                    complete = True
            await send(message)

        async def receiving():
            nonlocal gone
            message = await receive()
            # after a complete response the server says "disconnect" to a waiting receive(): not a client leaving
            if message.get("type") == "http.disconnect" and not complete:
                gone = True
            return message

        try:
            await self.app(scope, receiving, sending)
        finally:
            _current.reset(token)
            tokens = tracker.count(sniffer.tokens())
            client = scope.get("client") or ("", 0)
            status, detail = sniffer.status or 500, sniffer.error
            if gone or (sniffer.status == CLIENT_CLOSED and not detail):
                status = CLIENT_CLOSED
                after = f" after {tokens} tokens" if tokens else ""
                detail = f"client closed the connection{after} (the request was stopped)"
            elif not sniffer.status:
                detail = detail or "no response: the server failed while handling the request"
            elif not complete and not detail:
                detail = "the response was cut off before its end"
            entry = LogEntry(time=started, method=scope.get("method", ""), path=scope.get("path", ""),
                             status=status, tokens=tokens, latency=time.perf_counter() - t0,
                             client=str(client[0]), detail=detail)
            try:
                self.on_entry(entry)
            except Exception:  # logging must never break a response
                log.exception("request log callback failed")


class _UsageSniffer:
    """The status, ``usage.completion_tokens`` from a JSON body or from an SSE stream's usage chunk, and the
    error message of an error answer or of a stream's error event."""

    def __init__(self):
        self.status = 0
        self.content_type = ""
        self.body = bytearray()
        self.pending = b""
        self.usage_tokens: int | None = None
        self.stream_error = ""

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if "text/event-stream" in self.content_type:
            self.pending += data
            *events, self.pending = self.pending.split(b"\n\n")
            for ev in events:
                if b'"usage"' in ev or b'"error"' in ev:
                    self._event(ev)
        elif len(self.body) < _MAX_JSON:
            self.body += data

    def _event(self, ev: bytes) -> None:
        for line in ev.splitlines():
            if line.startswith(b"data:"):
                try:
                    obj = json.loads(line[5:].strip())
                except ValueError:
                    continue
                if not isinstance(obj, dict):
                    continue
                usage = obj.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    self.usage_tokens = int(usage["completion_tokens"])
                message = _error_message(obj)
                if message:
                    self.stream_error = message

    @property
    def error(self) -> str:
        """Why the request failed, from its answer ("" for a success)."""
        if self.stream_error:
            return self.stream_error
        if self.status < 400:
            return ""
        message = ""
        if self.body:
            try:
                message = _error_message(json.loads(bytes(self.body)))
            except ValueError:
                message = bytes(self.body[:200]).decode("utf-8", "replace").strip()
        return message or _REASONS.get(self.status, "")

    def tokens(self) -> int | None:
        if self.usage_tokens is not None:
            return self.usage_tokens
        if "json" in self.content_type and self.body:
            try:
                usage = json.loads(bytes(self.body)).get("usage") or {}
                value = usage.get("completion_tokens")
                return int(value) if value is not None else None
            except (ValueError, AttributeError):
                return None
        return None


_REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Payload Too Large", 422: "Unprocessable Content", 429: "Too Many Requests",
            499: "Client Closed Request", 500: "Internal Server Error", 503: "Service Unavailable"}


def _error_message(obj) -> str:
    """The message of an OpenAI error object ``{"error": {"message": ...}}`` or of a plain ``{"detail": ...}``."""
    if not isinstance(obj, dict):
        return ""
    err = obj.get("error")
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str) and err:
        return err
    detail = obj.get("detail")
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail:  # FastAPI's validation errors
        first = detail[0]
        return str(first.get("msg", first)) if isinstance(first, dict) else str(first)
    return ""
