"""engine/envs.py: one table of the KESTREL_* variables, read at access time; and the comm strategy names,
defined once (engine/config.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import envs

ROOT = Path(__file__).resolve().parents[2]

# where a variable is read (or set for a child, or documented as settable) in each kind of file
READS = {
    ".py": re.compile(r"""(?:environ(?:\.get)?\(?\[?|setenv\(|delenv\(|envs\.)["']?(KESTREL_[A-Z0-9_]+)"""),
    ".cpp": re.compile(r"""getenv\("(KESTREL_[A-Z0-9_]+)"\)"""),
    ".cu": re.compile(r"""getenv\("(KESTREL_[A-Z0-9_]+)"\)"""),
    ".txt": re.compile(r"""\$ENV\{(KESTREL_[A-Z0-9_]+)\}"""),
    ".sh": re.compile(r"""\$\{(KESTREL_[A-Z0-9_]+)"""),
}


def _sources():
    for top in ("engine", "app", "scripts", "installer", "csrc", "tests"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in READS and path.is_file() and path.name not in ("envs.py", "test_envs.py"):
                yield path


def test_every_variable_read_anywhere_is_in_the_table():
    found: dict[str, str] = {}
    for path in _sources():
        for name in READS[path.suffix].findall(path.read_text(errors="replace")):
            found.setdefault(name, str(path.relative_to(ROOT)))
    assert found, "the scan found nothing: the patterns are wrong"
    missing = {n: where for n, where in found.items() if n not in envs.ENV_VARS}
    assert not missing, f"read but not listed in engine/envs.py: {missing}"


def test_the_engine_reads_its_variables_through_envs():
    get = re.compile(r"""environ\.get\(["']KESTREL_""")
    index = re.compile(r"""environ\[["']KESTREL_\w+["']\](?!\s*=[^=])""")  # a read, not an assignment
    offenders = []
    for path in (ROOT / "engine").rglob("*.py"):
        if path.name == "envs.py" or "ops" in path.relative_to(ROOT / "engine").parts[:1]:
            continue  # engine/ops switches itself
        for line in path.read_text().splitlines():
            if get.search(line) or index.search(line):
                offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert not offenders


def _test_variables(monkeypatch):
    """Entries of each kind of parser (int, flag, float) for the mechanism's tests: the table no longer has an int
    or float variable of its own (the comm tuning ones became engine/parallel/comm/config.py's CommConfig)."""
    flag = envs.ENV_VARS["KESTREL_DISABLE_CUDA"][1]
    monkeypatch.setitem(envs.ENV_VARS, "KESTREL_TEST_INT", (256, int, "an int for the test"))
    monkeypatch.setitem(envs.ENV_VARS, "KESTREL_TEST_FLAG", (True, flag, "a flag for the test"))
    monkeypatch.setitem(envs.ENV_VARS, "KESTREL_TEST_FLOAT", (300.0, float, "a float for the test"))


def test_read_at_access_time(monkeypatch):
    _test_variables(monkeypatch)
    monkeypatch.delenv("KESTREL_TEST_INT", raising=False)
    assert envs.KESTREL_TEST_INT == 256
    monkeypatch.setenv("KESTREL_TEST_INT", "2")
    assert envs.KESTREL_TEST_INT == 2
    monkeypatch.setenv("KESTREL_TEST_INT", "")  # empty: the default
    assert envs.KESTREL_TEST_INT == 256
    for text, value in (("1", True), ("0", False), ("", False), ("false", False), ("yes", True)):
        monkeypatch.setenv("KESTREL_TEST_FLAG", text)
        assert envs.KESTREL_TEST_FLAG is value, text
    monkeypatch.delenv("KESTREL_TEST_FLAG")
    assert envs.KESTREL_TEST_FLAG is True
    monkeypatch.setenv("KESTREL_TEST_INT", "fast")
    with pytest.raises(ValueError, match="KESTREL_TEST_INT"):
        _ = envs.KESTREL_TEST_INT
    with pytest.raises(AttributeError):
        _ = envs.KESTREL_NO_SUCH_THING


def test_describe_reports_values_and_hides_the_key(monkeypatch):
    _test_variables(monkeypatch)
    monkeypatch.setenv("KESTREL_API_KEY", "s3cret")
    monkeypatch.setenv("KESTREL_TEST_FLOAT", "12.5")
    monkeypatch.setenv("KESTREL_TEST_INT", "many")
    monkeypatch.delenv("KESTREL_FAKE", raising=False)
    table = envs.describe()
    assert list(table) == list(envs.ENV_VARS)
    assert all(row["doc"] for row in table.values())
    assert table["KESTREL_TEST_FLOAT"]["value"] == 12.5 and table["KESTREL_TEST_FLOAT"]["set"]
    assert table["KESTREL_FAKE"] == {**table["KESTREL_FAKE"], "value": "", "set": False}
    assert table["KESTREL_API_KEY"]["value"] == "<set>" and "s3cret" not in repr(table)
    assert "error" in table["KESTREL_TEST_INT"]
    assert "KESTREL_FAKE" not in envs.describe(only_set=True)


def test_envs_and_the_strategy_names_import_without_torch():
    code = ("import sys; from engine import envs, capabilities, config; envs.describe(); "
            "capabilities.capabilities(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_comm_strategy_names_are_defined_once():
    from engine.capabilities import capabilities
    from engine.config import COMM_STRATEGIES, EngineConfig
    from engine.parallel.comm.group import STRATEGIES

    assert STRATEGIES is COMM_STRATEGIES
    assert capabilities()["comm_strategies"] == list(COMM_STRATEGIES)
    field = next(f for f in EngineConfig.__dataclass_fields__.values() if f.name == "comm_strategy")
    assert field.metadata["choices"] == list(COMM_STRATEGIES) and field.default in COMM_STRATEGIES
