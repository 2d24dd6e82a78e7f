"""Reference sampler for tests: one request at a time, in the plainest torch (the engine's was this until it
was batched). engine/layers/sampler.py must pick the same greedy tokens and draw from the same distributions.

Order: logit bias, min_tokens masking, repetition / presence / frequency penalties, then greedy
argmax or temperature -> top-k -> top-p -> min-p -> draw (with the request's own generator when it
has a seed). Logprobs are those of the model's raw distribution, as OpenAI and vLLM report them."""

from __future__ import annotations

import torch

from engine.core.request import Request
from engine.wire import TokenLogprobs


def _penalize(logits: torch.Tensor, req: Request) -> None:
    p = req.params
    dev = logits.device
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.all_token_ids)), dtype=torch.long, device=dev)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and req.output_token_ids:
        out = torch.tensor(req.output_token_ids, dtype=torch.long, device=dev)
        counts = torch.zeros_like(logits).index_add_(0, out, torch.ones_like(out, dtype=logits.dtype))
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _mask_stop_tokens(logits: torch.Tensor, req: Request) -> None:
    ids = set(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        ids |= req.eos_token_ids
    ids = [i for i in ids if 0 <= i < logits.shape[-1]]
    if ids:
        logits[ids] = float("-inf")


def _finite(logits: torch.Tensor) -> torch.Tensor:
    """Extreme but valid parameters (a temperature of 1e-5, a repetition penalty of 1e-30) overflow float32;
    NaN becomes impossible (-inf) and +inf the largest float, so softmax stays defined."""
    return torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max)


def _filter(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """logits of one row after temperature; returns probabilities with the filtered tokens at 0."""
    logits = _finite(logits)
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    if top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = (cum - sorted_p) > top_p * cum[-1]  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
    return probs


def process_row(row: torch.Tensor, req: Request) -> torch.Tensor:
    """One request's float32 logits after logit bias, min_tokens masking and penalties (a copy)."""
    p = req.params
    row = row.clone()
    if p.logit_bias:
        ids = torch.tensor([t for t in p.logit_bias if 0 <= t < row.shape[-1]], dtype=torch.long)
        if len(ids):
            row[ids] += torch.tensor([p.logit_bias[int(t)] for t in ids], dtype=row.dtype)
    if len(req.output_token_ids) < p.min_tokens:
        _mask_stop_tokens(row, req)
    if p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
        _penalize(row, req)
    return row


def reference_probs(row: torch.Tensor, req: Request) -> torch.Tensor:
    """The distribution a non-greedy request draws from."""
    p = req.params
    return _filter(process_row(row, req) / p.temperature, p.top_k, p.top_p, p.min_p)


class ReferenceSampler:
    def __init__(self, default_generator: torch.Generator):
        self.default_generator = default_generator

    def __call__(self, logits: torch.Tensor, reqs: list[Request], generators: list[torch.Generator | None]
                 ) -> tuple[list[int], list[TokenLogprobs | None]]:
        logits = logits.float()
        want_lp = [r.params.logprobs is not None for r in reqs]
        raw_lp = torch.log_softmax(logits, dim=-1) if any(want_lp) else None
        tokens: list[int] = []
        for i, req in enumerate(reqs):
            row = process_row(logits[i], req)
            if req.params.greedy:
                tokens.append(int(torch.argmax(_finite(row))))
                continue
            probs = reference_probs(logits[i], req)
            if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
                tokens.append(int(torch.argmax(_finite(row))))
                continue
            gen = generators[i] or self.default_generator
            tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
        lps: list[TokenLogprobs | None] = []
        for i, req in enumerate(reqs):
            if not want_lp[i]:
                lps.append(None)
                continue
            row = raw_lp[i]
            n = req.params.logprobs
            top = []
            if n:
                v, ix = torch.topk(row, n)
                top = list(zip(ix.tolist(), v.tolist()))
            lps.append(TokenLogprobs(tokens[i], float(row[tokens[i]]), top))
        return tokens, lps
