"""Structured output: grammars compiled against the engine's tokenizer, one matcher per request, token bitmasks.

The library is xgrammar (>= 0.2.9). Measured on SmolLM2's 49,152-token vocabulary with a JSON schema of nested
objects, an array of enums, bounded integers, a required set and an anyOf (55 output tokens, CPU, warm): xgrammar
fills a request's next-token bitmask in 2.5-5 us per token on average (p50 1.2-1.6 us, worst 13-112 us) after a
12 ms compile (0.1 ms from its cache); llguidance 1.9.1 took 34-63 us per token on average (p50 13-15 us, worst
0.5-1.5 ms) with a 1 ms grammar build. Both cover what OpenAI's strict mode allows (nested objects, arrays with
items, enum / const, integer and number bounds, required, anyOf, $ref / $defs, string patterns); at decode
steps of ~10-50 ms on the CPU either would be cheap, but xgrammar's masks are an order of magnitude faster,
which is what counts at batch 16 (the masks are filled one request after another on the engine's thread).
End to end on the default model (SmolLM2-135M, float32, 2 CPU cores), decode tokens/s with a schema of an array of
objects (integer bounds, enum, string, number) against the same requests unconstrained, same run: 27.9 vs 28.6 at
batch 1 (-2.3%), 154.0 vs 157.5 at batch 16 (-2.2%). Applying the masks is the larger part: xgrammar's CPU kernel
(~4 ms for 16 rows); unpacking the bits in torch ops instead had cost 19% at batch 16 (engine/layers/sampler.py).
The first structured request after a load builds the vocabulary (~0.7 s, plus xgrammar's import), once.

- ``GrammarCache`` (one per loaded tokenizer, built by EngineCore on the first structured request): the
  ``xgrammar.TokenizerInfo`` (from the tokens' UTF-8 bytes, ``token_bytes``) and a ``GrammarCompiler`` whose cache
  keys are the schema / regex text; ``matcher(spec)`` -> a fresh ``GrammarMatcher`` per request (the request's
  ``grammar``), or an InvalidRequestError naming the problem (a bad schema or regex).
- ``fill_bitmask(matchers)`` -> an int32 [rows, ceil(vocab / 32)] CPU tensor of the rows' allowed tokens; the sampler
  applies it with ``apply_bitmask`` (engine/layers/sampler.py) to those rows only, on the logits' device.
- JSON is compact (no free whitespace: a small model cannot loop on blanks); ``json_object`` is any JSON object.
  EOS is allowed only where the grammar is complete; the core finishes the request ("stop") once the matcher has
  accepted its stop token.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from engine.errors import InvalidRequestError
from engine.sampling_params import StructuredOutput
from engine.tokenizer.gguf_vocab import bytes_to_unicode
from engine.tokenizer.schema_support import merge_all_of, unenforced

log = logging.getLogger(__name__)

_PARAM = {"json": "response_format", "json_schema": "response_format", "regex": "guided_regex",
          "choice": "guided_choice", "structural_tag": "tools", "grammar": "guided_grammar"}


def token_bytes(tokenizer) -> list[bytes]:
    """The UTF-8 bytes each token id stands for (OpenAI's logprobs ``bytes``, the grammar's vocabulary), for
    byte-level BPE (GPT-2 / Llama 3 / Qwen / SmolLM), SentencePiece byte fallback (<0xNN>, '▁') and anything else
    through decode()."""
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    vocab_size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    special = getattr(tokenizer, "all_special_ids", frozenset())
    byte_level = sum(1 for p in pieces if p and ("Ġ" in p or "Ċ" in p)) > 10
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if piece is None:
            out.append(b"")
        elif i in special:
            out.append(piece.encode("utf-8"))
        elif byte_level and all(c in inverse for c in piece):
            out.append(bytes(inverse[c] for c in piece))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif "▁" in piece:
            out.append(piece.replace("▁", " ").encode("utf-8"))
        else:
            out.append(tokenizer.decode([i], skip_special_tokens=False).encode("utf-8"))
    return out


def _choice_ebnf(spec: str) -> str:
    choices = json.loads(spec)
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def enforceable_schema(so: StructuredOutput) -> str:
    """The JSON schema text to compile: ``allOf`` folded where exact; InvalidRequestError (400) naming each
    keyword the grammar would pass over (engine/tokenizer/schema_support.py), rather than outputs that break it."""
    try:
        schema = merge_all_of(json.loads(so.spec))
    except ValueError:
        return so.spec  # not JSON: the compiler says so
    refused = unenforced(schema)
    if refused:
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        raise InvalidRequestError(
            f"The JSON schema uses {'; '.join(refused[:3])}{more}: the output grammar cannot enforce that, so "
            "outputs could break the schema. Rewrite the schema without it.", param=so.param or _PARAM[so.kind])
    return json.dumps(schema)


def enforceable_tag(so: StructuredOutput) -> str:
    """A structural tag's text with each JSON schema in it made enforceable as ``enforceable_schema`` does (a tool's
    parameters under tool_choice "auto": the same 400s as under "required")."""
    def walk(node):
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "json_schema" and "json_schema" in node:
            inner = StructuredOutput("json_schema", json.dumps(node["json_schema"]), param=so.param or "tools")
            return {**node, "json_schema": json.loads(enforceable_schema(inner))}
        return {k: walk(v) for k, v in node.items()}

    try:
        spec = json.loads(so.spec)
    except ValueError:
        return so.spec  # not JSON: the compiler says so
    return json.dumps(walk(spec))


class GrammarCache:
    """The tokenizer's grammar vocabulary (built once) and its compiled grammars (cached by their text)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids) -> None:
        import xgrammar as xgr  # the server extra's; a grammar is built only for a structured request

        self._xgr = xgr
        stops = sorted(set(stop_token_ids))
        encoded = token_bytes(tokenizer)
        for i in getattr(tokenizer, "all_special_ids", ()) or ():
            if i < len(encoded):
                encoded[i] = b""  # no special token stands for its text inside the output (xgrammar: never allowed)
        self.info = xgr.TokenizerInfo(encoded, vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
                                      stop_token_ids=stops)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=True)
        self.vocab_size = vocab_size
        self._lock = threading.Lock()

    def compile(self, so: StructuredOutput):
        try:
            with self._lock:
                if so.kind == "json":
                    return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
                if so.kind == "json_schema":
                    return self.compiler.compile_json_schema(enforceable_schema(so), any_whitespace=False,
                                                             strict_mode=True)
                if so.kind == "regex":
                    return self.compiler.compile_regex(so.spec)
                if so.kind == "grammar":  # guided_grammar / structured_outputs.grammar: EBNF (GBNF's syntax)
                    return self.compiler.compile_grammar(so.spec)
                if so.kind == "structural_tag":  # tool_choice "auto" (engine.server.openai.tools.auto_grammar)
                    return self.compiler.compile_structural_tag(enforceable_tag(so))
                return self.compiler.compile_grammar(_choice_ebnf(so.spec))
        except (RuntimeError, ValueError, TypeError) as e:  # InvalidStructuralTagError is a RuntimeError
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            why = why.split(": ", 1)[1] if why.startswith("[") and ": " in why else why  # drop "[time] file.cc:N"
            raise InvalidRequestError(f"Invalid {so.kind.replace('_', ' ')} for structured output: {why}",
                                      param=so.param or _PARAM[so.kind]) from None

    def matcher(self, so: StructuredOutput) -> RequestGrammar:
        return RequestGrammar(self._xgr.GrammarMatcher(self.compile(so)), self.vocab_size)


