"""Tokenizers, chat templates and the incremental detokenizer.

``Tokenizer`` wraps a ``tokenizers.Tokenizer`` built either from a Hugging Face directory (tokenizer.json +
tokenizer_config.json / chat_template.jinja) or from a GGUF file's ``tokenizer.ggml.*`` metadata, and behaves
like transformers' tokenizer for the same files: the same ids from ``encode``, the same BOS rule, the same
chat-template rendering (sandboxed jinja2, trim_blocks/lstrip_blocks, raise_exception, strftime_now, tojson).
``IncrementalDetokenizer`` turns a token stream into text deltas that never split a UTF-8 character.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _BackendTokenizer

from engine.errors import CheckpointError, InvalidRequestError

__all__ = ["Tokenizer", "IncrementalDetokenizer", "render_chat_template"]


# ------------------------------------------------------------------------------------------------
# GGUF byte-level BPE: what transformers' GGUF tokenizer converter builds (integrations/gguf)

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

_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _gguf_metadata(source: Any) -> tuple[dict[str, Any], str]:
    """(metadata dict, name for messages) from a GGUFFile, a gguf.GGUFReader, a mapping or a path."""
    if isinstance(source, Mapping):
        return dict(source), "GGUF metadata"
    if isinstance(source, (str, Path)):
        from engine.loader.gguf_file import GGUFFile

        gf = GGUFFile(source)
        return gf.metadata, str(gf.path)
    if hasattr(source, "metadata") and isinstance(source.metadata, Mapping):  # engine.loader.gguf_file.GGUFFile
        return dict(source.metadata), str(getattr(source, "path", "GGUF file"))
    if hasattr(source, "fields"):  # gguf.GGUFReader
        meta = {}
        for key, field in source.fields.items():
            try:
                meta[key] = field.contents()
            except Exception:  # noqa: BLE001 - a field we cannot decode is one we do not need
                continue
        return meta, str(getattr(source, "path", "GGUF file"))
    raise TypeError(f"cannot read GGUF tokenizer metadata from {type(source).__name__}")


def _gguf_byte_level(meta: Mapping[str, Any], tokens: list[str], merges: list[str]):
    """transformers' byte_level_tokenizer (GPT2Tokenizer) + set_split_regex."""
    spelling = _bytes_to_unicode()
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


def _generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
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


