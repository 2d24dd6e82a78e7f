"""Ready-to-paste client snippets for the running endpoint."""

from __future__ import annotations

import json


def curl_snippet(base_url: str, model: str, api_key: str | None) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "stream": False})
    auth = f' \\\n  -H "Authorization: Bearer {api_key}"' if api_key else ""
    return (f"curl {base_url}/v1/chat/completions \\\n  -H \"Content-Type: application/json\"{auth} \\\n"
            f"  -d '{body}'")


def python_snippet(base_url: str, model: str, api_key: str | None) -> str:
    return (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base_url}/v1", api_key="{api_key or "not-needed"}")\n'
        "stream = client.chat.completions.create(\n"
        f'    model="{model}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        "    stream=True,\n"
        ")\n"
        "for chunk in stream:\n"
        '    print(chunk.choices[0].delta.content or "", end="", flush=True)\n'
    )
