"""Will a model fit? An estimate per GPU of weights + KV cache for a chosen context + a fixed overhead,
against the GPU's memory times the share the engine may use. Plain arithmetic, no I/O.

Kestrel dequantizes GGUF weights at load today, so a quantized file takes its parameter count times the
load dtype's width in memory, not its size on disk; ``weights_in_memory`` says which applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import tp_size_fits

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
INT8_BYTES_PER_PARAM = 1 + 4 / 32  # --quantization int8: int8 weights plus an fp32 scale per 32
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

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelShape | None:
        cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            ffn = cfg.get("intermediate_size")
            return cls(
                num_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                hidden_size=hidden,
                vocab_size=int(cfg.get("vocab_size") or 0),
                max_context=cfg.get("max_position_embeddings"),
                intermediate_size=ffn if isinstance(ffn, int) and ffn > 0 else None,
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
            return cls(num_layers=int(get("block_count")), num_attention_heads=heads, num_kv_heads=kv,
                       head_dim=int(head_dim), hidden_size=hidden, vocab_size=int(vocab_size or 0),
                       max_context=get("context_length"),
                       intermediate_size=int(ffn) if isinstance(ffn, int) and ffn > 0 else None)
        except (TypeError, ValueError, ZeroDivisionError):
            return None

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of every layer for one token, on one rank (KV heads are split across ranks, and
        replicated when there are fewer of them than ranks)."""
        heads_per_rank = max(1, -(-self.num_kv_heads // tp))
        return 2 * self.num_layers * heads_per_rank * self.head_dim * dtype_bytes


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


def weights_in_memory(num_params: int | None, dtype: str, file_bytes: int | None,
                      keeps_quantized: bool, quantization: str = "none") -> int | None:
    """Bytes the engine holds for the weights: int8 bytes when it quantizes them while loading, the file's size
    where it keeps them quantized (--quantization gguf), else the parameter count times the dtype's width."""
    if quantization == "int8" and num_params:
        return int(num_params * INT8_BYTES_PER_PARAM)
    if (keeps_quantized or quantization == "gguf") and file_bytes:
        return file_bytes
    if num_params:
        return num_params * DTYPE_BYTES.get(dtype, 2)
    return file_bytes


def can_estimate(facts) -> tuple[bool, str]:
    """Whether a memory estimate means anything for a model (app.model_inspect.ModelFacts), and if not, why in
    words: a file that is not a model Kestrel can read (garbage, a truncated or foreign file) has no known size
    in memory; its size on disk says nothing, so no "it fits"."""
    if not getattr(facts, "readable", True):
        why = getattr(facts, "reason", "") or "the file cannot be read"
        return False, f"Cannot tell how much memory this needs: this is not a model file Kestrel can read ({why})."
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


def tp_fits(tp: int, shape: ModelShape | None) -> bool:
    """Whether the engine can split the model over ``tp`` ranks (engine.config.tp_size_fits: the attention and
    KV heads as QKVParallelLinear splits them, and the MLP's width); an unknown shape does not rule it out."""
    if shape is None:
        return tp >= 1
    if shape.intermediate_size and shape.intermediate_size % tp:
        return False
    return tp_size_fits(tp, shape.num_attention_heads, shape.num_kv_heads)


def tp_sizes(max_size: int, shape: ModelShape | None = None) -> list[int]:
    """Every TP size from 1 to ``max_size`` the model splits into."""
    return [tp for tp in range(1, max(1, max_size) + 1) if tp_fits(tp, shape)]


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


def human_count(n: int | None) -> str:
    """A parameter count: 1.24 B, 135 M, 131 K."""
    if not n:
        return "?"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {unit}" if unit == "B" else f"{n / div:.0f} {unit}"
    return str(n)
