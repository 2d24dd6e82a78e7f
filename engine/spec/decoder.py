"""The engine core's half of speculative decoding: before each schedule, the proposals of every decoding request
(``propose``: the proposer's guesses, cut to what the request may still emit and at the first token its grammar
refuses; the scheduler verifies them with the request's last token in one k+1-token pass); after the step, the
counts and each request's back-off (``settle``); after the whole step, its cost (``step_done``).

Back-off: a request whose proposals were all rejected proposes nothing for 1, 2, 4 .. up to 32 steps, so that a
prompt where lookups miss (a plain chat) pays for few wasted verify passes; any accepted proposal resets it. With a
proposer whose proposals cost nothing (``free``: n-gram lookup) it drops its next 1, 2, 4 .. proposals instead: a
lookup that hits once in many steps would otherwise never meet a skipped step.

Cost gate (``StepCosts``): the decoder times whole steps (one ``step_done`` to the next: proposing, scheduling,
the forward pass, verifying, output and settling) and keeps a running mean of a step's seconds, per number of
decoding requests, for steps with verify passes and for plain decode steps. Each request keeps a running mean of
the tokens its verify passes emit. A verify pass pays where those tokens beat what plain steps emit in the same
time (tokens per pass > verify step / plain step); one that does not counts as a miss of the back-off above, so
the request decodes plainly for 1, 2, 4 .. steps and then tries again (which keeps both costs measured). Without a
measured plain step yet, every pass pays. After ``PLAIN_REFRESH_STEPS`` steps without a plain one, one step
proposes nothing, so the plain cost stays fresh."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from engine.spec.config import SpeculativeConfig

MAX_BACKOFF_STEPS = 32
COST_WEIGHT = 0.2  # weight of the newest step in the running mean of a step's seconds
PASS_WEIGHT = 0.3  # weight of the newest verify pass in a request's running mean of tokens per pass
PLAIN_REFRESH_STEPS = 64


@dataclass
class SpeculativeCounts:
    """Totals since start: proposed tokens verified, of them accepted, verify passes (request-steps with
    proposals) and the tokens those passes emitted."""

    proposed: int = 0
    accepted: int = 0
    verify_steps: int = 0
    emitted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a verify pass emits on average (1 + accepted proposals)."""
        return self.emitted / self.verify_steps if self.verify_steps else 0.0


@dataclass
class _Backoff:
    skip: int = 0  # steps left without proposals
    misses: int = 0  # verify passes in a row that accepted nothing or did not pay
    tokens_per_pass: float | None = None  # running mean of the tokens its verify passes emitted


@dataclass
class StepCosts:
    """Running means of a step's seconds, per number of decoding requests in it: steps with verify passes and plain
    decode steps."""

    verify: dict[int, float] = field(default_factory=dict)
    plain: dict[int, float] = field(default_factory=dict)

    def add(self, seconds: float, decoding: int, verified: bool) -> None:
        means = self.verify if verified else self.plain
        old = means.get(decoding)
        means[decoding] = seconds if old is None else old + COST_WEIGHT * (seconds - old)

    def break_even(self, decoding: int) -> float | None:
        """Tokens a verify pass must emit to beat plain steps (verify step / plain step); None: not both measured."""
        v, p = self.verify.get(decoding), self.plain.get(decoding)
        return v / p if v is not None and p else None


