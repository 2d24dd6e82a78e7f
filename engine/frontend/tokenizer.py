"""The engine's tokenizer on the client's side (engine.frontend.client.EngineClient tokenizes prompts here, not in the
engine process). After loading, the engine hands over its tokenizer (``EngineServer.call_tokenizer_state``:
tokenizer.json, special tokens, chat templates, the longest token in bytes); LocalTokenizer.build rebuilds it
in this process. add_request then renders the chat template and tokenizes on a worker thread (the tokenizers
library releases the GIL), so the engine's step loop never stalls on a huge prompt.

Where the tokenizer allows it (engine.core.process.length_bound_is_certain: ``max_token_bytes``), a prompt whose
UTF-8 length alone proves it longer than the context is refused before it is tokenized at all
(PromptTooLongError, "at least N tokens"); else check_prompt_length applies the engine's own length rule
(EngineCore.validate_prompt) to the ids. No torch here; engine.tokenizer is imported only when a tokenizer is
built.

A text longer than CHUNK_CHARS is counted before it is tokenized whole (``count_at_least``): chunk by chunk, cut
at whitespace after a word (where a pre-tokenizer splits anyway), one chunk per trip to the pool, stopping as
soon as the count surely exceeds the bound. A 600 KB prompt is refused after ~one context's worth of work,
requests take turns on the pool chunk by chunk (a small prompt does not wait behind a huge one), and a request
whose task is cancelled (its client gone) stops at the next chunk. A text that fits is then tokenized whole, as
before: chunking never changes the ids.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os

from engine.errors import InvalidRequestError, PromptTooLongError, as_request_error
from engine.sampling_params import SamplingParams

__all__ = ["LocalTokenizer", "check_prompt_length", "chunk_ends"]

log = logging.getLogger(__name__)


def check_prompt_length(n: int, params: SamplingParams, max_len: int) -> None:
    """The engine's own length rule (EngineCore.validate_prompt), applied before sending."""
    if n >= max_len:
        raise PromptTooLongError(n, max_len)
    if params.max_tokens is not None and n + params.max_tokens > max_len:
        raise PromptTooLongError(n, max_len, params.max_tokens)


