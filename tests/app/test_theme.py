"""Light and dark themes (app.theme): one style sheet template filled per theme, the palette, the setting
(System/Light/Dark) kept in the store, and "System" following the desktop's colour scheme."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette

from app import resources, theme
from app.store import Store


@pytest.fixture(autouse=True)
def back_to_light(qapp):
    yield
    theme.apply(qapp, theme.load(theme.LIGHT))


def test_both_themes_fill_every_placeholder():
    light, dark = theme.load(theme.LIGHT), theme.load(theme.DARK)
    assert set(light.colors) == set(dark.colors)
    assert theme.placeholders() <= set(light.colors)
    for t in (light, dark):
        qss = theme.stylesheet(t)
        assert "@" not in qss  # every placeholder and @ICONS@ replaced
        for icon in ("chevron-up.svg", "chevron-down.svg", "chevron-up-disabled.svg", "chevron-down-disabled.svg",
                     "check.svg"):
            assert f"{t.icons}/{icon}" in qss and (Path(t.icons) / icon).is_file()
    assert light.dark is False and dark.dark is True
    assert theme.stylesheet(light) != theme.stylesheet(dark)
    for name in ("light", "dark"):
        data = json.loads((resources.path("themes") / f"{name}.json").read_text())
        assert data["name"] == name


def _window_colour(qapp) -> str:
    return qapp.palette().color(QPalette.Window).name()


def test_setting_switches_and_persists(tmp_path, qapp):
    store = Store(tmp_path / "k.db")
    m = theme.ThemeManager(store)
    seen = []
    m.changed.connect(lambda t: seen.append(t.name))
    m.on_system_scheme_changed(Qt.ColorScheme.Light)
    m.set_choice(theme.DARK)
    dark = theme.load(theme.DARK)
    assert store.pref(theme.PREF_KEY) == "dark"
    assert qapp.styleSheet() == theme.stylesheet(dark)
    assert _window_colour(qapp) == QColor(dark["window"]).name()
    assert theme.current() is dark and seen[-1] == "dark"
    m.set_choice(theme.LIGHT)
    light = theme.load(theme.LIGHT)
    assert qapp.styleSheet() == theme.stylesheet(light) and _window_colour(qapp) == QColor(light["window"]).name()
    m.set_choice(theme.DARK)
    m.disconnect_system()
    again = theme.ThemeManager(store)  # a restart: the saved setting
    assert again.choice == "dark" and theme.current().name == "dark"
    again.disconnect_system()
    with pytest.raises(ValueError):
        again.set_choice("purple")
    store.close()


def test_system_scheme_is_followed_until_overridden(tmp_path, qapp):
    store = Store(tmp_path / "k.db")
    m = theme.ThemeManager(store)
    assert m.choice == theme.SYSTEM
    m.on_system_scheme_changed(Qt.ColorScheme.Dark)  # the desktop turns dark
    assert theme.current().name == "dark" and qapp.styleSheet() == theme.stylesheet(theme.load("dark"))
    m.on_system_scheme_changed(Qt.ColorScheme.Light)
    assert theme.current().name == "light"
    assert _window_colour(qapp) == QColor(theme.load("light")["window"]).name()
    m.set_choice(theme.LIGHT)  # the override wins over the desktop
    m.on_system_scheme_changed(Qt.ColorScheme.Dark)
    assert theme.current().name == "light"
    m.set_choice(theme.SYSTEM)  # back to following: the desktop is dark now
    assert theme.current().name == "dark"
    m.disconnect_system()
    store.close()


def test_system_scheme_signal_from_qt(tmp_path, qapp):
    """Qt's own signal reaches the manager (QStyleHints.colorSchemeChanged, Qt 6.5+)."""
    hints = qapp.styleHints()
    if not hasattr(hints, "colorSchemeChanged"):
        pytest.skip("Qt without colorSchemeChanged")
    store = Store(tmp_path / "k.db")
    m = theme.ThemeManager(store)
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert theme.current().name == "dark"
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert theme.current().name == "light"
    m.disconnect_system()
    store.close()


