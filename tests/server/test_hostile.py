"""The server under hostile input: oversized prompts (no stall, no leak), strict types and OpenAI's ranges,
bounded lists, DNS rebinding (the Host header), GET /v1/models/{id}, and what an API key hides.

Reproductions of the reliability report: a 10 MB chat message used to be tokenized inside the engine's step
loop (every stream stalled ~7 s and the engine kept ~120 MB per refused prompt); ``max_tokens: "8"``,
``stream: "yes"``, ``temperature: 1e308``, ``stop_token_ids: [-1]`` and a million stop strings were
accepted; ``Host: attacker.example`` was served; ``models.retrieve`` got 404."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import psutil
import pytest

from tests.server.conftest import MODEL, engine_stats, make_server

FAKE = "tests.server.fake_engine:FakeCore"
KEY = "sk-kestrel-hostile-7c2e"
BIG = 10_000_000  # characters: under the 16 MiB body limit


@pytest.fixture(scope="module")
def fake():
    srv = make_server(core_factory=FAKE)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keyed():
    srv = make_server(core_factory=FAKE, api_key=KEY)
    yield srv
    srv.stop()


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


# ------------------------------------------------------------------------------------------------
# 1. oversized prompts


class Streams:
    """Streaming completions on threads, recording the time of every SSE event."""

    def __init__(self, url: str, n: int):
        self.url = url
        self.events: list[list[float]] = [[] for _ in range(n)]
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def _run(self, i: int) -> None:
        body = {"model": MODEL, "prompt": f"Story number {i}: once upon a time", "max_tokens": 4000,
                "temperature": 0, "ignore_eos": True, "stream": True}
        try:
            with httpx.Client(base_url=self.url, timeout=120) as c, c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events[i].append(time.monotonic())
                    if self.stop.is_set():
                        return
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    def __enter__(self) -> Streams:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 120
        while not all(len(e) >= 3 for e in self.events):
            assert time.monotonic() < deadline and not self.errors, self.errors
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def longest_gap(self, t0: float, t1: float) -> float:
        gaps = [b - a for ev in self.events for a, b in zip(ev, ev[1:]) if b >= t0 and a <= t1]
        return max(gaps)


def test_oversized_prompt_neither_stalls_the_streams_nor_leaks(server, http):
    """A 10 MB chat message is refused in well under a second by its length in bytes (never tokenized, never
    sent to the engine); the streams running meanwhile see no stall; the engine's memory does not grow."""
    engine = server.client.engine_pid
    ctx = server.client.info.max_model_len
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello world " * (BIG // 12)}]})
    tiny = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 200_000})
    before = rss(engine)
    with Streams(server.url, 2) as streams:
        t0 = time.monotonic()
        took = []
        for _ in range(5):
            t = time.monotonic()
            r = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
            took.append(time.monotonic() - t)
            assert r.status_code == 400, r.text[:300]
            err = r.json()["error"]
            assert err["code"] == "context_length_exceeded" and f"{ctx} tokens" in err["message"]
            assert "at least" in err["message"]
        r = http.post("/v1/chat/completions", content=tiny, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        t1 = time.monotonic()
        time.sleep(0.5)
        gap = streams.longest_gap(t0, t1)
    after = rss(engine)
    print(f"10 MB prompts: refused in {max(took):.2f} s at most; longest gap between a stream's events while "
          f"they were refused: {gap:.3f} s; engine RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB")
    assert max(took) < 3
    assert gap < 2.0, f"a stream stalled {gap:.2f} s"  # it was ~7 s when the engine loop tokenized
    assert after - before < 64 * 2**20  # it was ~120 MB per refused prompt
    s = engine_stats(server)
    deadline = time.monotonic() + 10
    while (s.num_running or s.num_free_blocks != s.num_kv_blocks) and time.monotonic() < deadline:
        time.sleep(0.1)
        s = engine_stats(server)
    assert s.num_running == 0 and s.num_free_blocks == s.num_kv_blocks


def test_long_token_id_prompt_is_refused_before_the_engine(server, http):
    engine = server.client.engine_pid
    ctx = server.client.info.max_model_len
    before = rss(engine)
    ids = [1] * 2_000_000
    for _ in range(3):
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert f"{len(ids)} tokens" in r.json()["error"]["message"]
    assert rss(engine) - before < 64 * 2**20
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": [1] * ctx, "max_tokens": 1})
    assert r.status_code == 400 and f"{ctx} tokens" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": [1] * 64, "max_tokens": 1})
    assert r.status_code == 200, r.text[:300]


def test_tokenize_counts_exactly_and_refuses_a_text_beyond_its_bound(http, tok):
    text = "The quick brown fox jumps over the lazy dog. " * 200
    r = http.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200 and r.json()["tokens"] == tok(text)["input_ids"]
    r = http.post("/tokenize", json={"prompt": "y" * BIG})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = http.post("/detokenize", json={"tokens": [1] * (2**20 + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


# ------------------------------------------------------------------------------------------------
# 5. strict types, OpenAI's ranges, bounded lists

COMPLETION = {"model": MODEL, "prompt": "ab", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "ab"}], "max_tokens": 2}

# (route, fields merged into the body, status, the field the error names)
BAD_INPUTS = [
    ("/v1/completions", {"max_tokens": "8"}, 422, "max_tokens"),
    ("/v1/completions", {"max_tokens": True}, 422, "max_tokens"),
    ("/v1/completions", {"max_tokens": 8.0}, 422, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": "4"}, 422, "max_completion_tokens"),
    ("/v1/completions", {"stream": "yes"}, 422, "stream"),
    ("/v1/completions", {"stream": 1}, 422, "stream"),
    ("/v1/chat/completions", {"stream": "true"}, 422, "stream"),
    ("/v1/completions", {"n": True}, 422, "n"),
    ("/v1/completions", {"seed": "7"}, 422, "seed"),
    ("/v1/completions", {"ignore_eos": "false"}, 422, "ignore_eos"),
    ("/v1/completions", {"logprobs": True}, 422, "logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, 422, "logprobs"),
    ("/v1/completions", {"temperature": "0.5"}, 422, "temperature"),
    ("/v1/completions", {"temperature": 2.5}, 400, "temperature"),
    ("/v1/completions", {"temperature": 1e308}, 400, "temperature"),
    ("/v1/chat/completions", {"temperature": -0.1}, 400, "temperature"),
    ("/v1/completions", {"top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"min_p": 2}, 400, "min_p"),
    ("/v1/completions", {"presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/completions", {"frequency_penalty": -1e300}, 400, "frequency_penalty"),
    ("/v1/completions", {"repetition_penalty": 1e308}, 400, "repetition_penalty"),
    ("/v1/completions", {"repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/completions", {"stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("/v1/completions", {"stop_token_ids": [10**9]}, 400, "stop_token_ids"),
    ("/v1/completions", {"stop_token_ids": list(range(2000))}, 400, "stop_token_ids"),
    ("/v1/completions", {"stop_token_ids": ["1"]}, 422, "stop_token_ids"),
    ("/v1/completions", {"stop": ["x"] * 1_000_000}, 400, "stop"),
    ("/v1/completions", {"stop": ["x"] * 65}, 400, "stop"),
    ("/v1/completions", {"stop": "x" * 5000}, 400, "stop"),
    ("/v1/completions", {"logit_bias": {str(i): 1 for i in range(2000)}}, 400, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"1": "5"}}, 422, "logit_bias"),
    ("/v1/completions", {"prompt": ["a"] * 1000}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1] * 300}, 400, "prompt"),  # the stand-in's context is 128 tokens
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 20_000}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ["x"] * 5000}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": 1, "content": "x"}]}, 422, "messages.0.role"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "no"}, 422, "add_special_tokens"),
    ("/detokenize", {"tokens": ["1"]}, 422, "tokens"),
]


def test_strict_types_and_openai_ranges(fake):
    """Every input of BAD_INPUTS is refused with the status and the field named; none takes long (the
    million stop strings included); the server serves normally afterwards."""
    with httpx.Client(base_url=fake.url, timeout=60) as c:
        slowest = 0.0
        for route, extra, status, param in BAD_INPUTS:
            base = CHAT if route == "/v1/chat/completions" else COMPLETION if route == "/v1/completions" else {}
            t = time.monotonic()
            r = c.post(route, json={**base, **extra})
            slowest = max(slowest, time.monotonic() - t)
            assert r.status_code == status, (route, list(extra), r.status_code, r.text[:300])
            got = r.json()["error"]["param"] or ""
            assert got.startswith(param), (route, list(extra), got)
        assert slowest < 5
        r = c.post("/v1/completions", json=COMPLETION)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "cd"
        # an integer is a valid number; the bounds themselves are allowed
        r = c.post("/v1/completions", json={**COMPLETION, "temperature": 2, "top_p": 1, "presence_penalty": -2})
        assert r.status_code == 200
    print(f"{len(BAD_INPUTS)} bad inputs refused; slowest {slowest:.2f} s")


# ------------------------------------------------------------------------------------------------
# 6. GET /v1/models/{id}; what the API key hides


def test_models_retrieve(api):
    m = api.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and m.owned_by == "kestrel"
    with pytest.raises(openai.NotFoundError) as e:
        api.models.retrieve("gpt-5")
    assert e.value.body["code"] == "model_not_found"


def test_models_retrieve_a_name_with_a_slash():
    srv = make_server(core_factory=FAKE, served_model_names=["org/model-1"])
    try:
        api = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        assert api.models.retrieve("org/model-1").id == "org/model-1"
    finally:
        srv.stop()


def test_the_key_hides_metrics_and_the_model_path(keyed):
    path_parts = [p for p in keyed.client.info.path.split("/") if p]
    ok = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    ok.completions.create(model=MODEL, prompt="ab", max_tokens=2)
    with httpx.Client(base_url=keyed.url) as c:
        public = c.get("/metrics")
        assert public.status_code == 200
        assert "kestrel_engine_healthy 1.0" in public.text
        assert MODEL not in public.text and "kestrel_generation_tokens" not in public.text
        full = c.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        assert f'model_name="{MODEL}"' in full and "kestrel_generation_tokens_total" in full
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).text == public.text
        schema = c.get("/openapi.json").text
        assert MODEL not in schema and not any(p in schema for p in path_parts if len(p) > 3)
        models = c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]
        assert "/" not in models["root"]
        assert c.get(f"/v1/models/{MODEL}").status_code == 401


def test_api_key_file_and_environment(tmp_path, monkeypatch, capsys):
    from engine.cli import build_parser
    from engine.errors import KestrelError
    from engine.server.serve import api_key_of

    parser = build_parser()
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    key_file.chmod(0o600)
    monkeypatch.setenv("KESTREL_API_KEY", "sk-from-env")
    assert api_key_of(parser.parse_args(["serve"])) == "sk-from-env"
    assert api_key_of(parser.parse_args(["serve", "--api-key-file", str(key_file)])) == "sk-from-file"
    assert api_key_of(parser.parse_args(["serve", "--api-key", "k", "--api-key-file", str(key_file)])) == "k"
    with pytest.raises(KestrelError, match="cannot be read"):
        api_key_of(parser.parse_args(["serve", "--api-key-file", str(tmp_path / "missing")]))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(KestrelError, match="empty"):
        api_key_of(parser.parse_args(["serve", "--api-key-file", str(tmp_path / "empty")]))
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "KESTREL_API_KEY" in help_text and "--api-key-file" in help_text and "visible" in help_text


# ------------------------------------------------------------------------------------------------
# 3. DNS rebinding


def test_host_header_must_name_this_machine(server, fake):
    evil = {"Host": "attacker.example:8765"}
    with httpx.Client(base_url=server.url, timeout=30) as c:  # the default server (loopback, no key)
        for method, path in (("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"),
                             ("GET", "/openapi.json"), ("POST", "/v1/completions")):
            r = c.request(method, path, headers=evil, json={"prompt": "hi", "max_tokens": 1} if method == "POST"
                          else None)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", (path, r.status_code)
        port = server.running.port
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost", "LOCALHOST."):
            assert c.get("/v1/models", headers={"Host": host}).status_code == 200, host
        assert c.get("/v1/models", headers={"Host": "localhost.attacker.example"}).status_code == 400
    srv = make_server(core_factory=FAKE, allowed_hosts=["box.lan", ".example.org"])
    try:
        with httpx.Client(base_url=srv.url) as c:
            assert c.get("/v1/models", headers={"Host": "box.lan:80"}).status_code == 200
            assert c.get("/v1/models", headers={"Host": "api.example.org"}).status_code == 200
            assert c.get("/v1/models", headers={"Host": "attacker.example"}).status_code == 400
    finally:
        srv.stop()
