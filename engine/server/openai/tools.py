"""Tool calling on /v1/chat/completions, the request's side: ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
checked (400s naming the field), the plan for the request (``ToolPlan``), and the conversation made fit for the
model's chat template.

- ``tool_choice`` "none": the tools are not offered to the template; plain chat.
- "auto" (the default with tools): the tools go through the model's own chat template (``tools=``) and the output
  is parsed in the format that template teaches (engine.tokenizer.tool_parsers). A template that does not take
  ``tools`` (or whose call format Kestrel does not know) gets a 400: the model was never told about them.
- "required" / a named function: a grammar enforces the call, so the arguments are valid JSON for the function's
  schema whatever the model: a named function's output is its arguments object, "required"'s a JSON array of
  ``{"name", "parameters"}`` (one item when ``parallel_tool_calls`` is false). The template still gets the tools
  when it takes them; one that does not gets a system message that lists them, so the model knows what to fill in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError
from engine.sampling_params import StructuredOutput
from engine.tokenizer.tool_parsers import FORMATS, ToolFormat, tool_format_for

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_MAX_SCHEMA_DEPTH = 64
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    choice: str  # "none" | "auto" | "required" | "named"
    tools: list[dict]  # as checked, in OpenAI's shape ({"type": "function", "function": {...}})
    offered: bool  # the tools go through the chat template
    parallel: bool
    fmt: ToolFormat | None = None  # how to read the output ("auto", "required")
    name: str | None = None  # the named function
    structured: StructuredOutput | None = None  # the grammar of "required" / a named function

    @property
    def max_calls(self) -> int | None:
        return None if self.parallel else 1

    @property
    def parses(self) -> bool:
        return self.choice != "none"


def _bad(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {what}.", param=param)


def _check_schema(schema: Any, param: str, depth: int = 0) -> None:
    """The shape of a JSON Schema, enough to refuse what no validator or grammar could take (the grammar compiler
    checks the rest when the choice is enforced)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise _bad(param, "a JSON Schema must be an object")
    if depth > _MAX_SCHEMA_DEPTH:
        raise _bad(param, f"the schema is nested deeper than {_MAX_SCHEMA_DEPTH} levels")
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        bad = next((x for x in types if not isinstance(x, str) or x not in _TYPES), None)
        if bad is not None or not types:
            raise _bad(param, f"unknown type {bad!r} (one of {', '.join(sorted(_TYPES))})")
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise _bad(param, "'properties' must be an object of schemas")
        for k, v in props.items():
            _check_schema(v, f"{param}.properties.{k}", depth + 1)
    req = schema.get("required")
    if req is not None and not (isinstance(req, list) and all(isinstance(x, str) for x in req)):
        raise _bad(param, "'required' must be a list of property names")
    for key in ("items", "additionalProperties", "not"):
        if key in schema and schema[key] is not None:
            _check_schema(schema[key], f"{param}.{key}", depth + 1)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if key in schema:
            if not isinstance(schema[key], list) or not schema[key]:
                raise _bad(param, f"'{key}' must be a non-empty list of schemas")
            for j, sub in enumerate(schema[key]):
                _check_schema(sub, f"{param}.{key}[{j}]", depth + 1)
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        raise _bad(param, "'enum' must be a non-empty list")
    defs = schema.get("$defs", schema.get("definitions"))
    if defs is not None:
        if not isinstance(defs, dict):
            raise _bad(param, "'$defs' must be an object of schemas")
        for k, v in defs.items():
            _check_schema(v, f"{param}.$defs.{k}", depth + 1)


def check_tools(tools: Any) -> list[dict]:
    """The request's ``tools`` in OpenAI's shape, each checked; 400 naming the first bad field."""
    if not isinstance(tools, list):
        raise _bad("tools", "a list of {\"type\": \"function\", \"function\": {...}} objects")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"Too many entries in 'tools': {len(tools)}, at most {MAX_TOOLS}.", param="tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(where, "an object {\"type\": \"function\", \"function\": {...}}")
        if tool.get("type", "function") != "function":
            raise _bad(f"{where}.type", f"{tool.get('type')!r} is not supported (only 'function')")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise InvalidRequestError(f"Missing required parameter: '{where}.function'.", param=f"{where}.function")
        name = fn.get("name")
        if name is None:
            raise InvalidRequestError(f"Missing required parameter: '{where}.function.name'.",
                                      param=f"{where}.function.name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(f"{where}.function.name", "a name of 1 to 64 letters, digits, underscores, dots or dashes")
        if name in seen:
            raise _bad(f"{where}.function.name", f"the function name {name!r} is used twice")
        seen.add(name)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise _bad(f"{where}.function.description", "a string")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise _bad(f"{where}.function.strict", "a boolean")
        params = fn.get("parameters")
        if params is not None:
            _check_schema(params, f"{where}.function.parameters")
            if isinstance(params, bool) or params.get("type", "object") != "object":
                raise _bad(f"{where}.function.parameters", "the parameters schema must be of type 'object'")
        clean = {"name": name}
        if desc is not None:
            clean["description"] = desc
        clean["parameters"] = params if params is not None else dict(_EMPTY_PARAMETERS)
        out.append({"type": "function", "function": clean})
    return out


def _choice(value: Any, names: list[str]) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if names else "none"), None
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise _bad("tool_choice", f"{value!r} (one of 'none', 'auto', 'required' or "
                                      "{\"type\": \"function\", \"function\": {\"name\": ...}})")
        if value == "required" and not names:
            raise InvalidRequestError("'tool_choice' 'required' needs 'tools'.", param="tool_choice")
        return value, None
    fn = value.get("function") if isinstance(value, dict) else None
    if not isinstance(fn, dict) or value.get("type") != "function":
        raise _bad("tool_choice", "'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                                  "{\"name\": ...}}")
    name = fn.get("name")
    if not isinstance(name, str):
        raise InvalidRequestError("Missing required parameter: 'tool_choice.function.name'.",
                                  param="tool_choice.function.name")
    if name not in names:
        raise InvalidRequestError(f"Invalid value for 'tool_choice': no function named {name!r} in 'tools'.",
                                  param="tool_choice")
    return "named", name


def template_takes_tools(template: str | None) -> bool:
    """Whether a chat template reads the ``tools`` variable (HF templates with tool support do)."""
    return bool(template) and re.search(r"\btools\b", template) is not None


def _grammar(tools: list[dict], choice: str, name: str | None, parallel: bool) -> StructuredOutput:
    if choice == "named":
        fn = next(t["function"] for t in tools if t["function"]["name"] == name)
        idx = next(i for i, t in enumerate(tools) if t["function"]["name"] == name)
        return StructuredOutput("json_schema", json.dumps(fn["parameters"]),
                                param=f"tools[{idx}].function.parameters")
    items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                               "parameters": t["function"]["parameters"]},
              "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    schema: dict = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return StructuredOutput("json_schema", json.dumps(schema), param="tools")


