"""Sampler: each parameter does what it says, on synthetic logits."""

import math

import pytest
import torch

from engine.core.request import Request
from engine.errors import InvalidRequestError
from engine.layers.sampler import Sampler
from engine.sampling_params import SamplingParams

V = 16


def sample(logits, params, output=(), prompt=(1,), eos=frozenset({0}), seed=0, n=1):
    req = Request("r", list(prompt), params, eos_token_ids=eos)
    req.output_token_ids = list(output)
    s = Sampler(torch.Generator().manual_seed(seed))
    toks = []
    for _ in range(n):
        t, lp = s(torch.tensor([logits], dtype=torch.float32), [req], [None])
        toks.append(t[0])
    return toks, lp[0]


def test_greedy_is_argmax():
    logits = [0.0] * V
    logits[5] = 3.0
    assert sample(logits, SamplingParams(temperature=0))[0] == [5]


def test_top_k_restricts_to_k_best():
    logits = list(range(V))  # token 15 best
    toks, _ = sample(logits, SamplingParams(temperature=5.0, top_k=3), n=200)
    assert set(toks) <= {13, 14, 15} and len(set(toks)) == 3


def test_top_p_keeps_smallest_set_reaching_p():
    logits = [math.log(p) for p in [0.5, 0.3, 0.1, 0.1]] + [-1e9] * (V - 4)
    toks, _ = sample(logits, SamplingParams(temperature=1.0, top_p=0.75), n=300)
    assert set(toks) == {0, 1}


def test_min_p_drops_unlikely_tokens():
    logits = [math.log(p) for p in [0.6, 0.3, 0.05, 0.05]] + [-1e9] * (V - 4)
    toks, _ = sample(logits, SamplingParams(temperature=1.0, min_p=0.2), eos=frozenset(), n=300)
    assert set(toks) == {0, 1}


def test_seeded_generators_reproduce():
    logits = [0.0] * V
    a = sample(logits, SamplingParams(temperature=1.0), seed=7, n=20)[0]
    b = sample(logits, SamplingParams(temperature=1.0), seed=7, n=20)[0]
    c = sample(logits, SamplingParams(temperature=1.0), seed=8, n=20)[0]
    assert a == b and a != c


def test_repetition_penalty_hf_semantics():
    logits = [0.0] * V
    logits[3], logits[4] = 2.0, 1.5  # 3 was seen: 2.0/2 = 1.0 < 1.5
    assert sample(logits, SamplingParams(temperature=0, repetition_penalty=2.0), prompt=[3])[0] == [4]
    logits[3], logits[4] = -1.0, -1.5  # negative seen logits are multiplied: -1.0*2 = -2 < -1.5
    logits = [-5.0 if i not in (3, 4) else logits[i] for i in range(V)]
    assert sample(logits, SamplingParams(temperature=0, repetition_penalty=2.0), prompt=[3])[0] == [4]


def test_presence_and_frequency_penalties_openai_semantics():
    logits = [0.0] * V
    logits[3], logits[4] = 2.0, 1.0
    # 3 appeared twice in the output: 2.0 - 2*0.3 - 0.5 = 0.9 < 1.0
    p = SamplingParams(temperature=0, frequency_penalty=0.3, presence_penalty=0.5)
    assert sample(logits, p, output=[3, 3])[0] == [4]
    p = SamplingParams(temperature=0, frequency_penalty=0.1, presence_penalty=0.1)
    assert sample(logits, p, output=[3, 3])[0] == [3]  # 2.0 - 0.3 = 1.7 > 1.0


def test_min_tokens_masks_eos_and_stop_ids():
    logits = [0.0] * V
    logits[0], logits[9], logits[5] = 5.0, 4.0, 1.0
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[9])
    assert sample(logits, p, output=[7])[0] == [5]
    assert sample(logits, p, output=[7, 7])[0] == [0]  # after min_tokens eos is allowed again


def test_logit_bias_forces_token():
    logits = [0.0] * V
    logits[2] = 10.0
    assert sample(logits, SamplingParams(temperature=0, logit_bias={11: 100}))[0] == [11]


def test_logprobs_are_raw_distribution():
    logits = torch.randn(V, generator=torch.Generator().manual_seed(1)).tolist()
    toks, lp = sample(logits, SamplingParams(temperature=0, logprobs=3, repetition_penalty=1.5))
    ref = torch.log_softmax(torch.tensor(logits), -1)
    assert lp.token_id == toks[0]
    assert lp.logprob == pytest.approx(float(ref[toks[0]]), abs=1e-6)
    assert [t for t, _ in lp.top] == torch.topk(ref, 3).indices.tolist()


@pytest.mark.parametrize("kw,param", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -3}, "top_k"),
    ({"min_p": 2}, "min_p"), ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"logprobs": 50}, "logprobs"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"), ({"stop": [""]}, "stop"),
    ({"logit_bias": {1: 500}}, "logit_bias"), ({"repetition_penalty": 0}, "repetition_penalty"),
])
def test_invalid_parameters_name_themselves(kw, param):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kw)
    assert e.value.param == param and param in str(e.value)


@pytest.mark.parametrize("params", [
    dict(temperature=1e-5 * 1.0001),                   # just above the greedy threshold: logits x 1e5
    dict(temperature=1.0, repetition_penalty=1e-30),  # positive logits / 1e-30 -> +inf
    dict(temperature=1.0, repetition_penalty=1e30),   # negative logits * 1e30 -> -inf
    dict(temperature=1e-5 * 1.0001, repetition_penalty=1e-30, top_p=1e-9, min_p=1.0, top_k=2),
    dict(temperature=2.0, logit_bias={i: -100.0 for i in range(V)}, min_tokens=4),
    dict(temperature=0.0, repetition_penalty=1e-30),
])
def test_extreme_parameters_give_a_token_not_an_error(params):
    """Valid but extreme values overflow float32; the sampler must still return a token in the vocabulary
    (a crash here would take the engine process down with every other request)."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        logits = (torch.randn(V, generator=gen) * 30).tolist()
        logits[trial % V] = 1e38  # near the top of float32
        toks, _ = sample(logits, SamplingParams(**params), output=[1, 2, 3], prompt=range(V), n=2)
        assert all(0 <= t < V for t in toks)


def test_all_tokens_impossible_falls_back_to_argmax():
    s = Sampler(torch.Generator().manual_seed(0))
    req = Request("r", [1], SamplingParams(temperature=1.0), eos_token_ids=frozenset())
    logits = torch.full((1, V), float("nan"))
    logits[0, 3] = float("-inf")
    t, _ = s(logits, [req], [None])
    assert 0 <= t[0] < V
