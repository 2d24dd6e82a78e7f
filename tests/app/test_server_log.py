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


def _serve(tracking, app_body, receive=None) -> list:
    entries = []

    async def app(scope, receive, send):
        await app_body(send) if receive_arg is None else await app_body(send, receive)

    async def noop(*a):
        return {"type": "http.request"}

    receive_arg = receive
    mw = RequestLogMiddleware(app, entries.append)
    asyncio.run(mw({"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("127.0.0.1", 1)},
                   receive or noop, noop))
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
    # no disconnect seen (the stand-in app stopped by itself) but the response never ended: said so
    assert e.status == 200 and e.tokens == 3 and inner.aborted and "cut off" in e.detail
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
    # the client left mid-stream: logged as such, not as a 200
    assert row[3] == "499" and row[6].startswith(f"client closed the connection after {row[4]} tokens"), row
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is None, timeout=30_000)


def _json_answer(status: int, body: dict):
    async def answer(send):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})
    return answer


def test_error_answers_are_logged_with_their_reason():
    tracking = TrackingClient(_Client(_Stream([])))
    (e,) = _serve(tracking, _json_answer(404, {"error": {"message": "The model `x` does not exist.",
                                                         "type": "invalid_request_error"}}))
    assert e.status == 404 and e.detail == "The model `x` does not exist." and e.failed
    (e,) = _serve(tracking, _json_answer(422, {"detail": [{"loc": ["body", "messages"], "msg": "Field required"}]}))
    assert e.status == 422 and e.detail == "Field required"
    (e,) = _serve(tracking, _json_answer(200, {"choices": []}))
    assert e.status == 200 and e.detail == "" and not e.failed
    tracking.close()


def test_an_error_event_in_a_stream_is_the_reason():
    tracking = TrackingClient(_Client(_Stream([])))

    async def stream(send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        err = {"error": {"message": "The engine process exited unexpectedly.", "type": "service_unavailable"}}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(err).encode() + b"\n\n",
                    "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    (e,) = _serve(tracking, stream)
    assert e.status == 200 and e.detail == "The engine process exited unexpectedly." and e.failed
    tracking.close()


def test_a_client_that_leaves_before_the_end_is_499_and_one_after_it_is_not():
    tracking = TrackingClient(_Client(_Stream([])))

    async def disconnect():
        return {"type": "http.disconnect"}

    async def left_mid_stream(send, receive):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        await receive()  # what SSEResponse's disconnect listener hears when the client goes away

    (e,) = _serve(tracking, left_mid_stream, receive=disconnect)
    assert e.status == 499 and e.detail.startswith("client closed the connection")

    async def finished_then_disconnect(send, receive):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        await receive()  # the server answers a waiting receive() with "disconnect" once a response is complete

    (e,) = _serve(tracking, finished_then_disconnect, receive=disconnect)
    assert e.status == 200 and e.detail == ""
    tracking.close()


def test_server_panel_shows_why_a_request_failed(make_window, qtbot):
    """404 (unknown model) and 422 (malformed body) rows carry the server's message; the row is red."""
    import httpx

    w = make_window()
    panel = w.panels["server"]
    panel.port.setValue(0)
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is not None, timeout=30_000)
    base = panel.url_field.text()
    r404 = httpx.post(base + "/chat/completions", timeout=30,
                      json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    r422 = httpx.post(base + "/chat/completions", json={"model": w.ctx.engine.info.name}, timeout=30)
    assert (r404.status_code, r422.status_code) == (404, 422)
    qtbot.waitUntil(lambda: {"404", "422"} <= {r[3] for r in panel.log_rows()}, timeout=30_000)
    rows = {r[3]: r for r in panel.log_rows()}
    assert rows["404"][6] == r404.json()["error"]["message"] and "no-such-model" in rows["404"][6]
    assert rows["422"][6] == r422.json()["error"]["message"] and "messages" in rows["422"][6]
    item = next(panel.log.item(r, 6) for r in range(panel.log.rowCount()) if panel.log.item(r, 3).text() == "404")
    assert item.foreground().color().name() == "#d64545" and "no-such-model" in item.toolTip()
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is None, timeout=30_000)
