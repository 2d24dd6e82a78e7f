"""Where the app keeps things: user data (conversations, settings, the models folder) under platformdirs
locations, models in the Hugging Face cache so other tools share them. ``KESTREL_DATA_DIR`` overrides the
data directory (tests, portable installs)."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_data_path

APP_NAME = "kestrel"


def data_dir() -> Path:
    override = os.environ.get("KESTREL_DATA_DIR")
    if override:
        path = Path(override).expanduser()
    else:
        path = user_data_path(APP_NAME, appauthor=False)
    path.mkdir(parents=True, exist_ok=True)
    return path


def db_path() -> Path:
    return data_dir() / "kestrel.sqlite3"


def models_dir() -> Path:
    """The app's own models folder: GGUF files and model directories dropped here show up in the library."""
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def token_file() -> Path:
    return data_dir() / "hf_token"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, resolved the way huggingface_hub does (read at call time, so a changed
    HF_HUB_CACHE / HF_HOME takes effect without restarting)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def hf_endpoint() -> str | None:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    value = os.environ.get("HF_ENDPOINT")
    return value.rstrip("/") if value else None