@dataclass
class SpeculativeDecoder:
    config: SpeculativeConfig
    proposer: object  # propose(reqs, limits) -> list[list[int]]; remove(request_id); optional prefill(scheduled)
    counts: SpeculativeCounts = field(default_factory=SpeculativeCounts)
    backoff: dict[str, _Backoff] = field(default_factory=dict)
    costs: StepCosts = field(default_factory=StepCosts)
    clock: Callable[[], float] = time.monotonic
    _last_done: float | None = None  # clock at the last step_done
    _settled: list = field(default_factory=list)  # requests whose verify passes since the last step accepted some
    _passes: int = 0  # verify passes since the last step_done
    _steps_since_plain: int = 0

    def propose(self, running: list, max_model_len: int) -> None:
        """Set ``spec_token_ids`` of every running request: its proposals where it decodes, else none."""
        k = self.config.num_speculative_tokens
        free = getattr(self.proposer, "free", False)  # its back-off skips proposals, not steps
        refresh = self._steps_since_plain >= PLAIN_REFRESH_STEPS
        asking, limits = [], []
        for r in running:
            r.spec_token_ids = []
            if r.pooling is not None or r.num_computed_tokens + 1 != r.num_tokens or refresh:
                continue
            b = self.backoff.get(r.request_id)
            if b is not None and b.skip > 0 and not free:
                b.skip -= 1
                continue
            left = min(k, (r.params.max_tokens or max_model_len) - len(r.output_token_ids) - 1,
                       max_model_len - r.num_tokens - 1)
            if left > 0:
                asking.append(r)
                limits.append(left)
        if not asking:
            return
        for r, d in zip(asking, self.proposer.propose(asking, limits)):
            b = self.backoff.get(r.request_id) if free and d else None
            if b is not None and b.skip > 0:
                b.skip -= 1
                continue
            if d and r.grammar is not None:
                d = grammar_prefix(r.grammar, d)
            r.spec_token_ids = list(d)

    def prefill(self, scheduled: list) -> None:
        """The step's prompt chunks (its ScheduledSequences, before the target runs them) to a proposer that keeps
        state of its own (a draft model's KV: ``DraftProposer.prefill``), so that it processes a prompt with the
        target, not in the first proposal step."""
        fill = getattr(self.proposer, "prefill", None)
        if fill is not None:
            fill(scheduled)

    def settle(self, request_id: str, proposed: int, emitted: int, track: bool = True) -> None:
        """A verify pass of ``proposed`` tokens emitted ``emitted`` (its accepted proposals and one more); ``track``
        False: the request has finished (counted, no back-off state kept)."""
        c = self.counts
        accepted = min(proposed, max(0, emitted - 1))
        c.proposed += proposed
        c.accepted += accepted
        c.verify_steps += 1
        c.emitted += emitted
        self._passes += 1
        if not track:
            return
        b = self.backoff.setdefault(request_id, _Backoff())
        b.tokens_per_pass = emitted if b.tokens_per_pass is None else (
            b.tokens_per_pass + PASS_WEIGHT * (emitted - b.tokens_per_pass))
        if accepted:  # judged by the cost gate once the step is timed (step_done)
            self._settled.append(request_id)
        else:
            _miss(b)

    def step_done(self, prefill_tokens: int, decoding: int) -> None:
        """After each step (its tokens appended and settled): its whole cost, from the last call to this one, into
        the running means (a step with no prompt tokens and ``decoding`` decoding requests: one of them or more
        verified, or none), then the cost gate on the requests whose passes this step accepted proposals."""
        now = self.clock()
        last, self._last_done = self._last_done, now
        if last is not None and not prefill_tokens and decoding:
            self.observe_step(now - last, decoding)
        else:  # not a decode step's cost: its passes that accepted proposals paid
            self._judge(None)
            self._passes = 0

    def observe_step(self, seconds: float, decoding: int) -> None:
        """A decode step of ``seconds`` with ``decoding`` requests; the requests settled since the last step (with
        accepted proposals) back off where their tokens per pass do not beat the step's measured break-even."""
        verified, self._passes = self._passes > 0, 0
        self.costs.add(seconds, decoding, verified)
        self._steps_since_plain = self._steps_since_plain + 1 if verified else 0
        self._judge(self.costs.break_even(decoding))

    def _judge(self, need: float | None) -> None:
        """Each request settled since the last step with accepted proposals: a miss where its tokens per pass do
        not beat ``need`` (None: not measured, every pass pays), else its back-off reset."""
        settled, self._settled = self._settled, []
        for rid in settled:
            b = self.backoff.get(rid)
            if b is None:
                continue
            if need is not None and b.tokens_per_pass <= need:
                _miss(b)
            else:
                b.misses = 0

    def remove(self, request_id: str) -> None:
        self.backoff.pop(request_id, None)
        self.proposer.remove(request_id)


def _miss(b: _Backoff) -> None:
    """A verify pass that accepted nothing or did not pay: 1, 2, 4 .. up to MAX_BACKOFF_STEPS steps without."""
    b.misses += 1
    b.skip = min(MAX_BACKOFF_STEPS, 1 << (b.misses - 1))


def grammar_prefix(grammar, drafts: list[int]) -> list[int]:
    """The proposals up to the first one the request's grammar refuses, and before one that would end the grammar
    (its stop token: nothing can be verified after it); the matcher is left where it was."""
    taken = keep = 0
    for t in drafts:
        if not grammar.accept_token(t):
            break
        taken += 1
        if grammar.is_terminated():
            break
        keep += 1
    if taken:
        grammar.matcher.rollback(taken)
    return drafts[:keep]


def build_speculative(text: str | None, **draft_kw) -> SpeculativeDecoder | None:
    """--speculative-config -> the decoder with its proposer (None: off). ``draft_kw`` is what a draft model needs
    of the target (engine/spec/draft.py ``DraftProposer.load``)."""
    from engine.spec.config import parse_speculative_config

    cfg = parse_speculative_config(text)
    if cfg is None:
        return None
    if cfg.method == "ngram":
        from engine.spec.ngram import NgramProposer

        return SpeculativeDecoder(cfg, NgramProposer(cfg.prompt_lookup_max, cfg.prompt_lookup_min))
    from engine.spec.draft import DraftProposer

    return SpeculativeDecoder(cfg, DraftProposer.load(cfg, **draft_kw))
