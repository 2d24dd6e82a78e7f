"""Code blocks in assistant replies: highlighted (Pygments), one Copy button each that puts that block's raw code
on the clipboard, rendered while the reply streams (a half-written block included), laid out unclipped, and
re-coloured by a theme change."""

from __future__ import annotations

import time

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app import markdown_render, theme
from app.widgets.messages import CodeBlock, MessageList, MessageWidget
from tests.app.helpers import REPLY_TIMEOUT_MS

REPLY = """Two ways:

```python
def lt(a, b):
    return a < b and "x" != '&amp;'  # <b>not bold</b>
```

and in the shell:

```bash
echo "$HOME" | wc -c
```

Done with `x < y`."""

PY_CODE = 'def lt(a, b):\n    return a < b and "x" != \'&amp;\'  # <b>not bold</b>'
SH_CODE = 'echo "$HOME" | wc -c'


@pytest.fixture(autouse=True)
def light_theme(qapp):
    theme.apply(qapp, theme.load(theme.LIGHT))
    yield
    theme.apply(qapp, theme.load(theme.LIGHT))


def _pump(seconds: float = 0.1) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QApplication.processEvents()
        time.sleep(0.01)


def test_segments_keep_the_raw_code_and_language():
    segs = markdown_render.segments(REPLY)
    assert [s.kind for s in segs] == ["html", "code", "html", "code", "html"]
    assert (segs[1].code, segs[1].language) == (PY_CODE, "python")
    assert (segs[3].code, segs[3].language) == (SH_CODE, "bash")
    assert "<b>not bold</b>" not in segs[1].html and "&lt;b&gt;" in segs[1].html  # raw HTML stays text


def test_known_language_is_highlighted_unknown_is_plain():
    styled = markdown_render.highlight("def f():\n    return 1", "python")
    assert "<span style=" in styled and "def" in styled
    plain = markdown_render.highlight("a <b> c", "no-such-language")
    assert "<span" not in plain and "a &lt;b&gt; c" in plain
    assert "<span" not in markdown_render.highlight("x = 1", "")  # no tag: plain monospace


def test_each_copy_button_copies_its_own_block(qtbot):
    w = MessageWidget("assistant", REPLY)
    qtbot.addWidget(w)
    w.show()
    blocks = w.code_blocks()
    assert [b.language for b in blocks] == ["python", "bash"]
    assert "<span" in blocks[0].code_label.text()  # highlighted
    clipboard = QApplication.clipboard()
    qtbot.mouseClick(blocks[1].copy_button, Qt.LeftButton)
    assert clipboard.text() == SH_CODE
    assert blocks[1].copy_button.text() == "Copied"
    qtbot.mouseClick(blocks[0].copy_button, Qt.LeftButton)
    assert clipboard.text() == PY_CODE
    qtbot.waitUntil(lambda: blocks[1].copy_button.text() == "Copy", timeout=5000)


def test_streaming_renders_every_prefix_and_keeps_finished_blocks(qtbot):
    """As _render_pending does while a reply streams: set_text with the text so far, a few characters more
    each time. Half-written fences and blocks render; a finished block keeps its widget."""
    w = MessageWidget("assistant", "")
    qtbot.addWidget(w)
    w.show()
    first_block = None
    counts = []
    for end in range(0, len(REPLY) + 1, 3):
        w.set_text(REPLY[:end])
        blocks = w.code_blocks()
        counts.append(len(blocks))
        if end > REPLY.index("and in the shell"):
            if first_block is None:
                first_block = blocks[0]
            assert blocks[0] is first_block and first_block.code == PY_CODE
    w.set_text(REPLY)
    assert counts == sorted(counts) and counts[-1] == 2
    partial = REPLY[:REPLY.index("return") + 8]  # inside the first block: closed for rendering
    w.set_text(partial)
    assert w.code_blocks()[0].code == partial.split("```python\n")[1]


def test_long_reply_is_laid_out_unclipped(qtbot):
    lst = MessageList()
    qtbot.addWidget(lst)
    lst.resize(600, 400)
    lst.show()
    msg = lst.add(MessageWidget("assistant", "\n\n".join([REPLY] * 4)))
    _pump(0.3)
    assert len(msg.code_blocks()) == 8
    for block in msg.code_blocks():
        label = block.code_label
        assert label.height() >= label.heightForWidth(label.width())
    # the list's content is as tall as its messages, no blank space beyond (nor less)
    inner = lst.widget()
    assert inner.height() == max(lst.viewport().height(), inner.heightForWidth(lst.viewport().width()))


def test_theme_change_recolours_code(qtbot, qapp):
    w = MessageWidget("assistant", REPLY)
    qtbot.addWidget(w)
    w.show()
    light = w.code_blocks()[0].code_label.text()
    theme.apply(qapp, theme.load(theme.DARK))
    qtbot.waitUntil(lambda: w.code_blocks()[0].code_label.text() != light, timeout=5000)
    dark_style = markdown_render.highlight(PY_CODE, "python", theme.load(theme.DARK).pygments_style)
    assert w.code_blocks()[0].code_label.text() == dark_style
    assert isinstance(w.code_blocks()[0], CodeBlock) and w.code_blocks()[0].code == PY_CODE


def test_code_reply_in_the_chat(make_window, qtbot, monkeypatch):
    """A stored reply with code opens with its Copy buttons; a streamed reply whose text is a half-written code
    block renders as a code block while it grows and when it ends."""
    monkeypatch.setenv("KESTREL_FAKE", "slow")
    w = make_window()
    chat = w.chat
    store = w.ctx.store
    conv = store.create_conversation("code")
    store.add_message(conv.id, "user", "show me")
    store.add_message(conv.id, "assistant", REPLY, finish_reason="stop", num_tokens=40)
    chat.open_conversation(conv.id)
    reply = chat.message_widgets()[-1]
    qtbot.mouseClick(reply.code_blocks()[0].copy_button, Qt.LeftButton)
    assert QApplication.clipboard().text() == PY_CODE

    chat.sampling.max_tokens.setValue(30)
    assert chat.send("more")
    qtbot.waitUntil(lambda: chat.pending is not None and chat.pending.widget is not None, timeout=REPLY_TIMEOUT_MS)
    chat.pending.text = "```python\nprint(1" + chat.pending.text  # the stream so far opens a block
    chat.pending.dirty = True
    qtbot.waitUntil(lambda: chat.pending is None or bool(chat.message_widgets()[-1].code_blocks()),
                    timeout=REPLY_TIMEOUT_MS)
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    blocks = chat.message_widgets()[-1].code_blocks()
    assert len(blocks) == 1 and blocks[0].code.startswith("print(1") and blocks[0].language == "python"


def test_without_pygments_code_is_plain(monkeypatch):
    """Pygments missing (a GUI install without it): code blocks still render, plain and escaped."""
    import sys

    for f in (markdown_render.highlight, markdown_render._lexer, markdown_render._formatter):
        f.cache_clear()
    monkeypatch.setitem(sys.modules, "pygments", None)
    monkeypatch.setitem(sys.modules, "pygments.formatters", None)
    monkeypatch.setitem(sys.modules, "pygments.lexers", None)
    try:
        segs = markdown_render.segments(REPLY)
        assert segs[1].code == PY_CODE and "<span" not in segs[1].html and "&lt;b&gt;" in segs[1].html
    finally:
        for f in (markdown_render.highlight, markdown_render._lexer, markdown_render._formatter):
            f.cache_clear()
