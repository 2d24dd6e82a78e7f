"""Kill the engine process under a live server: requests fail with 503 within 2 s, /health says why."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from tests.server.conftest import MODEL, engine_stats, make_server


def test_killed_engine_gives_503_within_two_seconds():
    srv = make_server()
    try:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
                "ignore_eos": True}
        results: dict[str, object] = {}

        def whole():
            with httpx.Client(base_url=srv.url, timeout=60) as c:
                r = c.post("/v1/completions", json=body)
                results["whole"] = (time.monotonic(), r.status_code, r.json())

        def streamed():
            with httpx.Client(base_url=srv.url, timeout=60) as c, \
                    c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
                results["stream"] = (time.monotonic(), r.status_code, lines[-2:])

        threads = [threading.Thread(target=whole), threading.Thread(target=streamed)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while engine_stats(srv).num_running < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(srv.client.engine_pid, signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(10)
        t_whole, status, err = results["whole"]
        assert status == 503 and err["error"]["type"] == "engine_dead" and "SIGKILL" in err["error"]["message"]
        assert t_whole - killed < 2
        t_stream, status, tail = results["stream"]
        assert status == 200 and '"engine_dead"' in tail[0] and tail[1] == "data: [DONE]"  # headers were sent
        assert t_stream - killed < 2
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            t0 = time.monotonic()
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 503 and time.monotonic() - t0 < 2
            assert r.json()["error"]["type"] == "engine_dead"
            h = c.get("/health")
            assert h.status_code == 503
            assert h.json()["status"] == "dead" and "SIGKILL" in h.json()["reason"]
            assert c.post("/tokenize", json={"prompt": "x"}).status_code == 503
            m = c.get("/metrics")
            assert m.status_code == 200 and "kestrel_engine_healthy{model_name=\"smollm2\"} 0.0" in m.text
    finally:
        srv.stop()
    assert srv.client._proc.poll() is not None