class RequestGrammar:
    """One request's place in its grammar: ``accept_token`` after each sampled token, ``is_terminated`` once the
    grammar has taken its stop token; ``fill`` writes the next allowed tokens into a bitmask row."""

    __slots__ = ("matcher", "vocab_size")

    def __init__(self, matcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def accept_token(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill(self, bitmask, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def fill_bitmask(grammars: list[Any]):
    """One int32 row of allowed-token bits per grammar (bit t % 32 of word t // 32), on the CPU."""
    import torch  # this module stays torch-free for the server's request checks (parse_spec)

    mask = torch.empty((len(grammars), bitmask_width(grammars[0].vocab_size)), dtype=torch.int32)
    for i, g in enumerate(grammars):
        g.fill(mask, i)
    return mask


def parse_spec(kind: str, value: Any) -> StructuredOutput:
    """A request's structured-output field -> StructuredOutput (shape checks only: the grammar is compiled by the
    engine, where a schema the compiler refuses is an InvalidRequestError too)."""
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequestError("Invalid value for 'guided_choice': a non-empty list of non-empty strings.",
                                      param="guided_choice")
        return StructuredOutput("choice", json.dumps(value))
    if kind in ("regex", "grammar"):
        name = f"guided_{kind}"
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequestError(f"Invalid value for '{name}': a non-empty string.", param=name)
        return StructuredOutput(kind, value, param=name)
    raise ValueError(kind)


# vLLM's ``structured_outputs`` object: its constraint keys, and the options that change nothing here
_STRUCTURED_OUTPUTS = ("json", "regex", "choice", "grammar", "json_object")
_STRUCTURED_OUTPUTS_NEUTRAL = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                               "whitespace_pattern", "backend")


def structured_outputs_spec(value: Any) -> StructuredOutput | None:
    """vLLM's ``structured_outputs`` ({"json": schema, "regex": ..., "choice": [...], "grammar": EBNF,
    "json_object": true}: exactly one) -> StructuredOutput; an unknown key or two constraints is a 400 naming it.
    None for an empty object. (JSON output is compact whatever its whitespace options say.)"""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError("Invalid value for 'structured_outputs': an object such as {\"json\": schema}, "
                                  "{\"regex\": ...}, {\"choice\": [...]}, {\"grammar\": ...} or "
                                  "{\"json_object\": true}.", param="structured_outputs")
    for key in value:
        if key not in _STRUCTURED_OUTPUTS and key not in _STRUCTURED_OUTPUTS_NEUTRAL:
            raise InvalidRequestError(f"Unknown parameter: 'structured_outputs.{key}' (one of "
                                      f"{', '.join(_STRUCTURED_OUTPUTS)}).", param=f"structured_outputs.{key}")
    given = [k for k in _STRUCTURED_OUTPUTS if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise InvalidRequestError(f"Only one constraint in 'structured_outputs': {', '.join(given)} were given.",
                                  param="structured_outputs")
    if not given:
        return None
    key = given[0]
    param, spec = f"structured_outputs.{key}", value[key]
    if key == "json_object":
        return StructuredOutput("json", param=param)
    if key == "json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError:
                raise InvalidRequestError(f"Invalid value for '{param}': not valid JSON.", param=param) from None
        if not isinstance(spec, (dict, bool)):
            raise InvalidRequestError(f"Invalid value for '{param}': a JSON Schema object.", param=param)
        return StructuredOutput("json_schema", json.dumps(spec), param=param)
    if key == "choice":
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) and c for c in spec):
            raise InvalidRequestError(f"Invalid value for '{param}': a non-empty list of non-empty strings.",
                                      param=param)
        return StructuredOutput("choice", json.dumps(spec), param=param)
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidRequestError(f"Invalid value for '{param}': a non-empty string.", param=param)
    return StructuredOutput(key, spec, param=param)
