"""--kv-cache-dtype fp8 on the GPU: the cache-write kernels (reshape_and_cache, rotary_and_cache, their 16-byte and
scalar paths) store exactly what reference.to_cache stores (byte for byte); the paged decode kernel (vector and
scalar instances, GQA groups, partitions fixed, per call and per device) over fp8 caches against the float32
reference over the dequantized caches; the Triton varlen kernel compiled for sm_90 and sm_89 tiles (pointer loads:
no TMA for fp8) and the merge over a cached prefix; then the engine on a tiny model: twice the KV blocks in the
same memory, logits of chunked scoring near --kv-cache-dtype auto's, CUDA graph replays equal the same bucketed
steps run eagerly bit for bit, graphs capture no host synchronisation."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine import LLM, ops
from engine.ops import reference as ref
from engine.ops import varlen_attention as va
from engine.sampling_params import SamplingParams
from tests.support.varlen_cases import run_fp8_case

DEV = torch.device("cuda", torch.cuda.current_device())
FP8 = torch.float8_e4m3fn
FP8_OK = torch.cuda.get_device_capability() >= (8, 9)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
pytestmark = pytest.mark.skipif(not FP8_OK, reason="fp8 KV cache needs compute capability 8.9+")


def gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randn(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=DEV)


def scale_of(v: float) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float32, device=DEV)


def poisoned_fp8(shape):
    return torch.full(shape, float("nan"), device=DEV).to(FP8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache_fp8_bytes(dtype):
    for T, nkv, hd, bs, nb in [(1, 3, 64, 16, 4), (40, 8, 128, 64, 4), (7, 2, 80, 5, 9), (5, 2, 18, 4, 8)]:
        g = gen("cache8", str(dtype), T, nkv, hd)
        qkv = randn(g, T, 4 * nkv * hd, dtype=dtype, scale=3)
        qkv[0, 2 * nkv * hd] = 5000.0  # saturates: 448 x the scale
        key = qkv[:, 2 * nkv * hd: 3 * nkv * hd].view(T, nkv, hd)
        value = qkv[:, 3 * nkv * hd:].view(T, nkv, hd)
        slots = torch.randperm(nb * bs, generator=g)[:T]
        slots[1:][torch.rand(T - 1, generator=g) < 0.3] = -1
        slots = slots.to(DEV)
        ks, vs = scale_of(0.05), scale_of(0.013)
        kc, vc = poisoned_fp8((nb, bs, nkv, hd)), poisoned_fp8((nb, bs, nkv, hd))
        kc_ref, vc_ref = kc.clone(), vc.clone()
        ref.reshape_and_cache(key, value, kc_ref, vc_ref, slots, ks, vs)
        ops.reshape_and_cache(key, value, kc, vc, slots, ks, vs)
        assert same_bytes(kc, kc_ref) and same_bytes(vc, vc_ref), (dtype, T, nkv, hd)
        assert ref.from_cache(kc.view(-1, nkv, hd)[slots[0]], ks)[0, 0].item() == pytest.approx(448 * 0.05)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_and_cache_fp8_bytes(dtype, is_neox):
    """The fused kernel (16-byte path: partial rotary, padding slots) and the two-kernel path (head size 20)
    write the rotated keys and the values as rotary_embedding + the reference's to_cache, byte for byte."""
    for T, nh, nkv, hd, rot, bs, nb in [(1, 32, 8, 128, 128, 64, 4), (13, 32, 8, 128, 128, 16, 4),
                                        (5, 12, 3, 64, 32, 16, 2), (4, 6, 2, 20, 20, 4, 4)]:
        g = gen("rope_cache8", str(dtype), is_neox, T, nh, hd)
        qkv = randn(g, T, (nh + 2 * nkv) * hd, dtype=dtype, scale=2)
        inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        freqs = torch.outer(torch.arange(4096, dtype=torch.float32), inv)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DEV)
        pos = torch.randint(0, 4096, (T,), generator=g).to(DEV)
        slots = torch.randperm(nb * bs, generator=g)[:T]
        slots[torch.rand(T, generator=g) < 0.3] = -1
        slots = slots.to(DEV)
        ks, vs = scale_of(0.02), scale_of(0.03)
        want = qkv.clone()
        kc_want, vc_want = poisoned_fp8((nb, bs, nkv, hd)), poisoned_fp8((nb, bs, nkv, hd))
        kc, vc = kc_want.clone(), vc_want.clone()
        q, k, v = want.split([nh * hd, nkv * hd, nkv * hd], dim=1)
        ops.rotary_embedding(pos, q, k, hd, cache, is_neox)
        ref.reshape_and_cache(k.reshape(T, nkv, hd), v.reshape(T, nkv, hd), kc_want, vc_want, slots, ks, vs)
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=1)
        ops.rotary_and_cache(pos, q, k, v, kc, vc, slots, hd, cache, is_neox, ks, vs)
        assert torch.equal(qkv, want), (T, nh, hd, rot)
        assert same_bytes(kc, kc_want) and same_bytes(vc, vc_want), (dtype, T, nh, hd, rot)


