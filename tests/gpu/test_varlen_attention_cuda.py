"""The compiled Triton varlen attention kernel on the GPU against the float32 reference (random paged layouts up to
4,096-token chunks, GQA 1 / 4 / 8, head sizes 64 / 128, both kernel configurations: sm_90's and the 99 KB sm_89
one forced on this GPU), and the engine on the GPU against the engine on the CPU: greedy tokens of the tiny model of
every architecture in float32, with prefix caching and chunked prefill on and off; KV-cache sizing by profiling."""

from __future__ import annotations

import random

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine.ops import varlen_attention as va
from tests.support.tiny_models import TINY_ARCHS
from tests.support.varlen_cases import BOUNDS, chunk_state, make_case, run_case

pytestmark = pytest.mark.timeout(900)


def test_configs_fit_their_targets():
    for limit, target in ((99 * 1024, "sm89"), (227 * 1024, "sm90")):
        small, large = va.CONFIGS[target]  # for head sizes <= 64 and <= 128
        assert small.smem_bytes(64) <= limit and large.smem_bytes(128) <= limit
        if target in va.SHORT_CONFIGS:
            assert va.SHORT_CONFIGS[target].smem_bytes(128) <= limit


# (target, KV block size): sm_90 with blocks of 64 tokens takes the TMA loads, with 16 the pointer loads
TARGETS = [("sm90", 64), ("sm90", 16), ("sm89", 16), ("sm90_short", 64)]


def test_tma_on_sm90_with_the_gpu_default_block_size():
    from engine.runner.device import default_block_size

    bs = default_block_size(torch.device("cuda"))
    kc = torch.zeros(4, bs, 8, 128, dtype=torch.bfloat16, device="cuda")
    sm90 = torch.cuda.get_device_capability() >= (9, 0)
    assert (va.tma_descriptors(kc, kc.clone(), va.config_for(kc.device, 128), 128) is not None) == sm90
    assert va.tma_descriptors(kc, kc.clone(), va.config_for(kc.device, 128, "sm89"), 128) is None


@pytest.mark.parametrize("target,block_size", TARGETS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_random_layouts_on_gpu(target, block_size, dtype):
    rng = random.Random(hash((target, block_size, str(dtype))) & 0xFFFF)
    for nh, nkv in ((8, 8), (32, 8), (16, 2)):
        for hd in (64, 128):
            seqs = [(1, rng.randrange(1, 3000)) for _ in range(rng.randrange(0, 4))]  # decodes
            seqs += [(rng.choice([2, 17, 129, 700]), rng.choice([0, 7, 16, 33, 64, 1500]))]
            run_case(rng, nh, nkv, hd, seqs, dtype, target=target, device="cuda", block_size=block_size)


@pytest.mark.parametrize("target,block_size", TARGETS)
def test_long_chunks(target, block_size):
    rng = random.Random(5)
    kw = {"target": target, "device": "cuda", "block_size": block_size}
    run_case(rng, 32, 8, 128, [(4096, 0)], torch.bfloat16, **kw)
    run_case(rng, 32, 8, 128, [(1, 4000), (2048, 2048), (1000, 15)], torch.bfloat16, **kw)
    assert BOUNDS[torch.bfloat16] > 0


@pytest.mark.parametrize("target,block_size", [("sm90", 64), ("sm90", 16), ("sm89", 16)])
def test_resume_over_the_prefix_on_gpu(target, block_size):
    """The kernel merging each chunk's own attention (the float32 chunk state) with the cached prefix. Head size 64
    only with pointer loads: its TMA specialisation made Triton 3.6's ptxas die (the engine merges at 128 only,
    layers.attention.RESUME_HEAD_DIMS)."""
    rng = random.Random(9)
    kw = {"target": target, "device": "cuda", "block_size": block_size, "resume": True}
    run_case(rng, 32, 8, 128, [(1024, 1500)], torch.bfloat16, **kw)
    if block_size % 64:
        run_case(rng, 16, 2, 64, [(700, 64)], torch.bfloat16, **kw)
    run_case(rng, 8, 8, 128, [(600, 7), (513, 2000)], torch.float16, **kw)


def test_steps_of_other_shapes_reuse_the_built_kernel():
    """The arguments that change from step to step (block-table width, tile count and so the offset of the packed
    tile starts, the chunk's log-sum-exp stride) build no new Triton variant: a serving run once met compiles in
    the middle of its steps. The recorder itself is checked on a kernel new to this process."""
    import triton
    import triton.language as tl

    from engine.bench.timing import triton_compiles

    @triton.jit
    def add_one(x, n, B: tl.constexpr):
        i = tl.arange(0, B)
        tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)

    with triton_compiles() as built:
        add_one[(1,)](torch.zeros(16, device="cuda"), 16, B=16)
    assert [c["kernel"] for c in built] == ["add_one"]

    rng = random.Random(13)
    for resume in (False, True):
        kw = {"target": "sm90", "device": "cuda", "block_size": 64, "resume": resume}
        run_case(rng, 32, 8, 128, [(1, 700), (600, 64)], torch.bfloat16, **kw)  # builds the variant if new
        with triton_compiles() as built:
            for seqs in ([(1, 33), (517, 1500)], [(1, 4000), (1, 9), (129, 16)], [(2, 63), (1000, 15)],
                         [(1, 5)] * 7 + [(301, 2048)], [(64, 1)], [(1, 64), (17, 4095)]):
                run_case(rng, 32, 8, 128, seqs, torch.bfloat16, **kw)
        assert [c for c in built if c["kernel"] == "varlen_paged_attention_kernel"] == [], (resume, built)


