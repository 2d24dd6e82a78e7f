"""--kv-cache-dtype fp8 on the CPU, where only the torch references read an fp8 cache (the engine refuses fp8 there;
tests/gpu/test_fp8_kv_cache_cuda.py runs the CUDA kernels and the engine):

- the stored form (reference.to_cache / from_cache): fp32(x) / scale rounded to e4m3, saturated at +-448 x scale;
- the ops' CPU faces with fp8 caches (reshape_and_cache, rotary_and_cache, paged_decode_attention) against it;
- the Triton varlen kernel in Triton's interpreter with fp8 caches against the float32 reference over the
  dequantized caches (tests/support/varlen_cases.py run_fp8_case), TMA off for fp8;
- Attention.forward over fp8 caches: the SDPA path's gathered prefix is dequantized, decodes read it too;
- the option: its CLI flag and choices, the CPU refusal, the KV bytes per block halved.
"""

from __future__ import annotations

import argparse
import random

import pytest
import torch

from engine import ops
from engine.ops import reference
from engine.ops import varlen_attention as va

FP8 = torch.float8_e4m3fn

if torch.cuda.is_available():
    pytest.skip("CPU reference tests (tests/gpu covers CUDA)", allow_module_level=True)


def _scale(v: float) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float32)


def test_stored_values_round_trip_within_e4m3_precision():
    g = torch.Generator().manual_seed(0)
    scale = _scale(0.03)
    # magnitudes across e4m3's normal range (2^-6 .. 448) after the division by the scale
    mag = torch.exp2(torch.empty(4096).uniform_(-6, 8.7, generator=g)) * 0.03
    x = (mag * torch.where(torch.rand(4096, generator=g) < 0.5, -1.0, 1.0)).to(torch.bfloat16)
    back = reference.from_cache(reference.to_cache(x, FP8, scale), scale)
    rel = ((back - x.float()).abs() / x.float().abs()).max().item()
    assert 0 < rel <= 2 ** -4 + 1e-6  # 3 mantissa bits: half a unit in the last place
    # the same, compared with torch's own rounding of the divided value
    assert torch.equal(reference.to_cache(x, FP8, scale), (x.float() / scale).to(FP8))


def test_saturation_at_448_times_the_scale():
    scale = _scale(0.5)
    x = torch.tensor([1e6, -1e6, 300.0, 224.0, -250.0, float("nan"), 0.0])
    got = reference.from_cache(reference.to_cache(x, FP8, scale), scale)
    assert got[:2].tolist() == [224.0, -224.0]  # 448 x 0.5, not NaN as a plain conversion gives
    assert got[2].item() == 224.0 and got[3].item() == 224.0 and got[4].item() == -224.0
    assert got[5].isnan() and got[6].item() == 0.0
    # a cache in the model's dtype stores the values as they are
    assert torch.equal(reference.to_cache(x[2:5].bfloat16(), torch.bfloat16), x[2:5].bfloat16())


def _caches(num_blocks=6, bs=4, nkv=2, hd=16, dtype=FP8):
    return (torch.zeros(num_blocks, bs, nkv, hd, dtype=dtype), torch.zeros(num_blocks, bs, nkv, hd, dtype=dtype))


def test_reshape_and_cache_writes_the_stored_form():
    g = torch.Generator().manual_seed(1)
    k = torch.randn(5, 2, 16, generator=g).bfloat16()
    v = torch.randn(5, 2, 16, generator=g).bfloat16()
    ks, vs = _scale(0.05), _scale(0.01)
    kc, vc = _caches()
    slots = torch.tensor([3, 9, -1, 0, 22])
    ops.reshape_and_cache(k, v, kc, vc, slots, ks, vs)
    flat_k, flat_v = kc.view(-1, 2, 16), vc.view(-1, 2, 16)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        assert torch.equal(flat_k[s].view(torch.uint8), reference.to_cache(k[t], FP8, ks).view(torch.uint8))
        assert torch.equal(flat_v[s].view(torch.uint8), reference.to_cache(v[t], FP8, vs).view(torch.uint8))
    assert flat_k[[1, 2, 4, 5]].float().abs().sum() == 0  # nothing else written (the skipped token included)
    with pytest.raises(ValueError, match="k_scale"):
        ops.reshape_and_cache(k, v, kc, vc, slots)
    with pytest.raises(ValueError, match="v_scale"):
        ops.reshape_and_cache(k, v, kc, vc, slots, ks, torch.tensor([1.0, 2.0]))


