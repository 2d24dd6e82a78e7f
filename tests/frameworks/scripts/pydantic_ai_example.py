"""pydantic-ai's minimal agent with a tool and a structured output (``output_type`` a pydantic model, returned
through pydantic-ai's output tool), on OpenAIChatModel / OpenAIProvider(base_url) pointed at a Kestrel server:
``python pydantic_ai_example.py BASE_URL MODEL``. Prints one JSON line: what each run did. With a structured
output and no text allowed, pydantic-ai sends tool_choice "required" on every turn: each turn is a call of the tool
or of the output tool (a 135M model may call the tool again and again: the "tool_once" run offers it until it has
been called, with pydantic-ai's ``prepare``, so the next turn is the output tool). ``NativeOutput`` asks for the
output as response_format json_schema with the tool under "auto" instead. Runs in the frameworks tier's scratch venv (tests/frameworks/venv.py)."""

import json
import sys

from pydantic import BaseModel

from pydantic_ai import Agent, NativeOutput, RunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

BASE_URL, MODEL = sys.argv[1], sys.argv[2]
RESULT = "Sunny, 23 degrees"
MAX_TOKENS = 96  # a 135M model may ramble to the end of its context: answers kept short, the loop still whole
SEED = 47  # greedy (temperature 0) and seeded: each run the same on every run of the tier
calls = []


class Weather(BaseModel):
    city: str
    forecast: str


model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=BASE_URL, api_key="unused"))


async def until_called(ctx: RunContext, tool_def: ToolDefinition) -> ToolDefinition | None:
    return None if calls else tool_def


def make(output_type, once: bool = False) -> Agent:
    agent = Agent(model, output_type=output_type, instructions="Use get_weather, then answer.",
                  model_settings={"max_tokens": MAX_TOKENS, "temperature": 0, "seed": SEED})

    @agent.tool_plain(prepare=until_called if once else None)
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append({"city": city})
        return f"{RESULT} in {city}."

    return agent


def run(name: str, output_type, once: bool = False) -> dict:
    calls.clear()
    try:
        result = make(output_type, once).run_sync("What is the weather in Paris?", usage_limits=UsageLimits(request_limit=6))
        out = result.output.model_dump() if isinstance(result.output, BaseModel) else str(result.output)
        return {"run": name, "ok": True, "calls": list(calls), "final": out,
                "requests": result.usage.requests}
    except Exception as e:  # recorded: a 135M model may loop on the tool
        return {"run": name, "ok": False, "calls": list(calls), "error": f"{type(e).__name__}: {e}"[:500]}


print(json.dumps({"result": RESULT, "runs": [run("structured_output", Weather),
                                            run("structured_output_tool_once", Weather, once=True),
                                            run("native_output", NativeOutput(Weather)),
                                            run("text_output", str)]}))
