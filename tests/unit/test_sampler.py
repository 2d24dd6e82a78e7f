"""Sampler: each parameter does what it says, on synthetic logits."""

import math
import random

import pytest
import torch

from engine.core.request import Request
from engine.errors import InvalidRequestError
from engine.layers.sampler import Sampler
from engine.runner.inputs import sampling_metadata
from engine.sampling_params import SamplingParams

V = 16


def sample(logits, params, output=(), prompt=(1,), eos=frozenset({0}), seed=0, n=1):
    req = Request("r", list(prompt), params, eos_token_ids=eos)
    req.output_token_ids = list(output)
    s = Sampler(torch.Generator().manual_seed(seed))
    toks = []
    for _ in range(n):
        t, lp = s(torch.tensor([logits], dtype=torch.float32), sampling_metadata([req]))
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
    t, _ = s(logits, sampling_metadata([req]))
    assert 0 <= t[0] < V


# -- the batched sampler against the one-request-at-a-time reference (tests/unit/sampler_reference.py) ----------

def _random_request(rng: random.Random, i: int, vocab: int) -> Request:
    kw: dict = {"temperature": rng.choice([0.0, 0.3, 1.0, 1.7])}
    if rng.random() < 0.4:
        kw["top_k"] = rng.choice([1, 2, 5, vocab // 2, vocab + 10])
    if rng.random() < 0.4:
        kw["top_p"] = rng.choice([0.05, 0.5, 0.9])
    if rng.random() < 0.3:
        kw["min_p"] = rng.choice([0.01, 0.2])
    if rng.random() < 0.3:
        kw["repetition_penalty"] = rng.choice([0.7, 1.3, 2.0])
    if rng.random() < 0.3:
        kw["presence_penalty"], kw["frequency_penalty"] = rng.uniform(-2, 2), rng.uniform(-2, 2)
    if rng.random() < 0.3:
        kw["logit_bias"] = {rng.randrange(vocab + 5): rng.uniform(-100, 100) for _ in range(3)}
    if rng.random() < 0.3:
        kw["min_tokens"], kw["stop_token_ids"] = 5, [rng.randrange(vocab)]
    if rng.random() < 0.3:
        kw["logprobs"] = rng.choice([0, 1, 5])
    req = Request(f"r{i}", [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))], SamplingParams(**kw),
                  eos_token_ids=frozenset({0}))
    req.output_token_ids = [rng.randrange(vocab) for _ in range(rng.randrange(0, 8))]
    return req


@pytest.mark.parametrize("seed", range(12))
def test_batched_sampler_matches_reference(seed):
    """Random batches of mixed parameters: the same greedy tokens, the same distribution for every drawing row,
    the same logprobs, and every drawn token inside that distribution's support."""
    from engine.layers.sampler import filtered_probs
    from tests.unit.sampler_reference import ReferenceSampler, process_row, reference_probs

    rng = random.Random(seed)
    vocab = 64
    reqs = [_random_request(rng, i, vocab) for i in range(rng.randrange(1, 9))]
    logits = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(seed)) * 4
    sampler = Sampler(torch.Generator().manual_seed(seed))
    tokens, lps = sampler(logits, sampling_metadata(reqs))
    ref_tokens, ref_lps = ReferenceSampler(torch.Generator().manual_seed(seed))(logits, reqs, [None] * len(reqs))
    processed = sampler._process(logits, sampling_metadata(reqs))
    for i, req in enumerate(reqs):
        torch.testing.assert_close(processed[i], process_row(logits[i], req).nan_to_num(float("-inf")))
        if req.params.greedy:
            assert tokens[i] == ref_tokens[i]
        else:
            probs = filtered_probs(processed[i:i + 1], [req.params])[0]
            torch.testing.assert_close(probs, reference_probs(logits[i], req), atol=1e-6, rtol=1e-5)
            assert probs[tokens[i]] > 0
        if ref_lps[i] is None:
            assert lps[i] is None
        else:
            assert lps[i].token_id == tokens[i]
            assert [t for t, _ in lps[i].top] == [t for t, _ in ref_lps[i].top]
            assert lps[i].logprob == pytest.approx(float(torch.log_softmax(logits[i], -1)[tokens[i]]), abs=1e-5)


def test_exponential_race_draws_with_the_right_frequencies():
    target = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20000
    logits = target.log().expand(n, 4).contiguous()
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=1.0), eos_token_ids=frozenset()) for i in range(n)]
    tokens, _ = Sampler(torch.Generator().manual_seed(0))(logits, sampling_metadata(reqs))
    freq = torch.bincount(torch.tensor(tokens), minlength=4).float() / n
    assert torch.allclose(freq, target, atol=0.015), freq  # ~4.5 standard errors at n=20000


def test_seeded_rows_do_not_depend_on_their_neighbours():
    """A request with a seed gets the same tokens whatever else shares its batch."""
    logits = torch.zeros(3, V)
    seeded = Request("s", [1], SamplingParams(temperature=1.0, seed=5), eos_token_ids=frozenset())
    other = Request("o", [1], SamplingParams(temperature=1.0), eos_token_ids=frozenset())
    runs = []
    for batch in ([seeded], [other, seeded, other]):
        gen = torch.Generator().manual_seed(5)
        s = Sampler(torch.Generator().manual_seed(len(batch)))
        md = sampling_metadata(batch, [gen if r is seeded else None for r in batch])
        toks = [s(logits[:len(batch)], md)[0][batch.index(seeded)] for _ in range(10)]
        runs.append(toks)
    assert runs[0] == runs[1]


