"""The tokenizer metadata of the benchmark's random GGUF models: the embedded SmolLM2's byte-level BPE (vocab 49152),
copied into a ``gguf.GGUFWriter`` so that Kestrel and llama.cpp both read a real tokenizer."""

from __future__ import annotations

from pathlib import Path


def read_tokenizer_metadata(source: Path | None = None) -> dict:
    """The GGUF metadata of ``source`` (default: the embedded SmolLM2), whose tokenizer.* keys are copied."""
    from engine.loader.gguf_file import GGUFFile
    from engine.loader.resolve import default_model_path

    tok = GGUFFile(source or default_model_path())
    try:
        return dict(tok.metadata)
    finally:
        tok.close()


def add_tokenizer_metadata(w, meta: dict) -> int:
    """Write ``meta``'s tokenizer (tokens, types, merges, special ids, chat template) into the writer ``w``; the
    vocabulary size."""
    tokens = meta["tokenizer.ggml.tokens"]
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(tokens)
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("unknown_token_id", w.add_unk_token_id), ("padding_token_id", w.add_pad_token_id),
                     ("add_bos_token", w.add_add_bos_token)):
        if f"tokenizer.ggml.{key}" in meta:
            add(meta[f"tokenizer.ggml.{key}"])
    if "tokenizer.chat_template" in meta:
        w.add_chat_template(meta["tokenizer.chat_template"])
    return len(tokens)
