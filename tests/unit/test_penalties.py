"""The per-request penalty counts (engine/layers/penalties.py): rows filled from the host lists once, tokens counted
by ``record``, rows freed and reused, the buffers grown past their first capacity; the sampler's result with the
state's tensors equals its result from the token lists, bit for bit, on random logits and penalties."""

import random
from types import SimpleNamespace

import torch

from engine.layers.penalties import INITIAL_ROWS, PenaltyState, penalty_tensors_from_lists
from engine.layers.sampler import Sampler
from engine.runner.inputs import sampling_metadata
from engine.sampling_params import SamplingParams

VOCAB = 97


def _req(rid, prompt, output, params):
    return SimpleNamespace(request_id=rid, prompt_token_ids=prompt, output_token_ids=output, params=params,
                           eos_token_ids=frozenset({0}), all_token_ids=prompt + output, grammar=None)


def test_state_rows_track_the_lists_through_growth_and_reuse():
    rng = random.Random(0)
    state = PenaltyState(torch.device("cpu"))
    live = {}
    for step in range(60):
        if step % 7 == 3 and live:  # a request ends: its row is reused later
            rid = rng.choice(sorted(live))
            state.release(rid)
            del live[rid]
        if step % 2 == 0:
            rid = f"r{step}"
            live[rid] = ([rng.randrange(-3, VOCAB + 3) for _ in range(rng.randint(0, 20))],
                         [rng.randrange(VOCAB) for _ in range(rng.randint(0, 5))])
        reqs = sorted(live)
        rows = state.rows([SimpleNamespace(request_id=r, prompt_token_ids=live[r][0], output_token_ids=live[r][1])
                           for r in reqs], VOCAB)
        assert len(set(rows)) == len(rows)
        new = torch.tensor([rng.randrange(VOCAB) for _ in reqs], dtype=torch.long)
        state.record(rows, new)
        for r, t in zip(reqs, new.tolist()):
            live[r][1].append(t)
        counts, prompt = state.gather(rows)
        ref_counts, ref_prompt = penalty_tensors_from_lists([live[r][0] for r in reqs], [live[r][1] for r in reqs],
                                                            VOCAB, torch.device("cpu"))
        assert torch.equal(counts, ref_counts) and torch.equal(prompt, ref_prompt)
    assert state.counts.shape[0] > INITIAL_ROWS  # grown on the way


def test_sampler_with_the_state_equals_the_lists_bit_for_bit():
    rng = random.Random(1)
    for trial in range(20):
        reqs = []
        for i in range(rng.randint(1, 9)):
            p = SamplingParams(max_tokens=10, temperature=rng.choice([0.0, 0.7, 1.3]), seed=trial * 10 + i,
                               repetition_penalty=rng.choice([1.0, 0.7, 1.4]),
                               presence_penalty=rng.choice([0.0, 0.5, -1.0]),
                               frequency_penalty=rng.choice([0.0, 0.3, 1.5]), min_tokens=rng.choice([0, 4]))
            reqs.append(_req(f"q{i}", [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))],
                             [rng.randrange(VOCAB) for _ in range(rng.randint(0, 8))], p))
        logits = torch.randn(len(reqs), VOCAB, generator=torch.Generator().manual_seed(trial)) * 4
        gens = [torch.Generator().manual_seed(r.params.seed) for r in reqs]
        want = Sampler(torch.Generator().manual_seed(0))(logits, sampling_metadata(reqs, gens))
        md = sampling_metadata(reqs, [torch.Generator().manual_seed(r.params.seed) for r in reqs])
        pen = [i for i, r in enumerate(reqs) if r.params.repetition_penalty != 1.0 or r.params.presence_penalty
               or r.params.frequency_penalty]
        if pen:
            state = PenaltyState(torch.device("cpu"))
            md.penalty_counts, md.penalty_prompt = state.gather(state.rows([reqs[i] for i in pen], VOCAB))
            md.prompt_token_ids = md.output_token_ids = [()] * len(reqs)  # the lists are not read then
        assert Sampler(torch.Generator().manual_seed(0))(logits, md) == want