def test_start_up_builds_the_kernels_the_steps_take(tiny_model_dir):
    """The engine builds the prefill attention's variants at start-up (Attention.warm_up_kernels): a run of mixed
    steps (decodes beside short chunks), long chunks and prefix hits builds none. A block size and dtype no other
    test here loads, so the variants are new to this process and the start-up must build them."""
    from engine.bench.timing import triton_compiles
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    rng = random.Random(21)
    prompts = [[rng.randrange(10, 1000) for _ in range(n)] for n in (700, 33, 5, 1200)]
    with triton_compiles() as at_start:
        llm = LLM(str(tiny_model_dir("llama")), dtype="float16", device="cuda", block_size=32,
                  max_num_batched_tokens=600, kv_cache_memory_gib=0.25)
    with llm:
        assert "varlen_paged_attention_kernel" in [c["kernel"] for c in at_start]
        with triton_compiles() as during:
            for _ in range(2):  # the second round hits the prefix cache
                llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert [c for c in during if c["kernel"] == "varlen_paged_attention_kernel"] == []


def test_long_chunk_over_a_cached_prefix_takes_cudnn_then_the_kernel(monkeypatch):
    """The layer's path for one long chunk over a cached prefix: cuDNN's chunk attention with its log-sum-exp
    (natural log, checked against the float32 chunk state), then the kernel over the paged prefix merging it in; the
    layer's output equals the float32 reference. K and V are the strided views of a fused qkv output, as in the
    model."""
    from engine import ops
    from engine.layers.attention import Attention, AttentionMetadata, SeqSpan

    rng = random.Random(3)
    nh, nkv, hd, n, prefix, bs = 32, 8, 128, 1024, 1500, 64
    (q, kc, vc, *_), (tables, ctxs, qlens) = make_case(rng, nh, nkv, hd, [(n, prefix)], torch.bfloat16, bs, "cuda")
    idx = torch.tensor(tables[0], dtype=torch.long, device="cuda")
    k = kc[idx].flatten(0, 1)[prefix:prefix + n]  # the chunk's own keys and values (already in the cache)
    v = vc[idx].flatten(0, 1)[prefix:prefix + n]
    got = va.chunk_self_attention(q, k, v, hd ** -0.5)
    assert got is not None, "cuDNN's flash attention did not run on this GPU"
    state, lse = chunk_state(q, kc, vc, tables, ctxs, qlens, hd ** -0.5)
    assert (got[1] - lse).abs().max().item() < 2e-2
    assert (got[0].float() - state).abs().max().item() <= BOUNDS[torch.bfloat16]

    calls = []
    real = ops.chunk_self_attention
    monkeypatch.setattr(ops, "chunk_self_attention", lambda *a: calls.append(1) or real(*a))
    attn = Attention(nh, nkv, hd, 0)
    attn.k_cache, attn.v_cache = kc, vc
    qkv = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=1)
    q2, k2, v2 = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=1)
    meta = AttentionMetadata.build([SeqSpan(0, n, prefix + n, tuple(tables[0]))], bs, q.device)
    out = attn(q2, k2, v2, meta).view(n, nh, hd)
    assert calls == [1]
    ref = va.reference(q, kc, vc, tables, ctxs, qlens, hd ** -0.5)
    assert (out.float() - ref).abs().max().item() <= BOUNDS[torch.bfloat16]


