"""Continuous-batching scheduler: a token budget per step, decodes first, then chunked prefill;
preemption by recompute (newest first) when blocks run out."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.core.kv_cache import BlockManager
from engine.core.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed this step, starting at request.num_computed_tokens
    pending: int = 0  # tokens of the request still on the device (a step launched ahead: its input is one)

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the request's tokens, so a token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens + self.pending


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # decodes first, then prefills
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last one is the newest
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        blocks = self.blocks
        decodes: list[tuple[Request, int]] = []
        prefills: list[tuple[Request, int]] = []
        for r in self.running:  # one pass: a busy endpoint runs ~1,000 of them per step
            left = len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens
            if left == 1:
                decodes.append((r, 1))
            elif left > 1:
                prefills.append((r, left))
        scheduled: dict[int, ScheduledRequest] = {}
        for req, left in decodes + prefills:
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(left, budget)
            while not blocks.allocate(req, n):
                victim = self.running[-1]
                self._preempt(victim, out)
                scheduled.pop(id(victim), None)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                continue
            scheduled[id(req)] = ScheduledRequest(req, n)
            budget -= n
        # admit waiting requests while there is budget, room and memory (no preemption for them)
        admitted_decode = False  # one whose prefix hits leave one token: it belongs with the decodes
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            req = self.waiting[0]
            hits = blocks.match_prefix(req) if req.num_computed_tokens == 0 and _may_share(req) else []
            cached = len(hits) * blocks.block_size
            n = min(req.num_tokens - req.num_computed_tokens - cached, budget)
            if not blocks.allocate(req, n, hits):
                break
            blocks.record_lookup(req.num_tokens, cached)
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            if req.timings.first_scheduled is None:
                req.timings.first_scheduled = time.monotonic()
            self.running.append(req)
            scheduled[id(req)] = ScheduledRequest(req, n)
            admitted_decode |= n == 1 and req.num_computed_tokens + 1 == req.num_tokens
            budget -= n
        items = list(scheduled.values())  # running decodes, running prefills, admitted requests
        if admitted_decode:  # decodes first (stable: the others keep their order)
            items.sort(key=lambda s: s.num_new_tokens != 1
                       or s.request.num_computed_tokens + 1 != s.request.num_tokens)
        out.scheduled = items
        return out

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.blocks.free_request(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req)

    def finish(self, req: Request) -> None:
        """Remove a finished or aborted request and free its blocks at once."""
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.blocks.free_request(req)
        req.status = RequestStatus.FINISHED


def _may_share(req: Request) -> bool:
    """Whether a prefix-cache hit may skip the computation of the request's first tokens: not for an embedding
    pooled over every token (mean) or on the first (CLS), whose runner needs their hidden states."""
    return req.pooling is None or req.pooling.mode == "last"
