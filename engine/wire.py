"""The wire between EngineClient and the engine process: message types and their msgpack encoding.

Transport: two ZeroMQ PUSH/PULL pipes (client -> engine: requests; engine -> client: outputs and replies)
over a Unix-domain socket in a private temporary directory (TCP on 127.0.0.1 where there are none).
Why ZeroMQ + msgspec rather than multiprocessing pipes + pickle:
- zmq frames messages, queues them in its own I/O thread (the engine never blocks on a slow client and a
  send costs microseconds), integrates with asyncio (zmq.asyncio) and with a plain poller in the engine
  loop, and will carry the same protocol to worker processes or another host later;
- msgspec encodes dataclasses and Structs to msgpack several times faster than pickle and decodes into
  typed Structs with validation; unlike pickle it never runs code named by the peer.
No shared memory is used, so nothing outlives the processes but the socket files, which the client
removes with their directory.

Every message is one msgpack frame holding a tagged Struct (``array_like`` for compactness). One engine
step's outputs for all requests travel as one ``StepOutput``.
"""

from __future__ import annotations

import traceback
from typing import Any

import msgspec

from engine.sampling_params import SamplingParams

# ------------------------------------------------------------------------------------------------
# what the engine core emits: the same Structs in the core, on the wire and in the client (and the tests' fake
# core), defined here only; engine.outputs builds the offline API's whole results from them


class TokenLogprobs(msgspec.Struct):
    """The logprob of one sampled token (of the model's raw distribution) and the best ones beside it."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []  # (token id, logprob), best first


class RequestMetrics(msgspec.Struct):
    """Engine-side timings of one finished request (seconds; time.monotonic clock of the host)."""

    arrival_time: float = 0.0
    queue_time: float | None = None  # arrival in the engine -> first scheduled
    ttft: float | None = None  # arrival in the engine -> first token
    e2e: float | None = None  # arrival in the engine -> finished
    decode_time: float | None = None  # first token -> last token
    num_preemptions: int = 0


class RequestDelta(msgspec.Struct, omit_defaults=True):
    """What one sequence gained in one engine step. The core fills the fields up to ``embedding``; the client
    sets ``index`` (which of the request's n samples) and ``time`` (the engine's clock at the end of the step
    that produced it: per-token timestamps for TTFT / inter-token latency plots). Fields at their defaults are
    left out on the wire."""

    request_id: str = ""
    token_ids: list[int] = []
    text: str = ""
    logprobs: list[TokenLogprobs] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    metrics: RequestMetrics | None = None  # set on the final delta
    embedding: bytes | None = None  # an embedding request's final delta: little-endian float32
    # SamplingParams.prompt_logprobs: on the first delta with tokens, one entry per prompt token (the first has no
    # logprob: NaN), each scored by the logits of the position before it
    prompt_logprobs: list[TokenLogprobs] | None = None
    index: int = 0
    time: float = 0.0


class StepStats(msgspec.Struct):
    time: float
    duration: float
    num_running: int
    num_waiting: int
    num_prefill_tokens: int
    num_decode_tokens: int
    kv_usage: float


class CommStepStats(msgspec.Struct):
    """Tensor-parallel traffic of one step on rank 0 (recent_comm_steps parallels recent_steps)."""

    time: float
    calls: int  # all-reduces / all-gathers
    link_bytes: int  # bytes moved over the interconnect by rank 0 (the strategy's algorithm)
    payload_bytes: int  # size of the reduced tensors
    seconds: float  # time in communication


class EngineStats(msgspec.Struct):
    """EngineCore.stats(); the engine process adds the prefix-cache counts, the token rates and the time."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # share of KV blocks in use, 0..1
    num_kv_blocks: int = 0
    num_free_blocks: int = 0
    prefix_cache_hit_rate: float = 0.0  # over all lookups so far, by tokens
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prompt_tokens_per_s: float = 0.0  # over the last few seconds
    generation_tokens_per_s: float = 0.0
    num_preemptions: int = 0
    recent_steps: list[StepStats] = []
    time: float = 0.0  # engine clock when taken
    # tensor parallelism (TP size 1: zeros)
    tp_size: int = 1
    comm_strategy: str | None = None  # as requested (auto, nccl, int8, host, overlap)
    comm_calls_total: int = 0
    comm_bytes_total: int = 0  # bytes over the interconnect (link bytes) since start: the GUI plots its rate
    comm_payload_bytes_total: int = 0
    comm_time_total: float = 0.0
    comm_by_strategy: dict[str, Any] = {}  # name -> {calls, payload_bytes, link_bytes, seconds}
    comm_table: list[Any] | None = None  # auto's start-up micro-benchmark (per size: latency by strategy, choice)
    recent_comm_steps: list[CommStepStats] = []
    # speculative decoding (--speculative-config; zeros without): proposed tokens verified, of them accepted,
    # verify passes (request-steps with proposals) and the tokens those passes emitted, since start
    spec_method: str | None = None  # its description (engine/spec/config.py), None: off
    spec_proposed_total: int = 0
    spec_accepted_total: int = 0
    spec_verify_steps_total: int = 0
    spec_emitted_total: int = 0


