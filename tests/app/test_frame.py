"""Issue 45 rows 11, 12, 14 and 15 (the window frame and the theme): the style sheet reaches only the app's own
widgets (Qt's file dialog keeps its sidebar readable), the sidebar's theme list is readable, the Hardware memory
bar never cuts its text, the sidebar folds to icons in a small window (1024x700 usable), the status bar says
"Loading weights…" once, the Models banner sits under the tabs, can be dismissed and, when the Hub cannot be
reached, points to "Add GGUF file…", and every panel can be opened with --panel."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor


def _luminance(c: QColor) -> float:
    def lin(v: float) -> float:
        v /= 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(c.red()) + 0.7152 * lin(c.green()) + 0.0722 * lin(c.blue())


def _contrast(a: QColor, b: QColor) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def _background(image) -> QColor:
    """The commonest colour of a grabbed image."""
    counts: dict[int, int] = {}
    for y in range(0, image.height(), 2):
        for x in range(0, image.width(), 2):
            p = image.pixel(x, y)
            counts[p] = counts.get(p, 0) + 1
    return QColor.fromRgb(max(counts, key=counts.get))


@pytest.mark.parametrize("name", ["light", "dark"])
def test_the_file_dialog_sidebar_is_not_the_apps_sidebar(qtbot, name):
    """`QWidget#sidebar` matched QFileDialog's own sidebar (named "sidebar"): dark navy with dark text."""
    from PySide6.QtWidgets import QFileDialog, QListView

    from app import theme
    from app.main import create_app

    app = create_app()
    theme.apply(app, theme.load(name))
    try:
        dialog = QFileDialog(None, "Add a GGUF file")
        dialog.setOption(QFileDialog.DontUseNativeDialog, True)
        qtbot.addWidget(dialog)
        dialog.resize(800, 500)
        dialog.show()
        side = dialog.findChild(QListView, "sidebar")
        assert side is not None
        qtbot.waitExposed(dialog)
        bg = _background(side.grab().toImage())
        navy = QColor(theme.load(name)["sidebar"])
        assert bg.rgb() != navy.rgb(), bg.name()
        text = side.palette().color(side.foregroundRole())
        assert _contrast(bg, text) >= 4.5, (bg.name(), text.name())
    finally:
        theme.apply(app, theme.load("light"))


@pytest.mark.parametrize("name", ["light", "dark"])
def test_the_theme_list_is_readable(make_window, qtbot, name):
    """The sidebar's combo is light text on dark; its drop-down list used to take that light text onto white."""
    from app import theme

    w = make_window(autoload=False)
    w.theme.set_choice(name)
    t = theme.load(name)
    combo = w.theme_choice
    combo.showPopup()
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=5_000)
    view.setCurrentIndex(view.model().index(0, 0))  # "System" selected: "Light" and "Dark" drawn as plain items
    image = view.viewport().grab().toImage()
    bg = _background(image)
    assert bg.name() == t["surface"], bg.name()
    for row in (1, 2):
        r = view.visualRect(view.model().index(row, 0)).adjusted(2, 3, -2, -3)  # inside the item: no borders
        r = r.intersected(image.rect())
        assert r.height() > 0
        pixels = [QColor.fromRgb(image.pixel(x, y)) for y in range(r.top(), r.bottom()) for x in range(r.left(),
                                                                                                      r.right())]
        text = max(pixels, key=lambda c: _contrast(c, bg))  # the item's text: the pixel furthest from the list's
        assert _contrast(text, bg) >= 7, (row, text.name(), bg.name())
    combo.hidePopup()


