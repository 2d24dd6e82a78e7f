"""openai-agents' minimal example (an Agent with a function tool, run by Runner) on its default model, the Responses
API (OpenAIResponsesModel), pointed at a Kestrel server: ``python openai_agents_example.py BASE_URL MODEL``.
Prints one JSON line: what each run did. Temperature 0 and a seed (``seed`` is no parameter of
``responses.create``: sent through ModelSettings.extra_body). No max_tokens: openai-agents takes a response cut by max_output_tokens
(status incomplete, as OpenAI sends it) for a ModelBehaviorError. Runs in the frameworks tier's scratch venv
(tests/frameworks/venv.py)."""

import asyncio
import json
import sys

from openai import AsyncOpenAI

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

BASE_URL, MODEL = sys.argv[1], sys.argv[2]
RESULT = "Sunny, 23 degrees"
SEED = 47  # greedy (temperature 0) and seeded: each run the same on every run of the tier
calls = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    calls.append({"city": city})
    return f"{RESULT} in {city}."


def agent(tool_choice: str | None = None, **kw) -> Agent:
    client = AsyncOpenAI(base_url=BASE_URL, api_key="unused")
    return Agent(name="Assistant", instructions="You are a helpful assistant. Use the tools.",
                 model=OpenAIResponsesModel(model=MODEL, openai_client=client), tools=[get_weather],
                 model_settings=ModelSettings(tool_choice=tool_choice, temperature=0, extra_body={"seed": SEED}), **kw)


async def run(name: str, make, streamed: bool = False) -> dict:
    calls.clear()
    try:
        if streamed:
            result = Runner.run_streamed(make(), "What's the weather in Tokyo?", max_turns=4)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(make(), "What's the weather in Tokyo?", max_turns=4)
        return {"run": name, "ok": True, "calls": list(calls), "final": str(result.final_output),
                "turns": len(result.raw_responses)}
    except Exception as e:  # recorded: a 135M model may not finish under "auto"
        return {"run": name, "ok": False, "calls": list(calls), "error": f"{type(e).__name__}: {e}"[:500]}


async def main() -> None:
    set_tracing_disabled(True)
    forced = dict(tool_choice="required", tool_use_behavior="stop_on_first_tool")
    out = [await run("auto", agent),
           await run("required_stop_on_first_tool", lambda: agent(**forced)),
           await run("required_stop_on_first_tool_streamed", lambda: agent(**forced), streamed=True),
           await run("required_then_auto", lambda: agent(tool_choice="required", reset_tool_choice=True))]
    print(json.dumps({"result": RESULT, "runs": out}))


asyncio.run(main())
