"""One dataclass tree for every engine option. CLI flags (engine.cli) and GUI forms derive from
the field metadata here, so an option is declared once."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from collections.abc import Collection
from typing import Any

from engine.errors import UnsupportedArchitectureError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    # mixture of experts (engine/models/mixtral.py, engine/models/qwen_moe.py)
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    # multi-head latent attention + mixture of experts (engine/models/deepseek.py)
    "DeepseekV2ForCausalLM": "deepseek2",
    "DeepseekV3ForCausalLM": "deepseek3",
    # attention sinks, alternating sliding-window layers, biased experts (engine/models/gpt_oss.py; the CPU)
    "GptOssForCausalLM": "gpt_oss",
}

# The names of --comm-strategy, defined once: engine/parallel/comm/group.py implements them, engine/capabilities.py
# publishes them and the app's Load form offers them (this module is torch-free).
COMM_STRATEGIES = ("auto", "nccl", "int8", "host", "overlap")


# --quantization's choices (auto first: the default). The app's Load form offers them (this module is torch-free).
QUANTIZATIONS = ("auto", "none", "int8", "int4", "fp8", "gguf")
# --kv-cache-dtype's choices (auto first: the default; vLLM's name fp8 for e4m3). The app's Load form offers them.
KV_CACHE_DTYPES = ("auto", "fp8")
# The GGUF types the native CPU kernels compute on (engine/ops/gguf_quant.py TYPES; a test holds the two equal), for
# what --quantization auto does with a .gguf file, torch-free for the app.
GGUF_KERNEL_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def auto_quantization(device_type: str, gguf_types: Collection[str] | None, native: bool) -> str:
    """What ``--quantization auto`` loads: "gguf" (the file's blocks kept, engine/loader/gguf.py) for a .gguf file
    on the CPU where the native kernels are there (``native``) and one of the types of its 2-D tensors
    (``gguf_types``: names such as "Q4_1"; None for a checkpoint that is not a .gguf file) has a kernel (tensors of
    other types are dequantized, as under gguf); else "none": a GGUF file dequantized to the dtype (a GPU's path, or
    a CPU without the native kernels, or a float file), a Hugging Face checkpoint as it is (float weights, or a GPTQ
    / AWQ / FP8 checkpoint's own quantized ones)."""
    if device_type == "cpu" and native and gguf_types is not None and set(gguf_types) & set(GGUF_KERNEL_TYPES):
        return "gguf"
    return "none"


def tp_size_fits(size: int, num_heads: int, num_kv_heads: int) -> bool:
    """Whether the attention heads split over ``size`` ranks as QKVParallelLinear (engine/layers/linear.py) splits
    them: the query heads evenly; the KV heads evenly when there are at least ``size`` of them, else replicated,
    so ``size`` must then be a multiple of their number. (The loader also checks the MLP's intermediate size.)"""
    if size < 1 or num_heads % size:
        return False
    return num_kv_heads % size == 0 if num_kv_heads >= size else size % num_kv_heads == 0


@dataclass
class ModelConfig:
    """The subset of a Hugging Face config.json the engine uses (Llama family)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qkv bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None
    # Mixture of experts (num_experts 0: a dense model). Each expert is a gated MLP of moe_intermediate_size;
    # num_experts_per_tok of them run per token (engine/layers/moe.py routes exactly as transformers).
    num_experts: int = 0  # HF num_experts / num_local_experts / n_routed_experts
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's width (Mixtral's config calls it intermediate_size)
    norm_topk_prob: bool = False  # renormalize the top-k weights to sum to 1 (Mixtral always does)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: one shared expert, scaled by a sigmoid gate
    decoder_sparse_step: int = 1  # Qwen MoE: layer i is sparse when (i + 1) % step == 0 and i not in mlp_only_layers
    mlp_only_layers: list[int] = field(default_factory=list)
    # DeepSeek-V2/V3 routing and layout (the router's aux-loss settings are training-only, ignored)
    scoring_func: str = "softmax"  # or "sigmoid" (V3)
    topk_method: str = "greedy"  # V2: "greedy" | "group_limited_greedy"; V3: "noaux_tc" (with a correction bias)
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 0  # shared experts of width n_shared_experts * moe_intermediate_size, ungated
    first_k_dense_replace: int = 0  # the first k layers keep a dense MLP
    moe_layer_freq: int = 1
    # Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: none): the KV cache holds per token the
    # compressed latent (kv_lora_rank) and the rope key (qk_rope_head_dim) only (engine/layers/mla.py)
    q_lora_rank: int | None = None  # None: q_proj directly (V2-Lite), else q_a_proj -> q_a_layernorm -> q_b_proj
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True  # rope over interleaved pairs (V2 always; V3 unless its config says False)
    # gpt-oss: per layer "sliding_attention" (a window of layer_window tokens; not sliding_window, which caps every
    # layer's context) or "full_attention"; the experts' clamped SwiGLU
    layer_types: list[str] = field(default_factory=list)
    layer_window: int = 0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    @property
    def kv_cache_layout(self) -> tuple[int, int, int]:
        """(tensors, heads, head size) of one token's KV cache entry per layer: keys and values of the KV heads, or
        one latent row (kv_lora_rank + qk_rope_head_dim) under multi-head latent attention."""
        if self.kv_lora_rank:
            return 1, 1, self.kv_lora_rank + self.qk_rope_head_dim
        return 2, self.num_key_value_heads, self.head_dim

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` has a mixture-of-experts block instead of the dense MLP (transformers'
        rule: Qwen MoE's decoder_sparse_step / mlp_only_layers, DeepSeek's first_k_dense_replace / moe_layer_freq)."""
        if self.num_experts <= 0 or index in self.mlp_only_layers or index < self.first_k_dense_replace:
            return False
        return (index + 1) % self.decoder_sparse_step == 0 and index % self.moe_layer_freq == 0

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else cfg.get("model_type", "<missing>")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(arch, list(SUPPORTED_ARCHITECTURES))
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        eos = cfg.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        rope_params = cfg.get("rope_parameters")  # transformers >= 5 folds theta and scaling here
        if isinstance(rope_params, dict):
            rope_theta = rope_theta or rope_params.get("rope_theta")
            if rope_params.get("rope_type", "default") != "default" and rope_scaling is None:
                rope_scaling = rope_params
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) in (None, "default"):
            rope_scaling = None
        use_sliding = cfg.get("use_sliding_window")  # transformers 5 writes null for Mistral
        if use_sliding is None:
            use_sliding = arch in ("MistralForCausalLM", "MixtralForCausalLM")
        sliding = cfg.get("sliding_window") if use_sliding else None
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases (transformers hard-codes them; its config.json may say null); Qwen2-MoE
            # has them unless its qkv_bias says otherwise
            attention_bias=(arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias"))
                            or (arch == "Qwen2MoeForCausalLM" and cfg.get("qkv_bias", True) is not False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            sliding_window=sliding,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            **_moe_fields(cfg, arch),
            **_mla_fields(cfg, arch),
            **_gpt_oss_fields(cfg, arch),
        )


def _gpt_oss_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """ModelConfig's gpt-oss fields (transformers' GptOssConfig defaults: even layers sliding, from the first)."""
    if arch != "GptOssForCausalLM":
        return {}
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return dict(layer_types=list(types), layer_window=int(cfg.get("sliding_window") or 0),
                swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)), swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))


