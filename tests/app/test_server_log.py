"""The Server panel's request log (issue 14 item 5): a streamed request has its token count, also when it did not
finish by itself (the HTTP client stopped reading; its engine record says "abort") and its stream carried no
usage chunk."""

from __future__ import annotations

import asyncio
import gc
import json
from dataclasses import dataclass, field

from app.server_log import RequestLogMiddleware, TrackingClient
from tests.app.helpers import click_when_enabled, drop_a_stream_mid_reply


@dataclass
class _Delta:
    request_id: str
    token_ids: list = field(default_factory=list)
    num_output_tokens: int = 0


class _Stream:
    def __init__(self, batches):
        self.child_ids = ["req-7"]
        self.batches = list(batches)
        self.aborted = False
        self.num_prompt_tokens = 12

    async def next_batch(self):
        return self.batches.pop(0) if self.batches and not self.aborted else []

    def abort(self):
        self.aborted = True


class _Client:
    def __init__(self, stream):
        self.listeners = []
        self.stream = stream

    def add_listener(self, fn):
        self.listeners.append(fn)

    def remove_listener(self, fn):
        self.listeners.remove(fn)

    async def add_request(self, **kw):
        return self.stream


def _serve(tracking, app_body) -> list:
    entries = []

    async def app(scope, receive, send):
        await app_body(send)

    async def noop(*a):
        return {"type": "http.request"}

    mw = RequestLogMiddleware(app, entries.append)
    asyncio.run(mw({"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("127.0.0.1", 1)},
                   noop, noop))
    return entries


def test_stream_stopped_early_logs_the_tokens_it_sent():
    inner = _Stream([[_Delta("req-7", [5], 1)], [_Delta("req-7", [6, 7], 3)], [_Delta("req-7", [8], 4)]])
    client = _Client(inner)
    tracking = TrackingClient(client)

    async def body(send):
        stream = await tracking.add_request(prompt="x")
        assert stream.num_prompt_tokens == 12  # the stream's own attributes show through
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(2):  # two batches (3 tokens) reach the client, which then goes away
            for d in await stream.next_batch():
                chunk = {"choices": [{"delta": {"content": "t" * len(d.token_ids)}}]}
                await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                            "more_body": True})
        stream.abort()  # what serving's abort_all does (a stand-in stream: no record comes)

    (e,) = _serve(tracking, body)
    assert e.status == 200 and e.tokens == 3 and inner.aborted
    gc.collect()
    assert len(tracking._owners) == 0  # the aborted request's entry went with its HTTP request
    tracking.close()


def test_stream_stopped_early_with_its_abort_record_logs_the_tokens_it_sent():
    """The EngineClient hands an "abort" record for a stream stopped here (its count includes tokens that
    reached the client but not the response): the log keeps the tokens the response was handed."""
    inner = _Stream([[_Delta("req-7", [5], 1)], [_Delta("req-7", [6, 7], 3)], [_Delta("req-7", [8], 4)]])
    client = _Client(inner)
    tracking = TrackingClient(client)

    class Rec:
        request_id, num_output_tokens, finish_reason = "req-7", 4, "abort"

    def abort():
        inner.aborted = True
        for fn in client.listeners:
            fn(Rec())

    inner.abort = abort

    async def body(send):
        stream = await tracking.add_request(prompt="x")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(2):
            await stream.next_batch()
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        stream.abort()

    (e,) = _serve(tracking, body)
    assert e.tokens == 3 and inner.aborted
    assert len(tracking._owners) == 0
    tracking.close()


def test_record_wins_and_usage_is_the_fallback():
    client = _Client(_Stream([]))
    tracking = TrackingClient(client)

    class Rec:
        request_id, num_output_tokens = "req-7", 9

    async def finished(send):
        await tracking.add_request(prompt="x")
        for fn in client.listeners:
            fn(Rec())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"choices": [], "usage": {"completion_tokens": 9}}\n\n'})

    assert _serve(tracking, finished)[0].tokens == 9

    async def aborted_with_usage(send):
        await tracking.add_request(prompt="x")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"usage": {"completion_tokens": 4}}'})

    assert _serve(tracking, aborted_with_usage)[0].tokens == 4
    tracking.close()


def test_server_panel_logs_a_stream_the_client_dropped(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")  # 50 ms a token: the client leaves mid-stream
    w = make_window()
    panel = drop_a_stream_mid_reply(w, qtbot)
    qtbot.waitUntil(lambda: any(r[2] == "/v1/chat/completions" for r in panel.log_rows()), timeout=30_000)
    row = next(r for r in panel.log_rows() if r[2] == "/v1/chat/completions")
    assert row[4].isdigit() and 3 <= int(row[4]) < 100, row
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is None, timeout=30_000)
