"""The CPU paged decode attention's spans (csrc/cpu/kernels.h): consecutive rows whose block tables agree over their
contexts (a speculative verify pass's k + 1 rows of one request, contexts c .. c + k) share one pass over the cache.
Each row must come out as the torch reference says, and with the same bits as when it is computed alone (a plain
decode row): mixed with plain decode rows, GQA of several head groups, head sizes off the vector width, contexts
across block and partition boundaries, 1 and 2 threads (split-K partitions), batch-invariant mode."""

from __future__ import annotations

import zlib

import pytest
import torch

from engine import ops
from engine.ops import reference as ref

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


@pytest.fixture(params=ops.available_isas())
def isa(request):
    from engine import _C

    _C.force_isa(request.param)
    yield request.param
    _C.force_isa("auto")


@pytest.fixture
def threads():
    from engine import _C

    before = _C.get_num_threads()
    yield ops.set_num_threads
    ops.set_num_threads(before)


def step(seed, dtype, nh, nkv, hd, bs, layout):
    """q, caches, block tables and context lengths of a decode step laid out as ``layout``: ("decode", c) a plain
    row; ("verify", c, k) k + 1 rows of one request with contexts c .. c + k (one block table); ("prefix", c) a row
    of another request whose blocks are the previous row's except its last one (a prefix-cache hit: it must not
    join the previous span)."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((seed, str(dtype), nh, nkv, hd, bs, layout)).encode()))
    ctxs, tables, free = [], [], iter(torch.randperm(256, generator=g).tolist())
    for item in layout:
        if item[0] == "verify":
            c, k = item[1], item[2]
            table = [next(free) for _ in range(-(-(c + k) // bs))]
            ctxs += [c + i for i in range(k + 1)]
            tables += [table] * (k + 1)
        elif item[0] == "prefix":
            c = item[1]
            table = list(tables[-1][:max(0, -(-c // bs) - 1)])
            table += [next(free) for _ in range(-(-c // bs) - len(table))]
            ctxs.append(c)
            tables.append(table)
        else:
            ctxs.append(item[1])
            tables.append([next(free) for _ in range(-(-item[1] // bs))])
    width = max(1, max(len(t) for t in tables))
    nb = 1 + max((b for t in tables for b in t), default=0)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    kc = torch.randn(nb, bs, nkv, hd, generator=g).to(dtype)
    vc = torch.randn(nb, bs, nkv, hd, generator=g).to(dtype)
    q = torch.randn(len(ctxs), nh, hd, generator=g).to(dtype)
    return q, kc, vc, bt, torch.tensor(ctxs, dtype=torch.int32)


CASES = [  # nh, nkv, hd, block_size, layout
    (9, 3, 64, 16, [("verify", 37, 3)]),  # SmolLM2-135M's heads, one verify span alone
    (9, 3, 64, 16, [("decode", 40), ("verify", 47, 3), ("decode", 5), ("verify", 14, 4)]),  # spans across blocks
    (16, 2, 128, 8, [("verify", 63, 4), ("decode", 9)]),  # 8 heads per kv head: a span of 40 slots, 3 pieces
    (2, 1, 36, 32, [("verify", 200, 2), ("verify", 31, 1)]),  # head size off the vector width: the tail paths
    (8, 8, 64, 16, [("verify", 1, 3), ("verify", 16, 2), ("prefix", 19), ("decode", 0)]),  # first context 1,
    # one ending on a block boundary, a prefix-cache neighbour (its own last block) and an empty row
    (4, 1, 128, 16, [("verify", 1500, 3)]),  # few items: split-K partitions on 2 threads
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_span_rows_match_the_reference_and_their_rows_computed_alone(isa, dtype, threads):
    for nh, nkv, hd, bs, layout in CASES:
        q, kc, vc, bt, cl = step("spans", dtype, nh, nkv, hd, bs, layout)
        expected = ref.paged_decode_attention(q, kc, vc, bt, cl, hd**-0.5)
        for n in (1, 2):
            threads(n)
            got = ops.paged_decode_attention(q, kc, vc, bt, cl, hd**-0.5)
            rtol, atol = TOL[dtype]
            torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=f"{layout} threads={n}")
        # one thread: no partitions, so a row alone (a plain decode row) gives the same bits as in its span
        threads(1)
        got = ops.paged_decode_attention(q, kc, vc, bt, cl, hd**-0.5)
        for r in range(len(cl)):
            alone = ops.paged_decode_attention(q[r:r + 1], kc, vc, bt[r:r + 1], cl[r:r + 1], hd**-0.5)
            assert torch.equal(alone[0], got[r]), f"{layout} row {r}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_span_rows_are_batch_invariant(isa, dtype, threads):
    # Contexts across the fixed partition length (512): each row of the spans alone, on 1 and 2 threads, the same
    # bits as the whole step (what --deterministic's plain decode of the same token computes).
    nh, nkv, hd, bs = 9, 3, 64, 16
    layout = [("verify", 509, 4), ("decode", 700), ("verify", 1023, 2), ("verify", 3, 3)]
    q, kc, vc, bt, cl = step("invariant", dtype, nh, nkv, hd, bs, layout)
    ops.set_batch_invariant(True)
    try:
        threads(2)
        full = ops.paged_decode_attention(q, kc, vc, bt, cl, 0.125)
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(full, ref.paged_decode_attention(q, kc, vc, bt, cl, 0.125), rtol=rtol, atol=atol)
        for n in (1, 2):
            threads(n)
            for r in range(len(cl)):
                alone = ops.paged_decode_attention(q[r:r + 1], kc, vc, bt[r:r + 1], cl[r:r + 1], 0.125)
                assert torch.equal(alone[0], full[r]), f"row {r} threads={n}"
    finally:
        ops.set_batch_invariant(False)
