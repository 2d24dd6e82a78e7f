"""engine/layers/moe.py and engine/ops/fused_moe.py on fresh random inputs: the routing against transformers' own
routers (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 greedy and group-limited, DeepSeek-V3 with its correction bias),
ties included; FusedMoE's CPU path against a plain torch loop and against transformers' MixtralExperts, at one row
(decode) and many, with experts that get no token; the tensor-parallel split (each rank a slice of every expert:
the partial sums add up to the whole); the Triton grouped kernels (under the interpreter here) against the loop."""

from __future__ import annotations

import importlib

import pytest
import torch
import transformers

from engine.config import ModelConfig
from engine.layers.moe import GROUP_BEST, GROUP_TOP2_SUM, FusedMoE, Routing, select_experts, sort_by_expert
from engine.ops import fused_moe as fm
from engine.parallel.context import TPContext

H = 32


def _router(cls_name: str, module: str, **cfg):
    """transformers' router of the family, with a fresh random weight [E, H] (float32)."""
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config = getattr(transformers, cls_name)(hidden_size=H, num_hidden_layers=1, num_attention_heads=4,
                                             num_key_value_heads=4, vocab_size=64, **cfg)
    router = next(getattr(mod, n) for n in dir(mod) if n.endswith(("TopKRouter", "TopkRouter")))(config)
    torch.nn.init.normal_(router.weight, std=0.5)
    return router.float().eval()


ROUTERS = {  # name -> (transformers config class, module, config, our Routing)
    "mixtral": ("MixtralConfig", "mixtral", dict(num_local_experts=8, num_experts_per_tok=2),
                Routing(top_k=2, renormalize=True)),
    "qwen2_moe": ("Qwen2MoeConfig", "qwen2_moe", dict(num_experts=8, num_experts_per_tok=3, norm_topk_prob=False),
                  Routing(top_k=3)),
    "qwen3_moe": ("Qwen3MoeConfig", "qwen3_moe", dict(num_experts=16, num_experts_per_tok=4, norm_topk_prob=True),
                  Routing(top_k=4, renormalize=True)),
    "deepseek_v2_greedy": ("DeepseekV2Config", "deepseek_v2",
                           dict(n_routed_experts=8, num_experts_per_tok=3, topk_method="greedy",
                                routed_scaling_factor=1.5),
                           Routing(top_k=3, routed_scaling_factor=1.5, sorted=False, logits_fp32=True)),
    "deepseek_v2_group": ("DeepseekV2Config", "deepseek_v2",
                          dict(n_routed_experts=16, num_experts_per_tok=3, topk_method="group_limited_greedy",
                               n_group=4, topk_group=2, routed_scaling_factor=16.0),
                          Routing(top_k=3, group_score=GROUP_BEST, n_group=4, topk_group=2,
                                  routed_scaling_factor=16.0, sorted=False, logits_fp32=True)),
    "deepseek_v3": ("DeepseekV3Config", "deepseek_v3",
                    dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True,
                         routed_scaling_factor=2.5),
                    Routing(top_k=4, scoring="sigmoid", renormalize=True, group_score=GROUP_TOP2_SUM, n_group=4,
                            topk_group=2, routed_scaling_factor=2.5, sorted=False, logits_fp32=True)),
}


def _ours(name, router, x):
    routing = ROUTERS[name][3]
    bias = getattr(router, "e_score_correction_bias", None)
    return select_experts(torch.nn.functional.linear(x, router.weight), routing, bias)


def _same(a_w, a_ids, b_w, b_ids):
    assert torch.equal(a_ids, b_ids)
    torch.testing.assert_close(a_w.float(), b_w.float(), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(ROUTERS))
def test_routing_equals_transformers(name):
    cls, module, cfg, _ = ROUTERS[name]
    router = _router(cls, module, **cfg)
    if name == "deepseek_v3":  # a bias that changes the choice (and not the weights: those are the raw scores)
        router.e_score_correction_bias.copy_(torch.randn(router.e_score_correction_bias.shape) * 0.3)
    x = torch.randn(40, H)
    with torch.no_grad():
        _, ref_w, ref_ids = router(x)
    w, ids = _ours(name, router, x)
    _same(w, ids, ref_w, ref_ids)


