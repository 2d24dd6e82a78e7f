"""Issue 45 row 4: a model that cannot load never replaces the one that works. Load is off for a file Kestrel
cannot load (the reason beside it, in plain words), and a Load checks the file again (its header, architecture and
tensor types) and the memory estimate's verdict before anything is unloaded: a failing check leaves the loaded
model answering. On the real engine and the embedded SmolLM2 model."""

from __future__ import annotations

import shutil

from PySide6.QtCore import Qt

from app.library import EMBEDDED_KEY
from tests.app.helpers import REPLY_TIMEOUT_MS, set_sampling


def _still_answers(qtbot, w, text: str) -> None:
    """The engine loaded at the start is the one loaded now, and it still writes a reply."""
    chat = w.chat
    set_sampling(w, max_tokens=4, temperature=0.0)
    assert chat.send(text)
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    last = w.ctx.store.messages(chat.conversation.id)[-1]
    assert last.role == "assistant" and last.content.strip() and last.finish_reason in ("length", "stop"), last


def test_a_bad_file_is_refused_and_the_loaded_model_keeps_working(smollm2_gguf, tmp_path, make_window, qtbot):
    w = make_window(fake=False)  # the real engine on the embedded model
    load = w.panels["load"]
    engine = w.ctx.engine
    client = engine.client
    assert engine.state == "ready" and client is not None
    loaded_name = engine.info.name

    # a file that is not a GGUF file at all, as the issue found it: Load is off, with the reason in plain words
    junk = tmp_path / "notes.gguf"
    junk.write_bytes(b"FRP3" + bytes(range(256)) * 64)
    load.select_path(junk)
    assert not load.load_button.isEnabled()
    reason = 'not a GGUF file (it starts with "FRP3", where a GGUF file starts with "GGUF")'
    assert load.load_button.toolTip() == f"Kestrel cannot load this: {reason}"
    assert load.model_warning.text() == f"Kestrel cannot load this: {reason}"
    assert "b'FRP3'" not in load.model_warning.text() and "bad magic" not in load.model_warning.text()
    # Load reached another way (a shortcut, a stale button): refused before anything is unloaded
    assert load.load_selected() is False
    assert engine.state == "ready" and engine.client is client
    text = load.message.text()
    assert load.message.objectName() == "errorBox"
    assert text.startswith("Not loaded. Kestrel cannot load notes: not a GGUF file"), text
    assert text.endswith(f"{loaded_name} is still loaded."), text

    # a good copy of the model that turns bad after the library read it: Load is on, and the check at Load reads
    # the file again
    turned = tmp_path / "turned-bad.gguf"
    shutil.copy(smollm2_gguf, turned)
    load.select_path(turned)
    assert load.load_button.isEnabled()
    with open(turned, "r+b") as f:
        f.write(b"FRP3")
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    assert engine.state == "ready" and engine.client is client
    assert "Kestrel cannot load turned-bad: not a GGUF file" in load.message.text()
    assert not load.load_button.isEnabled()  # what the file is now
    assert "(cannot be loaded)" in load.model_combo.currentText()

    # a model that does not fit this machine's memory (the estimate's verdict): refused, with what would help
    load.select_key(EMBEDDED_KEY)
    load.form.set_value("kv_cache_memory_gib", 4000.0)
    assert "That is more than this machine's memory." in load.estimate.text()
    assert load.load_button.isEnabled()
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    assert engine.state == "ready" and engine.client is client
    text = load.message.text()
    assert "does not fit: it needs about" in text and "this machine has" in text, text
    load.form.set_value("kv_cache_memory_gib", None)

    _still_answers(qtbot, w, "Say hi")


def test_the_library_does_not_offer_load_for_a_file_it_cannot_load(tmp_path, make_window, qtbot):
    junk = tmp_path / "holiday.gguf"
    junk.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 4096)
    w = make_window(autoload=False)
    w.show_panel("models")
    lib = w.ctx.library
    lib.add_file(str(junk))
    qtbot.waitUntil(lambda: lib.scanned and any(e.model_ref == str(junk) for e in lib.entries), timeout=30_000)
    tab = w.panels["models"].library_tab
    assert tab.select_key(str(junk))
    reason = "not a GGUF file (it starts with 89 50 4e 47, where a GGUF file starts with \"GGUF\")"
    assert not tab.load_button.isEnabled()
    assert tab.load_button.toolTip() == f"Kestrel cannot load holiday: {reason}"
    assert tab.reason_note.isVisible() and tab.reason_note.text() == f"Kestrel cannot load holiday: {reason}"
    row = tab.table.currentRow()
    assert tab.table.item(row, tab.table.columnCount() - 1).text() == f"no: {reason}"
    # issue 45: the format column does not say GGUF for a PNG renamed .gguf, nor the quantization anything
    fmt = tab.table.item(row, 2)
    assert fmt.text() == "unknown" and fmt.toolTip() == f"Not a model file Kestrel can read: {reason}"
    assert tab.table.item(row, 4).text() == "—"
    tab.load_selected()  # a double-click: nothing opens
    assert w.stack.currentWidget() is w.panels["models"]
    assert tab.select_key(EMBEDDED_KEY)
    assert tab.load_button.isEnabled() and not tab.reason_note.isVisible()
