"""The Hugging Face token for gated models: in the OS keyring where one works (the optional ``keyring``
package with a real backend), else in a file only the user can read (mode 0600) in the app's data folder."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from app.paths import token_file

SERVICE = "kestrel"
USERNAME = "huggingface-token"


def _keyring():
    """The keyring module if it has a usable backend, else None."""
    try:
        # ~70 ms and a system keyring's D-Bus: only when a token is read or saved
        import keyring
        from keyring.backends import fail
    except Exception:  # noqa: BLE001 - not installed, or broken on this desktop
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(backend, fail.Keyring) or "fail" in type(backend).__module__ or "null" in type(backend).__module__:
        return None
    return keyring


def storage_kind() -> str:
    return "the OS keyring" if _keyring() is not None else f"a private file ({token_file()}, mode 0600)"


def get_token() -> str | None:
    kr = _keyring()
    if kr is not None:
        with contextlib.suppress(Exception):  # a locked or failing keyring: fall back to the file
            value = kr.get_password(SERVICE, USERNAME)
            if value:
                return value
    path = token_file()
    if path.is_file():
        value = path.read_text().strip()
        return value or None
    return None


def set_token(token: str) -> str:
    """Store the token; returns where it went."""
    token = token.strip()
    kr = _keyring()
    if kr is not None:
        with contextlib.suppress(Exception):  # a failing keyring: the file instead
            kr.set_password(SERVICE, USERNAME, token)
            _remove(token_file())
            return "the OS keyring"
    _write_private(token_file(), token)
    return f"a private file ({token_file()})"


def clear_token() -> None:
    kr = _keyring()
    if kr is not None:
        with contextlib.suppress(Exception):  # nothing stored
            kr.delete_password(SERVICE, USERNAME)
    _remove(token_file())


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
