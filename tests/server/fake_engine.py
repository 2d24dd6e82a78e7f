"""A stand-in for EngineCore (no model, no torch) to test the client and the server's plumbing fast.

Text is tokenized one character per token (id = code point, below 256). Each request generates the characters
after its last prompt character, cycling through 'a'..'z'; token id 0 is EOS. ``KESTREL_FAKE`` (environment)
picks a behaviour: "" (normal), "load_error" (raises CheckpointError while loading), "crash_step" (the first
step raises), "slow" (each step takes 50 ms)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from engine.errors import CheckpointError, InvalidRequestError, PromptTooLongError
from engine.wire import EngineStats, RequestDelta, RequestMetrics  # torch-free: the engine's own types

VOCAB = 256


class FakeTokenizer:
    eos_token_ids = [0]
    bos_token_id = None
    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    all_special_ids = frozenset({0})

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [min(ord(c), VOCAB - 1) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")
        return self.encode(text) if tokenize else text

    def convert_ids_to_tokens(self, ids):
        return [chr(i) for i in ids]

    def __len__(self) -> int:
        return VOCAB


@dataclass
class _Blocks:
    num_blocks: int = 64
    block_size: int = 16
    num_free_blocks: int = 64
    prefix_queries: int = 0
    prefix_hits: int = 0

    def reset_prefix_cache(self) -> None:
        pass


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: object
    out: list[int] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)


class FakeCore:
    def __init__(self, config):
        self.mode = os.environ.get("KESTREL_FAKE", "")
        if self.mode == "load_error":
            raise CheckpointError("/models/broken.gguf", "truncated: 12 bytes of 4096 present")
        self.config = config
        self.tokenizer = FakeTokenizer()
        self.max_model_len = config.max_model_len or 128
        self.blocks = _Blocks()
        self.eos_token_ids = frozenset({0})
        self.requests: dict[str, _Req] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def tokenize_prompt(self, prompt=None, messages=None):
        if messages is not None:
            return self.tokenizer.apply_chat_template(messages)
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        raise InvalidRequestError("bad prompt", param="prompt")

    def add_request(self, request_id, prompt=None, params=None, *, messages=None, prompt_token_ids=None):
        ids = prompt_token_ids if prompt_token_ids is not None else self.tokenize_prompt(prompt, messages)
        if not ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(len(ids), self.max_model_len)
        self.requests[request_id] = _Req(request_id, list(ids), params)
        self.prompt_tokens_total += len(ids)
        self.blocks.num_free_blocks -= 1

    def abort(self, ids):
        out = []
        for rid in ([ids] if isinstance(ids, str) else ids):
            r = self.requests.pop(rid, None)
            if r is not None:
                self.blocks.num_free_blocks += 1
                out.append(self._delta(r, [], True, "abort"))
        return out

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def _delta(self, r, toks, finished=False, reason=None):
        text = self.tokenizer.decode(toks)
        m = RequestMetrics(r.arrival, 0.0, 0.01, time.monotonic() - r.arrival, 0.0) if finished else None
        return RequestDelta(r.rid, toks, text, None, finished, reason, None, len(r.prompt), 0, len(r.out), m)

    def step(self):
        if self.mode == "crash_step":
            raise RuntimeError("simulated kernel failure")
        time.sleep(0.05 if self.mode == "slow" else 0.002)
        out = []
        for r in list(self.requests.values()):
            last = (r.out or r.prompt)[-1]
            tok = ord("a") + (last - ord("a") + 1) % 26 if ord("a") <= last <= ord("z") else ord("a")
            r.out.append(tok)
            self.generation_tokens_total += 1
            p = r.params
            done = len(r.out) >= (p.max_tokens or 1000)
            if done:
                del self.requests[r.rid]
                self.blocks.num_free_blocks += 1
            out.append(self._delta(r, [tok], done, "length" if done else None))
        return out

    def stats(self, recent=32):
        return EngineStats(num_running=len(self.requests), num_waiting=0,
                           kv_usage=1 - self.blocks.num_free_blocks / self.blocks.num_blocks,
                           num_kv_blocks=self.blocks.num_blocks, num_free_blocks=self.blocks.num_free_blocks,
                           prefix_cache_hit_rate=0.0, prompt_tokens_total=self.prompt_tokens_total,
                           generation_tokens_total=self.generation_tokens_total, num_preemptions=0)
