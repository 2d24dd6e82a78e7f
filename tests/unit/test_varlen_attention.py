"""The paged varlen attention kernel (Triton) against its float32 torch reference, on the CPU through Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no GPU; tests/gpu runs the compiled kernel
on random layouts up to 4,096-token chunks): scrambled block tables, prefixes of 0 / a partial block / many
blocks, decodes mixed with prefill chunks, GQA ratios 1 / 4 / 8, head sizes 16-128, fp32 / bf16 / fp16.
The engine with the kernel forced on against the SDPA path: tests/engine/test_varlen_attention_engine.py."""

from __future__ import annotations

import random

import pytest
import torch

from engine.ops import varlen_attention as va
from tests.support.varlen_cases import make_case, run_case

if torch.cuda.is_available():
    pytest.skip("CPU interpreter tests (tests/gpu covers CUDA)", allow_module_level=True)

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_random_paged_layouts(dtype):
    rng = random.Random(1234 + {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype])
    for nh, nkv in ((4, 4), (8, 2), (8, 1)):  # GQA ratios 1, 4, 8
        hd = rng.choice([16, 32, 64])
        seqs = [(1, rng.randrange(1, 40)) for _ in range(rng.randrange(0, 3))] + [(1, 0)]  # decodes first
        for _ in range(rng.randrange(1, 3)):  # prefill chunks: fresh, partial-block and multi-block prefixes
            seqs.append((rng.randrange(2, 48), rng.choice([0, 5, 16, rng.randrange(17, 70)])))
        run_case(rng, nh, nkv, hd, seqs, dtype)


def test_edges():
    rng = random.Random(7)
    run_case(rng, 4, 2, 24, [(9, 0)], torch.float32)  # a head size that is not a power of two
    run_case(rng, 2, 1, 128, [(17, 0), (1, 31)], torch.float32)  # head size 128
    run_case(rng, 4, 2, 32, [(1, 0)], torch.float32)  # one decode, nothing else
    run_case(rng, 4, 2, 32, [(33, 15)], torch.float32)  # a chunk crossing several query tiles
    run_case(rng, 4, 2, 32, [(16, 16), (16, 0)], torch.float32, target="sm89")  # AD102 tiles


@pytest.mark.parametrize("block_size", [16, 32])
def test_tma_tiles(block_size):
    """The TMA path (sm_90: a key tile copied out of one cache block through a tensor descriptor) in the
    interpreter: 16-key tiles in blocks of 16 and 32 (a tile at either half of a block), prefixes of whole and
    partial blocks, decodes beside chunks; NaN in every slot outside the contexts."""
    rng = random.Random(block_size)
    cfg = va.KernelConfig(16, 16, 1, 1, tma=True)
    (_, kc, vc, *_), _ = make_case(rng, 4, 2, 32, [(3, 40)], torch.float32, block_size)
    assert va.tma_descriptors(kc, vc, cfg, 32) is not None
    assert va.tma_descriptors(kc, vc, cfg, 24) is None  # the box must be the whole (power-of-two) head
    assert va.tma_descriptors(kc, vc, va.KernelConfig(16, 64, 1, 1, tma=True), 32) is None  # tile > block
    for dtype in (torch.float32, torch.bfloat16):
        run_case(rng, 4, 2, 32, [(1, 70), (1, 0), (37, 0), (20, 48), (9, 21)], dtype, block_size=block_size,
                 config=cfg)
        run_case(rng, 8, 1, 16, [(50, 33)], dtype, block_size=block_size, config=cfg)


@pytest.mark.parametrize("tma", [False, True])
def test_resume_over_the_prefix(tma):
    """Resuming: out holds each chunk's attention over its own keys (out and log-sum-exp, as cuDNN gives them);
    the kernel adds the cached prefix and merges: prefixes of a partial block, whole blocks and many blocks, several
    query tiles, GQA; NaN in every slot outside the contexts (the chunk's own slots are never read again)."""
    rng = random.Random(11 + tma)
    cfg = va.KernelConfig(16, 16, 1, 1, tma=tma)
    for dtype in (torch.float32, torch.bfloat16):
        run_case(rng, 4, 2, 32, [(37, 5)], dtype, config=cfg, resume=True)
        run_case(rng, 8, 1, 16, [(20, 48)], dtype, config=cfg, resume=True)
        run_case(rng, 4, 4, 32, [(9, 21), (40, 70)], dtype, config=cfg, resume=True)


