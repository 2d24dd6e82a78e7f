"""Inputs a lenient parser used to accept, and error bodies that said too little (issue 47's minor reliability
items): logit_bias keys that int() reads but are not token ids, Host values no browser can send, the 408 body's
type, and /tokenize naming its own bound and the model's context."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from engine.server.guard import host_of
from tests.server.conftest import MODEL, make_server

FAKE = "tests.server.fake_engine:FakeCore"


@pytest.fixture(scope="module")
def srv():
    s = make_server(core_factory=FAKE, body_timeout=1.0)
    yield s
    s.stop()


@pytest.mark.parametrize("key", [" 5", "5 ", "5_0", "\u0663", "+5", "-1", "0x5", "", "5.0"])
def test_logit_bias_keys_are_ascii_digits_only(srv, key):
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "ab", "max_tokens": 2, "logit_bias": {key: 1}})
        assert r.status_code == 400, (key, r.status_code, r.text[:200])
        err = r.json()["error"]
        assert err["param"] == "logit_bias" and repr(key) in err["message"]
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "ab", "max_tokens": 2, "logit_bias": {"5": 1}})
        assert r.status_code == 200, r.text[:200]


@pytest.mark.parametrize("host", ["localhost:18700@attacker.example", "localhost:abc", "", "localhost:",
                                  "local host", "localhost/x", "[::1", "127.0.0.1:123456"])
def test_host_values_no_browser_sends_are_refused(srv, host):
    assert host_of(host) == ""
    with socket.create_connection(("127.0.0.1", srv.running.port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400"), (host, reply[:120])
    assert b"invalid_host" in reply


def test_host_values_a_browser_sends_still_pass():
    assert host_of("localhost:8000") == "localhost"
    assert host_of("[::1]:8000") == "::1"
    assert host_of("::1") == "::1"
    assert host_of("Box.LAN.") == "box.lan"
    assert host_of("127.0.0.1") == "127.0.0.1"


def test_a_stalled_body_gets_a_408_of_a_known_error_type(srv):
    with socket.create_connection(("127.0.0.1", srv.running.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        t0 = time.monotonic()
        reply = b""  # until the server closes (connection: close): the head and the body may come apart
        while chunk := s.recv(65536):
            reply += chunk
        assert time.monotonic() - t0 < 10
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"type":"invalid_request_error"' in reply.replace(b" ", b""), reply


def test_tokenize_names_its_bound_and_the_context(server, http):
    ctx = server.client.info.max_model_len  # the real server of tests/server/conftest.py (the fake counts no bytes)
    r = http.post("/tokenize", json={"prompt": "y" * 10_000_000})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert f"context is {ctx} tokens" in err["message"] and "context lengths" in err["message"], err["message"]
