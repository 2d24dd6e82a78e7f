"""A verify step as the runner's inputs (engine/runner/inputs.py prepare_step, the one place that says which rows
get logits): the request's last token and its proposals, one decode span per row (each its own context, so the
paged decode kernel, the decode tapes and the CUDA graphs take them), a logit row for each, beside a plain decode
and a prefill chunk; and the scheduler's side: the k+1 tokens planned, cut by the token budget, dropped when the
blocks run out, and settled back to the accepted tokens."""

from __future__ import annotations

from engine.core.kv_cache import BlockManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from engine.runner.inputs import prepare_step
from engine.sampling_params import SamplingParams


def _running(rid, prompt, out=(), computed=None):
    r = Request(rid, list(prompt), SamplingParams())
    r.output_token_ids = list(out)
    r.num_computed_tokens = r.num_tokens - 1 if computed is None else computed
    r.block_ids = list(range(10 * int(rid[-1]), 10 * int(rid[-1]) + 4))
    r.status = RequestStatus.RUNNING
    return r


def test_verify_rows_are_decode_rows_with_logits():
    spec_req = _running("r1", [5, 6, 7, 8], out=[9])
    plain = _running("r2", [1, 2, 3])
    chunk = _running("r3", [4, 4, 4, 4, 4, 4], computed=2)
    sched = SchedulerOutput([ScheduledRequest(plain, 1), ScheduledRequest(spec_req, 3, spec=[11, 12]),
                             ScheduledRequest(chunk, 4)])
    inp, reqs, _ = prepare_step(sched, block_size=4)
    assert inp.token_ids == [3, 9, 11, 12, 4, 4, 4, 4]
    assert [(s.query_start, s.query_len, s.context_len) for s in inp.seqs] == [
        (0, 1, 3), (1, 1, 5), (2, 1, 6), (3, 1, 7), (4, 4, 6)]
    assert inp.logit_rows == [0, 1, 2, 3, 7] and reqs == [plain, spec_req, chunk]
    assert inp.drafts == [(), [11, 12], ()]
    plain_only, _, _ = prepare_step(SchedulerOutput([ScheduledRequest(plain, 1)]), block_size=4)
    assert plain_only.drafts == []  # no verify: the plain path


def test_scheduler_plans_verifies_within_budget_and_blocks():
    blocks = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True)
    s = Scheduler(blocks, max_num_seqs=4, max_num_batched_tokens=3)
    r = Request("a", [1, 2, 3], SamplingParams())
    s.add(r)
    first = s.schedule()
    s.launched(first)
    r.output_token_ids.append(4)
    r.spec_token_ids = [5, 6, 7]  # 4 tokens with its last: the budget of 3 keeps two proposals
    out = s.schedule()
    assert [(x.num_new_tokens, list(x.spec), x.samples) for x in out.scheduled] == [(3, [5, 6], True)]
    s.launched(out)
    assert r.num_computed_tokens == 6
    r.output_token_ids += [5, 8]  # the first proposal accepted, a correction after it
    s.settle_speculative(out.scheduled[0], emitted=2)
    assert r.num_computed_tokens == 5 == r.num_tokens - 1  # the rejected proposal's slot is not computed
    assert len(r.block_keys) == 1 and blocks.blocks[r.block_ids[0]].tokens == (1, 2, 3, 4)  # accepted only


def test_no_room_for_proposals_is_a_plain_decode():
    blocks = BlockManager(num_blocks=1, block_size=4, enable_prefix_caching=False)
    s = Scheduler(blocks, max_num_seqs=4, max_num_batched_tokens=16)
    r = Request("a", [1, 2], SamplingParams())
    s.add(r)
    s.launched(s.schedule())
    r.output_token_ids.append(3)
    r.spec_token_ids = [4, 5, 6]  # would need a second block
    out = s.schedule()
    assert [(x.num_new_tokens, list(x.spec)) for x in out.scheduled] == [(1, [])] and not out.preempted
