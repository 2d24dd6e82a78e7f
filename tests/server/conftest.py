"""Real uvicorn servers on free 127.0.0.1 ports, each in a background thread with its own EngineClient and
engine process. ``server``: the embedded SmolLM2 in float32, its GGUF blocks dequantized (``quantization="none"``:
float weights, as the offline reference below: the greedy outputs the tests compare), shared by the whole session."""

from __future__ import annotations

import pytest

MODEL = "smollm2"


def make_server(**kw):
    from engine.config import EngineConfig
    from engine.server.serve import BackgroundServer

    core_factory = kw.pop("core_factory", None)
    config = EngineConfig(**{"dtype": "float32", "quantization": "none", **kw.pop("engine", {})})
    kw.setdefault("served_model_names", [MODEL])
    return BackgroundServer(config, core_factory=core_factory, **kw).start()


@pytest.fixture(scope="session")
def server():
    srv = make_server()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def api(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="session")
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=600) as c:
        yield c


@pytest.fixture(scope="session")
def tok(hf_tokenizer, smollm2_gguf):
    """transformers' tokenizer of the served model (the reference for counts and the chat template)."""
    return hf_tokenizer(smollm2_gguf)


@pytest.fixture(scope="session")
def offline(smollm2_fp32):
    """The offline API on the same model and dtype: the reference for outputs. It is the session's one float32
    engine (``smollm2_fp32``, tests/conftest.py), not a second one built the same way."""
    return smollm2_fp32


def engine_stats(srv):
    return srv.call(srv.client.stats())
