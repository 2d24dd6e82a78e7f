"""Per-request sampling parameters, validated at construction with errors that name the parameter."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError

STRUCTURED_KINDS = ("json", "json_schema", "regex", "choice", "structural_tag", "grammar")


@dataclass
class StructuredOutput:
    """Constrained decoding (engine/tokenizer/grammar.py): ``kind`` "json" (any JSON object; ``spec`` unused),
    "json_schema" (``spec``: the schema as JSON text), "regex" (``spec``: the pattern) or "choice" (``spec``: a
    JSON list of the allowed strings) or "grammar" (``spec``: an EBNF / GBNF grammar whose start rule is
    ``root``). Tool calling enforced by a grammar (``tool_choice`` "required" or a named
    function) is a "json_schema" whose ``param`` names the tools; tool_choice "auto" is a "structural_tag" (``spec``:
    xgrammar's structural tag as JSON text: free text until a call's marker, then the call)."""

    kind: str
    spec: str = ""
    param: str = ""  # the request field the grammar came from, named by its errors (default: by kind)

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise InvalidRequestError(f"Invalid structured output kind {self.kind!r}: one of "
                                      f"{', '.join(STRUCTURED_KINDS)}.", param="response_format")


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per generated token (0: only the sampled one)
    # logprobs of the prompt's tokens (each scored by the logits of the position before it), with this many top
    # logprobs beside each (0: only the prompt's token); None: not computed. Such a request takes no prefix-cache hit
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: StructuredOutput | None = None  # the output follows this grammar (None: free text)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self._check(self.n >= 1, "n", "must be at least 1")
        self._check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be at least 1")
        self._check(self.min_tokens >= 0, "min_tokens", "must be non-negative")
        self._check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
                    "must not exceed max_tokens")
        self._check(self.temperature >= 0, "temperature", "must be non-negative")
        self._check(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        self._check(self.top_k >= 0, "top_k", "must be -1 (disabled) or a positive number")
        self._check(0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        self._check(self.repetition_penalty > 0, "repetition_penalty", "must be positive")
        self._check(-2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]")
        self._check(-2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]")
        self._check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]")
        self._check(self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20, "prompt_logprobs",
                    "must be in [0, 20]")
        self._check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        if isinstance(self.structured, dict):
            self.structured = StructuredOutput(**self.structured)
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            self._check(all(-100 <= v <= 100 for v in self.logit_bias.values()), "logit_bias",
                        "values must be in [-100, 100]")

    @staticmethod
    def _check(ok: bool, param: str, what: str) -> None:
        if not ok:
            raise InvalidRequestError(f"Invalid value for '{param}': {what}.", param=param)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1


def fan_out(params: SamplingParams) -> list[SamplingParams]:
    """n > 1 becomes n single-sample children; a seeded request gives child i the seed + i (one rule for the
    client and the offline LLM, so HTTP and offline runs of a seeded request agree)."""
    if params.n == 1:
        return [params]
    return [dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + i)
            for i in range(params.n)]
