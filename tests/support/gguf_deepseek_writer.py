"""DeepSeek-V2 / V3 GGUF files written the way llama.cpp's converter (convert_hf_to_gguf.py, DeepseekV2Model) writes
them under the ``deepseek2`` architecture, from a tiny random transformers model: its metadata keys, no q/k
permutation, kv_b_proj split into ``attn_k_b`` (each head's key rows transposed) and ``attn_v_b`` as newer files have
it (``split_kv_b``) or kept as ``attn_kv_b`` with the older key / value length keys, the experts stacked into 3-D
``ffn_*_exps``, the shared experts ``ffn_*_shexp``, the router F32 and the correction bias ``exp_probs_b.bias``.
Heavy imports inside the functions."""

from __future__ import annotations

from pathlib import Path

from tests.support.gguf_writer import quantize_kquant

# widths the K-quants can hold (a row of 256) where the experts need them; the attention's rows are multiples of 32.
# The model's vocabulary (4096, the file's vocab_size) is the first part of the tokenizer's (SmolLM2's 49152 tokens):
# small tables, cheap to write and to run
TINY = dict(vocab_size=4096, hidden_size=256, intermediate_size=256, moe_intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=64, qk_nope_head_dim=32,
            qk_rope_head_dim=16, v_head_dim=32, n_group=4, topk_group=2, max_position_embeddings=2048,
            rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False)
# llama.cpp's deepseek2 keeps one mscale (yarn_log_multiplier = 0.1 x mscale_all_dim): mscale == mscale_all_dim
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.8, "mscale_all_dim": 0.8,
        "original_max_position_embeddings": 512}
VERSIONS = {
    "v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
           dict(q_lora_rank=None, topk_method="group_limited_greedy", routed_scaling_factor=1.5)),
    "v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
           dict(q_lora_rank=64, norm_topk_prob=True, routed_scaling_factor=2.5, rope_parameters=YARN)),
}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_a_proj.weight": "attn_q_a.weight",
          "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight", "self_attn.q_b_proj.weight": "attn_q_b.weight",
          "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
          "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
          "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
          "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
          "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
          "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight"}


def build_deepseek_model(version: str, seed: int = 0):
    """A tiny random DeepSeek-V2 (no q_lora_rank, group_limited_greedy, routed scaling) or V3 (q_lora_rank, YaRN,
    noaux_tc with a correction bias, norm_topk_prob), float32, eval. The routers are drawn larger than the rest so
    that no two experts' scores sit within rounding of each other."""
    import torch
    import transformers

    cfg_cls, model_cls, extra = VERSIONS[version]
    config = getattr(transformers, cfg_cls)(**TINY, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 101)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "inv_freq" in name:
                continue
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("gate.weight"):
                p.copy_(0.5 * noise)
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.05 * noise)
    return model


def _metadata(cfg, split_kv_b: bool) -> dict[str, tuple[str, object]]:
    """key (after "deepseek2.") -> (GGUFWriter method, value): what the converter writes for this config."""
    import gguf

    rank, rope, nope, v = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
    md: dict[str, tuple[str, object]] = {
        "context_length": ("add_context_length", cfg.max_position_embeddings),
        "embedding_length": ("add_embedding_length", cfg.hidden_size),
        "block_count": ("add_block_count", cfg.num_hidden_layers),
        "feed_forward_length": ("add_feed_forward_length", cfg.intermediate_size),
        "attention.head_count": ("add_head_count", cfg.num_attention_heads),
        "attention.head_count_kv": ("add_head_count_kv", 1),  # MLA written as MQA
        "rope.freq_base": ("add_rope_freq_base", 10000.0),
        "attention.layer_norm_rms_epsilon": ("add_layer_norm_rms_eps", cfg.rms_norm_eps),
        "expert_count": ("add_expert_count", cfg.n_routed_experts),
        "expert_used_count": ("add_expert_used_count", cfg.num_experts_per_tok),
        "expert_group_count": ("add_expert_group_count", cfg.n_group),
        "expert_group_used_count": ("add_expert_group_used_count", cfg.topk_group),
        "leading_dense_block_count": ("add_leading_dense_block_count", cfg.first_k_dense_replace),
        "vocab_size": ("add_vocab_size", cfg.vocab_size),
        "attention.kv_lora_rank": ("add_kv_lora_rank", rank),
        "expert_feed_forward_length": ("add_expert_feed_forward_length", cfg.moe_intermediate_size),
        "expert_shared_count": ("add_expert_shared_count", cfg.n_shared_experts),
        "expert_weights_scale": ("add_expert_weights_scale", cfg.routed_scaling_factor),
        "rope.dimension_count": ("add_rope_dimension_count", rope),
    }
    if cfg.model_type == "deepseek_v3":  # DeepSeek-V3's config.json says scoring_func "sigmoid"; V2's file has none
        md["expert_gating_func"] = ("add_expert_gating_func", gguf.ExpertGatingFuncType.SIGMOID)
    if cfg.q_lora_rank:
        md["attention.q_lora_rank"] = ("add_q_lora_rank", cfg.q_lora_rank)
    if split_kv_b:  # newer converters: the latent's widths, and the per-head ones under *_mla
        md.update({"attention.key_length": ("add_key_length", rank + rope),
                   "attention.value_length": ("add_value_length", rank),
                   "attention.key_length_mla": ("add_key_length_mla", nope + rope),
                   "attention.value_length_mla": ("add_value_length_mla", v)})
    else:
        md.update({"attention.key_length": ("add_key_length", nope + rope),
                   "attention.value_length": ("add_value_length", v)})
    if getattr(cfg, "norm_topk_prob", False):
        md["expert_weights_norm"] = ("add_expert_weights_norm", True)
    scaling = getattr(cfg, "rope_parameters", None) or {}
    if scaling.get("rope_type") == "yarn":
        md.update({"rope.scaling.type": ("add_rope_scaling_type", gguf.RopeScalingType.YARN),
                   "rope.scaling.factor": ("add_rope_scaling_factor", scaling["factor"]),
                   "rope.scaling.original_context_length": ("add_rope_scaling_orig_ctx_len",
                                                            scaling["original_max_position_embeddings"]),
                   "rope.scaling.yarn_log_multiplier": ("add_rope_scaling_yarn_log_mul",
                                                        0.1 * scaling["mscale_all_dim"])})
    return md


