"""``--speculative-config``: vLLM's JSON, parsed and checked once at start-up (torch-free).

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    {"model": "/path/to/draft", "num_speculative_tokens": 4}          (method "draft_model", implied by "model")
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.errors import InvalidRequestError

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    model: str | None = None  # the draft model (method draft_model)

    def describe(self) -> str:
        if self.method == "ngram":
            return (f"ngram k={self.num_speculative_tokens} lookup {self.prompt_lookup_min}.."
                    f"{self.prompt_lookup_max}")
        return f"draft model {self.model} k={self.num_speculative_tokens}"


def parse_speculative_config(text: str | dict | None) -> SpeculativeConfig | None:
    """The flag's JSON (or its dict) -> SpeculativeConfig; None for no speculation (None, "" or "{}").
    InvalidRequestError names what is wrong."""
    if text is None or text == "" or text == {}:
        return None
    if isinstance(text, str):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"--speculative-config is not JSON: {e}") from None
    else:
        raw = dict(text)
    if not isinstance(raw, dict):
        raise InvalidRequestError("--speculative-config must be a JSON object")
    if not raw:
        return None
    known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidRequestError(f"--speculative-config: unknown key(s) {', '.join(unknown)} "
                                  f"(known: {', '.join(sorted(known))})")
    method = raw.get("method") or ("draft_model" if raw.get("model") else None)
    if method not in METHODS:
        raise InvalidRequestError(f"--speculative-config: method must be one of {', '.join(METHODS)} "
                                  f"(or give a draft \"model\"), not {method!r}")
    k = raw.get("num_speculative_tokens")
    if not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise InvalidRequestError(f"--speculative-config: num_speculative_tokens must be an integer in "
                                  f"1..{MAX_SPECULATIVE_TOKENS}, not {k!r}")
    if method == "draft_model":
        if not raw.get("model"):
            raise InvalidRequestError("--speculative-config: a draft model needs \"model\": a path")
        return SpeculativeConfig("draft_model", k, model=str(raw["model"]))
    hi = raw.get("prompt_lookup_max", 4)
    lo = raw.get("prompt_lookup_min", min(2, hi) if isinstance(hi, int) else 2)
    if not (isinstance(hi, int) and isinstance(lo, int) and 1 <= lo <= hi):
        raise InvalidRequestError(f"--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max, "
                                  f"not {lo!r} and {hi!r}")
    return SpeculativeConfig("ngram", k, prompt_lookup_max=hi, prompt_lookup_min=lo)
