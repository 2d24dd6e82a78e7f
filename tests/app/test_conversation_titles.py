"""Issue 45 (first-day polish): several chats started with the same prompt had the same title in the list
("Write a long story, at least t…" four times) and could not be told apart. Conversations sharing a title get a
second line with when they were started ("(2)" where even the minute is the same); every item's tooltip has
the whole title and its dates."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt

TITLE = "Write a long story, at least three paragraphs, about a kestrel"


def test_conversations_with_the_same_title_can_be_told_apart(make_window):
    w = make_window(autoload=False)
    chat, store = w.chat, w.ctx.store
    minute = (time.time() // 60) * 60 - 3600  # the start of a minute an hour ago
    older = store.create_conversation(TITLE, created=minute - 2 * 3600)
    a = store.create_conversation(TITLE, created=minute + 5)
    b = store.create_conversation(TITLE, created=minute + 20)  # the same minute as a
    other = store.create_conversation("Explain paged attention", created=minute + 30)
    chat.refresh_conversations()
    items = {chat.conv_list.item(i).data(Qt.UserRole): chat.conv_list.item(i) for i in range(chat.conv_list.count())}
    texts = {cid: items[cid].text() for cid in (older.id, a.id, b.id)}
    assert len(set(texts.values())) == 3, texts  # no two alike
    when = time.strftime("%b %-d, %H:%M", time.localtime(minute + 5))
    assert texts[a.id] == f"{TITLE}\nstarted {when} (1)" and texts[b.id] == f"{TITLE}\nstarted {when} (2)", texts
    assert texts[older.id] == f"{TITLE}\nstarted {time.strftime('%b %-d, %H:%M', time.localtime(minute - 7200))}"
    assert items[other.id].text() == "Explain paged attention"  # a title of its own stays one line
    tip = items[a.id].toolTip()
    assert tip.startswith(TITLE + "\nStarted " + when), tip
    # the second lines show (the items are two lines high, not cut to the title)
    assert chat.conv_list.visualItemRect(items[a.id]).height() > chat.conv_list.visualItemRect(items[other.id]).height()


def test_list_times_are_formatted_portably():
    """Issue 46: the day was formatted with "%-d", which only glibc's strftime knows (Windows raises ValueError):
    the list's times come out the same without it, and no strftime in app/ uses a platform-only flag."""
    import ast
    from pathlib import Path

    from app.chat_text import list_time

    t = time.mktime((2026, 12, 7, 9, 14, 30, 0, 0, -1))
    assert list_time(t) == f"{time.strftime('%b', time.localtime(t))} 7, 09:14"
    t = time.mktime((2026, 12, 17, 21, 5, 0, 0, 0, -1))
    assert list_time(t).endswith(" 17, 21:05")
    app = Path(__file__).resolve().parents[2] / "app"
    flagged = [f"{p.name}:{n.lineno}" for p in app.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and any(
                   f in n.value for f in ("%-d", "%-m", "%-H", "%-I", "%-M", "%#d", "%#m"))]
    assert flagged == []
