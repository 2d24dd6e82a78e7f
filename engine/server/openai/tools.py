"""Tool calling on /v1/chat/completions, the request's side: ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
checked (400s naming the field), the plan for the request (``ToolPlan``), and the conversation made fit for the
model's chat template.

- ``tool_choice`` "none": the tools are not offered to the template; plain chat.
- "auto" (the default with tools): a template that takes ``tools`` (and whose call format Kestrel knows, or that
  ``--tool-call-parser`` names) gets them (``tools=``) and the output is parsed in the format it teaches
  (engine.tokenizer.tool_parsers). Any other template (SmolLM2's, the shipped model's) gets Kestrel's built-in
  tool prompt, as LM Studio does for models without native tool support: a system-message section
  (``BUILTIN_TOOL_PROMPT``) that lists the tools' JSON schemas inside ``<tools></tools>`` and asks for each call as
  ``<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>`` (the hermes format,
  parsed by its parser). Where the call format opens with a text marker (hermes: ``<tool_call>``, built-in or
  native) a grammar (``auto_grammar``: an xgrammar structural tag) leaves the text free until the model writes the
  marker, then takes over: the call names a function and its arguments validate against that function's schema.
  With ``response_format`` json_schema / json_object the grammar is "tool calls, or the schema's JSON".
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
    builtin: bool = False  # "auto" through Kestrel's built-in tool prompt (the template takes no tools)
    legacy: bool = False  # the request used the deprecated ``functions`` / ``function_call``: answer in kind
    enforced: bool = False  # a grammar writes the calls: one cut short (max_tokens) is dropped, never content

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


def native_format(template: str | None, architecture: str | None, parser: str | None = None) -> ToolFormat | None:
    """The call format of a template that takes tools (``parser``, the server's ``--tool-call-parser``, else the
    one the template teaches); None when the built-in tool prompt applies."""
    if not template_takes_tools(template):
        return None
    return FORMATS[parser] if parser else tool_format_for(template, architecture)


def tool_mode(template: str | None, architecture: str | None, parser: str | None = None) -> dict:
    """What tool_choice "auto" does on this model (GET /v1/server_info): the template's own tool support and
    parser, or the built-in tool prompt and its hermes parser."""
    fmt = native_format(template, architecture, parser)
    if fmt is None:
        return {"auto": "builtin_prompt", "parser": "hermes", "grammar": True}
    return {"auto": "chat_template", "parser": fmt.name, "grammar": fmt.marker is not None and fmt.name == "hermes"}


def client_tool_mode(client, parser: str | None = None) -> dict:
    """``tool_mode`` for an EngineClient's model, from its tokenizer's template (the one a request with tools is
    rendered with): what the app's Load panel shows (the app's endpoint uses the model's template and no
    --tool-call-parser); ``kestrel serve`` reports the same through GET /v1/server_info's ``tools``."""
    tok = getattr(client, "tokenizer", None)
    template = None
    if tok is not None:
        try:
            template = tok.get_chat_template(None, tools=[{}])
        except Exception:  # noqa: BLE001 - no template: the built-in prompt is what applies
            template = None
    return tool_mode(template, client.info.architecture, parser)


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


def legacy_functions(extra: dict) -> bool:
    """OpenAI's deprecated ``functions`` / ``function_call`` mapped onto ``tools`` / ``tool_choice`` in ``extra``
    (in place); True when the request used them (the answer then carries ``function_call``, one call)."""
    functions, call = extra.get("functions"), extra.get("function_call")
    if functions is None and call is None:
        return False
    if extra.get("tools") is not None or extra.get("tool_choice") is not None:
        raise InvalidRequestError("Give either 'functions' / 'function_call' (deprecated) or 'tools' / "
                                  "'tool_choice', not both.", param="functions")
    if functions is not None:
        if not isinstance(functions, list):
            raise _bad("functions", "a list of {\"name\", \"description\", \"parameters\"} objects")
        extra["tools"] = [{"type": "function", "function": f} for f in functions]
    if call is not None:
        if isinstance(call, dict):
            extra["tool_choice"] = {"type": "function", "function": call}
        elif call in ("none", "auto"):
            extra["tool_choice"] = call
        else:
            raise _bad("function_call", "'none', 'auto' or {\"name\": ...}")
    extra["parallel_tool_calls"] = False
    return True


