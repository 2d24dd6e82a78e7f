"""The GGUF models of `kestrel bench offline --gguf-models`: the embedded SmolLM2-135M Q4_1, and random-weight
Llama-shape models of about a billion parameters that the bench writes itself with the `gguf` package (Q4_0, Q8_0):
big enough that a decode step streams the weights from memory, which is what the quantized kernels are for.

A random model is written once into the cache directory (``--workdir``, default the platformdirs user cache,
``<cache>/bench-models``) under a name that carries its shape, type and seed, and reused while that file is there.
Weights are seeded normal (std 0.02), norms 1, the embedding tied to the LM head (as Llama 3.2 1B), every 2-D
tensor in the file's type (as llama.cpp's ``llama-quantize`` would, bar its Q6_K output tensor), the tokenizer
the embedded SmolLM2's (a real byte-level BPE both engines read: vocab 49152), llama-arch metadata. Tensors are
generated, quantized and written one at a time, so writing needs about one tensor of memory."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from engine.bench.gguf_moe_models import RandomQwen3Moe
from engine.bench.random_gguf import TensorSpec, write_random_gguf

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # part of the file name: bump when what the writer puts in the file changes


@dataclass(frozen=True)
class LlamaShape:
    hidden: int = 2048
    layers: int = 16
    intermediate: int = 5632
    heads: int = 32
    kv_heads: int = 8
    context: int = 4096
    std: float = 0.02
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_params(self) -> int:
        kv = self.kv_heads * self.head_dim
        attn = self.hidden * (2 * self.hidden + 2 * kv)
        return self.layers * (attn + 3 * self.hidden * self.intermediate)


@dataclass(frozen=True)
class RandomLlama:
    qtype: str  # a GGMLQuantizationType name with a gguf-py quantizer: Q4_0, Q8_0, ...
    shape: LlamaShape = LlamaShape()

    def file_name(self) -> str:
        s = self.shape
        return (f"random-llama-h{s.hidden}-l{s.layers}-i{s.intermediate}-a{s.heads}-kv{s.kv_heads}-s{s.seed}"
                f"-v{FORMAT_VERSION}.{self.qtype}.gguf")

    def write(self, path: Path) -> Path:
        return write_random_llama(path, self)


# --gguf-models names -> "smollm2" (the embedded file) or a random model written by the bench
BENCH_MODELS: dict[str, RandomLlama | RandomQwen3Moe | None] = {
    "smollm2": None,
    "llama-1b-q4_0": RandomLlama("Q4_0"),
    "llama-1b-q8_0": RandomLlama("Q8_0"),
    "qwen3moe-q4_k": RandomQwen3Moe("Q4_K"),  # mixture of experts: engine/bench/gguf_moe_models.py
    "qwen3moe-q8_0": RandomQwen3Moe("Q8_0"),
}
DEFAULT_GGUF_MODELS = ["smollm2", "llama-1b-q4_0", "llama-1b-q8_0"]


def default_workdir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("kestrel")) / "bench-models"


def model_path(name: str, workdir: Path | None = None) -> Path:
    """The GGUF file of a --gguf-models entry: a name of BENCH_MODELS (a random model is written when its file is
    not in ``workdir`` yet) or the path of a .gguf file."""
    if name in BENCH_MODELS:
        spec = BENCH_MODELS[name]
        if spec is None:
            from engine.loader.resolve import default_model_path

            return default_model_path()
        return ensure_random_llama(spec, workdir or default_workdir())
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise ValueError(f"--gguf-models: {name!r} is neither a .gguf file nor one of {', '.join(BENCH_MODELS)}")


def ensure_random_llama(spec: RandomLlama | RandomQwen3Moe, workdir: Path) -> Path:
    """The file of ``spec`` in ``workdir``, written first when it is not there (to a temporary name, then renamed:
    an interrupted write leaves no half file under the real name)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / spec.file_name()
    if path.is_file() and path.stat().st_size > 0:
        return path
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    log.info("writing the benchmark model %s (once; reused from then on)", path)
    print(f"writing the benchmark model {path} (once; reused from then on)", flush=True)
    try:
        spec.write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _tensors(s: LlamaShape, vocab: int) -> list[TensorSpec]:
    """(GGUF name, numpy shape [rows, cols], quantized) in llama.cpp's order: every matrix in the file's type."""
    kv = s.kv_heads * s.head_dim
    out: list[TensorSpec] = [("token_embd.weight", (vocab, s.hidden), True)]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.hidden,), False), (b + "attn_q.weight", (s.hidden, s.hidden), True),
                (b + "attn_k.weight", (kv, s.hidden), True), (b + "attn_v.weight", (kv, s.hidden), True),
                (b + "attn_output.weight", (s.hidden, s.hidden), True), (b + "ffn_norm.weight", (s.hidden,), False),
                (b + "ffn_gate.weight", (s.intermediate, s.hidden), True),
                (b + "ffn_up.weight", (s.intermediate, s.hidden), True),
                (b + "ffn_down.weight", (s.hidden, s.intermediate), True)]
    out.append(("output_norm.weight", (s.hidden,), False))
    return out


def write_random_llama(path: Path, spec: RandomLlama, tokenizer_source: Path | None = None) -> Path:
    """Write ``spec`` to ``path`` (see the module docstring) with engine/bench/random_gguf.py's writer. Random
    weights need no q/k permutation: llama.cpp's rotary layout is as random as Hugging Face's."""
    import gguf
    import numpy as np

    s = spec.shape
    qtype = gguf.GGMLQuantizationType[spec.qtype]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if s.hidden % s.heads or s.hidden % block or s.intermediate % block:
        raise ValueError(f"{spec}: hidden and intermediate must be multiples of {block}, hidden of the heads")

    def hparams(w) -> None:
        w.add_feed_forward_length(s.intermediate)
        w.add_head_count(s.heads)
        w.add_head_count_kv(s.kv_heads)
        w.add_rope_dimension_count(s.head_dim)

    def blocks(shape: tuple[int, ...], rng):  # normal weights through gguf-py's quantizer
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= s.std
        return gguf.quants.quantize(values, qtype)

    return write_random_gguf(
        path, arch="llama", qtype=spec.qtype, file_type=f"MOSTLY_{spec.qtype}",
        description=f"random weights (normal, std {s.std}, seed {s.seed}) written by kestrel bench offline: "
                    f"{asdict(s)}",
        shape=s, tensors=lambda vocab: _tensors(s, vocab), add_hparams=hparams, rope_base=500000.0, rms_eps=1e-5,
        blocks=blocks, tokenizer_source=tokenizer_source)


def small_shape(**overrides) -> LlamaShape:
    """A few-MB shape of the same kind (tests)."""
    return replace(LlamaShape(hidden=128, layers=2, intermediate=256, heads=4, kv_heads=2, context=1024), **overrides)
