"""``python -m tests.support.import_graph``, the command: with no flag it prints the rules' check over the tree and
whether docs/ARCHITECTURE.md's section 6 is current (it raised TypeError, joining Violation objects as strings);
``--map`` prints section 6; a failing check is worded and exits 1."""

from __future__ import annotations

import pytest

from tests.support.import_graph import (
    DOC,
    Allowance,
    doc_section,
    main,
    render_section,
    replace_section,
    report,
    scan,
    sources_from,
)

# engine.core above engine.layers; engine.layers imports engine.core: a higher layer (rule 1)
LAYERS = ((("engine.core",), ""), (("engine.layers",), ""))
UPWARD = {"engine/core/core.py": "X = 1\n", "engine/layers/norm.py": "from engine.core.core import X\n"}


def test_no_flag_prints_the_check_of_the_tree(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "the import rules hold over" in out and "known violations allowed" in out
    assert "section 6 of docs/ARCHITECTURE.md is current" in out


def test_map_prints_section_6(capsys):
    assert main(["--map"]) == 0
    assert capsys.readouterr().out == doc_section(DOC.read_text(encoding="utf-8"))


def test_unknown_flags_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--bogus"])
    assert e.value.code == 2 and "usage: python -m tests.support.import_graph" in capsys.readouterr().err


def test_a_failing_check_is_worded():
    result = scan(sources_from(UPWARD))
    doc = replace_section("## 6. x\n\n## 7. y\n", render_section(result.imports, (), LAYERS))
    lines, ok = report(result, (), doc, LAYERS)
    assert not ok
    assert lines[0] == "1 violation(s) of the import rules in 2 modules:"
    assert "engine.layers.norm" in lines[1] and "engine.core" in lines[1]
    assert lines[-1] == "section 6 of docs/ARCHITECTURE.md is current"

    stale = Allowance("string", ("engine.layers.norm", "<computed>"), "no longer happens")
    lines, ok = report(result, [stale], "no section", LAYERS)
    assert not ok
    assert any("allowances no longer needed" in line for line in lines)
    assert any("string engine.layers.norm / <computed>: no longer happens" in line for line in lines)
    assert lines[-1].startswith("section 6 of docs/ARCHITECTURE.md is out of date: regenerate it with")


def test_a_clean_tree_passes():
    clean = {**UPWARD, "engine/layers/norm.py": "X = 2\n"}
    result = scan(sources_from(clean))
    doc = replace_section("## 6. x\n\n## 7. y\n", render_section(result.imports, (), LAYERS))
    lines, ok = report(result, (), doc, LAYERS)
    assert ok and lines[0] == "the import rules hold over 2 modules (0 known violations allowed)"
