"""Rendering and small pure pieces: Markdown for the chat view, sampling defaults from generation_config,
snippets, the token store, and the request log's token counting."""

from __future__ import annotations

import asyncio
import os
import re
import stat

import pytest

from app import token_store
from app.markdown_render import close_open_fence, to_html
from app.sampling import FALLBACK, SamplingSettings
from app.server_log import RequestLogMiddleware, TrackingClient
from app.snippets import curl_snippet, python_snippet


def test_markdown_code_blocks_tables_and_raw_html():
    html = to_html("Hi **there** <img src=x onerror=alert(1)>\n\n```python\nprint(1 < 2)\n```\n\n| a | b |\n|---|---|\n"
                   "| 1 | 2 |\n")
    assert "<strong>there</strong>" in html
    assert "&lt;img" in html and "<img" not in html  # raw HTML is text
    text = re.sub(r"<[^>]+>", "", html)  # the code block's text without the highlighting's spans
    assert 'font-family: monospace' in html and "print(1 &lt; 2)" in text and ">python<" in html
    assert "<table" in html and "<td>1</td>" in html


def test_streaming_markdown_closes_an_open_fence():
    assert close_open_fence("text\n```py\ncode") == "text\n```py\ncode\n```"
    assert close_open_fence("```a```") == "```a```"
    assert "monospace" in to_html("Here:\n```\nhalf a blo")


def test_sampling_defaults():
    assert SamplingSettings.from_generation_config({}) == SamplingSettings()
    assert SamplingSettings().temperature == FALLBACK["temperature"] == 0.7 and SamplingSettings().top_p == 0.95
    qwen = SamplingSettings.from_generation_config({"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                    "repetition_penalty": 1.05})
    assert (qwen.temperature, qwen.top_p, qwen.top_k, qwen.min_p, qwen.repetition_penalty) == (0.6, 0.95, 20, 0.0,
                                                                                              1.05)
    assert SamplingSettings.from_generation_config({"do_sample": False}).temperature == 0.0
    p = SamplingSettings(seed=3, stop=["###"], max_tokens=9).to_params()
    assert p.seed == 3 and p.stop == ["###"] and p.max_tokens == 9
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(top_p=0).to_params()


def test_snippets():
    c = curl_snippet("http://127.0.0.1:8000", "m", "sk-1")
    assert "http://127.0.0.1:8000/v1/chat/completions" in c and "Bearer sk-1" in c and '"model": "m"' in c
    py = python_snippet("http://127.0.0.1:8000", "m", None)
    assert 'base_url="http://127.0.0.1:8000/v1"' in py and 'api_key="not-needed"' in py
    compile(py, "snippet", "exec")


def test_token_in_a_private_file(app_env, monkeypatch):
    monkeypatch.setattr(token_store, "_keyring", lambda: None)
    assert token_store.get_token() is None
    assert "private file" in token_store.set_token(" hf_abc \n")
    assert token_store.get_token() == "hf_abc"
    path = app_env / "data" / "hf_token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    token_store.clear_token()
    assert token_store.get_token() is None and not path.exists()


def test_token_in_the_keyring(app_env, monkeypatch):
    class FakeKeyring:
        def __init__(self):
            self.store = {}

        def get_password(self, s, u):
            return self.store.get((s, u))

        def set_password(self, s, u, p):
            self.store[(s, u)] = p

        def delete_password(self, s, u):
            self.store.pop((s, u))

    kr = FakeKeyring()
    monkeypatch.setattr(token_store, "_keyring", lambda: kr)
    assert token_store.set_token("hf_xyz") == "the OS keyring"
    assert kr.store == {("kestrel", "huggingface-token"): "hf_xyz"}
    assert token_store.get_token() == "hf_xyz"
    assert not (app_env / "data" / "hf_token").exists()
    token_store.clear_token()
    assert token_store.get_token() is None


def test_request_log_counts_tokens_from_the_engine_records():
    """Streamed responses carry no usage; the log takes the tokens from the engine's records."""

    class Rec:
        def __init__(self, rid, n):
            self.request_id, self.num_output_tokens = rid, n

    class Stream:
        def __init__(self):
            self.child_ids = ["req-1#0", "req-1#1"]

    class Client:
        def __init__(self):
            self.listeners = []
            self.info = "info"

        def add_listener(self, fn):
            self.listeners.append(fn)

        def remove_listener(self, fn):
            self.listeners.remove(fn)

        async def add_request(self, **kw):
            return Stream()

    client = Client()
    tracking = TrackingClient(client)
    assert tracking.info == "info"

    async def app(scope, receive, send):
        await tracking.add_request(prompt="x")
        for rid, n in (("req-1#0", 4), ("req-1#1", 6), ("other", 100)):
            for fn in client.listeners:
                fn(Rec(rid, n))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'})

    entries = []
    mw = RequestLogMiddleware(app, entries.append)

    async def noop(*a):
        return {"type": "http.request"}

    asyncio.run(mw({"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("1.2.3.4", 5)},
                   noop, noop))
    (e,) = entries
    assert (e.method, e.path, e.status, e.tokens, e.client) == ("POST", "/v1/chat/completions", 200, 10, "1.2.3.4")
    tracking.close()
    assert client.listeners == []
