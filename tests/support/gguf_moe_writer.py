"""Mixture-of-experts GGUF files written the way llama.cpp's converter writes Qwen3-MoE (``qwen3moe``), Qwen2-MoE
(``qwen2moe``: q/k/v biases, the shared expert ``ffn_{gate,up,down}_shexp`` and its gate ``ffn_gate_inp_shexp`` in
F32) and Mixtral (``llama`` with expert_count, q/k permuted): each layer's experts stacked into 3-D
``ffn_{gate,up,down}_exps`` tensors, the router ``ffn_gate_inp`` in F32, from a transformers model's saved per-expert
tensors. Also the
model with every tensor replaced by what the file holds, dequantized (the reference the GGUF path is held to).
Heavy imports inside the functions."""

from __future__ import annotations

from pathlib import Path

from tests.support.gguf_writer import llama_cpp_permute, quantize_kquant

_ATTN = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
         "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
         "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias"}
_SHARED = {"mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
           "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
           "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
           "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}
_ARCH = {"mixtral": "llama", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def build_moe_model(kind: str, seed: int = 0):
    """A tiny random Qwen3-MoE (``kind`` "qwen3_moe"), Qwen2-MoE ("qwen2_moe": q/k/v biases, a shared expert of
    width 512 with its sigmoid gate, top-2 not renormalized) or Mixtral ("mixtral") of K-quant-friendly widths
    (hidden and expert width 256), float32, eval; weights N(0, 0.02), norms 1 + N(0, 0.1)."""
    import torch
    import transformers

    common = dict(vocab_size=49152, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False, num_experts_per_tok=2)
    if kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, head_dim=64, num_experts=4, moe_intermediate_size=256,
                                          intermediate_size=512, norm_topk_prob=True)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif kind == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(**common, num_experts=4, moe_intermediate_size=256, intermediate_size=512,
                                          shared_expert_intermediate_size=512, norm_topk_prob=False)
        model = transformers.Qwen2MoeForCausalLM(cfg)
    else:
        cfg = transformers.MixtralConfig(**common, num_local_experts=4, intermediate_size=256)
        model = transformers.MixtralForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.02 * noise)
    return model.to(torch.float32).eval()


def _saved_tensors(model, tmp: Path) -> dict:
    """The model's tensors under the checkpoint's names (transformers saves experts one by one)."""
    from safetensors.numpy import load_file

    model.save_pretrained(str(tmp))
    out = {}
    for f in sorted(tmp.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def write_moe_gguf(model, out: Path, qtype_name: str, tokenizer_source: Path, workdir: Path,
                   shared_length: bool = True) -> tuple[Path, dict]:
    """``model`` (build_moe_model) as a GGUF of ``qtype_name`` ("Q8_0" / "Q4_K": every 2-D and 3-D weight but the
    routers; norms, biases and routers F32; "F32": every tensor F32); returns the path and the dequantized tensors
    under the checkpoint's names. ``shared_length`` False: Qwen2-MoE's expert_shared_feed_forward_length left out
    (as early qwen2moe files have it; the width is then the tensors')."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    from engine.loader.gguf_file import GGUFFile

    cfg = model.config
    mixtral = cfg.model_type == "mixtral"
    arch = _ARCH[cfg.model_type]
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    experts = cfg.num_local_experts if mixtral else cfg.num_experts
    qtype = Q[qtype_name]
    tensors = _saved_tensors(model, workdir / f"{cfg.model_type}-saved")

    def encode(arr):
        if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            return quantize_kquant(arr, qtype)
        return quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qtype)

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(f"tiny-{cfg.model_type}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if mixtral:
        w.add_rope_dimension_count(head_dim)
    else:
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "qwen3moe":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "qwen2moe" and shared_length:
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == Q.F32 else gguf.LlamaFileType.GUESSED)
    meta = GGUFFile(tokenizer_source).metadata
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])

    dequantized: dict = {}

    def put(gguf_name: str, arr, quantize: bool, hf_names: list[str], unpermute=None):
        if quantize and qtype != Q.F32:
            data = encode(arr)
            w.add_tensor(gguf_name, data, raw_dtype=qtype)
            values = quants.dequantize(data, qtype).reshape(arr.shape)
        else:
            w.add_tensor(gguf_name, np.ascontiguousarray(arr, dtype=np.float32))
            values = arr.astype(np.float32)
        if unpermute is not None:
            values = unpermute(values)
        parts = [values] if len(hf_names) == 1 else list(values)
        for n, v in zip(hf_names, parts):
            dequantized[n] = np.ascontiguousarray(v, dtype=np.float32)

    for hf, gg in _TOP.items():
        put(gg, tensors[hf], hf != "model.norm.weight", [hf])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf, gg in _ATTN.items():
            if p + hf not in tensors:
                continue
            arr = tensors[p + hf]
            undo = None
            if mixtral and hf in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                n = heads if "q_proj" in hf else kv
                arr = llama_cpp_permute(arr, heads, n)
                undo = _inverse_permute(n)
            put(f"blk.{i}.{gg}", arr, arr.ndim == 2, [p + hf], undo)
        moe = p + ("block_sparse_moe." if mixtral else "mlp.")
        put(f"blk.{i}.ffn_gate_inp.weight", tensors[moe + "gate.weight"], False, [moe + "gate.weight"])
        for hf, gg in _SHARED.items():
            if p + hf in tensors:  # Qwen2-MoE's shared expert; its gate [1, hidden] F32, as the router
                put(f"blk.{i}.{gg}", tensors[p + hf], not hf.endswith("shared_expert_gate.weight"), [p + hf])
        names = {"gate": "w1", "up": "w3", "down": "w2"} if mixtral else {
            "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        for proj in ("gate", "up", "down"):
            hf_names = [f"{moe}experts.{e}.{names[proj]}.weight" for e in range(experts)]
            put(f"blk.{i}.ffn_{proj}_exps.weight", np.stack([tensors[n] for n in hf_names]), True, hf_names)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out, dequantized


def _inverse_permute(n_head: int):
    def undo(values):
        from engine.loader.gguf import qk_row_order

        return values[qk_row_order(values.shape[0], n_head)]
    return undo


def dequantized_reference(model, dequantized: dict, workdir: Path):
    """``model``'s class and config with the GGUF's dequantized values (saved under the checkpoint's names and
    loaded back by transformers, which stacks the experts itself): the float32 reference of the GGUF path."""
    import torch
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM

    d = workdir / f"{model.config.model_type}-dequantized"
    d.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(d))
    save_file(dequantized, str(d / "model.safetensors"))
    return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