def test_rotary_and_cache_writes_the_rotated_keys_in_fp8():
    g = torch.Generator().manual_seed(2)
    T, nh, nkv, hd = 3, 4, 2, 16
    q = torch.randn(T, nh * hd, generator=g).bfloat16()
    k = torch.randn(T, nkv * hd, generator=g).bfloat16()
    v = torch.randn(T, nkv * hd, generator=g).bfloat16()
    pos = torch.tensor([0, 5, 7])
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    f = torch.arange(16).float()[:, None] * inv[None, :]
    cos_sin = torch.cat([f.cos(), f.sin()], dim=-1).contiguous()
    q_ref, k_ref = q.clone(), k.clone()
    reference.rotary_embedding(pos, q_ref, k_ref, hd, cos_sin, True)
    kc, vc = _caches(nkv=nkv, hd=hd)
    ks, vs = _scale(0.02), _scale(0.04)
    slots = torch.tensor([1, 2, 13])
    ops.rotary_and_cache(pos, q, k, v, kc, vc, slots, hd, cos_sin, True, ks, vs)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    got_k = kc.view(-1, nkv, hd)[slots]
    assert torch.equal(got_k.view(torch.uint8),
                       reference.to_cache(k_ref.view(T, nkv, hd), FP8, ks).view(torch.uint8))
    assert torch.equal(vc.view(-1, nkv, hd)[slots].view(torch.uint8),
                       reference.to_cache(v.view(T, nkv, hd), FP8, vs).view(torch.uint8))


