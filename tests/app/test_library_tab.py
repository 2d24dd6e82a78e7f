"""The Library tab's list of added files (Browse in the Load panel, "Add GGUF file"): each can be removed from
the list (button, right-click, Delete key) with the file left on disk, and files that are gone can be
forgotten. And the style sheet's rules that the panels used to patch on their widgets."""

from __future__ import annotations

import shutil

from PySide6.QtCore import Qt


def _library_with(qtbot, make_window, *paths):
    w = make_window(autoload=False)
    models = w.panels["models"]
    w.show_panel("models")
    lib = w.ctx.library
    for p in paths:
        lib.add_file(str(p))
    qtbot.waitUntil(lambda: lib.scanned and all(any(e.model_ref == str(p) for e in lib.entries)
                                                for p in paths if p.exists()), timeout=30_000)
    return w, models.library_tab


def test_an_added_file_can_be_removed_from_the_list_and_stays_on_disk(smollm2_gguf, tmp_path, make_window, qtbot):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    shutil.copy(smollm2_gguf, a)
    shutil.copy(smollm2_gguf, b)
    w, tab = _library_with(qtbot, make_window, a, b)
    lib = w.ctx.library
    assert tab.select_key(str(a))
    assert tab.delete_button.text() == "Remove from list" and tab.delete_button.isEnabled()
    tab._context_menu(tab.table.visualItemRect(tab.table.item(tab.table.currentRow(), 0)).center())
    actions = {act.text(): act for act in tab._menu.actions()}
    tab._menu.close()
    assert "Remove from list (the file stays)" in actions and "Delete from disk…" not in actions
    actions["Remove from list (the file stays)"].trigger()
    qtbot.waitUntil(lambda: not any(e.model_ref == str(a) for e in lib.entries), timeout=30_000)
    assert a.exists() and str(a) not in lib.added_files()
    assert "Removed a" in w.panels["models"].status.text()
    # the Delete key on the other one
    assert tab.select_key(str(b))
    tab.table.setFocus()
    qtbot.keyClick(tab.table, Qt.Key_Delete)
    qtbot.waitUntil(lambda: not any(e.model_ref == str(b) for e in lib.entries), timeout=30_000)
    assert b.exists() and lib.added_files() == []


def test_added_files_that_are_gone_can_be_forgotten(smollm2_gguf, tmp_path, make_window, qtbot):
    keep, gone = tmp_path / "keep.gguf", tmp_path / "gone.gguf"
    shutil.copy(smollm2_gguf, keep)
    shutil.copy(smollm2_gguf, gone)
    w, tab = _library_with(qtbot, make_window, keep, gone)
    assert not tab.forget_button.isVisible()
    gone.unlink()
    w.ctx.library.refresh()
    qtbot.waitUntil(lambda: tab.forget_button.isVisible(), timeout=30_000)
    assert "1 added file is no longer there" in tab.missing_note.text() and str(gone) in tab.missing_note.text()
    qtbot.mouseClick(tab.forget_button, Qt.LeftButton)
    assert w.ctx.library.added_files() == [str(keep)]
    qtbot.waitUntil(lambda: not tab.forget_button.isVisible(), timeout=30_000)


def _grab(widget):
    widget.show()
    widget.repaint()
    return widget.grab().toImage()


def _colors(image) -> set[tuple[int, int, int]]:
    return {image.pixelColor(x, y).getRgb()[:3] for x in range(0, image.width(), 1)
            for y in range(0, image.height(), 1)}


def test_the_style_sheet_greys_a_disabled_danger_button_and_marks_the_open_conversation(qtbot):
    from PySide6.QtWidgets import QListWidget, QPushButton

    from app.main import create_app

    create_app()  # the app's style sheet, nothing set on the widgets
    b = QPushButton("Delete")
    b.setObjectName("danger")
    qtbot.addWidget(b)
    enabled = _colors(_grab(b))
    assert any(r > 150 and g < 80 and bl < 80 for r, g, bl in enabled)  # red text
    b.setEnabled(False)
    disabled = _colors(_grab(b))
    assert not any(r > 120 and r - g > 60 for r, g, bl in disabled)  # no red left: grey like other disabled buttons

    lst = QListWidget()
    lst.setObjectName("conversations")
    qtbot.addWidget(lst)
    lst.addItems(["one", "two"])
    lst.resize(200, 120)
    lst.setCurrentRow(0)
    assert (0xff, 0xed, 0xd5) in _colors(_grab(lst))  # the open conversation's background


def test_a_long_engine_support_text_does_not_squeeze_the_model_name(make_window, qtbot):
    """Issue 14 item 5: a long "no: ..." in the Engine support column used to take the width it wanted and leave
    the model names elided ("SmolL..."). The name keeps its width; the support text is elided, whole in its
    tooltip."""
    import dataclasses

    w = make_window(autoload=False)
    w.resize(1100, 700)
    w.show_panel("models")
    lib = w.ctx.library
    qtbot.waitUntil(lambda: lib.scanned and bool(lib.entries), timeout=30_000)
    reason = ("the architecture 'mamba2' is not supported by the engine yet (supported: llama, mistral, qwen2, "
              "qwen3, phi3, gemma2; see the README for the list and what each needs)")
    e = lib.entries[0]
    long_one = dataclasses.replace(e, facts=dataclasses.replace(e.facts, supported=False, reason=reason),
                                   key="long-support")
    lib.entries = [e, long_one]
    tab = w.panels["models"].library_tab
    tab.show_entries()
    qtbot.wait(50)
    t = tab.table
    fm = t.fontMetrics()
    name_width = max(fm.horizontalAdvance(t.item(r, 0).text()) for r in range(t.rowCount()))
    # sizeHintForColumn: the width the names need whole (text and the cell's margins)
    assert t.columnWidth(0) >= max(t.sizeHintForColumn(0), name_width), (t.columnWidth(0), name_width)
    total = sum(t.columnWidth(c) for c in range(t.columnCount()))
    assert total <= t.viewport().width() + 2  # no horizontal scrolling needed either
    support = t.item(1, t.columnCount() - 1)
    assert reason in support.toolTip() and t.textElideMode() != Qt.ElideNone
