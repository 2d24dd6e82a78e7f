"""Speculative decoding through the real server (issue 49): ``kestrel serve --speculative-config`` with n-gram prompt
lookup, driven by the official openai client.

- greedy chat and completions, streamed and not, give the text of plain decoding (the offline engine without
  speculation on the same float32 model: ``offline``, tests/server/conftest.py);
- /metrics shows the acceptance and tokens-per-step series, equal to the engine's counts and plausible
  (0 < accepted <= proposed <= k x verify passes, 1 < tokens per pass <= k + 1 on a repetitive prompt);
- a client that leaves mid-stream has its request aborted, every KV block back, and the engine keeps serving
  (speculating) with the same greedy text;
- an invalid --speculative-config is refused at start with a plain message, before any engine process starts.

One server for the module (its own engine process: the session's ``server`` runs without speculation)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from engine.sampling_params import SamplingParams
from tests.server.conftest import MODEL, engine_stats, make_server

K = 4
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
FRUIT = [{"role": "user", "content": "Repeat this list exactly, one item per line: apple, banana, cherry, date, "
                                     "elderberry, fig, grape, honeydew, kiwi, lemon, mango."}]
PROMPT = ("apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango.\n"
          "The same list again:\napple, banana,")
GREEDY = {"temperature": 0, "max_tokens": 32}


@pytest.fixture(scope="module")
def spec_server():
    srv = make_server(engine={"speculative_config": NGRAM})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def spec_api(spec_server):
    from openai import OpenAI

    return OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def chat_ref(offline):
    assert offline.core.spec is None  # the reference decodes plainly
    return offline.chat(FRUIT, SamplingParams(**GREEDY))[0].outputs[0]


def streamed(chunks) -> tuple[str, str | None, object]:
    text, reason, usage = "", None, None
    for ch in chunks:
        usage = ch.usage or usage
        for c in ch.choices:
            text += (c.delta.content if hasattr(c, "delta") else c.text) or ""
            reason = c.finish_reason or reason
    return text, reason, usage


def metrics(srv) -> dict[str, float]:
    """/metrics as {name: value} (the series' labels dropped: one engine, one model)."""
    out = {}
    for line in httpx.get(srv.url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0]] = float(value)
    return out


def test_greedy_chat_equals_plain_decoding(spec_server, spec_api, chat_ref):
    before = engine_stats(spec_server)
    assert before.spec_method == f"ngram k={K} lookup 1..3"
    full = spec_api.chat.completions.create(model=MODEL, messages=FRUIT, **GREEDY)
    assert full.choices[0].message.content == chat_ref.text
    assert full.usage.completion_tokens == len(chat_ref.token_ids)
    assert full.choices[0].finish_reason == chat_ref.finish_reason
    text, reason, usage = streamed(spec_api.chat.completions.create(
        model=MODEL, messages=FRUIT, stream=True, stream_options={"include_usage": True}, **GREEDY))
    assert (text, reason) == (chat_ref.text, chat_ref.finish_reason)
    assert usage.completion_tokens == len(chat_ref.token_ids)
    after = engine_stats(spec_server)
    assert after.spec_accepted_total > before.spec_accepted_total  # the proposals were verified, and some kept


def test_greedy_completions_equal_plain_decoding(spec_server, spec_api, offline):
    params = {**GREEDY, "max_tokens": 24}
    ref = offline.generate([PROMPT], SamplingParams(**params, ignore_eos=True))[0].outputs[0]
    before = engine_stats(spec_server)
    r = spec_api.completions.create(model=MODEL, prompt=PROMPT, extra_body={"ignore_eos": True}, **params)
    assert r.choices[0].text == ref.text and r.usage.completion_tokens == 24
    text, reason, _ = streamed(spec_api.completions.create(model=MODEL, prompt=PROMPT, stream=True,
                                                           extra_body={"ignore_eos": True}, **params))
    assert (text, reason) == (ref.text, "length")
    assert engine_stats(spec_server).spec_accepted_total > before.spec_accepted_total


def test_metrics_show_acceptance_and_tokens_per_step(spec_server, spec_api):
    spec_api.chat.completions.create(model=MODEL, messages=FRUIT, **GREEDY)  # at least one repetitive request
    m = metrics(spec_server)
    s = engine_stats(spec_server)
    proposed = m["kestrel_spec_decode_num_draft_tokens_total"]
    accepted = m["kestrel_spec_decode_num_accepted_tokens_total"]
    passes = m["kestrel_spec_decode_num_drafts_total"]
    assert (proposed, accepted, passes) == (s.spec_proposed_total, s.spec_accepted_total, s.spec_verify_steps_total)
    assert 0 < accepted <= proposed <= K * passes
    assert m["kestrel_spec_decode_acceptance_rate"] == pytest.approx(accepted / proposed)
    per_step = m["kestrel_spec_decode_tokens_per_step"]
    assert per_step == pytest.approx(s.spec_emitted_total / passes)
    # a pass emits its accepted proposals and one token more: on the repeated list, more than one on average
    assert 1 < per_step <= K + 1
    assert per_step <= 1 + accepted / passes + 1e-9


def test_a_client_leaving_mid_stream_leaves_the_engine_serving(spec_server, spec_api, chat_ref):
    idle = engine_stats(spec_server)
    assert idle.num_running == 0 and idle.num_free_blocks == idle.num_kv_blocks
    body = {"model": MODEL, "messages": FRUIT, "temperature": 0, "max_tokens": 400, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=spec_server.url, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            chunks = 0
            while chunks < 12:
                chunks += next(lines).startswith("data: ")
            busy = engine_stats(spec_server)
            assert busy.num_running == 1 and busy.spec_verify_steps_total > idle.spec_verify_steps_total
        # leaving the block closes the connection mid-stream: the server aborts the request
    deadline = time.monotonic() + 30
    s = engine_stats(spec_server)
    while (s.num_running, s.num_free_blocks) != (0, idle.num_free_blocks) and time.monotonic() < deadline:
        time.sleep(0.05)
        s = engine_stats(spec_server)
    assert (s.num_running, s.num_waiting, s.num_free_blocks) == (0, 0, idle.num_free_blocks)
    again = spec_api.chat.completions.create(model=MODEL, messages=FRUIT, **GREEDY)
    assert again.choices[0].message.content == chat_ref.text
    assert engine_stats(spec_server).spec_verify_steps_total > s.spec_verify_steps_total  # still speculating


@pytest.mark.parametrize("bad, says", [
    ("{method: ngram}", "--speculative-config is not JSON"),
    ('{"method": "ngram"}', "num_speculative_tokens must be an integer in 1..16"),
    ('{"method": "medusa", "num_speculative_tokens": 2}', "method must be one of ngram, draft_model"),
])
def test_an_invalid_config_is_refused_at_start(bad, says, capsys):
    """`kestrel serve --speculative-config BAD` exits with status 2 and one plain line, before any engine process
    starts (no start-up progress printed: the model is never loaded)."""
    from engine.cli import main

    assert main(["serve", "--speculative-config", bad, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err, err
    assert err.count("\n") == 1, err  # that line alone: no "loading ..." before it
