"""The packages' import graph, read with ``ast`` (no module is imported): every .py under engine/ and app/ is
parsed and its ``import x`` / ``from x import y`` statements collected, those inside functions included, relative
ones resolved. The rules:

1. engine never imports app;
2. engine's layers (LAYERS below, top to bottom): a module imports its own layer or lower ones, never a higher one;
3. no module imports another module's private name (``from engine.x import _name``), in engine/ and app/;
4. no import cycle among engine modules at module level (statements run when the module is imported: not inside
   a function, not under ``if TYPE_CHECKING:``).

``from pkg import name`` counts as an import of the submodule pkg.name when there is one (``from engine import
envs`` imports engine.envs, not engine/__init__.py), else as an import of pkg. The parent packages that Python
initialises on the way (``import engine.ops.native`` runs engine/__init__.py and engine/ops/__init__.py) are not
edges. Imports by string (importlib, e.g. engine_process's DEFAULT_CORE_FACTORY) are not seen.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app")

# Compiled extension modules: importable, with no .py to parse.
EXTENSION_MODULES = frozenset({"engine._C"})

# engine's layers, top to bottom. A module may import its own layer or any lower one, never a higher one.
# A member covers itself and everything under it, the longest member wins (engine.parallel.executor beats
# engine.parallel); "engine" (engine/__init__.py) covers only itself. Every engine module must be covered.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Entry points and front ends: the package facade (engine/__init__.py: SamplingParams, and LLM / EngineConfig
    # lazily), the OpenAI-compatible server, the async client (with its request streams and its copy of the
    # engine's tokenizer) and the supervisor that spawns engine_process and restarts it, the in-process LLM,
    # the CLI, the benchmarks (which also reach into core, parallel, runner and ops).
    ("entry", ("engine", "engine.server", "engine.client", "engine.request_stream", "engine.client_tokenizer",
               "engine.engine_supervisor", "engine.llm", "engine.cli", "engine.bench")),
    # The engine's own process: a ZMQ loop around a core, which it builds from a "module:callable" string
    # (DEFAULT_CORE_FACTORY = "engine.core.core:EngineCore", through importlib), not from an import statement.
    ("engine_process", ("engine.engine_process",)),
    # EngineCore, the scheduler, the KV-cache block manager, the requests. EngineCore drives a ModelRunner,
    # or a TPExecutor when tensor-parallel.
    ("core", ("engine.core",)),
    # Tensor parallelism's driving side, between core and runner: rank 0's TPExecutor (started by EngineCore),
    # the worker processes (python -m engine.parallel.worker; each loads a checkpoint and drives a ModelRunner),
    # the per-step mailbox between them.
    ("parallel.driver", ("engine.parallel.executor", "engine.parallel.worker", "engine.parallel.mailbox")),
    # One device's model, KV cache and forward pass (ModelRunner); device and dtype resolution.
    ("runner", ("engine.runner",)),
    # The architectures (llama and its relatives), the dual-stream overlap forward, the registry.
    ("models", ("engine.models",)),
    # The building blocks: attention, (tensor-parallel) linear and embedding, norm, rotary, the sampler.
    ("layers", ("engine.layers",)),
    # Tensor parallelism's plumbing, right under the layers that use it: TPContext (rank, size, communicator),
    # which the sharded layers hold, and the comm strategies (host, int8, nccl, auto) reached through it; they
    # call engine._C directly, not engine.ops. engine.parallel itself (its __init__ is a docstring) and any new
    # module under it land here unless listed above.
    ("parallel.comm", ("engine.parallel", "engine.parallel.context", "engine.parallel.comm")),
    # The kernels' Python side: dispatch to engine._C or the pure-torch references, Triton varlen attention.
    ("ops", ("engine.ops",)),
    # The native extension (csrc/), built by pip install; imported by ops, parallel.comm and parallel.mailbox.
    ("_C", ("engine._C",)),
    # The foundation, importable from anywhere (most of it torch-free, for the app): checkpoint loading,
    # the quantized weights' forms (which the loader builds) and which quantization_configs load (torch-free),
    # configs, tokenizers, output and error types, KESTREL_* variables, sampling parameters, capabilities,
    # CPU flags, metrics, the engine<->client IPC messages, start-up progress reports, the C heap's trim. They
    # import only each other.
    ("foundation", ("engine.loader", "engine.weight_quant", "engine.quant_scheme", "engine.config",
                    "engine.tokenizer", "engine.outputs", "engine.errors", "engine.envs", "engine.sampling_params",
                    "engine.capabilities", "engine.cpu_features", "engine.metrics", "engine.ipc", "engine.progress",
                    "engine.heap")),
)

# Known upward imports, (importer, imported module), each with its reason beside it; none today (the runner reads
# core's step through engine/runner/step.py's protocols). Each must still occur (test_allowances_are_still_needed).
LAYER_ALLOWANCES: frozenset[tuple[str, str]] = frozenset()

# Known imports of another module's private names, (importer, module) -> names, each with its reason; none today
# (engine/ops/native.py's helpers are public: native_lib, check_*, dtype_code, ...). Each must still occur.
PRIVATE_ALLOWANCES: Mapping[tuple[str, str], frozenset[str]] = {}


# --- the scan ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    module: str  # dotted name; a package's __init__.py is the package's name
    path: str  # for messages, relative to the repository root
    text: str
    is_package: bool


@dataclass(frozen=True)
class Import:
    importer: str
    path: str
    line: int
    target: str  # the module imported: pkg.name for `from pkg import name` when that is a submodule
    names: tuple[str, ...]  # the attributes taken from target (`from target import names`); () for a module
    top_level: bool  # runs when the importer is imported: not inside a function, not under TYPE_CHECKING

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def scan_tree(root: Path = ROOT) -> list[Source]:
    sources = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            parts = list(rel.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            sources.append(Source(".".join(parts), rel.as_posix(), path.read_text(encoding="utf-8"), is_package))
    return sources


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, top: bool) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool]]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node, top
        return
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        top = False
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for stmt in node.body:
            yield from _import_nodes(stmt, False)
        for stmt in node.orelse:
            yield from _import_nodes(stmt, top)
        return
    for child in ast.iter_child_nodes(node):
        yield from _import_nodes(child, top)


def _resolve(src: Source, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = src.module.split(".") if src.is_package else src.module.split(".")[:-1]
    if node.level - 1 >= len(package):
        raise ValueError(f"{src.path}:{node.lineno}: relative import beyond the top-level package")
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def imports_of(src: Source, known_modules: frozenset[str]) -> list[Import]:
    """The imports of engine and app modules in one source, each `from pkg import a, b` split into one Import per
    submodule named and one for the remaining attributes."""
    found = []
    for node, top in _import_nodes(ast.parse(src.text, filename=src.path), True):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    found.append(Import(src.module, src.path, node.lineno, alias.name, (), top))
            continue
        base = _resolve(src, node)
        if not _ours(base):
            continue
        attrs = []
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in known_modules:
                found.append(Import(src.module, src.path, node.lineno, sub, (), top))
            else:
                attrs.append(alias.name)
        if attrs:
            found.append(Import(src.module, src.path, node.lineno, base, tuple(attrs), top))
    return found


def all_imports(sources: list[Source]) -> list[Import]:
    known = frozenset(s.module for s in sources) | EXTENSION_MODULES
    return [imp for src in sources for imp in imports_of(src, known)]


# --- the rules --------------------------------------------------------------------------------------------------

_RANK = {member: rank for rank, (_, members) in enumerate(LAYERS) for member in members}


def layer_of(module: str) -> int | None:
    """Index into LAYERS (0 = top), by the longest member covering the module; None if none does."""
    if module == "engine":
        return _RANK.get("engine")
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        rank = _RANK.get(".".join(parts[:n]))
        if rank is not None:
            return rank
    return None


def _layer_name(rank: int | None) -> str:
    return "not in LAYERS" if rank is None else LAYERS[rank][0]


def engine_imports_app(imports: Iterable[Import]) -> list[str]:
    return [f"{imp.where}: rule 1 (engine never imports app): {imp.importer} imports {imp.target}"
            for imp in imports if imp.importer.split(".")[0] == "engine" and imp.target.split(".")[0] == "app"]


def upward_imports(imports: Iterable[Import], allowed: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    errors = []
    for imp in imports:
        if imp.importer.split(".")[0] != "engine" or imp.target.split(".")[0] != "engine":
            continue
        have, want = layer_of(imp.importer), layer_of(imp.target)
        if have is None or want is None:
            errors.append(f"{imp.where}: rule 2 (layers): {imp.importer} ({_layer_name(have)}) imports "
                          f"{imp.target} ({_layer_name(want)}): place both in LAYERS")
        elif want < have and (imp.importer, imp.target) not in allowed:
            errors.append(f"{imp.where}: rule 2 (layers): {imp.importer} ({_layer_name(have)}) imports "
                          f"{imp.target} ({_layer_name(want)}), a higher layer")
    return errors


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_name_imports(imports: Iterable[Import],
                         allowed: Mapping[tuple[str, str], frozenset[str]] | None = None) -> list[str]:
    allowed = allowed or {}
    errors = []
    for imp in imports:
        if imp.target == imp.importer:
            continue
        for name in imp.names:
            if _is_private(name) and name not in allowed.get((imp.importer, imp.target), ()):
                errors.append(f"{imp.where}: rule 3 (private names): {imp.importer} imports {imp.target}.{name}, "
                              f"private to {imp.target}")
    return errors


def module_level_cycles(imports: Iterable[Import]) -> list[str]:
    """Each strongly connected component of engine's module-level import graph, reported as one cycle through
    it, every edge with its file and line."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if (imp.top_level and imp.importer != imp.target and imp.importer.split(".")[0] == "engine"
                and imp.target.split(".")[0] == "engine"):
            edges.setdefault(imp.importer, {}).setdefault(imp.target, imp)
    # Tarjan, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    errors = []
    for component in components:
        members = set(component)
        first = component[0]
        # shortest way back to `first` inside the component (breadth first)
        came_from: dict[str, str] = {}
        frontier = [first]
        while first not in came_from:
            nxt = []
            for node in frontier:
                for child in sorted(edges.get(node, {})):
                    if child in members and child not in came_from:
                        came_from[child] = node
                        nxt.append(child)
            frontier = nxt
        path = [first]
        while True:
            path.append(came_from[path[-1]])
            if path[-1] == first:
                break
        path.reverse()
        hops = " -> ".join(f"{a} ({edges[a][b].where})" for a, b in itertools.pairwise(path))
        errors.append(f"{edges[path[0]][path[1]].where}: rule 4 (module-level import cycle): {hops} -> {first}")
    return errors


