"""The writer that the benchmark's random-weight GGUF files share (engine/bench/gguf_models.py's Llama shapes,
engine/bench/gguf_moe_models.py's Qwen3-MoE shapes): the header every one carries (name, description, sizes, rope
base, norm epsilon, vocabulary, file type, the embedded SmolLM2's tokenizer), the architecture's own keys, the
tensor table, then the tensors one at a time (about one tensor of memory): 1-D ones (norms) all ones, float 2-D
ones normal with the shape's ``std``, quantized ones from the caller's ``blocks``. Tensor ``i`` draws from
``numpy.random.default_rng([seed, i])``, so a file's bytes follow from its spec alone."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

# (llama.cpp's GGUF name, numpy shape: [rows, cols], experts [experts, rows, cols], in the file's type (else F32))
TensorSpec = tuple[str, tuple[int, ...], bool]


class RandomShape(Protocol):
    """What the writer reads of a model shape (LlamaShape, Qwen3MoeShape)."""
    context: int
    hidden: int
    layers: int
    std: float
    seed: int


def write_random_gguf(path: Path, *, arch: str, qtype: str, file_type: str, description: str, shape: RandomShape,
                      tensors: Callable[[int], list[TensorSpec]], add_hparams: Callable[[object], None],
                      rope_base: float, rms_eps: float, blocks: Callable[[tuple[int, ...], object], object],
                      tokenizer_source: Path | None = None) -> Path:
    """Write a random ``arch`` model to ``path``: ``tensors(vocab)`` lists its tensors, ``add_hparams(writer)``
    adds the architecture's keys between the block count and the rope base (feed-forward and head sizes),
    ``blocks(shape, rng)`` draws a quantized tensor's data (the file's ``qtype``; ``file_type`` is the
    gguf.LlamaFileType name)."""
    import gguf
    import numpy as np

    from engine.bench.gguf_tokenizer import add_tokenizer_metadata, read_tokenizer_metadata

    ggml_type = gguf.GGMLQuantizationType[qtype]
    block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
    meta = read_tokenizer_metadata(tokenizer_source)
    vocab = len(meta["tokenizer.ggml.tokens"])

    w = gguf.GGUFWriter(None, arch)
    w.add_name(f"random-{arch}-{qtype}")
    w.add_description(description)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    add_hparams(w)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType[file_type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer_metadata(w, meta)

    specs = tensors(vocab)
    for name, dims, quantized in specs:
        n = math.prod(dims)
        if quantized:
            w.add_tensor_info(name, dims, np.dtype(np.float32), n // block * type_size, raw_dtype=ggml_type)
        else:
            w.add_tensor_info(name, dims, np.dtype(np.float32), n * 4)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (_, dims, quantized) in enumerate(specs):
        rng = np.random.default_rng([shape.seed, i])
        if quantized:
            w.write_tensor_data(blocks(dims, rng))
        elif len(dims) == 1:
            w.write_tensor_data(np.ones(dims, dtype=np.float32))
        else:  # a float matrix (the MoE router, F32 as llama.cpp's converter keeps it)
            w.write_tensor_data((rng.standard_normal(dims, dtype=np.float32) * shape.std).astype(np.float32))
    w.close()
    return path