def write_deepseek_gguf(model, out: Path, qtype_name: str | None, tokenizer_source: Path, workdir: Path, *,
                        split_kv_b: bool = True, omit: frozenset[str] = frozenset(), tensors: bool = True
                        ) -> tuple[Path, dict]:
    """``model`` (build_deepseek_model) as a deepseek2 GGUF: float32 tensors (``qtype_name`` None), or the routed
    experts in ``qtype_name`` ("Q8_0" / "Q4_K") and every other matrix in Q8_0 (norms, router and bias F32).
    ``omit``: metadata keys (after "deepseek2.") left out; ``tensors`` False: the metadata and tokenizer only.
    Returns the path and the values the file holds, dequantized, under the checkpoint's names."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import quants
    from safetensors.numpy import load_file

    from engine.loader.gguf_file import GGUFFile

    cfg = model.config
    w = gguf.GGUFWriter(str(out), "deepseek2")
    w.add_name(f"tiny-{cfg.model_type}")
    for key, (method, value) in _metadata(cfg, split_kv_b).items():
        if key not in omit:
            getattr(w, method)(value)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype_name is None else gguf.LlamaFileType.GUESSED)
    meta = GGUFFile(tokenizer_source).metadata
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    dequantized: dict = {}

    def put(gguf_name: str, arr, qtype) -> np.ndarray:
        """Write arr (F32, or qtype for a matrix whose rows allow it); its values as the file holds them."""
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype is None or arr.ndim < 2:
            w.add_tensor(gguf_name, arr)
            return arr
        data = quantize_kquant(arr, qtype) if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else quants.quantize(arr, qtype)
        w.add_tensor(gguf_name, data, raw_dtype=qtype)
        return quants.dequantize(data, qtype).reshape(arr.shape)

    if tensors:
        saved = workdir / f"{cfg.model_type}-saved"
        model.save_pretrained(str(saved))
        hf = {}
        for f in sorted(saved.glob("*.safetensors")):
            hf.update(load_file(str(f)))
        matrix = None if qtype_name is None else Q.Q8_0
        experts = None if qtype_name is None else Q[qtype_name]
        for name, gg in _TOP.items():
            dequantized[name] = put(gg, hf[name], matrix)
        H, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            for name, gg in _LAYER.items():
                if p + name in hf:
                    dequantized[p + name] = put(f"blk.{i}.{gg}", hf[p + name], None if name == "mlp.gate.weight"
                                                else matrix)
            kv_b = hf[p + "self_attn.kv_b_proj.weight"]
            if split_kv_b:  # as the converter: view [H, nope + v, rank], k_b transposed to [H, rank, nope]
                heads = kv_b.reshape(H, nope + v, -1)
                k_b = put(f"blk.{i}.attn_k_b.weight", heads[:, :nope].transpose(0, 2, 1), matrix)
                v_b = put(f"blk.{i}.attn_v_b.weight", heads[:, nope:], matrix)
                dequantized[p + "self_attn.kv_b_proj.weight"] = np.concatenate(
                    [k_b.transpose(0, 2, 1), v_b], axis=1).reshape(kv_b.shape)
            else:
                dequantized[p + "self_attn.kv_b_proj.weight"] = put(f"blk.{i}.attn_kv_b.weight", kv_b, matrix)
            if p + "mlp.gate.weight" not in hf:
                continue
            for proj in ("gate", "up", "down"):
                names = [f"{p}mlp.experts.{e}.{proj}_proj.weight" for e in range(cfg.n_routed_experts)]
                values = put(f"blk.{i}.ffn_{proj}_exps.weight", np.stack([hf[n] for n in names]), experts)
                dequantized.update(zip(names, values))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out, {k: np.ascontiguousarray(val, dtype=np.float32) for k, val in dequantized.items()}
