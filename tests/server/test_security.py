"""API key on and off, CORS, the body size limit."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL, make_server

FAKE = "tests.server.fake_engine:FakeCore"
KEY = "sk-kestrel-test-4f1a"


@pytest.fixture(scope="module")
def keyed():
    srv = make_server(core_factory=FAKE, api_key=KEY, allowed_origins=["http://app.example"],
                      max_request_bytes=4096)
    yield srv
    srv.stop()


def test_api_key_required_on_v1(keyed):
    ok = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    r = ok.completions.create(model=MODEL, prompt="ab", max_tokens=3)
    assert r.choices[0].text == "cde"
    assert [m.id for m in ok.models.list().data] == [MODEL]
    bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY + "x", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=MODEL, prompt="ab", max_tokens=3)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with httpx.Client(base_url=keyed.url) as c:
        for path in ("/v1/models",):
            assert c.get(path).status_code == 401
            assert c.get(path, headers={"Authorization": f"Basic {KEY}"}).status_code == 401
            assert c.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
        assert c.post("/tokenize", json={"prompt": "x"}).status_code == 401
        assert c.get("/health").status_code == 200  # health, version and metrics stay open
        assert c.get("/version").status_code == 200
        assert c.get("/metrics").status_code == 200


def test_no_api_key_needed_when_none_is_set(http):
    assert http.get("/v1/models").status_code == 200
    assert http.get("/v1/models", headers={"Authorization": "Bearer anything"}).status_code == 200


def test_cors_only_for_the_given_origins(keyed, http):
    with httpx.Client(base_url=keyed.url) as c:
        pre = c.options("/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "http://app.example"
        r = c.get("/v1/models", headers={"Origin": "http://app.example", "Authorization": f"Bearer {KEY}"})
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        r = c.get("/v1/models", headers={"Origin": "http://evil.example", "Authorization": f"Bearer {KEY}"})
        assert "access-control-allow-origin" not in r.headers
    r = http.get("/v1/models", headers={"Origin": "http://app.example"})  # the default server: CORS off
    assert "access-control-allow-origin" not in r.headers
    r = http.options("/v1/models", headers={"Origin": "http://app.example", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in r.headers


def test_request_body_limit(keyed):
    with httpx.Client(base_url=keyed.url, headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/v1/completions", json={"prompt": "a" * 5000})
        assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted while read
            for _ in range(10):
                yield b" " * 1000

        r = c.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1}).status_code == 200


def test_serve_binds_loopback_and_reads_the_key_from_the_environment(monkeypatch):
    from engine.cli import build_parser
    from engine.server.serve import _is_loopback, api_key_of

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.api_key is None
    assert args.allowed_origins is None
    monkeypatch.setenv("KESTREL_API_KEY", "from-env")
    assert api_key_of(args) == "from-env"
    assert api_key_of(build_parser().parse_args(["serve", "--api-key", "flag"])) == "flag"
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and not _is_loopback("0.0.0.0")
