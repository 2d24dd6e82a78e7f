"""Tiny random-weight models of every supported architecture, built with transformers: in memory
(``build_tiny_model``) or saved as a Hugging Face directory with the SmolLM2 tokenizer shaped like the
family's (``save_tiny_model_dir``). Heavy imports (torch, transformers, tokenizers) happen inside the
functions.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.chat_templates import (LLAMA2_TEMPLATE, LLAMA3_TEMPLATE, MISTRAL_TEMPLATE, QWEN2_TEMPLATE,
                                          QWEN3_TEMPLATE)

TINY_ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3", "smollm2")
# mixture-of-experts architectures (tests/engine/test_moe_models.py; not in TINY_ARCHS, whose tests cover dense ones)
MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")

# arch -> (transformers config class, model class, config overrides, chat template (None: SmolLM2's own),
#          tokenizer_config overrides, generation_config)
ARCH_SPECS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, LLAMA2_TEMPLATE, {}, {"temperature": 0.6, "top_p": 0.9}),
    "llama3": (
        "LlamaConfig", "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
         "max_position_embeddings": 16384},
        LLAMA3_TEMPLATE, {"add_bos_token": True},
        {"temperature": 0.6, "top_p": 0.9, "eos_token_id": [2, 0]},
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}, MISTRAL_TEMPLATE, {},
                {"temperature": 0.7}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
              QWEN2_TEMPLATE, {}, {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "tie_word_embeddings": True,
               "head_dim": 32},
              QWEN3_TEMPLATE, {}, {"temperature": 0.6, "top_p": 0.95, "top_k": 20}),
    # 4 experts, top-2 (renormalized), each of width 64
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, MISTRAL_TEMPLATE, {}, {}),
    # TP 2 and 3 both split it: 6 heads, 1 KV head (replicated), widths divisible by 6; a shared expert with its
    # sigmoid gate, layer 1 dense (mlp_only_layers), top-2 of 6 without renormalisation
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 1, "intermediate_size": 96,
                   "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                   "shared_expert_intermediate_size": 72, "mlp_only_layers": [1], "norm_topk_prob": False,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                  QWEN2_TEMPLATE, {}, {}),
    # q/k norms, 8 experts top-2 renormalized (norm_topk_prob), tied embeddings
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
                   "head_dim": 32, "tie_word_embeddings": True,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                  QWEN3_TEMPLATE, {}, {}),
    "smollm2": ("LlamaConfig", "LlamaForCausalLM",
                {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}},
                None, {}, {}),
}

TINY_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5)
WIDE_DIMS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5)


def _randomize(model, seed: int) -> None:
    """Every weight non-trivial: linears/embeddings/biases ~ N(0, 0.02), norms ~ 1 + N(0, 0.1), so a
    dropped bias or norm shows up."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.02 * noise)


def build_tiny_model(arch: str, dims: dict | None = None, seed: int | None = None, vocab_size: int = 49152):
    """An in-memory transformers model of a tiny config of ``arch`` (one of TINY_ARCHS), randomized.
    (vocab_size 49152 matches the SmolLM2 tokenizer; a smaller one suits GGUFs with a synthetic tokenizer.)"""
    import transformers

    cfg_cls, model_cls, overrides, _, _, _ = ARCH_SPECS[arch]
    kw = dict(TINY_DIMS if dims is None else dims)
    kw.update(overrides)
    kw.update(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    kw.setdefault("tie_word_embeddings", False)
    config = getattr(transformers, cfg_cls)(**kw)
    import torch

    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    order = TINY_ARCHS if arch in TINY_ARCHS else list(ARCH_SPECS)
    _randomize(model, seed if seed is not None else order.index(arch) + 1)
    return model


_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def write_tokenizer(dest: Path, tok_dir: Path, arch: str) -> None:
    """The SmolLM2 tokenizer, shaped like the family's real tokenizer.json where that matters: Qwen's and
    Llama 3's split regexes (transformers' Qwen2Tokenizer imposes its regex whatever tokenizer.json says),
    and Llama 3's BOS-adding post-processor (transformers 5 takes BOS from tokenizer.json, not from
    tokenizer_config's add_bos_token)."""
    import json

    from tokenizers import Regex, Tokenizer, pre_tokenizers, processors

    _, _, _, template, tok_overrides, _ = ARCH_SPECS[arch]
    for f in tok_dir.iterdir():
        shutil.copy(f, dest / f.name)
    split = {"qwen2": _QWEN2_SPLIT, "qwen3": _QWEN2_SPLIT, "qwen2_moe": _QWEN2_SPLIT, "qwen3_moe": _QWEN2_SPLIT,
             "llama3": _LLAMA3_SPLIT}.get(arch)
    if split is not None:
        tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        if arch == "llama3":
            tok.post_processor = processors.TemplateProcessing(
                single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|>:1 $B:1",
                special_tokens=[("<|im_start|>", 1)])
        tok.save(str(dest / "tokenizer.json"))
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    cfg.update(tok_overrides)
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    if template is not None:
        (dest / "chat_template.jinja").write_text(template)


def save_tiny_model_dir(root: Path, arch: str, tokenizer_dir: Path, sharded: bool = False) -> Path:
    """``root/<arch>[-sharded]``: build_tiny_model(arch) saved in Hugging Face format (config.json,
    safetensors - several shards + index when ``sharded`` -, generation_config.json, the tokenizer of
    ``tokenizer_dir`` shaped by write_tokenizer, the arch's chat template)."""
    if arch not in ARCH_SPECS:
        raise ValueError(f"unknown tiny arch {arch!r}; choose from {TINY_ARCHS}")
    from transformers import GenerationConfig

    dest = root / (arch + ("-sharded" if sharded else ""))
    dest.mkdir(exist_ok=True)
    model = build_tiny_model(arch)
    model.save_pretrained(str(dest), max_shard_size="200KB" if sharded else "50GB")
    gen = dict(ARCH_SPECS[arch][5])
    gen.setdefault("eos_token_id", 2)
    GenerationConfig(bos_token_id=1, do_sample=True, **gen).save_pretrained(str(dest))
    write_tokenizer(dest, tokenizer_dir, arch)
    return dest
