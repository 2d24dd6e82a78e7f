"""A conversation out of the store and back: JSON that imports to the same conversation (title, system prompt,
overflow policy, output format, times, and every message with its stats, its versions and why a reply was
interrupted), and Markdown to read or share. No Qt here.

    data = conversation_to_dict(store, conversation_id)      # json.dumps(data) is the .json export
    conv = import_conversation(store, data)                   # a new conversation (the ids are new)
    text = conversation_to_markdown(store, conversation_id)  # the .md export
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from app.chat_context import POLICIES
from app.store import INTERRUPTED, NEW_TITLE, VERSION_FIELDS, Conversation, Store

FORMAT = "kestrel-conversation"
VERSION = 1
MESSAGE_FIELDS = (*VERSION_FIELDS, "role", "versions", "version")


def output_format_key(conversation_id: int) -> str:
    """The prefs key of a conversation's output format (conversation ids are never reused: AUTOINCREMENT)."""
    return f"chat.output_format.{conversation_id}"


def conversation_to_dict(store: Store, conversation_id: int) -> dict[str, Any]:
    conv = store.conversation(conversation_id)
    if conv is None:
        raise ValueError("That conversation no longer exists.")
    messages = []
    for m in store.messages(conversation_id):
        messages.append({k: getattr(m, k) for k in MESSAGE_FIELDS})
    return {"format": FORMAT, "version": VERSION, "title": conv.title, "system_prompt": conv.system_prompt,
            "overflow_policy": conv.overflow_policy, "created": conv.created, "updated": conv.updated,
            "output_format": store.pref(output_format_key(conversation_id)), "messages": messages}


def import_conversation(store: Store, data: Any) -> Conversation:
    """A new conversation from ``conversation_to_dict``'s data (checked first: a file that is not such an
    export is refused with a ValueError that says why, and nothing is added)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("This is not a Kestrel conversation (export one with Export → JSON).")
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise ValueError(f"This conversation was exported by a newer Kestrel (format {data.get('version')}).")
    msgs = data.get("messages")
    if not isinstance(msgs, list):
        raise ValueError("The file has no list of messages.")
    for i, m in enumerate(msgs, 1):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or \
                not isinstance(m.get("content"), str):
            raise ValueError(f"Message {i} needs a role (user or assistant) and a text.")
        versions = m.get("versions")
        if versions is not None and (not isinstance(versions, list) or not all(isinstance(v, dict) for v in versions)):
            raise ValueError(f"Message {i}'s versions are not a list of versions.")
    now = time.time()
    conv = store.create_conversation(str(data.get("title") or NEW_TITLE), str(data.get("system_prompt") or ""),
                                     created=_number(data.get("created"), now))
    policy = data.get("overflow_policy")
    if policy in POLICIES:
        store.set_overflow_policy(conv.id, policy)
    if data.get("output_format") is not None:
        store.set_pref(output_format_key(conv.id), data["output_format"])
    for m in msgs:
        extra = {k: m.get(k) for k in VERSION_FIELDS if k not in ("content", "created")}
        versions = m.get("versions") or None
        store.add_message(conv.id, m["role"], m["content"], created=_number(m.get("created"), now), **extra,
                          versions=versions, version=int(m.get("version") or 0) if versions else 0)
    store.set_updated(conv.id, _number(data.get("updated"), now))
    return store.conversation(conv.id)


def conversation_to_markdown(store: Store, conversation_id: int) -> str:
    conv = store.conversation(conversation_id)
    if conv is None:
        raise ValueError("That conversation no longer exists.")
    out = [f"# {conv.title}", "", f"*Exported from Kestrel on {time.strftime('%Y-%m-%d %H:%M', time.localtime())}"
           f" · started {time.strftime('%Y-%m-%d %H:%M', time.localtime(conv.created))}*", ""]
    if conv.system_prompt.strip():
        out += ["**System prompt:**", "", *(f"> {line}" for line in conv.system_prompt.splitlines()), ""]
    for m in store.messages(conversation_id):
        if m.role == "user":
            out += ["## You", ""]
        else:
            out += [f"## {m.model or 'Assistant'}", ""]
        out += [m.content.rstrip() if m.content.strip() else "*(no text)*", ""]
        if m.role != "assistant":
            continue
        notes = []
        if m.version_count > 1:
            notes.append(f"version {m.version + 1} of {m.version_count}")
        if m.num_tokens is not None:
            notes.append(f"{m.num_tokens} tokens")
        if m.tokens_per_s is not None:
            notes.append(f"{m.tokens_per_s:.1f} tok/s")
        if m.finish_reason == INTERRUPTED:
            notes.append(f"interrupted: {m.error or 'the reply did not finish'}")
        elif m.finish_reason == "abort":
            notes.append("stopped")
        elif m.finish_reason == "length":
            notes.append("max tokens reached")
        if notes:
            out += [f"*{' · '.join(notes)}*", ""]
    return "\n".join(out).rstrip() + "\n"


def export_to_file(store: Store, conversation_id: int, path: str | Path) -> Path:
    """Write the conversation to ``path``: Markdown for .md/.markdown, JSON otherwise."""
    path = Path(path)
    if path.suffix.lower() in (".md", ".markdown"):
        path.write_text(conversation_to_markdown(store, conversation_id), encoding="utf-8")
    else:
        path.write_text(json.dumps(conversation_to_dict(store, conversation_id), indent=2, ensure_ascii=False) + "\n",
                        encoding="utf-8")
    return path


def import_from_file(store: Store, path: str | Path) -> Conversation:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"The file could not be read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"The file is not JSON (line {e.lineno}: {e.msg}). Import takes a JSON export.") from None
    return import_conversation(store, data)


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
