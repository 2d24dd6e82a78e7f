"""POST /v1/embeddings (issue 19) with the official openai client against the real server: the embedded SmolLM2
(last-token pooling, the engine's default) and tiny models whose directory carries a sentence-transformers
pipeline (modules.json + 1_Pooling/config.json, with and without a Normalize module), compared with
sentence-transformers itself; input shapes, float and base64, dimensions, usage, OpenAI-style 400s, batch
invariance, and the KV cache left empty."""

from __future__ import annotations

import base64
import json
import math
import shutil
import threading

import httpx
import numpy as np
import pytest

from tests.server.conftest import MODEL, engine_stats, make_server

# Across requests of different shapes (alone, batched, after a prefix-cache hit) the default model's Q4_1 linear
# kernels round differently (GEMV for steps of at most 16 tokens, GEMM above): its vectors agree to this cosine.
# The float32 tiny models are held to 1e-5 per component.
Q4_COS = 0.999
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello",
         "Embeddings map text to vectors; similar texts land close together, " * 3]


def _unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def _cos(a, b) -> float:
    return float(np.dot(_unit(a), _unit(b)))


def _post(srv, body: dict) -> httpx.Response:
    return httpx.post(srv.url + "/v1/embeddings", json=body, timeout=120)


# -- the embedded default model -----------------------------------------------------------------------------------


def test_input_shapes_formats_and_usage(api, tok, server):
    ids = [tok.encode(t) for t in TEXTS]
    by_text = api.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in by_text.data] == [0, 1, 2]
    assert by_text.model == MODEL and by_text.object == "list"
    assert by_text.usage.prompt_tokens == by_text.usage.total_tokens == sum(map(len, ids))
    vecs = [np.asarray(d.embedding) for d in by_text.data]
    assert all(v.shape == (576,) and abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs)
    assert _cos(vecs[0], vecs[1]) < 0.999  # different texts, different vectors

    # the client's default is base64 (little-endian float32), decoded by the client: the same numbers
    b64 = api.embeddings.create(model=MODEL, input=TEXTS)
    assert all(_cos(d.embedding, v) > Q4_COS for d, v in zip(b64.data, vecs))
    # the same request (one short input, so the same kernels) in both formats: the same float32 numbers
    raw = _post(server, {"model": MODEL, "input": TEXTS[0], "encoding_format": "base64"}).json()["data"][0]
    floats = _post(server, {"model": MODEL, "input": TEXTS[0]}).json()["data"][0]["embedding"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(raw["embedding"]), dtype="<f4"),
                                  np.asarray(floats, dtype=np.float32))
    # token ids (one list, and a list of lists) are the same inputs as their texts
    one = api.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    assert one.usage.prompt_tokens == len(ids[0])
    assert _cos(one.data[0].embedding, vecs[0]) > Q4_COS
    many = api.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert all(_cos(d.embedding, v) > Q4_COS for d, v in zip(many.data, vecs))
    single = api.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    assert _cos(single.data[0].embedding, vecs[1]) > Q4_COS

    st = engine_stats(server)  # prefill only: nothing left running, no KV kept
    assert st.num_running == 0 and st.kv_usage == 0.0


def test_dimensions_truncate_then_renormalise(api):
    full = np.asarray(api.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float").data[0].embedding)
    for fmt in ("float", "base64"):
        cut = api.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=64, encoding_format=fmt).data[0].embedding
        if fmt == "base64":  # asked for explicitly, the client hands the string over as it came
            cut = np.frombuffer(base64.b64decode(cut), dtype="<f4")
        cut = np.asarray(cut, dtype=np.float64)
        assert cut.shape == (64,) and abs(np.linalg.norm(cut) - 1) < 1e-5
        np.testing.assert_allclose(cut, _unit(full[:64]), atol=1e-5)


def test_batch_invariance(api):
    """An input's embedding does not depend on what else is in the batch beyond rounding: Q4_COS on the default
    model (see above; --deterministic makes its vectors bitwise batch-invariant: tests/engine/test_pooling.py),
    1e-5 on the float32 tiny models below."""
    alone = [api.embeddings.create(model=MODEL, input=t, encoding_format="float").data[0].embedding for t in TEXTS]
    mixed = [TEXTS[2], "filler " * 40, TEXTS[0], "x", TEXTS[1]]
    batch = api.embeddings.create(model=MODEL, input=mixed, encoding_format="float").data
    for i, j in ((0, 2), (1, 4), (2, 0)):
        assert _cos(alone[i], batch[j].embedding) > Q4_COS, (i, _cos(alone[i], batch[j].embedding))


def test_beside_a_running_generation(api):
    """Embedding requests share engine steps with a decode in flight (decode rows and prefill-only rows in one
    batch) and neither disturbs the other."""
    alone = api.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float").data[0].embedding
    out: dict = {}

    def generate():
        out["chat"] = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count to 50"}],
                                                  max_tokens=16, temperature=0)

    t = threading.Thread(target=generate)
    t.start()
    got = [api.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float").data[0].embedding
           for _ in range(2)]
    t.join()
    assert out["chat"].choices[0].finish_reason in ("stop", "length")
    assert all(_cos(alone, g) > Q4_COS for g in got)


