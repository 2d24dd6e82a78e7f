"""DeepSeek-V2 / V3 (engine/models/deepseek.py: multi-head latent attention over a paged latent cache, shared and
routed experts) against transformers, and the latent cache under the scheduler's prefix caching, chunked prefill
and preemption against the plain path.

Tiny random configs written with transformers, float32 on the CPU: V2 without q_lora_rank (q_proj directly, as
V2-Lite), group_limited_greedy routing with routed scaling; V3 with q_lora_rank, YaRN rope (mscale != mscale_all_dim:
the rope factor and the softmax scale both differ from 1), noaux_tc routing with a correction bias and norm_topk_prob;
a V3 with rope_interleave off. One dense layer first (first_k_dense_replace), then MoE layers. The router weights are
drawn larger than the rest so that no two experts' scores sit within rounding of each other (a near-tie would make
the choice depend on the last bit of the logits).
"""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=8, min_tokens=8, temperature=0)
TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_group=4, topk_group=2, max_position_embeddings=2048,
            bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.8,
        "original_max_position_embeddings": 512}
VARIANTS = {
    "v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
           dict(q_lora_rank=None, topk_method="group_limited_greedy", routed_scaling_factor=1.5)),
    "v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
           dict(q_lora_rank=24, norm_topk_prob=True, routed_scaling_factor=2.5, rope_parameters=YARN)),
    "v3-halves": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                  dict(q_lora_rank=24, rope_interleave=False, norm_topk_prob=False)),
}


def _build(variant: str):
    import transformers

    cfg_cls, model_cls, extra = VARIANTS[variant]
    config = getattr(transformers, cfg_cls)(**TINY, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(list(VARIANTS).index(variant) + 11)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "inv_freq" in name:
                continue
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("gate.weight"):  # the routers: well-separated expert scores
                p.copy_(0.5 * noise)
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.05 * noise)
    return model


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory, smollm2_tokenizer_dir):
    """``deepseek(variant) -> (directory, transformers model)``, saved once per module."""
    made: dict[str, tuple] = {}

    def make(variant: str):
        if variant not in made:
            model = _build(variant)
            dest = tmp_path_factory.mktemp("deepseek") / variant
            model.save_pretrained(str(dest))
            for f in smollm2_tokenizer_dir.iterdir():
                shutil.copy(f, dest / f.name)
            made[variant] = (dest, model)
        return made[variant]

    return make


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_and_greedy_match_transformers(variant, deepseek):
    path, hf = deepseek(variant)
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02)
    ids = torch.randint(3, 49152, (37,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
        ref_tokens = hf.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    # every prompt position (the expanded prefill), then 8 decodes (the absorbed form) against transformers'
    torch.testing.assert_close(llm.core.score(ids), ref, atol=1e-4, rtol=1e-4)
    out = llm.generate([ids], GREEDY)[0].outputs[0].token_ids
    assert out == ref_tokens[0, len(ids):].tolist()


def test_latent_cache_holds_one_row_per_token(deepseek):
    """The cache is the latent (kv_lora_rank) plus the rope key (qk_rope_head_dim) per token and layer, one tensor,
    and the KV sizing counts exactly that."""
    path, _ = deepseek("v2")
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02)
    runner = llm.core.runner
    attn = runner.model.attention_layers()[0]
    assert attn.v_cache is None
    assert attn.k_cache.shape[1:] == (runner.block_size, 1, 32 + 8)
    assert runner.kv_bytes_per_block() == 3 * runner.block_size * (32 + 8) * 4
    assert llm.core.blocks.num_blocks == int(0.02 * 2**30) // runner.kv_bytes_per_block()


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(rng.randint(2, 70))] for _ in range(n)]


@pytest.fixture(scope="module")
def plain(deepseek):
    """The V3 engine without a prefix cache, each prompt run alone: the reference of the scheduling tests."""
    path, _ = deepseek("v3")
    return LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02, enable_prefix_caching=False)


def _alone(llm, prompts) -> list[list[int]]:
    return [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]


@pytest.fixture(scope="module")
def solo(plain):
    prompts = _prompts(6, seed=3)
    return prompts, _alone(plain, prompts)


def _assert_idle(llm):
    assert not llm.core.has_unfinished()
    assert llm.core.blocks.num_free_blocks == llm.core.blocks.num_blocks


def test_batched_chunked_prefill_equals_solo(deepseek, solo):
    prompts, ref = solo
    path, _ = deepseek("v3")
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02, max_num_batched_tokens=40)
    outs = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == ref
    _assert_idle(llm)


def test_prefix_cache_hits_equal_the_plain_path(deepseek, plain):
    path, _ = deepseek("v3")
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02)
    shared = list(range(100, 150))  # 50 tokens: three full blocks of 16
    prompts = [shared + p for p in _prompts(3, seed=5)]
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    hits = llm.core.blocks.prefix_hits
    again = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == first == _alone(plain, prompts)
    assert all(o.num_cached_tokens >= 48 for o in again) and llm.core.blocks.prefix_hits > hits
    _assert_idle(llm)


def test_padded_decode_buckets_equal_solo(deepseek, solo):
    """The decode graphs' path run eagerly (what a GPU captures): static buffers, block tables of the full context
    width, padding rows with slot -1 and context 0 and no SeqSpan; the same tokens."""
    prompts, ref = solo
    path, _ = deepseek("v3")
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02, enable_prefix_caching=False, max_num_seqs=8)
    runner = llm.core.runner
    runner.tapes = None
    runner.graph_sizes = [1, 2, 4, 8]
    runner.capture_decode_graphs(capture=False)
    buckets = []
    real = runner.graphs.run

    def counted(*a, **k):
        out = real(*a, **k)
        buckets.append(out is not None)
        return out

    runner.graphs.run = counted
    outs = llm.generate(prompts[:3], GREEDY)  # 3 sequences: the bucket of 4 has a padding row
    assert buckets and all(buckets)
    assert [o.outputs[0].token_ids for o in outs] == ref[:3]


def test_preemption_equals_solo(deepseek, solo):
    prompts, ref = solo
    path, _ = deepseek("v3")
    small = LLM(str(path), dtype="float32", num_kv_blocks=12, enable_prefix_caching=False)
    outs = small.generate(prompts, GREEDY)
    assert small.core.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == ref
    _assert_idle(small)


@pytest.mark.timeout(900)
def test_tp2_equals_tp1(deepseek, solo):
    """Heads split over two ranks (q / q_b / kv_b rows, o_proj columns), the latent cache replicated on each, the
    experts split like the dense MLP: the same greedy tokens as one rank."""
    prompts, ref = solo
    path, _ = deepseek("v3")
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.02, tensor_parallel_size=2, comm_strategy="host")
    assert llm.core.runner.tp.size == 2 and llm.core.runner.model.layers[0].self_attn.num_heads == 2
    outs = llm.generate(prompts[:4], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == ref[:4]