def test_a_merge_kernel_that_does_not_compile_falls_back_to_one_launch(monkeypatch, caplog):
    """A Triton build whose ptxas cannot compile the merging specialisation (Triton 3.6's died on several): the
    layer logs it once and takes the one-launch kernel, with the right output, from then on without trying again."""
    from engine import ops
    from engine.layers import attention
    from engine.layers.attention import Attention, AttentionMetadata, SeqSpan

    rng = random.Random(4)
    nh, nkv, hd, n, prefix, bs = 8, 2, 128, 600, 100, 64
    (q, kc, vc, *_), (tables, ctxs, qlens) = make_case(rng, nh, nkv, hd, [(n, prefix)], torch.bfloat16, bs, "cuda")
    idx = torch.tensor(tables[0], dtype=torch.long, device="cuda")
    k, v = kc[idx].flatten(0, 1)[prefix:prefix + n], vc[idx].flatten(0, 1)[prefix:prefix + n]
    attempts = []
    real = ops.varlen_paged_attention

    def no_merge(*a, lse=None, **kw):
        if lse is not None:
            attempts.append(1)
            raise RuntimeError("PTXAS error: `ptxas` failed with error code -11")
        return real(*a, **kw)

    monkeypatch.setattr(ops, "varlen_paged_attention", no_merge)
    monkeypatch.setattr(attention, "_RESUME_COMPILES", {})
    attn = Attention(nh, nkv, hd, 0)
    attn.k_cache, attn.v_cache = kc, vc
    ref = va.reference(q, kc, vc, tables, ctxs, qlens, hd ** -0.5)
    for _ in range(2):
        meta = AttentionMetadata.build([SeqSpan(0, n, prefix + n, tuple(tables[0]))], bs, q.device)
        out = attn(q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1), meta).view(n, nh, hd)
        assert (out.float() - ref).abs().max().item() <= BOUNDS[torch.bfloat16]
    assert attempts == [1]
    assert "did not compile" in caplog.text


