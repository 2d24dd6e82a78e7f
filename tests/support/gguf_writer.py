"""GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes the Llama / Qwen2 / Qwen3 architectures
(tensor names, llama-arch q/k permutation, metadata, tokenizer metadata), from a transformers model, with
any tensor type (K-quants as random valid blocks). Heavy imports (numpy, gguf) happen inside the functions.
"""

from __future__ import annotations

from pathlib import Path

from engine.tokenizer import bytes_to_unicode

_GGUF_ARCH = {"llama": "llama", "llama3": "llama", "mistral": "llama", "smollm2": "llama", "qwen2": "qwen2",
              "qwen3": "qwen3"}
_HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensor_name(name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    return f"blk.{parts[2]}." + _HF_TO_GGUF[".".join(parts[3:])]


def llama_cpp_permute(w, n_head: int, n_head_kv: int | None = None):
    """llama.cpp's LlamaModel.permute (HF rotate-half layout -> GGUF interleaved), verbatim."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _random_blocks(qtype, n_blocks: int, rng):
    """Random but valid blocks of a type gguf-py cannot quantize to (the K-quants): random quant bits and
    small finite fp16 scales at the offsets ggml's block structs put them."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q

    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scale_offsets = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}[qtype]
    for off in scale_offsets:
        scales = (rng.random(n_blocks, dtype=np.float32) * 2e-3 + 1e-4).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def quantize_kquant(array, qtype):
    """float32 values [..., K] (K % 256 == 0) as Q4_K / Q5_K / Q6_K blocks ([..., K / 256 * type_size] uint8),
    close to the values (a plain min / max quantizer, not llama.cpp's search): what gguf-py cannot write. The
    layouts are ggml's (gguf.quants' dequantization reads them back)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q

    _, size = GGML_QUANT_SIZES[qtype]
    x = np.asarray(array, dtype=np.float32)
    lead = x.shape[:-1]
    x = x.reshape(-1, 256)
    n = x.shape[0]
    f16 = lambda v: v.astype(np.float16)
    if qtype == Q.Q6_K:
        g = x.reshape(n, 16, 16)
        scale = np.abs(g).max(-1) / 31  # per group of 16
        d = f16(scale.max(-1) / 127)
        df = d.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(-128, 127).astype(np.int8)
            step = df[:, None, None] * sc[..., None].astype(np.float32)
            q = np.where(step > 0, np.rint(g / step), 0).clip(-32, 31).astype(np.int16)
        u = (q.reshape(n, 2, 4, 32) + 32).astype(np.uint8)  # [half, sub-block s, l]
        ql = np.concatenate([u[:, :, 0] & 15 | (u[:, :, 2] & 15) << 4, u[:, :, 1] & 15 | (u[:, :, 3] & 15) << 4],
                            axis=-1)  # [n, 2, 64]
        qh = u[:, :, 0] >> 4 | (u[:, :, 1] >> 4) << 2 | (u[:, :, 2] >> 4) << 4 | (u[:, :, 3] >> 4) << 6
        out = np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d.view(np.uint8)[:, None]
                              .reshape(n, 2)], axis=-1)
    else:
        levels = 15 if qtype == Q.Q4_K else 31
        g = x.reshape(n, 8, 32)
        mn = np.maximum(0, -g.min(-1))             # w = a q - b with b >= 0
        scale = (g.max(-1) + mn) / levels
        d, dmin = f16(scale.max(-1) / 63), f16(mn.max(-1) / 63)
        df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(df > 0, np.rint(scale / df), 0).clip(0, 63).astype(np.uint8)
            m6 = np.where(dmf > 0, np.rint(mn / dmf), 0).clip(0, 63).astype(np.uint8)
            a = (df * sc)[..., None]
            b = (dmf * m6)[..., None]
            q = np.where(a > 0, np.rint((g + b) / a), 0).clip(0, levels).astype(np.uint8)  # [n, 8, 32]
        packed = np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4) << 6, m6[:, :4] | (m6[:, 4:] >> 4) << 6,
                                 (sc[:, 4:] & 15) | (m6[:, 4:] & 15) << 4], axis=-1)
        qs = ((q[:, 0::2] & 15) | (q[:, 1::2] & 15) << 4).reshape(n, 128)
        parts = [d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2), packed]
        if qtype == Q.Q5_K:
            bits = (q >> 4).astype(np.uint8)  # [n, 8 (t), 32 (l)]
            parts.append(np.bitwise_or.reduce(bits << np.arange(8, dtype=np.uint8)[None, :, None], axis=1))
        out = np.concatenate(parts + [qs], axis=-1)
    assert out.shape[-1] == size
    return np.ascontiguousarray(out.reshape(*lead, -1))


def encode_tensor(array, qtype, rng, kquant_values: bool = False):
    """``(data, raw_dtype)`` for GGUFWriter.add_tensor: float32 values stored as ``qtype``. K-quants: random valid
    blocks, or with ``kquant_values`` (Q4_K / Q5_K / Q6_K, K % 256 == 0) the values quantized (quantize_kquant)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, quants
    from gguf import GGMLQuantizationType as Q

    if qtype == Q.F32:
        return array.astype(np.float32), None
    if qtype == Q.F16:
        return array.astype(np.float16), None
    block, size = GGML_QUANT_SIZES[qtype]
    if kquant_values and qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return quantize_kquant(array, qtype), qtype
    if qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
        blocks = _random_blocks(qtype, array.size // block, rng)
        return blocks.reshape(*array.shape[:-1], -1), qtype
    try:
        return quants.quantize(array.astype(np.float32), qtype), qtype
    except NotImplementedError:  # a type gguf-py cannot write (e.g. Q8_1): random bytes of the right size
        blocks = rng.integers(0, 256, size=(array.size // block, size), dtype=np.uint8)
        return blocks.reshape(*array.shape[:-1], -1), qtype


def write_gguf(model, out: Path, arch: str, types=None, tokenizer_source: Path | None = None,
               name: str = "tiny", seed: int = 0, skip: set[str] = frozenset(), kquant_values: bool = False) -> Path:
    """Write a transformers Llama/Qwen2/Qwen3 model as a GGUF file like llama.cpp's converter:
    tensor names, q/k permutation (llama arch), metadata, tokenizer metadata copied from
    ``tokenizer_source`` (a GGUF; None: a synthetic byte-level one of the model's vocab size).
    ``types``: None (all F32), a GGMLQuantizationType for every 2-D tensor, or a callable(hf_name, shape)
    -> type. 1-D tensors stay F32, as llama.cpp writes them. ``skip``: HF
    names of tensors to leave out (to make broken files). ``kquant_values``: Q4_K / Q5_K / Q6_K tensors hold
    the model's values (quantize_kquant) instead of random blocks."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q

    from engine.loader.gguf_file import GGUFFile

    rng = np.random.default_rng(seed)
    gguf_arch = _GGUF_ARCH[arch]
    cfg = model.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w = gguf.GGUFWriter(str(out), gguf_arch)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    rope = getattr(cfg, "rope_parameters", None) or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if gguf_arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if head_dim != cfg.hidden_size // heads or gguf_arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if types is None else gguf.LlamaFileType.GUESSED)
    if tokenizer_source is None:
        # a small synthetic byte-level vocabulary of the model's size (keeps gguf.GGUFReader, which
        # transformers uses, fast): 3 control tokens, the 256 byte symbols, fillers
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens = specials + list(bytes_to_unicode().values()) + ["Ġt", "he"]
        tokens += [f"<x{i}>" for i in range(cfg.vocab_size - len(tokens))]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
        w.add_token_merges(["Ġ t", "h e"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    else:
        meta = GGUFFile(tokenizer_source).metadata
        w.add_tokenizer_model(meta["tokenizer.ggml.model"])
        w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
        w.add_token_list(meta["tokenizer.ggml.tokens"])
        w.add_token_types(meta["tokenizer.ggml.token_type"])
        w.add_token_merges(meta["tokenizer.ggml.merges"])
        w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
        w.add_unk_token_id(meta["tokenizer.ggml.unknown_token_id"])
        w.add_pad_token_id(meta["tokenizer.ggml.padding_token_id"])
        w.add_add_bos_token(meta["tokenizer.ggml.add_bos_token"])
        w.add_chat_template(meta["tokenizer.chat_template"])
    if rope.get("rope_type") == "llama3":  # llama.cpp stores llama3 scaling as per-frequency divisors
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        orig = rope["original_max_position_embeddings"]
        inv = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        divisors = []
        for f in inv:
            wavelen = 2 * np.pi / f
            if wavelen < orig / high:
                divisors.append(1.0)
            elif wavelen > orig / low:
                divisors.append(factor)
            else:
                smooth = (orig / wavelen - low) / (high - low)
                divisors.append(1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.array(divisors, dtype=np.float32))
    for hf, tensor in model.state_dict().items():
        if (hf == "lm_head.weight" and cfg.tie_word_embeddings) or hf in skip:
            continue
        arr = tensor.detach().to("cpu").float().numpy()
        if gguf_arch == "llama" and ".self_attn.q_proj." in hf:
            arr = llama_cpp_permute(arr, heads, heads)
        elif gguf_arch == "llama" and ".self_attn.k_proj." in hf:
            arr = llama_cpp_permute(arr, heads, kv)
        qtype = Q.F32
        if arr.ndim == 2 and types is not None:
            qtype = types(hf, arr.shape) if callable(types) else types
        data, raw = encode_tensor(np.ascontiguousarray(arr), qtype, rng, kquant_values)
        w.add_tensor(gguf_tensor_name(hf), data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def convert_model_dir(model_dir: Path, out: Path, arch: str, quant: str = "F32",
                      tokenizer_source: Path | None = None, name: str = "tiny") -> Path:
    """The transformers model of ``model_dir`` (loaded in float32) written to ``out`` by write_gguf, every 2-D
    tensor as ``quant`` (a GGMLQuantizationType name; "F32": all float32)."""
    import torch
    from gguf import GGMLQuantizationType
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    qtype = None if quant == "F32" else GGMLQuantizationType[quant]
    return write_gguf(model, out, arch, qtype, tokenizer_source=tokenizer_source, name=name)
