"""Speculative decoding's cost gate (engine/spec/decoder.py StepCosts, SpeculativeDecoder.step_done /
observe_step): given step durations and acceptance, a request proposes only where its verify passes beat plain
steps. Durations are handed in (no clock, no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.sampling_params import SamplingParams
from engine.spec.config import parse_speculative_config
from engine.spec.decoder import PLAIN_REFRESH_STEPS, SpeculativeDecoder, StepCosts

K = 3
PLAIN_S = 0.008  # a plain decode step
COSTLY_VERIFY_S = 0.017  # break-even 2.125 tokens per pass
CHEAP_VERIFY_S = 0.010  # break-even 1.25


class _Proposer:
    def propose(self, reqs, limits):
        return [[1] * k for k in limits]

    def remove(self, rid):
        pass


def _request():
    r = SimpleNamespace(request_id="r", prompt_token_ids=[5, 6, 7], output_token_ids=[8], pooling=None,
                        grammar=None, params=SamplingParams(), spec_token_ids=[])
    r.num_tokens = 4
    r.num_computed_tokens = 3
    return r


def _decoder():
    cfg = parse_speculative_config(f'{{"method": "ngram", "num_speculative_tokens": {K}}}')
    return SpeculativeDecoder(cfg, _Proposer())


def _step(dec, r, verify_s, emitted):
    """One decode step of one request: its proposals, then (where it proposed) a verify pass emitting ``emitted``
    at ``verify_s``, else a plain step at PLAIN_S. Returns how many tokens it proposed."""
    dec.propose([r], 1000)
    proposed = len(r.spec_token_ids)
    if proposed:
        dec.settle("r", proposed, emitted)
        dec.observe_step(verify_s, 1)
    else:
        dec.observe_step(PLAIN_S, 1)
    return proposed


def _run(dec, r, verify_s, emitted, steps):
    return [_step(dec, r, verify_s, emitted) for _ in range(steps)]


def test_break_even_is_the_verify_step_over_the_plain_step_per_batch_size():
    c = StepCosts()
    assert c.break_even(1) is None
    c.add(0.010, 1, verified=False)
    assert c.break_even(1) is None  # no verify step measured yet
    c.add(0.020, 1, verified=True)
    assert c.break_even(1) == pytest.approx(2.0)
    assert c.break_even(2) is None  # another batch size is measured on its own
    c.add(0.030, 1, verified=True)  # a running mean: moves toward the newest
    assert 2.0 < c.break_even(1) < 3.0


def test_poor_acceptance_on_a_costly_verify_step_stops_proposing():
    dec, r = _decoder(), _request()
    proposed = _run(dec, r, COSTLY_VERIFY_S, emitted=2, steps=200)  # 1 of 3 accepted: 2 < 2.125 tokens per pass
    assert dec.costs.break_even(1) == pytest.approx(COSTLY_VERIFY_S / PLAIN_S)
    late = proposed[100:]
    assert 0 < sum(p > 0 for p in late) <= 8  # a few probes (the back-off doubling to 32 steps), else plain


def test_the_same_acceptance_keeps_proposing_where_the_verify_step_is_cheap():
    dec, r = _decoder(), _request()
    proposed = _run(dec, r, CHEAP_VERIFY_S, emitted=2, steps=200)
    late = proposed[100:]
    assert sum(p == K for p in late) >= 95  # only the plain refresh steps go without


def test_high_acceptance_keeps_k_on_a_costly_verify_step():
    dec, r = _decoder(), _request()
    proposed = _run(dec, r, COSTLY_VERIFY_S, emitted=K + 1, steps=200)
    assert set(proposed) == {0, K}
    assert proposed.count(0) <= 200 // PLAIN_REFRESH_STEPS + 1  # the plain refresh steps alone
    assert proposed[1:].index(0) + 1 >= PLAIN_REFRESH_STEPS  # ... one after PLAIN_REFRESH_STEPS verify steps


def test_the_estimate_recovers_when_costs_change():
    dec, r = _decoder(), _request()
    _run(dec, r, COSTLY_VERIFY_S, emitted=2, steps=150)
    assert dec.backoff["r"].misses > 0
    proposed = _run(dec, r, CHEAP_VERIFY_S, emitted=2, steps=200)  # the verify step got cheaper
    assert dec.costs.break_even(1) == pytest.approx(CHEAP_VERIFY_S / PLAIN_S, rel=0.05)
    assert sum(p == K for p in proposed[-50:]) >= 45
    proposed = _run(dec, r, COSTLY_VERIFY_S, emitted=2, steps=200)  # ... and costly again
    assert sum(p > 0 for p in proposed[-100:]) <= 8


def test_a_request_that_gets_better_starts_proposing_again():
    dec, r = _decoder(), _request()
    _run(dec, r, COSTLY_VERIFY_S, emitted=2, steps=150)
    proposed = _run(dec, r, COSTLY_VERIFY_S, emitted=K + 1, steps=300)  # its lookups start to hit
    assert sum(p == K for p in proposed[-50:]) >= 45


def test_step_done_times_whole_steps_and_skips_prompt_steps():
    now = [100.0]
    dec = SpeculativeDecoder(_decoder().config, _Proposer(), clock=lambda: now[0])
    dec.step_done(prefill_tokens=40, decoding=0)  # the first step: nothing before it to time
    now[0] += 0.5
    dec.step_done(prefill_tokens=0, decoding=1)  # a plain decode step of 0.5 s
    now[0] += 3.0
    dec.settle("r", K, 2)
    dec.step_done(prefill_tokens=12, decoding=1)  # a step with a prompt chunk: not a decode step's cost
    now[0] += 1.0
    dec.settle("r", K, 2)
    dec.step_done(prefill_tokens=0, decoding=1)  # a verify step of 1 s
    assert dec.costs.plain == {1: 0.5} and dec.costs.verify == {1: 1.0}


class _RareLookups:
    """A free proposer (n-gram-like) whose lookup hits on every 5th step only."""

    free = True

    def __init__(self):
        self.calls = 0

    def propose(self, reqs, limits):
        self.calls += 1
        return [[1] * k if self.calls % 5 == 0 else [] for k in limits]

    def remove(self, rid):
        pass


def _passes_with_rare_lookups(free: bool, steps: int) -> int:
    proposer = _RareLookups()
    proposer.free = free
    dec = SpeculativeDecoder(_decoder().config, proposer)
    return sum(p > 0 for p in _run(dec, _request(), COSTLY_VERIFY_S, emitted=2, steps=steps))


def test_a_free_proposers_back_off_drops_proposals_not_steps():
    # 20 hits in 100 steps, none paying: dropping 1, 2, 4 .. proposals verifies 5 of them; skipping 1, 2, 4 ..
    # steps (which mostly fall between hits) verifies 7
    free, stepped = _passes_with_rare_lookups(True, 100), _passes_with_rare_lookups(False, 100)
    assert free <= 5 < stepped
