"""LangChain's minimal agent (``create_agent`` with a tool, langchain >= 1.0, langchain-openai's ChatOpenAI) pointed
at a Kestrel server: ``python langchain_example.py BASE_URL MODEL``. Prints one JSON line: what each run did.
The forced run makes the first model call's tool_choice "any" (OpenAI's "required") with a middleware, as
LangChain's docs override a model request, and the tool returns directly (``return_direct``), so its result is the
agent's final answer; the tool-calling example of LangChain's docs (``bind_tools(tool_choice=...)``, the tool run
on the call, the result sent back) runs too. Runs in the frameworks tier's scratch venv (tests/frameworks/venv.py)."""

import json
import sys

from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

BASE_URL, MODEL = sys.argv[1], sys.argv[2]
RESULT = "Sunny, 23 degrees"
SEED = 47  # greedy (temperature 0) and seeded: each run the same on every run of the tier
calls = []  # get_weather's calls, kept when a run ends in an error (the recursion limit under "auto")
MAX_TOKENS = 160  # a 135M model may ramble to the end of its context: answers kept short, the loop still whole


def get_weather(city: str) -> str:
    """Get weather for a given city."""
    calls.append({"name": "get_weather", "args": {"city": city}})
    return f"{RESULT} in {city}."


@tool(return_direct=True)
def weather_report(city: str) -> str:
    """Get the weather report for a given city."""
    return f"{RESULT} in {city}."


@wrap_model_call
def first_call_uses_a_tool(request, handler):
    if not any(isinstance(m, ToolMessage) for m in request.messages):
        request = request.override(tool_choice="any")
    return handler(request)


def describe(messages) -> dict:
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    results = [m.content for m in messages if isinstance(m, ToolMessage)]
    return {"calls": [{"name": c["name"], "args": c["args"]} for c in calls], "tool_results": results,
            "final": str(messages[-1].content), "final_type": type(messages[-1]).__name__, "messages": len(messages),
            "finish_reasons": [m.response_metadata.get("finish_reason") for m in messages if isinstance(m, AIMessage)]}


def run(name: str, fn) -> dict:
    calls.clear()
    try:
        return {"run": name, "ok": True, **fn()}
    except Exception as e:  # recorded: a 135M model may not finish under "auto"
        return {"run": name, "ok": False, "calls": list(calls), "error": f"{type(e).__name__}: {e}"[:500]}


def model() -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=BASE_URL, api_key="unused", max_retries=0, max_tokens=MAX_TOKENS,
                      temperature=0, seed=SEED)


def auto() -> dict:
    agent = create_agent(model=model(), tools=[get_weather], system_prompt="You are a helpful assistant")
    out = agent.invoke({"messages": [{"role": "user", "content": "what is the weather in sf"}]},
                       {"recursion_limit": 8})
    return describe(out["messages"])


def forced() -> dict:
    agent = create_agent(model=model(), tools=[weather_report], system_prompt="You are a helpful assistant",
                         middleware=[first_call_uses_a_tool])
    out = agent.invoke({"messages": [{"role": "user", "content": "what is the weather in sf"}]},
                       {"recursion_limit": 8})
    return describe(out["messages"])


def bind_tools_loop() -> dict:
    llm = model()
    messages = [HumanMessage("what is the weather in sf")]
    ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"]))
    messages.append(llm.bind_tools([get_weather]).invoke(messages))
    return describe(messages)


print(json.dumps({"result": RESULT, "runs": [run("auto", auto), run("forced_return_direct", forced),
                                            run("bind_tools_named_then_auto", bind_tools_loop)]}))