@pytest.mark.parametrize("name", list(ROUTERS))
def test_ties_break_as_transformers(name):
    """Experts with identical router rows score exactly alike: the pick among them is torch.topk's, as in
    transformers (and for DeepSeek whole groups tie)."""
    cls, module, cfg, _ = ROUTERS[name]
    router = _router(cls, module, **cfg)
    E = router.weight.shape[0]
    with torch.no_grad():
        router.weight[1::2] = router.weight[0::2]  # pairs (0, 1), (2, 3), ... tie
        router.weight[E // 2:] = router.weight[:E // 2]  # and the two halves (DeepSeek: groups tie too)
    x = torch.randn(24, H)
    with torch.no_grad():
        _, ref_w, ref_ids = router(x)
    w, ids = _ours(name, router, x)
    _same(w, ids, ref_w, ref_ids)
    T, k = ids.shape
    assert int((w.unsqueeze(2) == w.unsqueeze(1)).sum()) > T * k  # tied experts were among the chosen


def test_group_limits_and_bias():
    """DeepSeek-V3's rule directly: only experts of the topk_group best groups (by the sum of their two best biased
    scores) are chosen, a large bias wins an expert its place, and the weights are the unbiased scores."""
    routing = Routing(top_k=3, scoring="sigmoid", renormalize=False, group_score=GROUP_TOP2_SUM, n_group=4,
                      topk_group=1)
    logits = torch.randn(16, 16)
    bias = torch.zeros(16)
    bias[13] = 10.0  # group 3 wins for every token, and expert 13 in it
    w, ids = select_experts(logits, routing, bias)
    assert ((ids // 4) == 3).all() and (ids == 13).any(dim=1).all()
    torch.testing.assert_close(w, logits.sigmoid().gather(1, ids))
    v2 = Routing(top_k=2, group_score=GROUP_BEST, n_group=4, topk_group=2)
    w, ids = select_experts(logits, v2)
    best_groups = torch.softmax(logits, -1).view(16, 4, 4).max(-1).values.topk(2, -1).indices
    assert all(set((ids[t] // 4).tolist()) <= set(best_groups[t].tolist()) for t in range(16))


def test_routing_from_config():
    def cfg(**kw):
        base = dict(architecture="Qwen3MoeForCausalLM", vocab_size=8, hidden_size=8, intermediate_size=8,
                    num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=8, num_experts=8,
                    num_experts_per_tok=2)
        base.update(kw)
        return ModelConfig(**base)

    assert Routing.from_config(cfg(norm_topk_prob=True)) == Routing(top_k=2, renormalize=True)
    v2 = Routing.from_config(cfg(architecture="DeepseekV2ForCausalLM", norm_topk_prob=True,
                                 topk_method="group_limited_greedy", n_group=4, topk_group=2))
    assert (v2.group_score, v2.renormalize, v2.sorted, v2.logits_fp32) == (GROUP_BEST, False, False, True)
    v3 = Routing.from_config(cfg(architecture="DeepseekV3ForCausalLM", norm_topk_prob=True, n_group=4))
    assert (v3.scoring, v3.group_score, v3.renormalize) == ("sigmoid", GROUP_TOP2_SUM, True)


def test_moe_config_fields_and_sparse_layers():
    """ModelConfig from the config.json of each family (as real checkpoints and transformers 5 write them)."""
    base = dict(vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=6, num_attention_heads=2)
    mixtral = ModelConfig.from_hf({**base, "architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
                                   "num_experts_per_tok": 2})
    assert (mixtral.num_experts, mixtral.moe_intermediate_size, mixtral.norm_topk_prob) == (8, 16, True)
    assert all(mixtral.is_moe_layer(i) for i in range(6))
    qwen2 = ModelConfig.from_hf({**base, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4,
                                 "num_experts_per_tok": 2, "moe_intermediate_size": 4, "decoder_sparse_step": 2,
                                 "mlp_only_layers": [3], "shared_expert_intermediate_size": 12,
                                 "router_aux_loss_coef": 0.001})
    assert [qwen2.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    assert qwen2.attention_bias and qwen2.shared_expert_intermediate_size == 12 and not qwen2.norm_topk_prob
    qwen3 = ModelConfig.from_hf({**base, "architectures": ["Qwen3MoeForCausalLM"], "num_local_experts": 4,
                                 "num_experts_per_tok": 2, "moe_intermediate_size": 4, "norm_topk_prob": True})
    assert qwen3.num_experts == 4 and qwen3.norm_topk_prob and qwen3.qk_norm and not qwen3.attention_bias
    deepseek = ModelConfig(architecture="DeepseekV2ForCausalLM", head_dim=4, num_key_value_heads=2, num_experts=4,
                           first_k_dense_replace=1, moe_layer_freq=2, **base)
    assert [deepseek.is_moe_layer(i) for i in range(6)] == [False, False, True, False, True, False]
    dense = ModelConfig.from_hf({**base, "architectures": ["Qwen3ForCausalLM"]})
    assert dense.num_experts == 0 and not any(dense.is_moe_layer(i) for i in range(6))


class _Weights:
    """A checkpoint of named tensors (the WeightSource calls FusedMoE.load makes)."""

    def __init__(self, tensors):
        self.tensors = tensors

    def get(self, name):
        return self.tensors[name]

    def get_slice(self, name, dim, start, stop):
        return self.tensors[name].narrow(dim, start, stop - start).contiguous()


def _experts(E, inter, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = {}
    for e in range(E):
        t[f"e{e}.gate"] = torch.randn(inter, H, generator=g) * 0.2
        t[f"e{e}.up"] = torch.randn(inter, H, generator=g) * 0.2
        t[f"e{e}.down"] = torch.randn(H, inter, generator=g) * 0.2
    return _Weights(t)


def _names(e):
    return f"e{e}.gate", f"e{e}.up", f"e{e}.down"


def _choices(T, E, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    return torch.rand(T, k, generator=g), ids


@pytest.mark.parametrize("T", [1, 2, 19])
def test_fused_moe_cpu_equals_the_loop_and_transformers(T):
    E, inter, k = 6, 24, 2
    src = _experts(E, inter)
    moe = FusedMoE(E, H, inter, torch.float32, TPContext())
    moe.load(src, _names)
    x = torch.randn(T, H)
    w, ids = _choices(T, E, k)
    out = moe(x, w, ids)
    torch.testing.assert_close(out, fm.fused_moe_reference(x, moe.w13, moe.w2, w, ids), atol=1e-5, rtol=1e-5)
    hf = importlib.import_module("transformers.models.mixtral.modeling_mixtral").MixtralExperts(
        transformers.MixtralConfig(hidden_size=H, intermediate_size=inter, num_local_experts=E))
    with torch.no_grad():
        hf.gate_up_proj.copy_(moe.w13)
        hf.down_proj.copy_(moe.w2)
        torch.testing.assert_close(out, hf(x, ids, w), atol=1e-6, rtol=1e-6)
    order, counts = sort_by_expert(ids, E)
    assert counts.sum() == T * k and torch.equal(ids.reshape(-1)[order], ids.reshape(-1).sort(stable=True).values)


@pytest.mark.parametrize("size", [2, 3])
def test_tensor_parallel_slices_add_up(size):
    E, inter, k, T = 4, 36, 2, 7
    src = _experts(E, inter, seed=3)
    full = FusedMoE(E, H, inter, torch.float32, TPContext())
    full.load(src, _names)
    x = torch.randn(T, H)
    w, ids = _choices(T, E, k, seed=4)
    parts = []
    for rank in range(size):
        moe = FusedMoE(E, H, inter, torch.float32, TPContext(rank=rank, size=size))
        moe.load(src, _names)
        assert moe.w13.shape == (E, 2 * inter // size, H) and moe.w2.shape == (E, H, inter // size)
        parts.append(moe(x, w, ids))
    torch.testing.assert_close(sum(parts), full(x, w, ids), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="not divisible"):
        FusedMoE(E, H, 11, torch.float32, TPContext(rank=0, size=size))


def test_quantized_experts_hook():
    """Experts in another form computed through expert_weight (here int8 groups, as GGUF blocks would be)."""
    from engine import ops

    E, inter = 3, 32
    moe = FusedMoE(E, H, inter, torch.float32, TPContext())
    moe.load(_experts(E, inter, seed=5), _names)
    x = torch.randn(5, H)
    w, ids = _choices(5, E, 2, seed=6)
    moe.quantized_experts = [(ops.Int8Weight.quantize(moe.w13[e].clone()), ops.Int8Weight.quantize(moe.w2[e].clone()))
                             for e in range(E)]
    w13 = torch.stack([q.dequantize() for q, _ in moe.quantized_experts])
    w2 = torch.stack([q.dequantize() for _, q in moe.quantized_experts])
    assert not torch.equal(w13, moe.w13)  # (the int8 weights differ from the float ones)
    moe.drop_float()
    assert moe.w13.numel() == 0
    torch.testing.assert_close(moe(x, w, ids), fm.fused_moe_reference(x, w13, w2, w, ids), atol=1e-5, rtol=1e-5)


def test_align_block_size():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2]])
    rows, block_expert = fm.align_block_size(ids, 5, block_m=4)
    n = ids.numel()
    assert rows.numel() == block_expert.numel() * 4 >= n + 5 * 3
    for b, e in enumerate(block_expert.tolist()):
        blk = rows[4 * b:4 * b + 4]
        real = blk[blk < n].long()
        if e >= 5:
            assert real.numel() == 0
        else:
            assert (ids.reshape(-1)[real] == e).all() and torch.equal(real, real.sort().values)
    assert sorted(rows[rows < n].tolist()) == list(range(n))
    assert block_expert.tolist()[:4] == [0, 1, 2, 3] and set(block_expert.tolist()[4:]) <= {5}  # no expert 4 block


@pytest.mark.skipif(not fm.available(), reason="Triton is not installed")
@pytest.mark.parametrize("T,E,k,inter,dtype", [(1, 4, 2, 40, torch.float32), (9, 5, 2, 24, torch.float32),
                                               (6, 8, 3, 16, torch.bfloat16)])
def test_triton_fused_moe_equals_the_loop(T, E, k, inter, dtype):
    """The grouped kernels (interpreted where there is no GPU): one launch each for gate_up and down; H = 32 and
    the widths cut BLOCK_N / BLOCK_K tiles; some experts get no token."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(T * 100 + E)
    x = torch.randn(T, H, generator=g).to(dev, dtype)
    w13 = (torch.randn(E, 2 * inter, H, generator=g) * 0.2).to(dev, dtype)
    w2 = (torch.randn(E, H, inter, generator=g) * 0.2).to(dev, dtype)
    w, ids = _choices(T, E, k, seed=T)
    out = fm.fused_moe(x, w13, w2, w.to(dev), ids.to(dev))
    ref = fm.fused_moe_reference(x, w13, w2, w, ids)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def _hf_block_weights(block, prefix="mlp"):
    """The checkpoint names of a transformers MoE block's tensors (its experts stored per expert, as on disk)."""
    t = {}
    for name, p in block.state_dict().items():
        if name == "experts.gate_up_proj":
            inter = p.shape[1] // 2
            for e in range(p.shape[0]):
                t[f"{prefix}.experts.{e}.gate_proj.weight"] = p[e, :inter]
                t[f"{prefix}.experts.{e}.up_proj.weight"] = p[e, inter:]
        elif name == "experts.down_proj":
            for e in range(p.shape[0]):
                t[f"{prefix}.experts.{e}.down_proj.weight"] = p[e]
        else:
            t[f"{prefix}.{name}"] = p
    return _Weights(t)


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3"])
def test_moe_block_equals_transformers_block(family):
    """engine/models/moe_block.py's MoEBlock against transformers' whole block: Qwen2-MoE's (shared expert scaled by
    its sigmoid gate) and DeepSeek-V3's (sigmoid routing with the correction bias in groups, routed scaling, shared
    experts), at TP=1."""
    from engine.models.moe_block import MoEBlock

    if family == "qwen2_moe":
        hf_cfg = transformers.Qwen2MoeConfig(hidden_size=H, num_hidden_layers=1, num_attention_heads=4,
                                             num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
                                             shared_expert_intermediate_size=24, vocab_size=64)
        mod = importlib.import_module("transformers.models.qwen2_moe.modeling_qwen2_moe")
        block = mod.Qwen2MoeSparseMoeBlock(hf_cfg)
        arch, kw = "Qwen2MoeForCausalLM", dict(shared_intermediate=24, shared_gate=True)
    else:
        hf_cfg = transformers.DeepseekV3Config(hidden_size=H, num_hidden_layers=1, num_attention_heads=4,
                                               n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
                                               n_shared_experts=2, n_group=4, topk_group=2, norm_topk_prob=True,
                                               routed_scaling_factor=2.5, vocab_size=64)
        mod = importlib.import_module("transformers.models.deepseek_v3.modeling_deepseek_v3")
        block = mod.DeepseekV3MoE(hf_cfg)
        arch, kw = "DeepseekV3ForCausalLM", dict(shared_intermediate=32, correction_bias=True,
                                                 shared_name="shared_experts")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in list(block.parameters()) + list(block.buffers()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    block = block.float().eval()
    cfg = ModelConfig(architecture=arch, vocab_size=64, hidden_size=H, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=8, num_experts=hf_cfg.num_experts
                      if family == "qwen2_moe" else 8, num_experts_per_tok=hf_cfg.num_experts_per_tok,
                      moe_intermediate_size=16, norm_topk_prob=bool(hf_cfg.norm_topk_prob))
    if family == "deepseek_v3":
        cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor = 4, 2, 2.5
    ours = MoEBlock(cfg, torch.float32, TPContext(), **kw)
    ours.load(_hf_block_weights(block), "mlp")
    x = torch.randn(11, H, generator=g)
    with torch.no_grad():
        ref = block(x.unsqueeze(0))[0]
    torch.testing.assert_close(ours(x), ref, atol=1e-5, rtol=1e-5)
