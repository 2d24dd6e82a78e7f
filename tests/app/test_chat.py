"""The Chat panel on a stand-in engine (no model): streaming into the view and the database, stop,
regenerate, edit-and-resend, conversations (new, rename, search, delete), system prompts, Enter/Shift+Enter,
and an engine that dies mid-reply."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.panels import chat as chat_panel
from tests.app.helpers import REPLY_TIMEOUT_MS, set_sampling, spy_requests


def _reply(qtbot, window, text: str) -> None:
    chat = window.chat
    assert chat.send(text)
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)


def test_reply_streams_into_view_and_database(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")  # 50 ms per token: we can watch it stream
    w = make_window()
    chat = w.chat
    set_sampling(w, max_tokens=12)
    seen: list[str] = []
    w.ctx.engine.delta.connect(lambda _rid, text: seen.append(text))
    assert chat.send("hello")
    qtbot.waitUntil(lambda: chat.pending is not None and len(chat.pending.text) >= 3, timeout=REPLY_TIMEOUT_MS)
    assert chat.stop_button.isVisible() and not chat.send_button.isVisible()
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    assert len(seen) > 1  # several deltas, not one block
    reply = chat.message_widgets()[-1]
    assert reply.role == "assistant" and reply.text == "abcdefghijkl"
    assert "abcdefghijkl" in reply.body.text()
    assert "12 tokens" in reply.stats_label.text() and "tok/s" in reply.stats_label.text()
    assert "TTFT" in reply.stats_label.text()
    msgs = w.ctx.store.messages(chat.conversation.id)
    assert [(m.role, m.content) for m in msgs] == [("user", "hello"), ("assistant", "abcdefghijkl")]
    assert msgs[1].num_tokens == 12 and msgs[1].finish_reason == "length" and msgs[1].ttft > 0
    assert w.ctx.store.conversation(chat.conversation.id).title == "hello"


def test_stop_regenerate_and_edit(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")
    w = make_window()
    chat = w.chat
    set_sampling(w, max_tokens=400)
    assert chat.send("first")
    qtbot.waitUntil(lambda: chat.pending is not None and len(chat.pending.text) >= 2, timeout=REPLY_TIMEOUT_MS)
    qtbot.mouseClick(chat.stop_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    conv = chat.conversation.id
    stopped = w.ctx.store.messages(conv)[-1]
    assert stopped.finish_reason == "abort" and 2 <= stopped.num_tokens < 400
    assert "stopped" in chat.message_widgets()[-1].stats_label.text()
    assert chat.send_button.isVisible()

    set_sampling(w, max_tokens=5)
    qtbot.mouseClick(chat.regenerate_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and len(w.ctx.store.messages(conv)) == 2, timeout=REPLY_TIMEOUT_MS)
    msgs = w.ctx.store.messages(conv)
    # the new reply is a second version of the same message: the stopped one is kept
    assert msgs[-1].id == stopped.id and msgs[-1].content == "abcde" and msgs[-1].finish_reason == "length"
    assert (msgs[-1].version, msgs[-1].version_count) == (1, 2)
    assert msgs[-1].versions[0]["content"] == stopped.content and msgs[-1].versions[0]["finish_reason"] == "abort"
    assert [m.role for m in chat.message_widgets()] == ["user", "assistant"]
    reply = chat.message_widgets()[-1]
    assert reply.versions.isVisible() and reply.version_label.text() == "2/2"
    assert reply.prev_version.isEnabled() and not reply.next_version.isEnabled()

    _reply(qtbot, w, "second")
    assert len(w.ctx.store.messages(conv)) == 4
    first_user = chat.message_widgets()[0]
    qtbot.mouseClick(first_user.edit_button, Qt.LeftButton)
    assert chat.composer.toPlainText() == "first" and chat.editing_banner.isVisible()
    chat.composer.setPlainText("edited")
    qtbot.keyClick(chat.composer, Qt.Key_Return)
    qtbot.waitUntil(lambda: chat.pending is None and len(w.ctx.store.messages(conv)) == 2, timeout=REPLY_TIMEOUT_MS)
    msgs = w.ctx.store.messages(conv)
    assert [(m.role, m.content) for m in msgs] == [("user", "edited"), ("assistant", "abcde")]
    assert [x.text for x in chat.message_widgets()] == ["edited", "abcde"]
    assert not chat.editing_banner.isVisible()


def test_enter_sends_and_shift_enter_breaks_line(make_window, qtbot):
    w = make_window()
    chat = w.chat
    set_sampling(w, max_tokens=3)
    qtbot.keyClicks(chat.composer, "line one")
    qtbot.keyClick(chat.composer, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(chat.composer, "line two")
    assert chat.composer.toPlainText() == "line one\nline two"
    assert chat.pending is None
    qtbot.keyClick(chat.composer, Qt.Key_Return)
    qtbot.waitUntil(lambda: chat.pending is None and len(chat.message_widgets()) == 2, timeout=REPLY_TIMEOUT_MS)
    assert chat.composer.toPlainText() == ""
    assert w.ctx.store.messages(chat.conversation.id)[0].content == "line one\nline two"


def test_conversations_new_rename_search_delete_and_system_prompt(make_window, qtbot):
    w = make_window()
    chat, store = w.chat, w.ctx.store
    set_sampling(w, max_tokens=2)
    _reply(qtbot, w, "about apples")
    a = chat.conversation.id
    chat.system_prompt.setPlainText("Answer like a pirate.")
    qtbot.mouseClick(chat.new_button, Qt.LeftButton)
    b = chat.conversation.id
    assert b != a and chat.message_widgets() == [] and chat.system_prompt.toPlainText() == ""
    _reply(qtbot, w, "about pears")
    assert chat.conv_list.count() == 2
    chat.rename_conversation(b, "Fruit talk")
    assert store.conversation(b).title == "Fruit talk" and chat.title.text() == "Fruit talk"

    chat.search.setText("apples")  # matches a message, not a title
    assert [chat.conv_list.item(i).data(Qt.UserRole) for i in range(chat.conv_list.count())] == [a]
    chat.search.setText("fruit")
    assert [chat.conv_list.item(i).data(Qt.UserRole) for i in range(chat.conv_list.count())] == [b]
    chat.search.clear()

    chat.open_conversation(a)
    assert chat.system_prompt.toPlainText() == "Answer like a pirate."
    assert [x.text for x in chat.message_widgets()] == ["about apples", "ab"]
    # the system prompt goes to the engine first
    sent = spy_requests(w.ctx.engine)
    _reply(qtbot, w, "more")
    assert sent[0][0] == {"role": "system", "content": "Answer like a pirate."}
    assert [m["role"] for m in sent[0]] == ["system", "user", "assistant", "user"]

    chat.delete_conversation(a, confirm=False)
    assert store.conversation(a) is None and store.messages(a) == []
    assert chat.conversation.id == b and chat.conv_list.count() == 1


def test_conversations_survive_a_restart(make_window, qtbot):
    w = make_window()
    set_sampling(w, max_tokens=4)
    _reply(qtbot, w, "remember me")
    conv = w.chat.conversation.id
    w.shutdown()
    w2 = make_window()
    assert w2.chat.conversation.id == conv
    assert [x.text for x in w2.chat.message_widgets()] == ["remember me", "abcd"]
    assert "4 tokens" in w2.chat.message_widgets()[-1].stats_label.text()


def _streaming(qtbot, chat, at_least: int) -> None:
    qtbot.waitUntil(lambda: chat.pending is not None and len(chat.pending.text) >= at_least, timeout=REPLY_TIMEOUT_MS)


def test_a_reply_is_saved_as_it_streams_and_kept_when_the_window_closes(make_window, qtbot, monkeypatch):
    """Issue 45 row 5: the partial reply of a window closed mid-reply is there on reopen, marked interrupted
    with the reason; the next message makes no second user turn in a row."""
    monkeypatch.setenv("KESTREL_FAKE", "slow")  # 50 ms per token
    w = make_window()
    chat, store = w.chat, w.ctx.store
    set_sampling(w, max_tokens=400)
    assert chat.send("tell me everything")
    qtbot.waitUntil(lambda: chat.conversation is not None, timeout=REPLY_TIMEOUT_MS)  # made once the turn fits
    conv = chat.conversation.id
    _streaming(qtbot, chat, 3)
    # saved while it streams (what a killed app leaves): the row is there, interrupted until it finishes
    qtbot.waitUntil(lambda: len(store.messages(conv)[-1].content) >= 3 and chat.pending is not None,
                    timeout=REPLY_TIMEOUT_MS)
    saved = store.messages(conv)
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[-1].finish_reason == "interrupted" and saved[-1].error == chat_panel.STREAMING_REASON
    w.close()
    w2 = make_window()
    msgs = w2.ctx.store.messages(conv)
    assert [m.role for m in msgs] == ["user", "assistant"]
    partial = msgs[-1]
    assert partial.finish_reason == "interrupted" and partial.error == chat_panel.CLOSED_REASON
    assert len(partial.content) >= 3 and "abcdefghijklmnopqrstuvwxyz".startswith(partial.content[:26])
    chat2 = w2.chat
    assert chat2.conversation.id == conv
    reply = chat2.message_widgets()[-1]
    assert reply.text == partial.content and reply.error_label.isVisible()
    assert reply.error_label.text().startswith("Interrupted: The app was closed")
    assert "interrupted" in reply.stats_label.text()
    # the conversation goes on: the request alternates user / assistant
    sent = spy_requests(w2.ctx.engine)
    set_sampling(w2, max_tokens=3)
    monkeypatch.setenv("KESTREL_FAKE", "")
    assert chat2.send("go on")
    qtbot.waitUntil(lambda: chat2.pending is None, timeout=REPLY_TIMEOUT_MS)
    assert [m["role"] for m in sent[0]] == ["user", "assistant", "user"]
    roles = [m.role for m in w2.ctx.store.messages(conv)]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_engine_crash_mid_reply_keeps_the_partial_reply_and_shows_one_restart_state(make_window, qtbot,
                                                                                     monkeypatch):
    """Issue 45 rows 5 and 13: the engine killed mid-reply. The partial reply stays (interrupted, with the
    reason, no "retry shortly"); the notice says "Restarting engine… (attempt 1 of 3)", never "No model is
    loaded"; once the engine is back, Regenerate adds a version and the interrupted one is kept."""
    import os
    import signal

    monkeypatch.setenv("KESTREL_FAKE", "slow")
    w = make_window()
    chat, store, engine = w.chat, w.ctx.store, w.ctx.engine
    set_sampling(w, max_tokens=400)
    assert chat.send("a long answer please")
    qtbot.waitUntil(lambda: chat.conversation is not None, timeout=REPLY_TIMEOUT_MS)  # made once the turn fits
    conv = chat.conversation.id
    _streaming(qtbot, chat, 4)
    os.kill(engine.info.engine_pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    qtbot.waitUntil(lambda: "Restarting engine" in chat.notice.text(), timeout=30_000)
    assert "attempt 1 of 3" in chat.notice.text()
    assert "No model" not in chat.notice.text()
    reply = chat.message_widgets()[-1]
    saved = store.messages(conv)[-1]
    assert saved.role == "assistant" and len(saved.content) >= 4 and reply.text == saved.content
    assert saved.finish_reason == "interrupted" and "SIGKILL" in saved.error
    assert "retry shortly" not in reply.error_label.text() and reply.error_label.text().startswith("Interrupted:")
    qtbot.waitUntil(lambda: engine.state == "ready", timeout=60_000)
    qtbot.waitUntil(lambda: "runs again" in chat.notice.text(), timeout=10_000)
    assert "Regenerate" in chat.notice.text()
    set_sampling(w, max_tokens=3)
    qtbot.mouseClick(chat.regenerate_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and chat.message_widgets()[-1].text == "abc", timeout=REPLY_TIMEOUT_MS)
    m = store.messages(conv)[-1]
    assert m.version_count == 2 and m.versions[0]["content"] == saved.content and m.error is None
    assert not chat.message_widgets()[-1].error_label.isVisible()
    qtbot.mouseClick(chat.message_widgets()[-1].prev_version, Qt.LeftButton)  # back to the interrupted one
    assert chat.message_widgets()[-1].text == saved.content and chat.message_widgets()[-1].error_label.isVisible()
    assert store.messages(conv)[-1].version == 0


def test_engine_that_gives_up_says_why_and_reload_works(make_window, qtbot, monkeypatch):
    """No restarts allowed: the reply fails in place, the notice gives the reason (not "No model is loaded"),
    Reload brings the model back and Regenerate answers."""
    from engine.frontend.supervisor import RestartPolicy

    w = make_window()
    chat, engine = w.chat, w.ctx.engine
    monkeypatch.setenv("KESTREL_FAKE", "crash_step")
    engine.restart_policy = RestartPolicy(max_restarts=0)
    w._reload()  # the same model again, under this policy
    qtbot.waitUntil(lambda: engine.state == "loading", timeout=30_000)
    qtbot.waitUntil(lambda: engine.state == "ready", timeout=60_000)
    assert chat.send("boom")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    reply = chat.message_widgets()[-1]
    assert reply.error_label.isVisible() and "simulated kernel failure" in reply.error_label.text()
    qtbot.waitUntil(lambda: engine.state == "dead", timeout=30_000)
    qtbot.waitUntil(lambda: "was not restarted" in chat.notice.text(), timeout=30_000)
    assert "simulated kernel failure" in chat.notice.text() and "Reload" in chat.notice.text()
    assert w.reload_button.isVisible()
    assert not chat.send_button.isEnabled()
    monkeypatch.setenv("KESTREL_FAKE", "")
    qtbot.mouseClick(w.reload_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: engine.state == "ready", timeout=60_000)
    set_sampling(w, max_tokens=3)
    qtbot.mouseClick(chat.regenerate_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and chat.message_widgets()[-1].text == "abc", timeout=REPLY_TIMEOUT_MS)
    # the failed reply had no text: replaced, not kept as a version
    assert w.ctx.store.messages(chat.conversation.id)[-1].version_count == 1


def test_request_messages_never_put_two_user_turns_in_a_row():
    from app.store import Message

    def m(role, content):
        return Message(0, 1, role, content, 0.0)

    msgs = [m("user", "a"), m("assistant", ""), m("user", "b"), m("assistant", "B"), m("user", "c")]
    assert chat_panel.request_messages(msgs, [{"role": "user", "content": "d"}]) == [
        {"role": "user", "content": "a\n\nb"}, {"role": "assistant", "content": "B"},
        {"role": "user", "content": "c\n\nd"}]


def _fake_prompt_len(messages: list[dict]) -> int:  # tests/server/fake_engine.py: one token per character
    return sum(len(f"<{m['role']}>{m['content']}") for m in messages) + len("<assistant>")


def test_long_chat_keeps_working_at_the_context_limit(make_window, qtbot):
    """The fake engine's context is 128 tokens: a few turns of 40-token replies outgrow it. Each turn still
    answers (the oldest turns left out, the reply clamped), the meter counts the next turn, and the overflow
    policy is kept with the conversation."""
    w = make_window()
    chat, store = w.chat, w.ctx.store
    set_sampling(w, max_tokens=40)
    sent = spy_requests(w.ctx.engine, with_params=True)
    assert chat.overflow_policy() == "drop_oldest"
    chat.system_prompt.setPlainText("Be brief.")
    for text in ("first question", "second question", "third question", "fourth question"):
        _reply(qtbot, w, text)
        reply = chat.message_widgets()[-1]
        assert not reply.error_label.isVisible(), reply.error_label.text()
        assert reply.text == "abcdefghijklmnopqrstuvwxyzabcdefghijklmn"[:len(reply.text)] and reply.text
    messages, params = sent[-1]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[-1] == {"role": "user", "content": "fourth question"}
    assert {"role": "user", "content": "first question"} not in messages
    assert _fake_prompt_len(messages) + params.max_tokens <= 128
    assert all(_fake_prompt_len(m) + p.max_tokens <= 128 for m, p in sent)
    # Regenerate works at the limit too
    qtbot.mouseClick(chat.regenerate_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and len(sent) == 5, timeout=REPLY_TIMEOUT_MS)
    assert not chat.message_widgets()[-1].error_label.isVisible()
    # the meter: the next turn (conversation + draft + max tokens) against the context
    chat.composer.setPlainText("a draft")
    chat.update_meter()
    qtbot.waitUntil(lambda: chat.meter_fit is not None and chat.meter_fit.messages[-1]["content"] == "a draft",
                    timeout=10_000)
    full = [{"role": "system", "content": "Be brief."}] + [
        {"role": m.role, "content": m.content} for m in store.messages(chat.conversation.id)] + [
        {"role": "user", "content": "a draft"}]
    assert chat.meter_fit.full_prompt_tokens == _fake_prompt_len(full) > 128
    assert chat.meter_label.text() == f"{_fake_prompt_len(full):,} + 40 / 128 tokens"
    assert chat.meter_bar.maximum() == 128 and chat.meter_bar.value() == 128
    assert chat.meter_note.isVisible() and "left out" in chat.meter_note.text()
    set_sampling(w, max_tokens=10)  # the meter follows max tokens
    qtbot.waitUntil(lambda: chat.meter_label.text().endswith("+ 10 / 128 tokens"), timeout=10_000)
    chat.composer.clear()
    # "stop and say so", kept with the conversation
    conv = chat.conversation.id
    chat.overflow.setCurrentIndex(chat.overflow.findData("stop"))
    assert store.conversation(conv).overflow_policy == "stop"
    chat.new_conversation()
    assert chat.overflow_policy() == "drop_oldest"
    chat.open_conversation(conv)
    assert chat.overflow_policy() == "stop"
    set_sampling(w, max_tokens=40)
    n, cards = len(store.messages(conv)), len(chat.message_widgets())
    chat.composer.setPlainText("one more")
    qtbot.mouseClick(chat.send_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and "Not sent" in chat.notice.text(), timeout=REPLY_TIMEOUT_MS)
    # issue 45 row 15: nothing added (no message, no empty error bubble); told in place; the draft kept
    assert "no room is left" in chat.notice.text() and chat.notice.isVisible()
    assert len(store.messages(conv)) == n and len(chat.message_widgets()) == cards
    assert not any(m.error_label.isVisible() for m in chat.message_widgets())
    assert chat.composer.toPlainText() == "one more"
    chat.overflow.setCurrentIndex(chat.overflow.findData("drop_oldest"))  # another policy: it goes through
    qtbot.mouseClick(chat.send_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and len(store.messages(conv)) == n + 2, timeout=REPLY_TIMEOUT_MS)
    assert "Not sent" not in chat.notice.text() and chat.composer.toPlainText() == ""


def test_a_send_is_one_worker_call_and_tokenizes_its_prompt_once(make_window, qtbot):
    """Issue 46: the chat makes one EngineWorker call per send (``send``: the fit and the request on the engine's
    loop, no round trip through the GUI); the fitted prompt is tokenized once and goes to the engine as token
    ids; the panel never reaches the engine's client itself."""
    import inspect

    w = make_window()
    chat, engine = w.chat, w.ctx.engine
    set_sampling(w, max_tokens=4)
    client = engine.client
    tokenized, added, calls = [], [], []
    tokenize, add_request = client.tokenize, client.add_request

    async def counting_tokenize(*args, **kwargs):
        tokenized.append(kwargs.get("messages"))
        return await tokenize(*args, **kwargs)

    async def recording_add_request(*args, **kwargs):
        added.append(kwargs)
        return await add_request(*args, **kwargs)

    client.tokenize, client.add_request = counting_tokenize, recording_add_request
    for name in ("send", "count", "abort"):
        original = getattr(engine, name)
        setattr(engine, name, lambda *a, _name=name, _f=original, **k: (calls.append(_name), _f(*a, **k))[1])
    chat._meter_timer.stop()
    _reply(qtbot, w, "hello there")
    assert [c for c in calls if c != "count"] == ["send"], calls  # (the meter counts the next turn after it)
    assert len(tokenized) == 1 and tokenized[0][-1] == {"role": "user", "content": "hello there"}
    assert len(added) == 1 and added[0].get("prompt_token_ids") and added[0].get("messages") is None
    assert chat.message_widgets()[-1].text == "abcd"
    source = inspect.getsource(chat_panel)
    assert ".client" not in source and ".submit(" not in source


@pytest.mark.slow
def test_long_chat_on_the_real_model_at_a_small_context(make_window, qtbot):
    """The embedded SmolLM2 with a 192-token context and 48-token replies: without the overflow policy the
    third turn failed ("the prompt has N tokens plus 48 requested...") and so did Regenerate."""
    w = make_window(fake=False, engine_settings={"dtype": "float32", "max_model_len": 192})
    chat = w.chat
    assert w.ctx.engine.info.max_model_len == 192
    set_sampling(w, max_tokens=48, temperature=0.0)
    chat.system_prompt.setPlainText("You are a helpful assistant.")
    for text in ("Tell me about the sea.", "Tell me about mountains.", "Tell me about rivers."):
        _reply(qtbot, w, text)
        reply = chat.message_widgets()[-1]
        assert not reply.error_label.isVisible(), reply.error_label.text()
    qtbot.mouseClick(chat.regenerate_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and chat.message_widgets()[-1].message_id is not None,
                    timeout=REPLY_TIMEOUT_MS)
    assert not chat.message_widgets()[-1].error_label.isVisible()
    chat.update_meter()
    qtbot.waitUntil(lambda: chat.meter_fit is not None, timeout=10_000)
    assert chat.meter_fit.full_prompt_tokens + 48 > 192  # the conversation outgrew the context
    assert chat.meter_label.text().endswith("/ 192 tokens") and chat.meter_note.isVisible()


def _is_red(c) -> bool:
    return c.red() > 150 and c.green() < 110 and c.blue() < 110


def test_open_conversation_is_highlighted_and_a_disabled_delete_looks_disabled(make_window, qtbot):
    w = make_window()
    chat = w.chat
    assert not chat.delete_button.isEnabled()  # nothing to delete yet
    img = chat.delete_button.grab().toImage()
    assert not any(_is_red(img.pixelColor(x, y)) for x in range(img.width()) for y in range(img.height()))
    set_sampling(w, max_tokens=2)
    _reply(qtbot, w, "first chat")
    a = chat.conversation.id
    chat.new_conversation()
    _reply(qtbot, w, "second chat")
    chat.open_conversation(a)
    items = [chat.conv_list.item(i) for i in range(chat.conv_list.count())]
    opened = next(it for it in items if it.data(Qt.UserRole) == a)
    other = next(it for it in items if it.data(Qt.UserRole) != a)
    assert opened.isSelected() and not other.isSelected()
    img = chat.conv_list.viewport().grab().toImage()
    ratio = chat.conv_list.viewport().devicePixelRatioF()

    def colour(item):
        r = chat.conv_list.visualItemRect(item)
        return img.pixelColor(int((r.right() - 4) * ratio), int(r.center().y() * ratio))

    assert colour(opened) != colour(other)  # the open one stands out
    assert colour(opened).red() > colour(opened).blue() + 20  # in the accent's light orange
    assert chat.delete_button.isEnabled()
    img = chat.delete_button.grab().toImage()
    assert any(_is_red(img.pixelColor(x, y)) for x in range(img.width()) for y in range(img.height()))


def test_each_reply_keeps_the_label_of_the_model_that_wrote_it(make_window, qtbot):
    w = make_window(engine_settings={"quantization": "int8"})
    chat = w.chat
    set_sampling(w, max_tokens=3)
    name = w.ctx.engine.info.name
    assert "int8" in w.engine_label.text() and name in w.engine_label.text()  # the status bar says int8
    _reply(qtbot, w, "hello")
    conv = chat.conversation.id
    assert chat.message_widgets()[-1].title == f"{name} (int8)"
    assert w.ctx.store.messages(conv)[-1].model == f"{name} (int8)"
    # replies written by other models, and one from before the model was kept
    w.ctx.store.add_message(conv, "user", "again")
    w.ctx.store.add_message(conv, "assistant", "old", model="Qwen2.5-0.5B-Instruct")
    w.ctx.store.add_message(conv, "assistant", "older")
    chat.open_conversation_force(conv)
    titles = [m.title for m in chat.message_widgets() if m.role == "assistant"]
    assert titles == [f"{name} (int8)", "Qwen2.5-0.5B-Instruct", "Assistant"]


def test_a_refused_first_message_adds_no_conversation(make_window, qtbot):
    """Issue 45 row 15: "Stop and say so" on a new chat whose first message does not fit: no conversation, no
    message, no empty error bubble; the notice says why and the draft stays."""
    w = make_window()
    chat, store = w.chat, w.ctx.store
    chat.overflow.setCurrentIndex(chat.overflow.findData("stop"))
    set_sampling(w, max_tokens=40)
    chat.composer.setPlainText("x " * 60)  # the fake engine: one token a character, 128 of context
    qtbot.mouseClick(chat.send_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and "Not sent" in chat.notice.text(), timeout=REPLY_TIMEOUT_MS)
    assert store.conversations() == [] and chat.message_widgets() == [] and chat.conversation is None
    assert chat.composer.toPlainText() == "x " * 60
    chat.composer.setPlainText("short")
    qtbot.mouseClick(chat.send_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and len(chat.message_widgets()) == 2, timeout=REPLY_TIMEOUT_MS)
    assert [c.title for c in store.conversations()] == ["short"] and chat.conv_list.count() == 1
    assert store.conversation(chat.conversation.id).overflow_policy == "stop"