class ModelInfo(msgspec.Struct):
    name: str
    path: str
    architecture: str = ""
    format: str = ""
    quantization: str | None = None  # the file's own ("Q4_1", "GPTQ int4"), not the load option
    max_model_len: int = 0
    dtype: str = ""
    device: str = ""
    vocab_size: int = 0
    num_kv_blocks: int = 0
    block_size: int = 0
    has_chat_template: bool = False
    generation_config: dict[str, Any] = {}
    bos_token_id: int | None = None
    eos_token_ids: list[int] = []
    tensor_parallel_size: int = 1
    engine_pid: int = 0
    load_time: float = 0.0
    cuda_graph_sizes: list[int] = []  # decode batch sizes with a captured CUDA graph (none: eager decode)
    cuda_graph_seconds: float = 0.0  # their capture time at start-up
    # what the load option --quantization resolved to (ModelRunner.quantization: auto -> "gguf" or "none"); ""
    # where the engine does not say (a stand-in core)
    quantization_mode: str = ""

    def quantization_text(self, option: str | None) -> str:
        """The load option as reports show it, with what ``auto`` resolved to: "auto (Q4_1 blocks kept)",
        "auto (Q4_1 dequantized)", "auto (GPTQ int4 as stored)", "auto (none)"; any other option as it is."""
        option = option or "none"
        if option != "auto" or not self.quantization_mode:
            return option
        if self.quantization_mode == "gguf":
            return f"auto ({self.quantization or 'GGUF'} blocks kept)"
        if self.quantization_mode == "none" and self.quantization:
            how = "dequantized" if self.format == "gguf" else "as stored"
            return f"auto ({self.quantization} {how})"
        return f"auto ({self.quantization_mode})"


class ErrorInfo(msgspec.Struct):
    """An exception on the wire: rebuilt on the other side as the same engine.errors class."""

    type: str
    message: str
    attrs: dict[str, Any] = {}
    traceback: str | None = None


# ------------------------------------------------------------------------------------------------
# client -> engine


class AddRequest(msgspec.Struct, tag="add", array_like=True):
    """One request with n samples: child i runs as ``child_ids[i]`` with ``params[i]``. EngineClient sends
    ``prompt_token_ids`` (it tokenizes and applies the chat template itself, off the engine's loop); ``prompt``
    / ``messages`` are tokenized by the engine only for a client that has no tokenizer of its own. ``embed``:
    prefill only; the final delta carries the pooled embedding instead of a sampled token."""

    child_ids: list[str]
    params: list[SamplingParams]
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    embed: bool = False


class Abort(msgspec.Struct, tag="abort", array_like=True):
    request_ids: list[str]


class Call(msgspec.Struct, tag="call", array_like=True):
    """A request/reply call: stats, tokenize, detokenize, apply_chat_template, token_bytes, tokenizer_state,
    ping."""

    call_id: int
    method: str
    args: dict[str, Any] = {}


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


ClientMessage = AddRequest | Abort | Call | Shutdown

# ------------------------------------------------------------------------------------------------
# engine -> client


class Progress(msgspec.Struct, tag="progress", array_like=True):
    stage: str  # "loading" | "building" | ...
    detail: str = ""


class Ready(msgspec.Struct, tag="ready", array_like=True):
    info: ModelInfo


class LoadFailed(msgspec.Struct, tag="load_failed", array_like=True):
    error: ErrorInfo


class StepOutput(msgspec.Struct, tag="step", array_like=True):
    time: float
    deltas: list[RequestDelta] = []
    accepted: list[tuple[str, int]] = []  # (child id, number of prompt tokens) of requests just admitted
    errors: list[tuple[str, ErrorInfo]] = []  # (child id, why it was refused)


class Reply(msgspec.Struct, tag="reply", array_like=True):
    call_id: int
    result: Any = None
    error: ErrorInfo | None = None


class Fatal(msgspec.Struct, tag="fatal", array_like=True):
    """The engine loop failed and the process is about to exit."""

    error: ErrorInfo


class Heartbeat(msgspec.Struct, tag="heartbeat", array_like=True):
    """Sent about once a second by the engine process's heartbeat thread (engine.core.heartbeat), which runs on
    during a step; the client's watchdog (engine.frontend.watchdog) takes silence for a stopped process, and a
    loop pass that lasts with no CPU used for a stuck one."""

    sent: float  # the engine's time.monotonic()
    passes: int  # loop passes so far (a new pass: the loop moved on)
    busy_for: float  # seconds in the current pass (0.0: idle, waiting for messages)
    cpu_s: float  # the process's CPU time so far (all threads, and its children waited for)


EngineMessage = Progress | Ready | LoadFailed | StepOutput | Reply | Fatal | Heartbeat


def _enc_hook(obj: Any) -> Any:
    # numpy / torch scalars sneaking into outputs
    if hasattr(obj, "item"):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder(enc_hook=_enc_hook)


def client_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the engine sends."""
    return msgspec.msgpack.Decoder(EngineMessage)


def engine_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the client sends."""
    return msgspec.msgpack.Decoder(ClientMessage)


# ------------------------------------------------------------------------------------------------
# exceptions across the process boundary

_PRIMITIVE = (str, int, float, bool, type(None))


def error_to_info(err: BaseException, with_traceback: bool = False) -> ErrorInfo:
    attrs = {k: v for k, v in vars(err).items() if isinstance(v, _PRIMITIVE) and not k.startswith("_")}
    tb = "".join(traceback.format_exception(err)) if with_traceback else None
    return ErrorInfo(type(err).__name__, str(err), attrs, tb)


def error_from_info(info: ErrorInfo) -> Exception:
    """The engine.errors class named in ``info`` (its message and attributes restored); anything else
    becomes a KestrelError (status 500) that names the original type."""
    from engine import errors

    cls = getattr(errors, info.type, None)
    if isinstance(cls, type) and issubclass(cls, errors.KestrelError):
        err = cls.__new__(cls)
        Exception.__init__(err, info.message)
        err.__dict__.update(info.attrs)
        if isinstance(err, errors.InvalidRequestError) and not hasattr(err, "param"):
            err.param = None
        return err
    err = errors.KestrelError(f"{info.type}: {info.message}" if info.message else info.type)
    err.original_type = info.type
    if info.traceback:
        err.remote_traceback = info.traceback
    return err
