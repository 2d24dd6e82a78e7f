"""docs/ARCHITECTURE.md names only what exists: every repository path in backticks is a file or folder, and every
name in backticks (a module, class, function, constant, variable) is written somewhere in the tree. A rename or a
deletion that leaves the map behind fails here with the names to fix. (Section 6 is generated and checked by
tests/unit/test_import_graph.py.) Read as text: nothing is imported."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
TREES = ("engine", "app", "tests", "csrc", "scripts", "benchmarks", "installer", "resources", ".ci")
SUFFIXES = (".py", ".cpp", ".h", ".cu", ".cuh", ".sh", ".txt", ".toml", ".qss", ".json", ".cfg")
ROOTS = ("engine", "app", "tests", "csrc", "scripts", "benchmarks", "installer", "resources", "docs")
# names the map uses that the tree does not define: other projects' (torch, Qt)
EXTERNAL = frozenset({"TorchDispatchMode"})


def _paths(text: str) -> set[str]:
    found = set()
    for p in re.findall(r"`((?:%s)/[\w./{},*-]*)" % "|".join(ROOTS), text):
        p = p.split(":")[0].rstrip(".,")
        m = re.search(r"\{([^}]*)\}", p)
        found.update(p[: m.start()] + alt + p[m.end():] for alt in m.group(1).split(",")) if m else found.add(p)
    return {p for p in found if "*" not in p}


def _names(text: str) -> set[str]:
    return {name for name in re.findall(r"`([A-Za-z_][\w.]*)(?:\(\))?`", text)
            if "/" not in name and len(name.split(".")[-1]) >= 3}


def _tree_text() -> str:
    parts = [(ROOT / "pyproject.toml").read_text(encoding="utf-8")]
    for top in TREES:
        for path in (ROOT / top).rglob("*"):
            if path.suffix in SUFFIXES and path.is_file():
                parts.append(path.read_text(encoding="utf-8", errors="ignore"))
    return "\n".join(parts)


def test_every_path_the_map_names_exists():
    missing = sorted(p for p in _paths(DOC.read_text(encoding="utf-8")) if not (ROOT / p).exists())
    assert not missing, "docs/ARCHITECTURE.md names paths that do not exist:\n" + "\n".join(missing)


def test_every_name_the_map_names_is_in_the_tree():
    tree = set(re.findall(r"\w+", _tree_text()))
    missing = sorted(n for n in _names(DOC.read_text(encoding="utf-8"))
                     if n.split(".")[-1] not in tree and n not in EXTERNAL)
    assert not missing, "docs/ARCHITECTURE.md names what the tree no longer has:\n" + "\n".join(missing)


def test_every_variable_the_map_names_is_in_envs():
    """Every KESTREL_* variable the map names is one engine/envs.py lists (the rest became configuration)."""
    table = set(re.findall(r"\"(KESTREL_\w+)\"", (ROOT / "engine" / "envs.py").read_text(encoding="utf-8")))
    named = set(re.findall(r"KESTREL_[A-Z0-9_]*[A-Z0-9]", DOC.read_text(encoding="utf-8")))
    missing = sorted(named - table - {"KESTREL_X"})  # KESTREL_X: the table's placeholder in the text
    assert not missing, "docs/ARCHITECTURE.md names variables engine/envs.py no longer has:\n" + "\n".join(missing)


def test_the_checks_catch_a_stale_name_and_path():
    text = "see `engine/no_such_module.py` and `Scheduler.no_such_method` and `engine/ops/{gemm,nope}.py`"
    assert _paths(text) == {"engine/no_such_module.py", "engine/ops/gemm.py", "engine/ops/nope.py"}
    assert "Scheduler.no_such_method" in _names(text)
    tree = set(re.findall(r"\w+", "class Scheduler: def schedule(self): pass"))
    assert [n for n in _names(text) if n.split(".")[-1] not in tree] == ["Scheduler.no_such_method"]
