"""Issue 47: agent frameworks run unchanged on Kestrel: openai-agents (an Agent with a function tool on its default
model, the Responses API), LangChain (``create_agent`` with a tool, ChatOpenAI) and pydantic-ai (an agent with a
tool and a structured output, OpenAIChatModel), each its documentation's minimal example in the scratch venv
against ``kestrel serve`` on the default model (tests/frameworks/conftest.py).

Every run's requests are answered below 400. Where the first turn's tool call is forced (tool_choice required, the
way each framework allows it) the call's arguments are valid (the framework parsed them into the tool's typed
parameters and ran it); in openai-agents (stop_on_first_tool) and LangChain (a return_direct tool) its result is the
final answer. pydantic-ai forces every turn of a structured output: its loop ends in the output tool's validated
arguments once the tool is no longer offered; whether the model copies the tool's result into them is recorded, not
judged. A 135M model may answer poorly under "auto" (or call the tool again and again): such a run passes with any
protocol-valid end (an answer, or calls with typed arguments up to the framework's turn / request limit) and is
recorded (printed with -s). Every run is greedy and seeded (temperature 0 and a seed through each framework's model
settings), so the tier does the same on every run on one machine."""

from __future__ import annotations

import pytest

from tests.frameworks.conftest import no_errors

# slow: the tier's time on this machine, ~270 s for the three runs and the server, plus ~55 s for the venv's one
# pip install when CI=true builds it
pytestmark = [pytest.mark.slow(seconds=330), pytest.mark.timeout(3600)]


def _runs(report: dict) -> dict[str, dict]:
    return {r["run"]: r for r in report["runs"]}


def _unforced(run: dict, limit_error: str, cities: list, cut_errors: tuple[str, ...] = ()) -> None:
    """A run under "auto" ends in any protocol-valid way: an answer (after calls or none), calls up to the
    framework's turn / request limit (``limit_error``, the exception's name), or an output the framework could not
    use because max_tokens cut it (``cut_errors``: raised only on a response whose finish_reason is "length");
    every call the framework ran has typed arguments (a call it could not parse would end the run in another
    error)."""
    assert all(isinstance(city, str) for city in cities), run
    assert (run["ok"] or (cities and run["error"].startswith(limit_error))
            or run["error"].startswith(cut_errors)), run


def test_openai_agents_on_the_responses_api(framework_python, kestrel_serve):
    report, requests, log = kestrel_serve.run("openai_agents_example.py")
    no_errors(requests, log)
    assert {path for _, path, _ in requests} == {"/v1/responses"}  # the default model: Responses, not chat
    runs, result = _runs(report), report["result"]
    _unforced(runs["auto"], "MaxTurnsExceeded", [c["city"] for c in runs["auto"]["calls"]])
    for name in ("required_stop_on_first_tool", "required_stop_on_first_tool_streamed"):
        run = runs[name]
        assert run["ok"] and run["calls"] and all(isinstance(c["city"], str) for c in run["calls"]), run
        assert run["final"] == f"{result} in {run['calls'][0]['city']}.", run  # the tool's result is the answer
    then_auto = runs["required_then_auto"]  # turn 1 forced, then "auto": it may call again until max_turns
    assert then_auto["calls"], then_auto
    _unforced(then_auto, "MaxTurnsExceeded", [c["city"] for c in then_auto["calls"]])


def test_langchain_create_agent(framework_python, kestrel_serve):
    report, requests, log = kestrel_serve.run("langchain_example.py")
    no_errors(requests, log)
    assert {path for _, path, _ in requests} == {"/v1/chat/completions"}
    runs, result = _runs(report), report["result"]
    auto = runs["auto"]  # the answer (an AIMessage), or get_weather called until the graph's recursion limit
    _unforced(auto, "GraphRecursionError", [c["args"]["city"] for c in auto["calls"]])
    assert not auto["ok"] or auto["final_type"] == "AIMessage", auto
    forced = runs["forced_return_direct"]
    assert forced["ok"] and forced["calls"][0]["name"] == "weather_report", forced
    city = forced["calls"][0]["args"]["city"]
    assert isinstance(city, str) and forced["final"] == f"{result} in {city}.", forced
    bound = runs["bind_tools_named_then_auto"]
    assert bound["ok"] and bound["calls"][0]["name"] == "get_weather", bound
    assert bound["tool_results"][0] == f"{result} in {bound['calls'][0]['args']['city']}."
    assert bound["final_type"] == "AIMessage"  # the result went back to the model and it answered (200)


def test_pydantic_ai_tool_and_structured_output(framework_python, kestrel_serve):
    report, requests, log = kestrel_serve.run("pydantic_ai_example.py")
    no_errors(requests, log)
    assert {path for _, path, _ in requests} == {"/v1/chat/completions"}
    runs = _runs(report)
    looping = runs["structured_output"]  # every turn forced: the tiny model may call get_weather until the limit
    assert looping["ok"] or (looping["calls"] and looping["error"].startswith("UsageLimitExceeded")), looping
    once = runs["structured_output_tool_once"]
    # turn 1 is forced between the tool and the output tool (sampled: the output tool may come first, or parallel
    # calls of the tool), turn 2 has only the output tool left: the loop always ends in the structured output
    assert once["ok"] and once["requests"] <= 2 and all(isinstance(c["city"], str) for c in once["calls"]), once
    assert set(once["final"]) == {"city", "forecast"}, once  # the output tool's arguments, validated by pydantic
    native = runs["native_output"]  # response_format json_schema with the tool under "auto": the schema's JSON
    cut = ("OutputTokenLimitExceeded", "IncompleteToolCall")  # pydantic-ai's errors for finish_reason "length"
    _unforced(native, "UsageLimitExceeded", [c["city"] for c in native["calls"]], cut)  # or calls until the limit
    assert not native["ok"] or set(native["final"]) == {"city", "forecast"}, native
    text = runs["text_output"]  # a text answer, or calls until the limit
    _unforced(text, "UsageLimitExceeded", [c["city"] for c in text["calls"]], cut)
