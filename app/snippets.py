"""Ready-to-paste client snippets for the running endpoint: a chat, a tool call, a JSON-schema request and an
embeddings call, each as curl and as Python with the official ``openai`` client. Every snippet runs as it is
against Kestrel's server (tests/server/test_snippets.py runs them), so the agent and retrieval clients they
stand for are known to work."""

from __future__ import annotations

import json

# (key, label) in the order the Server panel offers them
SNIPPET_KINDS = (("chat", "Chat"), ("tools", "Tool call"), ("json_schema", "JSON schema"),
                 ("embeddings", "Embeddings"))

_WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"]}}}
_PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["name", "age"], "additionalProperties": False}
_EMBED_INPUT = ["Kestrel runs models locally.", "A kestrel is a small falcon."]


def _body(kind: str, model: str) -> tuple[str, dict]:
    """The route and JSON body of one kind of request."""
    if kind == "embeddings":
        return "/v1/embeddings", {"model": model, "input": _EMBED_INPUT}
    body: dict = {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "stream": False}
    if kind == "tools":
        body["messages"] = [{"role": "user", "content": "What is the weather in Paris?"}]
        # "required": the server's grammar makes the model call a tool (with "auto" the model decides)
        body.update(tools=[_WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False)
    elif kind == "json_schema":
        body["messages"] = [{"role": "user", "content": "Describe a person as JSON."}]
        body.update(max_tokens=100, response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": _PERSON_SCHEMA, "strict": True}})
    elif kind != "chat":
        raise ValueError(f"unknown snippet kind {kind!r}")
    return "/v1/chat/completions", body


def curl_snippet(base_url: str, model: str, api_key: str | None, kind: str = "chat") -> str:
    route, body = _body(kind, model)
    auth = f' \\\n  -H "Authorization: Bearer {api_key}"' if api_key else ""
    # -s: no progress meter mixed into the JSON answer
    return (f"curl -s {base_url}{route} \\\n  -H \"Content-Type: application/json\"{auth} \\\n"
            f"  -d '{json.dumps(body)}'")


def _py(value) -> str:
    """A JSON value as Python source (indented, True/False/None spelled the Python way)."""
    return repr(value) if not isinstance(value, (dict, list)) else (
        json.dumps(value, indent=4).replace(": true", ": True").replace(": false", ": False")
        .replace(": null", ": None"))


def python_snippet(base_url: str, model: str, api_key: str | None, kind: str = "chat") -> str:
    head = ("from openai import OpenAI\n\n"
            f'client = OpenAI(base_url="{base_url}/v1", api_key="{api_key or "not-needed"}")\n')
    if kind == "chat":
        return head + (
            "stream = client.chat.completions.create(\n"
            f'    model="{model}",\n'
            '    messages=[{"role": "user", "content": "Hello!"}],\n'
            "    stream=True,\n"
            ")\n"
            "for chunk in stream:\n"
            '    print(chunk.choices[0].delta.content or "", end="", flush=True)\n'
        )
    if kind == "tools":
        return head + (
            f"tools = [{_py(_WEATHER_TOOL)}]\n"
            "reply = client.chat.completions.create(\n"
            f'    model="{model}",\n'
            '    messages=[{"role": "user", "content": "What is the weather in Paris?"}],\n'
            "    tools=tools,\n"
            '    tool_choice="required",  # or "auto": the model decides\n'
            "    parallel_tool_calls=False,  # at most one call per reply\n"
            ")\n"
            "for call in reply.choices[0].message.tool_calls or []:\n"
            "    print(call.function.name, call.function.arguments)\n"
        )
    if kind == "json_schema":
        return "import json\n\n" + head + (
            f"schema = {_py(_PERSON_SCHEMA)}\n"
            "reply = client.chat.completions.create(\n"
            f'    model="{model}",\n'
            '    messages=[{"role": "user", "content": "Describe a person as JSON."}],\n'
            '    response_format={"type": "json_schema",\n'
            '                     "json_schema": {"name": "person", "schema": schema, "strict": True}},\n'
            "    max_tokens=100,\n"
            ")\n"
            "print(json.loads(reply.choices[0].message.content))\n"
        )
    if kind == "embeddings":
        return head + (
            "result = client.embeddings.create(\n"
            f'    model="{model}",\n'
            f"    input={_EMBED_INPUT!r},\n"
            ")\n"
            "for item in result.data:\n"
            "    print(item.index, len(item.embedding), item.embedding[:4])\n"
        )
    raise ValueError(f"unknown snippet kind {kind!r}")
