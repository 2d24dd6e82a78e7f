"""Random paged layouts for the varlen attention kernel and the check against its float32 reference (shared by
tests/unit, through Triton's interpreter, and tests/gpu)."""

from __future__ import annotations

import itertools
import random

import torch

from engine.ops import varlen_attention as va

BOUNDS = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def make_case(rng: random.Random, nh: int, nkv: int, hd: int, seqs: list[tuple[int, int]], dtype,
              block_size: int = 16, device="cpu"):
    """seqs: (query_len, prefix_len) per sequence. Returns the kernel's inputs and the reference's. Every cache
    slot outside the sequences' contexts holds NaN: a kernel that reads one (unmasked) poisons its output."""
    ctxs = [q + p for q, p in seqs]
    qlens = [q for q, _ in seqs]
    need = sum(-(-c // block_size) for c in ctxs)
    num_blocks = need + 5
    perm = list(range(num_blocks))
    rng.shuffle(perm)  # scrambled: a sequence's blocks are anywhere in the cache, in any order
    tables, i = [], 0
    for c in ctxs:
        nb = -(-c // block_size)
        tables.append(perm[i:i + nb])
        i += nb
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    kc = torch.randn(num_blocks, block_size, nkv, hd, generator=g).to(dtype).to(device)
    vc = torch.randn(num_blocks, block_size, nkv, hd, generator=g).to(dtype).to(device)
    used = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for t, c in zip(tables, ctxs):
        pos = torch.arange(c)
        used[torch.tensor(t, dtype=torch.long)[pos // block_size] * block_size + pos % block_size] = True
    for c in (kc, vc):
        c.view(num_blocks * block_size, nkv, hd)[~used.to(device)] = float("nan")
    T = sum(qlens)
    q = torch.randn(T, nh, hd, generator=g).to(dtype).to(device)
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    sl = torch.tensor(ctxs, dtype=torch.int32, device=device)
    qsl = torch.tensor([0, *itertools.accumulate(qlens)], dtype=torch.int32, device=device)
    return (q, kc, vc, bt, sl, qsl), (tables, ctxs, qlens)


def chunk_state(q, kc, vc, tables, ctxs, qlens, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's queries attending to its own chunk only (causal), in float32: (out [T, nh, hd], lse [T, nh]
    natural log), the state the kernel merges with the cached prefix (chunk_self_attention's result)."""
    T, nh, hd = q.shape
    out = torch.empty(T, nh, hd, dtype=torch.float32, device=q.device)
    lse = torch.empty(T, nh, dtype=torch.float32, device=q.device)
    group = torch.arange(nh, device=q.device) // (nh // kc.shape[2])
    q0 = 0
    for blocks, ctx, n in zip(tables, ctxs, qlens):
        idx = torch.tensor(blocks, dtype=torch.long, device=q.device)
        k = kc[idx].flatten(0, 1)[ctx - n:ctx].float()[:, group]  # [n, nh, hd]
        v = vc[idx].flatten(0, 1)[ctx - n:ctx].float()[:, group]
        s = torch.einsum("qhd,khd->hqk", q[q0:q0 + n].float(), k) * scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse[q0:q0 + n] = torch.logsumexp(s, dim=-1).transpose(0, 1)
        out[q0:q0 + n] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)
        q0 += n
    return out, lse


def run_case(rng, nh, nkv, hd, seqs, dtype, target=None, device="cpu", block_size: int = 16,
             config: va.KernelConfig | None = None, resume: bool = False):
    """resume: out holds each chunk's attention over its own keys (chunk_state, as cuDNN gives it: lse
    head-major) and the kernel adds the cached prefix, merging by log-sum-exp."""
    (q, kc, vc, bt, sl, qsl), (tables, ctxs, qlens) = make_case(rng, nh, nkv, hd, seqs, dtype, block_size, device)
    if target and target.endswith("_short"):  # the configuration of steps with decodes or short chunks
        cfg = va.config_for(q.device, hd, target.removesuffix("_short"), short=True)
    else:
        cfg = config or va.config_for(q.device, hd, target)
    plan = va.VarlenPlan.build(qlens, ctxs, cfg.block_m, q.device)
    lse = None
    if resume:
        start, lse = chunk_state(q, kc, vc, tables, ctxs, qlens, hd ** -0.5)
        out = start.to(dtype)
        lse = lse.t().contiguous().t()  # [T, nh] with the heads' rows apart, as cuDNN lays it out
    else:
        out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
    va.varlen_paged_attention(q, kc, vc, bt, sl, qsl, plan, hd ** -0.5, out=out, config=cfg, lse=lse)
    ref = va.reference(q, kc, vc, tables, ctxs, qlens, hd ** -0.5)
    assert not out.isnan().any()
    err = (out.float() - ref).abs().max().item()
    assert err <= BOUNDS[dtype], (nh, nkv, hd, seqs, dtype, err)
    return err


def run_fp8_case(rng, nh, nkv, hd, seqs, dtype, target=None, device="cpu", block_size: int = 16,
                 config: va.KernelConfig | None = None, resume: bool = False, k_scale: float = 0.05,
                 v_scale: float = 0.02):
    """run_case with fp8 e4m3 caches (--kv-cache-dtype fp8): the random keys and values stored as the cache-write
    ops store them (reference.to_cache: x / scale, saturated; the NaN outside the contexts stays NaN), the kernel
    against the float32 reference over the same stored values times the scales. Returns the largest error."""
    from engine.ops.reference import to_cache

    (q, kc, vc, bt, sl, qsl), (tables, ctxs, qlens) = make_case(rng, nh, nkv, hd, seqs, dtype, block_size, device)
    ks = torch.tensor([k_scale], dtype=torch.float32, device=device)
    vs = torch.tensor([v_scale], dtype=torch.float32, device=device)
    kc8, vc8 = to_cache(kc, torch.float8_e4m3fn, ks), to_cache(vc, torch.float8_e4m3fn, vs)
    if target and target.endswith("_short"):
        cfg = va.config_for(q.device, hd, target.removesuffix("_short"), short=True)
    else:
        cfg = config or va.config_for(q.device, hd, target)
    plan = va.VarlenPlan.build(qlens, ctxs, cfg.block_m, q.device)
    lse = None
    if resume:  # the chunk's own state from the dequantized cache, as the engine's cuDNN call would give it
        kd = torch.where(kc8.float().isnan(), kc8.float(), kc8.float() * k_scale).to(dtype)
        vd = torch.where(vc8.float().isnan(), vc8.float(), vc8.float() * v_scale).to(dtype)
        start, lse = chunk_state(q, kd, vd, tables, ctxs, qlens, hd ** -0.5)
        out = start.to(dtype)
        lse = lse.t().contiguous().t()
    else:
        out = torch.full_like(q, float("nan"))
    va.varlen_paged_attention(q, kc8, vc8, bt, sl, qsl, plan, hd ** -0.5, out=out, config=cfg, lse=lse,
                              k_scale=ks, v_scale=vs)
    ref = va.reference(q, kc8, vc8, tables, ctxs, qlens, hd ** -0.5, ks, vs)
    assert not out.isnan().any()
    err = (out.float() - ref).abs().max().item()
    assert err <= max(BOUNDS[dtype], 1e-4), (nh, nkv, hd, seqs, dtype, err)
    return err


def step_layout(rng: random.Random, seqs: list[tuple[int, int]], block_size: int, device="cpu"):
    """A step's int32 metadata for ops.token_positions_and_slots (query starts, context lengths, a block table of
    scrambled blocks, wider than needed) and the positions and slots it must give, worked out token by token."""
    ctxs = [q + p for q, p in seqs]
    blocks = list(range(sum(-(-c // block_size) for c in ctxs) + 3))
    rng.shuffle(blocks)
    width = max(-(-c // block_size) for c in ctxs) + 2
    tables, positions, slots, i = [], [], [], 0
    for (q, p), c in zip(seqs, ctxs):
        nb = -(-c // block_size)
        row = blocks[i:i + nb]
        i += nb
        tables.append(row + [rng.randrange(1000, 2000) for _ in range(width - nb)])  # junk past the context
        for pos in range(p, c):
            positions.append(pos)
            slots.append(row[pos // block_size] * block_size + pos % block_size)
    qsl = torch.tensor([0, *itertools.accumulate(q for q, _ in seqs)], dtype=torch.int32, device=device)
    sl = torch.tensor(ctxs, dtype=torch.int32, device=device)
    bt = torch.tensor(tables, dtype=torch.int32, device=device)
    return (qsl, sl, bt), (positions, slots)


STEP_LAYOUTS = [  # (query_len, prefix_len) per sequence: decodes, fresh prompts, chunks on cached prefixes
    [(1, 0)], [(1, 37)], [(5, 0)], [(1, 3), (1, 16), (1, 100), (17, 0), (300, 45)], [(4096, 0)],
    [(1, 15), (33, 16), (2, 4095), (64, 64)], [(512, 0)] * 9,
]
