"""Rebuilding a tokenizer from a GGUF file's ``tokenizer.ggml.*`` metadata.

Turns the vocabulary, merges, scores and token types llama.cpp stores into a ``tokenizers.Tokenizer`` exactly
as transformers' GGUF converter does (integrations/gguf): byte-level BPE (``"gpt2"``: Llama 3, Qwen, SmolLM,
DeepSeek, ...) with the split steps ``tokenizer.ggml.pre`` names (``gguf_pre_tokenizer``: a name it does not know
logs a warning and splits as GPT-2), and SentencePiece BPE with byte fallback
(``"llama"``: Llama 2, Mistral, TinyLlama, ...). Also GPT-2's byte -> character table, ``bytes_to_unicode``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _BackendTokenizer

from engine.errors import CheckpointError

log = logging.getLogger(__name__)

__all__ = ["DIGITS_THEN_GPT2_PRE", "GGUF_PRE_TOKENIZER_SPLITS", "GPT2_REGEX_PRE", "bytes_to_unicode", "generate_merges",
           "gguf_backend", "gguf_metadata", "gguf_pre_tokenizer"]

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
# DeepSeek's pre-tokenizers: several Split steps each, as their tokenizer.json files have them (llama.cpp's
# llama-vocab.cpp has the same regexes: LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM / DEEPSEEK3_LLM / DEEPSEEK_CODER). The
# letter class of "deepseek-llm" is spelled with escapes: several of its characters (U+1F7D, U+1FBE, U+1FD3, U+1FDB,
# U+2126, U+212A) are canonical singletons that an editor's or a web page's NFC would silently turn into others.
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
_DIGITS = "digits"  # a step: tokenizers' Digits(individual_digits=True), as DeepSeek's tokenizer.json files have it
# DeepSeek LLM, DeepSeek-V2 / V2-Lite. The last step is the tokenizer.json's Digits; llama.cpp splits \p{N}+ there,
# which gives other tokens only where the vocabulary merges two digits
_DEEPSEEK_LLM = (
    "[\r\n]",
    "\\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    _DIGITS,
)
_DEEPSEEK_V3 = (  # DeepSeek-V3 / R1 (and llama.cpp's hunyuan-dense, joyai-llm, hy_v4)
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# others whose tokenizer.json regex llama-vocab.cpp quotes (the originals; llama.cpp runs adapted forms)
_SEED_CODER_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_BAILINGMOE_SPLIT = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
                     r"|\s+(?!\S)|\s+")
_EXAONE_MOE_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                     r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
_MINICPM5 = (r"\p{N}{1,3}", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TINY_AYA = (r"\d{1,3}(?=(?:\d{3})*\b)", _GPT4O_SPLIT)
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", _DIGITS)

# tokenizer.ggml.pre -> the pre-tokenizer steps before ByteLevel (names as llama.cpp's llama-vocab.cpp reads them):
# one split regex, or DeepSeek's several steps. GPT2_REGEX_PRE: ByteLevel's own GPT-2 regex (as transformers does
# for every name it does not know); DIGITS_THEN_GPT2_PRE: each digit isolated first (llama.cpp's \p{N} step, HF's
# Digits(individual_digits=True)), then the GPT-2 regex: SmolLM, StarCoder, Command-R, ...
GGUF_PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe", "glm4", "chatglm-bpe"], (_LLAMA3_SPLIT,)),
    "tekken": (_TEKKEN_SPLIT,),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
                     "solar-open", "grok-2"], (_QWEN2_SPLIT,)),
    "qwen35": (_QWEN35_SPLIT,),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], (_GPT4O_SPLIT,)),
    "deepseek-llm": _DEEPSEEK_LLM,
    **dict.fromkeys(["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], _DEEPSEEK_V3),
    "deepseek-coder": _DEEPSEEK_CODER,
    "seed-coder": (_SEED_CODER_SPLIT,),
    **dict.fromkeys(["bailingmoe", "bailingmoe2", "llada-moe"], (_BAILINGMOE_SPLIT,)),
    "exaone-moe": (_EXAONE_MOE_SPLIT,),
    "minicpm5": _MINICPM5,
    **dict.fromkeys(["tiny_aya", "cohere2moe"], _TINY_AYA),
}
GPT2_REGEX_PRE = frozenset(["default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion",
                            "granite-docling", "exaone4", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
                            "gigachat", "a.x-4.0", "mellum", "modern-bert", "roberta-bpe", "jina-v1-en",
                            "jina-v2-code"])
DIGITS_THEN_GPT2_PRE = frozenset(["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                  "minerva-7b", "mellum2"])

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


def gguf_pre_tokenizer(pre: Any, where: str = "GGUF metadata") -> pre_tokenizers.PreTokenizer:
    """The byte-level pre-tokenizer for ``tokenizer.ggml.pre`` = ``pre``: its split steps
    (GGUF_PRE_TOKENIZER_SPLITS, each Split isolating its matches), then ByteLevel without its own regex; for the
    GPT-2 family (and, with a warning naming it, a name this table does not know or no name) ByteLevel's GPT-2
    regex, as transformers and llama.cpp's "default" do."""
    steps = GGUF_PRE_TOKENIZER_SPLITS.get(pre) if isinstance(pre, str) else None
    if steps is None:
        if pre in DIGITS_THEN_GPT2_PRE:
            return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False)])
        if pre not in GPT2_REGEX_PRE:
            what = ("has no tokenizer.ggml.pre" if pre is None
                    else f"has a tokenizer.ggml.pre Kestrel does not know ({pre!r})")
            log.warning("%s %s: splitting text with GPT-2's regex, which may tokenize differently from the model's own "
                        "tokenizer (its Hugging Face directory gives the exact tokens)", where, what)
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence([
        *(pre_tokenizers.Digits(individual_digits=True) if step == _DIGITS
          else pre_tokenizers.Split(Regex(step), behavior="isolated") for step in steps),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _byte_level(meta: Mapping[str, Any], tokens: list[str], merges: list[str], where: str):
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
    backend.pre_tokenizer = gguf_pre_tokenizer(meta.get("tokenizer.ggml.pre"), where)
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
            backend, vocab, spelled = _byte_level(meta, tokens, merges or [], where)
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
