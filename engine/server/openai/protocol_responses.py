"""Request and response models of POST /v1/responses (pydantic, like engine.server.openai.protocol; they also make
/openapi.json). Stateless, as Ollama and LM Studio serve it: nothing is stored, so ``store: true``,
``previous_response_id``, ``conversation`` and ``background`` are 400s saying so; every other field the engine
cannot honour is a 400 naming it (``check_response_fields``); wrong JSON types are 422 (strict types, as in chat).
The items of ``input`` and ``tools``, ``tool_choice`` and ``text`` are checked by the handler
(engine.server.openai.serving_responses), each 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import InvalidRequestError


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False,
                              json_schema_extra={"additionalProperties": False})

    model: str | None = Field(None, description="The served model name (see GET /v1/models); optional")
    input: str | list[dict[str, Any]] = Field(
        ..., description="Text (one user message), or items: messages (content as text or input_text / "
                         "output_text parts), function_call, function_call_output, reasoning")
    instructions: str | None = Field(None, description="A system message put before the input")
    tools: list[dict[str, Any]] | None = Field(
        None, description="Function tools: {\"type\": \"function\", \"name\", \"description\", \"parameters\", "
                          "\"strict\"}")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="none, auto, required, or {\"type\": \"function\", \"name\": ...}")
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = Field(
        None, description="{\"format\": {\"type\": \"text\" | \"json_object\" | \"json_schema\", \"name\", "
                          "\"schema\", \"strict\"}}")
    max_output_tokens: int | None = Field(None, description="Default: up to the context length",
                                          json_schema_extra={"minimum": 1})
    temperature: float | None = Field(None, json_schema_extra={"minimum": 0, "maximum": 2})
    top_p: float | None = Field(None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})
    stream: bool | None = False
    store: bool | None = Field(None, description="Only false (or absent): this server stores nothing")
    previous_response_id: str | None = Field(None, description="Refused: this server stores no responses")
    reasoning: dict[str, Any] | None = Field(None, description="Only {\"effort\": null}")
    metadata: dict[str, Any] | None = None
    user: str | None = None
    include: list[str] | None = None
    truncation: str | None = Field(None, description="disabled (the default); auto is refused",
                                   json_schema_extra={"enum": ["disabled"]})
    stream_options: dict[str, Any] | None = None
    # the sampling extensions chat takes too (vLLM's and Kestrel's): same ranges and checks
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None


# field -> values that are harmless (None: any), and why anything else is refused
_ACCEPTED: dict[str, tuple[tuple[Any, ...] | None, str]] = {
    "service_tier": ((None, "auto", "default"), "service tiers are not supported"),
    "prompt_cache_key": (None, ""),
    "safety_identifier": (None, ""),
    "background": ((None, False), "background responses are not supported: this server stores nothing"),
    "conversation": ((None,), "conversations are not supported: this server stores nothing; send the whole "
                              "conversation as 'input'"),
    "prompt": ((None,), "stored prompt templates are not supported"),
    "max_tool_calls": ((None,), "max_tool_calls is not supported"),
    "top_logprobs": ((None, 0), "logprobs are not supported on /v1/responses (use /v1/chat/completions)"),
}
_INCLUDABLE = {"message.output_text.logprobs": False, "reasoning.encrypted_content": True}


def check_response_fields(req: ResponsesRequest) -> None:
    """400 naming the first field the server cannot honour."""
    if req.store:
        raise InvalidRequestError("Unsupported value for 'store': this server is stateless and stores no responses; "
                                  "send 'store': false (or leave it out) with the whole conversation as 'input'.",
                                  param="store")
    if req.previous_response_id is not None:
        raise InvalidRequestError("Unsupported parameter 'previous_response_id': this server is stateless and "
                                  "keeps no earlier responses; send the whole conversation as 'input' items.",
                                  param="previous_response_id")
    for name, value in (req.model_extra or {}).items():
        if name not in _ACCEPTED:
            raise InvalidRequestError(f"Unknown parameter: '{name}'.", param=name)
        allowed, why = _ACCEPTED[name]
        if allowed is not None and value not in allowed:
            raise InvalidRequestError(f"Unsupported value for '{name}': {why}.", param=name)
    if req.reasoning is not None and any(v is not None for k, v in req.reasoning.items() if k != "summary"):
        raise InvalidRequestError("Unsupported value for 'reasoning': reasoning effort is not supported (a "
                                  "template's thinking switch goes in 'chat_template_kwargs' on chat).",
                                  param="reasoning")
    if req.truncation not in (None, "disabled"):
        raise InvalidRequestError("Unsupported value for 'truncation': only 'disabled' (a prompt over the context "
                                  "is a 400, never cut).", param="truncation")
    for i, item in enumerate(req.include or []):
        if not _INCLUDABLE.get(item, False):
            raise InvalidRequestError(f"Unsupported value for 'include[{i}]': {item!r} is not available here.",
                                      param=f"include[{i}]")
    for name in (req.stream_options or {}):
        if name != "include_obfuscation":
            raise InvalidRequestError(f"Unknown parameter: 'stream_options.{name}'.", param=f"stream_options.{name}")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequestError("'stream_options' is only allowed when 'stream' is true.", param="stream_options")


# ------------------------------------------------------------------------------------------------
# responses (documentation: the handler builds the JSON directly)


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class OutputText(_Out):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = []


class OutputMessage(_Out):
    type: Literal["message"] = "message"
    id: str
    status: str = Field(..., description="completed or incomplete")
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(_Out):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = Field(..., description="The arguments as JSON text")
    status: str = "completed"


class ResponseUsage(_Out):
    input_tokens: int
    input_tokens_details: dict = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens: int
    output_tokens_details: dict = Field(default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int


class ResponseObject(_Out):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str = Field(..., description="completed, or incomplete (max_output_tokens reached)")
    model: str
    output: list[OutputMessage | FunctionCallItem]
    usage: ResponseUsage | None = None
