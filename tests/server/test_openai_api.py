"""The official openai client against a real uvicorn server serving the default model (float32)."""

from __future__ import annotations

import json

import openai
import pytest

from engine.sampling_params import SamplingParams
from tests.server.conftest import MODEL

CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three colours."}]


def hf_chat_ids(tok, messages) -> list[int]:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])  # transformers 5: a BatchEncoding


def stream_text(chunks) -> tuple[dict[int, str], dict[int, str], object]:
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for ch in chunks:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            piece = c.delta.content if hasattr(c, "delta") else c.text
            texts[c.index] = texts.get(c.index, "") + (piece or "")
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    return texts, reasons, usage


def test_models(api, server):
    models = api.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].max_model_len == server.client.info.max_model_len


def test_chat_applies_the_template_as_transformers(api, http, tok):
    r = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    expected = hf_chat_ids(tok, CHAT)
    assert r.usage.prompt_tokens == len(expected)
    assert http.post("/tokenize", json={"messages": CHAT}).json()["tokens"] == expected
    # content as text parts is the same conversation
    parts = [CHAT[0], {"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}]
    r2 = api.chat.completions.create(model=MODEL, messages=parts, max_tokens=8, temperature=0)
    assert r2.choices[0].message.content == r.choices[0].message.content
    # no system message: SmolLM2's template adds its default one, as transformers does
    user_only = CHAT[1:]
    expected = hf_chat_ids(tok, user_only)
    assert http.post("/tokenize", json={"messages": user_only}).json()["tokens"] == expected


def test_chat_streaming_equals_non_streaming(api, offline):
    full = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    chunks = list(api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    texts, reasons, usage = stream_text(chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert texts[0] == full.choices[0].message.content
    assert reasons[0] == full.choices[0].finish_reason
    assert usage.model_dump(exclude_none=True) == full.usage.model_dump(exclude_none=True)
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    ref = offline.chat(CHAT, SamplingParams(max_tokens=12, temperature=0))[0].outputs[0]
    assert full.choices[0].message.content == ref.text
    assert full.usage.completion_tokens == len(ref.token_ids)
    assert full.choices[0].finish_reason == ref.finish_reason


def test_completions_usage_is_the_tokenizers_count(api, tok, offline):
    prompt = "The capital of France is"
    r = api.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(tok(prompt)["input_ids"])
    assert r.usage.completion_tokens == 6 and r.usage.total_tokens == r.usage.prompt_tokens + 6
    assert r.choices[0].finish_reason == "length"
    ref = offline.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0].outputs[0]
    assert r.choices[0].text == ref.text
    texts, reasons, usage = stream_text(api.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}, stream=True,
        stream_options={"include_usage": True}))
    assert texts == {0: ref.text} and reasons == {0: "length"}
    assert usage.completion_tokens == 6 and usage.prompt_tokens == r.usage.prompt_tokens


def test_completion_prompt_forms(api, tok):
    ids = tok("Once upon a time")["input_ids"]
    by_text = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    by_ids = api.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    many = api.completions.create(model=MODEL, prompt=["Once upon a time", "Hello"], max_tokens=5, temperature=0,
                                  n=2, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]
    texts = {c.index: c.text for c in many.choices}
    assert texts[0] == texts[1] == by_text.choices[0].text and texts[2] == texts[3] != texts[0]
    assert many.usage.prompt_tokens == len(ids) + len(tok("Hello")["input_ids"])
    assert many.usage.completion_tokens == 4 * 5
    ids_many = api.completions.create(model=MODEL, prompt=[ids, ids[:2]], max_tokens=3, temperature=0)
    assert len(ids_many.choices) == 2


def test_n_samples_seeded_and_reproducible(api):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=10, temperature=1.0, n=3, seed=1234)
    a = api.chat.completions.create(**kw)
    b = api.chat.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len({c.message.content for c in a.choices}) > 1  # seed + i per sample: different samples
    assert a.usage.completion_tokens == b.usage.completion_tokens
    c = api.chat.completions.create(**{**kw, "seed": 99})
    assert [x.message.content for x in c.choices] != [x.message.content for x in a.choices]
    # streaming, n > 1: every choice streams, the same samples
    texts, reasons, usage = stream_text(api.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))
    assert texts == {ch.index: ch.message.content for ch in a.choices}
    assert set(reasons) == {0, 1, 2} and usage.completion_tokens == a.usage.completion_tokens


def test_stop_strings(api):
    base = api.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True}).choices[0].text
    assert " 6" in base, base
    r = api.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 6"])
    assert r.choices[0].text == base[:base.index(" 6")]
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == " 6"
    texts, reasons, _ = stream_text(api.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12,
                                                          temperature=0, stop=" 6", stream=True))
    assert texts[0] == r.choices[0].text and reasons[0] == "stop"


def test_logprobs(api):
    r = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
                                    top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token  # greedy: the sampled token is the most likely
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
        assert bytes(t.bytes).decode() == t.token
    c = api.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
                               logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == c.choices[0].text
    assert all(len(d) == 2 and max(d.values()) == v for d, v in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]


