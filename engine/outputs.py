"""The offline API's whole results (LLM.generate / embed), built from the per-step RequestDeltas that the core
emits (engine.wire: TokenLogprobs, RequestMetrics, RequestDelta, the same types the client receives)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.wire import RequestDelta, RequestMetrics, TokenLogprobs


@dataclass
class EmbeddingOutput:
    """One input's embedding: the pooled vector as little-endian float32 bytes (what OpenAI's base64 format
    carries; 4 bytes a dimension on the wire instead of msgpack's 9) and the tokens it was computed from."""

    embedding: bytes
    num_prompt_tokens: int

    def floats(self) -> list[float]:
        import array
        import sys

        vec = array.array("f", self.embedding)
        if sys.byteorder == "big":
            vec.byteswap()
        return vec.tolist()


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None  # SamplingParams.prompt_logprobs (the first: NaN)

    def add(self, d: RequestDelta) -> None:
        self.text += d.text
        if d.prompt_logprobs is not None:
            self.prompt_logprobs = d.prompt_logprobs
        self.token_ids.extend(d.token_ids)
        if d.logprobs is not None:
            self.logprobs = (self.logprobs or []) + d.logprobs
        if d.finished:
            self.finish_reason, self.stop_reason, self.metrics = d.finish_reason, d.stop_reason, d.metrics


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    finished: bool = False
