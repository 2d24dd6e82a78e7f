"""The bounds the OpenAI server holds a request to: list sizes, OpenAI's ranges. One place for both users:
the body's list sizes checked before parsing (engine.server.openai.body_checks.precheck_body) and the parsed
request's checks (engine.server.openai.serving.sampling_params, the handlers)."""

from __future__ import annotations

from engine.errors import InvalidRequestError

MAX_N = 128  # samples per prompt
MAX_CHOICES = 256  # prompts x n per HTTP request
MAX_MESSAGES = 10_000  # chat messages per request
MAX_CONTENT_PARTS = 1024  # text parts per message
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096  # per stop string
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # entries
MAX_TOKENIZE_CONTEXTS = 8  # /tokenize refuses a text of surely more than 8 context lengths
MAX_DETOKENIZE_TOKENS = 1 << 20
TEMPERATURE_RANGE = (0.0, 2.0)  # OpenAI's
REPETITION_PENALTY_MAX = 2.0
INT64_RANGE = (-(2**63), 2**63 - 1)


def check_count(name: str, items, most: int) -> None:
    """InvalidRequestError naming ``name`` when ``items`` (None: absent) has more than ``most`` entries."""
    if items is not None and len(items) > most:
        raise InvalidRequestError(f"Too many entries in '{name}': {len(items)}, at most {most}.", param=name)
