"""What the engine hands back: per-step deltas (streamed over IPC) and whole results (offline API)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprobs:
    """The logprob of one sampled token (of the model's raw distribution) and the best ones beside it."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first


@dataclass
class RequestMetrics:
    arrival_time: float
    queue_time: float | None = None
    ttft: float | None = None  # seconds from arrival to the first token
    e2e: float | None = None  # seconds from arrival to the end
    decode_time: float | None = None  # first token to last token
    num_preemptions: int = 0


@dataclass
class RequestDelta:
    """What one request gained in one engine step."""

    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    metrics: RequestMetrics | None = None  # set on the final delta
    embedding: bytes | None = None  # an embedding request's pooled vector: little-endian float32


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

    def add(self, d: RequestDelta) -> None:
        self.text += d.text
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
