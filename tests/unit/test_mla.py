"""Multi-head latent attention's parts (engine/layers/mla.py) against references: YaRN frequencies and scales and
the rope layouts against transformers' DeepSeek code, the absorbed decode and the expanded prefill over the paged
latent cache against a direct float64 attention of the expanded keys and values, and the KV bytes per token of the
DeepSeek-V2-Lite shape (the latent cache against full keys and values)."""

from __future__ import annotations

import pytest
import torch

from engine.config import ModelConfig
from engine.layers.attention import AttentionMetadata, SeqSpan
from engine.layers.mla import LatentAttention, LatentRope, rope_frequencies, softmax_scale
from engine.runner.kv_sizing import kv_bytes

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.8,
        "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}


def _v3_config(rope_parameters: dict, **kw):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(hidden_size=64, num_attention_heads=4, qk_rope_head_dim=16, qk_nope_head_dim=32,
                            max_position_embeddings=163840, rope_parameters=rope_parameters, **kw)


@pytest.mark.parametrize("rope", [YARN, {"rope_type": "default", "rope_theta": 10000.0}])
def test_frequencies_and_scales_match_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, yarn_apply_mscale
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    config = _v3_config(dict(rope))
    ref = DeepseekV3RotaryEmbedding(config)
    if rope["rope_type"] == "yarn":
        inv_ref, factor_ref = ROPE_INIT_FUNCTIONS["yarn"](config)
        torch.testing.assert_close(ref.inv_freq, inv_ref)
    scaling = None if rope["rope_type"] == "default" else dict(rope)
    inv, factor = rope_frequencies(16, 10000.0, scaling, config.max_position_embeddings)
    torch.testing.assert_close(inv, ref.inv_freq, atol=0, rtol=1e-6)
    assert factor == pytest.approx(ref.attention_scaling, rel=1e-12)
    assert softmax_scale(48, scaling) == pytest.approx(yarn_apply_mscale(config.rope_parameters, 48 ** -0.5),
                                                       rel=1e-12)
    if scaling:  # both differ from the plain values here (mscale != mscale_all_dim)
        assert factor != 1.0 and softmax_scale(48, scaling) != 48 ** -0.5


@pytest.mark.parametrize("interleave", [True, False])
def test_rope_matches_transformers_v3(interleave):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds3

    config = _v3_config(dict(YARN), rope_interleave=interleave)
    T, H = 9, 3
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(T, H, 16, generator=g), torch.randn(T, 16, generator=g)
    positions = torch.tensor([0, 1, 2, 5, 17, 100, 4095, 4096, 30000])
    cos, sin = ds3.DeepseekV3RotaryEmbedding(config)(q, positions[None])
    apply = ds3.apply_rotary_pos_emb_interleave if interleave else ds3.apply_rotary_pos_emb
    q_ref, k_ref = apply(q.transpose(0, 1)[None], k[None, None], cos, sin)  # [1, heads, T, dim]
    rope = LatentRope(16, 10000.0, dict(YARN), config.max_position_embeddings, interleave)
    torch.testing.assert_close(rope(positions, q), q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rope(positions, k), k_ref[0, 0], atol=1e-5, rtol=1e-5)


def test_rope_scores_match_transformers_v2():
    """V2's complex product keeps each rotated pair in place, ours lays the halves side by side: the same q . k."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as ds2

    config = DeepseekV2Config(hidden_size=64, num_attention_heads=4, qk_rope_head_dim=16, qk_nope_head_dim=32,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    T, H = 7, 2
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(T, H, 16, generator=g), torch.randn(T, 16, generator=g)
    positions = torch.tensor([0, 3, 4, 9, 64, 511, 2000])
    freqs = ds2.DeepseekV2RotaryEmbedding(config)(q, positions[None])
    q_ref, k_ref = ds2.apply_rotary_emb(q.transpose(0, 1)[None], k[None, None], freqs)
    rope = LatentRope(16, 10000.0, None, 2048, interleaved=True)
    ours = torch.einsum("thd,sd->hts", rope(positions, q), rope(positions, k))
    torch.testing.assert_close(ours, torch.einsum("htd,sd->hts", q_ref[0], k_ref[0, 0]), atol=1e-5, rtol=1e-5)


H, L, DN, R, DV, BS = 3, 16, 8, 4, 6, 4


def _layer(seed: int = 0) -> LatentAttention:
    g = torch.Generator().manual_seed(seed)
    attn = LatentAttention(H, L, DN, R, DV, scale=0.3, layer_index=0, dtype=torch.float32)
    attn.kv_b_weight.data.copy_(torch.randn(attn.kv_b_weight.shape, generator=g) * 0.5)
    attn.k_cache = torch.full((12, BS, 1, L + R), float("nan"))  # never-written slots must never be read
    return attn


def _reference(attn: LatentAttention, q_nope, q_pe, latent, k_pe, n_query: int) -> torch.Tensor:
    """The last n_query tokens' attention over all of them (causal), expanded, in float64."""
    w = attn.kv_b_weight.double().view(H, DN + DV, L)
    k_nope = torch.einsum("tl,hdl->thd", latent.double(), w[:, :DN])
    v = torch.einsum("tl,hdl->thd", latent.double(), w[:, DN:])
    T = latent.shape[0]
    keys = torch.cat([k_nope, k_pe.double()[:, None].expand(T, H, R)], -1)
    q = torch.cat([q_nope, q_pe], -1).double()[T - n_query:]
    scores = torch.einsum("qhd,khd->hqk", q, keys) * attn.scale
    mask = torch.arange(T)[None, :] > torch.arange(T - n_query, T)[:, None]
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).reshape(n_query, H * DV).float()


