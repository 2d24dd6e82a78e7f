"""Scheduler: token budget, decodes first, chunked prefill, preemption newest-first, abort frees blocks."""

from engine.core.kv_cache import BlockManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.sampling_params import SamplingParams


def mk(rid, n):
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=100))


def commit(out, token=7):
    """Pretend the runner ran the step: advance computed tokens, append a token where one is sampled."""
    for s in out.scheduled:
        samples = s.samples
        s.request.num_computed_tokens += s.num_new_tokens
        if samples:
            s.request.output_token_ids.append(token)


def test_chunked_prefill_respects_budget():
    s = Scheduler(BlockManager(100, 4, enable_prefix_caching=False), 8, max_num_batched_tokens=10)
    r = mk("a", 25)
    s.add(r)
    chunks = []
    while not r.output_token_ids:
        out = s.schedule()
        assert out.num_tokens <= 10
        chunks.append(out.scheduled[0].num_new_tokens)
        commit(out)
    assert chunks == [10, 10, 5]


def test_decodes_scheduled_before_prefills():
    s = Scheduler(BlockManager(100, 4, enable_prefix_caching=False), 8, max_num_batched_tokens=8)
    a = mk("a", 4)
    s.add(a)
    commit(s.schedule())  # a prefilled, now decoding
    b = mk("b", 20)
    s.add(b)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["a", "b"]
    assert out.scheduled[0].num_new_tokens == 1 and out.scheduled[1].num_new_tokens == 7


def test_preemption_newest_first_and_recompute():
    bm = BlockManager(6, 4, enable_prefix_caching=False)
    s = Scheduler(bm, 8, max_num_batched_tokens=64)
    a, b = mk("a", 8), mk("b", 8)  # 2 blocks each
    s.add(a)
    s.add(b)
    commit(s.schedule())
    assert bm.num_free_blocks == 2
    # grow both until the cache runs out: b (newest) must be preempted, a keeps running
    preempted = []
    for _ in range(12):
        out = s.schedule()
        preempted += out.preempted
        commit(out)
    assert preempted and preempted[0] is b
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    for r in list(s.running) + list(s.waiting):
        s.finish(r)
    assert bm.num_free_blocks == 6


def test_abort_frees_blocks_at_once():
    bm = BlockManager(20, 4)
    s = Scheduler(bm, 8, 64)
    r = mk("a", 30)
    s.add(r)
    commit(s.schedule())
    assert bm.num_free_blocks < 20
    s.finish(r)
    assert bm.num_free_blocks == 20 and r.status is RequestStatus.FINISHED and not s.has_unfinished()


