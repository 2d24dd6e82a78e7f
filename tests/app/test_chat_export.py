"""Export and import of a conversation (issue 45): JSON that imports back to the same conversation (every
field, versions and interrupted replies included), readable Markdown, and files that are not an export refused
with nothing added."""

from __future__ import annotations

import json

import pytest

from app import chat_export
from app.store import INTERRUPTED, Store
from tests.app.helpers import REPLY_TIMEOUT_MS, set_sampling


def _rich_conversation(store: Store) -> int:
    c = store.create_conversation("Ships & “quotes”", system_prompt="Be brief.\nUse metric units.")
    store.set_overflow_policy(c.id, "truncate_middle")
    store.set_pref(chat_export.output_format_key(c.id), {"kind": "json_object", "schema": ""})
    store.add_message(c.id, "user", "How long is a 50 ft boat?\n\n```\ncode < & >\n```")
    r = store.add_message(c.id, "assistant", "About 15 m.", ttft=0.25, tokens_per_s=12.5, num_tokens=4,
                          finish_reason="stop", model="SmolLM2")
    store.add_version(r.id, "15.24 m", ttft=0.3, tokens_per_s=11.0, num_tokens=5, finish_reason="length", model="B")
    store.select_version(r.id, 0)
    store.add_message(c.id, "user", "And in feet?")
    store.add_message(c.id, "assistant", "Fifty fe", finish_reason=INTERRUPTED, error="The app was closed.",
                      model="SmolLM2")
    return c.id


def test_json_export_imports_back_exactly(tmp_path):
    store = Store(tmp_path / "k.sqlite3")
    cid = _rich_conversation(store)
    data = chat_export.conversation_to_dict(store, cid)
    path = chat_export.export_to_file(store, cid, tmp_path / "out.json")
    assert json.loads(path.read_text(encoding="utf-8")) == data
    other = Store(tmp_path / "other.sqlite3")
    other.create_conversation("already there")  # the ids differ on the other side
    conv = chat_export.import_from_file(other, path)
    assert conv.id != cid
    again = chat_export.conversation_to_dict(other, conv.id)
    assert again == data
    m = other.messages(conv.id)
    assert [x.role for x in m] == ["user", "assistant", "user", "assistant"]
    assert m[1].version_count == 2 and m[1].version == 0 and m[1].versions[1]["content"] == "15.24 m"
    assert m[3].finish_reason == INTERRUPTED and m[3].error == "The app was closed."
    assert other.conversation(conv.id).overflow_policy == "truncate_middle"


@pytest.mark.parametrize("text, why", [
    ("not json", "not JSON"),
    ('{"messages": []}', "not a Kestrel conversation"),
    ('{"format": "kestrel-conversation", "version": 99, "messages": []}', "newer Kestrel"),
    ('{"format": "kestrel-conversation", "version": 1, "messages": [{"role": "robot", "content": "x"}]}',
     "Message 1"),
])
def test_import_refuses_what_is_not_an_export(tmp_path, text, why):
    store = Store(tmp_path / "k.sqlite3")
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=why):
        chat_export.import_from_file(store, path)
    assert store.conversations() == []


def test_markdown_export_reads_as_a_conversation(tmp_path):
    store = Store(tmp_path / "k.sqlite3")
    cid = _rich_conversation(store)
    md = chat_export.export_to_file(store, cid, tmp_path / "out.md").read_text(encoding="utf-8")
    assert md.startswith("# Ships & “quotes”\n")
    assert "> Be brief.\n> Use metric units." in md
    assert md.index("## You") < md.index("## SmolLM2") < md.index("And in feet?")
    assert "```\ncode < & >\n```" in md  # the text as written, code included
    assert "*version 1 of 2 · 4 tokens · 12.5 tok/s*" in md
    assert "Fifty fe" in md and "interrupted: The app was closed." in md


def test_export_and_import_from_the_chat(make_window, qtbot, tmp_path):
    w = make_window()
    chat = w.chat
    set_sampling(w, max_tokens=4)
    assert chat.send("hello there")
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    cid = chat.conversation.id
    labels = [a.text() for a in chat.export_button.menu().actions()]
    assert labels == ["As Markdown (.md)…", "As JSON (.json)…"] and chat.export_button.isEnabled()
    chat.export_conversation(cid, str(tmp_path / "c.json"))
    chat.export_conversation(cid, str(tmp_path / "c.md"))
    assert "## You\n\nhello there" in (tmp_path / "c.md").read_text(encoding="utf-8")
    conv = chat.import_conversation(str(tmp_path / "c.json"))
    assert conv is not None and conv.id != cid and chat.conversation.id == conv.id
    assert [m.text for m in chat.message_widgets()] == ["hello there", "abcd"]
    assert chat.conv_list.count() == 2 and "Imported" in chat.notice.text()
    (tmp_path / "bad.json").write_text("{}")
    assert chat.import_conversation(str(tmp_path / "bad.json")) is None
    assert "Not imported" in chat.notice.text() and chat.conv_list.count() == 2