def _mla_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """ModelConfig's multi-head latent attention fields (DeepSeek-V2/V3; empty for other models)."""
    if arch not in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        return {}
    return dict(
        q_lora_rank=cfg.get("q_lora_rank") or None,
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        rope_interleave=arch == "DeepseekV2ForCausalLM" or cfg.get("rope_interleave", True) is not False,
    )


def _moe_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """ModelConfig's mixture-of-experts fields from a Hugging Face config (empty for a dense model)."""
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    if not experts:
        return {}
    return dict(
        num_experts=int(experts),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        # Mixtral renormalizes always; Qwen MoE / DeepSeek-V3 as their config says (transformers' default False)
        norm_topk_prob=arch == "MixtralForCausalLM" or bool(cfg.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        decoder_sparse_step=int(cfg.get("decoder_sparse_step") or 1),
        mlp_only_layers=list(cfg.get("mlp_only_layers") or []),
        # transformers' DeepSeek-V3 router is sigmoid + noaux_tc whatever its config says (the real ones say so too)
        scoring_func="sigmoid" if arch == "DeepseekV3ForCausalLM" else cfg.get("scoring_func") or "softmax",
        topk_method="noaux_tc" if arch == "DeepseekV3ForCausalLM" else cfg.get("topk_method") or "greedy",
        n_group=int(cfg.get("n_group") or 1),
        topk_group=int(cfg.get("topk_group") or 1),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        n_shared_experts=int(cfg.get("n_shared_experts") or 0),
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        moe_layer_freq=int(cfg.get("moe_layer_freq") or 1),
    )


def _opt(help: str, **kw) -> Any:
    """A field that is also a CLI flag / GUI form entry."""
    default = kw.pop("default", None)
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class EngineConfig:
    model: str | None = _opt("Model: a Hugging Face directory, a .gguf file, or a repo id in the HF cache "
                             "(default: the embedded SmolLM2-135M-Instruct)")
    dtype: str = _opt("Weights and activations dtype", default="auto",
                      choices=["auto", "float32", "bfloat16", "float16"])
    device: str = _opt("Device", default="auto", choices=["auto", "cpu", "cuda"])
    quantization: str = _opt("Weights quantized while loading: auto (the default: a .gguf file's blocks kept for "
                             "the CPU kernels where this CPU runs them and the file has a type they take, as gguf "
                             "below; a GPTQ / AWQ / FP8 checkpoint's own scheme; float weights as they are: what "
                             "none does everywhere else, a GPU included), none (the checkpoint's own weights: float, "
                             "or a GPTQ / AWQ / FP8 checkpoint's quantized ones; a GGUF file's blocks dequantized "
                             "to the dtype), int8 (weight-only; CPU: one scale per 32 weights, GPU: one per output "
                             "channel), int4 (GPU: weight-only, groups of 128 with a scale and zero point), fp8 "
                             "(GPU with fp8 tensor cores, sm_89+: e4m3 weights with a scale per channel, "
                             "activations quantized per token for prefills) or gguf (a .gguf file's Q4_0 / Q4_1 / "
                             "Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K linear weights kept as their blocks for the CPU "
                             "kernels: about the file's size in memory, faster decode; the kernels quantize "
                             "activations per block, so a greedy output may change with what it is batched with "
                             "unless --deterministic)", default="auto", choices=list(QUANTIZATIONS))
    kv_cache_dtype: str = _opt("KV-cache element type: auto (the model's dtype) or fp8 (GPU with fp8 support, "
                               "sm_89+: e4m3 keys and values, each layer's with a float32 scale for each, set from "
                               "the largest values of the first prompt step, later values saturated at 448 x the "
                               "scale); twice the tokens in the same memory, at some accuracy; the CPU keeps the KV "
                               "cache in the model's dtype", default="auto", choices=list(KV_CACHE_DTYPES))
    max_model_len: int | None = _opt("Context length (default: the model's, capped at 8192)")
    block_size: int | None = _opt("KV-cache block size in tokens (default: 64 on a GPU, where the prefill "
                                  "attention kernel copies a key tile out of one block with TMA; 16 on the CPU)")
    kv_cache_memory_gib: float | None = _opt("KV-cache memory in GiB (CPU default 2; GPU default from "
                                             "--gpu-memory-utilization)")
    gpu_memory_utilization: float = _opt("Share of GPU memory the engine may use", default=0.9)
    num_kv_blocks: int | None = _opt("Exact number of KV blocks (overrides the memory-based size)")
    max_num_seqs: int = _opt("Most requests running at once", default=256)
    max_num_batched_tokens: int = _opt("Token budget per engine step (prefill chunks are cut to it)",
                                       default=2048)
    enable_prefix_caching: bool = _opt("Reuse the KV of shared prompt prefixes", default=True)
    tensor_parallel_size: int = _opt("Tensor-parallel size (processes / GPUs)", default=1, aliases=["-tp"])
    comm_strategy: str = _opt("All-reduce strategy for tensor parallelism", default="auto",
                              choices=list(COMM_STRATEGIES))
    num_threads: int | None = _opt("CPU threads (default: physical cores)")
    enforce_eager: bool = _opt("Run every step eagerly: no CUDA graphs for decode steps on a GPU (a faster "
                               "start, slower decode), no recorded decode tapes on the CPU", default=False)
    async_scheduling: str = _opt("Queue each decode step while the one before still runs, so that the host's "
                                 "work (detokenising, stop checks, scheduling) overlaps the device's: auto = on a "
                                 "GPU at tensor-parallel size 1", default="auto", choices=["auto", "on", "off"])
    seed: int = _opt("Seed of the default random generator", default=0)
    pooling: str = _opt("How /v1/embeddings pools the final hidden states of a model without a "
                        "sentence-transformers pooling configuration: the last token or the mean of all tokens "
                        "(then L2-normalised)", default="last", choices=["last", "mean"])
    deterministic: bool = _opt("Batch-invariant CPU kernels: a greedy (or seeded) request gives the same tokens "
                               "alone or beside any other requests, at some speed (CPU, tensor-parallel size 1)",
                               default=False)
    speculative_config: str | None = _opt("Speculative decoding, vLLM's JSON: {\"method\": \"ngram\", "
                                          "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, "
                                          "\"prompt_lookup_min\": 2} (prompt lookup) or {\"model\": PATH, "
                                          "\"num_speculative_tokens\": 4} (a draft model with the same "
                                          "tokenizer): several tokens per step, the same output distribution")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(EngineConfig):
            meta = dict(f.metadata)
            flag = "--" + f.name.replace("_", "-")
            names = [flag, *meta.pop("aliases", [])]
            help_ = meta.pop("help", "")
            kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_}
            if f.type in ("bool", bool):
                kw["action"] = argparse.BooleanOptionalAction
            else:
                typ = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
                kw["type"] = typ
                if "choices" in meta:
                    kw["choices"] = meta["choices"]
            parser.add_argument(*names, **kw)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})
