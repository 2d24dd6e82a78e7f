"""The Load panel says which tool calling applies to the loaded model (issue 47): the chat template's own tool
support, or Kestrel's built-in tool prompt where the template takes no tools (SmolLM2's), and the parser that reads
the calls; the same source as GET /v1/server_info's ``tools`` (engine.server.openai.tools ``tool_mode``)."""

from __future__ import annotations

from app.panels.load import tool_mode_text
from engine.server.openai.tools import tool_mode
from tests.support.chat_templates import LLAMA31_TOOLS_TEMPLATE, QWEN3_TEMPLATE


def test_label_after_a_load_and_gone_after_unload(make_window, qtbot, tmp_path):
    w = make_window(fake=True)
    load = w.panels["load"]
    mode = w.ctx.engine.tool_mode
    assert mode is not None and mode["auto"] == "builtin_prompt" and mode["parser"] == "hermes"
    qtbot.waitUntil(lambda: not load.tool_mode.isHidden(), timeout=10_000)
    text = load.tool_mode.text()
    assert text == ("Tool calling (loaded model): its chat template takes no tools, so Kestrel's built-in tool prompt "
                    "describes them and asks for <tool_call> blocks, read by the hermes parser; a grammar keeps each "
                    "call's arguments valid. kestrel serve chooses with --chat-template and --tool-call-parser."), text
    shot = tmp_path / "load_tool_mode.png"
    assert load.grab().save(str(shot)) and shot.stat().st_size > 0
    load.unload()
    qtbot.waitUntil(lambda: load.tool_mode.isHidden(), timeout=30_000)


def test_text_for_a_template_with_tools():
    text = tool_mode_text(tool_mode(QWEN3_TEMPLATE, "Qwen3ForCausalLM"))
    assert text.startswith("Tool calling (loaded model): its chat template's own tool support, calls read by the "
                           "hermes parser; a grammar keeps"), text
    llama = tool_mode_text(tool_mode(LLAMA31_TOOLS_TEMPLATE, "LlamaForCausalLM"))
    assert "own tool support, calls read by the llama3_json parser. kestrel" in llama and "grammar" not in llama
    forced = tool_mode_text(tool_mode(QWEN3_TEMPLATE, "Qwen3ForCausalLM", "llama3_json"))  # --tool-call-parser
    assert "llama3_json parser" in forced, forced
    assert tool_mode_text(None) == ""
