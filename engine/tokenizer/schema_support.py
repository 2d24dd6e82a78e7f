"""The JSON Schema keywords the output grammar cannot enforce, found before a grammar is compiled.

xgrammar (engine/tokenizer/grammar.py) compiles a schema into a grammar but passes over some keywords: the output
may then break them while the request "succeeds" (a strict schema with ``allOf`` got 200 and 0 of 8 valid outputs).
A request whose schema relies on one is refused with a 400 naming the keyword and where it is, never served
silently. The list was measured against xgrammar: a document breaking only that keyword is accepted by its
grammar (tests/server/test_schema_support.py checks each entry still is, so an upgrade that starts enforcing one
shows up). Patterns with lookaround are refused too (the regex converter drops the assertion with a log line);
backreferences are already refused by the compiler.
"""

from __future__ import annotations

import re
from typing import Any

# keyword -> why a user should care (the grammar accepts a document that breaks it)
UNENFORCED = {
    "allOf": "every subschema must hold, but the grammar checks none of them",
    "not": "the grammar does not exclude what it names",
    "if": "conditional subschemas (if / then / else) are not applied",
    "then": "conditional subschemas (if / then / else) are not applied",
    "else": "conditional subschemas (if / then / else) are not applied",
    "uniqueItems": "repeated array items are not prevented",
    "contains": "an array is not made to contain a matching item",
    "dependentRequired": "properties required by another property's presence are not enforced",
    "dependentSchemas": "subschemas applied by another property's presence are not enforced",
}
# keywords whose value is a schema, a list of schemas, or a map of name -> schema
_SCHEMA = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "propertyNames",
           "contains", "not", "if", "then", "else", "additionalItems")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LOOKAROUND = re.compile(r"(?<!\\)\(\?(=|!|<=|<!)")


def merge_all_of(schema: Any) -> Any:
    """``schema`` with each ``allOf`` folded into its parent where that is exact: subschemas (objects) whose keywords
    do not clash (the same value, or ``properties`` / ``$defs`` with distinct names, or ``required`` lists, which
    are joined). pydantic writes ``{"allOf": [{"$ref": ...}], "description": ...}`` for a described nested model;
    folded, the grammar enforces it. An ``allOf`` that cannot be folded stays (and is refused: ``unenforced``)."""
    if isinstance(schema, list):
        return [merge_all_of(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: merge_all_of(v) for k, v in schema.items()}
    parts = out.get("allOf")
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        return out
    merged = {k: v for k, v in out.items() if k != "allOf"}
    for part in parts:
        for key, value in part.items():
            if key not in merged or merged[key] == value:
                merged[key] = value
            elif key in ("properties", "$defs", "definitions") and isinstance(value, dict) and isinstance(
                    merged[key], dict) and not set(value) & set(merged[key]):
                merged[key] = {**merged[key], **value}
            elif key == "required" and isinstance(value, list) and isinstance(merged[key], list):
                merged[key] = merged[key] + [r for r in value if r not in merged[key]]
            else:
                return out  # a clash: not folded
    return merged


def unenforced(schema: Any, path: str = "#") -> list[str]:
    """Each keyword of ``schema`` the grammar would not enforce, as "allOf at #/properties/x" (in document order)."""
    out: list[str] = []
    _walk(schema, path, out, 0)
    return out


def _walk(s: Any, path: str, out: list[str], depth: int) -> None:
    if not isinstance(s, dict) or depth > 64:  # booleans are schemas too; the body check bounds real depth
        return
    for key, value in s.items():
        if key in UNENFORCED:
            out.append(f"'{key}' at {path} ({UNENFORCED[key]})")
        if key == "pattern" and isinstance(value, str) and _LOOKAROUND.search(value):
            out.append(f"the lookaround in 'pattern' at {path} (lookahead / lookbehind assertions are dropped)")
    for key in _SCHEMA:
        if key in s:
            v = s[key]
            for i, sub in enumerate(v) if isinstance(v, list) else ((None, v),):
                _walk(sub, f"{path}/{key}" + ("" if i is None else f"/{i}"), out, depth + 1)
    for key in _SCHEMA_LISTS:
        if isinstance(s.get(key), list):
            for i, sub in enumerate(s[key]):
                _walk(sub, f"{path}/{key}/{i}", out, depth + 1)
    for key in _SCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            for name, sub in s[key].items():
                if key == "patternProperties" and isinstance(name, str) and _LOOKAROUND.search(name):
                    out.append(f"the lookaround in the 'patternProperties' name {name!r} at {path}")
                _walk(sub, f"{path}/{key}/{name}", out, depth + 1)
