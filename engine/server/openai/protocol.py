"""Request and response models of the OpenAI-compatible API (pydantic; they also make /openapi.json).

Requests accept unknown fields at the parsing stage (``extra="allow"``) so that the server, not pydantic,
answers them: a field the engine cannot honour gets a 400 that names it (``unsupported_fields``), while
harmless OpenAI fields (``user``, ``stream_options``, ``store: false``, ``metadata``, ``service_tier``,
...) are accepted, and chat's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` and
``response_format`` are checked by their handlers (400 naming the field). Types are strict (pydantic's strict
mode: no ``"8"`` or ``true`` for an integer, no ``"yes"`` for a boolean; an integer is a valid number) and a wrong type
is 422; values out of OpenAI's ranges and lists over their bounds are 400 naming the field
(engine.server.openai.serving). Non-finite floats (NaN, Infinity) are refused by the models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import InvalidRequestError


class _Request(BaseModel):
    # unknown fields are parsed, then refused (400) or accepted by check_fields; the schema documents none
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False,
                              json_schema_extra={"additionalProperties": False})


def _f(default: Any = None, description: str | None = None, **schema: Any) -> Any:
    """A field whose bounds are documented in the schema but checked by the server (400 naming the field,
    not pydantic's 422)."""
    return Field(default, description=description, json_schema_extra=schema or None)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------------------------------------
# requests


class StreamOptions(_Request):
    include_usage: bool | None = False


class ContentPart(_Request):
    type: str = _f("text", "Only text parts", enum=["text"])
    text: str | None = None


class ChatMessage(_Request):
    role: str = _f(..., "'developer' reads as 'system'; 'tool' carries a tool call's result",
                   enum=["system", "user", "assistant", "developer", "tool"])
    content: str | list[ContentPart | str] | None = _f(None, "Text, or a list of text parts (joined by newlines)")
    name: str | None = None
    # also accepted (checked by the chat handler): assistant ``tool_calls``, a tool message's ``tool_call_id``


class _SamplingFields(_Request):
    model: str | None = Field(None, description="The served model name (see GET /v1/models); optional")
    temperature: float | None = _f(None, "0 for greedy; default: the model's or 1.0", minimum=0, maximum=2)
    top_p: float | None = _f(None, "Nucleus sampling mass", exclusiveMinimum=0, maximum=1)
    top_k: int | None = _f(None, "Keep the k most likely tokens; -1 or 0 disables", minimum=-1)
    min_p: float | None = _f(None, "Drop tokens below min_p times the top probability", minimum=0, maximum=1)
    presence_penalty: float | None = _f(None, None, minimum=-2, maximum=2)
    frequency_penalty: float | None = _f(None, None, minimum=-2, maximum=2)
    repetition_penalty: float | None = _f(None, "1 disables", exclusiveMinimum=0, maximum=2)
    seed: int | None = _f(None, "Sample i of n uses seed + i", minimum=-(2**63), maximum=2**63 - 129)
    stop: str | list[str] | None = _f(None, "Stop strings (not in the output), at most 64 of at most 4096 "
                                         "characters", minLength=1)
    stop_token_ids: list[int] | None = _f(None, "Token ids that stop generation (at most 1024)", maxItems=1024)
    n: int | None = _f(1, "Samples per prompt", minimum=1, maximum=128)
    logit_bias: dict[str, float] | None = _f(None, "Token id (as a string) -> bias in [-100, 100]; at most "
                                                   "1024 entries", maxProperties=1024)
    ignore_eos: bool | None = False
    min_tokens: int | None = _f(0, "Generate at least this many tokens before a stop", minimum=0)
    include_stop_str_in_output: bool | None = False
    skip_special_tokens: bool | None = True
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = _f(..., "system / user / assistant messages (at most 10000)", minItems=1,
                                     maxItems=10000)
    max_tokens: int | None = _f(None, "Deprecated in OpenAI's API: max_completion_tokens", minimum=1)
    max_completion_tokens: int | None = _f(None, "Default: up to the context length", minimum=1)
    logprobs: bool | None = False
    top_logprobs: int | None = _f(None, "With logprobs: true", minimum=0, maximum=20)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="A string, a list of strings, token ids, or a list of token-id lists")
    max_tokens: int | None = _f(16, "0 only with echo: the prompt scored, nothing generated", minimum=0)
    logprobs: int | None = _f(None, "Top logprobs per token (with echo: the prompt's tokens too)", minimum=0,
                              maximum=20)
    echo: bool | None = _f(False, "The prompt before the completion (with logprobs: the prompt's logprobs)")
    suffix: str | None = None
    best_of: int | None = None


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = True
    add_generation_prompt: bool | None = True


class EmbeddingRequest(_Request):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="A string, a list of strings (at most 2048), token ids, or a list of token-id lists; "
                         "each at most the context length")
    encoding_format: str | None = _f("float", "float: a list of numbers; base64: little-endian float32 bytes",
                                     enum=["float", "base64"])
    dimensions: int | None = _f(None, "Keep the first N dimensions, then renormalise", minimum=1)
    user: str | None = None


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


# ------------------------------------------------------------------------------------------------
# what the engine cannot honour

