"""Block manager and prefix cache: allocation, true-prefix matching, LRU eviction, frees."""

from engine.core.kv_cache import BlockManager
from engine.core.request import Request
from engine.sampling_params import SamplingParams


def req(rid, tokens):
    return Request(rid, list(tokens), SamplingParams())


def run_prefill(bm, r):
    hits = bm.match_prefix(r)
    n = r.num_tokens - r.num_computed_tokens - len(hits) * bm.block_size
    assert bm.allocate(r, n, hits)
    r.num_computed_tokens += n
    bm.cache_full_blocks(r)
    return len(hits)


def test_allocate_and_free_counts():
    bm = BlockManager(10, 4)
    r = req("a", range(9))  # 3 blocks
    assert bm.allocate(r, 9)
    assert len(r.block_ids) == 3 and bm.num_free_blocks == 7
    assert not bm.allocate(req("b", range(40)), 40)  # needs 10 blocks: refused, nothing changed
    assert bm.num_free_blocks == 7
    bm.free_request(r)
    assert bm.num_free_blocks == 10 and r.block_ids == []


def test_prefix_hit_only_for_true_prefix():
    bm = BlockManager(32, 4)
    a = req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    run_prefill(bm, a)
    # same first block, different second block: only one block may match
    b = req("b", [1, 2, 3, 4, 5, 6, 0, 8, 9, 10])
    assert len(bm.match_prefix(b)) == 1
    # same second block tokens at the same index but a different first block: no match at all
    c = req("c", [0, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert bm.match_prefix(c) == []
    # a full match stops one token short so something is left to compute
    d = req("d", [1, 2, 3, 4, 5, 6, 7, 8])
    assert len(bm.match_prefix(d)) == 1
    e = req("e", [1, 2, 3, 4, 5, 6, 7, 8, 99])
    assert bm.match_prefix(e) == a.block_ids[:2]


def test_hit_shares_blocks_and_counts_cached_tokens():
    bm = BlockManager(32, 4)
    a = req("a", range(12))
    run_prefill(bm, a)
    b = req("b", list(range(8)) + [50, 51, 52])
    assert run_prefill(bm, b) == 2
    assert b.block_ids[:2] == a.block_ids[:2] and b.num_cached_tokens == 8
    assert bm.blocks[a.block_ids[0]].ref_count == 2
    bm.free_request(a)
    bm.free_request(b)
    assert bm.num_free_blocks == 32


def test_freed_cached_blocks_survive_until_evicted_lru():
    bm = BlockManager(6, 4)
    a = req("a", range(9))  # blocks: 2 full + 1 partial
    run_prefill(bm, a)
    bm.free_request(a)
    assert bm.num_free_blocks == 6
    b = req("b", range(9))
    assert run_prefill(bm, b) == 2  # still cached after free
    bm.free_request(b)
    # fill the whole cache with unrelated content: the cached blocks get evicted
    c = req("c", range(100, 124))
    assert run_prefill(bm, c) == 0
    bm.free_request(c)
    d = req("d", range(9))
    assert bm.match_prefix(d) == []


def test_eviction_takes_least_recently_used_first():
    bm = BlockManager(8, 4)
    old = req("old", list(range(8)) + [0])
    run_prefill(bm, old)
    bm.free_request(old)
    new = req("new", list(range(50, 58)) + [0])
    run_prefill(bm, new)
    bm.free_request(new)
    # need 3 fresh blocks: the unkeyed ones go first, then the oldest cached tail
    x = req("x", range(200, 212))
    run_prefill(bm, x)
    assert len(bm.match_prefix(req("n2", list(range(50, 58)) + [1]))) == 2
    bm.free_request(x)