def _inputs(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, H, DN, generator=g), torch.randn(T, H, R, generator=g), torch.randn(T, L, generator=g),
            torch.randn(T, R, generator=g))


def test_chunks_and_decodes_over_the_paged_latents_match_the_expanded_reference():
    """Sequence A: a chunk of 7 (fresh), then a chunk of 3 over it (chunked prefill: the prefix read back from the
    cache), then a decode (absorbed) in the same step as sequence B's first chunk; blocks out of order."""
    attn = _layer()
    a_blocks, b_blocks = (7, 2, 9), (4, 0)
    qa, pa, la, ka = _inputs(11, seed=1)
    qb, pb, lb, kb = _inputs(6, seed=2)

    def step(seqs, rows):
        """One step: the sequences' spans and, per sequence, its (q_nope, q_pe, latent, k_pe) rows."""
        meta = AttentionMetadata.build(seqs, BS, torch.device("cpu"))
        return attn(*[torch.cat(parts) for parts in zip(*rows)], meta)

    out = step([SeqSpan(0, 7, 7, a_blocks[:2])], [(qa[:7], pa[:7], la[:7], ka[:7])])
    torch.testing.assert_close(out, _reference(attn, qa[:7], pa[:7], la[:7], ka[:7], 7), atol=1e-5, rtol=1e-5)
    out = step([SeqSpan(0, 3, 10, a_blocks)], [(qa[7:10], pa[7:10], la[7:10], ka[7:10])])
    torch.testing.assert_close(out, _reference(attn, qa[:10], pa[:10], la[:10], ka[:10], 3), atol=1e-5, rtol=1e-5)
    out = step([SeqSpan(0, 1, 11, a_blocks), SeqSpan(1, 6, 6, b_blocks)],
               [(qa[10:], pa[10:], la[10:], ka[10:]), (qb, pb, lb, kb)])
    torch.testing.assert_close(out[:1], _reference(attn, qa, pa, la, ka, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1:], _reference(attn, qb, pb, lb, kb, 6), atol=1e-5, rtol=1e-5)
    # the cache holds exactly [latent, k_pe] per token, where the block table puts it
    flat = attn.k_cache.view(-1, L + R)
    slots = [a_blocks[p // BS] * BS + p % BS for p in range(11)]
    torch.testing.assert_close(flat[slots], torch.cat([la, ka], -1))


def test_padded_decode_rows_write_nothing():
    """The decode buckets' padded rows (slot -1, context 0, no SeqSpan) leave the cache alone and stay finite."""
    attn = _layer(seed=3)
    q, p, lat, k = _inputs(5, seed=4)
    attn(q[:4], p[:4], lat[:4], k[:4], AttentionMetadata.build([SeqSpan(0, 4, 4, (5,))], BS, torch.device("cpu")))
    before = attn.k_cache.clone()
    table = torch.tensor([[5, 6], [0, 0]], dtype=torch.int32)
    lens = torch.tensor([5, 0], dtype=torch.int32)
    meta = AttentionMetadata(positions=torch.tensor([4, 0]), slot_mapping=torch.tensor([6 * BS, -1]),
                             num_decode_tokens=2, seqs=[], block_tables=table, seq_lens=lens, query_start_loc=None,
                             decode_block_tables=table, decode_context_lens=lens)
    pad = torch.zeros(1, L + R)
    out = attn(torch.cat([q[4:], q[:1]]), torch.cat([p[4:], p[:1]]), torch.cat([lat[4:], pad[:, :L]]),
               torch.cat([k[4:], pad[:, L:]]), meta)
    torch.testing.assert_close(out[:1], _reference(attn, q, p, lat, k, 1), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()
    changed = ~((attn.k_cache == before) | (attn.k_cache.isnan() & before.isnan())).all(-1).view(-1)
    assert changed.nonzero().view(-1).tolist() == [6 * BS]


def test_kv_bytes_per_token_deepseek_v2_lite():
    """DeepSeek-V2-Lite (27 layers, 16 heads, kv_lora_rank 512, rope 64, nope 128, v 128), bfloat16: the latent
    cache holds 576 values per token and layer, 1,152 bytes; full keys (192 per head) and values (128 per head)
    would be 10,240: 8.9x the memory per token."""
    cfg = ModelConfig.from_hf({
        "architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 102400, "hidden_size": 2048,
        "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "topk_method": "greedy",
        "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}})
    tensors, heads, width = cfg.kv_cache_layout
    assert (tensors, heads, width) == (1, 1, 576)
    latent = kv_bytes(cfg.num_hidden_layers, heads, width, 1, torch.bfloat16, tensors)
    per_head_k, per_head_v = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
    expanded = cfg.num_hidden_layers * cfg.num_attention_heads * (per_head_k + per_head_v) * 2
    assert latent == 27 * 1152 == 31_104
    assert expanded == 27 * 10_240 == 276_480
    assert round(expanded / latent, 1) == 8.9
