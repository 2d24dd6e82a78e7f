"""Every ``KESTREL_*`` environment variable, in one table: its default, how its text is read, what it means.

Modelled on vLLM's envs.py: ``from engine import envs`` then ``envs.KESTREL_X`` reads os.environ at that
moment (module ``__getattr__``), so a test's ``monkeypatch.setenv`` is seen and nothing is frozen at import.
An unset (or, except for flags, empty) variable gives the default; a default of None means "unset: the
reader picks" (its doc says how). A value that cannot be read raises ValueError naming the variable.

Torch-free, imports nothing of the engine: the app, the installer's checks and the native build may read it.
Some variables are read elsewhere and only listed here (the doc says who): the native module (csrc/),
the native build (csrc/CMakeLists.txt), the installer scripts (installer/*.sh), the app (app/paths.py) and
the test fake engine (tests/server/fake_engine.py). Variables the engine *sets* for child processes
(NCCL_*, GLOO_*, PYTHONPATH, ...) are not in this table.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["ENV_VARS", "describe", "is_set"]


def _flag(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return text

    return parse


def _str(text: str) -> str:
    return text


# name -> (default, parser, doc)
ENV_VARS: dict[str, tuple[Any, Callable[[str], Any], str]] = {
    # -- server ----------------------------------------------------------------------------------------------
    "KESTREL_API_KEY": (
        None, _str,
        ("The API key of `kestrel serve` when --api-key is not given (engine/server/serve.py). Secret: "
         "describe() shows only whether it is set.")),
    # -- app -------------------------------------------------------------------------------------------------
    "KESTREL_DATA_DIR": (
        None, _str,
        ("The app's data directory (conversations, settings, models folder). Unset: the platform's user data "
         "folder. Read by app/paths.py.")),
    # -- build and install (read outside Python) -------------------------------------------------------------
    "KESTREL_CUDA_ARCHS": (
        None, _str,
        ("GPU targets of the native build, e.g. 89 (default: CMake's native detection). Read by the native "
         "build (csrc/CMakeLists.txt).")),
    "KESTREL_DISABLE_CUDA": (
        False, _flag,
        "Build the native module without the CUDA kernels. Read by the native build (csrc/CMakeLists.txt)."),
    "KESTREL_VENV": (
        None, _str,
        ("The virtual environment of the installer scripts (default: .venv in the checkout). Read by "
         "installer/*.sh.")),
    "KESTREL_TORCH_INDEX": (
        None, _str,
        "An extra package index for PyTorch (e.g. its CPU-only index). Read by installer/setup.sh."),
    "KESTREL_BIN_DIR": (
        None, _str,
        ("Where installer/install-desktop.sh links `kestrel` (default: ~/.local/bin); uninstall.sh removes the "
         "link from there.")),
    # -- tests -----------------------------------------------------------------------------------------------
    "KESTREL_TEST_TOKENIZER_DIR": (
        None, _str, ("Tests only: a saved SmolLM2 tokenizer directory the tiny test models use instead of one made "
                     "from the embedded GGUF, for machines without that package (tests/conftest.py, "
                     "scripts/gpu_run.sh).")),
    "KESTREL_FAKE": (
        "", _str,
        ("Behaviour of the test fake engine core: slow, crash_step, load_error, ... Read by "
         "tests/server/fake_engine.py.")),
    "KESTREL_INSTALL_VENV": (
        None, _str,
        ("Tests only: an existing virtualenv for the install tier (tests/install) to set up again with "
         "installer/setup.sh instead of a fresh one (only what changed is redone).")),
    "KESTREL_INSTALL_SHOTS": (
        None, _str,
        "Tests only: where the install tier (tests/install) saves its screenshots (default /tmp/shots/install)."),
}

_SECRET = frozenset({"KESTREL_API_KEY"})


def _read(name: str) -> Any:
    default, parse, _doc = ENV_VARS[name]
    text = os.environ.get(name)
    if text is None or (text == "" and parse is not _flag):
        return default
    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={text!r}: {e}") from None


def __getattr__(name: str) -> Any:
    if name in ENV_VARS:
        return _read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *ENV_VARS])


def is_set(name: str) -> bool:
    """Whether the variable is in the environment (even empty)."""
    if name not in ENV_VARS:
        raise KeyError(name)
    return name in os.environ


def describe(only_set: bool = False) -> dict[str, dict[str, Any]]:
    """The variables with their current values, for reports: name -> {value, default, set, doc}.
    ``only_set`` keeps those present in the environment. A secret's value reads "<set>"; a value that
    cannot be read is reported as its text with an "error"."""
    out: dict[str, dict[str, Any]] = {}
    for name, (default, _parse, doc) in ENV_VARS.items():
        present = name in os.environ
        if only_set and not present:
            continue
        error = None
        try:
            value = _read(name)
        except ValueError as e:
            value, error = os.environ[name], str(e)
        if name in _SECRET and present:
            value = "<set>"
        row: dict[str, Any] = {"value": value, "default": default, "set": present, "doc": doc}
        if error:
            row["error"] = error
        out[name] = row
    return out
