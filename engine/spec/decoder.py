"""The engine core's half of speculative decoding: before each schedule, the proposals of every decoding request
(``propose``: the proposer's guesses, cut to what the request may still emit and at the first token its grammar
refuses; the scheduler verifies them with the request's last token in one k+1-token pass); after the step, the
counts and each request's back-off (``settle``).

Back-off: a request whose proposals were all rejected proposes nothing for 1, 2, 4 .. up to 32 steps, so that a
prompt where lookups miss (a plain chat) pays for few wasted verify passes; any accepted proposal resets it."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.spec.config import SpeculativeConfig

MAX_BACKOFF_STEPS = 32


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
    misses: int = 0  # verify passes in a row that accepted nothing


@dataclass
class SpeculativeDecoder:
    config: SpeculativeConfig
    proposer: object  # propose(reqs, limits) -> list[list[int]]; remove(request_id); optional prefill(scheduled)
    counts: SpeculativeCounts = field(default_factory=SpeculativeCounts)
    backoff: dict[str, _Backoff] = field(default_factory=dict)

    def propose(self, running: list, max_model_len: int) -> None:
        """Set ``spec_token_ids`` of every running request: its proposals where it decodes, else none."""
        k = self.config.num_speculative_tokens
        asking, limits = [], []
        for r in running:
            r.spec_token_ids = []
            if r.pooling is not None or r.num_computed_tokens + 1 != r.num_tokens:
                continue
            b = self.backoff.get(r.request_id)
            if b is not None and b.skip > 0:
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
        if not track:
            return
        b = self.backoff.setdefault(request_id, _Backoff())
        if accepted:
            b.misses = 0
        else:
            b.misses += 1
            b.skip = min(MAX_BACKOFF_STEPS, 1 << (b.misses - 1))

    def remove(self, request_id: str) -> None:
        self.backoff.pop(request_id, None)
        self.proposer.remove(request_id)


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