# -- structured output: allowed-token bitmasks (engine/tokenizer/grammar.py) ------------------------------


class _FixedGrammar:
    """A stand-in matcher whose next allowed tokens are a fixed set."""

    def __init__(self, allowed, vocab_size=V):
        self.allowed, self.vocab_size = set(allowed), vocab_size

    def fill(self, bitmask, row):
        words = [0] * bitmask.shape[1]
        for t in self.allowed:
            words[t // 32] |= 1 << (t % 32)
        bitmask[row] = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def _structured_batch(params_allowed, logits):
    reqs = []
    for i, (params, allowed) in enumerate(params_allowed):
        req = Request(f"r{i}", [1], params, eos_token_ids=frozenset({0}))
        req.grammar = None if allowed is None else _FixedGrammar(allowed, logits.shape[1])
        reqs.append(req)
    return sampling_metadata(reqs)


def test_bitmask_restricts_its_rows_only():
    logits = torch.arange(V, dtype=torch.float32).repeat(4, 1)  # token 15 best everywhere
    md = _structured_batch([(SamplingParams(temperature=0), {3, 7}), (SamplingParams(temperature=0), None),
                                  (SamplingParams(temperature=0), {2}), (SamplingParams(temperature=0), None)],
                                 logits)
    assert md.bitmask_rows == [0, 2] and md.bitmask.shape == (2, 1)
    toks, _ = Sampler(torch.Generator().manual_seed(0))(logits, md)
    assert toks == [7, 15, 2, 15]


def test_bitmask_with_drawing_penalties_and_min_tokens():
    """Drawn rows only ever pick allowed tokens; a grammar row is not min_tokens-masked (the grammar decides
    where EOS goes), penalties and bias do not bring a masked token back."""
    logits = torch.zeros(3, V)
    p = SamplingParams(temperature=1.5, top_k=10, repetition_penalty=1.3, logit_bias={5: 100.0}, seed=3)
    md = _structured_batch([(p, {0, 4, 9}), (SamplingParams(temperature=1.0, min_tokens=5), {0}),
                                  (SamplingParams(temperature=1.0), None)], logits)
    s = Sampler(torch.Generator().manual_seed(0))
    seen = set()
    for _ in range(100):
        toks, _ = s(logits, md)
        seen.add(toks[0])
        assert toks[1] == 0
    assert seen == {0, 4, 9}


def test_bitmask_over_a_vocabulary_not_a_multiple_of_32():
    vocab = 70  # three words; token 69 is bit 5 of word 2
    logits = torch.zeros(2, vocab)
    logits[:, 1] = 5.0
    md = _structured_batch([(SamplingParams(temperature=0), {31, 69}), (SamplingParams(temperature=0), {32})],
                                 logits)
    logits[0, 69] = 1.0
    toks, _ = Sampler(torch.Generator().manual_seed(0))(logits, md)
    assert toks == [69, 32]


def test_bitmask_from_a_real_grammar_on_a_tiny_vocab():
    pytest.importorskip("xgrammar")
    import xgrammar as xgr

    from engine.tokenizer.grammar import RequestGrammar, fill_bitmask

    vocab = [b"<eos>", b"a", b"b", b"ab", b"c", b"{", b"}"]
    info = xgr.TokenizerInfo(vocab, vocab_size=len(vocab), stop_token_ids=[0])
    g = RequestGrammar(xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex("a+b")), len(vocab))
    mask = fill_bitmask([g])
    logits = torch.zeros(1, len(vocab))
    logits[0, 4] = 9.0  # 'c' is the model's favourite, never allowed
    req = Request("r", [1], SamplingParams(temperature=0), eos_token_ids=frozenset({0}))
    req.grammar = g
    md = sampling_metadata([req])
    assert torch.equal(md.bitmask, mask)
    out = []
    for _ in range(4):
        tok = Sampler(torch.Generator())(logits, sampling_metadata([req]))[0][0]
        out.append(tok)
        assert g.accept_token(tok)
        if g.is_terminated():
            break
        logits[0, 1] = 1.0 if len(out) < 2 else -1.0  # 'a' then 'ab'/'b'
    assert out[-1] == 0 and b"".join(vocab[t] for t in out[:-1]) in (b"aab", b"ab", b"aaab")


@pytest.mark.parametrize("vocab", [16, 64, 70])
def test_bitmask_kernels_agree(vocab):
    """xgrammar's CPU kernel and the torch unpacking (the GPU path) mask the same tokens of the same rows."""
    from engine.layers.sampler import apply_bitmask, apply_bitmask_torch

    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(5, vocab, generator=g)
    mask = torch.randint(-2**31, 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32, generator=g)
    a, b = apply_bitmask(x, mask, [0, 2, 3]), apply_bitmask_torch(x, mask, [0, 2, 3])
    assert torch.equal(a, b) and torch.equal(a[[1, 4]], x[[1, 4]])
    assert torch.isinf(a[[0, 2, 3]]).any()
