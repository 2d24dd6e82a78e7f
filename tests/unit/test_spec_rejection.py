"""Speculative decoding's verification (engine/layers/rejection_sampler.py) against its definition: greedy keeps
the proposals that are each row's argmax; sampling keeps the target's distribution exactly (a statistical test:
fixed seed, total variation within a stated bound)."""

from __future__ import annotations

import torch

from engine.layers.rejection_sampler import accept_greedy, accept_sampled, rejection_sample
from engine.sampling_params import SamplingParams


def test_greedy_keeps_the_argmax_prefix_then_corrects_or_adds_a_bonus():
    assert accept_greedy([5, 6, 9, 1], [5, 6, 7]) == [5, 6, 9]  # the third is not row 2's argmax: corrected
    assert accept_greedy([5, 6, 7, 1], [5, 6, 7]) == [5, 6, 7, 1]  # all kept: row 3's bonus token
    assert accept_greedy([4, 6, 7, 1], [5, 6, 7]) == [4]
    assert accept_greedy([3], []) == [3]


def test_rejection_sample_splits_rows_by_request():
    x = torch.full((5, 6), -10.0)
    x[[0, 1, 2, 3, 4], [2, 3, 1, 4, 5]] = 10.0  # argmaxes 2 3 1 | 4 5
    greedy = SamplingParams(temperature=0)
    got = rejection_sample(x, [(0, [2, 4]), (3, [4])], [greedy, greedy], [None, None], torch.Generator())
    assert got == [[2, 3], [4, 5]]


TOLERANCE = 0.02  # total variation; with 20,000 draws over 6 tokens the expected distance is about 0.006


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def test_sampling_keeps_the_targets_distribution():
    """Row 0's distribution p0 must be the first token's whatever the proposal (accepted with p0(d), else drawn
    from p0 without d); given the first proposal accepted, the second token follows row 1's p1."""
    gen = torch.Generator().manual_seed(1234)
    p0 = torch.tensor([0.05, 0.40, 0.10, 0.25, 0.15, 0.05])
    p1 = torch.tensor([0.30, 0.05, 0.05, 0.20, 0.10, 0.30])
    p2 = torch.tensor([0.10, 0.10, 0.10, 0.10, 0.10, 0.50])
    probs = torch.stack([p0, p1, p2])
    drafts = [3, 0]  # an ordinary proposal: p0(3) = 0.25, p1(0) = 0.3
    first = torch.zeros(6)
    second = torch.zeros(6)
    for _ in range(20_000):
        out = accept_sampled(probs, drafts, gen)
        first[out[0]] += 1
        if out[0] == drafts[0]:
            second[out[1]] += 1
    assert _tv(first, p0) < TOLERANCE
    assert _tv(second, p1) < TOLERANCE
    assert first[3] / first.sum() < 0.3  # the proposal is not simply taken: a broken acceptance would show


def test_a_draft_the_target_never_samples_is_always_rejected():
    gen = torch.Generator().manual_seed(5)
    probs = torch.tensor([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    outs = {tuple(accept_sampled(probs, [0], gen)) for _ in range(200)}
    assert outs == {(1,), (2,)}
