"""The engine process dies under a live server: clients get an error at once, the engine is restarted with the
same model and options (with back-off and a limit), /health, /v1/models and /metrics say so meanwhile, and the
next request works. Past the limit the engine stays dead, and `kestrel serve` exits (status 1) so that a
service manager can start it again.

Reproduction of the reliability report: after the engine died, /health stayed 503 for ever, /v1/models
still answered 200 and the server never exited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from engine.frontend.client import RestartPolicy
from tests.server.conftest import MODEL, make_server

FAKE = "tests.server.fake_engine:FakeCore"
ROOT = Path(__file__).resolve().parents[2]


def metric(text: str, name: str) -> float:
    return next(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name))


def wait_health(c: httpx.Client, status: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = c.get("/health").json()
        if h["status"] == status:
            return h
        assert time.monotonic() < deadline, h
        time.sleep(0.05)


def test_killed_engine_is_restarted_and_the_next_request_works():
    srv = make_server(restart=RestartPolicy(delay_s=0.5))
    try:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
                "ignore_eos": True}
        greedy = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
                  "ignore_eos": True}
        results: dict[str, object] = {}
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            before = c.post("/v1/completions", json=greedy).json()["choices"][0]["text"]

            def whole():
                with httpx.Client(base_url=srv.url, timeout=60) as c2:
                    r = c2.post("/v1/completions", json=body)
                    results["whole"] = (time.monotonic(), r.status_code, r.json(), r.headers.get("retry-after"))

            def streamed():
                with httpx.Client(base_url=srv.url, timeout=60) as c2, \
                        c2.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                    lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
                    results["stream"] = (time.monotonic(), r.status_code, lines[-2:])

            threads = [threading.Thread(target=whole), threading.Thread(target=streamed)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 120
            while srv.call(srv.client.stats()).num_running < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            first_pid = srv.client.engine_pid
            os.kill(first_pid, signal.SIGKILL)
            killed = time.monotonic()
            for t in threads:
                t.join(10)
            t_whole, status, err, retry = results["whole"]
            assert status == 503 and err["error"]["type"] == "engine_restarting" and retry == "5"
            assert "SIGKILL" in err["error"]["message"] and t_whole - killed < 2
            t_stream, status, tail = results["stream"]
            assert status == 200 and '"engine_restarting"' in tail[0] and tail[1] == "data: [DONE]"
            assert t_stream - killed < 2
            # while it restarts: said so everywhere, and no model is listed
            h = c.get("/health")
            if h.status_code == 503:  # (the restart may already be done on a fast machine)
                assert h.json()["status"] == "restarting" and "SIGKILL" in h.json()["reason"]
                assert c.get("/v1/models").status_code in (200, 503)
            h = wait_health(c, "ok")
            back = time.monotonic() - killed
            assert h["restarts"] == 1 and srv.client.engine_pid != first_pid
            assert c.get("/v1/models").json()["data"][0]["id"] == MODEL
            m = c.get("/metrics").text
            assert metric(m, "kestrel_engine_restarts_total") == 1 and metric(m, "kestrel_engine_healthy") == 1
            assert c.post("/v1/completions", json=greedy).json()["choices"][0]["text"] == before
            print(f"engine killed under the server: clients told in {max(t_whole, t_stream) - killed:.2f} s, "
                  f"serving again after {back:.1f} s")
    finally:
        srv.stop()
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE


def test_models_answer_503_while_the_engine_restarts_and_the_limit_holds():
    srv = make_server(core_factory=FAKE, restart=RestartPolicy(max_restarts=2, delay_s=1.0))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for n in (1, 2):
                os.kill(srv.client.engine_pid, signal.SIGKILL)
                h = wait_health(c, "restarting", 10)
                assert "restart" in h["reason"] and h["restarts"] == n - 1
                r = c.get("/v1/models")
                assert r.status_code == 503 and r.json()["error"]["type"] == "engine_restarting"
                assert c.get(f"/v1/models/{MODEL}").status_code == 503
                assert metric(c.get("/metrics").text, "kestrel_engine_restarting") == 1
                assert wait_health(c, "ok", 30)["restarts"] == n
                assert c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2}).json()["choices"][0]["text"] \
                    == "cd"
            os.kill(srv.client.engine_pid, signal.SIGKILL)  # a third death within the window: it stays dead
            h = wait_health(c, "dead", 10)
            assert "restarted 2 times" in h["reason"] and h["restarts"] == 2
            assert c.get("/v1/models").status_code == 503
            m = c.get("/metrics").text
            assert metric(m, "kestrel_engine_healthy") == 0 and metric(m, "kestrel_engine_restarts_total") == 2
            time.sleep(1.5)
            assert c.get("/health").json()["status"] == "dead"  # no restart after giving up
    finally:
        srv.stop()


def test_kestrel_serve_exits_when_the_engine_is_dead_for_good():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--port", "0", "--dtype", "float32",
                             "--max-engine-restarts", "0", "--api-key", "sk-visible"],
                            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        url = None
        while url is None:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read()[-2000:]
            if line.startswith("OpenAI base URL:"):
                url = line.split()[3]
            assert time.monotonic() < deadline
        engines = [p for p in psutil.Process(proc.pid).children() if "engine.core.process" in " ".join(p.cmdline())]
        assert len(engines) == 1
        assert httpx.get(url.removesuffix("/v1") + "/health").json()["status"] == "ok"
        engines[0].kill()
        t0 = time.monotonic()
        code = proc.wait(30)
        took = time.monotonic() - t0
        err = proc.stderr.read()
        assert code == 1 and took < 10, (code, err[-2000:])
        assert "SIGKILL" in err and "service manager" in err
        assert "visible to other users" in err  # --api-key on the command line is warned about
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
