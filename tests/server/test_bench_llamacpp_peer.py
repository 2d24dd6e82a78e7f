"""A second, independent server as a peer of `kestrel bench serve`: llama.cpp's OpenAI-compatible server
(llama-cpp-python[server], the bench extra) on the embedded SmolLM2 GGUF. It sends no ``usage`` while streaming
and ignores ``ignore_eos``: ``--extra-body`` bans the end tokens with a logit bias, so every request generates
exactly its output length, which the bench counts from the finish reason "length" (else a token per chunk). Skipped without llama-cpp-python (CI)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("sse_starlette") is None,
    reason="llama-cpp-python[server] (the bench extra) is not installed")

# SmolLM2's <|endoftext|> and <|im_end|>: banned, llama.cpp's server generates max_tokens as ignore_eos would
NO_EOS = json.dumps({"logit_bias": {"0": -100, "2": -100}})


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def llamacpp_server(smollm2_gguf, tmp_path_factory):
    import httpx

    port = _free_port()
    log = tmp_path_factory.mktemp("llamacpp") / "server.log"  # a file: llama.cpp logs more than a pipe holds
    sink = open(log, "wb")  # noqa: SIM115 - closed with the server
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf),
                             "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port),
                             "--n_threads", "2", "--n_ctx", "2048", "--interrupt_requests", "False"],
                            stdout=subprocess.DEVNULL, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama.cpp's server exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama.cpp's server did not start in 120 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        sink.close()


def test_bench_serve_against_llamacpps_server(llamacpp_server, smollm2_gguf, tmp_path):
    from engine.cli import main

    out = tmp_path / "llamacpp.json"
    rc = main(["bench", "sweep", "--base-url", llamacpp_server, "--num-prompts", "3", "--random-input-len", "16",
               "--random-output-len", "6", "--max-concurrency", "1", "2", "--num-warmups", "1", "--seed", "3",
               "--extra-body", NO_EOS, "--disable-tqdm", "--result-filename", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["server"]["model"] == "smollm2" and rep["server"]["kestrel"] is None  # not Kestrel's server
    assert rep["sampling"]["extra_body"] == json.loads(NO_EOS)
    for p in rep["points"]:
        m = p["metrics"]
        assert m["completed"] == 3 and m["failed"] == 0 and not p["usage_reported"]
        for r in p["requests"]:
            assert r["output_tokens"] == r["max_tokens"] == 6 and r["finish_reason"] == "length"  # no early end
            assert 1 <= r["chunks"] <= 6
            assert 0 < r["ttft"] <= r["e2el"] and len(r["itl"]) == 5
        assert m["total_output_tokens"] == 18
