"""Light and dark themes. One style sheet template (resources/style.qss, ``@name@`` placeholders) filled with
a theme's colours (resources/themes/<name>.json), a QPalette from the same colours (what the style sheet does
not reach: scroll bars, rich text links, the placeholder text), and the Pygments style of code blocks.

The choice is a preference in the store (``Store.pref("theme")``): "system" (the default) follows the desktop's
colour scheme, ``QStyleHints.colorScheme()`` (Qt 6.5+) and its ``colorSchemeChanged``; "light" and "dark"
override it. ``ThemeManager`` applies the choice to the QApplication and emits ``changed`` with the theme."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette

from app import resources

SYSTEM, LIGHT, DARK = "system", "light", "dark"
CHOICES = {SYSTEM: "System", LIGHT: "Light", DARK: "Dark"}  # the setting's values and labels
PREF_KEY = "theme"
_TOKEN = re.compile(r"@([a-z_]+)@")


@dataclass(frozen=True)
class Theme:
    name: str
    dark: bool
    colors: dict[str, str] = field(hash=False, compare=False)
    pygments_style: str = "default"
    icons: str = ""  # folder of the style sheet's icons (chevrons, check mark)

    def __getitem__(self, key: str) -> str:
        return self.colors[key]


@cache
def load(name: str) -> Theme:
    """The theme ``name`` ("light" or "dark") from resources/themes/<name>.json."""
    p = resources.path("themes") / f"{name}.json"
    data = json.loads(p.read_text())
    icons = (p.parent / data.get("icons", "../icons")).resolve()
    return Theme(name=data["name"], dark=bool(data["dark"]), colors=dict(data["colors"]),
                 pygments_style=data.get("pygments_style", "default"), icons=icons.as_posix())


def template() -> str:
    p = resources.path("style.qss")
    return p.read_text() if p.is_file() else ""


def stylesheet(theme: Theme) -> str:
    """The style sheet with ``theme``'s colours; an unknown placeholder raises KeyError (a test checks every
    placeholder of the template against both themes)."""
    text = template().replace("@ICONS@", theme.icons).replace("@SIDEBAR_ICONS@", load(DARK).icons)
    return _TOKEN.sub(lambda m: theme.colors[m.group(1)], text)


def placeholders() -> set[str]:
    return set(_TOKEN.findall(template()))


def palette(theme: Theme) -> QPalette:
    c = {k: QColor(v) for k, v in theme.colors.items() if v.startswith("#")}
    p = QPalette()
    roles = {
        QPalette.Window: c["window"], QPalette.WindowText: c["text"], QPalette.Base: c["surface"],
        QPalette.AlternateBase: c["alt_bg"], QPalette.Text: c["text"], QPalette.Button: c["surface"],
        QPalette.ButtonText: c["text"], QPalette.BrightText: c["on_accent"], QPalette.Highlight: c["selection_bg"],
        QPalette.HighlightedText: c["text"], QPalette.ToolTipBase: c["surface"], QPalette.ToolTipText: c["text"],
        QPalette.PlaceholderText: c["muted"], QPalette.Link: c["link"], QPalette.LinkVisited: c["link"],
        QPalette.Light: c["surface"], QPalette.Midlight: c["border"], QPalette.Mid: c["border_strong"],
        QPalette.Dark: c["muted"], QPalette.Shadow: QColor("#000000"),
    }
    for role, color in roles.items():
        p.setColor(QPalette.All, role, color)
    for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
        p.setColor(QPalette.Disabled, role, c["disabled_text"])
    p.setColor(QPalette.Disabled, QPalette.Base, c["subtle"])
    p.setColor(QPalette.Disabled, QPalette.Button, c["disabled_bg"])
    return p


def system_scheme() -> str:
    """The desktop's colour scheme as "light" or "dark" (light when Qt cannot tell)."""
    app = QGuiApplication.instance()
    if app is None:
        return LIGHT
    hints = QGuiApplication.styleHints()
    scheme = hints.colorScheme() if hasattr(hints, "colorScheme") else None
    return DARK if scheme == Qt.ColorScheme.Dark else LIGHT


def resolve(choice: str, system: str | None = None) -> Theme:
    """The theme a setting means: "light", "dark", or "system" (the desktop's scheme, ``system`` if given)."""
    if choice not in (LIGHT, DARK):
        choice = system or system_scheme()
    return load(choice)


_current: Theme | None = None


def current() -> Theme:
    """The theme last applied (light before any)."""
    return _current or load(LIGHT)


def apply(app, theme: Theme) -> None:
    """Give ``app`` the theme's palette and style sheet (nothing to do when it has them already)."""
    global _current
    qss = stylesheet(theme)
    changed = _current is None or _current.name != theme.name
    _current = theme
    if changed or app.palette().color(QPalette.Window) != QColor(theme["window"]):
        app.setPalette(palette(theme))
    if app.styleSheet() != qss:
        app.setStyleSheet(qss)


class ThemeManager(QObject):
    """The theme setting of one store, applied to the application; follows the system while it is "system"."""

    changed = Signal(object)  # Theme

    def __init__(self, store, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        choice = store.pref(PREF_KEY, SYSTEM)
        self._choice = choice if choice in CHOICES else SYSTEM
        self._system: str | None = None  # the scheme last reported by the system (None: ask Qt)
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            hints.colorSchemeChanged.connect(self.on_system_scheme_changed)
        self.apply()

    @property
    def choice(self) -> str:
        return self._choice

    @property
    def theme(self) -> Theme:
        return resolve(self._choice, self._system)

    def set_choice(self, choice: str) -> None:
        """Set and keep the setting ("system", "light" or "dark"), and apply it."""
        if choice not in CHOICES:
            raise ValueError(f"unknown theme {choice!r}")
        self._choice = choice
        self.store.set_pref(PREF_KEY, choice)
        self.apply()

    def on_system_scheme_changed(self, scheme) -> None:
        self._system = DARK if scheme == Qt.ColorScheme.Dark else LIGHT
        if self._choice == SYSTEM:
            self.apply()

    def apply(self) -> None:
        theme = self.theme
        before = current().name if _current is not None else None
        apply(QGuiApplication.instance(), theme)
        if before != theme.name:
            self.changed.emit(theme)

    def disconnect_system(self) -> None:
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            try:
                hints.colorSchemeChanged.disconnect(self.on_system_scheme_changed)
            except (RuntimeError, TypeError):
                pass
