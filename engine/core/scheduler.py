"""Continuous-batching scheduler: a token budget per step, decodes first, then chunked prefill;
preemption by recompute (newest first) when blocks run out.

The one owner of request state: the queues, each request's blocks and computed tokens, and the step launched
ahead (async scheduling, vLLM v1's async scheduler). The engine core asks it for each step's plan (``schedule``,
or ``schedule_ahead`` for a decode step launched before the step that samples its input tokens completes), tells
it when a plan is on the device (``launched``) and when that step's tokens are on the host (``update_from_output``),
and finishes requests through it (``finish``)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from engine.core.kv_cache import BlockManager
from engine.core.request import Request, RequestStatus
from engine.errors import KVCacheFullError


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed this step, starting at request.num_computed_tokens
    pending: int = 0  # tokens of the request still on the device (a step launched ahead: its input is one)
    spec: "list[int] | tuple" = ()  # proposed tokens verified this step (after its last token)

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the request's tokens (and proposals), so a token is sampled."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens == r.num_tokens + self.pending + len(self.spec)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # decodes first, then prefills
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int | None = None, exact_hits: bool = False):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len  # a request's last position (schedule_ahead's length check)
        self.exact_hits = exact_hits  # a hit computes the same bits as a cold prefill (--deterministic): seeds share
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last one is the newest
        self.num_preemptions = 0
        self.ahead: SchedulerOutput | None = None  # the step launched ahead of the one whose tokens come next
        self.num_steps_ahead = 0  # steps launched before the one that samples their input tokens completed

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        blocks = self.blocks
        decodes: list[tuple[Request, int]] = []
        prefills: list[tuple[Request, int]] = []
        for r in self.running:  # one pass: a busy endpoint runs ~1,000 of them per step
            left = len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens
            if left == 1:
                decodes.append((r, 1 + len(r.spec_token_ids)))  # its proposals verified in the same pass
            elif left > 1:
                prefills.append((r, left))
        scheduled: dict[int, ScheduledRequest] = {}
        for req, left in decodes + prefills:
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(left, budget)
            spec = req.spec_token_ids[:n - 1] if req.spec_token_ids and n > 1 and _decoding(req) else []
            if spec and not blocks.allocate(req, n):
                n, spec = 1, []  # no room for the proposals: a plain decode (before preempting anyone)
            while not blocks.allocate(req, n):
                victim = self.running[-1]
                self._preempt(victim, out)
                scheduled.pop(id(victim), None)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                continue
            scheduled[id(req)] = ScheduledRequest(req, n, spec=spec)
            budget -= n
        # admit waiting requests while there is budget, room and memory (no preemption for them)
        admitted_decode = False  # one whose prefix hits leave one token: it belongs with the decodes
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            req = self.waiting[0]
            hits = blocks.match_prefix(req) if req.num_computed_tokens == 0 and _may_share(req, self.exact_hits) else []
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

    def schedule_ahead(self, sampled: Sequence[Request], pooled: bool = False) -> SchedulerOutput | None:
        """The plan of step N+1 while step N runs on the device (async scheduling, vLLM v1's and SGLang's overlap
        scheduler): each of N's requests decoding the token N samples (fed to N+1 on the device), so that N's
        detokenisation, stop checks and deltas, and the next schedule, run beside N+1. ``sampled``: the requests
        that sample in N; ``pooled``: N finished an embedding. Remembered as ``ahead`` (None where N+1 cannot go
        ahead: N then completes and the next step is scheduled as usual).

        Only a pure decode continuation goes ahead: nothing waiting to be admitted (or no room for it), every
        running request sampling in N, none with a grammar (its matcher takes N's token on the host; penalties
        count it on the device, engine/layers/penalties.py). A request that N finishes by its length leaves the
        batch; one that N stops (EOS, stop token or string) or that is aborted meanwhile has its N+1 token dropped,
        as if never sampled (its blocks are freed at once: later steps that reuse them queue behind N+1). Seeded
        requests draw the same tokens as without look-ahead."""
        self.ahead = None
        if not sampled or pooled or (self.waiting and len(self.running) < self.max_num_seqs):
            return None
        in_n = {id(r) for r in sampled}
        max_len = self.max_model_len
        batch = []
        for r in self.running:
            p = r.params
            if id(r) not in in_n or r.grammar is not None or r.pooling is not None:
                return None
            n_out = len(r.output_token_ids) + 1  # with N's token
            if n_out >= (p.max_tokens or max_len) or r.num_tokens + 1 >= max_len:
                continue  # N's token is its last
            batch.append(r)
        if not batch or not all(self.blocks.allocate(r, 1) for r in batch):
            return None  # (blocks allocated before a refusal serve the next step)
        self.ahead = SchedulerOutput([ScheduledRequest(r, 1, pending=1) for r in batch])
        self.num_steps_ahead += 1
        return self.ahead

    def launched(self, out: SchedulerOutput) -> None:
        """A plan is queued on the device: its tokens count as computed and its newly full blocks join the prefix
        cache (a later step that reads those blocks is queued behind it on the device). A step launched ahead
        computes a token not yet on the host: its blocks are registered once that token is (``update_from_output``)."""
        cache = out is not self.ahead
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
            if cache and not s.spec:  # proposals are not tokens yet: settle_speculative registers their blocks
                self.blocks.cache_full_blocks(s.request)

    def settle_speculative(self, s: ScheduledRequest, emitted: int) -> None:
        """A verify step's request kept ``emitted`` tokens (its accepted proposals and one more): its computed
        tokens drop to the accepted ones (the rejected proposals' KV slots are overwritten by the next step) and the
        blocks they filled join the prefix cache; a finished request has already given its blocks back."""
        req = s.request
        if req.is_finished:
            return
        req.num_computed_tokens -= len(s.spec) + 1 - emitted
        self.blocks.cache_full_blocks(req)

    def update_from_output(self, sampled: Sequence[Request]) -> None:
        """A step's tokens are on the host and appended to its requests (those that sampled, ``sampled``; the ones
        finished meanwhile are skipped): with a step launched ahead still in flight, the blocks those tokens filled
        join the prefix cache now."""
        if self.ahead is not None:
            for r in sampled:
                if not r.is_finished:
                    self.blocks.cache_full_blocks(r)

    def drop_finished_ahead(self) -> bool:
        """Forget the step launched ahead where none of its requests still runs (all stopped or aborted since its
        launch): nothing of it would be kept. True where there is none now."""
        if self.ahead is not None and all(s.request.is_finished for s in self.ahead.scheduled):
            self.ahead = None
        return self.ahead is None

    def scoring_steps(self, req: Request, chunk: int) -> Iterator[SchedulerOutput]:
        """Steps that compute a request outside the queues (prompt scoring) in chunks of ``chunk`` tokens, on blocks
        borrowed from the cache; KVCacheFullError where they have no room. Close the iterator (or exhaust it) to
        give the blocks back."""
        try:
            while req.num_computed_tokens < req.num_tokens:
                n = min(req.num_tokens - req.num_computed_tokens, chunk)
                if not self.blocks.allocate(req, n):
                    raise KVCacheFullError("The KV cache has no room to score this sequence now; retry when idle.")
                yield SchedulerOutput([ScheduledRequest(req, n)])
                req.num_computed_tokens += n
        finally:
            self.blocks.free_request(req)

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


def _decoding(req: Request) -> bool:
    """One token left to compute: a decode, whose proposals may be verified with it."""
    return req.num_computed_tokens + 1 == req.num_tokens


def _may_share(req: Request, exact_hits: bool = False) -> bool:
    """Whether a prefix-cache hit may skip the computation of the request's first tokens: not for an embedding
    pooled over every token (mean) or on the first (CLS), whose runner needs their hidden states; not for a request
    that asks for its prompt's logprobs (the logits of every prompt position); and not for a seeded one (D5 of issue
    47): the rows after a hit are computed in a smaller call than a cold prefill's (a 1-row GEMV where the cold
    prompt's last row came from a GEMM on the CPU's GGUF kernels), whose logits differ in their last bits, so the
    seed's draws would pick other tokens warm than cold. With ``exact_hits`` (--deterministic: every row computed
    alike whatever the call) a seeded request shares."""
    p = req.params
    if p.prompt_logprobs is not None or (p.seed is not None and not exact_hits):
        return False
    return req.pooling is None or req.pooling.mode == "last"