def plan_tools(extra: dict, template: str | None, architecture: str | None,
               parser: str | None = None) -> ToolPlan | None:
    """The request's tool fields -> its ToolPlan (None: no tools, plain chat). ``template`` is the chat template
    the request will be rendered with (the model's "tool_use" one where it has it); ``parser`` the server's
    ``--tool-call-parser`` (None: from the template)."""
    legacy = legacy_functions(extra)
    raw_tools = extra.get("tools")
    parallel = extra.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "a boolean")
    tools = check_tools(raw_tools) if raw_tools is not None else []
    choice, name = _choice(extra.get("tool_choice"), [t["function"]["name"] for t in tools])
    if not tools:
        return None
    plan = ToolPlan(choice, tools, offered=False, parallel=parallel is not False, name=name, legacy=legacy)
    if choice == "none":
        return plan
    takes = template_takes_tools(template)
    plan.offered = takes
    if choice == "auto":
        fmt = native_format(template, architecture, parser)
        if fmt is None:  # Kestrel's own tool prompt and the format it teaches
            plan.offered, plan.builtin, fmt = False, True, FORMATS["hermes"]
        plan.fmt = fmt
        return plan
    if extra.get("response_format") not in (None, {"type": "text"}) or any(
            extra.get(k) is not None for k in ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                               "structured_outputs")):
        raise InvalidRequestError("'response_format' (or a guided_* field) cannot be combined with tool_choice "
                                  f"{'required' if choice == 'required' else 'a named function'}: both constrain "
                                  "the output.", param="tool_choice")
    plan.fmt = FORMATS["json_array"] if choice == "required" else None
    plan.structured = _grammar(tools, choice, name, plan.parallel)
    plan.enforced = True
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
    assistant's text, written as the built-in tool prompt asks (``<tool_call>`` JSON ``</tool_call>``), so the
    model still sees what it called. Templates that read ``tool_calls`` get the
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
            text = "\n".join(_hermes_call(c["function"]["name"], c["function"]["arguments"]) for c in calls)
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


def _hermes_call(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


BUILTIN_TOOL_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> \
XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def with_builtin_tools(messages: list[dict], plan: ToolPlan) -> list[dict]:
    """The built-in tool prompt (``BUILTIN_TOOL_PROMPT``: the tools' JSON schemas and the call format) as a
    section of the system message, for a template that takes no tools under tool_choice "auto"."""
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in plan.tools)
    section = BUILTIN_TOOL_PROMPT.format(tools=specs)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{section}".lstrip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"


def _call_tags(tools: list[dict]) -> list[dict]:
    return [{"type": "tag", "begin": f'{_CALL_OPEN}\n{{"name": {json.dumps(t["function"]["name"])}, "arguments": ',
             "content": {"type": "json_schema", "json_schema": t["function"]["parameters"], "max_whitespace_cnt": 1},
             "end": f"}}\n{_CALL_CLOSE}"} for t in tools]


def auto_grammar(plan: ToolPlan, answer: StructuredOutput | None) -> StructuredOutput | None:
    """The grammar of tool_choice "auto" in the hermes format (built-in prompt or a hermes template): free text
    until the model writes ``<tool_call>``, then the call (a function of ``tools``, its arguments valid for its
    schema) and ``</tool_call>``; then free text again (one call only with ``parallel_tool_calls`` false). With
    ``answer`` (response_format json_schema / json_object): tool calls, or the schema's JSON. None where the
    format has no text marker (the output is parsed, not enforced) or ``answer`` is another kind of grammar
    (guided_regex / guided_choice: it covers the whole output, as without tools)."""
    if plan.choice != "auto" or plan.fmt is None or plan.fmt.name != "hermes":
        return answer
    tags = _call_tags(plan.tools)
    if answer is None:
        fmt = {"type": "triggered_tags", "triggers": [_CALL_OPEN], "tags": tags,
               "stop_after_first": not plan.parallel}
        param = "tools"
    elif answer.kind in ("json", "json_schema"):
        schema = json.loads(answer.spec) if answer.kind == "json_schema" else {"type": "object"}
        calls = (tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}) if not plan.parallel else {
            "type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True}
        fmt = {"type": "or", "elements": [calls, {"type": "json_schema", "json_schema": schema,
                                                  "max_whitespace_cnt": 1}]}
        param = answer.param or "response_format"
    else:
        return answer
    return StructuredOutput("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}), param=param)


def apply_plan(plan: ToolPlan | None, params) -> ToolPlan | None:
    """The tool plan's grammar on the request's SamplingParams (chat and /v1/responses): the calls' grammar, or under
    "auto" the structural tag over the answer's own. Returns the plan when the output is parsed for calls."""
    if plan is None:
        return None
    if plan.structured is not None:
        params.structured = plan.structured
    elif plan.choice == "auto":
        grammar = auto_grammar(plan, params.structured)
        plan.enforced = grammar is not None and grammar.kind == "structural_tag"
        params.structured = grammar
    return plan if plan.parses else None