# --- the tests --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sources() -> list[Source]:
    return scan_tree()


@pytest.fixture(scope="module")
def imports(sources) -> list[Import]:
    return all_imports(sources)


def _report(errors: list[str]) -> str:
    return f"{len(errors)} violation(s):\n" + "\n".join(errors)


def test_the_scan_sees_the_graph(sources, imports):
    modules = {s.module for s in sources}
    assert {"engine", "engine.core.core", "engine.ops.native", "app.main"} <= modules
    edges = {(i.importer, i.target) for i in imports}
    assert ("engine.llm", "engine.core.core") in edges  # a module-level import
    assert ("engine.core.core", "engine.runner.model_runner") in edges  # inside a function
    assert ("engine.layers.attention", "engine.envs") in edges  # `from engine import envs, ops`: submodules


def test_engine_never_imports_app(imports):
    errors = engine_imports_app(imports)
    assert not errors, _report(errors)


def test_every_engine_module_is_in_a_layer(sources):
    unplaced = [f"{s.path}: {s.module} is in no layer of LAYERS" for s in sources
                if s.module.split(".")[0] == "engine" and layer_of(s.module) is None]
    assert not unplaced, _report(unplaced)
    modules = {s.module for s in sources} | EXTENSION_MODULES
    dead = [m for m in _RANK if not any(x == m or x.startswith(m + ".") for x in modules)]
    assert not dead, f"LAYERS names modules that do not exist: {dead}"


