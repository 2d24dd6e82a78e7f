"""Issue 45 row 4, the engine's part: a model file that passes the app's checks (its GGUF header is whole) but fails
inside the engine (its tensor data cut short, as an interrupted download leaves it) does not leave the app with
nothing loaded. The engine worker loads the model before it again, with its settings, says so in plain words
("<new> could not be loaded: <why>. <old> is loaded again."), and the chat and the endpoint go on with it. On the
real engine and the embedded SmolLM2 GGUF; one test on the stand-in core for a second failure."""

from __future__ import annotations

import httpx
from PySide6.QtCore import Qt

from app.library import EMBEDDED_KEY
from tests.app.helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, click_when_enabled, set_sampling


def _cut_short(src, dst) -> None:
    """A copy of ``src`` without the second half of its tensor data: the header (metadata, tensor table) whole."""
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])


def test_a_model_that_fails_in_the_engine_brings_the_one_before_back(smollm2_gguf, tmp_path, make_window, qtbot):
    w = make_window(fake=False)  # the real engine on the embedded model
    load, engine, chat = w.panels["load"], w.ctx.engine, w.chat
    first_client, first_config, name = engine.client, engine.config, engine.info.name
    assert w.ctx.model_key == EMBEDDED_KEY

    server = w.panels["server"]  # the endpoint follows the model back
    server.port.setValue(0)
    click_when_enabled(qtbot, server.start_button)
    qtbot.waitUntil(lambda: server.url is not None, timeout=30_000)
    base = server.url_field.text()
    # (the default load, --quantization auto, says what it resolved to: the file's blocks kept on the CPU)
    assert first_config.quantization == "auto" and engine.info.quantization_mode == "gguf"
    quant = httpx.get(base + "/server_info", timeout=30).json()["engine_config"]["quantization"]
    assert quant == "auto (Q4_1 blocks kept)", quant
    assert "Q4_1 blocks kept, " in w.engine_label.text() and "Q4_1 blocks kept, " in load.message.text()

    broken = tmp_path / "cut-short.gguf"
    _cut_short(smollm2_gguf, broken)
    load.select_path(broken)
    assert load.load_button.isEnabled() and load.load_problem() == ""  # the app's checks cannot see it
    reverted: list[str] = []
    failed: list[str] = []
    engine.loadReverted.connect(reverted.append)
    engine.loadFailed.connect(failed.append)
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: engine.state == "loading", timeout=30_000)
    qtbot.waitUntil(lambda: engine.state in ("ready", "failed", "empty") and engine.client is not first_client,
                    timeout=2 * LOAD_TIMEOUT_MS)
    qtbot.waitUntil(lambda: "is loaded again" in load.message.text(), timeout=30_000)

    assert engine.state == "ready" and not failed, failed
    assert engine.config == first_config and engine.info.name == name
    text = load.message.text()
    head = text.splitlines()[0]
    assert head.startswith("cut-short.gguf could not be loaded: the file is truncated: tensor "), head
    assert head.endswith(f". {name} is loaded again."), head
    assert str(tmp_path) not in text  # the file by its name, not its whole path
    assert reverted == [head]
    assert load.message.objectName() == "warningBox" and text.splitlines()[1].startswith(f"Loaded {name}: ")
    # the model before is the app's model again: its settings key, and the next start's autoload
    assert w.ctx.model_key == EMBEDDED_KEY
    assert w.ctx.store.pref("last_model")["key"] == EMBEDDED_KEY
    assert w.engine_label.text().startswith(f"● {name}") and not w.reload_button.isVisible()

    # the chat gets a reply from it
    set_sampling(w, max_tokens=4, temperature=0.0)
    assert chat.send("Say hi")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    last = w.ctx.store.messages(chat.conversation.id)[-1]
    assert last.role == "assistant" and last.content.strip() and last.finish_reason in ("length", "stop"), last

    # and so does the endpoint, at the same address
    qtbot.waitUntil(lambda: server.url is not None, timeout=30_000)
    assert server.url_field.text() == base
    r = httpx.post(base + "/chat/completions", timeout=120,
                   json={"model": name, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


def test_when_the_model_before_fails_too_both_are_named(make_window, qtbot, monkeypatch):
    """The stand-in core refuses every load once KESTREL_FAKE=load_error is set: the new model and the model loaded
    again both fail, and the message says so (nothing is loaded then)."""
    import dataclasses

    w = make_window()
    load, engine = w.panels["load"], w.ctx.engine
    name = engine.info.name
    monkeypatch.setenv("KESTREL_FAKE", "load_error")  # read by each engine process as it loads
    w.ctx.load_model("/models/other.gguf", dataclasses.replace(engine.config, model="/models/other.gguf"))
    qtbot.waitUntil(lambda: engine.state == "failed", timeout=2 * LOAD_TIMEOUT_MS)
    qtbot.waitUntil(lambda: load.message.objectName() == "errorBox", timeout=30_000)
    text = load.message.text()
    why = "broken.gguf: truncated: 12 bytes of 4096 present"  # another file than the model's: named
    assert text == (f"The model could not be loaded.\nother.gguf could not be loaded: {why}. {name} could not be "
                    f"loaded again either: {why}"), text
    assert engine.client is None and "is loaded again" not in text
