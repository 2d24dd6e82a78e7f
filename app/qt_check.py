"""Before Qt opens a window on X11: are the system libraries its xcb plugin needs present? If not, say which
Debian/Ubuntu packages to install instead of Qt's "could not load the Qt platform plugin xcb" abort."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

# shared library -> the Debian/Ubuntu package that ships it
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-glx.so.0": "libxcb-glx0",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6",
    "libglib-2.0.so.0": "libglib2.0-0",
}


def missing_libraries(ldd_output: str) -> list[str]:
    """Library names ``ldd`` reports as "not found"."""
    out = []
    for line in ldd_output.splitlines():
        if "not found" in line:
            name = line.strip().split(" ", 1)[0]
            if name not in out:
                out.append(name)
    return out


def install_hint(missing: list[str]) -> str:
    packages = sorted({PACKAGES.get(lib, "") for lib in missing} - {""})
    unknown = [lib for lib in missing if lib not in PACKAGES]
    lines = [("Kestrel cannot open its window: Qt's X11 (xcb) platform plugin needs system libraries that are "
              "missing:"), "  " + ", ".join(missing)]
    if packages:
        lines += ["Install them (Debian/Ubuntu) with:", "  sudo apt-get install -y " + " ".join(packages)]
    if unknown:
        lines.append("Find the packages that provide the others with your distribution's package search.")
    lines.append("Or run without a window: `kestrel serve` (OpenAI-compatible server) or `kestrel chat`.")
    return "\n".join(lines)


def _xcb_libraries() -> list[Path]:
    try:
        import PySide6
    except ImportError:
        return []
    qt = Path(PySide6.__file__).parent / "Qt"
    return [p for p in (qt / "plugins" / "platforms" / "libqxcb.so", qt / "lib" / "libQt6XcbQpa.so.6")
            if p.exists()]


def will_use_xcb() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0].split(";")[0] == "xcb"
    # Qt picks Wayland when a Wayland session is there (its wayland plugin has other needs)
    return bool(os.environ.get("DISPLAY")) and not os.environ.get("WAYLAND_DISPLAY")


def check_xcb() -> str | None:
    """None when fine (or not applicable); else a message saying what to install."""
    if not will_use_xcb():
        return None
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    missing: list[str] = []
    for lib in _xcb_libraries():
        try:
            out = subprocess.run([ldd, str(lib)], check=False, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        missing += [m for m in missing_libraries(out) if m not in missing]
    return install_hint(missing) if missing else None


def check_pyside() -> str | None:
    """PySide6 6.12.0 drops a reference to True on every Signal.emit(); on Python < 3.12 (where True is not
    immortal) the app aborts after some thousands of signals ("bool_dealloc: deallocating True")."""
    try:
        installed = version("PySide6-Essentials")
    except Exception:  # noqa: BLE001 - PySide6 from another distribution: nothing known against it
        return None
    if installed == "6.12.0" and sys.version_info < (3, 12):
        return ("PySide6 6.12.0 has a reference-counting bug that crashes Kestrel on Python "
                f"{sys.version_info.major}.{sys.version_info.minor}. Install another version, e.g.:\n"
                "  pip install 'PySide6-Essentials==6.11.3' 'shiboken6==6.11.3'")
    return None


def check_display() -> str | None:
    """A plain message when there is no display to show a window on (Linux, no platform forced)."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return ("Kestrel needs a graphical session to open its window, and none was found (DISPLAY and "
            "WAYLAND_DISPLAY are unset). On a server, use `kestrel serve` (OpenAI-compatible endpoint) or "
            "`kestrel chat`; to try the window without a screen, run it under `xvfb-run`.")