def test_window_theme_choice(make_window, qtbot, qapp):
    w = make_window(autoload=False)
    combo = w.theme_choice
    assert combo.currentData() == theme.SYSTEM
    combo.setCurrentIndex(combo.findData(theme.DARK))
    assert theme.current().name == "dark" and w.ctx.store.pref(theme.PREF_KEY) == "dark"
    assert qapp.styleSheet() == theme.stylesheet(theme.load("dark"))
    combo.setCurrentIndex(combo.findData(theme.LIGHT))
    assert theme.current().name == "light" and w.ctx.store.pref(theme.PREF_KEY) == "light"
    assert [combo.itemData(i) for i in range(combo.count())] == list(theme.CHOICES)


def test_plots_follow_the_theme(make_window, qapp):
    """The Performance and Hardware plots (pyqtgraph paints its own colours) switch with the theme: background,
    axis text, titles and legends."""
    w = make_window(autoload=False)
    perf, hw = w.panels["performance"], w.panels["hardware"]
    w.theme.set_choice(theme.LIGHT)
    light, dark = theme.load("light"), theme.load("dark")
    views = [perf.plots, hw.host_plots, hw.gpu_plots]
    assert [v.backgroundBrush().color().name() for v in views] == [light["surface"]] * 3
    w.theme.set_choice(theme.DARK)
    assert [v.backgroundBrush().color().name() for v in views] == [dark["surface"]] * 3
    assert perf.p_ttft.getAxis("left").textPen().color().name() == dark["text_secondary"]
    assert hw.p_cpu.getAxis("bottom").textPen().color().name() == dark["text_secondary"]
    assert perf.p_ttft.titleLabel.opts["color"] == dark["text"]
    assert all(label.opts["color"] == dark["text"] for _, label in perf.p_ttft.legend.items)
    assert hw.p_gpu_util.legend.opts["brush"].color().name() == dark["surface"]
    w.theme.set_choice(theme.LIGHT)
    assert perf.plots.backgroundBrush().color().name() == light["surface"]
    assert perf.p_ttft.getAxis("left").textPen().color().name() == light["text_secondary"]


@pytest.mark.parametrize("name", [theme.DARK, theme.LIGHT])
def test_checked_radio_buttons_and_check_boxes_stand_out(qapp, qtbot, name):
    """Issue 45 (first-day polish): in the dark theme a checked radio button (Benchmark's "Local server") was a
    small grey dot on dark grey, hard to tell from an unchecked one. A checked indicator is filled with the
    accent colour in both themes, an unchecked one is not."""
    from PySide6.QtWidgets import QCheckBox, QRadioButton, QVBoxLayout, QWidget

    th = theme.load(name)
    theme.apply(qapp, th)
    accent = QColor(th["accent"])

    def accent_pixels(w) -> int:
        img = w.grab().toImage()
        n = 0
        for y in range(img.height()):
            for x in range(min(img.width(), 24)):  # the indicator, left of the text
                c = img.pixelColor(x, y)
                if abs(c.red() - accent.red()) + abs(c.green() - accent.green()) + abs(c.blue() - accent.blue()) < 40:
                    n += 1
        return n

    box = QWidget()
    lay = QVBoxLayout(box)
    on, off = QRadioButton("Local server"), QRadioButton("Other endpoint")
    tick, no_tick = QCheckBox("Checked"), QCheckBox("Not checked")
    for w in (on, off, tick, no_tick):
        lay.addWidget(w)
    on.setChecked(True)
    tick.setChecked(True)
    qtbot.addWidget(box)
    box.show()
    qtbot.waitExposed(box)
    assert accent_pixels(on) >= 60, "a checked radio button shows the accent colour"
    assert accent_pixels(off) == 0
    assert accent_pixels(tick) >= 60 and accent_pixels(no_tick) == 0
