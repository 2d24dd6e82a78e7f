"""Request bodies that Python's JSON parser would turn into a 500 get a 400 naming the problem, on every route that
takes a body: nesting past MAX_JSON_DEPTH (RecursionError near 1,000 levels before) and an unpaired UTF-16
surrogate escape (UnicodeEncodeError wherever the text was written out before), in any field (issue 47)."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.server.openai.body_checks import MAX_JSON_DEPTH, check_json_body, json_depth, lone_surrogate
from engine.server.openai.limits import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_STOP_STRINGS
from tests.server.conftest import MODEL, make_server

ROUTES = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"model": MODEL, "input": "hi"},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2},
    "/tokenize": {"model": MODEL, "prompt": "hi"},
    "/detokenize": {"model": MODEL, "tokens": [1, 2]},
}


@pytest.fixture(scope="module")
def http():
    srv = make_server(core_factory="tests.server.fake_engine:FakeCore")
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c
    srv.stop()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_deep_nesting_is_a_400_on_every_route(http, route):
    for depth in (MAX_JSON_DEPTH + 1, 999, 5000):
        body = json.dumps(ROUTES[route])[:-1] + f', "metadata": {nested(depth)}}}'
        r = http.post(route, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (route, depth, r.status_code, r.text[:200])
        assert f"{depth + 1} levels deep" in r.json()["error"]["message"]  # (the body object is one more)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_lone_surrogate_is_a_400_on_every_route(http, route):
    body = json.dumps(ROUTES[route]).replace(json.dumps(MODEL), '"\\ud800' + MODEL + '"', 1)
    assert "\\ud800" in body
    r = http.post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, (route, r.status_code, r.text[:200])
    assert "\\ud800" in r.json()["error"]["message"]


def test_bodies_within_the_bounds_still_reach_the_handlers(http):
    shallow = dict(ROUTES["/tokenize"], prompt="\U0001F600 a paired surrogate, escaped",
                   extra_depth=json.loads(nested(MAX_JSON_DEPTH - 1)))
    text = json.dumps(shallow)  # ensure_ascii: the emoji goes as a \ud83d\ude00 pair
    assert "\\ud83d\\ude00" in text
    r = http.post("/tokenize", content=text, headers={"content-type": "application/json"})
    assert r.status_code != 500 and "levels deep" not in r.text and "surrogate" not in r.text, r.text[:300]
    r = http.post("/tokenize", json=ROUTES["/tokenize"])
    assert r.status_code == 200 and r.json()["count"] > 0


def test_depth_ignores_brackets_inside_strings_and_escapes():
    assert json_depth(b'{"a": "[[[[{{{{", "b": [1, {"c": []}]}') == 4
    assert json_depth(b'["\\"[[[", [[]]]') == 3
    assert json_depth(nested(2000).encode()) == 2000
    assert json_depth(b'"no brackets"') == 0
    for run in (1, 2, 63, 64, 65, 200, 201):  # a quote after an odd run of backslashes is escaped
        text = b'["' + b"\\" * run + b'" "[[[", [[]]]' if run % 2 else b'["' + b"\\" * run + b'", [[]]]'
        text = text.replace(b'" "', b'"') if run % 2 else text
        assert json.loads(text) is not None
        assert json_depth(text) == 3, run


@pytest.mark.parametrize("text,bad", [
    (r'"\ud800"', r"\ud800"), (r'"x\udc00"', r"\udc00"), (r'"\ud800\ud800\udc00"', r"\ud800"),
    (r'"\ud83d\ude00"', None), (r'"\uDBFF\uDFFF"', None),
    (r'"\\ud800"', None),  # an escaped backslash, then the letters "ud800"
    (r'"\\\ud800"', r"\ud800"),  # an escaped backslash, then a lone surrogate escape
])
def test_lone_surrogates_are_found_and_pairs_are_not(text, bad):
    assert json.loads(text) is not None  # all of them are JSON that Python's parser accepts
    assert lone_surrogate(text.encode()) == bad
    if bad:
        with pytest.raises(Exception, match="surrogate"):
            check_json_body(text.encode())
    else:
        check_json_body(text.encode())


# Lists over their bounds are refused before the body is parsed (body_checks.precheck_body), on /v1/responses as on
# chat: the refusal comes first even where the parsed body would be a 422 (a temperature that is not a number).
# (route, fields, the param named); the item counts are those of engine.server.openai.limits.
TOO_MANY = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)}, "messages"),
    ("/v1/responses", {"input": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)}, "input"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]
                                            * (MAX_CONTENT_PARTS + 1)}]}, "messages[0].content"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]
                                  * (MAX_CONTENT_PARTS + 1)}]}, "input[0].content"),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "c",
                                  "output": [{"type": "input_text", "text": "x"}] * (MAX_CONTENT_PARTS + 1)}]},
     "input[0].output"),
    ("/v1/responses", {"input": "hi", "stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
]


@pytest.mark.parametrize("route,fields,param", TOO_MANY, ids=[f"{r}:{p}" for r, _, p in TOO_MANY])
def test_lists_over_their_bounds_are_refused_before_parsing(http, route, fields, param):
    body = {**ROUTES[route], **fields, "temperature": "hot"}
    r = http.post(route, json=body)
    assert r.status_code == 400, (route, param, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["param"] == param and "Too many" in err["message"], err
    r = http.post(route, json={**ROUTES[route], **fields})  # and without the bad temperature, the same
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text[:300]