@pytest.mark.parametrize("dtype", DTYPES)  # (the G = 4 kernel's U = 1 / 4 variants were deleted: issue 46)
def test_paged_decode_attention_fp8(dtype):
    cases = [  # B, nh, nkv, hd, bs, contexts: the scalar kernel (80), the vector one, GQA groups 1 / 2 / 4 / 8
        (1, 9, 3, 64, 16, [37]), (3, 8, 8, 128, 16, [1, 16, 17]), (2, 32, 8, 128, 64, [1000, 33]),
        (2, 16, 2, 256, 8, [65, 0]), (4, 5, 1, 80, 16, [31, 3000, 2, 257]), (3, 8, 4, 64, 16, [5, 700, 64]),
        (2, 32, 4, 128, 64, [513, 1]), (2, 8, 2, 256, 16, [300, 17]), (2, 32, 8, 128, 12, [100, 37]),
    ]
    for (B, nh, nkv, hd, bs, ctx), part in ((c, p) for c in cases for p in (0, 64, -1, -7)):
        g = gen("attn8", str(dtype), B, nh, nkv, hd, bs, tuple(ctx))
        max_blocks = max(1, max((c + bs - 1) // bs for c in ctx))
        nb = B * max_blocks + 2
        ks, vs = scale_of(0.03), scale_of(0.01)
        kc = ref.to_cache(randn(g, nb, bs, nkv, hd, scale=4), FP8, ks)
        vc = ref.to_cache(randn(g, nb, bs, nkv, hd), FP8, vs)
        bt = torch.randperm(nb, generator=g)[: B * max_blocks].view(B, max_blocks).to(torch.int32).to(DEV)
        cl = torch.tensor(ctx, dtype=torch.int32, device=DEV)
        q = randn(g, B, nh, hd, dtype=dtype)
        out = torch.full((B, nh, hd), float("nan"), dtype=dtype, device=DEV)
        ops.paged_decode_attention(q, kc, vc, bt, cl, hd ** -0.5, out=out, part_tokens=part, k_scale=ks, v_scale=vs)
        want = ref.paged_decode_attention(q.float(), ref.from_cache(kc, ks), ref.from_cache(vc, vs), bt, cl,
                                          hd ** -0.5)
        tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
        torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol, msg=f"{B, nh, nkv, hd, bs, ctx, part}")


@pytest.mark.parametrize("target,block_size", [("sm90", 64), ("sm89", 16), ("sm90_short", 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_kernel_fp8_on_gpu(target, block_size, dtype):
    rng = random.Random(f"{target}{block_size}{dtype}")
    for nh, nkv, hd in ((32, 8, 128), (8, 8, 64), (16, 2, 128)):
        seqs = [(1, rng.randrange(1, 300)), (1, 0), (rng.randrange(2, 700), 0), (rng.randrange(2, 300), 130)]
        run_fp8_case(rng, nh, nkv, hd, seqs, dtype, target=target, device=DEV, block_size=block_size)
    run_fp8_case(rng, 32, 8, 128, [(600, 1000)], dtype, target="sm90", device=DEV, block_size=64, resume=True)


def _generate(model_dir, kv: str, bucketed: bool = False):
    prompts = ["The quick brown fox", "An fp8 KV cache on the GPU", "x", "One two three four five six", "Hello"]
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=7, temperature=0.9, seed=4, ignore_eos=True)]
    with LLM(str(model_dir), dtype="bfloat16", device="cuda", kv_cache_dtype=kv, enable_prefix_caching=False,
             max_num_seqs=8, kv_cache_memory_gib=0.25) as llm:
        if bucketed:
            llm.core.runner.capture_decode_graphs(capture=False)
        outs = llm.generate(prompts, [params[i % 2] for i in range(len(prompts))])
        return [(o.outputs[0].token_ids, [(lp.token_id, lp.logprob) for lp in o.outputs[0].logprobs or []])
                for o in outs]


def test_engine_fp8_graphs_equal_eager_bucketed(tiny_model_dir):
    d = tiny_model_dir("llama")
    assert _generate(d, "fp8") == _generate(d, "fp8", bucketed=True)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_fp8_twice_the_blocks_and_logits_near_auto(tiny_model_dir, arch):
    """The same memory holds twice the blocks; chunked scoring (every chunk after the first reads its prefix from
    the cache: the Triton kernel) and greedy decoding (the decode kernel in the graphs) stay near auto's."""
    d = tiny_model_dir(arch)
    ids = list(range(5, 90))
    got = {}
    for kv in ("auto", "fp8"):
        with LLM(str(d), dtype="bfloat16", device="cuda", kv_cache_dtype=kv, kv_cache_memory_gib=0.1,
                 max_num_batched_tokens=16, enable_prefix_caching=False) as llm:
            runner = llm.core.runner
            attn = runner.model.attention_layers()[0]
            assert attn.k_cache.dtype == (FP8 if kv == "fp8" else torch.bfloat16)
            blocks = llm.core.blocks.num_blocks
            logits = llm.core.score(ids).cpu()
            out = llm.generate(["The rain in Spain", "Numbers: 1 2 3"],
                               SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
            got[kv] = (blocks, logits, [o.outputs[0].token_ids for o in out])
            if kv == "fp8":
                assert not attn.calibrate_scales and attn.k_scale.item() != 1.0  # set by the first prefill
    (b0, l0, t0), (b1, l1, t1) = got["auto"], got["fp8"]
    assert b1 in (2 * b0, 2 * b0 + 1)
    assert (l1 - l0).abs().max() <= 0.05 * l0.abs().max() + 0.05
    assert (l1.argmax(-1) == l0.argmax(-1)).float().mean() >= 0.9
    assert sum(a[:4] == b[:4] for a, b in zip(t0, t1)) >= 1  # greedy starts agree at least once (tiny random model)


def test_no_host_sync_inside_an_fp8_replay(tiny_model_dir):
    with LLM(str(tiny_model_dir("llama")), dtype="bfloat16", device="cuda", kv_cache_dtype="fp8", max_num_seqs=8,
             kv_cache_memory_gib=0.25) as llm:
        graphs = llm.core.runner.graphs
        real = graphs.run
        replays = []

        def checked(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = real(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            replays.append(out is not None)
            return out

        graphs.run = checked
        llm.generate(["a b c", "hello there"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        assert any(replays)


def test_fp8_tma_off_and_scales_required():
    kc = torch.zeros(4, 64, 8, 128, device=DEV).to(FP8)
    assert va.tma_descriptors(kc, kc.clone(), va.config_for(DEV, 128, "sm90"), 128) is None
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16, device=DEV)
    bt = torch.zeros(1, 1, dtype=torch.int32, device=DEV)
    cl = torch.ones(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="k_scale"):
        ops.paged_decode_attention(q, kc, kc.clone(), bt, cl, 0.1)
