"""Prompt logprobs (``SamplingParams.prompt_logprobs``: /v1/completions' ``echo`` with ``logprobs``, what evaluation
harnesses score a text with): the logprob of each prompt token under the logits of the position before it, and the
best tokens there.

The rows come from the step's final hidden states (``StepInputs.prompt_rows``, chosen by
engine/runner/inputs.py ``score_prompt`` beside the rows that sample), through the LM head in chunks of at most
``CHUNK_ELEMENTS`` logits, so a long prompt never holds a vocabulary x prompt-length tensor: each chunk is reduced
to the target's logprob and the top-k before the next. Every tensor-parallel rank runs the same chunks (the head's
all-gather is a collective); rank 0 keeps the result. ``to_host`` turns a step's scores into per-request lists of
``TokenLogprobs`` (one host copy, after the step's tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.ops.transfer import to_device
from engine.runner.inputs import StepInputs, select_rows
from engine.wire import TokenLogprobs

CHUNK_ELEMENTS = 1 << 24  # float32 logits per chunk: 64 MiB (341 rows of a 49,152-token vocabulary)


@dataclass
class PromptScores:
    """One step's prompt scores on the device: per scored row the target's logprob and the top values / ids
    (as many columns as the step's largest ask), with the step's spans (request id, first position scored,
    positions, the request's own top count) and the scored tokens."""

    chosen: torch.Tensor
    top_values: torch.Tensor
    top_ids: torch.Tensor
    spans: list[tuple[str, int, int, int]]
    targets: list[int]


@torch.inference_mode()
def score_rows(model, hidden: torch.Tensor, inp: StepInputs, vocab: int) -> PromptScores:
    """Log-softmax of the LM head's logits at ``inp.prompt_rows`` of ``hidden``, chunk by chunk (``vocab``: the
    head's width, which sizes the chunks)."""
    rows, targets, k = inp.prompt_rows, inp.prompt_targets, inp.prompt_top
    chunk = max(1, CHUNK_ELEMENTS // max(1, vocab))
    chosen, top_v, top_i = [], [], []
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        lp = torch.log_softmax(model.compute_logits(select_rows(hidden, part)).float(), dim=-1)
        want = to_device(targets[i:i + chunk], torch.long, lp.device).unsqueeze(1)
        chosen.append(lp.gather(1, want).squeeze(1))
        if k:
            v, ids = torch.topk(lp, k, dim=-1)
            top_v.append(v)
            top_i.append(ids)
        del lp
    empty = hidden.new_zeros((len(rows), 0), dtype=torch.float32)
    return PromptScores(torch.cat(chosen), torch.cat(top_v) if k else empty,
                        torch.cat(top_i) if k else empty.long(), list(inp.prompt_spans), list(targets))


def to_host(scores: PromptScores) -> list[tuple[str, int, list[TokenLogprobs]]]:
    """(request id, first position scored, its TokenLogprobs) per span, each with the request's own top count."""
    chosen = scores.chosen.tolist()
    tv, ti = scores.top_values.tolist(), scores.top_ids.tolist()
    out = []
    row = 0
    for rid, first, count, k in scores.spans:
        lps = [TokenLogprobs(scores.targets[r], chosen[r], [(int(ti[r][j]), tv[r][j]) for j in range(k)])
               for r in range(row, row + count)]
        out.append((rid, first, lps))
        row += count
    return out
