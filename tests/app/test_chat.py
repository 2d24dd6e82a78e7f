"""The Chat panel on a stand-in engine (no model): streaming into the view and the database, stop,
regenerate, edit-and-resend, conversations (new, rename, search, delete), system prompts, Enter/Shift+Enter,
and an engine that dies mid-reply."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.helpers import REPLY_TIMEOUT_MS, set_sampling


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
    assert msgs[-1].id != stopped.id and msgs[-1].content == "abcde" and msgs[-1].finish_reason == "length"
    assert [m.role for m in chat.message_widgets()] == ["user", "assistant"]

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
    sent: list = []
    original = w.ctx.engine.generate
    w.ctx.engine.generate = lambda rid, messages, params: (sent.append(messages), original(rid, messages, params))
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


def test_engine_death_fails_the_reply_in_place_and_offers_reload(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "crash_step")
    w = make_window()
    chat = w.chat
    assert chat.send("boom")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    reply = chat.message_widgets()[-1]
    assert reply.error_label.isVisible() and "failed" in reply.error_label.text()
    qtbot.waitUntil(lambda: w.ctx.engine.state == "dead", timeout=30_000)
    assert w.reload_button.isVisible()
    assert not chat.send_button.isEnabled()
    monkeypatch.setenv("KESTREL_FAKE", "")
    qtbot.mouseClick(w.reload_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready", timeout=60_000)
    set_sampling(w, max_tokens=3)
    qtbot.mouseClick(chat.regenerate_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None and chat.message_widgets()[-1].text == "abc", timeout=REPLY_TIMEOUT_MS)
