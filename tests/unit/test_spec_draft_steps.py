"""The steps a draft model's runner is given (engine/spec/draft.py, no engine: a recording stand-in for its
ModelRunner whose greedy next token is the row's input token + 1): a prompt processed once as a prefill in the
target's step (cut to the step's token budget, no logits), each later catch-up and proposal as decode rows (one span
of one token per row, over its own context) in calls of at most DECODE_ROWS rows, a long catch-up as a prefill; the
proposals in the requests' order; a finished request's KV taken by the next prompt that starts alike, and given back
when blocks run short."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from engine.spec.draft import DECODE_ROWS, RETAINED_MAX, DraftProposer

VOCAB = 1000


class RecordingRunner:
    """What DraftProposer uses of a ModelRunner; ``run`` records each step's StepInputs."""

    def __init__(self, num_blocks=64, block_size=4, budget=16):
        self.block_size, self.num_blocks, self.deterministic = block_size, num_blocks, False
        self.config = SimpleNamespace(max_num_batched_tokens=budget)
        self.steps = []

    def run(self, inp):
        self.steps.append(inp)
        if not inp.logit_rows:
            return None
        logits = torch.zeros(len(inp.logit_rows), VOCAB)
        for i, r in enumerate(inp.logit_rows):
            logits[i, (inp.token_ids[r] + 1) % VOCAB] = 1.0
        return logits


@dataclass
class Req:
    """The fields of a target's request the draft reads."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    pooling: None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def _scheduled(req, n):
    return SimpleNamespace(request=req, num_new_tokens=n, spec=())


def _decode_rows(inp) -> bool:
    return all(s.query_len == 1 for s in inp.seqs) and len(inp.seqs) == len(inp.token_ids)


def test_a_prompt_once_in_the_targets_step_then_decode_rows():
    runner = RecordingRunner(budget=16)
    draft = DraftProposer(runner, "draft")
    prompt = list(range(10, 50))  # 40 tokens: three prefill calls of the 16-token budget
    req = Req("a", list(prompt), num_computed_tokens=32)  # the target's prefix cache had 32 of them
    draft.prefill([_scheduled(req, 8)])
    assert [len(s.token_ids) for s in runner.steps] == [16, 16, 8]
    assert [t for s in runner.steps for t in s.token_ids] == prompt  # the whole prompt, once
    assert all(not s.logit_rows for s in runner.steps)
    assert draft.prefill_tokens == draft.tokens_computed == 40

    req.num_computed_tokens, req.output_token_ids = 40, [50]
    req.all_token_ids.append(50)
    runner.steps.clear()
    assert draft.propose([req], [3]) == [[51, 52, 53]]
    assert [s.token_ids for s in runner.steps] == [[50], [51], [52]]  # the new token, then the proposals
    assert all(_decode_rows(s) for s in runner.steps)
    assert [s.seqs[0].context_len for s in runner.steps] == [41, 42, 43]

    # the target kept all three and emitted 60: the draft catches up on 53 (its last proposal, never fed) and 60,
    # two decode rows over their own contexts, the last row's logits
    req.all_token_ids += [51, 52, 53, 60]
    req.num_computed_tokens = len(req.all_token_ids) - 1
    runner.steps.clear()
    assert draft.propose([req], [2]) == [[61, 62]]
    first = runner.steps[0]
    assert first.token_ids == [53, 60] and _decode_rows(first)
    assert [s.context_len for s in first.seqs] == [44, 45] and first.logit_rows == [1]
    # the target rejected the first proposal (61) for 70: the draft's KV of 61 is overwritten, nothing else redone
    req.all_token_ids.append(70)
    req.num_computed_tokens += 1
    runner.steps.clear()
    assert draft.propose([req], [1]) == [[71]]
    assert [(s.token_ids, s.seqs[0].context_len) for s in runner.steps] == [([70], 46)]
    assert draft.prefill_tokens == 40  # no prompt computed again
    draft.remove("a")
    assert len(draft.free_blocks) + len(draft.retained["a"].block_ids) == runner.num_blocks


def test_short_catch_ups_share_decode_row_calls_a_long_one_prefills():
    runner = RecordingRunner(num_blocks=256)
    draft = DraftProposer(runner, "draft")
    long = Req("long", list(range(100, 100 + DECODE_ROWS + 5)))  # never prefilled: a catch-up past DECODE_ROWS
    shorts = [Req(f"s{i}", [200 + i] * 3) for i in range(DECODE_ROWS // 3 + 2)]  # 3 rows each: more than one call
    reqs = [shorts[0], long] + shorts[1:]
    got = draft.propose(reqs, [1] * len(reqs))
    assert got == [[r.all_token_ids[-1] + 1] for r in reqs]  # each its own next token, in the requests' order
    rows = [s for s in runner.steps if _decode_rows(s)]
    prefills = [s for s in runner.steps if not _decode_rows(s)]
    assert len(prefills) == 1 and prefills[0].token_ids == long.all_token_ids
    assert all(len(s.token_ids) <= DECODE_ROWS for s in rows)
    assert sum(len(s.token_ids) for s in rows) == 3 * len(shorts) and len(rows) == 2
    assert draft.prefill_tokens == len(long.all_token_ids)


def _finish(draft, req):
    """``req`` prefilled as the target's step schedules it whole, then finished."""
    draft.prefill([_scheduled(req, req.num_tokens)])
    draft.remove(req.request_id)


