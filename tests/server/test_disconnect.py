"""A client that goes away has its request aborted and its KV blocks freed."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import MODEL, engine_stats

LONG = {"model": MODEL, "max_tokens": 4000, "temperature": 0, "ignore_eos": True}


def wait_idle(server, idle_free: int, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        s = engine_stats(server)
        if (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, idle_free) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a long story."}], "n": 2}),
    ("/v1/completions", {"prompt": "Once upon a time"}),
])
def test_disconnect_mid_stream_frees_the_blocks(server, route, body):
    idle = engine_stats(server)
    assert idle.num_running == 0 and idle.num_free_blocks == idle.num_kv_blocks
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", route, json={**LONG, **body, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: dropping a half-read httpx iterator closes the connection
            chunks = 0
            while chunks < 6:
                chunks += next(lines).startswith("data: ")
            busy = engine_stats(server)
            assert busy.num_running == body.get("n", 1) and busy.num_free_blocks < idle.num_free_blocks
        # leaving the block closes the connection mid-stream
    s = wait_idle(server, idle.num_free_blocks)
    assert (s.num_running, s.num_free_blocks) == (0, idle.num_free_blocks)


def test_disconnect_while_waiting_for_a_whole_response(server):
    idle = engine_stats(server)
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60, read=3)) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/completions", json={**LONG, "prompt": "Once upon a time"})
    s = wait_idle(server, idle.num_free_blocks)
    assert (s.num_running, s.num_free_blocks) == (0, idle.num_free_blocks)
