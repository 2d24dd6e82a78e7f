"""The SQLite store: conversations, messages, search, settings per model, preferences."""

from __future__ import annotations

import os
import stat

import pytest

from app.store import INTERRUPTED, NEW_TITLE, Store


def test_conversations_and_messages(tmp_path):
    s = Store(tmp_path / "k.sqlite3")
    a = s.create_conversation()
    assert a.title == NEW_TITLE
    m1 = s.add_message(a.id, "user", "Tell me about 100% cotton_shirts")
    m2 = s.add_message(a.id, "assistant", "They breathe.", ttft=0.5, tokens_per_s=12.0, num_tokens=3,
                       finish_reason="stop", model="m")
    b = s.create_conversation("Other", system_prompt="Be brief.")
    assert [c.id for c in s.conversations()] == [b.id, a.id]
    s.add_message(a.id, "user", "more")  # touching a conversation moves it up
    assert [c.id for c in s.conversations()] == [a.id, b.id]
    got = s.messages(a.id)
    assert [m.content for m in got] == ["Tell me about 100% cotton_shirts", "They breathe.", "more"]
    assert got[1].ttft == 0.5 and got[1].num_tokens == 3 and got[1].finish_reason == "stop"
    # search: titles and contents, LIKE wildcards taken literally
    assert [c.id for c in s.conversations("100%")] == [a.id]
    assert [c.id for c in s.conversations("n_s")] == [a.id]
    assert s.conversations("0%c") == []
    assert [c.id for c in s.conversations("other")] == [b.id]
    s.delete_messages_from(a.id, m2.id)
    assert [m.id for m in s.messages(a.id)] == [m1.id]
    s.rename_conversation(a.id, "  ")
    assert s.conversation(a.id).title == NEW_TITLE
    s.set_system_prompt(b.id, "Be kind.")
    assert s.conversation(b.id).system_prompt == "Be kind."
    s.delete_conversation(a.id)
    assert s.conversation(a.id) is None and s.messages(a.id) == []
    s.close()
    s2 = Store(tmp_path / "k.sqlite3")
    assert [c.title for c in s2.conversations()] == ["Other"]


def test_settings_and_prefs(tmp_path):
    s = Store(tmp_path / "k.sqlite3")
    assert s.model_settings("x") == {}
    s.update_model_settings("x", engine={"dtype": "float32"})
    s.update_model_settings("x", sampling={"temperature": 0.2})
    assert s.model_settings("x") == {"engine": {"dtype": "float32"}, "sampling": {"temperature": 0.2}}
    assert s.model_settings("y") == {}
    s.set_pref("last_model", {"key": "k"})
    assert s.pref("last_model") == {"key": "k"} and s.pref("nope", 3) == 3


def test_database_is_private(tmp_path):
    Store(tmp_path / "k.sqlite3")
    if os.name == "posix":
        assert stat.S_IMODE((tmp_path / "k.sqlite3").stat().st_mode) == 0o600


def test_an_old_database_gains_the_reply_model_column(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)  # the schema before overflow policies and before replies kept their model
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL
            REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL, content TEXT NOT NULL,
            created REAL NOT NULL, ttft REAL, tokens_per_s REAL, num_tokens INTEGER, finish_reason TEXT);
        INSERT INTO conversations (title, created, updated) VALUES ('old', 1, 1);
        INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'assistant', 'hi', 1);
    """)
    db.commit()
    db.close()
    s = Store(path)
    (old,) = s.messages(1)
    assert old.content == "hi" and old.model is None
    assert s.conversation(1).overflow_policy == "drop_oldest"
    new = s.add_message(1, "assistant", "there", model="SmolLM2-135M-Instruct (int8)")
    assert s.message(new.id).model == "SmolLM2-135M-Instruct (int8)"
    s.close()
    assert Store(path).messages(1)[-1].model == "SmolLM2-135M-Instruct (int8)"  # a second open: no upgrade again


def test_a_streaming_reply_is_updated_in_place_and_keeps_its_reason(tmp_path):
    s = Store(tmp_path / "k.sqlite3")
    c = s.create_conversation()
    s.add_message(c.id, "user", "hi")
    r = s.add_message(c.id, "assistant", "", finish_reason=INTERRUPTED, error="The app closed.")
    s.update_message(r.id, content="Hel")
    got = s.message(r.id)
    assert (got.content, got.finish_reason, got.error, got.versions) == ("Hel", INTERRUPTED, "The app closed.", None)
    s.update_message(r.id, content="Hello", finish_reason="stop", error=None, num_tokens=2)
    got = s.messages(c.id)[-1]
    assert (got.content, got.finish_reason, got.error, got.num_tokens) == ("Hello", "stop", None, 2)
    with pytest.raises(ValueError):
        s.update_message(r.id, role="user")


def test_regenerated_replies_keep_every_version(tmp_path):
    s = Store(tmp_path / "k.sqlite3")
    c = s.create_conversation()
    s.add_message(c.id, "user", "hi")
    r = s.add_message(c.id, "assistant", "one", num_tokens=1, finish_reason="stop", model="a")
    assert r.version_count == 1 and r.versions is None
    m = s.add_version(r.id, "", finish_reason=INTERRUPTED, error="streaming")
    assert m.version_count == 2 and m.version == 1 and m.content == "" and m.model is None
    m = s.update_message(r.id, content="two", finish_reason="stop", error=None, model="b")
    assert [v["content"] for v in m.versions] == ["one", "two"] and m.version == 1
    m = s.add_version(r.id, "three", finish_reason="length", model="b")
    assert [v["content"] for v in m.versions] == ["one", "two", "three"] and m.content == "three"
    m = s.select_version(r.id, 0)
    assert (m.content, m.model, m.num_tokens, m.finish_reason, m.version) == ("one", "a", 1, "stop", 0)
    assert s.select_version(r.id, 9).version == 2  # clamped
    s.close()
    s2 = Store(tmp_path / "k.sqlite3")  # kept across a restart
    m = s2.messages(c.id)[-1]
    assert m.version == 2 and m.version_count == 3 and m.content == "three"
    s2.update_message(m.id, content="three, edited")
    assert s2.message(m.id).versions[2]["content"] == "three, edited"
    assert s2.message(m.id).versions[0]["content"] == "one"


def test_a_database_from_before_versions_is_upgraded(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(str(path))
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL,
            role TEXT NOT NULL, content TEXT NOT NULL, created REAL NOT NULL, ttft REAL, tokens_per_s REAL,
            num_tokens INTEGER, finish_reason TEXT);
        INSERT INTO conversations VALUES (1, 'old', '', 1.0, 1.0);
        INSERT INTO messages VALUES (1, 1, 'user', 'hi', 1.0, NULL, NULL, NULL, NULL);
        INSERT INTO messages VALUES (2, 1, 'assistant', 'hello', 1.0, 0.1, 5.0, 1, 'stop');""")
    db.commit()
    db.close()
    s = Store(path)
    m = s.messages(1)[-1]
    assert (m.content, m.error, m.versions, m.version, m.model) == ("hello", None, None, 0, None)
    assert s.add_version(m.id, "again").version_count == 2