def plan_tools(extra: dict, template: str | None, architecture: str | None) -> ToolPlan | None:
    """The request's tool fields -> its ToolPlan (None: no tools, plain chat). ``template`` is the chat template
    the request will be rendered with (the model's "tool_use" one where it has it)."""
    raw_tools = extra.get("tools")
    parallel = extra.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "a boolean")
    tools = check_tools(raw_tools) if raw_tools is not None else []
    choice, name = _choice(extra.get("tool_choice"), [t["function"]["name"] for t in tools])
    if not tools:
        return None
    plan = ToolPlan(choice, tools, offered=False, parallel=parallel is not False, name=name)
    if choice == "none":
        return plan
    takes = template_takes_tools(template)
    plan.offered = takes
    if choice == "auto":
        fmt = tool_format_for(template, architecture)
        if not takes or fmt is None:
            why = ("its chat template does not take tools" if not takes
                   else "Kestrel does not know the tool-call format its chat template teaches")
            raise InvalidRequestError(
                f"This model cannot be offered tools with tool_choice 'auto': {why}. Use tool_choice 'required' "
                "or a named function (a grammar then enforces the call), or send no tools.", param="tools")
        plan.fmt = fmt
        return plan
    if extra.get("response_format") not in (None, {"type": "text"}) or any(
            extra.get(k) is not None for k in ("guided_json", "guided_regex", "guided_choice")):
        raise InvalidRequestError("'response_format' (or a guided_* field) cannot be combined with tool_choice "
                                  f"{'required' if choice == 'required' else 'a named function'}: both constrain "
                                  "the output.", param="tool_choice")
    plan.fmt = FORMATS["json_array"] if choice == "required" else None
    plan.structured = _grammar(tools, choice, name, plan.parallel)
    return plan


def _arguments(value: Any) -> Any:
    """OpenAI sends arguments as JSON text; chat templates expect the object (as transformers documents)."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def check_tool_calls(value: Any, param: str) -> list[dict]:
    """An assistant message's ``tool_calls`` -> the shape chat templates read (arguments as objects)."""
    if not isinstance(value, list):
        raise _bad(param, "a list of tool calls")
    out = []
    for j, call in enumerate(value):
        where = f"{param}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(where, "{\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}")
        if fn.get("arguments") is not None and not isinstance(fn["arguments"], (str, dict)):
            raise _bad(f"{where}.function.arguments", "a JSON string")
        item = {"type": "function", "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"))}}
        if isinstance(call.get("id"), str):
            item["id"] = call["id"]
        out.append(item)
    return out


def fit_history(messages: list[dict], template: str | None) -> list[dict]:
    """Tool calls and results of earlier turns for a template that does not know them: the calls become the
    assistant's text (JSON), so the model still sees what it called. Templates that read ``tool_calls`` get the
    messages unchanged."""
    if template and "tool_calls" in template:
        if "length != 9" in template:  # Mistral's templates take only 9-character alphanumeric call ids
            return [_mistral_ids(m) for m in messages]
        return messages
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            text = json.dumps([{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                               for c in calls], ensure_ascii=False)
            m["content"] = f"{m['content']}\n{text}" if m.get("content") else text
        out.append(m)
    return out


def _short_id(call_id: str) -> str:
    return (re.sub(r"[^A-Za-z0-9]", "", call_id)[-9:]).rjust(9, "0")


def _mistral_ids(m: dict) -> dict:
    """The same call ids shortened the same way in the assistant's calls and the tool results that answer them."""
    if m.get("tool_calls"):
        calls = [{**c, "id": _short_id(c["id"])} if isinstance(c.get("id"), str) else c for c in m["tool_calls"]]
        return {**m, "tool_calls": calls}
    if isinstance(m.get("tool_call_id"), str):
        return {**m, "tool_call_id": _short_id(m["tool_call_id"])}
    return m


def with_tool_hint(messages: list[dict], plan: ToolPlan) -> list[dict]:
    """For a template that does not take tools (the choice enforced by a grammar): a system message that lists the
    functions, so the model knows what it is filling in."""
    specs = json.dumps([t["function"] for t in plan.tools], ensure_ascii=False)
    what = f"Call the function {plan.name!r}" if plan.choice == "named" else "Call one or more of them"
    hint = f"You can call these functions:\n{specs}\n{what}, answering with the call's JSON."
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{hint}".lstrip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": hint}, *messages]
