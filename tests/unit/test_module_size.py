"""No Python module of the product or its lab over MAX_LINES lines (issue 46: small modules with one concern; a
file that grows past the limit is cut at a seam, not allowed a little more). Counts lines as ``wc -l`` does, in
every .py file under engine/, app/ and benchmarks/ (tests are not held to it). Read as text: nothing is imported."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("engine", "app", "benchmarks")
MAX_LINES = 550


def oversized(root: Path, trees=TREES, most: int = MAX_LINES) -> list[str]:
    """'path: N lines' for each .py file under ``trees`` of ``root`` longer than ``most`` lines, longest first."""
    found = []
    for top in trees:
        for path in (root / top).rglob("*.py"):
            n = path.read_bytes().count(b"\n")
            if n > most:
                found.append((n, path.relative_to(root).as_posix()))
    return [f"{p}: {n} lines" for n, p in sorted(found, reverse=True)]


def test_no_module_over_the_limit():
    over = oversized(ROOT)
    assert not over, (f"modules over {MAX_LINES} lines (move one concern into a module of its own):\n  "
                      + "\n  ".join(over))


def test_the_count_names_every_module_over_the_limit(tmp_path):
    (tmp_path / "engine" / "deep").mkdir(parents=True)
    (tmp_path / "app").mkdir()
    (tmp_path / "engine" / "deep" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "engine" / "at_limit.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "app" / "longer.py").write_text("x = 1\n" * (MAX_LINES + 9))
    (tmp_path / "app" / "notes.txt").write_text("x\n" * 2 * MAX_LINES)
    assert oversized(tmp_path) == [f"app/longer.py: {MAX_LINES + 9} lines",
                                   f"engine/deep/long.py: {MAX_LINES + 1} lines"]
