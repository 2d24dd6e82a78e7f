"""The packages' import graph (tests/support/import_graph.py reads it with ``ast``; nothing is imported): the
layers are ``LAYERS`` there, one line per package, top to bottom. The rules: (1) no import of a higher layer
(engine never imports app), (2) no package cycle, (3) no file circle, (4) no private-name import across
modules, (5) no private attribute read across modules, (6) no string import of our modules. Every import counts:
module-level, inside functions, under ``TYPE_CHECKING``, and ``importlib`` calls and "module:callable" strings.

Each rule is shown catching a mutation of a copy of the real tree (tmp_path), and docs/ARCHITECTURE.md's
section 6 is rendered from the same tables (``python -m tests.support.import_graph --write`` regenerates it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.import_graph import (
    DOC,
    LAYERS,
    REGENERATE,
    ROOT,
    Allowance,
    Violation,
    check,
    doc_section,
    file_circles,
    layer_of,
    package_cycles,
    package_of,
    private_name_imports,
    render_section,
    scan,
    scan_tree,
    sources_from,
    stale_allowances,
    upward_imports,
)

# Violations present today, each allowed while its owner (another part of issue 46, working now) removes it.
# test_allowances_are_still_needed fails once one no longer occurs: delete its line then.
ALLOWED: tuple[Allowance, ...] = (
    # The chat and Load panels being cut at their seams (new modules that wire the panel's private slots and
    # timers, `panel._x` / `f._owner`); the GUI part gives them public names or keeps the wiring in the panel.
    Allowance("attribute", ("app.panels.chat_view", "*"), "chat_view reads ChatPanel's privates; the GUI part"),
    Allowance("attribute", ("app.panels.load_options", "*"), "load_options reads the form's _owner; the GUI part"),
    # Processes started by name: the parent names a "module:callable" (seen as an edge of the graph: it is a
    # string literal where it is written) and the child imports what it was sent. These stay: a callable
    # crossing a process boundary travels as its name.
    Allowance("string", ("engine.core.process", "<computed>"),
              "the engine process builds its core from --core-factory (tests pass their stand-in core)"),
    Allowance("string", ("engine.executor.worker", "<computed>"),
              "a TP worker builds its checkpoint from the executor's tp_factory (benchmarks' random weights)"),
    Allowance("string", ("engine.bench.comm_group", "<computed>"),
              "a comm group's rank runs the target its parent names (run_group)"),
)

# the part that fixes the Tokenizer <-> Loader cycle is this one (engine/tokenizer/gguf_vocab.py no longer
# opens GGUF files itself): no allowance.


@pytest.fixture(scope="module")
def real():
    return scan(scan_tree())


def _report(errors: list[Violation]) -> str:
    return f"{len(errors)} violation(s):\n" + "\n".join(map(str, errors))


# --- the tree as it is ------------------------------------------------------------------------------------------

def test_the_scan_sees_the_graph(real):
    modules = {s.module for s in real.sources}
    assert {"engine", "engine.core.core", "engine.ops.native", "app.main"} <= modules
    edges = {(i.importer, i.target) for i in real.imports}
    assert ("engine.llm", "engine.core.core") in edges  # a module-level import
    assert ("engine.core.core", "engine.runner.model_runner") in edges  # inside a function
    assert ("engine.loader.gguf", "engine.heap") in edges  # `from engine import heap`: the submodule
    lazy = {(i.importer, i.target) for i in real.imports if not i.top_level}
    assert ("engine.core.core", "engine.runner.model_runner") in lazy


def test_every_package_is_on_one_line():
    members = [m for ms, _ in LAYERS for m in ms]
    assert len(members) == len(set(members)), "a package on two lines of LAYERS"
    assert layer_of("benchmarks") == 0 and layer_of("app") == 1  # the lab on top, then the app: engine importing
    # either is an upward import (benchmarks/ is not installed)


def test_the_import_rules_hold(real):
    errors = check(real, allowed=ALLOWED)
    assert not errors, _report(errors)


def test_allowances_are_still_needed(real):
    stale = stale_allowances(real, ALLOWED)
    assert not stale, "remove the allowances no longer needed from ALLOWED:\n" + "\n".join(
        f"{a.rule} {a.key}: {a.why}" for a in stale)


def test_architecture_section_6_is_generated(real):
    want = render_section(real.imports, ALLOWED)
    have = doc_section(DOC.read_text(encoding="utf-8"))
    assert have == want, f"docs/ARCHITECTURE.md section 6 differs from the import graph; regenerate: {REGENERATE}"


# --- each rule catches a mutation of a copy of the tree ----------------------------------------------------------

@pytest.fixture(scope="module")
def baseline(real):
    return {str(v) for v in check(real, allowed=ALLOWED)}


@pytest.fixture
def mutate(tmp_path, real, baseline):
    """mutate({path: text}) -> the violations a copy of the tree with those files added or replaced has and the
    tree itself has not."""

    def run(files: dict[str, str]) -> list[Violation]:
        for pkg in ("engine", "app"):
            shutil.rmtree(tmp_path / pkg, ignore_errors=True)
        for src in real.sources:
            dest = tmp_path / src.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(src.text, encoding="utf-8")
        for path, text in files.items():
            dest = tmp_path / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
        return [v for v in check(scan(scan_tree(tmp_path)), allowed=ALLOWED) if str(v) not in baseline]

    return run


def _rules(found: list[Violation]) -> set[str]:
    return {v.rule for v in found}


def test_mutation_upward_import_is_caught(mutate):
    found = mutate({"engine/ops/mutant.py": "def f():\n    from engine.models import registry\n"})
    assert _rules(found) == {"layers", "cycles"}, _report(found)
    [up] = [v for v in found if v.rule == "layers"]
    assert up.message == ("engine/ops/mutant.py:2: rule 1 (layers): engine.ops.mutant (engine.ops) imports "
                          "engine.models.registry (engine.models), a higher layer")
    # engine never imports app, even lazily, even under TYPE_CHECKING
    found = mutate({"engine/loader/mutant.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                             "    from app import main\n"})
    assert [v.rule for v in found if "app.main" in v.message] == ["layers"], _report(found)
    # nor the lab, which is not installed
    found = mutate({"engine/loader/mutant.py": "def f():\n    import benchmarks.decode\n"})
    assert ("layers", ("engine.loader", "benchmarks")) in [(v.rule, v.key) for v in found], _report(found)


def test_mutation_package_cycle_is_caught(mutate):
    # two packages of one line (no upward import): engine.config imports engine.errors, now back too
    errors = (ROOT / "engine/errors.py").read_text(encoding="utf-8")
    found = mutate({"engine/errors.py": errors + "\n\ndef _mutant():\n    from engine import config\n"})
    assert _rules(found) == {"cycles", "circles"}, _report(found)
    [cycle] = [v for v in found if v.rule == "cycles"]
    assert cycle.key == ("engine.config", "engine.errors")
    assert "rule 2 (package cycle): engine.config (engine/config.py:" in cycle.message


def test_mutation_file_circle_is_caught(mutate):
    found = mutate({
        "engine/core/mutant_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from engine.core.mutant_b import B\n",
        "engine/core/mutant_b.py": "class B:\n    def f(self):\n        from . import mutant_a\n",
    })
    assert [(v.rule, v.key) for v in found] == [("circles", ("engine.core.mutant_a", "engine.core.mutant_b"))]
    assert found[0].message == ("engine/core/mutant_a.py:3: rule 3 (file circle): engine.core.mutant_a "
                                "(engine/core/mutant_a.py:3) -> engine.core.mutant_b (engine/core/mutant_b.py:3) "
                                "-> engine.core.mutant_a")


def test_mutation_private_name_import_is_caught(mutate):
    found = mutate({"app/mutant.py": "from engine.config import _mutant_secret, EngineConfig\n"})
    assert [(v.rule, v.key) for v in found] == [("private", ("app.mutant", "engine.config._mutant_secret"))]


def test_mutation_private_attribute_read_is_caught(mutate):
    found = mutate({
        # on an imported module, by its name or its dotted path
        "app/mutant.py": "import engine.envs\nfrom engine import config\n\nx = config._mutant_x\n"
                         "y = engine.envs._mutant_y\n",
        # on an object, of a member defined in another module (the client / request stream pattern) ...
        "engine/core/mutant_owner.py": "class Owner:\n    def _mutant_forget(self):\n        pass\n",
        "engine/core/mutant_reader.py": "class Reader:\n    def __init__(self, owner):\n        self.owner = owner\n"
                                        "    def done(self):\n        self.owner._mutant_forget()\n"
                                        # ... but not its own members, a base class's through self, or torch's
                                        "        self._mine = 1\n        return self._mine, self._mutant_forget\n"
                                        "import torch\nz = torch._C\n",
    })
    assert sorted((v.rule, v.key) for v in found) == [
        ("attribute", ("app.mutant", "engine.config._mutant_x")),
        ("attribute", ("app.mutant", "engine.envs._mutant_y")),
        ("attribute", ("engine.core.mutant_reader", "_mutant_forget"))], _report(found)


def test_mutation_string_import_is_caught(mutate):
    found = mutate({"engine/loader/mutant.py": "import importlib\n\ndef f(name):\n"
                                               "    importlib.import_module('engine.core.core')\n"
                                               "    return importlib.import_module(name)\n"})
    keys = sorted((v.rule, v.key) for v in found)
    assert ("string", ("engine.loader.mutant", "engine.core.core")) in keys, _report(found)
    assert ("string", ("engine.loader.mutant", "<computed>")) in keys, _report(found)
    # the string's module is an edge: loader -> core is upward
    assert ("layers", ("engine.loader", "engine.core")) in keys, _report(found)
    # a "module:callable" string names an edge too
    found = mutate({"engine/tokenizer/mutant.py": "FACTORY = 'engine.runner.model_runner:ModelRunner'\n"})
    assert ("layers", ("engine.tokenizer", "engine.runner")) in [(v.rule, v.key) for v in found], _report(found)


def test_mutation_fact_defined_twice_is_caught(mutate):
    found = mutate({"app/mutant.py": "FP8_BLOCK = 128\n\ndef f():\n    DEFAULT_MODEL_FILE = 'x'  # a local: fine\n"})
    assert [(v.rule, v.key) for v in found] == [("facts", ("app.mutant", "FP8_BLOCK"))], _report(found)
    assert found[0].message == ("app/mutant.py:1: one source for each fact: FP8_BLOCK is defined in "
                                "engine.constants; import it from there")


def test_mutation_unplaced_package_is_caught(mutate):
    found = mutate({"engine/mutant_pkg/__init__.py": ""})
    assert [(v.rule, v.key) for v in found] == [("unplaced", ("engine.mutant_pkg",))]


# --- the checker's pieces on tiny synthetic trees ----------------------------------------------------------------

TINY_LAYERS = ((("app",), ""), (("engine.models",), ""), (("engine.layers",), ""), (("engine.ops",), ""),
               (("engine.core",), ""))


def test_relative_imports_and_submodules_resolve():
    result = scan(sources_from({
        "engine/layers/fake.py": "from ..models import llama\nfrom engine.ops import native\nfrom . import norm\n",
        "engine/models/llama.py": "",
        "engine/ops/native.py": "",
        "engine/layers/norm.py": "",
    }))
    assert {(i.importer, i.target) for i in result.imports} == {
        ("engine.layers.fake", "engine.models.llama"), ("engine.layers.fake", "engine.ops.native"),
        ("engine.layers.fake", "engine.layers.norm")}
    assert [str(v) for v in upward_imports(result.imports, TINY_LAYERS)] == [
        "engine/layers/fake.py:1: rule 1 (layers): engine.layers.fake (engine.layers) imports engine.models.llama "
        "(engine.models), a higher layer"]
    assert package_of("engine.layers.fake", TINY_LAYERS) == "engine.layers"
    assert package_of("engine", TINY_LAYERS) == "engine" and package_of("app.panels.chat") == "app"


def test_private_names_synthetic():
    result = scan(sources_from({
        "app/fake.py": "from engine.ops.native import _fail, cpu_isa\nfrom engine import __version__\n"
                       "def f():\n    from .store import _load\n",
        "app/store.py": "def _load(): pass\n",
        # not flagged: a private submodule is a module, and a package's __init__ may name its own privates
        "engine/ops/native.py": "from engine import _C\n",
        "engine/ops/__init__.py": "_x = 1\nfrom engine.ops import _x as y\n",
        # flagged: a sibling's private, relatively; a package's private from one of its modules
        "engine/ops/norm.py": "from .native import _C\nfrom . import _x\n",
    }))
    assert [str(v) for v in private_name_imports(result.imports)] == [
        ("app/fake.py:1: rule 4 (private names): app.fake imports engine.ops.native._fail, private to "
         "engine.ops.native"),
        "app/fake.py:4: rule 4 (private names): app.fake imports app.store._load, private to app.store",
        ("engine/ops/norm.py:1: rule 4 (private names): engine.ops.norm imports engine.ops.native._C, private to "
         "engine.ops.native"),
        ("engine/ops/norm.py:2: rule 4 (private names): engine.ops.norm imports engine.ops._x, private to "
         "engine.ops")]


def test_cycles_synthetic_count_lazy_and_type_checking_imports():
    result = scan(sources_from({
        "engine/core/a.py": "from engine.core.b import B\nA = 1\n",
        "engine/core/b.py": "try:\n    from engine.core import c\nexcept ImportError:\n    c = None\nB = 1\n",
        "engine/core/c.py": "from engine.core.a import A\n",
        "engine/core/d.py": "def f():\n    from engine.core.e import E\n",
        "engine/core/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.core.d import f\n"
                            "E = 1\n",
        "engine/ops/x.py": "from engine.layers import y\n",
        "engine/layers/y.py": "def g():\n    import engine.ops.x\n",
    }))
    assert [str(v) for v in file_circles(result.imports)] == [
        ("engine/core/a.py:1: rule 3 (file circle): engine.core.a (engine/core/a.py:1) -> "
         "engine.core.b (engine/core/b.py:2) -> engine.core.c (engine/core/c.py:1) -> engine.core.a"),
        ("engine/core/d.py:2: rule 3 (file circle): engine.core.d (engine/core/d.py:2) -> "
         "engine.core.e (engine/core/e.py:3) -> engine.core.d"),
        ("engine/layers/y.py:2: rule 3 (file circle): engine.layers.y (engine/layers/y.py:2) -> "
         "engine.ops.x (engine/ops/x.py:1) -> engine.layers.y")]
    assert [(v.rule, v.key) for v in package_cycles(result.imports, TINY_LAYERS)] == [
        ("cycles", ("engine.layers", "engine.ops"))]
    top = {(i.importer, i.target): i.top_level for i in result.imports}
    assert top[("engine.core.a", "engine.core.b")] and not top[("engine.core.d", "engine.core.e")]
    assert not top[("engine.core.e", "engine.core.d")]  # under TYPE_CHECKING


def test_allowances_silence_only_their_key():
    result = scan(sources_from({"engine/ops/x.py": "from engine.layers import y\n", "engine/layers/y.py": ""}))
    up = upward_imports(result.imports, TINY_LAYERS)
    assert [v.key for v in up] == [("engine.ops", "engine.layers")]
    assert check(result, TINY_LAYERS, [Allowance("layers", ("engine.ops", "engine.layers"), "")]) == [
        v for v in check(result, TINY_LAYERS) if v.rule != "layers"]
    assert stale_allowances(result, [Allowance("layers", ("engine.ops", "engine.core"), "")], TINY_LAYERS)
    # "*" covers a module's every key of the rule
    assert check(result, TINY_LAYERS, [Allowance("layers", ("engine.ops", "*"), "")]) == [
        v for v in check(result, TINY_LAYERS) if v.rule != "layers"]
    assert not stale_allowances(result, [Allowance("layers", ("engine.ops", "*"), "")], TINY_LAYERS)


def test_the_doc_section_is_replaced_in_place():
    from tests.support.import_graph import BEGIN, END, replace_section

    doc = "# x\n\n## 6. Old\n\nold text\n\n## 7. Next\n\nrest\n"
    once = replace_section(doc, "## 6. New\n\nnew\n")
    assert once == f"# x\n\n{BEGIN}\n## 6. New\n\nnew\n{END}\n\n## 7. Next\n\nrest\n"
    assert replace_section(once, "## 6. Newer\n") == f"# x\n\n{BEGIN}\n## 6. Newer\n{END}\n\n## 7. Next\n\nrest\n"
    assert doc_section(once) == "## 6. New\n\nnew\n"
    assert isinstance(Path(DOC), Path)
