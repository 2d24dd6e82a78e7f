"""Random-weight Qwen3-MoE-shape GGUF models for `kestrel bench offline --gguf-models` (names ``qwen3moe-q4_k``,
``qwen3moe-q8_0``): 24 layers, hidden 1024, 32 experts of which 4 are active, expert FFN 512, 16 query heads and 4
KV heads of 128 (Qwen3's head size), an untied LM head over the embedded SmolLM2's vocabulary (49152): 1.43B
parameters in all, 0.33B read per token (attention, 4 experts' three projections, the LM head), about Qwen3-30B-A3B's
proportions at a twentieth of its size. Written with llama.cpp's ``qwen3moe`` names (``blk.N.ffn_gate_inp`` router
in F32 as llama.cpp's converter keeps it, the experts as 3-D ``ffn_{gate,up,down}_exps`` tensors), every other
2-D tensor in the file's type.

The blocks are drawn directly (valid Q8_0 / Q4_K blocks of uniform random codes, with their scales chosen so the
weights have a standard deviation of about ``std`` and mean about zero): quantizing 1.4B float weights with gguf-py's
numpy quantizers would take minutes, and gguf-py has no Q4_K quantizer. Written once into the bench's workdir and
reused, one tensor at a time (about one tensor of memory), like engine/bench/gguf_models.py's Llama files."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from engine.bench.random_gguf import TensorSpec, write_random_gguf

FORMAT_VERSION = 1  # part of the file name: bump when what the writer puts in the file changes


@dataclass(frozen=True)
class Qwen3MoeShape:
    hidden: int = 1024
    layers: int = 24
    experts: int = 32
    experts_used: int = 4
    expert_ffn: int = 512
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 128
    context: int = 4096
    std: float = 0.02
    seed: int = 0

    def attention_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (2 * q + 2 * kv)

    def expert_params(self) -> int:
        """One expert's gate, up and down."""
        return 3 * self.hidden * self.expert_ffn

    def params(self, vocab: int) -> int:
        """Every weight in the file (embedding and LM head untied; norms left out)."""
        per_layer = self.attention_params() + self.experts * (self.expert_params() + self.hidden)
        return self.layers * per_layer + 2 * vocab * self.hidden

    def active_params(self, vocab: int) -> int:
        """The weights one token's decode reads: attention, the router, the active experts, the LM head."""
        per_layer = self.attention_params() + self.experts * self.hidden + self.experts_used * self.expert_params()
        return self.layers * per_layer + vocab * self.hidden


@dataclass(frozen=True)
class RandomQwen3Moe:
    qtype: str  # Q8_0 or Q4_K (the types whose blocks random_blocks can draw)
    shape: Qwen3MoeShape = Qwen3MoeShape()

    def file_name(self) -> str:
        s = self.shape
        return (f"random-qwen3moe-h{s.hidden}-l{s.layers}-e{s.experts}x{s.experts_used}-f{s.expert_ffn}"
                f"-a{s.heads}-kv{s.kv_heads}-d{s.head_dim}-s{s.seed}-v{FORMAT_VERSION}.{self.qtype}.gguf")

    def write(self, path: Path) -> Path:
        return write_random_qwen3moe(path, self)


