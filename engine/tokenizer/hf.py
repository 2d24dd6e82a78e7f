"""The ``Tokenizer`` class: a Hugging Face ``tokenizers.Tokenizer`` that behaves like transformers' tokenizer.

It is built from a Hugging Face directory (tokenizer.json + tokenizer_config.json / chat_template.jinja /
generation_config.json) or from a GGUF file's metadata (vocabulary rebuilt by ``gguf_vocab``), and keeps
what transformers keeps beside the backend: special tokens, the BOS/EOS rule, EOS ids, chat templates
(rendered by ``chat_template``). Same ids from ``encode`` and same chat text as transformers for the same files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as _BackendTokenizer

from engine.checkpoint_json import read_json
from engine.errors import CheckpointError, InvalidRequestError
from engine.tokenizer.chat_template import render_chat_template
from engine.tokenizer.gguf_vocab import gguf_backend, gguf_metadata

__all__ = ["Tokenizer"]


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
                 extra_eos_token_ids: Iterable[int] = ()) -> Tokenizer:
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
        cfg = read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
        if generation_config is None and (path / "generation_config.json").is_file():
            generation_config = read_json(path / "generation_config.json")

        templates: dict[str, str] = {}
        raw = cfg.get("chat_template")
        if isinstance(raw, str):
            templates["default"] = raw
        elif isinstance(raw, list):
            templates.update({t["name"]: t["template"] for t in raw if isinstance(t, Mapping) and "name" in t})
        if (path / "chat_template.json").is_file():
            raw = read_json(path / "chat_template.json").get("chat_template")
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
                  extra_eos_token_ids: Iterable[int] = ()) -> Tokenizer:
        """The tokenizer a GGUF file describes (``tokenizer.ggml.*``): a GGUFFile, gguf.GGUFReader or metadata
        mapping (open a path with engine.loader.gguf_file.GGUFFile). Byte-level BPE (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen, SmolLM, ...) and
        SentencePiece BPE (``"llama"``: Llama 2, Mistral, TinyLlama, ...), built as transformers does."""
        meta, where = gguf_metadata(source)
        backend = gguf_backend(meta, where)
        kind = meta.get("tokenizer.ggml.model")
        tokens = meta["tokenizer.ggml.tokens"]

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