def test_resume_validation():
    rng = random.Random(5)
    (q, kc, vc, bt, sl, qsl), (_, ctxs, qlens) = make_case(rng, 4, 2, 32, [(5, 3)], torch.float32)
    plan = va.VarlenPlan.build(qlens, ctxs, va.config_for(q.device, 32).block_m, q.device)
    with pytest.raises(ValueError, match="resuming"):
        va.varlen_paged_attention(q, kc, vc, bt, sl, qsl, plan, 0.1, lse=torch.zeros(5, 4))
    with pytest.raises(ValueError, match="resuming"):
        va.varlen_paged_attention(q, kc, vc, bt, sl, qsl, plan, 0.1, out=torch.zeros_like(q),
                                  lse=torch.zeros(4, 5))
    assert va.chunk_self_attention(q, kc[0], vc[0], 0.1) is None  # CPU: no cuDNN, the caller takes the kernel


def test_plan_covers_every_query_row_once_heaviest_first():
    qlens, ctxs = [1, 40, 3, 17], [9, 40, 100, 20]
    plan = va.VarlenPlan.build(qlens, ctxs, 16, torch.device("cpu"))
    tiles = list(zip(plan.tile_seq.tolist(), plan.tile_start.tolist()))
    rows = sorted((s, r) for s, start in tiles for r in range(start, min(qlens[s], start + 16)))
    assert rows == sorted((s, r) for s, n in enumerate(qlens) for r in range(n))
    work = [ctxs[s] - qlens[s] + min(qlens[s], start + 16) for s, start in tiles]
    assert work == sorted(work, reverse=True)


def test_validation_errors():
    rng = random.Random(3)
    (q, kc, vc, bt, sl, qsl), (_, ctxs, qlens) = make_case(rng, 4, 2, 32, [(5, 3)], torch.float32)
    plan = va.VarlenPlan.build(qlens, ctxs, va.config_for(q.device, 32).block_m, q.device)
    with pytest.raises(ValueError, match="int32"):
        va.varlen_paged_attention(q, kc, vc, bt.long(), sl, qsl, plan, 0.1)
    with pytest.raises(ValueError, match="KV heads"):
        va.varlen_paged_attention(q[:, :3], kc, vc, bt, sl, qsl, plan, 0.1)
    with pytest.raises(ValueError, match="BLOCK_M"):
        va.varlen_paged_attention(q, kc, vc, bt, sl, qsl, va.VarlenPlan.build(qlens, ctxs, 999, q.device), 0.1)


def test_flops_counts_causal_pairs():
    assert va.flops([4], [4], 1, 1) == 4 * (4 * 5 // 2)
    assert va.flops([2], [10], 2, 8) == 4 * (2 * 8 + 3) * 2 * 8


def test_start_up_runs_each_kernel_variant_once(monkeypatch):
    """Attention.warm_up_kernels' launches (the interpreter here: one configuration, so one variant plus the merge
    over a cached prefix), and the merge recorded as built so later steps trust it; off CUDA the start-up builds
    nothing (the CPU engine never takes the Triton kernel)."""
    from engine.layers import attention

    monkeypatch.setattr(attention, "_RESUME_COMPILES", {})
    layer = attention.Attention(8, 2, 128, 0)
    assert layer.warm_up_kernels() == []  # no caches yet
    layer.k_cache = torch.randn(3, 16, 2, 128).to(torch.bfloat16)
    layer.v_cache = torch.randn(3, 16, 2, 128).to(torch.bfloat16)
    assert layer.warm_up_kernels() == []  # CPU caches
    assert layer._run_kernel_variants() == ["long tiles", "merge over a cached prefix"]
    assert list(attention._RESUME_COMPILES.values()) == [True]
    assert layer._run_kernel_variants() == ["long tiles"]  # the merge is known to build: not run again


def test_tma_descriptors_leave_with_their_caches():
    """The descriptors (each holds its cache tensor) are remembered only in the caller's memo: once the caches
    and the memo's owner are gone, so is their memory (a module-level registry once kept half of every unloaded
    engine's KV cache allocated). The memo keeps one set of caches: new caches replace the old ones' entries."""
    import gc
    import weakref

    cfg = va.KernelConfig(16, 16, 1, 1, tma=True)
    kc, vc = torch.zeros(4, 16, 2, 32), torch.zeros(4, 16, 2, 32)
    alive = [weakref.ref(kc), weakref.ref(vc)]
    assert va.tma_descriptors(kc, vc, cfg, 32) is not None
    memo: dict = {}
    first = va.tma_descriptors(kc, vc, cfg, 32, memo)
    assert first is not None and va.tma_descriptors(kc, vc, cfg, 32, memo) is first
    k2, v2 = torch.zeros(4, 16, 2, 32), torch.zeros(4, 16, 2, 32)
    assert va.tma_descriptors(k2, v2, cfg, 32, memo) is not None and len(memo) == 1  # the first caches' dropped
    del kc, vc, first
    gc.collect()
    assert [r() is None for r in alive] == [True, True]
    alive2 = [weakref.ref(k2), weakref.ref(v2)]
    del k2, v2, memo
    gc.collect()
    assert [r() is None for r in alive2] == [True, True]
