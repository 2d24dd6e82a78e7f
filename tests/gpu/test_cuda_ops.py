"""engine.ops CUDA kernels against the pure-torch references (skipped without a CUDA device).

Run on a GPU machine with:  pytest -q tests/gpu/test_cuda_ops.py
(build first with the CUDA toolkit on PATH; KESTREL_CUDA_ARCHS=<your sm, e.g. 89> keeps the build quick).
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine import ops  # noqa: E402
from engine.ops import reference as ref  # noqa: E402
from tests.support.varlen_cases import STEP_LAYOUTS, step_layout  # noqa: E402

pytestmark = pytest.mark.timeout(600)

DEV = torch.device("cuda", torch.cuda.current_device())
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def test_cuda_kernels_are_built():
    assert ops.native_available(), "engine._C is missing"
    assert ops.cuda_available(), "engine._C was built without CUDA: put nvcc on PATH and rebuild"


def gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randn(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=DEV)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def close(actual, expected, dtype, msg=""):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=msg or None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_fused_add(dtype):
    for T, H in [(1, 576), (1, 1), (7, 77), (33, 1000), (300, 4096), (2, 8192)]:
        g = gen("rms", str(dtype), T, H)
        x, r, w = randn(g, T, H, dtype=dtype, scale=3), randn(g, T, H, dtype=dtype), randn(g, H, dtype=dtype)
        out = poisoned((T, H), dtype)
        ops.rms_norm(x, w, 1e-6, out=out)
        close(out, ref.rms_norm(x, w, 1e-6), dtype, f"rms_norm {T}x{H}")
        x_ref, r_ref = x.clone(), r.clone()
        ref.fused_add_rms_norm(x_ref, r_ref, w, 1e-6)
        ops.fused_add_rms_norm(x, r, w, 1e-6)
        close(r, r_ref, dtype, f"residual {T}x{H}")
        close(x, x_ref, dtype, f"x {T}x{H}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    for T, I in [(1, 1536), (1, 1), (5, 37), (64, 14336)]:
        g = gen("silu", str(dtype), T, I)
        base = randn(g, T, 2 * I + 8, dtype=dtype, scale=4)
        x = base[:, 4 : 4 + 2 * I]  # row-strided view
        out = poisoned((T, I), dtype)
        ops.silu_and_mul(x, out=out)
        close(out, ref.silu_and_mul(x), dtype, f"{T}x{I}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding(dtype, is_neox):
    # 16-byte path (sizes multiples of two vectors) and the scalar one (a rotary width of 20)
    for T, nh, nkv, hd, rot in [(1, 9, 3, 64, 64), (13, 32, 8, 128, 128), (5, 12, 3, 64, 32), (3, 4, 1, 80, 80),
                                (4, 6, 2, 20, 20), (2, 3, 1, 40, 20)]:
        g = gen("rope", str(dtype), is_neox, T, nh, hd)
        qkv = randn(g, T, (nh + 2 * nkv) * hd, dtype=dtype, scale=2)
        q, k = qkv[:, : nh * hd], qkv[:, nh * hd : (nh + nkv) * hd]
        inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        freqs = torch.outer(torch.arange(4096, dtype=torch.float32), inv)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DEV)
        pos = torch.randint(0, 4096, (T,), generator=g).to(DEV)
        q_ref, k_ref = q.clone(), k.clone()
        ref.rotary_embedding(pos, q_ref, k_ref, hd, cache, is_neox)
        v_before = qkv[:, (nh + nkv) * hd :].clone()
        ops.rotary_embedding(pos, q, k, hd, cache, is_neox)
        close(q, q_ref, dtype)
        close(k, k_ref, dtype)
        assert torch.equal(qkv[:, (nh + nkv) * hd :], v_before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(dtype):
    for T, nkv, hd, bs, nb in [(1, 3, 64, 16, 4), (40, 8, 128, 16, 16), (7, 2, 80, 5, 9), (5, 2, 18, 4, 8)]:  # 18: scalar
        g = gen("cache", str(dtype), T, nkv, hd)
        nh = 2 * nkv
        qkv = randn(g, T, (nh + 2 * nkv) * hd, dtype=dtype)
        key = qkv[:, nh * hd : (nh + nkv) * hd].view(T, nkv, hd)
        value = qkv[:, (nh + nkv) * hd :].view(T, nkv, hd)
        slots = torch.randperm(nb * bs, generator=g)[:T]
        slots[torch.rand(T, generator=g) < 0.3] = -1
        slots = slots.to(DEV)
        kc, vc = poisoned((nb, bs, nkv, hd), dtype), poisoned((nb, bs, nkv, hd), dtype)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        ref.reshape_and_cache(key, value, kc_ref, vc_ref, slots)
        ops.reshape_and_cache(key, value, kc, vc, slots)
        assert torch.equal(kc.isnan(), kc_ref.isnan()) and torch.equal(vc.isnan(), vc_ref.isnan())
        assert torch.equal(kc.nan_to_num(), kc_ref.nan_to_num()) and torch.equal(vc.nan_to_num(), vc_ref.nan_to_num())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_and_cache(dtype, is_neox):
    """The fused rope + cache write equals rotary_embedding then reshape_and_cache bit for bit (the fused kernel on
    the 16-byte path: partial rotary, padding slots of -1 that rotate but write nothing; the two kernels on the
    others: a head size of 20)."""
    for T, nh, nkv, hd, rot, bs, nb in [(1, 32, 8, 128, 128, 64, 4), (13, 32, 8, 128, 128, 16, 4),
                                        (5, 12, 3, 64, 32, 16, 2), (3, 4, 1, 80, 80, 5, 4), (4, 6, 2, 20, 20, 4, 4)]:
        g = gen("rope_cache", str(dtype), is_neox, T, nh, hd)
        qkv = randn(g, T, (nh + 2 * nkv) * hd, dtype=dtype, scale=2)
        inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        freqs = torch.outer(torch.arange(4096, dtype=torch.float32), inv)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DEV)
        pos = torch.randint(0, 4096, (T,), generator=g).to(DEV)
        slots = torch.randperm(nb * bs, generator=g)[:T]
        slots[torch.rand(T, generator=g) < 0.3] = -1
        slots = slots.to(DEV)
        want = qkv.clone()
        kc_want, vc_want = poisoned((nb, bs, nkv, hd), dtype), poisoned((nb, bs, nkv, hd), dtype)
        kc, vc = kc_want.clone(), vc_want.clone()
        q, k, v = want.split([nh * hd, nkv * hd, nkv * hd], dim=1)
        ops.rotary_embedding(pos, q, k, hd, cache, is_neox)
        ops.reshape_and_cache(k.view(T, nkv, hd), v.view(T, nkv, hd), kc_want, vc_want, slots)
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=1)
        ops.rotary_and_cache(pos, q, k, v, kc, vc, slots, hd, cache, is_neox)
        assert torch.equal(qkv, want), (T, nh, hd, rot)
        for got, exp in ((kc, kc_want), (vc, vc_want)):
            assert torch.equal(got.isnan(), exp.isnan()) and torch.equal(got.nan_to_num(), exp.nan_to_num())


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_token_positions_and_slots(block_size):
    rng = random.Random(block_size)
    for seqs in STEP_LAYOUTS:
        (qsl, sl, bt), (positions, slots) = step_layout(rng, seqs, block_size, DEV)
        got = ops.token_positions_and_slots(qsl, sl, bt, block_size, len(positions), max(q for q, _ in seqs))
        assert [t.tolist() for t in got] == [positions, slots]


@pytest.mark.parametrize("dtype", DTYPES)  # (the G = 4 kernel's U = 1 / 4 variants were deleted: issue 46)
def test_paged_decode_attention(dtype):
    cases = [  # B, nh, nkv, hd, bs, contexts
        (1, 9, 3, 64, 16, [37]),
        (3, 8, 8, 128, 16, [1, 16, 17]),
        (2, 32, 8, 128, 16, [1000, 33]),
        (2, 16, 2, 256, 8, [65, 0]),
        (4, 5, 1, 80, 16, [31, 3000, 2, 257]),
        # the GQA kernel (query heads of one KV head per block): groups of 2, 4 and 8 at head sizes 64..256
        (3, 8, 4, 64, 16, [5, 700, 64]),
        (2, 32, 4, 128, 64, [513, 1]),
        (2, 16, 2, 64, 16, [129, 2000]),
        (2, 8, 2, 256, 16, [300, 17]),
        # block sizes that are not powers of two (a division instead of a shift for a token's page)
        (2, 32, 8, 128, 12, [100, 37]),
        (2, 8, 8, 64, 24, [50, 7]),
    ]
    # partitions sized per call (0), fixed (64) and each context cut into 1, 7 or 33 on the device (-splits); the
    # 16-byte kernel takes bf16 / fp16 at head sizes 64, 128, 256 and fp32 up to 128, the scalar one the rest
    for (B, nh, nkv, hd, bs, ctx), part in ((c, p) for c in cases for p in (0, 64, -1, -7, -33)):
        g = gen("attn", str(dtype), B, nh, nkv, hd, bs, tuple(ctx))
        max_blocks = max(1, max((c + bs - 1) // bs for c in ctx))
        nb = B * max_blocks + 2
        kc, vc = randn(g, nb, bs, nkv, hd, dtype=dtype), randn(g, nb, bs, nkv, hd, dtype=dtype)
        bt = torch.randperm(nb, generator=g)[: B * max_blocks].view(B, max_blocks).to(torch.int32).to(DEV)
        cl = torch.tensor(ctx, dtype=torch.int32, device=DEV)
        q = randn(g, B, nh, hd, dtype=dtype)
        out = poisoned((B, nh, hd), dtype)
        ops.paged_decode_attention(q, kc, vc, bt, cl, hd**-0.5, out=out, part_tokens=part)
        close(out, ref.paged_decode_attention(q, kc, vc, bt, cl, hd**-0.5), dtype, f"{B, nh, nkv, hd, bs, ctx, part}")
        if part == -7:  # q as a view whose rows are not 16-byte aligned: the scalar kernel
            qv = randn(g, B, nh * hd + 1, dtype=dtype)[:, 1:].view(B, nh, hd)
            ops.paged_decode_attention(qv, kc, vc, bt, cl, hd**-0.5, out=out, part_tokens=part)
            close(out, ref.paged_decode_attention(qv, kc, vc, bt, cl, hd**-0.5), dtype, f"view {B, nh, hd, ctx}")


def test_side_stream_and_cuda_graph_capture():
    g = gen("graph")
    T, H = 4, 576
    x, r, w = randn(g, T, H, dtype=torch.bfloat16), randn(g, T, H, dtype=torch.bfloat16), randn(g, H, dtype=torch.bfloat16)
    out = torch.empty(T, H, dtype=torch.bfloat16, device=DEV)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # kernels must run on the current (side) stream
        ops.rms_norm(x, w, 1e-6, out=out)
    s.synchronize()
    close(out, ref.rms_norm(x, w, 1e-6), torch.bfloat16)

    gu = randn(g, T, 2 * 1536, dtype=torch.bfloat16)
    act = torch.empty(T, 1536, dtype=torch.bfloat16, device=DEV)
    graph = torch.cuda.CUDAGraph()
    xs, rs = x.clone(), r.clone()
    with torch.cuda.graph(graph):
        ops.fused_add_rms_norm(xs, rs, w, 1e-6)
        ops.silu_and_mul(gu, out=act)
    xs.copy_(x)
    rs.copy_(r)
    act.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    x_ref, r_ref = x.clone(), r.clone()
    ref.fused_add_rms_norm(x_ref, r_ref, w, 1e-6)
    close(xs, x_ref, torch.bfloat16)
    close(rs, r_ref, torch.bfloat16)
    close(act, ref.silu_and_mul(gu), torch.bfloat16)


def test_mixed_devices_raise():
    x = torch.randn(2, 8, device=DEV)
    with pytest.raises(ValueError, match="on"):
        ops.rms_norm(x, torch.randn(8), 1e-6)