def test_a_finished_requests_kv_serves_the_next_prompt_that_starts_alike():
    runner = RecordingRunner(num_blocks=64, block_size=4, budget=64)
    draft = DraftProposer(runner, "draft")
    turn1 = list(range(10, 40))  # 30 tokens
    _finish(draft, Req("t1", turn1))
    assert draft.prefill_tokens == 30 and list(draft.retained) == ["t1"]
    assert len(draft.retained["t1"].block_ids) == 8  # ceil(30 / 4): the blocks past its KV given back
    kept = list(draft.retained["t1"].block_ids)
    turn2 = turn1[:29] + [99] + list(range(500, 510))  # the same first 29 tokens, then others
    runner.steps.clear()
    draft.prefill([_scheduled(Req("t2", turn2), len(turn2))])
    assert runner.steps[0].token_ids == turn2[29:]  # from the first token that differs
    assert runner.steps[0].seqs[0].context_len == len(turn2) and not draft.retained
    assert draft.seqs["t2"].block_ids[:8] == kept  # its blocks (the 8th's last slot overwritten)
    # the same prompt again: all but its last token taken (a proposal step needs that token's logits)
    draft.remove("t2")
    runner.steps.clear()
    assert draft.propose([Req("t3", list(turn2))], [1]) == [[turn2[-1] + 1]]
    assert [s.token_ids for s in runner.steps] == [[turn2[-1]]]
    draft.remove("t3")
    assert len(draft.free_blocks) + sum(len(s.block_ids) for s in draft.retained.values()) == runner.num_blocks


def test_kept_kv_is_given_back_oldest_first():
    runner = RecordingRunner(num_blocks=3 * (RETAINED_MAX + 1), block_size=4)
    draft = DraftProposer(runner, "draft")
    for i in range(RETAINED_MAX + 1):  # one too many: the first given back
        _finish(draft, Req(f"r{i}", [1000 + 10 * i + j for j in range(10)]))  # 3 blocks each
    assert list(draft.retained) == [f"r{i}" for i in range(1, RETAINED_MAX + 1)]
    assert len(draft.free_blocks) == 3
    # a prompt that needs more blocks than are free takes them from the oldest kept requests
    runner.steps.clear()
    draft.prefill([_scheduled(Req("big", list(range(2000, 2020))), 20)])  # 5 blocks
    assert runner.steps and list(draft.retained) == [f"r{i}" for i in range(2, RETAINED_MAX + 1)]
    assert len(draft.free_blocks) == 3 + 3 - 5


def test_a_proposal_the_target_decoded_plainly_is_fed_again():
    """Proposals dropped after the draft made them (a back-off, a grammar): the target decodes plainly the token the
    draft had proposed, which the draft has computed already; the next proposal step still feeds the last token."""
    runner = RecordingRunner()
    draft = DraftProposer(runner, "draft")
    req = Req("a", list(range(10, 20)))
    draft.prefill([_scheduled(req, 10)])
    req.all_token_ids.append(20)
    req.output_token_ids = [20]
    assert draft.propose([req], [3]) == [[21, 22, 23]]  # computes 20, 21, 22
    req.all_token_ids += [21, 22]  # two plain decodes of what it proposed: the draft holds both
    runner.steps.clear()
    assert draft.propose([req], [2]) == [[23, 24]]
    assert [(s.token_ids, s.seqs[0].context_len) for s in runner.steps] == [([22], 13), ([23], 14)]


def test_the_decoder_skips_asking_a_draft_in_back_off():
    """A draft's proposals cost its steps (``free`` False: not the n-gram lookup's drop-after-proposing)."""
    from engine.spec.config import parse_speculative_config
    from engine.spec.decoder import SpeculativeDecoder

    runner = RecordingRunner()
    draft = DraftProposer(runner, "draft")
    dec = SpeculativeDecoder(parse_speculative_config('{"model": "/x", "num_speculative_tokens": 2}'), draft)
    req = Req("a", list(range(10, 20)), num_computed_tokens=9)
    req.params, req.grammar = SimpleNamespace(max_tokens=None), None
    dec.settle("a", 2, 1)  # a pass that accepted nothing: back off
    dec.propose([req], 4096)
    assert req.spec_token_ids == [] and runner.steps == []
