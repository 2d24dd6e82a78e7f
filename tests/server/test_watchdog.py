"""An engine process that stops answering under a live server (SIGSTOP: the process is there, holds its sockets,
answers nothing) is noticed by the client's watchdog through the missing heartbeats: /health says so (503,
"restarting", why), /metrics counts it, the requests in flight fail with an error (a 503 and a stream's error
event, not a hang until the client gives up), the stopped process is killed (nothing left behind) and a new one
serves the next request.

Reproduction of the report: with SIGSTOP, /health said ok and completions hung until the client gave up."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil

from engine.frontend.client import RestartPolicy
from tests.server.conftest import MODEL, make_server


def metric(text: str, name: str) -> float:
    return next(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name))


def test_stopped_engine_is_detected_its_requests_fail_and_it_is_replaced():
    srv = make_server(restart=RestartPolicy(delay_s=0.5))
    stopped_pid = None
    try:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
                "ignore_eos": True}
        results: dict[str, object] = {}

        def whole():
            with httpx.Client(base_url=srv.url, timeout=120) as c2:
                r = c2.post("/v1/completions", json=body)
                results["whole"] = (r.status_code, r.json())

        def streamed():
            with httpx.Client(base_url=srv.url, timeout=120) as c2, \
                    c2.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
                results["stream"] = (r.status_code, lines[-2:])

        with httpx.Client(base_url=srv.url, timeout=60) as c:
            assert c.get("/health").json()["status"] == "ok"
            threads = [threading.Thread(target=whole), threading.Thread(target=streamed)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 120
            while srv.call(srv.client.stats()).num_running < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            stopped_pid = srv.client.engine_pid
            os.kill(stopped_pid, signal.SIGSTOP)
            t_stop = time.monotonic()
            deadline = t_stop + 120
            while (h := c.get("/health")).status_code == 200:
                assert time.monotonic() < deadline, "the stopped engine was never noticed"
                time.sleep(0.05)
            noticed = time.monotonic() - t_stop
            assert h.status_code == 503 and h.json()["status"] == "restarting", h.text
            reason = h.json()["reason"]
            assert "stopped answering" in reason and "no heartbeat for" in reason, reason
            seconds = float(reason.split("no heartbeat for ", 1)[1].split(" s", 1)[0])
            assert seconds < 10  # the watchdog's own measure (its policy: 5 s of silence)
            for t in threads:
                t.join(60)
            status, err = results["whole"]
            assert status == 503 and err["error"]["type"] == "engine_restarting"
            assert "stopped answering" in err["error"]["message"]
            status, tail = results["stream"]
            assert status == 200 and '"engine_restarting"' in tail[0] and tail[1] == "data: [DONE]"
            # the stopped process was killed, not left behind
            deadline = time.monotonic() + 30
            while psutil.pid_exists(stopped_pid) and psutil.Process(stopped_pid).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "the stopped engine process was left running"
                time.sleep(0.05)
            deadline = time.monotonic() + 300
            while (h := c.get("/health").json())["status"] != "ok":
                assert time.monotonic() < deadline, h
                time.sleep(0.1)
            assert h["restarts"] == 1 and srv.client.engine_pid != stopped_pid
            m = c.get("/metrics").text
            assert metric(m, "kestrel_engine_hangs_total") == 1 and metric(m, "kestrel_engine_restarts_total") == 1
            assert metric(m, "kestrel_engine_heartbeat_age_seconds") < 10
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": "The capital of France is",
                                                 "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            print(f"engine stopped (SIGSTOP) under the server: /health said so after {noticed:.1f} s "
                  f"(watchdog: no heartbeat for {seconds:.1f} s); serving again after "
                  f"{time.monotonic() - t_stop:.1f} s")
    finally:
        if stopped_pid is not None:
            try:
                os.kill(stopped_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        srv.stop()
