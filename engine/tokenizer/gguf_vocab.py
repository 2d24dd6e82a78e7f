"""Rebuilding a tokenizer from a GGUF file's ``tokenizer.ggml.*`` metadata.

Turns the vocabulary, merges, scores and token types llama.cpp stores into a ``tokenizers.Tokenizer`` exactly
as transformers' GGUF converter does (integrations/gguf): byte-level BPE (``"gpt2"``: Llama 3, Qwen, SmolLM,
...) with the split regex ``tokenizer.ggml.pre`` names, and SentencePiece BPE with byte fallback
(``"llama"``: Llama 2, Mistral, TinyLlama, ...). Also GPT-2's byte -> character table, ``bytes_to_unicode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _BackendTokenizer

from engine.errors import CheckpointError

__all__ = ["GGUF_PRE_TOKENIZER_SPLITS", "bytes_to_unicode", "generate_merges", "gguf_backend", "gguf_metadata"]

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> split regex. Others (gpt2, smollm, starcoder, ...) keep ByteLevel's own GPT-2 regex,
# as transformers does. (For SmolLM2 that is exact: llama.cpp's "smollm" also isolates digits, but its
# vocabulary has no merge involving a digit, so both give the same tokens.)
GGUF_PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"], _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"], _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _GPT4O_SPLIT),
}

_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table: how byte-level BPE vocabularies (GPT-2,
    Llama 3, Qwen, SmolLM, ...) spell each byte in their token strings (e.g. space -> "Ġ", newline -> "Ċ").
    Invert it to get a token's raw bytes back. Cached; do not mutate the returned dict."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def gguf_metadata(source: Any) -> tuple[dict[str, Any], str]:
    """(metadata dict, name for messages) from a GGUFFile, a gguf.GGUFReader or a mapping. A path is refused:
    the loader opens files (engine.loader.gguf_file.GGUFFile), the tokenizer package sits below it."""
    if isinstance(source, Mapping):
        return dict(source), "GGUF metadata"
    if isinstance(source, (str, Path)):
        raise TypeError(f"open the GGUF file first (engine.loader.gguf_file.GGUFFile({str(source)!r})): the "
                        "tokenizer reads metadata, not files")
    if hasattr(source, "metadata") and isinstance(source.metadata, Mapping):  # engine.loader.gguf_file.GGUFFile
        return dict(source.metadata), str(getattr(source, "path", "GGUF file"))
    if hasattr(source, "fields"):  # gguf.GGUFReader
        meta = {}
        for key, field in source.fields.items():
            try:
                meta[key] = field.contents()
            except Exception:  # noqa: BLE001, S112 - a field we cannot decode is one we do not need
                continue
        return meta, str(getattr(source, "path", "GGUF file"))
    raise TypeError(f"cannot read GGUF tokenizer metadata from {type(source).__name__}")


def _byte_level(meta: Mapping[str, Any], tokens: list[str], merges: list[str]):
    """transformers' byte_level_tokenizer (GPT2Tokenizer) + set_split_regex."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(tokens)
    }
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = _BackendTokenizer(models.BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="",
                                           end_of_word_suffix="", fuse_unk=False))
    split = GGUF_PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    backend.decoder = decoders.ByteLevel()
    return backend, vocab, lambda t: set(t) <= alphabet


def generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a piece into two pieces, best
    score first (transformers' generate_merges, same order)."""
    merges = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _sentencepiece(meta: Mapping[str, Any], tokens: list[str], merges: list[str] | None):
    """transformers' sentencepiece_tokenizer (LlamaTokenizer, legacy=False): BPE with byte fallback,
    Metaspace pre-tokenizer prepending "▁" to the first word, merges from the file or from the scores."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if not isinstance(scores, list) or len(scores) != len(tokens):
            raise ValueError("a SentencePiece vocabulary needs tokenizer.ggml.scores or tokenizer.ggml.merges")
        pairs = generate_merges(vocab, dict(zip(tokens, scores)))
    backend = _BackendTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True,
                                           dropout=None))
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0),
    ])
    return backend, vocab, lambda t: True


def gguf_backend(meta: Mapping[str, Any], where: str) -> _BackendTokenizer:
    """The ``tokenizers.Tokenizer`` for GGUF metadata ``meta`` (``where`` names the file in errors): the
    vocabulary and merges of ``tokenizer.ggml.model`` "gpt2" or "llama", with the CONTROL / USER_DEFINED
    tokens of ``tokenizer.ggml.token_type`` added. Raises CheckpointError for anything it cannot rebuild."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise CheckpointError(where, "has no tokenizer (tokenizer.ggml.tokens) in its metadata")
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None and not isinstance(merges, list):
        raise CheckpointError(where, "has an invalid tokenizer.ggml.merges (not a list of strings)")
    token_types = meta.get("tokenizer.ggml.token_type") or []
    try:
        if kind == "gpt2":
            backend, vocab, spelled = _byte_level(meta, tokens, merges or [])
        elif kind == "llama":
            backend, vocab, spelled = _sentencepiece(meta, tokens, merges)
        else:
            raise CheckpointError(
                where, f"uses a {kind!r} tokenizer; Kestrel reads byte-level BPE ('gpt2') and SentencePiece "
                "BPE ('llama') GGUF tokenizers. Use the model's Hugging Face directory instead")
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions on bad tables
        raise CheckpointError(where, f"has an invalid tokenizer vocabulary/merge table ({e})") from None
    # CONTROL tokens become special added tokens (skipped by decode, matched whole in text), USER_DEFINED
    # ones plain added tokens; in a byte-level vocabulary a "control" token not spelled in the byte
    # alphabet is a llama.cpp mislabel (adding it would grow the vocabulary), so it is skipped.
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, token_types) if ty == _TOKEN_CONTROL and spelled(t)]
    if control:
        backend.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, token_types) if ty == _TOKEN_USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens(user)
    return backend