def _gguf_sentencepiece(meta: Mapping[str, Any], tokens: list[str], merges: list[str] | None):
    """transformers' sentencepiece_tokenizer (LlamaTokenizer, legacy=False): BPE with byte fallback,
    Metaspace pre-tokenizer prepending "▁" to the first word, merges from the file or from the scores."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if not isinstance(scores, list) or len(scores) != len(tokens):
            raise ValueError("a SentencePiece vocabulary needs tokenizer.ggml.scores or tokenizer.ggml.merges")
        pairs = _generate_merges(vocab, dict(zip(tokens, scores)))
    backend = _BackendTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True,
                                           dropout=None))
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0),
    ])
    return backend, vocab, lambda t: True


# ------------------------------------------------------------------------------------------------
# chat templates


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@lru_cache(maxsize=32)
def _compile_template(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps (as transformers)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class _Namespace(jinja2.utils.Namespace):
        # namespaces reject dunder/underscore attributes (a sandbox escape route), as transformers does
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set attribute {name!r} on a namespace")

    class _Generation(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` (assistant-mask markers): render the body unchanged
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env.from_string(template)


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain dicts without None values (as transformers), text parts joined, reasoning aliases filled."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError("'messages' must be a list of {role, content} objects", param="messages")
    if len(messages) == 0:
        raise InvalidRequestError("'messages' must contain at least one message", param="messages")
    out = []
    for i, message in enumerate(messages):
        if hasattr(message, "model_dump"):
            message = message.model_dump()
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object with 'role' and 'content'", param="messages")
        message = {k: v for k, v in message.items() if v is not None}
        if not isinstance(message.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] has no 'role'", param="messages")
        content = message.get("content")
        if isinstance(content, (list, tuple)):
            message["content"] = "\n".join(_text_parts(content, i))
        elif content is not None and not isinstance(content, str):
            raise InvalidRequestError(
                f"messages[{i}].content must be a string or a list of text parts", param="messages"
            )
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _text_parts(parts: Iterable[Any], i: int) -> list[str]:
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise InvalidRequestError(
                f"messages[{i}].content[{j}] is of type {kind!r}; this model accepts only text parts",
                param="messages",
            )
    return texts


def render_chat_template(template: str, messages: Sequence[Any], *, add_generation_prompt: bool = True,
                         tools: list | None = None, documents: list | None = None, **variables: Any) -> str:
    """Render a chat template as transformers' ``apply_chat_template(tokenize=False)`` does."""
    import jinja2

    chat = _normalize_messages(messages)
    try:
        compiled = _compile_template(template)
    except jinja2.TemplateSyntaxError as e:
        raise InvalidRequestError(f"The model's chat template is invalid: {e}", param="messages") from None
    try:
        return compiled.render(messages=chat, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:  # raise_exception(...) in the template, undefined attributes, sandbox
        raise InvalidRequestError(f"Chat template error: {e}", param="messages") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise InvalidRequestError(
            f"The conversation does not fit the model's chat template ({type(e).__name__}: {e})", param="messages"
        ) from None


# ------------------------------------------------------------------------------------------------


def _token_content(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    if isinstance(value, AddedToken):
        return value.content
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise CheckpointError(path, f"cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(path, "is not a JSON object")
    return data


def _eos_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, int)]
    return []


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus what transformers keeps beside it (special tokens, the BOS rule,
    chat templates). Build with ``from_dir`` / ``from_gguf``; ``backend`` is the raw tokenizers object."""

    def __init__(
        self,
        backend: _BackendTokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        unk_token: str | None = None,
        pad_token: str | None = None,
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        chat_template: str | Mapping[str, str] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        extra_special_tokens: Iterable[str] = (),
        name_or_path: str | None = None,
    ):
        self.backend = backend
        self.name_or_path = name_or_path
        self.bos_token, self.eos_token, self.unk_token, self.pad_token = bos_token, eos_token, unk_token, pad_token
        # Like transformers: named special tokens the backend lacks become special added tokens.
        present = {t.content for t in backend.get_added_tokens_decoder().values()}
        wanted = [t for t in (bos_token, eos_token, unk_token, pad_token, *extra_special_tokens) if t]
        new = [AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(wanted) if t not in present]
        if new:
            backend.add_special_tokens(new)
        # Like transformers: an explicit add_bos/eos_token (or no post-processor at all) rebuilds the
        # post-processor; otherwise tokenizer.json's own post-processor decides.
        if add_bos_token is not None or add_eos_token is not None or backend.post_processor is None:
            self._set_post_processor(bool(add_bos_token) and bos_token is not None,
                                     bool(add_eos_token) and eos_token is not None)
        probe = backend.encode("", add_special_tokens=True).ids
        self.bos_token_id = self.token_to_id(bos_token)
        self.eos_token_id = self.token_to_id(eos_token)
        self.unk_token_id = self.token_to_id(unk_token)
        self.pad_token_id = self.token_to_id(pad_token)
        self.add_bos_token = self.bos_token_id is not None and probe[:1] == [self.bos_token_id]
        self.add_eos_token = self.eos_token_id is not None and probe[-1:] == [self.eos_token_id]
        eos = ([self.eos_token_id] if self.eos_token_id is not None else []) + list(extra_eos_token_ids)
        self.eos_token_ids: list[int] = list(dict.fromkeys(int(i) for i in eos))
        if isinstance(chat_template, Mapping):
            self.chat_templates = {str(k): str(v) for k, v in chat_template.items() if v}
        else:
            self.chat_templates = {"default": chat_template} if chat_template else {}
        self.chat_template: str | None = self.chat_templates.get("default") or next(
            iter(self.chat_templates.values()), None
        )
        self.all_special_ids: frozenset[int] = frozenset(
            i for i, t in backend.get_added_tokens_decoder().items() if t.special
        )
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        bos, eos = self.bos_token, self.eos_token
        single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
        pair = f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1{(' ' + eos + ':1') if add_eos else ''}"
        special = []
        if add_bos:
            special.append((bos, self.backend.token_to_id(bos)))
        if add_eos:
            special.append((eos, self.backend.token_to_id(eos)))
        self.backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)

    # construction -------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path, generation_config: Mapping[str, Any] | None = None,
                 extra_eos_token_ids: Iterable[int] = ()) -> "Tokenizer":
        """A Hugging Face tokenizer directory: tokenizer.json (+ tokenizer_config.json, chat_template.jinja,
        generation_config.json for extra EOS ids)."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            hint = (" (only a SentencePiece tokenizer.model is present; Kestrel needs tokenizer.json)"
                    if (path / "tokenizer.model").is_file() else "")
            raise CheckpointError(path, f"has no tokenizer.json{hint}")
        try:
            backend = _BackendTokenizer.from_file(str(tok_file))
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception subclasses
            raise CheckpointError(tok_file, f"is not a valid tokenizer.json ({e})") from None
        cfg = _read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
        if generation_config is None and (path / "generation_config.json").is_file():
            generation_config = _read_json(path / "generation_config.json")

        templates: dict[str, str] = {}
        raw = cfg.get("chat_template")
        if isinstance(raw, str):
            templates["default"] = raw
        elif isinstance(raw, list):
            templates.update({t["name"]: t["template"] for t in raw if isinstance(t, Mapping) and "name" in t})
        if (path / "chat_template.json").is_file():
            raw = _read_json(path / "chat_template.json").get("chat_template")
            if isinstance(raw, str):
                templates["default"] = raw
        extra_dir = path / "additional_chat_templates"
        if extra_dir.is_dir():
            for f in sorted(extra_dir.glob("*.jinja")):
                templates[f.stem] = f.read_text(encoding="utf-8")
        if (path / "chat_template.jinja").is_file():
            templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")

        extra_special = [t for t in map(_token_content, cfg.get("additional_special_tokens") or []) if t]
        extra = cfg.get("extra_special_tokens")
        if isinstance(extra, Mapping):
            extra = list(extra.values())
        if isinstance(extra, list):
            extra_special += [t for t in map(_token_content, extra) if t]
        eos_extra = _eos_list((generation_config or {}).get("eos_token_id")) + list(extra_eos_token_ids)
        return cls(
            backend,
            bos_token=_token_content(cfg.get("bos_token")),
            eos_token=_token_content(cfg.get("eos_token")),
            unk_token=_token_content(cfg.get("unk_token")),
            pad_token=_token_content(cfg.get("pad_token")),
            # transformers 5 ignores tokenizer_config's add_bos/eos_token when tokenizer.json exists: its
            # post-processor decides (and none at all means no BOS/EOS)
            chat_template=templates or None,
            extra_eos_token_ids=eos_extra,
            extra_special_tokens=extra_special,
            name_or_path=str(path),
        )

    @classmethod
    def from_gguf(cls, source: Any, generation_config: Mapping[str, Any] | None = None,
                  extra_eos_token_ids: Iterable[int] = ()) -> "Tokenizer":
        """The tokenizer a GGUF file describes (``tokenizer.ggml.*``): a GGUFFile, gguf.GGUFReader, metadata
        mapping or path. Byte-level BPE (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen, SmolLM, ...) and
        SentencePiece BPE (``"llama"``: Llama 2, Mistral, TinyLlama, ...), built as transformers does."""
        meta, where = _gguf_metadata(source)
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
                backend, vocab, spelled = _gguf_byte_level(meta, tokens, merges or [])
            elif kind == "llama":
                backend, vocab, spelled = _gguf_sentencepiece(meta, tokens, merges)
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

        def special(key: str) -> str | None:
            idx = meta.get(f"tokenizer.ggml.{key}")
            return tokens[idx] if isinstance(idx, int) and 0 <= idx < len(tokens) else None

        templates: dict[str, str] = {}
        if isinstance(meta.get("tokenizer.chat_template"), str):
            templates["default"] = meta["tokenizer.chat_template"]
        for key, value in meta.items():
            if key.startswith("tokenizer.chat_template.") and isinstance(value, str):
                templates[key.removeprefix("tokenizer.chat_template.")] = value
        eos_extra = _eos_list((generation_config or {}).get("eos_token_id")) + list(extra_eos_token_ids)
        # llama.cpp's end-of-turn / end-of-message ids (Llama 3.x: <|eot_id|>, <|eom_id|>) end generation too
        eos_extra += [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                      if isinstance(meta.get(k), int) and 0 <= meta[k] < len(tokens)]
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        if add_bos is None:  # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
            add_bos = kind == "llama"
        add_eos = meta.get("tokenizer.ggml.add_eos_token")
        return cls(
            backend,
            bos_token=special("bos_token_id"),
            eos_token=special("eos_token_id"),
            unk_token=special("unknown_token_id"),
            pad_token=special("padding_token_id"),
            add_bos_token=bool(add_bos),
            add_eos_token=bool(add_eos),
            chat_template=templates or None,
            extra_eos_token_ids=eos_extra,
            name_or_path=where,
        )

    # encoding / decoding ------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. With ``add_special_tokens`` BOS/EOS are added only where the tokenizer says
        so, as transformers 5 decides it: tokenizer.json's post-processor for a directory, the
        ``tokenizer.ggml.add_bos_token`` flag for a GGUF (``self.add_bos_token`` tells which)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    # chat ---------------------------------------------------------------------------------------
    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str:
        if chat_template is not None:
            if chat_template in self.chat_templates:
                return self.chat_templates[chat_template]
            if "{" in chat_template:  # a template given inline
                return chat_template
            raise InvalidRequestError(f"This model has no chat template named {chat_template!r}",
                                      param="chat_template")
        if tools and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if self.chat_template is None:
            raise InvalidRequestError(
                "This model has no chat template, so it cannot take chat messages; send a plain text prompt "
                "(the completions endpoint) or supply a chat template.", param="messages",
            )
        return self.chat_template

    def apply_chat_template(
        self,
        messages: Sequence[Any],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        *,
        tools: list | None = None,
        documents: list | None = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> list[int] | str:
        """Render the conversation with the model's chat template exactly as transformers does; with
        ``tokenize`` return its ids (encoded without adding special tokens, as transformers does: the
        template writes them). Extra ``kwargs`` (e.g. ``enable_thinking=False``) reach the template."""
        template = self.get_chat_template(chat_template, tools)
        variables = {k: v for k, v in (("bos_token", self.bos_token), ("eos_token", self.eos_token),
                                       ("unk_token", self.unk_token), ("pad_token", self.pad_token))
                     if v is not None}
        variables.update(kwargs)
        text = render_chat_template(template, messages, add_generation_prompt=add_generation_prompt,
                                    tools=tools, documents=documents, **variables)
        if not tokenize:
            return text
        return self.encode(text, add_special_tokens=False)

    def __repr__(self) -> str:
        return (f"Tokenizer({self.name_or_path!r}, vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
                f"eos={self.eos_token!r}, add_bos_token={self.add_bos_token})")


# ------------------------------------------------------------------------------------------------


class IncrementalDetokenizer:
    """Text deltas for a growing token sequence (vLLM's prefix/read-offset scheme).

    Each ``add`` decodes only a short window: the tokens from ``prefix_offset`` (a few tokens before the
    last emitted text, so leading-space rules see context) to the end, and compares that with the window's
    already-emitted part. Text is held back while it ends in U+FFFD, i.e. in the middle of a UTF-8
    character split across byte tokens, so no delta ever carries a broken character.
    """

    _CONTEXT = 5  # tokens of prompt kept as left context, as vLLM
    _MAX_HELD = 8  # a "partial character" longer than this is invalid UTF-8 in the output, not a split char

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids)[-self._CONTEXT:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self._pieces: list[str] = []
        self._text_cache: str | None = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.backend.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes ('' while a character is incomplete)."""
        self.ids.append(int(token_id))
        window = self.ids[self.prefix_offset:]
        prefix_text = self._decode(window[: self.read_offset - self.prefix_offset])
        new_text = self._decode(window)
        held = len(self.ids) - self.read_offset
        if new_text.endswith("\ufffd") and held < self._MAX_HELD:
            return ""
        if len(new_text) > len(prefix_text):
            delta = new_text[len(prefix_text):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
        else:  # nothing visible (e.g. a skipped special token): move on without growing the window
            delta = ""
            self.read_offset = len(self.ids)
        # keep the buffer small: tokens before prefix_offset are never decoded again
        if self.prefix_offset > 64:
            cut = self.prefix_offset
            del self.ids[:cut]
            self.prefix_offset -= cut
            self.read_offset -= cut
        if delta:
            self._pieces.append(delta)
            self._text_cache = None
        return delta

    def add_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.add(t) for t in token_ids)

    def flush(self) -> str:
        """Text still held back (an incomplete character at the very end, decoded with U+FFFD)."""
        if self.read_offset >= len(self.ids):
            return ""
        window = self.ids[self.prefix_offset:]
        prefix_text = self._decode(window[: self.read_offset - self.prefix_offset])
        new_text = self._decode(window)
        delta = new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        if delta:
            self._pieces.append(delta)
            self._text_cache = None
        return delta

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if self._text_cache is None:
            self._text_cache = "".join(self._pieces)
            self._pieces = [self._text_cache]
        return self._text_cache