def test_engine_layers(imports):
    errors = upward_imports(imports, LAYER_ALLOWANCES)
    assert not errors, _report(errors)


def test_no_imports_of_other_modules_private_names(imports):
    errors = private_name_imports(imports, PRIVATE_ALLOWANCES)
    assert not errors, _report(errors)


def test_no_module_level_import_cycles_in_engine(imports):
    errors = module_level_cycles(imports)
    assert not errors, _report(errors)


def test_allowances_are_still_needed(imports):
    upward = {(i.importer, i.target) for i in imports}
    private = {(i.importer, i.target, n) for i in imports for n in i.names}
    stale = [f"LAYER_ALLOWANCES: {a} -> {b} no longer imported" for a, b in sorted(LAYER_ALLOWANCES)
             if (a, b) not in upward]
    stale += [f"PRIVATE_ALLOWANCES: {a} no longer imports {b}.{n}" for (a, b), names in PRIVATE_ALLOWANCES.items()
              for n in sorted(names) if (a, b, n) not in private]
    assert not stale, "remove the allowances no longer needed:\n" + "\n".join(stale)


# --- the checks catch what they should, on synthetic sources ---------------------------------------------------

def _synthetic(files: dict[str, str]) -> list[Import]:
    sources = []
    for path, text in files.items():
        parts = path.removesuffix(".py").split("/")
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        sources.append(Source(".".join(parts), path, text, is_package))
    return all_imports(sources)