@pytest.mark.parametrize("body, param, words", [
    ({"input": ""}, "input", "empty"),
    ({"input": []}, "input", "empty"),
    ({"input": ["a", ""]}, "input", "input[1]"),
    ({"input": [[1, 2], []]}, "input", "input[1]"),
    ({"input": [1, 99999999]}, "input", "vocabulary"),
    ({"input": [[1] * 8193]}, "input", "maximum context length is 8192 tokens"),
    ({"input": ["word " * 9000]}, "input", "maximum context length is 8192 tokens"),
    ({"input": "x", "dimensions": 0}, "dimensions", "at least 1"),
    ({"input": "x", "dimensions": 577}, "dimensions", "576 dimensions"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "'float' or 'base64'"),
    ({"input": ["x"] * 2049}, "input", "at most 2048"),
    ({"input": "x", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens", "Unknown parameter"),
])
def test_bad_requests_are_openai_400s(server, body, param, words):
    r = _post(server, {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert words in err["message"], err


def test_openai_client_raises_bad_request(api):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        api.embeddings.create(model=MODEL, input="x", dimensions=0)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.NotFoundError):
        api.embeddings.create(model="nope", input="x")


# -- tiny models with a sentence-transformers pipeline --------------------------------------------------------------

ST_CASES = [("qwen3", "mean", True), ("llama3", "lasttoken", True), ("smollm2", "cls", False)]


def write_st_dir(src, dest, mode: str, normalize: bool):
    """A copy of a tiny model directory turned into a sentence-transformers model: Transformer -> Pooling
    (``mode``) [-> Normalize]."""
    shutil.copytree(src, dest)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (dest / "2_Normalize").mkdir()
    (dest / "modules.json").write_text(json.dumps(modules))
    (dest / "1_Pooling").mkdir()
    flags = {f"pooling_mode_{m}": m == {"mean": "mean_tokens", "cls": "cls_token"}.get(mode, mode)
             for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                       "lasttoken")}
    (dest / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **flags,
                                                                 "include_prompt": True}))
    (dest / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    return dest


@pytest.fixture(scope="module", params=ST_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def st_model(request, tiny_model_dir, tmp_path_factory):
    arch, mode, normalize = request.param
    d = write_st_dir(tiny_model_dir(arch), tmp_path_factory.mktemp("st") / arch, mode, normalize)
    srv = make_server(engine={"model": str(d)}, served_model_names=["tiny"])
    yield d, normalize, srv
    srv.stop()


def test_equal_to_sentence_transformers(st_model):
    from openai import OpenAI

    SentenceTransformer = pytest.importorskip("sentence_transformers").SentenceTransformer
    d, normalize, srv = st_model
    api = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ref = SentenceTransformer(str(d), device="cpu")
    # one text at a time: the tokenizer has no padding token for sentence-transformers' batches
    want = [ref.encode(t, convert_to_numpy=True) for t in TEXTS]
    got = api.embeddings.create(model="tiny", input=TEXTS, encoding_format="float").data
    for w, g in zip(want, got):
        g = np.asarray(g.embedding)
        assert _cos(w, g) >= 0.9999
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)  # the same scale: normalised or not, as ST
    assert all(abs(np.linalg.norm(g.embedding) - 1) < 1e-5 for g in got) == normalize

    alone = [api.embeddings.create(model="tiny", input=t, encoding_format="float").data[0].embedding for t in TEXTS]
    for a, g in zip(alone, got):  # batch-invariant to float rounding
        assert max(abs(x - y) for x, y in zip(a, g.embedding)) < 1e-5
    assert math.isclose(engine_stats(srv).kv_usage, 0.0)


def test_an_oversized_input_is_refused_by_its_bytes_before_tokenizing(server):
    """A 10 MiB input used to be tokenized for 21-36 s before its 400 (the server's RSS +800 MB a request, and the
    tokenizer pool busy for everyone): refused by its length in bytes now, 15 times with the memory flat (glibc
    kept ~90 MiB of freed 10 MiB blocks before engine/server/memory.py fixed its mmap threshold)."""
    import gc
    import time

    import psutil

    proc = psutil.Process()  # the server runs in this process (tests/server/conftest.py make_server)
    body = json.dumps({"model": MODEL, "input": ["hello world " * (10 * 2**20 // 12)]})
    httpx.post(server.url + "/v1/embeddings", content=body, headers={"content-type": "application/json"},
               timeout=120)  # one-time allocations of the refusal path (~20 MiB: code, caches) are not growth
    gc.collect()
    before = proc.memory_info().rss
    took = []
    for _ in range(15):
        t = time.monotonic()
        r = httpx.post(server.url + "/v1/embeddings", content=body, headers={"content-type": "application/json"},
                       timeout=120)
        took.append(time.monotonic() - t)
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and "at least" in err["message"] and err["param"] == "input"
    gc.collect()
    grew = proc.memory_info().rss - before
    print(f"10 MiB embedding inputs: refused in {max(took):.2f} s at most; RSS {grew / 2**20:+.0f} MiB after 15")
    assert max(took) < 10  # tokenizing took 21-36 s; the byte check is milliseconds (a loaded CI box: seconds)
    assert grew < 50 * 2**20
