"""The Server panel's snippets (app/snippets.py) run as they are against the real server on the default model:
the Python ones under the official openai client, the curl ones' route and body over HTTP."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess

import jsonschema
import pytest

from app.snippets import SNIPPET_KINDS, curl_snippet, python_snippet
from tests.server.conftest import MODEL

KINDS = [k for k, _ in SNIPPET_KINDS]


@pytest.mark.parametrize("kind", KINDS)
def test_python_snippet_runs(server, kind):
    code = python_snippet(server.url, MODEL, None, kind).replace("stream=True", "stream=True, max_tokens=8")
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"snippet-{kind}", "exec"), ns)  # noqa: S102 - our own snippet, the test's subject
    if kind == "tools":
        calls = ns["reply"].choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather"
        assert "city" in json.loads(calls[0].function.arguments)
    elif kind == "json_schema":
        if ns["reply"].choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(ns["reply"].choices[0].message.content), ns["schema"])
    elif kind == "embeddings":
        assert [len(d.embedding) for d in ns["result"].data] == [576, 576]
    assert out.getvalue().strip()


@pytest.mark.parametrize("kind", KINDS)
def test_curl_snippet_body_is_served(http, kind):
    text = curl_snippet("http://HOST", MODEL, "sk-1", kind)
    assert '-H "Authorization: Bearer sk-1"' in text
    assert text.startswith("curl -s ")  # no progress meter in the pasted command's output
    route = re.match(r"curl -s http://HOST(\S+)", text).group(1)
    body = json.loads(re.search(r"-d '(.*)'$", text, re.S).group(1))
    if route.endswith("completions"):  # accepted as written (tools, schema); the Python test runs them whole
        body["max_tokens"] = 1
    r = http.post(route, json=body)
    assert r.status_code == 200, r.text
    if kind == "embeddings":
        assert len(r.json()["data"]) == 2


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl command")
def test_curl_snippet_runs_with_nothing_but_the_answer(server):
    """Pasted into a shell as it is, the curl snippet prints the JSON answer and nothing else (``-s``: no progress
    meter on the terminal)."""
    text = curl_snippet(server.url, MODEL, None, "chat").replace('"stream": false', '"max_tokens": 4, "stream": false')
    r = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout)["choices"][0]["message"]["content"] is not None
