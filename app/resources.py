"""Icons and the stylesheet from the repository's resources/ folder (absent resources degrade to Qt's
defaults, never to an error)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "resources"


def path(name: str) -> Path:
    return ROOT / name


@cache
def icon(name: str):
    from PySide6.QtGui import QIcon

    p = ROOT / "icons" / f"{name}.svg"
    return QIcon(str(p)) if p.is_file() else QIcon()


def stylesheet() -> str:
    p = ROOT / "style.qss"
    if not p.is_file():
        return ""
    return p.read_text().replace("@ICONS@", (ROOT / "icons").as_posix())