def random_blocks(qtype: str, n_weights: int, std: float, rng):
    """``n_weights`` weights as valid blocks of ``qtype`` (uint8 [n_blocks, type_size]): uniform random codes and
    one scale for all, so that the weights' standard deviation is about ``std`` and their mean about zero.
    Q8_0: d * q, q uniform in [-127, 127]. Q4_K: d * sc * q - dmin * m with q in [0, 15] and the 6-bit sc, m
    uniform in [0, 63] (random scale bytes), dmin = 7.5 d (the mean of sc * q is 7.5 times the mean of m)."""
    import numpy as np

    if qtype == "Q8_0":
        n = n_weights // 32
        out = np.empty((n, 34), dtype=np.uint8)
        out[:, 2:] = rng.integers(-127, 128, size=(n, 32), dtype=np.int8).view(np.uint8)
        d = np.float16(std / np.sqrt((255**2 - 1) / 12))
        out[:, :2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        return out
    if qtype == "Q4_K":
        n = n_weights // 256
        out = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
        # var(sc q) = E[sc^2] E[q^2] - (E[sc] E[q])^2, var(7.5 m) = 56.25 var(m): sc, m uniform 0..63, q 0..15
        var = 1333.5 * 77.5 - (31.5 * 7.5) ** 2 + 56.25 * (64**2 - 1) / 12
        d = np.float16(std / np.sqrt(var))
        out[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        out[:, 2:4] = np.frombuffer(np.float16(7.5 * float(d)).tobytes(), dtype=np.uint8)
        return out
    raise ValueError(f"random_blocks draws Q8_0 or Q4_K blocks, not {qtype}")


def _tensors(s: Qwen3MoeShape, vocab: int) -> list[TensorSpec]:
    """(GGUF name, numpy shape, quantized) in llama.cpp's order; experts [experts, rows, cols]."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [("token_embd.weight", (vocab, s.hidden), True)]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.hidden,), False), (b + "attn_q.weight", (q, s.hidden), True),
                (b + "attn_q_norm.weight", (s.head_dim,), False), (b + "attn_k.weight", (kv, s.hidden), True),
                (b + "attn_k_norm.weight", (s.head_dim,), False), (b + "attn_v.weight", (kv, s.hidden), True),
                (b + "attn_output.weight", (s.hidden, q), True), (b + "ffn_norm.weight", (s.hidden,), False),
                (b + "ffn_gate_inp.weight", (s.experts, s.hidden), False),
                (b + "ffn_gate_exps.weight", (s.experts, s.expert_ffn, s.hidden), True),
                (b + "ffn_down_exps.weight", (s.experts, s.hidden, s.expert_ffn), True),
                (b + "ffn_up_exps.weight", (s.experts, s.expert_ffn, s.hidden), True)]
    out += [("output_norm.weight", (s.hidden,), False), ("output.weight", (vocab, s.hidden), True)]
    return out


def write_random_qwen3moe(path: Path, spec: RandomQwen3Moe, tokenizer_source: Path | None = None) -> Path:
    """Write ``spec`` to ``path`` (the module docstring says what is in it) with engine/bench/random_gguf.py's
    writer."""
    import math

    import gguf

    s = spec.shape
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[spec.qtype]][0]
    if any(k % block for k in (s.hidden, s.expert_ffn, s.heads * s.head_dim)):
        raise ValueError(f"{spec}: hidden, expert FFN and heads x head_dim must be multiples of {block}")

    def hparams(w) -> None:
        w.add_feed_forward_length(s.expert_ffn * s.experts_used)
        w.add_expert_feed_forward_length(s.expert_ffn)
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
        w.add_head_count(s.heads)
        w.add_head_count_kv(s.kv_heads)
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)

    return write_random_gguf(
        path, arch="qwen3moe", qtype=spec.qtype,
        file_type="MOSTLY_Q8_0" if spec.qtype == "Q8_0" else "MOSTLY_Q4_K_S",
        description=f"random weights (std {s.std}, seed {s.seed}) written by kestrel bench offline: {asdict(s)}",
        shape=s, tensors=lambda vocab: _tensors(s, vocab), add_hparams=hparams, rope_base=1000000.0, rms_eps=1e-6,
        blocks=lambda shape, rng: random_blocks(spec.qtype, math.prod(shape), s.std, rng),
        tokenizer_source=tokenizer_source)


def small_moe_shape(**overrides) -> Qwen3MoeShape:
    """A few-MB shape of the same kind (tests)."""
    return replace(Qwen3MoeShape(hidden=256, layers=2, experts=4, experts_used=2, expert_ffn=256, heads=4,
                                 kv_heads=2, head_dim=64, context=1024), **overrides)


def active_weight_bytes(tensors: dict, metadata: dict) -> tuple[int, int]:
    """(all weight bytes, the bytes one batch-1 decode step reads) of a GGUF file's tensors (GGUFTensorInfo by
    name) and metadata: every 2-D+ tensor, expert tensors (``*_exps``) at ``expert_used_count / expert_count`` of
    their size, the token table at one row unless it is also the LM head (no ``output.weight``)."""
    arch = metadata.get("general.architecture", "llama")
    experts = int(metadata.get(f"{arch}.expert_count") or 0)
    used = int(metadata.get(f"{arch}.expert_used_count") or 0)
    total = active = 0
    for name, t in tensors.items():
        if len(t.shape) < 2:
            continue
        total += t.nbytes
        if "_exps." in name and experts:
            active += t.nbytes * used // experts
        elif name == "token_embd.weight" and "output.weight" in tensors:
            active += t.nbytes // t.shape[0]
        else:
            active += t.nbytes
    return total, active


def read_bandwidth(threads: int, mib: int = 1024, repeats: int = 5) -> float:
    """This machine's memory read bandwidth now (bytes/s): the best of ``repeats`` sums of a ``mib`` MiB float32
    tensor (far past the caches) on ``threads`` threads."""
    import time

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(mib << 18, dtype=torch.float32)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t0)
        return x.numel() * 4 / best
    finally:
        torch.set_num_threads(before)
