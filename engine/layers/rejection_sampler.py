"""Speculative decoding's verification: which of a request's proposed tokens the target model keeps, and the token
after them, so that the output is distributed exactly as the target's own sampling (Leviathan et al. 2023, Chen et
al. 2023; vLLM's rejection sampler).

A request with k proposed tokens d_0..d_{k-1} has k+1 rows of processed logits (engine/layers/sampler.py
``Sampler.processed``): row j is the target's distribution p_j after the request's tokens and d_0..d_{j-1}.

- greedy: d_j is kept while it is row j's argmax; the first row where it is not gives the correction (its argmax),
  and with every proposal kept the last row gives a bonus token: the same tokens as plain greedy decoding.
- sampled: the proposers here are deterministic (prompt lookup, a greedy draft), so the proposal distribution q_j is
  a point mass on d_j: d_j is kept with probability min(1, p_j(d_j) / q_j(d_j)) = p_j(d_j); on rejection the token
  is drawn from the normalised residual (p_j - q_j)+ = p_j without d_j; with every proposal kept, from p_k. A
  request's own generator (a seed) draws all of it."""

from __future__ import annotations

import torch

from engine.layers.sampler import filtered_probs


def accept_greedy(argmax_rows: list[int], drafts: list[int]) -> list[int]:
    """The tokens a greedy request emits: its drafts up to the first one that is not row j's argmax, then that
    row's argmax (len(argmax_rows) == len(drafts) + 1)."""
    out = []
    for j, d in enumerate(drafts):
        if argmax_rows[j] != d:
            break
        out.append(d)
    out.append(argmax_rows[len(out)])
    return out


def accept_sampled(probs: torch.Tensor, drafts: list[int], generator: torch.Generator) -> list[int]:
    """The tokens a sampling request emits, ``probs`` its k+1 rows of filtered probabilities (float32, any device;
    filtered_probs' rows), by rejection sampling against point-mass proposals."""
    dev = probs.device
    p_drafts = probs[torch.arange(len(drafts), device=dev), torch.tensor(drafts, dtype=torch.long, device=dev)] \
        .tolist() if drafts else []
    out = []
    for j, d in enumerate(drafts):
        u = torch.rand((), generator=generator, device=generator.device).item()
        if u < p_drafts[j]:
            out.append(d)
            continue
        residual = probs[j].clone()
        residual[d] = 0.0
        out.append(_draw(residual, generator))
        return out
    out.append(_draw(probs[len(drafts)], generator))
    return out


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One token with probability proportional to ``weights`` (its argmax where nothing is drawable)."""
    total = float(weights.sum())
    if not total > 0 or not torch.isfinite(weights).all():
        return int(torch.argmax(torch.nan_to_num(weights, nan=-1.0)))
    gen = generator if generator.device == weights.device else None
    return int(torch.multinomial(weights / total, 1, generator=gen))


def rejection_sample(x: torch.Tensor, spans: list[tuple[int, list[int]]], params: list, generators: list,
                     default_generator: torch.Generator) -> list[list[int]]:
    """Each request's emitted tokens: ``x`` the processed logits of every row (float32 [rows, vocab]), ``spans``
    each request's first row and drafts (its rows: first .. first + len(drafts)), ``params`` / ``generators`` per
    request (None: the default generator)."""
    argmax = torch.argmax(x, dim=-1).tolist()
    out = []
    for (first, drafts), p, g in zip(spans, params, generators):
        rows = argmax[first:first + len(drafts) + 1]
        if p.greedy:
            out.append(accept_greedy(rows, drafts))
            continue
        probs = filtered_probs(x[first:first + len(drafts) + 1], [p] * (len(drafts) + 1))
        usable = bool(torch.isfinite(probs).all()) and bool((probs.sum(dim=-1) > 0).all())
        out.append(accept_sampled(probs, drafts, g or default_generator) if usable
                   else accept_greedy(rows, drafts))
    return out