def test_max_num_seqs():
    s = Scheduler(BlockManager(100, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(5):
        s.add(mk(str(i), 3))
    out = s.schedule()
    assert len(out.scheduled) == 2 and len(s.waiting) == 3


def test_scheduler_output_is_what_the_runner_reads():
    # ModelRunner names no core type: it reads a step through engine/runner/step.py's protocols, which the
    # scheduler's own objects must satisfy (checked here, as nothing else would check the structural match).
    from engine.runner.step import ScheduledSequence, ScheduledStep, SequenceState

    s = Scheduler(BlockManager(100, 4, enable_prefix_caching=False), 8, max_num_batched_tokens=16)
    r = mk("a", 5)
    s.add(r)
    out = s.schedule()
    assert isinstance(out, ScheduledStep)
    (item,) = out.scheduled
    assert isinstance(item, ScheduledSequence) and item.samples
    assert isinstance(item.request, SequenceState)
    assert item.request.all_token_ids == [1, 2, 3, 4, 5] and item.request.token_at(4) == 5


def test_admitted_request_with_one_token_left_joins_the_decodes():
    """A waiting request whose prefix-cache hit leaves one token is a decode row: it goes before the running
    prefill chunks, the others keep their order."""
    bm = BlockManager(100, 4, enable_prefix_caching=True)
    s = Scheduler(bm, 8, max_num_batched_tokens=24)
    first = mk("first", 9)  # two full blocks of tokens 1..8 go into the prefix cache
    s.add(first)
    commit(s.schedule())
    bm.cache_full_blocks(first)
    s.finish(first)
    long = Request("long", list(range(100, 140)), SamplingParams(max_tokens=100))
    s.add(long)
    commit(s.schedule())  # its first chunk of 24: still prefilling
    hit = mk("hit", 9)  # the same first 8 tokens + one: 8 cached, one to compute
    s.add(hit)
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("hit", 1), ("long", 16)]
    assert hit.num_cached_tokens == 8


def decoding(s, *reqs):
    """Admit and prefill the requests: each then has its first output token and one token left to compute."""
    for r in reqs:
        s.add(r)
    out = s.schedule()
    s.launched(out)
    for x in out.scheduled:
        x.request.output_token_ids.append(7)
    return out


def test_schedule_ahead_plans_a_decode_of_the_token_in_flight():
    """Look-ahead inside the scheduler: every running request that samples in step N decodes N's token in N+1
    (pending=1, one block more where needed); the step launched ahead counts as computed but registers its blocks
    only once N's tokens are on the host (update_from_output)."""
    bm = BlockManager(100, 4, enable_prefix_caching=True)
    s = Scheduler(bm, 8, max_num_batched_tokens=64, max_model_len=64)
    a, b = mk("a", 5), mk("b", 6)
    decoding(s, a, b)
    n = s.schedule()
    s.launched(n)  # step N: a and b at 6 and 7 computed tokens, the tokens N samples not yet on the host
    ahead = s.schedule_ahead([a, b])
    assert ahead is s.ahead and s.num_steps_ahead == 1
    assert [(x.request, x.num_new_tokens, x.pending, x.samples) for x in ahead.scheduled] == [
        (a, 1, 1, True), (b, 1, 1, True)]
    s.launched(ahead)
    assert (a.num_computed_tokens, b.num_computed_tokens) == (7, 8) and len(b.block_ids) == 2
    assert len(b.block_keys) == 1  # the step ahead fills b's second block with N's token, still on the device
    b.output_token_ids.append(9)
    a.output_token_ids.append(9)
    s.update_from_output([a, b])
    assert len(b.block_keys) == 2 and len(a.block_keys) == 1
    s.finish(a)
    assert not s.drop_finished_ahead()  # b still runs in it
    s.finish(b)
    assert s.drop_finished_ahead() and s.ahead is None


def test_schedule_ahead_refuses_what_needs_the_host():
    s = Scheduler(BlockManager(100, 4), 8, max_num_batched_tokens=64, max_model_len=64)
    a, b = mk("a", 5), mk("b", 5)
    decoding(s, a, b)
    assert s.schedule_ahead([]) is None  # N samples nothing
    assert s.schedule_ahead([a, b], pooled=True) is None  # N finished an embedding
    assert s.schedule_ahead([a]) is None  # b does not sample in N
    s.add(mk("w", 5))
    assert s.schedule_ahead([a, b]) is None  # a waiting request has room: the next step admits it
    s.waiting.clear()
    a.grammar = object()
    assert s.schedule_ahead([a, b]) is None  # a grammar takes N's token on the host
    a.grammar = None
    a.params = SamplingParams(max_tokens=2)  # N's token is a's last: a leaves the batch
    assert [x.request for x in s.schedule_ahead([a, b]).scheduled] == [b]
    assert s.num_steps_ahead == 1 and s.ahead is not None
    assert s.schedule_ahead([]) is None and s.ahead is None  # each plan replaces the last


def test_scoring_steps_borrow_blocks_and_give_them_back():
    bm = BlockManager(6, 4, enable_prefix_caching=False)
    s = Scheduler(bm, 8, max_num_batched_tokens=64)
    r = mk("score", 10)
    assert [x.scheduled[0].num_new_tokens for x in s.scoring_steps(r, 4)] == [4, 4, 2]
    assert bm.num_free_blocks == 6 and not s.has_unfinished()
    import pytest
    from engine.errors import KVCacheFullError

    with pytest.raises(KVCacheFullError):
        list(s.scoring_steps(mk("long", 30), 64))
    assert bm.num_free_blocks == 6
