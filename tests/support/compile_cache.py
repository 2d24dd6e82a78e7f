"""A cache of compiler runs that succeeded, for tests that only check that sources compile
(tests/unit/test_cuda_compiles.py: nvcc for three architectures, ~185 s of a CI run on two cores).

A run's key is the SHA-256 of everything its result depends on: the compiler's identity (``--version``), the
command line (the output path left out), and the bytes of every file that can reach the compilation: the source
and the closure of its quoted ``#include``s (resolved beside the including file, then in the include folders;
angle-bracket and unresolved includes are the toolkit's and the system's, covered by the compiler's identity). A run
whose key is stored succeeded before with exactly these inputs, so its outputs are copied back instead of being
compiled again; a run that fails is never stored and fails again next time. The cache lives in
``~/.cache/kestrel-compile-cache`` (``$XDG_CACHE_HOME`` honoured); delete it to compile everything again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kestrel-compile-cache"


def compiler_identity(compiler: str) -> str:
    """The compiler's ``--version`` text: a new compiler is a new key."""
    proc = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=120)
    return f"{compiler}\n{proc.returncode}\n{proc.stdout}{proc.stderr}"


def include_closure(source: Path, include_dirs: list[Path]) -> list[Path]:
    """``source`` and every file its quoted ``#include``s reach, transitively (each looked up beside the file that
    includes it, then in ``include_dirs``, as the compiler does)."""
    seen: list[Path] = []
    todo = [source.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for name in INCLUDE.findall(path.read_text(errors="replace")):
            for folder in (path.parent, *include_dirs):
                found = (folder / name).resolve()
                if found.is_file():
                    todo.append(found)
                    break
    return sorted(seen)


def run_key(identity: str, command: list[str], inputs: list[Path], root: Path) -> str:
    """The key of one compiler run: its compiler, its command line (without the output path) and its inputs' bytes.
    Paths are taken relative to ``root`` (the checkout), so a checkout elsewhere with the same files hits."""
    h = hashlib.sha256()
    h.update(identity.encode())
    h.update(b"\0".join(arg.replace(str(root), "<root>").encode() for arg in command))
    for path in sorted(set(inputs)):
        h.update(b"\0file\0" + str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def restore(key: str, out: Path | None) -> bool:
    """True where a run with this key succeeded before; its output (if any) is copied to ``out``."""
    entry = cache_root() / key
    if not (entry / "ok").is_file():
        return False
    if out is not None:
        stored = entry / "output"
        if not stored.is_file():
            return False
        shutil.copyfile(stored, out)
    return True


def store(key: str, out: Path | None) -> None:
    """Record a successful run (and its output file), atomically: a half-written entry is never read."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
    try:
        if out is not None:
            shutil.copyfile(out, tmp / "output")
        (tmp / "ok").write_text("")
        os.replace(tmp, root / key)
    except OSError:  # another run stored the same key first: its entry stands
        shutil.rmtree(tmp, ignore_errors=True)
