"""Persistent app state in one SQLite file: conversations and their messages, settings per model, and
small app preferences. No Qt here; used from the GUI thread only (each call is a short transaction).

A reply is saved while it streams (``update_message``): one that did not finish (the app closed, the engine
died, the request failed) stays with ``finish_reason`` "interrupted" and ``error`` saying why. A reply that
was regenerated keeps its earlier versions (``add_version``, ``select_version``): the message's own columns
hold the version shown, ``versions`` all of them (None while there is only one)."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    overflow_policy TEXT NOT NULL DEFAULT 'drop_oldest',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    created REAL NOT NULL,
    ttft REAL,
    tokens_per_s REAL,
    num_tokens INTEGER,
    finish_reason TEXT,
    model TEXT,
    error TEXT,
    versions TEXT,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS model_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prefs (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

NEW_TITLE = "New chat"


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float
    overflow_policy: str = "drop_oldest"  # app.chat_context: what a turn does when it outgrows the context


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str  # "user" | "assistant"
    content: str
    created: float
    ttft: float | None = None  # seconds
    tokens_per_s: float | None = None
    num_tokens: int | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    model: str | None = None  # an assistant reply: the model that wrote it (None: from before this was kept)
    error: str | None = None  # a reply that did not finish ("interrupted"): why, in words
    versions: list[dict] | None = None  # a regenerated reply: every version (VERSION_FIELDS), None when one
    version: int = 0  # the version shown (an index into ``versions``)

    @property
    def version_count(self) -> int:
        return len(self.versions) if self.versions else 1

    def fields(self) -> dict[str, Any]:
        """This version's content and stats (VERSION_FIELDS)."""
        return {k: getattr(self, k) for k in VERSION_FIELDS}


