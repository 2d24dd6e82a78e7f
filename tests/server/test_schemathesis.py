"""Property-based requests from /openapi.json (schemathesis): no 5xx, whatever the body.

A server of its own with a 64-token context keeps every generation short. Three kinds of cases per operation:
"positive" (valid by the schema), "negative" (breaking it), and "nudged" (positive ones with the few values the
schema cannot constrain made usable: the served model name, token ids inside the vocabulary, short outputs),
so that random sampling parameters reach the engine rather than stopping at a 400.
schemathesis' pytest plugin (``schemathesis.pytest.from_fixture``) does not run under pytest 9 (it reads
``Function._nodeid``), so each operation's strategy runs under a plain ``hypothesis.given``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")  # the `test` extra should list schemathesis>=4

from hypothesis import HealthCheck, given, settings  # noqa: E402 - hypothesis comes with schemathesis
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

from tests.server.conftest import MODEL, make_server  # noqa: E402

OPERATIONS = ["GET /v1/models", "GET /v1/models/{model_id}", "POST /v1/chat/completions", "POST /v1/completions",
              "POST /tokenize", "POST /detokenize", "GET /health", "GET /version", "GET /metrics",
              "GET /v1/server_info", "POST /v1/embeddings", "POST /v1/responses"]
GENERATE = ("POST /v1/chat/completions", "POST /v1/completions")
CASES = ([(op, "positive") for op in OPERATIONS] + [(op, "negative") for op in OPERATIONS if op.startswith("POST")]
         + [(op, "nudged") for op in (*GENERATE, "POST /tokenize", "POST /detokenize", "POST /v1/embeddings",
                                      "POST /v1/responses")])
VOCAB = 49152

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "kestrel-hypothesis")  # not .hypothesis/ in the work tree


@pytest.fixture(scope="module")
def st_server():
    srv = make_server(engine={"max_model_len": 64})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def st_schema(st_server):
    schema = schemathesis.openapi.from_url(st_server.url + "/openapi.json")
    ops = {r.ok().label: r.ok() for r in schema.get_all_operations()}
    assert set(ops) == set(OPERATIONS)
    return ops


def nudge(body: dict) -> None:
    body["model"] = MODEL
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("content") is None:
            m["content"] = "hi"
    p = body.get("prompt")
    if isinstance(p, list):
        body["prompt"] = [[abs(t) % VOCAB for t in x] or [1] if isinstance(x, list) else (x or "hi") for x in p] \
            if p and not isinstance(p[0], int) else [abs(t) % VOCAB for t in p] or "hi"
    elif p == "":
        body["prompt"] = "hi"
    x = body.get("input")
    if isinstance(x, list) and x:
        body["input"] = [abs(t) % VOCAB for t in x] if isinstance(x[0], int) else \
            [[abs(t) % VOCAB for t in i] or [1] if isinstance(i, list) else (i or "hi") for i in x]
    if isinstance(body.get("dimensions"), int):
        body["dimensions"] = min(body["dimensions"], 576)
    if isinstance(body.get("tokens"), list):
        body["tokens"] = [abs(t) % VOCAB for t in body["tokens"]]
    for k in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(k), int):
            body[k] = min(body[k], 8)
    for k, top in (("min_tokens", 8), ("n", 3)):
        if isinstance(body.get(k), int):
            body[k] = min(body[k], top)
    body.pop("best_of", None)
    if not body.get("stream"):
        body.pop("stream_options", None)
    if body.get("top_logprobs") is not None:
        body["logprobs"] = True
    if isinstance(body.get("logit_bias"), dict):
        body["logit_bias"] = {str(abs(hash(k)) % VOCAB): v for k, v in body["logit_bias"].items()}
    if "prompt" in body and "messages" in body:
        body.pop("messages")


@pytest.mark.parametrize("label, mode", CASES)
def test_no_server_errors(st_server, st_schema, label, mode):
    op = st_schema[label]
    seen = []
    generation_mode = schemathesis.GenerationMode("negative" if mode == "negative" else "positive")

    @given(case=op.as_strategy(generation_mode=generation_mode))
    @settings(max_examples=30 if label in GENERATE else 12, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case):
        if mode != "negative" and isinstance(case.body, dict):
            if mode == "nudged":
                nudge(case.body)
            elif "model" in case.body:
                case.body["model"] = MODEL  # else nearly every request stops at 404 unknown model
        response = case.call(base_url=st_server.url, timeout=300)
        seen.append(response.status_code)
        assert response.status_code < 500, f"{label} -> {response.status_code}: {response.text[:500]}"
        if "text/event-stream" in str(response.headers.get("content-type")):
            assert '"internal_error"' not in response.text, response.text[:500]

    check()
    assert seen
    print(label, mode, {s: seen.count(s) for s in sorted(set(seen))})
