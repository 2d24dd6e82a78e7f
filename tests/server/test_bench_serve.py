"""`kestrel bench serve` / `sweep` (engine/bench/load.py, serve.py, sweep.py): the metric maths on synthetic
timings, the seeded arrival process and datasets (no server); then real runs against the embedded SmolLM2
server (tests/server/conftest.py): metric invariants, token counts equal to what the server observed, the
report's keys, a seeded run repeating its requests, a sweep of two points, and GET /v1/server_info."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest

from engine.bench import load
from engine.bench.sweep import sweep_points
from tests.server.conftest import MODEL, make_server

FAKE = "tests.server.fake_engine:FakeCore"


# ------------------------------------------------------------------------------------------------
# pure: metrics, goodput, arrivals, datasets


def _result(i, ttft, e2el, out, itl=(), prompt=10):
    return load.RequestResult(index=i, success=True, prompt_len=prompt, output_tokens=out, usage_reported=True,
                              ttft=ttft, e2el=e2el, itl=list(itl), chunks=out)


def test_metrics_on_synthetic_timings():
    rs = [_result(0, 0.1, 1.1, 11, [0.1] * 10, prompt=10),  # tpot (1.1 - 0.1) / 10 = 0.1
          _result(1, 0.2, 0.6, 5, [0.1] * 4, prompt=20),  # tpot 0.4 / 4 = 0.1
          _result(2, 0.3, 0.3, 1, [], prompt=30),  # one token: no TPOT
          load.RequestResult(index=3, error="HTTP 500")]
    m = load.compute_metrics(rs, 2.0, goodput={"ttft": 250, "tpot": 100},
                             percentile_metrics=("ttft", "tpot", "itl", "e2el"), percentiles=(50, 90, 99))
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_input_tokens"] == 60 and m["total_output_tokens"] == 17
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(8.5)
    assert m["total_token_throughput"] == pytest.approx(38.5)
    assert m["mean_ttft_ms"] == pytest.approx(200) and m["median_ttft_ms"] == pytest.approx(200)
    assert m["p90_ttft_ms"] == pytest.approx(280)  # numpy's linear interpolation: 200 + 0.8 * 100
    assert m["std_ttft_ms"] == pytest.approx(statistics.pstdev([100, 200, 300]))
    assert m["mean_tpot_ms"] == pytest.approx(100)  # the single-token request has none
    assert m["mean_itl_ms"] == pytest.approx(100) and m["p99_itl_ms"] == pytest.approx(100)
    assert m["mean_e2el_ms"] == pytest.approx(2000 / 3) and m["median_e2el_ms"] == pytest.approx(600)
    # goodput: ttft <= 250 ms and tpot <= 100 ms (tpot 0 for the one-token request): requests 0 and 1
    assert m["good_completed"] == 2 and m["request_goodput"] == pytest.approx(1.0)
    m2 = load.compute_metrics(rs, 2.0, goodput={"e2el": 500}, percentile_metrics=("ttft",), percentiles=(99,))
    assert m2["good_completed"] == 1  # only request 2 ends within 500 ms
    assert "mean_tpot_ms" not in m2 and "p99_ttft_ms" in m2 and "p50_ttft_ms" not in m2


def test_metrics_of_no_success_and_goodput_flags():
    m = load.compute_metrics([load.RequestResult(index=0, error="x")], 1.0)
    assert m["completed"] == 0 and m["failed"] == 1 and m["output_throughput"] == 0
    assert load.parse_goodput(["ttft:500", "tpot:50", "e2el:2000.5"]) == {"ttft": 500, "tpot": 50, "e2el": 2000.5}
    for bad in (["itl:5"], ["ttft"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            load.parse_goodput(bad)


def test_arrivals_poisson_and_burstiness_seeded():
    assert load.arrival_delays(5) == [0.0] * 5  # rate inf: all at once
    a = load.arrival_delays(20000, request_rate=4.0, burstiness=1.0, seed=7)
    assert a == load.arrival_delays(20000, request_rate=4.0, burstiness=1.0, seed=7)
    assert a != load.arrival_delays(20000, request_rate=4.0, burstiness=1.0, seed=8)
    for k in (0.25, 1.0, 4.0):
        d = load.arrival_delays(20000, request_rate=4.0, burstiness=k, seed=1)
        mean = statistics.fmean(d)
        cv2 = statistics.pvariance(d) / mean ** 2  # gamma of shape k: mean k * theta = 1 / rate, CV^2 = 1 / k
        assert mean == pytest.approx(0.25, rel=0.05)
        assert cv2 == pytest.approx(1 / k, rel=0.1)
        assert min(d) > 0
    for bad in ({"request_rate": 0}, {"request_rate": 1, "burstiness": 0}):
        with pytest.raises(ValueError):
            load.arrival_delays(3, **bad)


def test_datasets_seeded(tmp_path):
    tok = load.Tokenizer("estimate")
    r = load.random_dataset(tok, 200, 100, 20, 0.5, seed=3)
    assert r == load.random_dataset(tok, 200, 100, 20, 0.5, seed=3)
    assert all(50 <= s.prompt_len <= 150 and 10 <= s.max_tokens <= 30 for s in r)
    assert len({s.prompt_len for s in r}) > 10
    assert all(len(s.prompt.split()) == s.prompt_len for s in r)  # word prompts: one word per target token
    f = load.random_dataset(tok, 5, 12, 3, 0.0, seed=3)
    assert {(s.prompt_len, s.max_tokens) for s in f} == {(12, 3)}
    p = load.prefix_dataset(tok, 12, 8, 4, 3, 5, seed=0)
    assert len({" ".join(s.prompt.split()[:8]) for s in p}) == 3 and {s.max_tokens for s in p} == {5}
    data = [{"conversations": [{"from": "human", "value": "word " * n}, {"from": "gpt", "value": "reply " * 10}]}
            for n in (30, 2, 40, 50)] + [{"conversations": [{"from": "human", "value": "alone"}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    s = load.sharegpt_dataset(tok, str(path), 3, seed=0)
    assert sorted(x.prompt_len for x in s) == [38, 50, 62]  # 5-character words: 4 chars per token estimate
    assert s == load.sharegpt_dataset(tok, str(path), 3, seed=0)
    with pytest.raises(ValueError):
        load.sharegpt_dataset(tok, str(path), 4, seed=0)  # the 2-word prompt is filtered out
    assert len(load.sharegpt_dataset(tok, str(path), 4, output_len=7, seed=0)) == 4


def test_bad_arguments_are_refused(capsys):
    from engine.cli import main

    base = ["bench", "serve", "--base-url", "http://127.0.0.1:9"]
    for extra in (["--goodput", "ttft"], ["--percentile-metrics", "ttft,foo"], ["--metric-percentiles", "101"],
                  ["--dataset-name", "sharegpt"], ["--num-prompts", "0"]):
        assert main([*base, *extra]) == 2, extra
    assert main([*base, "--num-prompts", "1"]) == 2  # nothing listens there: no model from /v1/models
    assert "is the server up" in capsys.readouterr().err


def test_progress_without_tqdm(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError: the plain bar on stderr
    bar = load.Progress(4, desc="run")
    for _ in range(4):
        bar.update()
    bar.close()
    err = capsys.readouterr().err
    assert "run [" in err and err.rstrip().endswith("4/4") and "#" * 30 in err


def test_sweep_points_product():
    import argparse

    args = argparse.Namespace(max_concurrency=[1, 2], request_rate=[math.inf], random_input_len=[8, 16],
                              random_output_len=[4])
    pts = sweep_points(args)
    assert [(p["max_concurrency"], p["random_input_len"]) for p in pts] == [(1, 8), (1, 16), (2, 8), (2, 16)]


# ------------------------------------------------------------------------------------------------
# against the real server


def _metric_sum(text: str, name: str) -> float:
    m = re.search(rf"^{name}_sum\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def _bench(argv: list[str], out) -> dict:
    from engine.cli import main

    assert main(["bench", *argv, "--result-filename", str(out), "--disable-tqdm"]) == 0
    return json.loads(out.read_text())


def test_serve_completions_invariants_and_report(server, http, tmp_path, capsys):
    before = http.get("/metrics").text
    rep = _bench(["serve", "--base-url", server.url, "--num-prompts", "6", "--random-input-len", "24",
                  "--random-output-len", "4", "--random-range-ratio", "0.5", "--max-concurrency", "3",
                  "--ignore-eos", "--num-warmups", "0", "--seed", "5", "--goodput", "ttft:600000", "tpot:600000",
                  "--metadata", "note=test"], tmp_path / "serve.json")
    after = http.get("/metrics").text
    printed = capsys.readouterr().out
    assert "Output token throughput" in printed and "P99 TTFT (ms)" in printed
    for key in ("benchmark", "date", "command", "args", "client", "server", "dataset", "arrivals", "sampling",
                "goodput_slos_ms", "seed", "metrics", "requests", "usage_reported", "errors", "metadata"):
        assert key in rep, key
    assert rep["benchmark"] == "serve" and rep["command"].startswith("kestrel bench serve --base-url")
    assert rep["metadata"] == {"note": "test"} and rep["seed"] == 5
    assert rep["client"]["cpu"] and rep["client"]["versions"]["httpx"]
    k = rep["server"]["kestrel"]
    assert k["engine"] == "kestrel" and k["dtype"] == "float32" and k["tensor_parallel_size"] == 1
    assert k["quantization"] in (None, "none") or isinstance(k["quantization"], str)
    assert rep["server"]["model"] == MODEL and rep["server"]["endpoint"] == "/v1/completions"
    assert rep["dataset"] == {"name": "random", "num_prompts": 6, "seed": 5, "tokenizer": "server", "input_len": 24,
                              "output_len": 4, "range_ratio": 0.5}
    assert rep["arrivals"]["request_rate"] == "inf" and rep["arrivals"]["max_concurrency"] == 3
    m, reqs = rep["metrics"], rep["requests"]
    assert m["completed"] == 6 and m["failed"] == 0 and rep["usage_reported"] and not rep["errors"]
    for r in reqs:
        assert 0 < r["ttft"] <= r["e2el"]
        assert r["output_tokens"] == r["max_tokens"]  # ignore_eos: exactly the asked length
        assert len(r["itl"]) == r["chunks"] - 1 and sum(r["itl"]) <= r["e2el"] - r["ttft"] + 1e-6
    # token counts: the usage the server reported, equal to what its own metrics observed
    assert m["total_output_tokens"] == sum(r["output_tokens"] for r in reqs)
    assert m["total_input_tokens"] == sum(r["prompt_len"] for r in reqs)
    assert _metric_sum(after, "kestrel_request_generation_tokens") - \
        _metric_sum(before, "kestrel_request_generation_tokens") == m["total_output_tokens"]
    assert _metric_sum(after, "kestrel_request_prompt_tokens") - \
        _metric_sum(before, "kestrel_request_prompt_tokens") == m["total_input_tokens"]
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert m[f"p50_{name}_ms"] <= m[f"p90_{name}_ms"] <= m[f"p99_{name}_ms"]
        assert m[f"median_{name}_ms"] == m[f"p50_{name}_ms"]
    assert m["mean_ttft_ms"] <= m["mean_e2el_ms"]
    assert m["good_completed"] == 6
    assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / m["duration"])


def test_serve_seeded_run_repeats_its_requests(server, tmp_path):
    argv = ["serve", "--base-url", server.url, "--endpoint-type", "chat", "--num-prompts", "4",
            "--random-input-len", "12", "--random-output-len", "3", "--random-range-ratio", "0.3",
            "--request-rate", "50", "--burstiness", "0.5", "--num-warmups", "1", "--ignore-eos"]
    a = _bench([*argv, "--seed", "11"], tmp_path / "a.json")
    b = _bench([*argv, "--seed", "11"], tmp_path / "b.json")
    c = _bench([*argv, "--seed", "12"], tmp_path / "c.json")

    def asked(rep):
        return [(r["digest"], r["target_input_len"], r["max_tokens"], r["prompt_len"]) for r in rep["requests"]]

    assert asked(a) == asked(b) and asked(a) != asked(c)
    assert a["server"]["endpoint"] == "/v1/chat/completions" and a["arrivals"]["burstiness"] == 0.5
    assert all(r["output_tokens"] == r["max_tokens"] and r["ttft"] <= r["e2el"] for r in a["requests"])
    gaps = load.arrival_delays(4, 50, 0.5, seed=11)  # request i is sent gaps[0] + ... + gaps[i - 1] s in
    due = [sum(gaps[:i]) for i in range(4)]
    starts = [r["start"] for r in a["requests"]]
    assert starts[0] < 0.5 and all(s >= d - 1e-3 for s, d in zip(starts, due)) and starts == sorted(starts)


def test_sweep_two_points(server, tmp_path, capsys):
    rep = _bench(["sweep", "--base-url", server.url, "--num-prompts", "3", "--random-input-len", "8",
                  "--random-output-len", "3", "--max-concurrency", "1", "3", "--ignore-eos", "--num-warmups", "0"],
                 tmp_path / "sweep.json")
    out = capsys.readouterr().out
    assert rep["benchmark"] == "sweep" and rep["sweep"]["max_concurrency"] == [1, 3]
    assert [p["params"]["max_concurrency"] for p in rep["points"]] == [1, 3]
    for p in rep["points"]:
        assert p["metrics"]["completed"] == 3 and p["metrics"]["total_output_tokens"] == 9
        assert p["arrivals"]["max_concurrency"] == p["params"]["max_concurrency"]
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["conc", "rate"])
    assert [ln.split()[0] for ln in lines[head + 1:head + 3]] == ["1", "3"]
    assert lines[head + 3].startswith("report written to")


def test_server_info_and_api_key(tmp_path):
    import httpx

    srv = make_server(core_factory=FAKE, api_key="sk-bench")
    try:
        assert httpx.get(srv.url + "/v1/server_info").status_code == 401
        info = httpx.get(srv.url + "/v1/server_info", headers={"Authorization": "Bearer sk-bench"}).json()
        assert info["engine"] == "kestrel" and info["served_model_names"] == [MODEL]
        assert info["tensor_parallel_size"] == 1 and info["comm_strategy"] is None
        assert "enable_prefix_caching" in info["engine_config"] and "path" not in info
        assert info["host"]["cpu"] and info["host"]["logical_cpus"] >= 1 and "gpus" in info["host"]
        # the fake engine's vocabulary (256) refuses /detokenize of random ids: word prompts, usage counts
        rep = _bench(["serve", "--base-url", srv.url + "/v1", "--api-key", "sk-bench", "--num-prompts", "2",
                      "--random-input-len", "5", "--random-output-len", "3", "--num-warmups", "0"],
                     tmp_path / "keyed.json")
        assert rep["metrics"]["completed"] == 2 and rep["dataset"]["tokenizer"] == "estimate"
        assert "sk-bench" not in json.dumps(rep)
        assert "--api-key REDACTED" in rep["command"]
        assert rep["server"]["kestrel"]["served_model_names"] == [MODEL]
    finally:
        srv.stop()


def test_extra_body_is_merged_into_every_request_and_recorded(tmp_path, capsys):
    """--extra-body (a JSON object) rides in every request, warm-up included, and in the report's sampling; for a
    server without ignore_eos (llama.cpp's: tests/server/test_bench_llamacpp_peer.py)."""
    from engine.bench.serve import add_args

    body = load.request_body("completions", "m", load.SampleRequest("hi", 1, 4), ignore_eos=True,
                             extra={"logit_bias": {"2": -100}, "top_k": 1})
    assert body["logit_bias"] == {"2": -100} and body["top_k"] == 1 and body["ignore_eos"] and body["max_tokens"] == 4
    import argparse

    p = argparse.ArgumentParser()
    add_args(p)
    assert p.parse_args(["--extra-body", '{"top_k": 1}']).extra_body == {"top_k": 1}
    for bad in ("[1]", "{top_k: 1}"):
        with pytest.raises(SystemExit):
            p.parse_args(["--extra-body", bad])
    assert "--extra-body" in capsys.readouterr().err
    srv = make_server(core_factory=FAKE)
    try:
        rep = _bench(["serve", "--base-url", srv.url, "--num-prompts", "2", "--random-input-len", "5",
                      "--random-output-len", "3", "--num-warmups", "1", "--extra-body", '{"top_k": 1}'],
                     tmp_path / "extra.json")
        assert rep["sampling"]["extra_body"] == {"top_k": 1} and rep["metrics"]["completed"] == 2
        assert "--extra-body" in rep["command"]
    finally:
        srv.stop()


def test_output_tokens_without_usage():
    """A server that sends no usage (llama.cpp's): a reply that finished for length generated max_tokens, even
    when a chunk carries several tokens (the bytes of a multi-byte character held back); else a token per chunk."""
    import asyncio

    import httpx

    def sse(chunks: list[tuple[str, str | None]]) -> bytes:
        events = [json.dumps({"choices": [{"index": 0, "text": t, "finish_reason": f}]}) for t, f in chunks]
        return "".join(f"data: {e}\n\n" for e in [*events, "[DONE]"]).encode()

    replies = {"length": sse([(" a", None), (" 日本", None), (" b", None), ("", "length")]),
               "stop": sse([(" a", None), (" b", None), ("", "stop")])}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=replies[json.loads(request.content)["prompt"]],
                              headers={"content-type": "text/event-stream"})

    async def go(prompt: str) -> load.RequestResult:
        body = load.request_body("completions", "m", load.SampleRequest(prompt, 1, 5))
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await load.send_request(http, "http://x/v1/completions", body, 0, 0.0)

    r = asyncio.run(go("length"))
    assert r.success and not r.usage_reported and r.chunks == 3 and r.finish_reason == "length"
    assert r.output_tokens == 5  # max_tokens, not the 3 chunks
    s = asyncio.run(go("stop"))
    assert s.success and s.finish_reason == "stop" and s.output_tokens == s.chunks == 2