@pytest.mark.parametrize("bs", [16, 64])
def test_cache_of_more_than_2_31_elements(bs):
    """Block offsets past 2**31 elements (a big cache on a big GPU) take the 64-bit path (pointer loads) or
    TMA row coordinates (blocks of 64) and stay exact."""
    nkv, hd = 8, 128
    nb = 2 ** 31 // (bs * nkv * hd) + 64  # 4 GiB per cache in bf16
    kc = torch.zeros(nb, bs, nkv, hd, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    n = -(-640 // bs)
    blocks = list(range(nb - n, nb))  # the sequence lives at the top of the cache
    kc[blocks] = torch.randn(n, bs, nkv, hd, device="cuda").to(torch.bfloat16)
    vc[blocks] = torch.randn(n, bs, nkv, hd, device="cuda").to(torch.bfloat16)
    q = torch.randn(100, 32, hd, device="cuda").to(torch.bfloat16)
    cfg = va.config_for(q.device, hd)
    plan = va.VarlenPlan.build([100], [600], cfg.block_m, q.device)
    used = -(-600 // bs)
    bt = torch.tensor([blocks[:used]], dtype=torch.int32, device="cuda")
    sl = torch.tensor([600], dtype=torch.int32, device="cuda")
    qsl = torch.tensor([0, 100], dtype=torch.int32, device="cuda")
    out = va.varlen_paged_attention(q, kc, vc, bt, sl, qsl, plan, hd ** -0.5)
    ref = va.reference(q, kc, vc, [blocks[:used]], [600], [100], hd ** -0.5)
    assert (out.float() - ref).abs().max().item() <= BOUNDS[torch.bfloat16]


def _greedy(model_dir, device: str, prefix: bool, chunk: int | None) -> list[list[int]]:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    prompts = ["The quick brown fox jumps over the lazy dog " * 6, "The quick brown fox jumps over a fence",
               "Paged attention over a block table", "x"]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    opts = {"max_num_batched_tokens": chunk} if chunk else {}
    with LLM(str(model_dir), dtype="float32", device=device, enable_prefix_caching=prefix,
             kv_cache_memory_gib=0.25, **opts) as llm:
        first = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        if prefix:  # the second round hits the prefix cache
            assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == first
        return first


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_gpu_greedy_equals_cpu_float32(tiny_model_dir, arch):
    d = tiny_model_dir(arch)
    cpu = _greedy(d, "cpu", False, None)
    for prefix, chunk in ((False, None), (True, None), (True, 16), (False, 24)):
        assert _greedy(d, "cuda", prefix, chunk) == cpu, (arch, prefix, chunk)


def _greedy_ids(model_dir, device: str, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Greedy outputs of token-id prompts submitted together, and the fresh_len of every prefill step's
    attention metadata (the batched-SDPA path when nonzero)."""
    from engine.layers import attention
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    seen = []
    real = attention.AttentionMetadata.build.__func__

    def spy(cls, seqs, block_size, device):
        meta = real(cls, seqs, block_size, device)
        if meta.num_decode_tokens < meta.num_tokens:
            seen.append(meta.fresh_len)
        return meta

    attention.AttentionMetadata.build = classmethod(spy)
    try:
        with LLM(str(model_dir), dtype="float32", device=device, enable_prefix_caching=False,
                 kv_cache_memory_gib=0.25) as llm:
            out = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    finally:
        attention.AttentionMetadata.build = classmethod(real)
    return [o.outputs[0].token_ids for o in out], seen


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fresh_prompts_of_one_length_as_one_sdpa_batch(tiny_model_dir, arch):
    rng = random.Random(arch)
    d = tiny_model_dir(arch)
    prompts = [[rng.randrange(10, 1000) for _ in range(37)] for _ in range(3)]
    gpu, steps = _greedy_ids(d, "cuda", prompts)
    assert steps == [37]  # the three prompts in one step, on the batched path
    assert gpu == _greedy_ids(d, "cpu", prompts)[0]
    ragged, steps = _greedy_ids(d, "cuda", [prompts[0], prompts[1][:20]])
    assert steps == [0] and ragged == [gpu[0], _greedy_ids(d, "cpu", [prompts[1][:20]])[0][0]]


def test_kv_cache_sized_by_profiling(tiny_model_dir):
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    with LLM(str(tiny_model_dir("llama")), dtype="bfloat16", device="cuda", max_num_batched_tokens=4096,
             gpu_memory_utilization=0.5) as llm:
        runner = llm.core.runner
        assert runner.activation_peak_bytes and runner.activation_peak_bytes > 0
        total = torch.cuda.mem_get_info()[1]
        kv = runner.num_blocks * runner.kv_bytes_per_block()
        assert kv <= 0.5 * total
        out = llm.generate(["hello " * 1000], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 2
