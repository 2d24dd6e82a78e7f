"""The chat's model picker (on the stand-in engine core): it lists the library's runnable models with the loaded
one selected; choosing another requests a load of that model through AppContext.load_model (the Load panel's
path, with the model's saved engine settings) and the chat stays open; it is disabled while a reply streams."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.library import EMBEDDED_KEY
from tests.app.helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, set_sampling


@pytest.fixture
def window_with_two_models(make_window, qtbot, tiny_model_dir):
    w = make_window()  # the embedded model, on the fake core
    tiny = tiny_model_dir("smollm2")
    w.ctx.library.add_file(str(tiny))  # a second runnable model in the library
    picker = w.chat.model_picker
    qtbot.waitUntil(lambda: picker.findData(str(tiny)) >= 0, timeout=30_000)
    return w, tiny


def _pick(qtbot, picker, key: str) -> None:
    """As a user does: open the list and choose the item."""
    i = picker.findData(key)
    assert i >= 0, key
    picker.showPopup()
    view = picker.view()
    index = view.model().index(i, 0)
    qtbot.waitUntil(view.isVisible, timeout=5_000)
    rect = view.visualRect(index)
    qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5_000)


def test_picker_lists_runnable_models_with_the_loaded_one_selected(window_with_two_models):
    w, tiny = window_with_two_models
    picker = w.chat.model_picker
    keys = [picker.itemData(i) for i in range(picker.count())]
    runnable = [e.key for e in w.ctx.library.entries if e.facts.supported]
    assert keys == runnable and EMBEDDED_KEY in keys and str(tiny) in keys
    assert picker.currentData() == EMBEDDED_KEY == w.ctx.model_key
    assert picker.isEnabled()


def test_choosing_a_model_loads_it_without_leaving_the_chat(window_with_two_models, qtbot, monkeypatch):
    w, tiny = window_with_two_models
    chat, picker = w.chat, w.chat.model_picker
    w.ctx.store.update_model_settings(str(tiny), engine={"max_model_len": 256, "kv_cache_memory_gib": None})
    requests: list[tuple[str, object]] = []
    load = w.ctx.load_model
    monkeypatch.setattr(w.ctx, "load_model", lambda key, config: (requests.append((key, config)), load(key, config)))
    w.show_panel("chat")
    assert chat.send("hello")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    conv = chat.conversation.id

    _pick(qtbot, picker, str(tiny))
    assert len(requests) == 1
    key, config = requests[0]
    assert key == str(tiny) and config.model == str(tiny)
    assert config.max_model_len == 256  # the model's saved Load settings
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready" and w.ctx.engine.config.model == str(tiny),
                    timeout=LOAD_TIMEOUT_MS)
    assert w.ctx.model_key == str(tiny) and picker.currentData() == str(tiny)
    assert w.stack.currentWidget() is chat and chat.conversation.id == conv  # still in the same chat
    assert w.panels["load"].current_key() == str(tiny)  # the Load panel follows
    assert w.ctx.store.pref("last_model")["model"] == str(tiny)  # and it is the model the next start loads

    _pick(qtbot, picker, str(tiny))  # the loaded one again: nothing to do
    assert len(requests) == 1
    _pick(qtbot, picker, EMBEDDED_KEY)  # and back
    assert requests[-1][0] == EMBEDDED_KEY and requests[-1][1].model is None
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready" and w.ctx.engine.config.model is None,
                    timeout=LOAD_TIMEOUT_MS)
    assert picker.currentData() == EMBEDDED_KEY
    set_sampling(w, max_tokens=3)
    assert chat.send("still here")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    assert [m.role for m in w.ctx.store.messages(conv)] == ["user", "assistant"] * 2


def test_picker_is_disabled_while_a_reply_streams(window_with_two_models, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")  # 50 ms per token
    w, tiny = window_with_two_models
    chat, picker = w.chat, w.chat.model_picker
    set_sampling(w, max_tokens=400)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready", timeout=LOAD_TIMEOUT_MS)
    assert chat.send("a long one")
    qtbot.waitUntil(lambda: chat.pending is not None and len(chat.pending.text) >= 2, timeout=REPLY_TIMEOUT_MS)
    assert not picker.isEnabled()
    requests = []
    monkeypatch.setattr(w.ctx, "load_model", lambda key, config: requests.append(key))
    picker.pick(picker.findData(str(tiny)))  # even if it were reached: no load mid-reply
    assert requests == [] and picker.currentData() == EMBEDDED_KEY
    qtbot.mouseClick(chat.stop_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    assert picker.isEnabled()


def test_picker_follows_loads_from_the_load_panel_and_unload(window_with_two_models, qtbot):
    w, tiny = window_with_two_models
    picker, load = w.chat.model_picker, w.panels["load"]
    load.select_key(str(tiny))
    load.load_selected()
    assert picker.currentData() == str(tiny)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "loading", timeout=30_000)
    assert not picker.isEnabled()  # no second load while one runs
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready", timeout=LOAD_TIMEOUT_MS)
    qtbot.waitUntil(picker.isEnabled, timeout=30_000)  # (the queued stateChanged, as below)
    assert picker.isEnabled() and picker.currentData() == str(tiny)
    load.unload()
    qtbot.waitUntil(lambda: w.ctx.engine.state == "empty", timeout=30_000)
    # the worker's state is set on its thread; the picker follows the queued stateChanged on the GUI thread (CI,
    # two xdist workers: asserted at once, the signal was still queued)
    qtbot.waitUntil(lambda: picker.currentIndex() == -1, timeout=30_000)
    assert picker.currentIndex() == -1 and picker.placeholderText().startswith("No model loaded")
    assert "choose one above" in w.chat.notice.text()
