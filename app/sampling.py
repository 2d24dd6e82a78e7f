"""Sampling settings of the chat: what the UI edits, their defaults from the model's generation_config
(or sensible ones when it has none, as GGUF files do), and the engine's SamplingParams."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.sampling_params import SamplingParams, StructuredOutput

FALLBACK = {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "max_tokens": 1024}


@dataclass
class SamplingSettings:
    temperature: float = FALLBACK["temperature"]
    top_p: float = FALLBACK["top_p"]
    top_k: int = FALLBACK["top_k"]  # 0: off
    min_p: float = FALLBACK["min_p"]
    max_tokens: int = FALLBACK["max_tokens"]
    seed: int | None = None  # None: random
    stop: list[str] = field(default_factory=list)
    repetition_penalty: float = 1.0  # from generation_config only (not in the form)

    @classmethod
    def from_generation_config(cls, gc: dict[str, Any] | None) -> SamplingSettings:
        """The model's recommended values where it gives them; FALLBACK for the rest. A config that turns
        sampling off (do_sample false) means greedy."""
        gc = gc or {}
        s = cls()
        if gc:
            s.temperature = float(gc.get("temperature", s.temperature))
            s.top_p = float(gc.get("top_p", s.top_p))
            s.top_k = int(gc.get("top_k", 0 if "top_p" in gc else s.top_k))
            s.min_p = float(gc.get("min_p", 0.0 if ("top_p" in gc or "top_k" in gc) else s.min_p))
            s.repetition_penalty = float(gc.get("repetition_penalty", 1.0))
            if gc.get("do_sample") is False:
                s.temperature = 0.0
        return s

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_params(self, output: OutputFormat | None = None):
        """The engine's SamplingParams; with ``output`` (the conversation's output format) its structured
        output too."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                              max_tokens=self.max_tokens, seed=self.seed, stop=list(self.stop),
                              repetition_penalty=self.repetition_penalty,
                              structured=output.structured() if output is not None else None)


# ------------------------------------------------------------------------------------------------
# output format (per conversation): plain text, any JSON object, or JSON that follows a schema, enforced by the
# engine's structured output (engine.sampling_params.StructuredOutput: constrained decoding, so the reply
# always parses unless max tokens cuts it)

OUTPUT_FORMATS = {"text": "Plain text", "json_object": "JSON object", "json_schema": "JSON schema"}
_JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


@dataclass
class OutputFormat:
    kind: str = "text"  # a key of OUTPUT_FORMATS
    schema: str = ""  # the JSON schema as the user wrote it (kind "json_schema")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> OutputFormat:
        d = d or {}
        kind = d.get("kind") if d.get("kind") in OUTPUT_FORMATS else "text"
        return cls(kind, str(d.get("schema") or ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problem(self) -> str | None:
        """Why this format cannot be sent, in words (None: it can)."""
        return schema_problem(self.schema) if self.kind == "json_schema" else None

    def structured(self):
        """The engine's StructuredOutput for this format (None for plain text); ValueError when the schema has a
        problem."""
        if self.kind == "text":
            return None
        if self.kind == "json_object":
            return StructuredOutput("json")
        why = self.problem()
        if why:
            raise ValueError(why)
        return StructuredOutput("json_schema", json.dumps(json.loads(self.schema)))


def schema_problem(text: str) -> str | None:
    """What is wrong with a JSON schema's text, said so that it can be fixed (where and what), or None. Checks the
    JSON and the schema keywords a typo breaks most (types, properties, required, items, enum); the engine's
    grammar compiler has the last word (its refusal is shown under the reply)."""
    if not text.strip():
        return 'Write a JSON schema, e.g. {"type": "object", "properties": {"answer": {"type": "string"}}}.'
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return f"Not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})."
    if not isinstance(doc, dict):
        return f"A JSON schema is a JSON object ({{...}}), not {_json_kind(doc)}."
    return _subschema_problem(doc, "the schema")


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _subschema_problem(s: Any, where: str) -> str | None:
    if isinstance(s, bool):
        return None
    if not isinstance(s, dict):
        return f"{where} must be a schema (an object), not {_json_kind(s)}."
    t = s.get("type")
    for name in ([t] if isinstance(t, str) else t if isinstance(t, list) else [] if t is None else [0]):
        if name not in _JSON_TYPES:
            return f"'type' of {where} is {json.dumps(name)}: use one of {', '.join(_JSON_TYPES)}."
    props = s.get("properties")
    if props is not None and not isinstance(props, dict):
        return f"'properties' of {where} must be an object mapping names to schemas."
    req = s.get("required")
    if req is not None:
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            return f"'required' of {where} must be a list of property names."
        missing = [r for r in req if isinstance(props, dict) and r not in props]
        if missing and s.get("additionalProperties") is False:
            return f"'required' of {where} names {json.dumps(missing[0])}, which is not in its 'properties'."
    enum = s.get("enum")
    if enum is not None and (not isinstance(enum, list) or not enum):
        return f"'enum' of {where} must be a non-empty list of values."
    for key in _SUBSCHEMA_MAPS:
        sub = s.get(key)
        if isinstance(sub, dict):
            for name, value in sub.items():
                why = _subschema_problem(value, f"{key}.{name}" if where == "the schema" else f"{where}.{key}.{name}")
                if why:
                    return why
    for key in _SUBSCHEMA_LISTS:
        sub = s.get(key)
        if sub is not None and not isinstance(sub, list):
            return f"'{key}' of {where} must be a list of schemas."
        for i, value in enumerate(sub or []):
            why = _subschema_problem(value, f"{where}.{key}[{i}]")
            if why:
                return why
    for key in ("items", "additionalProperties", "not"):
        if key in s and not isinstance(s[key], bool):
            why = _subschema_problem(s[key], f"{where}.{key}")
            if why:
                return why
    return None
