"""Token counts for the repetition / presence / frequency penalties, kept per request on the logits' device.

Each penalised request owns a row of two [capacity, vocab] buffers: the tokens of its prompt (bool) and how often
it generated each token (int32). A row is filled from the request's host lists once, when it first samples (one
upload of its prompt and outputs); after that every sampled token is counted on the device by the step that
draws it (``record``), so no step uploads a history, and a step launched ahead of the one that samples its input
(engine/core/core.py) already sees that token in the counts. Rows are freed with their request and reused; the
buffers double when full (a device copy). Memory: 5 bytes x vocab per penalised request (640 KB at 128k).

``penalty_tensors_from_lists`` builds the same two tensors from token lists: the reference form, used where no
state is kept (the sampler's tests)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.ops.transfer import to_device

INITIAL_ROWS = 8


def has_penalty(params) -> bool:
    return params.repetition_penalty != 1.0 or bool(params.presence_penalty) or bool(params.frequency_penalty)


class PenaltyState:
    def __init__(self, device: torch.device):
        self.device = device
        self.prompt: torch.Tensor | None = None  # bool [capacity, vocab]
        self.counts: torch.Tensor | None = None  # int32 [capacity, vocab]
        self.row_of: dict[str, int] = {}
        self.free: list[int] = []

    def rows(self, reqs: Sequence, vocab: int) -> list[int]:
        """Each request's row, filled from its host lists where it has none yet."""
        out = []
        for r in reqs:
            row = self.row_of.get(r.request_id)
            if row is None:
                row = self._new_row(r.request_id, vocab)
                self._fill(row, r.prompt_token_ids, r.output_token_ids, vocab)
            out.append(row)
        return out

    def gather(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(output counts int32, prompt mask bool), [len(rows), vocab] each."""
        idx = to_device(rows, torch.long, self.device)
        return self.counts.index_select(0, idx), self.prompt.index_select(0, idx)

    def record(self, rows: list[int], tokens: torch.Tensor) -> None:
        """Count ``tokens`` (int64 on the device, one per row) into ``rows``: no host sync."""
        idx = to_device(rows, torch.long, self.device)
        self.counts.index_put_((idx, tokens), torch.ones((), dtype=torch.int32, device=self.device),
                               accumulate=True)

    def release(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.free.append(row)

    def _new_row(self, request_id: str, vocab: int) -> int:
        if self.counts is None or self.counts.shape[1] != vocab:
            self.prompt = torch.zeros(INITIAL_ROWS, vocab, dtype=torch.bool, device=self.device)
            self.counts = torch.zeros(INITIAL_ROWS, vocab, dtype=torch.int32, device=self.device)
            self.free = list(range(INITIAL_ROWS - 1, -1, -1))
            self.row_of.clear()
        if not self.free:
            cap = self.counts.shape[0]
            self.prompt = torch.cat([self.prompt, torch.zeros_like(self.prompt)])
            self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
            self.free = list(range(2 * cap - 1, cap - 1, -1))
        row = self.free.pop()
        self.row_of[request_id] = row
        return row

    def _fill(self, row: int, prompt: Sequence[int], output: Sequence[int], vocab: int) -> None:
        self.prompt[row].zero_()
        self.counts[row].zero_()
        ids = [t for t in prompt if 0 <= t < vocab]
        if ids:
            self.prompt[row].index_fill_(0, to_device(ids, torch.long, self.device), True)
        out = [t for t in output if 0 <= t < vocab]
        if out:
            self.counts[row].index_put_((to_device(out, torch.long, self.device),),
                                        torch.ones((), dtype=torch.int32, device=self.device), accumulate=True)


def penalty_tensors_from_lists(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], vocab: int,
                               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(output counts int32, prompt mask bool) [len(prompts), vocab] of token lists."""
    counts = torch.zeros(len(prompts), vocab, dtype=torch.int32, device=device)
    prompt = torch.zeros(len(prompts), vocab, dtype=torch.bool, device=device)
    pr = [(i, t) for i, ids in enumerate(prompts) for t in ids if 0 <= t < vocab]
    if pr:
        prompt.index_put_((to_device([i for i, _ in pr], torch.long, device),
                           to_device([t for _, t in pr], torch.long, device)),
                          torch.ones((), dtype=torch.bool, device=device))
    oc = [(i, t) for i, ids in enumerate(outputs) for t in ids if 0 <= t < vocab]
    if oc:
        counts.index_put_((to_device([i for i, _ in oc], torch.long, device),
                           to_device([t for _, t in oc], torch.long, device)),
                          torch.ones((), dtype=torch.int32, device=device), accumulate=True)
    return counts, prompt
