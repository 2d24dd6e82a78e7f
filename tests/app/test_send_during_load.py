"""Issue 45 (first-day polish): a message sent just after clicking Load went to the model being replaced (the
Send button stayed enabled until the loop's "loading" state reached the GUI) and its reply was saved as
interrupted with "No model is loaded". From the click on Load on, the chat sends nothing (Send off, the notice
says the model is loading, the typed text stays) until the new model is ready. On the stand-in engine core."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, set_sampling


def test_send_is_off_from_the_click_on_load_until_the_model_is_ready(make_window, qtbot):
    w = make_window()  # the embedded model on the fake core, ready
    chat, load, engine = w.chat, w.panels["load"], w.ctx.engine
    set_sampling(w, max_tokens=4, temperature=0.0)
    assert chat.send_button.isEnabled()
    conv_count = len(w.ctx.store.conversations())

    w.show_panel("load")
    assert load.load_button.isEnabled()
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    # no event processed since the click: the loop may not have reached LOADING, the old model is still READY
    assert not chat.send_button.isEnabled()
    assert "Loading the model" in chat.notice.text(), chat.notice.text()
    w.show_panel("chat")
    chat.composer.setPlainText("Hello right after Load")
    qtbot.mouseClick(chat.send_button, Qt.LeftButton)  # disabled: nothing happens
    assert not chat.send("Hello right after Load")  # nor through Ctrl+Enter's path
    assert chat.pending is None and chat.composer.toPlainText() == "Hello right after Load"
    assert len(w.ctx.store.conversations()) == conv_count  # nothing stored

    qtbot.waitUntil(lambda: engine.state == "ready" and not engine.load_pending, timeout=LOAD_TIMEOUT_MS)
    qtbot.waitUntil(chat.send_button.isEnabled, timeout=10_000)
    assert chat.notice.text() == ""
    qtbot.mouseClick(chat.send_button, Qt.LeftButton)
    assert chat.pending is not None
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    msgs = w.ctx.store.messages(chat.conversation.id)
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[0].content == "Hello right after Load"
    assert msgs[-1].finish_reason in ("length", "stop") and not msgs[-1].error, msgs[-1]


def test_a_load_that_ends_before_loading_gives_send_back(make_window, qtbot):
    """A load refused on the loop before it starts (here: cancelled at once) does not leave Send off."""
    w = make_window()
    chat, engine = w.chat, w.ctx.engine
    w.ctx.load_model(w.ctx.model_key, engine.config)
    engine.cancel_load()
    assert not chat.send_button.isEnabled()
    qtbot.waitUntil(lambda: not engine.load_pending, timeout=LOAD_TIMEOUT_MS)
    # cancelled (nothing loaded) or loaded anew: either way the chat's controls follow the state, not the click
    qtbot.waitUntil(lambda: engine.state in ("ready", "empty"), timeout=LOAD_TIMEOUT_MS)
    qtbot.waitUntil(lambda: chat.send_button.isEnabled() == (engine.state == "ready"), timeout=10_000)
