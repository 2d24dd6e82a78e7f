"""Incremental detokenization for streaming: text deltas from a growing token sequence.

``IncrementalDetokenizer`` decodes only a short window per token and holds text back while it ends in the
middle of a UTF-8 character, so no streamed delta ever carries a broken character.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.tokenizer.hf import Tokenizer

__all__ = ["IncrementalDetokenizer"]


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