# field -> (value(s) that are harmless, why anything else is refused)
_HARMLESS: dict[str, tuple[tuple[Any, ...], str]] = {
    "tools": ((), ""),  # tool calling (chat only): checked by engine.server.openai.tools
    "tool_choice": ((), ""),
    "parallel_tool_calls": ((), ""),
    "functions": ((), ""),  # OpenAI's deprecated form of tools: mapped onto them (engine.server.openai.tools)
    "function_call": ((), ""),
    "chat_template_kwargs": ((), ""),  # vLLM's template variables: checked by the chat handler
    "response_format": ((), ""),  # structured output: checked by engine.server.openai.serving.structured_output
    "guided_json": ((), ""),  # vLLM's extra fields, the same
    "guided_regex": ((), ""),
    "guided_choice": ((), ""),
    "guided_grammar": ((), ""),  # EBNF / GBNF (engine.tokenizer.grammar)
    "structured_outputs": ((), ""),  # vLLM's object form of the guided_* fields
    "store": ((None, False), "stored completions are not supported"),
    "metadata": ((), ""),  # only meaningful with store
    "service_tier": ((None, "auto", "default"), "service tiers are not supported"),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "audio": ((None,), "audio output is not supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "reasoning effort is not supported"),
    "web_search_options": ((None,), "web search is not supported"),
    "verbosity": ((None,), "verbosity is not supported"),
    "prompt_cache_key": ((), ""),  # a routing hint: harmless
    "safety_identifier": ((), ""),  # like `user`
}


def _unsupported(name: str, value: Any) -> str | None:
    if name not in _HARMLESS:
        return f"Unknown parameter: '{name}'."
    allowed, why = _HARMLESS[name]
    if not allowed or value in allowed:
        return None
    return f"Unsupported value for '{name}': {why}."


def check_fields(req: BaseModel, where: str = "") -> None:
    """400 naming the first field (at any depth of the request) the engine cannot honour."""
    for name, value in (req.model_extra or {}).items():
        msg = _unsupported(name, value)
        if msg is not None:
            raise InvalidRequestError(msg, param=where + name)
    if isinstance(req, CompletionRequest):
        for name in ("tools", "tool_choice", "functions", "function_call"):
            if (req.model_extra or {}).get(name) not in (None, [], "none", "auto"):
                raise InvalidRequestError(f"Unsupported parameter '{name}' on /v1/completions: tool calling is "
                                          "for /v1/chat/completions.", param=name)
        if req.suffix:
            raise InvalidRequestError("Unsupported value for 'suffix': insertion (suffix) is not supported.",
                                      param="suffix")
        if req.best_of is not None and req.best_of != (req.n or 1):
            raise InvalidRequestError("Unsupported value for 'best_of': only best_of == n is supported.",
                                      param="best_of")
    if getattr(req, "stream_options", None) is not None:
        for name in req.stream_options.model_extra or {}:
            if name != "continuous_usage_stats" or req.stream_options.model_extra[name]:
                raise InvalidRequestError(f"Unknown parameter: 'stream_options.{name}'.",
                                          param=f"stream_options.{name}")
        if not req.stream:
            raise InvalidRequestError("'stream_options' is only allowed when 'stream' is true.",
                                      param="stream_options")


# ------------------------------------------------------------------------------------------------
# responses (documentation: the handlers build the JSON directly, for speed)


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(_Response):
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []


class PromptTokensDetails(_Response):
    cached_tokens: int = 0


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class FunctionCall(_Response):
    name: str
    arguments: str = Field(..., description="The arguments as JSON text")


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kestrel"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(_Response):
    tokens: list[int]
    count: int
    max_model_len: int


class Embedding(_Response):
    object: str = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(_Response):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(_Response):
    object: str = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class DetokenizeResponse(_Response):
    prompt: str


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorDetail


class HealthResponse(_Response):
    status: str = Field(..., description="ok, restarting, dead or shutting_down")
    reason: str | None = None
    restarts: int = Field(0, description="Times the engine process was restarted after it died")


class VersionResponse(_Response):
    version: str


class ServerInfo(_Response):
    """GET /v1/server_info: what a benchmark report records about the server (never the model's path)."""

    engine: Literal["kestrel"] = "kestrel"
    version: str
    served_model_names: list[str]
    model: str
    architecture: str | None = None
    format: str | None = None
    quantization: str | None = None
    dtype: str | None = None
    device: str | None = None
    max_model_len: int | None = None
    vocab_size: int | None = None
    num_kv_blocks: int | None = None
    block_size: int | None = None
    tensor_parallel_size: int = 1
    comm_strategy: str | None = Field(None, description="As configured (auto, nccl, ...); tp 1: none")
    comm_table: list[dict] | None = Field(
        None, description="auto's start-up all-reduce micro-benchmark, one row per message size: bytes, "
                          "latency_us and ok by strategy, max_err_ratio, the strategy chosen (choice); "
                          "None when TP is 1 or the strategy was fixed")
    engine_config: dict = Field(default_factory=dict, description="Scheduling and cache options of the engine")
    host: dict = Field(default_factory=dict, description="CPU, GPUs, driver, PCIe topology of the server's host")
    tools: dict | None = Field(None, description="What tool_choice 'auto' does: the chat template's tool support or "
                                                 "the built-in tool prompt, the call parser, the grammar")
