"""The frameworks tier's scratch virtualenv: openai-agents, LangChain (with langchain-openai) and pydantic-ai, pinned
to the versions these tests were run with, installed from PyPI by one ``pip install`` into a directory outside the
repository (``~/.cache/kestrel-frameworks-venv/<key of the pins>``), so the project's own dependencies stay lean.

    python -m tests.frameworks.venv          # build it (or say where it is); prints the seconds it took

``tests/frameworks/conftest.py`` builds it when CI=true and skips the tier when it is absent otherwise."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

PINS = ("openai-agents==0.25.0", "langchain==1.5.2", "langchain-openai==1.8.1", "pydantic-ai-slim[openai]==2.78.0")
IMPORTS = ("agents", "langchain.agents", "langchain_openai", "pydantic_ai")


def venv_dir() -> Path:
    key = hashlib.sha256("\n".join((sys.version.split()[0], *PINS)).encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "kestrel-frameworks-venv" / key


def python() -> Path:
    return venv_dir() / "bin" / "python"


def ready() -> bool:
    """The venv exists and imports the four packages (a half-built one does not count)."""
    py = python()
    if not py.exists() or not (venv_dir() / ".complete").exists():
        return False
    probe = subprocess.run([str(py), "-c", "import " + ", ".join(IMPORTS)], capture_output=True, timeout=300)
    return probe.returncode == 0


def build() -> float:
    """Makes the venv with one ``pip install`` of the pins; returns the seconds it took (0 when it was there)."""
    if ready():
        return 0.0
    start = time.monotonic()
    d = venv_dir()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(d)], check=True)
    subprocess.run([str(python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS], check=True)
    (d / ".complete").write_text("\n".join(PINS) + "\n")
    return time.monotonic() - start


if __name__ == "__main__":
    took = build()
    print(f"{venv_dir()} ready ({took:.0f} s)" if took else f"{venv_dir()} was ready")