@pytest.mark.parametrize("extra, changes", [
    ({"top_k": 1, "temperature": 1.5, "seed": 7}, True),  # top-k 1 is greedy: not what plain sampling gives
    ({"top_p": 0.01, "temperature": 1.5, "seed": 7}, True),
    ({"min_p": 0.99, "temperature": 1.5, "seed": 7}, True),
    ({"top_k": 5, "top_p": 0.9, "min_p": 0.05, "temperature": 0.9, "seed": 11}, False),
    ({"presence_penalty": 1.5, "temperature": 0}, True),
    ({"frequency_penalty": 1.5, "temperature": 0}, True),
    ({"repetition_penalty": 1.8, "temperature": 0}, True),
])
def test_sampling_parameters_are_honoured(api, offline, extra, changes):
    """The server's output equals the offline engine's for the same parameters, and (where it must) the
    parameter changes the output: it is used, not dropped."""
    penalty = any(k.endswith("_penalty") for k in extra)
    prompt = "Repeat after me: apple apple apple apple" if penalty else "List the numbers: one, two, one, two,"
    vllm_style = {k: v for k, v in extra.items() if k in ("top_k", "min_p", "repetition_penalty")}
    openai_style = {k: v for k, v in extra.items() if k not in vllm_style}
    r = api.completions.create(model=MODEL, prompt=prompt, max_tokens=10, extra_body=vllm_style or None,
                               **openai_style)
    ref = offline.generate([prompt], SamplingParams(max_tokens=10, **extra))[0].outputs[0]
    assert r.choices[0].text == ref.text
    if changes:
        plain = {k: v for k, v in extra.items() if k in ("seed", "temperature")}
        base = offline.generate([prompt], SamplingParams(max_tokens=10, **plain))[0].outputs[0]
        assert ref.text != base.text, f"{extra} did not change the output"


def test_logit_bias_min_tokens_ignore_eos(api, tok):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    msgs = [{"role": "user", "content": "Hi"}]
    r = api.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                    logit_bias={str(eos): 100})
    assert (r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason) == ("", 1, "stop")
    r = api.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                    logit_bias={str(eos): 100}, extra_body={"min_tokens": 3})
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (4, "stop")
    r = api.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=5, temperature=0,
                                    logit_bias={str(eos): 100}, extra_body={"ignore_eos": True}, user="someone")
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (5, "length")


def test_errors_are_openai_errors(api, http, server, tok):
    ctx = server.client.info.max_model_len
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=CHAT, temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    long_prompt = "x " * (ctx + 10)
    with pytest.raises(openai.BadRequestError) as e:
        api.completions.create(model=MODEL, prompt=long_prompt, max_tokens=1)
    msg = e.value.body["message"]
    n = len(tok(long_prompt)["input_ids"])
    assert f"{ctx} tokens" in msg and f"{n} tokens" in msg and e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        api.completions.create(model=MODEL, prompt="hi", max_tokens=ctx)
    assert "context length" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=CHAT, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "array"}}}])  # (tool_choice "auto" itself is 200 since issue 47)
    assert e.value.body["param"] == "tools[0].function.parameters"
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=CHAT, extra_body={"best_of_mode": 3})
    assert "best_of_mode" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=CHAT, response_format={"type": "xml"})
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    assert "image_url" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        api.chat.completions.create(model="gpt-5", messages=CHAT)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.UnprocessableEntityError):
        api.chat.completions.create(model=MODEL, messages="not a list")
    r = http.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request_error"
    r = http.post("/v1/completions", content=json.dumps({"prompt": "hi", "temperature": float("nan")}),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    r = http.post("/v1/completions", json={"prompt": "hi", "n": 10**30})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = http.post("/v1/completions", json={"prompt": [10**20]})
    assert r.status_code == 400
    r = http.post("/v1/completions", json={"prompt": "hi", "logit_bias": {"99999999": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    r = http.post("/v1/completions", content=b"x" * (17 * 2**20), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "error" in r.json()
    assert http.get("/v1/nothing").status_code == 404


def test_tokenize_detokenize(http, tok):
    r = http.post("/tokenize", json={"prompt": "Hello world, how are you?"}).json()
    assert r["tokens"] == tok("Hello world, how are you?")["input_ids"] and r["count"] == len(r["tokens"])
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "Hello world, how are you?"}


def test_health_version_metrics(http, api):
    assert http.get("/health").json()["status"] == "ok"
    assert http.get("/version").json()["version"]
    api.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    text = http.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)

    def metric(prefix):
        return next(v for k, v in values.items() if k.startswith(prefix))

    for name in ("kestrel_time_to_first_token_seconds_count", "kestrel_inter_token_latency_seconds_count",
                 "kestrel_e2e_request_latency_seconds_count", "kestrel_request_queue_time_seconds_count",
                 "kestrel_prompt_tokens_total", "kestrel_generation_tokens_total"):
        assert metric(name) > 0, name
    for name in ("kestrel_num_requests_running", "kestrel_num_requests_waiting", "kestrel_kv_cache_usage_perc",
                 "kestrel_prefix_cache_hits_total", "kestrel_prefix_cache_queries_total",
                 "kestrel_kv_cache_free_blocks"):
        assert metric(name) >= 0, name
    assert metric("kestrel_engine_healthy") == 1


def test_openapi_schema(http):
    schema = http.get("/openapi.json").json()
    assert {"/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/health",
            "/version", "/metrics"} <= set(schema["paths"])