def test_synthetic_engine_importing_app_is_caught():
    imports = _synthetic({
        "engine/core/fake.py": "import os\n\ndef f():\n    from app.window import MainWindow\n",
        "app/window.py": "MainWindow = object\n",
    })
    assert engine_imports_app(imports) == [
        "engine/core/fake.py:4: rule 1 (engine never imports app): engine.core.fake imports app.window"]


def test_synthetic_upward_import_is_caught():
    imports = _synthetic({
        "engine/layers/fake.py": "from ..models import llama\nfrom engine.ops import native\nfrom . import norm\n",
        "engine/models/llama.py": "",
        "engine/ops/native.py": "",
        "engine/layers/norm.py": "",
    })
    assert upward_imports(imports) == [
        ("engine/layers/fake.py:1: rule 2 (layers): engine.layers.fake (layers) imports engine.models.llama "
        "(models), a higher layer")]
    assert upward_imports(imports, frozenset({("engine.layers.fake", "engine.models.llama")})) == []
    # the foundation may not reach up either, even lazily
    imports = _synthetic({"engine/config.py": "def f():\n    import engine.runner.device\n"})
    assert [e.split(": ", 2)[:2] for e in upward_imports(imports)] == [["engine/config.py:2", "rule 2 (layers)"]]


def test_synthetic_private_name_is_caught():
    imports = _synthetic({
        "app/fake.py": "from engine.ops.native import _fail, cpu_isa\nfrom engine import __version__\n"
                       "def f():\n    from .store import _load\n",
        "app/store.py": "def _load(): pass\n",
        # not flagged: a private submodule is a module, and a package's __init__ may name its own privates
        "engine/ops/native.py": "from engine import _C\n",
        "engine/ops/__init__.py": "_x = 1\nfrom engine.ops import _x as y\n",
        # flagged: a sibling's private, relatively; a package's private from one of its modules
        "engine/ops/norm.py": "from .native import _C\nfrom . import _x\n",
    })
    assert private_name_imports(imports) == [
        ("app/fake.py:1: rule 3 (private names): app.fake imports engine.ops.native._fail, private to "
        "engine.ops.native"),
        "app/fake.py:4: rule 3 (private names): app.fake imports app.store._load, private to app.store",
        ("engine/ops/norm.py:1: rule 3 (private names): engine.ops.norm imports engine.ops.native._C, private to "
        "engine.ops.native"),
        ("engine/ops/norm.py:2: rule 3 (private names): engine.ops.norm imports engine.ops._x, private to "
        "engine.ops")]
    assert private_name_imports(imports, {("engine.ops.norm", "engine.ops.native"): frozenset({"_C"}),
                                          ("engine.ops.norm", "engine.ops"): frozenset({"_x"}),
                                          ("app.fake", "app.store"): frozenset({"_load"})}) == [
        ("app/fake.py:1: rule 3 (private names): app.fake imports engine.ops.native._fail, private to "
        "engine.ops.native")]


def test_synthetic_cycle_is_caught_at_module_level_only():
    imports = _synthetic({
        "engine/core/a.py": "from engine.core.b import B\nA = 1\n",
        "engine/core/b.py": "try:\n    from engine.core import c\nexcept ImportError:\n    c = None\nB = 1\n",
        "engine/core/c.py": "from engine.core.a import A\n",
        "engine/core/d.py": "def f():\n    from engine.core.e import E\n",
        "engine/core/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.core.d import f\n"
                            "from engine.core.d import f\nE = 1\n",
    })
    assert module_level_cycles(imports) == [
        ("engine/core/a.py:1: rule 4 (module-level import cycle): engine.core.a (engine/core/a.py:1) -> "
        "engine.core.b (engine/core/b.py:2) -> engine.core.c (engine/core/c.py:1) -> engine.core.a")]
