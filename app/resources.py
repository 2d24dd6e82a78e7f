"""Icons and files from the repository's resources/ folder (absent resources degrade to Qt's defaults, never
to an error). The stylesheet is a per-theme template: app/theme.py fills it."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "resources"


def path(name: str) -> Path:
    return ROOT / name


@cache
def icon(name: str):
    # path() serves Qt-free callers: Qt only for an icon
    from PySide6.QtGui import QIcon

    p = ROOT / "icons" / f"{name}.svg"
    return QIcon(str(p)) if p.is_file() else QIcon()