def test_the_memory_bar_shows_its_whole_text(qtbot):
    from types import SimpleNamespace

    from PySide6.QtCore import QObject, Signal

    from app.hardware import HardwareSnapshot
    from app.panels.hardware import HardwarePanel

    class Hardware(QObject):
        sampled = Signal(object)

    ctx = SimpleNamespace(hardware=Hardware(), hardware_snapshot=None)
    panel = HardwarePanel(ctx)
    qtbot.addWidget(panel)
    panel.resize(834, 660)  # what a 1024x700 window leaves the panel
    panel.show()
    snap = HardwareSnapshot(cpu_name="Xeon", cores_physical=2,
                            cores_logical=2, cpu_percent=12.0, ram_used=int(13.5 * 2**30), ram_total=int(23.5 * 2**30),
                            gpus=[], peer_matrix=None, driver=None, gpu_message="No NVIDIA GPU found.")
    ctx.hardware.sampled.emit(snap)
    qtbot.wait(20)
    bar = panel.ram
    assert bar.text() == "13.5 GiB used of 23.5 GiB"
    assert bar.width() >= bar.fontMetrics().horizontalAdvance(bar.text()) + 16, bar.width()


def test_a_small_window_folds_the_sidebar_to_icons(make_window, qtbot):
    from app.window import PANELS, SIDEBAR_NARROW, SIDEBAR_WIDTH

    w = make_window(autoload=False)
    w.resize(1024, 700)
    qtbot.waitUntil(lambda: w.compact, timeout=5_000)
    assert w.width() == 1024  # the full sidebar would keep the window wider than that
    assert w.sidebar.width() == SIDEBAR_NARROW
    assert not w.nav.horizontalScrollBar().isVisible()
    assert [w.nav.item(i).text() for i in range(w.nav.count())] == [""] * len(PANELS)
    assert [w.nav.item(i).toolTip() for i in range(w.nav.count())] == [label for _, label in PANELS]
    assert w.theme_row.isHidden()
    assert w.stack.width() >= 1024 - SIDEBAR_NARROW - 4
    w.resize(1600, 1000)
    qtbot.waitUntil(lambda: not w.compact, timeout=5_000)
    assert w.sidebar.width() == SIDEBAR_WIDTH and w.nav.item(0).text() == "Chat" and not w.theme_row.isHidden()


def test_the_status_bar_says_loading_once(make_window, qtbot):
    w = make_window(autoload=False)
    w._on_load_progress("Loading weights…")
    assert w.engine_label.text() == "Loading weights…"


def test_the_hub_banner_is_under_the_tabs_dismissable_and_points_to_a_local_file(app_env, make_window, qtbot,
                                                                                  monkeypatch):
    import huggingface_hub.constants

    from app.panels.models import HUB, LIBRARY

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    w = make_window(autoload=False)
    w.resize(1024, 700)
    w.show_panel("models")
    models = w.panels["models"]
    models.tabs.setCurrentIndex(HUB)
    tabs_y = models.tabs.geometry().y()
    models.hub_tab.query.setText("qwen")
    qtbot.mouseClick(models.hub_tab.search_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: models.status.objectName() == "errorBox" and models.banner.isVisible(), timeout=10_000)
    text = models.status.text()
    assert "offline mode is on" in text and "Add GGUF file" in text, text
    assert models.add_file_button.isVisible()
    assert models.tabs.geometry().y() == tabs_y  # the tabs stay where they were
    assert models.banner.geometry().top() >= models.tabs.geometry().bottom()
    qtbot.mouseClick(models.dismiss_button, Qt.LeftButton)
    assert not models.banner.isVisible() and models.status.text() == ""
    # the button: the Library, and its file dialog (replaced here: a real one would wait for a person)
    opened = []
    monkeypatch.setattr(models.library_tab, "add_file", lambda: opened.append(True))
    models.show_status("Cannot search the Hub: the Hub is not reachable (no answer).", error=True)
    qtbot.mouseClick(models.add_file_button, Qt.LeftButton)
    assert opened == [True] and models.tabs.currentIndex() == LIBRARY and not models.banner.isVisible()
    models.show_status("Deleted x: freed 1 GB.")  # other messages: no file button
    assert models.banner.isVisible() and not models.add_file_button.isVisible()


def test_every_panel_opens_with_the_panel_option():
    from app.main import build_parser
    from app.window import PANELS

    parser = build_parser()
    for name, _label in PANELS:
        assert parser.parse_args(["--panel", name]).panel == name
    assert parser.parse_args(["--panel", "benchmark"]).panel == "benchmark"