def test_paged_decode_attention_reads_value_times_scale():
    g = torch.Generator().manual_seed(3)
    B, nh, nkv, hd, bs = 3, 8, 2, 32, 4
    ks, vs = _scale(0.02), _scale(0.05)
    kf = torch.randn(8, bs, nkv, hd, generator=g)
    vf = torch.randn(8, bs, nkv, hd, generator=g)
    kc, vc = reference.to_cache(kf, FP8, ks), reference.to_cache(vf, FP8, vs)
    q = torch.randn(B, nh, hd, generator=g).bfloat16()
    tables = torch.tensor([[5, 2, 7], [0, 1, 3], [6, 4, 0]], dtype=torch.int32)
    lens = torch.tensor([9, 1, 8], dtype=torch.int32)
    got = ops.paged_decode_attention(q, kc, vc, tables, lens, hd ** -0.5, k_scale=ks, v_scale=vs)
    # the float path over the dequantized caches
    want = ops.paged_decode_attention(q.float(), reference.from_cache(kc, ks), reference.from_cache(vc, vs), tables,
                                      lens, hd ** -0.5)
    assert (got.float() - want).abs().max().item() < 2e-2
    # and far from reading the stored values without their scales
    raw = ops.paged_decode_attention(q.float(), kc.float(), vc.float(), tables, lens, hd ** -0.5)
    assert (raw - want).abs().max().item() > 1.0
    with pytest.raises(ValueError, match="k_scale"):
        ops.paged_decode_attention(q, kc, vc, tables, lens, hd ** -0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_varlen_kernel_reads_fp8_caches(dtype):
    """The interpreter's kernel over fp8 caches (NaN outside the contexts) against the float32 reference over the
    same stored values times their scales: decodes, fresh chunks, partial-block and multi-block prefixes, GQA."""
    from tests.support.varlen_cases import run_fp8_case

    rng = random.Random(50 + {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype])
    for nh, nkv in ((4, 4), (8, 2)):
        hd = rng.choice([16, 32])
        seqs = [(1, rng.randrange(1, 40)), (1, 0), (rng.randrange(2, 40), 0), (rng.randrange(2, 30), 21)]
        run_fp8_case(rng, nh, nkv, hd, seqs, dtype)


def test_varlen_kernel_fp8_resume_and_no_tma():
    """The merge over a cached prefix (cuDNN's state in out / lse) with fp8 prefixes, and a TMA configuration,
    which fp8 caches run with pointer loads (tma_descriptors gives none for them)."""
    from tests.support.varlen_cases import make_case, run_fp8_case

    rng = random.Random(9)
    run_fp8_case(rng, 4, 2, 32, [(20, 16), (9, 37)], torch.bfloat16, resume=True)
    cfg = va.KernelConfig(16, 16, 1, 1, tma=True)
    kc, vc = _caches(4, 16, 2, 32)
    assert va.tma_descriptors(kc, vc, cfg, 32) is None
    assert va.tma_descriptors(kc.float(), vc.float(), cfg, 32) is not None
    run_fp8_case(rng, 4, 2, 32, [(1, 70), (37, 0), (20, 48)], torch.bfloat16, config=cfg)
    (q, kcs, vcs, bt, sl, qsl), (_, ctxs, qlens) = make_case(rng, 4, 2, 32, [(3, 5)], torch.bfloat16)
    plan = va.VarlenPlan.build(qlens, ctxs, 16, q.device)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        va.varlen_paged_attention(q, kcs.to(FP8), vcs.to(FP8), bt, sl, qsl, plan, 0.1,
                                  config=va.config_for(q.device, 32))


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_attention_layer_over_fp8_caches(monkeypatch, backend):
    """Attention.forward with fp8 caches: a fresh prompt (its own keys), a chunk over the cached prefix (SDPA on
    the gathered, dequantized prefix; or the Triton kernel) beside a decode (the decode op on the fp8 cache),
    each against the float32 reference over the dequantized cache."""
    from engine.layers.attention import Attention, AttentionMetadata, SeqSpan, select_backend

    g = torch.Generator().manual_seed(4)
    nh, nkv, hd, bs = 4, 2, 32, 16
    layer = Attention(nh, nkv, hd, 0)
    layer.backend = select_backend(backend, torch.device("cpu"), hd)  # the model's, as the runner binds it
    layer.k_cache, layer.v_cache = _caches(8, bs, nkv, hd)
    layer.k_scale, layer.v_scale = _scale(0.05), _scale(0.03)
    layer.compute_dtype = torch.bfloat16

    def step(seqs):
        T = sum(s.query_len for s in seqs)
        q = torch.randn(T, nh * hd, generator=g).bfloat16()
        k = torch.randn(T, nkv * hd, generator=g).bfloat16()
        v = torch.randn(T, nkv * hd, generator=g).bfloat16()
        meta = AttentionMetadata.build(seqs, bs, torch.device("cpu"))
        out = layer.forward(q, k, v, meta).view(T, nh, hd)
        ref = va.reference(q.view(T, nh, hd), layer.k_cache, layer.v_cache, [list(s.block_ids) for s in seqs],
                           [s.context_len for s in seqs], [s.query_len for s in seqs], layer.scale,
                           layer.k_scale, layer.v_scale)
        return out, ref

    out, _ = step([SeqSpan(0, 20, 20, (3, 5))])  # fresh: attends to its own (unrounded) keys
    assert not out.isnan().any()
    step([SeqSpan(0, 5, 5, (1,))])  # a second sequence's prompt
    out, ref = step([SeqSpan(0, 1, 6, (1,)), SeqSpan(1, 7, 27, (3, 5))])  # a decode, then a chunk over the prefix
    assert (out.float() - ref).abs().max().item() < 3e-2


def test_the_option_and_its_refusal_on_the_cpu():
    from engine.config import KV_CACHE_DTYPES, EngineConfig
    from engine.errors import KestrelError
    from engine.runner.load_checks import resolve_kv_cache_dtype
    from engine.runner.model_runner import ModelRunner

    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    assert EngineConfig.from_cli_args(parser.parse_args(["--kv-cache-dtype", "fp8"])).kv_cache_dtype == "fp8"
    assert EngineConfig().kv_cache_dtype == "auto" and KV_CACHE_DTYPES == ("auto", "fp8")
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int8"])
    cpu = torch.device("cpu")
    assert resolve_kv_cache_dtype("auto", cpu, torch.bfloat16) == torch.bfloat16
    with pytest.raises(KestrelError, match="fp8 KV cache needs a GPU; the CPU keeps the KV cache in the model dtype"):
        resolve_kv_cache_dtype("fp8", cpu, torch.float32)
    with pytest.raises(KestrelError, match="fp8 KV cache needs a GPU"):  # at load, before the weights
        ModelRunner(EngineConfig(device="cpu", kv_cache_dtype="fp8"), None, None, 64)
    # the KV bytes of a block: one byte an element for fp8, so twice the blocks fit in the same memory
    runner = ModelRunner.__new__(ModelRunner)
    runner.block_size = 64
    runner.kv_cache_dtype = torch.bfloat16
    bf16 = runner._kv_bytes(32, 8, 128)
    runner.kv_cache_dtype = FP8
    assert bf16 == 2 * runner._kv_bytes(32, 8, 128) == 2 * 2 * 32 * 64 * 8 * 128


def test_scales_set_by_the_first_step_with_a_prefill():
    """A fresh allocation's scales (1.0, calibrate_scales) are set by the first step with a prefill, before its
    write: amax / FP8_SCALE_TARGET of its keys and values; a decode-only step before it leaves them alone."""
    from engine.layers import attention
    from engine.layers.attention import Attention, AttentionMetadata, SeqSpan

    g = torch.Generator().manual_seed(5)
    nh, nkv, hd, bs = 4, 2, 32, 16
    layer = Attention(nh, nkv, hd, 0)
    layer.k_cache, layer.v_cache = _caches(4, bs, nkv, hd)
    layer.k_scale, layer.v_scale = _scale(1.0), _scale(1.0)
    layer.calibrate_scales = True

    def run(seqs, mag):
        T = sum(s.query_len for s in seqs)
        q = torch.randn(T, nh * hd, generator=g).bfloat16()
        k = (torch.randn(T, nkv * hd, generator=g) * mag).bfloat16()
        v = (torch.randn(T, nkv * hd, generator=g) * mag / 10).bfloat16()
        layer.forward(q, k, v, AttentionMetadata.build(seqs, bs, torch.device("cpu")))
        return k, v

    run([SeqSpan(0, 1, 1, (0,))], 50.0)  # a decode
    assert layer.calibrate_scales and layer.k_scale.item() == 1.0
    k, v = run([SeqSpan(0, 9, 9, (1,))], 30.0)
    assert not layer.calibrate_scales
    assert layer.k_scale.item() == pytest.approx(k.float().abs().max().item() / attention.FP8_SCALE_TARGET)
    assert layer.v_scale.item() == pytest.approx(v.float().abs().max().item() / attention.FP8_SCALE_TARGET)
    stored = reference.from_cache(layer.k_cache[1, :9], layer.k_scale)
    tol = k.float().abs().view(9, nkv, hd) / 16 + layer.k_scale.item() * 2 ** -9  # e4m3: 3 bits, subnormals
    assert ((stored - k.float().view(9, nkv, hd)).abs() <= tol).all()
    before = layer.k_scale.clone()
    run([SeqSpan(0, 5, 5, (2,))], 300.0)  # later prompts keep the scales
    assert torch.equal(layer.k_scale, before)
