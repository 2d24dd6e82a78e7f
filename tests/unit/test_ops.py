"""engine.ops native CPU kernels against their pure-torch references (engine/ops/reference.py).

Every kernel x dtype x ISA level this CPU has (forced through engine._C.force_isa), on fresh random
inputs from a seeded generator, with outputs poisoned (NaN) before the call so a skipped element cannot
pass. Bounds per dtype: the kernels compute in fp32 and round where the references round, so they
differ from them only by fp32 reassociation and, rarely, one rounding step of the dtype.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import zlib

import pytest
import torch

from engine import ops
from engine.ops import native
from engine.ops import reference as ref
from tests.support.varlen_cases import STEP_LAYOUTS, step_layout

pytestmark = pytest.mark.timeout(300)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (rtol, atol)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
ISAS = ops.available_isas()


def test_native_module_is_built():
    assert ops.native_available(), "engine._C is missing: build it with `pip install --no-build-isolation -e .`"
    assert ops.cpu_isa() in ("scalar", "avx2", "avx512", "avx512bf16")
    assert "scalar" in ISAS


@pytest.fixture(params=ISAS)
def isa(request):
    from engine import _C

    _C.force_isa(request.param)
    assert ops.cpu_isa() == request.param
    yield request.param
    _C.force_isa("auto")


@pytest.fixture
def threads():
    """Run with the given thread count, then restore."""
    from engine import _C

    before = _C.get_num_threads()
    yield ops.set_num_threads
    ops.set_num_threads(before)


def gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randn(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def close(actual, expected, dtype, msg=""):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=False, msg=msg or None)


# ---------------------------------------------------------------------------------------------------
# RMSNorm


NORM_SHAPES = [(1, 576), (1, 1), (7, 77), (3, 15), (33, 1000), (96, 2048)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(isa, dtype):
    for T, H in NORM_SHAPES:
        g = gen("rms", isa, str(dtype), T, H)
        x, w = randn(g, T, H, dtype=dtype, scale=3.0), randn(g, H, dtype=dtype)
        out = poisoned((T, H), dtype)
        got = ops.rms_norm(x, w, 1e-6, out=out)
        assert got is out
        close(out, ref.rms_norm(x, w, 1e-6), dtype, f"T={T} H={H}")
        close(ops.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), dtype)


def test_rms_norm_strided_rows_and_default_out():
    g = gen("rms-strided")
    for dtype in DTYPES:
        base = randn(g, 5, 300, dtype=dtype)
        x = base[:, 10:210]  # row stride 300
        w = randn(g, 200, dtype=dtype)
        out_base = poisoned((5, 400), dtype)
        out = out_base[:, :200]
        ops.rms_norm(x, w, 1e-5, out=out)
        close(out, ref.rms_norm(x, w, 1e-5), dtype)
        assert torch.isnan(out_base[:, 200:]).all(), "rms_norm wrote outside its output rows"
        close(ops.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm(isa, dtype):
    for T, H in NORM_SHAPES:
        g = gen("fused", isa, str(dtype), T, H)
        x, r, w = randn(g, T, H, dtype=dtype), randn(g, T, H, dtype=dtype, scale=4.0), randn(g, H, dtype=dtype)
        x_ref, r_ref = x.clone(), r.clone()
        ref.fused_add_rms_norm(x_ref, r_ref, w, 1e-6)
        assert ops.fused_add_rms_norm(x, r, w, 1e-6) is None
        close(r, r_ref, dtype, f"residual T={T} H={H}")
        close(x, x_ref, dtype, f"x T={T} H={H}")


def test_fused_add_rms_norm_rounds_the_sum_before_normalising():
    # Statistics must come from the residual as stored in the dtype: exact equality with the reference
    # (which rounds first) at bf16, where rounding the sum changes the variance visibly.
    g = gen("fused-round")
    T, H = 4, 64
    x = randn(g, T, H, dtype=torch.bfloat16) * 100
    r = randn(g, T, H, dtype=torch.bfloat16) * 0.01
    x_ref, r_ref = x.clone(), r.clone()
    ref.fused_add_rms_norm(x_ref, r_ref, torch.ones(H, dtype=torch.bfloat16), 1e-6)
    ops.fused_add_rms_norm(x, r, torch.ones(H, dtype=torch.bfloat16), 1e-6)
    assert torch.equal(r, r_ref)
    close(x, x_ref, torch.bfloat16)


def test_norm_parallel_rows_match_serial(threads):
    # Enough rows to cross the threading threshold: 2 threads must give exactly the 1-thread result.
    g = gen("norm-threads")
    x, r, w = randn(g, 256, 4096), randn(g, 256, 4096), randn(g, 4096)
    threads(1)
    a = ops.rms_norm(x, w, 1e-6)
    x1, r1 = x.clone(), r.clone()
    ops.fused_add_rms_norm(x1, r1, w, 1e-6)
    threads(2)
    b = ops.rms_norm(x, w, 1e-6)
    x2, r2 = x.clone(), r.clone()
    ops.fused_add_rms_norm(x2, r2, w, 1e-6)
    assert torch.equal(a, b) and torch.equal(x1, x2) and torch.equal(r1, r2)


# ---------------------------------------------------------------------------------------------------
# SiLU and mul


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(isa, dtype):
    for T, I in [(1, 1536), (1, 1), (5, 37), (17, 100), (64, 2048)]:
        g = gen("silu", isa, str(dtype), T, I)
        x = randn(g, T, 2 * I, dtype=dtype, scale=4.0)
        out = poisoned((T, I), dtype)
        ops.silu_and_mul(x, out=out)
        close(out, ref.silu_and_mul(x), dtype, f"T={T} I={I}")
    # extremes: exp must neither overflow into NaN nor lose the sign
    x = torch.tensor([[-200.0, -88.0, -20.0, 0.0, 20.0, 88.0, 200.0, 1e-8] + [1.5] * 8], dtype=dtype)
    close(ops.silu_and_mul(x), ref.silu_and_mul(x), dtype)


def test_silu_and_mul_strided_input():
    g = gen("silu-strided")
    for dtype in DTYPES:
        base = randn(g, 6, 500, dtype=dtype)
        x = base[:, 3:203]
        close(ops.silu_and_mul(x), ref.silu_and_mul(x), dtype)


# ---------------------------------------------------------------------------------------------------
# Rotary embedding


def _cos_sin_cache(max_pos: int, rot_dim: int, theta: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


ROPE_CASES = [  # T, nh, nkv, hd, rot_dim
    (1, 9, 3, 64, 64),
    (13, 8, 8, 128, 128),
    (5, 12, 3, 64, 32),  # partial rotary
    (3, 4, 1, 80, 80),  # not a multiple of 16 lanes per half
    (2, 2, 2, 72, 24),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding(isa, dtype, is_neox):
    for T, nh, nkv, hd, rot in ROPE_CASES:
        g = gen("rope", isa, str(dtype), is_neox, T, nh, hd, rot)
        # q and k as row-strided views of a fused qkv output
        qkv = randn(g, T, (nh + 2 * nkv) * hd, dtype=dtype, scale=2.0)
        q, k = qkv[:, : nh * hd], qkv[:, nh * hd : (nh + nkv) * hd]
        cache = _cos_sin_cache(4096, rot)
        pos = torch.randint(0, 4096, (T,), generator=g)
        q_ref, k_ref = q.clone(), k.clone()
        ref.rotary_embedding(pos, q_ref, k_ref, hd, cache, is_neox)
        v_before = qkv[:, (nh + nkv) * hd :].clone()
        ops.rotary_embedding(pos, q, k, hd, cache, is_neox)
        close(q, q_ref, dtype, f"q {T, nh, nkv, hd, rot}")
        close(k, k_ref, dtype, f"k {T, nh, nkv, hd, rot}")
        assert torch.equal(qkv[:, (nh + nkv) * hd :], v_before), "rotary_embedding touched v"
        if rot < hd:  # dims past rot_dim pass through untouched
            assert torch.equal(q.view(T, nh, hd)[..., rot:], q_ref.view(T, nh, hd)[..., rot:])


def test_rotary_embedding_llama3_scaled_cache_matches_hf_formula():
    # The kernel only reads the cache; with a llama3-scaled cache it must equal HF's q*cos + rotate_half(q)*sin.
    g = gen("rope-llama3")
    T, nh, nkv, hd = 6, 4, 2, 64
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    wavelen = 2 * math.pi / inv_freq
    inv_freq = torch.where(wavelen > 8192 / 1.0, inv_freq / 8.0, inv_freq)  # crude llama3-like scaling
    freqs = torch.outer(torch.arange(2048, dtype=torch.float32), inv_freq)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    pos = torch.randint(0, 2048, (T,), generator=g)
    q, k = randn(g, T, nh * hd), randn(g, T, nkv * hd)
    emb = torch.cat([freqs[pos], freqs[pos]], dim=-1)[:, None, :]

    def rotate_half(x):
        return torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], dim=-1)

    q_hf = q.view(T, nh, hd) * emb.cos() + rotate_half(q.view(T, nh, hd)) * emb.sin()
    ops.rotary_embedding(pos, q, k, hd, cache, True)
    torch.testing.assert_close(q.view(T, nh, hd), q_hf, rtol=1e-5, atol=1e-5)


def test_rotary_and_cache_is_the_two_ops(isa):
    """On the CPU, rotary_and_cache runs rotary_embedding then reshape_and_cache (the fused CUDA kernel is checked
    in tests/gpu/test_cuda_ops.py): the same q, k and caches as the reference ops."""
    T, nh, nkv, hd, bs, nb = 5, 8, 2, 64, 16, 2
    g = gen("rope_cache", isa)
    qkv = randn(g, T, (nh + 2 * nkv) * hd, dtype=torch.bfloat16, scale=2.0)
    cache = _cos_sin_cache(4096, hd)
    pos = torch.randint(0, 4096, (T,), generator=g)
    slots = torch.tensor([3, -1, 17, 0, 30])
    want = qkv.clone()
    kc_ref, vc_ref = poisoned((nb, bs, nkv, hd), torch.bfloat16), poisoned((nb, bs, nkv, hd), torch.bfloat16)
    kc, vc = kc_ref.clone(), vc_ref.clone()
    q, k, v = want.split([nh * hd, nkv * hd, nkv * hd], dim=1)
    ref.rotary_embedding(pos, q, k, hd, cache, True)
    ref.reshape_and_cache(k.view(T, nkv, hd), v.view(T, nkv, hd), kc_ref, vc_ref, slots)
    q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=1)
    ops.rotary_and_cache(pos, q, k, v, kc, vc, slots, hd, cache, True)
    close(qkv, want, torch.bfloat16)
    close(kc.nan_to_num(), kc_ref.nan_to_num(), torch.bfloat16)
    close(vc.nan_to_num(), vc_ref.nan_to_num(), torch.bfloat16)
    assert torch.equal(kc.isnan(), kc_ref.isnan())
    with pytest.raises(ValueError):
        ops.rotary_and_cache(pos, q, k, v, kc, vc, slots[:3], hd, cache, True)


# ---------------------------------------------------------------------------------------------------
# reshape_and_cache


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(isa, dtype):
    for T, nkv, hd, bs, nb in [(1, 3, 64, 16, 4), (19, 1, 128, 16, 8), (40, 4, 64, 8, 16), (7, 2, 80, 5, 9)]:
        g = gen("cache", isa, str(dtype), T, nkv, hd)
        nh = 2 * nkv
        qkv = randn(g, T, (nh + 2 * nkv) * hd, dtype=dtype)
        key = qkv[:, nh * hd : (nh + nkv) * hd].view(T, nkv, hd)  # strided views
        value = qkv[:, (nh + nkv) * hd :].view(T, nkv, hd)
        slots = torch.randperm(nb * bs, generator=g)[:T]
        slots[torch.rand(T, generator=g) < 0.3] = -1  # padding tokens: skipped
        kc, vc = poisoned((nb, bs, nkv, hd), dtype), poisoned((nb, bs, nkv, hd), dtype)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        ref.reshape_and_cache(key, value, kc_ref, vc_ref, slots)
        ops.reshape_and_cache(key, value, kc, vc, slots)
        assert torch.equal(kc.isnan(), kc_ref.isnan()) and torch.equal(vc.isnan(), vc_ref.isnan())
        assert torch.equal(kc.nan_to_num(), kc_ref.nan_to_num()) and torch.equal(vc.nan_to_num(), vc_ref.nan_to_num())
        written = kc.view(-1, nkv, hd)[slots[slots >= 0]]
        assert torch.equal(written, key[slots >= 0])


def test_reshape_and_cache_non_contiguous_heads():
    # heads not adjacent in memory (key [T, nkv, hd] permuted view): per-head copies
    g = gen("cache-heads")
    T, nkv, hd = 6, 3, 64
    key = randn(g, nkv, T, hd).transpose(0, 1)
    value = randn(g, nkv, T, hd).transpose(0, 1)
    kc, vc = poisoned((4, 4, nkv, hd), torch.float32), poisoned((4, 4, nkv, hd), torch.float32)
    slots = torch.tensor([0, 5, -1, 9, 15, 2])
    ops.reshape_and_cache(key, value, kc, vc, slots)
    keep = slots >= 0
    assert torch.equal(kc.view(-1, nkv, hd)[slots[keep]], key[keep])
    assert torch.equal(vc.view(-1, nkv, hd)[slots[keep]], value[keep])


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_token_positions_and_slots(block_size):
    rng = random.Random(block_size)
    for seqs in STEP_LAYOUTS:
        (qsl, sl, bt), (positions, slots) = step_layout(rng, seqs, block_size)
        T, longest = len(positions), max(q for q, _ in seqs)
        got = ops.token_positions_and_slots(qsl, sl, bt, block_size, T, longest)
        assert [t.tolist() for t in got] == [positions, slots]
        assert [t.tolist() for t in ref.token_positions_and_slots(qsl, sl, bt, block_size)] == [positions, slots]


def test_token_positions_and_slots_rejects_a_context_past_its_table():
    (qsl, sl, bt), (positions, _) = step_layout(random.Random(0), [(3, 40)], 16)
    with pytest.raises(ValueError, match="past its block table"):
        ops.token_positions_and_slots(qsl, sl, bt[:, :2], 16, len(positions), 3)
    with pytest.raises(ValueError, match="more query tokens than context"):
        ops.token_positions_and_slots(qsl, sl - 41, bt, 16, len(positions), 3)
    with pytest.raises(ValueError, match="int32"):
        ops.token_positions_and_slots(qsl.long(), sl, bt, 16, len(positions), 3)


# ---------------------------------------------------------------------------------------------------
# Paged decode attention


def _attention_inputs(g, dtype, B, nh, nkv, hd, bs, ctx_lens, extra_blocks=3):
    max_blocks = max(1, max((c + bs - 1) // bs for c in ctx_lens))
    nb = B * max_blocks + extra_blocks
    kc, vc = randn(g, nb, bs, nkv, hd, dtype=dtype), randn(g, nb, bs, nkv, hd, dtype=dtype)
    bt = torch.randperm(nb, generator=g)[: B * max_blocks].view(B, max_blocks).to(torch.int32)
    cl = torch.tensor(ctx_lens, dtype=torch.int32)
    q = randn(g, B, nh, hd, dtype=dtype)
    return q, kc, vc, bt, cl


ATTN_CASES = [  # B, nh, nkv, hd, block_size, context lengths
    (1, 9, 3, 64, 16, [37]),  # GQA 3 (SmolLM2-135M)
    (3, 8, 8, 128, 16, [1, 16, 17]),  # MHA, contexts on and across a block boundary
    (2, 16, 4, 64, 16, [100, 33]),  # GQA 4
    (2, 16, 2, 128, 8, [65, 9]),  # GQA 8: two head groups per kv head
    (2, 5, 1, 80, 16, [31, 0]),  # head_dim 80, a sequence with no context -> zeros
    (1, 2, 1, 36, 32, [200]),  # head_dim not a multiple of the vector width: tail paths
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention(isa, dtype):
    for B, nh, nkv, hd, bs, ctx in ATTN_CASES:
        g = gen("attn", isa, str(dtype), B, nh, nkv, hd, bs, tuple(ctx))
        q, kc, vc, bt, cl = _attention_inputs(g, dtype, B, nh, nkv, hd, bs, ctx)
        scale = hd**-0.5
        out = poisoned((B, nh, hd), dtype)
        ops.paged_decode_attention(q, kc, vc, bt, cl, scale, out=out)
        close(out, ref.paged_decode_attention(q, kc, vc, bt, cl, scale), dtype, f"{B, nh, nkv, hd, bs, ctx}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention_split_context(isa, dtype, threads):
    # Few (sequence, kv head) items and long contexts: with 2 threads the context is split into
    # partitions whose partial softmaxes are merged; with 1 thread it is not. Both must match.
    g = gen("attn-split", isa, str(dtype))
    B, nh, nkv, hd, bs = 1, 4, 1, 128, 16
    ctx = [1500]
    q, kc, vc, bt, cl = _attention_inputs(g, dtype, B, nh, nkv, hd, bs, ctx)
    expected = ref.paged_decode_attention(q, kc, vc, bt, cl, 0.1)
    for n in (1, 2):
        threads(n)
        out = poisoned((B, nh, hd), dtype)
        ops.paged_decode_attention(q, kc, vc, bt, cl, 0.1, out=out)
        close(out, expected, dtype, f"threads={n}")
    # uneven contexts across a batch, some shorter than one partition
    B, nh, nkv = 2, 6, 2
    q, kc, vc, bt, cl = _attention_inputs(g, dtype, B, nh, nkv, hd, bs, [2000, 70])
    out = poisoned((B, nh, hd), dtype)
    ops.paged_decode_attention(q, kc, vc, bt, cl, 0.1, out=out)
    close(out, ref.paged_decode_attention(q, kc, vc, bt, cl, 0.1), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bfloat16: the vdpbf16ps scores where the CPU has them
def test_paged_decode_attention_strided_q_and_large_scores(isa, dtype):
    g = gen("attn-strided", isa, str(dtype))
    B, nh, nkv, hd, bs = 3, 6, 2, 64, 16
    q_full, kc, vc, bt, cl = _attention_inputs(g, dtype, B, nh + 2 * nkv, nkv, hd, bs, [50, 20, 64])
    q = q_full[:, :nh]  # row-strided view (as sliced from a fused qkv output)
    out = ops.paged_decode_attention(q, kc, vc, bt, cl, 3.0)  # large scale: peaked softmax, tests max-subtraction
    expected = ref.paged_decode_attention(q, kc, vc, bt, cl, 3.0)
    if dtype == torch.float32:
        # Scores of up to ~100 in magnitude: each exp(s - max) carries ~|s| ulps of fp32 rounding (~6e-6 relative),
        # so outputs differ from the reference by up to ~1.5e-5 (measured over the seeds of every level), not 1e-5.
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=5e-5)
    else:
        close(out, expected, dtype)


# ---------------------------------------------------------------------------------------------------
# Misuse and plumbing


def test_bad_arguments_raise_value_error():
    x, w = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        ops.rms_norm(x.double(), w.double(), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, w.half(), 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        ops.rms_norm(torch.randn(8, 4).t(), w, 1e-6)
    with pytest.raises(ValueError, match=r"x must have shape \[\*, \*\]"):
        ops.rms_norm(torch.randn(2, 4, 8), w, 1e-6)
    with pytest.raises(ValueError, match="residual"):
        ops.fused_add_rms_norm(x, torch.randn(4, 9), w, 1e-6)
    with pytest.raises(ValueError, match="even last dim"):
        ops.silu_and_mul(torch.randn(4, 7))
    with pytest.raises(ValueError, match="out"):
        ops.silu_and_mul(torch.randn(4, 8), out=torch.empty(4, 3))

    q, k = torch.randn(2, 128), torch.randn(2, 64)
    cache = _cos_sin_cache(16, 64)
    with pytest.raises(ValueError, match="position"):
        ops.rotary_embedding(torch.tensor([0, 16]), q, k, 64, cache, True)
    with pytest.raises(ValueError, match="int64"):
        ops.rotary_embedding(torch.tensor([0, 1], dtype=torch.int32), q, k, 64, cache, True)
    with pytest.raises(ValueError, match="head_size"):
        ops.rotary_embedding(torch.tensor([0, 1]), q, k, 48, cache, True)
    with pytest.raises(ValueError, match="rot_dim"):
        ops.rotary_embedding(torch.tensor([0, 1]), q, k, 32, cache, True)

    key = torch.randn(3, 2, 16)
    kc, vc = torch.zeros(2, 4, 2, 16), torch.zeros(2, 4, 2, 16)
    with pytest.raises(ValueError, match="slot"):
        ops.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 1, 8]))
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="bfloat16"):
        ops.reshape_and_cache(key, key, kc.bfloat16(), vc.bfloat16(), torch.tensor([0, 1, 2]))

    qd = torch.randn(1, 4, 16)
    bt, cl = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([8], dtype=torch.int32)
    ops.paged_decode_attention(qd, kc, vc, bt, cl, 0.25)  # valid
    with pytest.raises(ValueError, match="block table"):
        ops.paged_decode_attention(qd, kc, vc, torch.tensor([[0, 2]], dtype=torch.int32), cl, 0.25)
    with pytest.raises(ValueError, match="context length"):
        ops.paged_decode_attention(qd, kc, vc, bt, torch.tensor([9], dtype=torch.int32), 0.25)
    with pytest.raises(ValueError, match="int32"):
        ops.paged_decode_attention(qd, kc, vc, bt.long(), cl, 0.25)
    with pytest.raises(ValueError, match="multiple"):
        ops.paged_decode_attention(torch.randn(1, 3, 16), kc, vc, bt, cl, 0.25)
    with pytest.raises(ValueError, match="CPU or all on one CUDA device|on meta"):
        ops.rms_norm(x.to("meta"), w.to("meta"), 1e-6)


def test_force_isa_rejects_unknown_levels():
    from engine import _C

    with pytest.raises(ValueError, match="not available"):
        _C.force_isa("avx1024")
    _C.force_isa("scalar")
    assert ops.cpu_isa() == "scalar"
    _C.force_isa("auto")
    assert ops.cpu_isa() == ISAS[-1]


def test_kernel_config_forces_the_isa_levels(monkeypatch):
    """KernelConfig.cpu_isa / gguf_isa, applied once by ops.configure (at engine start: ModelRunner), set the
    levels (what KESTREL_CPU_ISA / KESTREL_GGUF_ISA did at import); a level this build or CPU lacks falls back to
    the best one with a warning; auto goes back to the best."""
    from engine.kernel_config import KernelConfig

    try:
        ops.configure(KernelConfig(cpu_isa="scalar", gguf_isa="scalar"))
        assert ops.cpu_isa() == "scalar" and ops.gguf_isa() == "scalar"
        monkeypatch.setattr(native_lib_of_ops(), "force_isa", _refusing(native_lib_of_ops().force_isa))
        ops.configure(KernelConfig(cpu_isa="avx2"))  # refused by the (patched) module: the best level, a warning
        assert ops.cpu_isa() == ISAS[-1]
    finally:
        monkeypatch.undo()
        ops.configure(KernelConfig())
    assert ops.cpu_isa() == ISAS[-1]


def native_lib_of_ops():
    return native.native_lib


def _refusing(force):
    def force_isa(name):
        if name != "auto":
            raise ValueError(f"{name} is not available here")
        force(name)

    return force_isa


def test_reference_fallback_when_native_missing(monkeypatch):
    # every engine.ops module binds native_lib at import (a module global: the cheapest lookup on the hot path)
    for mod in [m for name, m in sys.modules.items() if name.startswith("engine.ops.")]:
        if getattr(mod, "native_lib", None) is not None:
            monkeypatch.setattr(mod, "native_lib", None)
    assert not ops.native_available() and ops.cpu_isa() == "reference"
    g = gen("fallback")
    x, w = randn(g, 3, 32), randn(g, 32)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    out = torch.empty(3, 16)
    assert ops.silu_and_mul(x, out=out) is out


def test_cuda_tensors_without_cuda_build_raise_clearly(monkeypatch):
    # A CPU-only torch cannot make a CUDA tensor; check the guard every CUDA path goes through instead.
    class FakeCuda:
        is_cuda = True
        device = torch.device("cuda", 0)

    monkeypatch.setattr(native, "_HAS_CUDA", False)
    with pytest.raises(ValueError, match="built without CUDA"):
        native.check_cuda("rms_norm", FakeCuda(), FakeCuda())
    with pytest.raises(ValueError, match="must be on"):
        native.check_cuda("rms_norm", FakeCuda(), torch.zeros(1))


# ---------------------------------------------------------------------------------------------------
# Batch invariance (--deterministic): a row's bits must not depend on the other rows of the call


@pytest.fixture
def batch_invariant():
    ops.set_batch_invariant(True)
    yield
    ops.set_batch_invariant(False)


def _weights(g, dtype, N, K, int8):
    w = randn(g, N, K, dtype=dtype, scale=0.05)
    return ops.Int8Weight.quantize(w) if int8 else w


@pytest.mark.parametrize("linear_isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("int8", [False, True], ids=["dense", "int8"])
def test_linear_rows_do_not_depend_on_the_batch_when_batch_invariant(linear_isa, dtype, int8, batch_invariant,
                                                                     threads):
    from engine import _C

    _C.force_isa(linear_isa)
    try:
        # K with a vector tail (not for int8: groups of 32), N not a multiple of the GEMV block; M across the
        # GEMV / GEMM threshold (16) and the invariant row block (64)
        K, N = (96 if int8 else 200), 77
        g = gen("linear-invariant", linear_isa, str(dtype), int8)
        x = randn(g, 150, K, dtype=dtype)
        w, b = _weights(g, dtype, N, K, int8), randn(g, N, dtype=dtype)
        threads(2)
        full = ops.linear(x, w, b)
        for start, M in [(0, 1), (5, 1), (3, 2), (0, 3), (7, 16), (1, 17), (9, 64), (10, 65), (0, 150)]:
            for n in (1, 2):
                threads(n)
                got = ops.linear(x[start:start + M], w, b)
                assert torch.equal(got, full[start:start + M]), f"rows {start}..{start + M} threads={n}"
        close(full.float(), ref.linear(x, w.dequantize(dtype) if int8 else w, b).float(), torch.bfloat16
              if int8 else dtype)
    finally:
        _C.force_isa("auto")


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gemv_rows_do_not_depend_on_their_place(isa, dtype):
    # Without batch invariance too: at decode sizes (M <= 16, the GEMV kernels) a row's result does not
    # depend on M or on its place in the tile of rows the kernel reduces together.
    g = gen("gemv-place", isa, str(dtype))
    x, w = randn(g, 16, 200, dtype=dtype), randn(g, 77, 200, dtype=dtype, scale=0.05)
    full = ops.linear(x, w)
    for start, M in [(0, 1), (1, 1), (3, 1), (2, 3), (5, 7), (0, 16)]:
        assert torch.equal(ops.linear(x[start:start + M], w), full[start:start + M]), f"rows {start}..{start + M}"


def test_linear_batch_invariance_changes_the_large_m_kernel():
    # The check above could pass by accident if both modes ran the same kernel: at M = 17 the default mode
    # runs the GEMM kernels (sequential K), whose bits differ from the GEMV kernels' somewhere.
    g = gen("gemm-vs-gemv")
    x, w = randn(g, 17, 1000), randn(g, 300, 1000)
    default = ops.linear(x, w)
    ops.set_batch_invariant(True)
    try:
        invariant = ops.linear(x, w)
    finally:
        ops.set_batch_invariant(False)
    assert ops.batch_invariant() is False
    assert torch.equal(invariant[:1], ops.linear(x[:1], w))  # M = 1 runs the GEMV kernels in both modes
    assert not torch.equal(default, invariant)
    torch.testing.assert_close(default, invariant, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention_rows_do_not_depend_on_the_batch_when_batch_invariant(isa, dtype, batch_invariant,
                                                                                    threads):
    # Contexts below, at and above the fixed partition length (512 tokens), one empty; each row alone, in
    # pairs and all together, on 1 and 2 threads: the same bits.
    B, nh, nkv, hd, bs = 6, 9, 3, 64, 16
    ctx = [1300, 37, 512, 0, 700, 1]
    g = gen("attn-invariant", isa, str(dtype))
    q, kc, vc, bt, cl = _attention_inputs(g, dtype, B, nh, nkv, hd, bs, ctx)
    threads(2)
    full = ops.paged_decode_attention(q, kc, vc, bt, cl, 0.125)
    close(full, ref.paged_decode_attention(q, kc, vc, bt, cl, 0.125), dtype)
    for n in (1, 2):
        threads(n)
        for rows in ([0], [1], [2], [4], [5], [1, 0], [3, 2, 5], list(range(B))):
            idx = torch.tensor(rows)
            got = ops.paged_decode_attention(q[idx], kc, vc, bt[idx], cl[idx], 0.125)
            assert torch.equal(got, full[idx]), f"rows {rows} threads={n}"
