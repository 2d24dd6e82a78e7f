"""Will a model fit? An estimate per GPU of weights + KV cache for a chosen context + a fixed overhead,
against the GPU's memory times the share the engine may use. Plain arithmetic, no I/O.

Kestrel keeps a GGUF file's blocks on the CPU by default (--quantization auto, where the native kernels are built;
--quantization gguf asks for it) and dequantizes them on a GPU or with --quantization none, where a quantized file
takes its parameter count times the load dtype's width in memory, not its size on disk; and --quantization
int8 / int4 / fp8 requantize the linear layers while loading. ``weights_bytes`` says what applies: the linear layers'
parameters times the bytes a parameter takes in the chosen format, plus the token embedding, LM head and the rest
(norms, biases) in the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import tp_size_fits
from engine.expert_blocks import kept_block, splits_on_blocks

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}  # fp8: --kv-cache-dtype fp8 (e4m3)
INT8_BYTES_PER_PARAM = 1 + 4 / 32  # --quantization int8 on the CPU: int8 weights plus an fp32 scale per 32
# --quantization int8 on a GPU: int8 weights, one float16 scale + one uint8 zero per output channel (3 bytes a row:
# negligible next to the row's K bytes). The LM head takes this form under every GPU mode (engine/layers/embedding.py
# quantize_head: 4 bits or e4m3 would cost the logits more than the bytes they save)
GPU_INT8_BYTES_PER_PARAM = 1.0
INT4_BYTES_PER_PARAM = 0.5 + 3 / 128  # --quantization int4 (GPU): 4-bit codes, a float16 scale + uint8 zero per 128
FP8_BYTES_PER_PARAM = 1.0  # --quantization fp8 (GPU): e4m3 weights, a float32 scale per output channel
FP8_MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards
FP8_REASON = "needs FP8 tensor cores (compute capability 8.9+: RTX 40-series, RTX 6000 Ada, L40, H100)"
GPU_ONLY_QUANTIZATIONS = ("int4", "fp8")
# --kv-cache-dtype fp8 with multi-head latent attention (engine/runner/load_checks.py refuses it at load)
MLA_FP8_KV_REASON = "not for multi-head latent attention: its latent KV cache stays in the model dtype"
# checkpoints whose weights are already quantized (model_inspect: config.json's quantization_config.quant_method):
# on a GPU they stay quantized (about the files' size); on the CPU they are dequantized to the dtype at load (MXFP4:
# gpt-oss's experts, which the engine runs on the CPU only)
PREQUANTIZED_METHODS = ("GPTQ", "AWQ", "FP8", "MXFP4")
GPU_OVERHEAD = 1.0 * GIB  # CUDA context, activations, sampler buffers (rough)
CPU_OVERHEAD = 0.5 * GIB


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_context: int | None = None
    intermediate_size: int | None = None  # the MLP's width (a TP size must divide it too)
    tie_word_embeddings: bool | None = None  # the LM head is the token embedding; None: unknown (see param_split)
    # mixture of experts (None: a dense model): the routed experts per layer, how many a token uses, and a shared
    # expert's width (Qwen2-MoE, DeepSeek); intermediate_size is then one expert's width (what TP splits)
    num_experts: int | None = None
    experts_used: int | None = None
    shared_intermediate_size: int | None = None
    dense_intermediate_size: int | None = None  # an MoE's dense MLP layers' width (DeepSeek's first layers)
    # multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one row of kv_lora_rank + qk_rope_head_dim
    # values per token and layer (engine/layers/mla.py), the same on every TP rank; None: full K and V
    kv_latent_size: int | None = None
    # and its parameters per layer (linear, norms): q_a_proj + q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj,
    # o_proj in place of q, k, v, o of head_dim; q_a_layernorm, kv_a_layernorm (latent_attention_params)
    latent_attention: tuple[int, int] | None = None
    dense_layers: int = 0  # an MoE's leading dense MLP layers, dense_intermediate_size wide (first_k_dense_replace)
    # a GGUF MoE's routed experts' down projections: their tensor types (app/model_inspect.py reads them), whose
    # blocks a TP size must not split where the CPU keeps them (expert_block); () for other models
    expert_down_types: tuple[str, ...] = ()

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelShape | None:
        cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            ffn = cfg.get("intermediate_size")
            tied = cfg.get("tie_word_embeddings")
            experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
            shared = dense = None
            if experts:  # Mixtral: intermediate_size is an expert's width; the others name it moe_intermediate_size
                ffn = cfg.get("moe_intermediate_size") or ffn
                shared = cfg.get("shared_expert_intermediate_size") or (
                    (cfg.get("n_shared_experts") or 0) * (cfg.get("moe_intermediate_size") or 0)) or None
                if cfg.get("moe_intermediate_size") and (cfg.get("first_k_dense_replace") or cfg.get("mlp_only_layers")
                                                         or (cfg.get("decoder_sparse_step") or 1) > 1
                                                         or (cfg.get("moe_layer_freq") or 1) > 1):
                    dense = cfg.get("intermediate_size")
            latent = (int(cfg.get("kv_lora_rank") or 0) + int(cfg.get("qk_rope_head_dim") or 0)
                      if cfg.get("kv_lora_rank") else None)
            mla = latent_attention_params(
                hidden, heads, cfg.get("q_lora_rank"), cfg.get("kv_lora_rank"), cfg.get("qk_nope_head_dim"),
                cfg.get("qk_rope_head_dim"), cfg.get("v_head_dim")) if latent else None
            return cls(
                num_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                hidden_size=hidden,
                vocab_size=int(cfg.get("vocab_size") or 0),
                max_context=cfg.get("max_position_embeddings"),
                intermediate_size=ffn if isinstance(ffn, int) and ffn > 0 else None,
                tie_word_embeddings=tied if isinstance(tied, bool) else None,
                num_experts=int(experts) if experts else None,
                experts_used=int(cfg.get("num_experts_per_tok") or 0) or None if experts else None,
                shared_intermediate_size=int(shared) if shared else None,
                dense_intermediate_size=int(dense) if isinstance(dense, int) and dense > 0 else None,
                kv_latent_size=latent,
                dense_layers=int(cfg.get("first_k_dense_replace") or 0) if experts and dense else 0,
                latent_attention=mla,
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any], vocab_size: int | None = None) -> ModelShape | None:
        arch = md.get("general.architecture")

        def get(key: str, default: Any = None) -> Any:
            return md.get(f"{arch}.{key}", default)

        try:
            heads = int(get("attention.head_count"))
            hidden = int(get("embedding_length"))
            kv = get("attention.head_count_kv", heads)
            kv = max(kv) if isinstance(kv, list) else int(kv)
            head_dim = get("attention.key_length") or hidden // heads
            ffn = get("feed_forward_length")
            experts = get("expert_count")
            if experts:  # llama.cpp's MoE keys (a Mixtral file's feed_forward_length is already an expert's)
                ffn = get("expert_feed_forward_length") or ffn
            # Qwen2-MoE writes the shared expert's width, deepseek2 how many shared experts of an expert's width
            shared = (get("expert_shared_feed_forward_length")
                      or int(get("expert_shared_count") or 0) * int(ffn or 0)) if experts else None
            leading_dense = int(get("leading_dense_block_count") or 0) if experts else 0  # deepseek2
            dense = get("feed_forward_length") if leading_dense else None
            kv_lora = get("attention.kv_lora_rank")  # llama.cpp's deepseek2: MLA, with the rope part's width
            rope = int(get("rope.dimension_count") or 0)
            latent = int(kv_lora) + rope if kv_lora else None
            mla = None
            if kv_lora:  # newer files: key_length / value_length are the latent's, the heads' in *_mla
                qk = get("attention.key_length_mla") or get("attention.key_length")
                v = get("attention.value_length_mla") or get("attention.value_length")
                mla = latent_attention_params(hidden, heads, get("attention.q_lora_rank"), kv_lora,
                                              int(qk) - rope if qk else None, rope, v)
            return cls(num_layers=int(get("block_count")), num_attention_heads=heads, num_kv_heads=kv,
                       head_dim=int(head_dim), hidden_size=hidden, vocab_size=int(vocab_size or 0),
                       max_context=get("context_length"),
                       intermediate_size=int(ffn) if isinstance(ffn, int) and ffn > 0 else None,
                       num_experts=int(experts) if experts else None,
                       experts_used=int(get("expert_used_count") or 0) or None if experts else None,
                       shared_intermediate_size=int(shared) if shared else None, kv_latent_size=latent,
                       dense_intermediate_size=int(dense) if dense else None,
                       dense_layers=leading_dense if dense else 0, latent_attention=mla)
        except (TypeError, ValueError, ZeroDivisionError):
            return None

    def linear_params(self) -> int | None:
        """Parameters of the linear layers (q, k, v, o, gate, up, down of every layer): the weights
        --quantization int8 / int4 / fp8 quantize. None without the MLP's width."""
        if not self.intermediate_size:
            return None
        return self._linear_params(self.num_experts or 1)

    def _linear_params(self, experts: int) -> int:
        """The linear layers with ``experts`` routed experts per layer (an MoE's router and shared expert too)."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.latent_attention[0] if self.latent_attention else h * (q + 2 * kv) + q * h
        mlp = experts * 3 * h * self.intermediate_size
        if self.num_experts:
            mlp += self.num_experts * h + 3 * h * (self.shared_intermediate_size or 0)
        dense = self.dense_layers * 3 * h * (self.dense_intermediate_size or 0)  # the leading dense layers
        return self.num_layers * attention + (self.num_layers - self.dense_layers) * mlp + dense

    def norm_params(self) -> int:
        """The norms' parameters: two per layer and the final one, plus multi-head latent attention's two."""
        extra = self.latent_attention[1] if self.latent_attention else 0
        return (2 * self.num_layers + 1) * self.hidden_size + self.num_layers * extra

    def inactive_params(self) -> int:
        """Parameters a token does not read: the experts it is not routed to (0 for a dense model or an MoE shape
        without the width or the count used)."""
        if not (self.num_experts and self.experts_used and self.intermediate_size):
            return 0
        return self._linear_params(self.num_experts) - self._linear_params(self.experts_used)

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of every layer for one token, on one rank (KV heads are split across ranks, and
        replicated when there are fewer of them than ranks); under multi-head latent attention the one latent row
        per layer (engine.config.ModelConfig.kv_cache_layout), which every rank holds whole."""
        if self.kv_latent_size:
            return self.num_layers * self.kv_latent_size * dtype_bytes
        heads_per_rank = max(1, -(-self.num_kv_heads // tp))
        return 2 * self.num_layers * heads_per_rank * self.head_dim * dtype_bytes


def latent_attention_params(hidden: int, heads: int, q_lora_rank: Any, kv_lora_rank: Any, qk_nope: Any,
                            qk_rope: Any, v_head: Any) -> tuple[int, int] | None:
    """Multi-head latent attention's (linear, norm) parameters per layer, as transformers' DeepseekV2/V3 attention
    holds them: q_a_proj + q_b_proj (or q_proj without a q_lora_rank), kv_a_proj_with_mqa, kv_b_proj, o_proj; the
    norms q_a_layernorm and kv_a_layernorm. None when a width is missing."""
    try:
        rank, nope, rope, v = int(kv_lora_rank), int(qk_nope), int(qk_rope), int(v_head)
    except (TypeError, ValueError):
        return None
    q_rank = int(q_lora_rank or 0)
    q = q_rank * (hidden + heads * (nope + rope)) if q_rank else hidden * heads * (nope + rope)
    linear = q + hidden * (rank + rope) + rank * heads * (nope + v) + heads * v * hidden
    return linear, q_rank + rank


@dataclass(frozen=True)
class Estimate:
    tp: int
    weights: int  # bytes per device
    kv_cache: int
    overhead: int
    capacity: int | None  # bytes the engine may use per device; None when unknown
    device: str = "GPU"  # "GPU" | "CPU"

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.total <= self.capacity

    def describe(self) -> str:
        where = "per GPU" if self.device == "GPU" else "of RAM"
        return (f"{gib(self.total)} {where} (weights {gib(self.weights)}, KV {gib(self.kv_cache)}, overhead {gib(self.overhead)})")


@dataclass(frozen=True)
class ParamSplit:
    """A model's parameters by how --quantization treats them."""

    linear: int  # q, k, v, o, gate, up, down: what int8 / int4 / fp8 quantize
    embedding: int  # the token table
    lm_head: int  # 0 when tied to the token table (counted once, in ``embedding``)
    rest: int  # norms, biases: always in the dtype

    @property
    def total(self) -> int:
        return self.linear + self.embedding + self.lm_head + self.rest


def param_split(shape: ModelShape | None, num_params: int | None) -> ParamSplit | None:
    """Split a model's parameters into the linear layers, the token embedding, the LM head and the rest. The linear
    layers come from the shape; with a parameter count (the files' tensors) the rest is what is left, which also
    tells a tied LM head (the count then holds the token table once) where the config does not say. Without a
    parameter count the embedding and head come from the shape too (tied only where the config says so).
    None when neither the shape nor the count tells."""
    if shape is None:
        return ParamSplit(num_params, 0, 0, 0) if num_params else None
    table = shape.vocab_size * shape.hidden_size
    linear = shape.linear_params()
    if linear is None:  # no MLP width: the linear layers are what the tables and norms leave
        if not num_params:
            return None
        tied = bool(shape.tie_word_embeddings)
        tables = table * (1 if tied else 2)
        if num_params <= tables:
            return ParamSplit(num_params, 0, 0, 0)
        return ParamSplit(num_params - tables, table, 0 if tied else table, 0)
    norms = shape.norm_params()
    if num_params and num_params > linear:
        other = num_params - linear
        tied = shape.tie_word_embeddings
        if tied is None:
            tied = other < 1.5 * table
        tables = min(other, table * (1 if tied else 2))
        embedding = min(tables, table)
        return ParamSplit(linear, embedding, tables - embedding, other - tables)
    tied = bool(shape.tie_word_embeddings)
    return ParamSplit(linear, table, 0 if tied else table, norms)


def linear_bytes_per_param(quantization: str | None, gpu: bool, dtype: str) -> float:
    """Bytes a linear layer's parameter takes with --quantization ``quantization`` on a GPU or the CPU."""
    if quantization == "int8":
        return GPU_INT8_BYTES_PER_PARAM if gpu else INT8_BYTES_PER_PARAM
    if quantization == "int4":
        return INT4_BYTES_PER_PARAM
    if quantization == "fp8":
        return FP8_BYTES_PER_PARAM
    return DTYPE_BYTES.get(dtype, 2)


@dataclass(frozen=True)
class WeightBytes:
    """The weights in memory for the whole model (not per rank): ``linear`` the linear layers in the chosen format,
    ``head`` the LM head where it is quantized (0 where it is in the dtype, counted in ``other``), ``other`` the token
    embedding, the float LM head and the norms in the dtype; ``from_file``: the files' size (GGUF blocks kept, or a
    checkpoint's quantized weights kept on a GPU)."""

    linear: int
    other: int
    from_file: bool = False
    head: int = 0

    @property
    def total(self) -> int:
        return self.linear + self.head + self.other


def prequantized_method(facts) -> str | None:
    """"GPTQ" / "AWQ" / "FP8" for a checkpoint already quantized (a Hugging Face folder whose config names its
    quantization method), else None."""
    quant = (getattr(facts, "quantization", None) or "").upper()
    return quant if getattr(facts, "format", "") == "safetensors" and quant in PREQUANTIZED_METHODS else None


def weights_bytes(num_params: int | None, dtype: str, file_bytes: int | None, keeps_quantized: bool,
                  quantization: str | None = "auto", shape: ModelShape | None = None, gpu: bool = False,
                  prequantized: str | None = None, fp8_ok: bool | None = None) -> WeightBytes | None:
    """What the engine holds for the weights with --quantization ``quantization`` on a GPU (``gpu``) or the CPU
    (engine/runner/model_runner.py ``_quantize``, engine/layers/linear.py ``load_checkpoint_quant``):
    - none: the parameters times the dtype's width (a GGUF file dequantized);
    - auto (the default): as gguf on the CPU where the engine keeps GGUF blocks (``keeps_quantized``: its native
      kernels are built), else as none (engine.config.auto_quantization);
    - int8 (CPU): the linear layers and the LM head in int8 with an fp32 scale per 32 (a tied head gets an int8 copy
      beside the token table, which stays in the dtype);
    - int8 / int4 / fp8 (GPU): the linear layers at GPU_INT8 / INT4 / FP8_BYTES_PER_PARAM, the LM head in int8 with a
      scale per row whatever the mode (a tied head: an int8 copy), the token table and the norms in the dtype;
    - gguf: the file's size (its linear weights, token table and LM head stay as their blocks);
    - a GPTQ / AWQ / FP8 checkpoint (``prequantized``: the method): on a GPU its quantized weights stay as they are,
      whatever the mode: about the files' size (an FP8 one is dequantized on a GPU without FP8 tensor cores:
      ``fp8_ok`` False); on the CPU dequantized to the dtype (then int8 if asked). Its parameter count from the files
      counts packed words: the shape says the real one.
    None when nothing tells the model's size."""
    quantization = quantization or "auto"
    width = DTYPE_BYTES.get(dtype, 2)
    if prequantized:
        kept = gpu and not (prequantized.upper() == "FP8" and fp8_ok is False)
        if kept and file_bytes:
            return WeightBytes(0, file_bytes, from_file=True)
        num_params = None  # packed codes: the files' element count is not the parameter count
    elif quantization == "gguf" or (quantization == "auto" and keeps_quantized and not gpu):
        if file_bytes:
            return WeightBytes(0, file_bytes, from_file=True)
    split = param_split(shape, num_params)
    if split is None:
        return WeightBytes(0, file_bytes, from_file=True) if file_bytes and not prequantized else None
    if quantization in ("int8", "int4", "fp8") and (gpu or quantization == "int8"):
        head = split.lm_head or split.embedding  # a tied head: a quantized copy beside the float token table
        head_bytes = GPU_INT8_BYTES_PER_PARAM if gpu else INT8_BYTES_PER_PARAM
        return WeightBytes(int(split.linear * linear_bytes_per_param(quantization, gpu, dtype)),
                           (split.embedding + split.rest) * width, head=int(head * head_bytes))
    return WeightBytes(split.linear * width, (split.embedding + split.lm_head + split.rest) * width)


def weights_in_memory(num_params: int | None, dtype: str, file_bytes: int | None,
                      keeps_quantized: bool, quantization: str = "auto", shape: ModelShape | None = None,
                      gpu: bool = False, prequantized: str | None = None) -> int | None:
    """Bytes the engine holds for the weights (weights_bytes(...).total)."""
    w = weights_bytes(num_params, dtype, file_bytes, keeps_quantized, quantization, shape, gpu, prequantized)
    return w.total if w is not None else None


def active_params(shape: ModelShape | None, num_params: int | None) -> int | None:
    """The parameters one token's forward pass reads: all of them for a dense model, all but the experts it is not
    routed to for a mixture of experts (None when the count is unknown)."""
    if not num_params:
        return None
    inactive = shape.inactive_params() if shape is not None else 0
    return num_params - inactive if 0 < inactive < num_params else num_params


def params_text(num_params: int | None, shape: ModelShape | None) -> str:
    """A parameter count in words: "1.24 B", or for a mixture of experts "30.53 B total, 3.35 B active (128
    experts, 8 per token)"."""
    active = active_params(shape, num_params)
    if not num_params or shape is None or not shape.num_experts or active == num_params:
        return human_count(num_params)
    return (f"{human_count(num_params)} total, {human_count(active)} active ({shape.num_experts} experts, "
            f"{shape.experts_used} per token)")


def active_weight_bytes(weight_bytes: int, shape: ModelShape | None, num_params: int | None) -> int:
    """The weight bytes one decoded token reads (what its speed follows): ``weight_bytes`` (all experts, as held in
    memory) times the active share of the parameters."""
    active = active_params(shape, num_params)
    if not active or not num_params:
        return weight_bytes
    return int(weight_bytes * active / num_params)


def moe_speed_note(shape: ModelShape | None, num_params: int | None, weight_bytes: int) -> str:
    """For a mixture of experts, the Load panel's line on what memory and speed follow: every expert held, the
    active ones read per token. "" for a dense model."""
    active = active_params(shape, num_params)
    if shape is None or not shape.num_experts or not active or active == num_params:
        return ""
    return (f"Mixture of experts: all {shape.num_experts} experts are in memory; a token reads {shape.experts_used} "
            f"({gib(active_weight_bytes(weight_bytes, shape, num_params))}, {human_count(active)} active), so it "
            f"decodes like a {human_count(active)} model.")


def can_estimate(facts) -> tuple[bool, str]:
    """Whether a memory estimate means anything for a model (app.model_inspect.ModelFacts), and if not, why in
    words: a file that is not a model Kestrel can read (garbage, a truncated or foreign file) has no known size
    in memory; its size on disk says nothing, so no "it fits"."""
    if not getattr(facts, "readable", True):
        why = getattr(facts, "reason", "") or "the file cannot be read"
        # no brackets around the reason: it has its own ("not a GGUF file (it starts with ...)")
        return False, f"Cannot tell how much memory this needs. This is not a model file Kestrel can read: {why}."
    if not getattr(facts, "num_params", None) and getattr(facts, "shape", None) is None:
        return False, "Cannot tell how much memory this needs: the file does not say how large the model is."
    return True, ""


def estimate(weight_bytes: int, shape: ModelShape | None, context: int, tp: int, dtype: str,
             capacity: int | None, gpu: bool = True) -> Estimate:
    dtype_bytes = DTYPE_BYTES.get(dtype, 2)
    kv = shape.kv_bytes_per_token(dtype_bytes, tp) * context if shape is not None else 0
    return Estimate(tp=tp, weights=-(-weight_bytes // tp), kv_cache=kv,
                    overhead=int(GPU_OVERHEAD if gpu else CPU_OVERHEAD), capacity=capacity,
                    device="GPU" if gpu else "CPU")


def fp8_supported(capabilities: list[tuple[int, int] | None]) -> bool | None:
    """Whether every GPU (its CUDA compute capability, None where unknown) has FP8 tensor cores: False when one is
    known to be older than 8.9, None when one is unknown and none is known to be older."""
    if any(c is not None and tuple(c) < FP8_MIN_CAPABILITY for c in capabilities):
        return False
    return None if not capabilities or any(c is None for c in capabilities) else True


def max_context(capacity: int, weight_bytes: int, shape: ModelShape | None, tp: int, dtype: str,
                gpu: bool = True) -> int | None:
    """The longest context one sequence's KV cache leaves room for beside the weights and the overhead."""
    if shape is None:
        return None
    per_token = shape.kv_bytes_per_token(DTYPE_BYTES.get(dtype, 2), tp)
    room = capacity - estimate(weight_bytes, shape, 0, tp, dtype, capacity, gpu).total
    return max(0, room // per_token) if per_token else None


def expert_block(shape: ModelShape | None, quantization: str, on_gpu: bool) -> tuple[str, int] | None:
    """(type, columns) of the experts' blocks a TP size must split on boundaries (engine/expert_blocks.py, the rule
    the engine refuses other sizes by): a GGUF MoE whose experts the CPU keeps as blocks (--quantization auto or
    gguf); None on a GPU or with --quantization none / int8 (the experts dequantized: any size that divides works)."""
    if shape is None or on_gpu or quantization not in ("auto", "gguf") or not shape.intermediate_size:
        return None
    return kept_block(shape.expert_down_types)


def tp_fits(tp: int, shape: ModelShape | None, block: tuple[str, int] | None = None) -> bool:
    """Whether the engine can split the model over ``tp`` ranks (engine.config.tp_size_fits: the attention and
    KV heads as QKVParallelLinear splits them, and the MLP's width; with ``block``, ``expert_block``'s, each rank's
    slice of the experts whole blocks); an unknown shape does not rule it out."""
    if shape is None:
        return tp >= 1
    if any(width % tp for _, width in mlp_widths(shape)):
        return False
    if block is not None and not splits_on_blocks(shape.intermediate_size, tp, block[1]):
        return False
    return tp_size_fits(tp, shape.num_attention_heads, shape.num_kv_heads)


def tp_misfit(tp: int, shape: ModelShape | None, block: tuple[str, int] | None = None) -> str:
    """Why the model does not split over ``tp`` ranks, in words ("its 9 attention heads do not divide into 2 equal
    groups"); "" when it does."""
    if shape is None or tp_fits(tp, shape, block):
        return ""
    heads, kv = shape.num_attention_heads, shape.num_kv_heads
    if heads % tp:
        return f"its {heads} attention heads do not divide into {tp} equal groups"
    if kv >= tp and kv % tp:
        return f"its {kv} KV heads do not divide into {tp} equal groups"
    if kv < tp and tp % kv:
        return f"its {kv} KV heads can be neither split nor evenly copied over {tp} ranks"
    for name, width in mlp_widths(shape):
        if width % tp:
            return f"its {name} ({width:,}) does not divide by {tp}"
    if block is not None:  # the experts' blocks: --quantization none dequantizes them (any dividing size works)
        return (f"its experts' {block[0]} blocks ({block[1]} columns each) would be split: {tp} ranks take "
                f"{shape.intermediate_size // tp:,} of the {shape.intermediate_size:,} columns each (quantization "
                f"\"none\" dequantizes the experts and allows it, at several times the memory)")
    return "it does not split over that many ranks"


def mlp_widths(shape: ModelShape) -> list[tuple[str, int]]:
    """The MLP widths TP splits, named as the Load panel says them: a dense model's MLP, or an MoE's expert width,
    shared expert width and dense layers' width (engine.executor.tp_executor.check_tp_size checks the same)."""
    if not shape.num_experts:
        return [("MLP width", shape.intermediate_size)] if shape.intermediate_size else []
    named = [("expert width", shape.intermediate_size), ("shared expert width", shape.shared_intermediate_size),
             ("dense MLP width", shape.dense_intermediate_size)]
    return [(name, width) for name, width in named if width]


def tp_sizes(max_size: int, shape: ModelShape | None = None, block: tuple[str, int] | None = None) -> list[int]:
    """Every TP size from 1 to ``max_size`` the model splits into (with ``block``: on its experts' blocks)."""
    return [tp for tp in range(1, max(1, max_size) + 1) if tp_fits(tp, shape, block)]


def tp_choices(num_gpus: int, shape: ModelShape | None = None) -> list[int]:
    """Powers of two up to the number of GPUs that the model splits into."""
    sizes = []
    tp = 1
    while tp <= max(1, num_gpus):
        if tp_fits(tp, shape):
            sizes.append(tp)
        tp *= 2
    return sizes


def gib(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / GIB:.1f} GiB" if n >= 0.1 * GIB else f"{n / 1024**2:.0f} MiB"


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def gib_round(n: float) -> str:
    """A GPU's memory as its box says it: 24 GiB, 80 GiB, 11.5 GiB."""
    g = n / GIB
    return f"{g:.0f} GiB" if g >= 10 else f"{g:.1f}".removesuffix(".0") + " GiB"


def context_words(tokens: int) -> str:
    """A context length as people say it: 8k, 16k, 128k; 3,000 tokens where it is no whole number of 1024s."""
    return f"{tokens // 1024}k" if tokens >= 1024 and tokens % 1024 == 0 else f"{tokens:,}-token"


def human_count(n: int | None) -> str:
    """A parameter count: 1.24 B, 135 M, 131 K."""
    if not n:
        return "?"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {unit}" if unit == "B" else f"{n / div:.0f} {unit}"
    return str(n)