INTERRUPTED = "interrupted"  # finish_reason of a reply that did not finish (``error`` says why)
# what one version of a reply holds (the message's columns of the same names show the selected one)
VERSION_FIELDS = ("content", "created", "ttft", "tokens_per_s", "num_tokens", "finish_reason", "model", "error")
_UPDATABLE = {"content", "ttft", "tokens_per_s", "num_tokens", "finish_reason", "model", "error"}


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(mode=0o600, exist_ok=True)  # conversations are private
        self._db = sqlite3.connect(str(self.path))
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(_SCHEMA)
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(conversations)")}
        if "overflow_policy" not in cols:  # a database from before overflow policies
            self._db.execute("ALTER TABLE conversations ADD COLUMN overflow_policy TEXT NOT NULL "
                             "DEFAULT 'drop_oldest'")
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(messages)")}
        if "model" not in cols:  # a database from before replies kept the model that wrote them
            self._db.execute("ALTER TABLE messages ADD COLUMN model TEXT")
        for col, decl in (("error", "TEXT"), ("versions", "TEXT"), ("version", "INTEGER NOT NULL DEFAULT 0")):
            if col not in cols:  # from before interrupted replies and reply versions were kept
                self._db.execute(f"ALTER TABLE messages ADD COLUMN {col} {decl}")
        self._db.commit()

    def close(self) -> None:
        self._db.close()

    # -- conversations ------------------------------------------------------------------------
    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; with ``search``, those whose title or any message contains it (case-insensitive)."""
        if search:
            like = f"%{_escape_like(search)}%"
            rows = self._db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS ("
                "SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\') "
                "ORDER BY c.updated DESC, c.id DESC", (like,))
        else:
            rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC")
        return [Conversation(**dict(r)) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(**dict(row)) if row else None

    def create_conversation(self, title: str = NEW_TITLE, system_prompt: str = "",
                            created: float | None = None) -> Conversation:
        now = time.time() if created is None else created
        with self._db:
            cur = self._db.execute(
                "INSERT INTO conversations (title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
                (title, system_prompt, now, now))
        return self.conversation(cur.lastrowid)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or NEW_TITLE,
                                                                                  conversation_id))

    def set_system_prompt(self, conversation_id: int, text: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (text, conversation_id))

    def set_overflow_policy(self, conversation_id: int, policy: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET overflow_policy = ? WHERE id = ?", (policy, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages -----------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,))
        return [_message(r) for r in rows]

    def message(self, message_id: int) -> Message | None:
        row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return _message(row) if row else None

    def add_message(self, conversation_id: int, role: str, content: str, created: float | None = None,
                    **stats: Any) -> Message:
        """Append a message (``stats``: ttft, tokens_per_s, num_tokens, finish_reason, model, error, and
        ``versions`` as a list with ``version``, as Message has them)."""
        now = time.time()
        if "versions" in stats:
            stats["versions"] = json.dumps(stats["versions"]) if stats["versions"] else None
        cols = ["conversation_id", "role", "content", "created", *stats]
        with self._db:
            cur = self._db.execute(
                f"INSERT INTO messages ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                (conversation_id, role, content, now if created is None else created, *stats.values()))
            self._touch(conversation_id, now)
        return self.message(cur.lastrowid)

    def update_message(self, message_id: int, **fields: Any) -> Message | None:
        """Change the shown version of a message (content and stats; a streaming reply is saved this way)."""
        m = self._message_to_change(message_id, fields)
        if m is None:
            return None
        values = {**m.fields(), **fields}
        self._write_version(m, m.version, values, m.versions)
        return self.message(message_id)

    def add_version(self, message_id: int, content: str = "", **fields: Any) -> Message | None:
        """Add a version of a reply (Regenerate) and show it; the earlier ones are kept."""
        m = self._message_to_change(message_id, fields)
        if m is None:
            return None
        versions = list(m.versions) if m.versions else [m.fields()]
        new = {k: None for k in VERSION_FIELDS} | {"content": content, "created": time.time()} | fields
        versions.append(new)
        self._write_version(m, len(versions) - 1, new, versions)
        return self.message(message_id)

    def _message_to_change(self, message_id: int, fields: dict[str, Any]) -> Message | None:
        """The message that ``fields`` are about to change (None: there is none); ValueError for a field a
        version does not hold."""
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"not a message field: {', '.join(sorted(unknown))}")
        return self.message(message_id)

    def select_version(self, message_id: int, index: int) -> Message | None:
        """Show another version of a reply (clamped to those there are)."""
        m = self.message(message_id)
        if m is None or not m.versions:
            return m
        index = max(0, min(index, len(m.versions) - 1))
        self._write_version(m, index, m.versions[index], m.versions)
        return self.message(message_id)

    def _write_version(self, m: Message, index: int, values: dict[str, Any], versions: list[dict] | None) -> None:
        if versions:
            versions = list(versions)
            versions[index] = {k: values.get(k) for k in VERSION_FIELDS}
        cols = list(VERSION_FIELDS)
        with self._db:
            self._db.execute(
                f"UPDATE messages SET {', '.join(f'{c} = ?' for c in cols)}, versions = ?, version = ? WHERE id = ?",
                (*(values.get(c) for c in cols), json.dumps(versions) if versions else None, index, m.id))
            self._touch(m.conversation_id, time.time())

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete this message and every later one of the conversation (edit-and-resend, regenerate)."""
        with self._db:
            self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                             (conversation_id, message_id))
            self._touch(conversation_id, time.time())

    def set_updated(self, conversation_id: int, when: float) -> None:
        """Set when a conversation last changed (its place in the list; an imported one keeps its own)."""
        with self._db:
            self._touch(conversation_id, when)

    def _touch(self, conversation_id: int, now: float) -> None:
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))

    # -- settings -------------------------------------------------------------------------------
    def model_settings(self, key: str) -> dict[str, Any]:
        row = self._db.execute("SELECT value FROM model_settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else {}

    def set_model_settings(self, key: str, values: dict[str, Any]) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO model_settings (key, value) VALUES (?, ?)",
                             (key, json.dumps(values)))

    def update_model_settings(self, key: str, **values: Any) -> None:
        merged = {**self.model_settings(key), **values}
        self.set_model_settings(key, merged)

    def pref(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM prefs WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_pref(self, key: str, value: Any) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO prefs (key, value) VALUES (?, ?)", (key, json.dumps(value)))


def _message(row: sqlite3.Row) -> Message:
    d = dict(row)
    d["versions"] = json.loads(d["versions"]) if d.get("versions") else None
    d["version"] = d.get("version") or 0
    return Message(**d)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