def chunk_ends(text: str, size: int) -> list[int]:
    """Where ``text`` is cut into chunks of at most ``size`` characters: each cut is just before a whitespace
    character that follows a non-whitespace one (a pre-tokenizer's boundary: the word before ends there and the
    next piece starts with that whitespace), searched in the chunk's second half; a chunk without one (a long
    run without spaces) is cut at ``size``. The last end is ``len(text)``."""
    ends: list[int] = []
    start, n = 0, len(text)
    while n - start > size:
        end = start + size
        cut = end
        while cut > start + size // 2 and not (text[cut].isspace() and not text[cut - 1].isspace()):
            cut -= 1
        ends.append(cut if cut > start + size // 2 else end)
        start = ends[-1]
    ends.append(n)
    return ends


class LocalTokenizer:
    """The engine's tokenizer, rebuilt in this process from its tokenizer.json (``tokenizer_state``), and the
    checks that refuse a prompt before it reaches the engine. Work on large inputs runs on a small thread
    pool: rendering a chat template is Python (it shares the GIL in 5 ms slices), encoding and decoding go
    through tokenizers' batch calls, which release the GIL."""

    INLINE_CHARS = 8192  # smaller inputs are handled on the event loop (faster than a thread hop)
    INLINE_MESSAGES = 32
    CHUNK_CHARS = 16384  # longer texts are counted chunk by chunk before being tokenized whole
    BOUNDARY_SLACK = 4  # tokens a chunk boundary may add to a count (0 at a clean cut for byte-level BPE)

    def __init__(self, tokenizer, max_token_bytes: int | None):
        self.tok = tokenizer
        self.max_token_bytes = max_token_bytes
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="kestrel-tokenize")

    @classmethod
    def build(cls, state: dict) -> LocalTokenizer:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one text at a time; no fork warnings
        from tokenizers import Tokenizer as Backend

        from engine.tokenizer import Tokenizer

        tok = Tokenizer(Backend.from_str(state["backend"]), bos_token=state.get("bos_token"),
                        eos_token=state.get("eos_token"), unk_token=state.get("unk_token"),
                        pad_token=state.get("pad_token"), chat_template=state.get("chat_templates") or None,
                        extra_eos_token_ids=state.get("eos_token_ids") or (), name_or_path=state.get("name_or_path"))
        bound = state.get("max_token_bytes")
        return cls(tok, int(bound) if bound else None)

    @classmethod
    async def take_over(cls, state: dict | None) -> LocalTokenizer | None:
        """The engine's tokenizer rebuilt here from its ``tokenizer_state`` (on a worker thread); None where the
        engine has none to give (a stand-in core) or it cannot be rebuilt: the engine then tokenizes for itself."""
        if state is None:
            return None
        try:
            return await asyncio.get_running_loop().run_in_executor(None, cls.build, state)
        except Exception:  # noqa: BLE001 - the engine can still tokenize for itself
            log.warning("the engine's tokenizer could not be rebuilt here; the engine will tokenize", exc_info=True)
            return None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, inline: bool, fn, *args):
        if inline:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- pieces --------------------------------------------------------------------------------------
    def lower_bound(self, text: str) -> int:
        """At least this many tokens (0 when the tokenizer gives no certain bound)."""
        if not self.max_token_bytes:
            return 0
        nbytes = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        return -(-nbytes // self.max_token_bytes)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tok.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def _count(self, text: str, start: int, end: int) -> int:
        backend = self.tok.backend
        fast = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets: cheaper
        return len(fast([text[start:end]], add_special_tokens=False)[0].ids)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tok.backend.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]

    @staticmethod
    def _chars(messages: list[dict]) -> int:
        return sum(len(c) for m in messages if isinstance(m, dict) and isinstance(c := m.get("content"), str))

    async def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        inline = len(messages) <= self.INLINE_MESSAGES and self._chars(messages) <= self.INLINE_CHARS
        try:
            return await self._run(inline, self._render, messages, add_generation_prompt)
        except Exception as e:  # noqa: BLE001 - typed for the caller
            raise as_request_error(e, "Internal error while tokenizing") from None

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            return await self._run(len(text) <= self.INLINE_CHARS, self._encode, text, add_special_tokens)
        except Exception as e:  # noqa: BLE001
            raise as_request_error(e, "Internal error while tokenizing") from None

    async def count_at_least(self, text: str, most: int) -> int:
        """At least this many tokens (more than ``most``) in ``text`` (without special tokens), counted chunk by
        chunk (one pool job each) and stopping once the count exceeds ``most`` for certain (each chunk boundary
        may add BOUNDARY_SLACK tokens: taken off) with more than a chunk of text left; 0 when no such verdict
        came (a short text, not counted; or one whose count passes ``most`` only within its last two chunks: a
        whole encode then gives its exact count at a bounded cost)."""
        ends = chunk_ends(text, self.CHUNK_CHARS)
        counted, start = 0, 0
        loop = asyncio.get_running_loop()
        for k, end in enumerate(ends[:-1]):
            try:
                counted += await loop.run_in_executor(self.pool, self._count, text, start, end)
            except Exception as e:  # noqa: BLE001
                raise as_request_error(e, "Internal error while tokenizing") from None
            start = end
            if counted - k * self.BOUNDARY_SLACK > most:  # a verdict, unless the rest is short: exact is cheap
                return counted - k * self.BOUNDARY_SLACK if len(text) - end > self.CHUNK_CHARS else 0
        return 0

    async def encode_bounded(self, text: str, add_special_tokens: bool, most: int) -> list[int] | int:
        """The ids of ``text`` (exactly encode()'s), or, when it surely has more than ``most`` tokens, that
        lower bound (an int) after a bounded amount of work: by its bytes, then count_at_least. The ids may still
        be more than ``most`` (by up to about a chunk): the caller's length check gives the exact count."""
        at_least = self.lower_bound(text)
        if at_least and at_least > most:
            return at_least
        at_least = await self.count_at_least(text, most)
        if at_least and at_least > most:
            return at_least
        return await self.encode(text, add_special_tokens)

    async def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return await self._run(len(ids) <= self.INLINE_CHARS // 4, self._decode, ids, skip_special_tokens)

    # -- the client's tokenize / detokenize calls ------------------------------------------------------
    async def tokenize(self, prompt: str | None, messages: list[dict] | None, add_special_tokens: bool,
                       add_generation_prompt: bool, most: int | None = None) -> list[int] | int:
        """The ids; with ``most``: the lower bound (an int) instead when there are surely more (encode_bounded)."""
        if messages is not None:
            text, add_special_tokens = await self.render(messages, add_generation_prompt), False
        elif isinstance(prompt, str):
            text = prompt
        else:
            raise InvalidRequestError("Give 'prompt' (a string) or 'messages'.", param="prompt")
        if most is None:
            return await self.encode(text, add_special_tokens)
        return await self.encode_bounded(text, add_special_tokens, most)

    async def detokenize(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        ids = list(token_ids)
        vocab = len(self.tok)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"Token id {bad} is out of the vocabulary (0..{vocab - 1}).", param="tokens")
        return await self.decode(ids, skip_special_tokens)

    # -- a request's prompt -------------------------------------------------------------------------------
    async def prompt_ids(self, prompt: str | None, messages: list[dict] | None, params: SamplingParams,
                         max_len: int) -> list[int]:
        """The prompt's token ids, or PromptTooLongError as the engine would raise it (by the byte-length
        bound, before tokenizing, where that already decides). Nothing of a refused prompt is kept."""
        if messages is not None:
            text = await self.render(messages)
            special = False  # the template writes the special tokens (as transformers)
        elif isinstance(prompt, str):
            text, special = prompt, True
        else:
            raise InvalidRequestError("The prompt must be a string, a list of token ids, or chat messages.",
                                      param="prompt")
        most = max_len - 1 if params.max_tokens is None else min(max_len - 1, max_len - params.max_tokens)
        ids = await self.encode_bounded(text, special, most)
        text = None
        if isinstance(ids, int):  # surely too long: by its bytes, or counted in chunks up to the bound
            at_least = ids
            raise PromptTooLongError(at_least, max_len, params.max_tokens if at_least < max_len else None,
                                     at_least=True)
        n = len(ids)
        if n >= max_len or (params.max_tokens is not None and n + params.max_tokens > max_len):
            ids = None  # not kept alive by the exception's traceback
            check_prompt_length(n, params, max_len)
        return ids
