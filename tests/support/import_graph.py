"""The packages' import graph, read with ``ast`` (no module is imported), its rules, and the Markdown of
docs/ARCHITECTURE.md's section 6 rendered from them.

Every .py under engine/, app/ and benchmarks/ is parsed; its ``import x`` / ``from x import y`` statements are collected (those
inside functions and under ``if TYPE_CHECKING:`` included, each marked), relative ones resolved, and so are
``importlib.import_module("engine.x")`` / ``__import__("engine.x")`` calls on our packages. ``from pkg import name``
counts as an import of the submodule pkg.name when there is one, else as an import of pkg. The parent packages
that Python initialises on the way are not edges.

A *package* is the unit of the layering: ``benchmarks``, ``app``; ``engine`` (engine/__init__.py alone); for an engine module the
longest member of ``LAYERS`` that covers it (``engine.frontend.client`` is in ``engine.frontend``), else its own name.
``LAYERS`` lists the packages top to bottom, one line each (packages on one line are one layer).

The rules (each checked by tests/unit/test_import_graph.py, each shown catching a synthetic mutation there):

1. layers: a package imports its own layer or lower ones, never a higher one (engine never imports app or benchmarks);
2. no package cycle: the graph of packages (every import, lazy ones too) has no cycle;
3. no file circle: the graph of files (every import, lazy and TYPE_CHECKING ones too) has no cycle;
4. no private name across modules: ``from x import _y`` where x is another module;
5. no private attribute read across modules: ``mod._y`` on an imported module of ours, and ``obj._y`` on any
   other object (not ``self`` / ``cls`` / ``super()``) when ``_y`` is defined in another of our modules and not in
   the reading one;
6. no string import of our modules: ``importlib.import_module("engine.x")`` / ``__import__`` (import it), or one
   whose name is computed (a "module:callable" factory string), unless allowed with its reason.

Regenerate section 6: ``.venv/bin/python -m tests.support.import_graph --write``; with no flag the command prints
the rules' check and whether section 6 is current (``--map`` prints the section, ``--help`` the rest).
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app", "benchmarks")
EXTENSION_MODULES = frozenset({"engine._C"})  # compiled: importable, no .py to parse
DOC = ROOT / "docs" / "ARCHITECTURE.md"

# The layers, top to bottom: one line per package (a line naming several packages makes them one layer; they may
# import each other, though never in a circle, rule 2). A package imports its own layer or lower ones.
LAYERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("benchmarks",), "the developers' lab (not installed): nothing in engine/ or app/ may import it"),
    (("app",), "the PySide6 desktop app; torch-free in its own process, reaches the engine through its client"),
    (("engine.cli",), "the `kestrel` command's engine side: generate, chat, bench, serve"),
    (("engine.bench",), "the benchmarks users run (`kestrel bench ...`, the app's Benchmark panel), their reports"),
    (("engine.server",), "the OpenAI-compatible HTTP server (FastAPI under uvicorn), headless `kestrel serve`"),
    (("engine",), "the package facade (engine/__init__.py: SamplingParams; LLM and EngineConfig lazily)"),
    (("engine.llm",), "the offline API: LLM builds an EngineCore in the calling process"),
    (("engine.frontend",), "the engine process seen from the client: EngineClient, request streams, the "
                           "supervisor, the client's tokenizer"),
    (("engine.core",), "the engine process's loop, EngineCore's steps, the scheduler, the KV-cache blocks, requests"),
    (("engine.spec",), "speculative decoding: the proposers (n-gram prompt lookup, a draft model), the core's "
                       "proposals, counts and back-off"),
    (("engine.executor",), "tensor parallelism's driving side: TPExecutor, the worker processes, the mailbox"),
    (("engine.runner",), "one device's model, KV cache and forward pass (ModelRunner), CUDA graphs, CPU tapes"),
    (("engine.models",), "the architectures (llama and its relatives), the overlap forward, the registry"),
    (("engine.layers",), "attention, (tensor-parallel, quantized) linear, embedding, norm, rotary, the sampler"),
    (("engine.parallel",), "tensor parallelism's plumbing under the layers: TPContext, the comm strategies, "
                           "CommConfig"),
    (("engine.ops",), "the Python face of every kernel (engine._C or the pure-torch reference), Triton kernels"),
    (("engine._C",), "the native extension built from csrc/"),
    (("engine.loader",), "checkpoints: safetensors, GGUF, quantized formats, the embedded default model"),
    (("engine.tokenizer",), "tokenizers, chat templates, the incremental detokenizer, grammars, tool parsers"),
    (("engine.wire", "engine.outputs", "engine.metrics", "engine.progress"),
     "what crosses processes: the wire types, outputs, request records and metrics, start-up progress"),
    (("engine.constants", "engine.config", "engine.kernel_config", "engine.weight_quant", "engine.quant_scheme",
      "engine.capabilities", "engine.cpu_features", "engine.dtype_codes", "engine.host_info",
      "engine.sampling_params", "engine.errors",
      "engine.envs", "engine.heap", "engine.checkpoint_json", "engine.expert_blocks"),
     "the foundation: facts defined once (constants), options, kernel configuration, quantized weights' forms, "
     "checkpoint schemes, capabilities, "
     "CPU flags, host facts (NVML), sampling parameters, errors, KESTREL_* variables, the C heap's trim, "
     "a checkpoint's JSON files"),
)


@dataclass(frozen=True)
class Allowance:
    """A known violation, kept while its owner fixes it: the test fails when it no longer occurs."""
    rule: str
    key: tuple[str, ...]
    why: str


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
    type_checking: bool = False  # under `if TYPE_CHECKING:`
    by_string: bool = False  # importlib.import_module("...") / __import__("...")

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Scan:
    sources: list[Source]
    imports: list[Import]
    attribute_reads: list[Violation] = field(default_factory=list)  # rule 5's findings
    string_imports: list[Violation] = field(default_factory=list)  # rule 6's findings


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


def sources_from(files: Mapping[str, str]) -> list[Source]:
    """Sources from {path: text}, for synthetic trees."""
    sources = []
    for path, text in files.items():
        parts = path.removesuffix(".py").split("/")
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        sources.append(Source(".".join(parts), path, text, is_package))
    return sources


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


_FACTORY = re.compile(r"^((?:engine|app)(?:\.\w+)+):\w+$")
_DEF = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass(frozen=True)
class _Facts:
    """What one file says, before its imports are resolved against the tree (cached by text)."""
    imports: tuple  # (lineno, base or None for `import x`, level, ((name, asname), ...), top, tc)
    string_calls: tuple  # (lineno, constant name or None, top, tc)
    factories: tuple  # (lineno, module, top, tc): "module:callable" strings
    reads: tuple  # (lineno, attr, dotted receiver or None, root name, plain self/cls, on super(), text)
    names: frozenset  # every name the file defines (imports do not count)
    members: frozenset  # functions, methods, class-body names, attributes assigned on objects
    globals: tuple  # (lineno, name) of each module-level assignment


@functools.lru_cache(maxsize=4096)
def _facts(path: str, text: str) -> _Facts:
    """One pass over the file's tree. Names: functions, classes, assignment targets (names and attributes),
    arguments, keywords, identifier-like strings (__slots__, setattr, argparse dests). Members: what another
    module could reach as ``obj._x``."""
    imports, calls, factories, reads = [], [], [], []
    names: set[str] = set()
    members: set[str] = set()
    tree = ast.parse(text, filename=path)
    globals_ = []
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
            if isinstance(stmt, ast.AnnAssign) else []
        globals_ += [(stmt.lineno, t.id) for t in targets if isinstance(t, ast.Name)]
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, True, False)]
    while stack:
        node, top, tc = stack.pop()
        if isinstance(node, ast.Import):
            imports.append((node.lineno, None, 0, tuple((a.name, a.asname) for a in node.names), top, tc))
            continue
        if isinstance(node, ast.ImportFrom):
            imports.append((node.lineno, node.module or "", node.level,
                            tuple((a.name, a.asname) for a in node.names), top, tc))
            continue
        if isinstance(node, _DEF):
            names.add(node.name)
            members.add(node.name)
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
                        if isinstance(stmt, ast.AnnAssign) else []
                    members.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                names.add(node.id)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.attr)
                members.add(node.attr)
            elif _is_private(node.attr):
                value = node.value
                plain = isinstance(value, ast.Name) and value.id in ("self", "cls")
                on_super = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                    and value.func.id == "super"
                reads.append((node.lineno, node.attr, _dotted(value), _root_name(value), plain, on_super,
                              ast.unparse(node)))
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword):
            if node.arg:
                names.add(node.arg)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                if node.value.isidentifier():
                    names.add(node.value)
                elif m := _FACTORY.match(node.value):
                    # "module:callable", named for another process to import: an edge the graph must see
                    factories.append((node.lineno, m.group(1), top, tc))
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if fname in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                const = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
                calls.append((node.lineno, const, top, tc))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            top = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((stmt, top, tc) for stmt in node.orelse)
            stack.extend((stmt, False, True) for stmt in node.body)
            continue
        stack.extend((child, top, tc) for child in ast.iter_child_nodes(node))
    return _Facts(tuple(imports), tuple(calls), tuple(factories), tuple(reads), frozenset(names),
                  frozenset(members), tuple(globals_))


def _resolve(src: Source, lineno: int, base: str, level: int) -> str:
    if not level:
        return base
    package = src.module.split(".") if src.is_package else src.module.split(".")[:-1]
    if level - 1 >= len(package):
        raise ValueError(f"{src.path}:{lineno}: relative import beyond the top-level package")
    return ".".join(package[: len(package) - (level - 1)] + ([base] if base else []))


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def scan(sources: list[Source]) -> Scan:
    known = frozenset(s.module for s in sources) | EXTENSION_MODULES
    facts = {s.module: _facts(s.path, s.text) for s in sources}
    definers: dict[str, list[str]] = {}
    for module, f in facts.items():
        for name in f.members:
            if _is_private(name):
                definers.setdefault(name, []).append(module)
    result = Scan(sources, [])
    for src in sources:
        f = facts[src.module]
        module_names: dict[str, str] = {}  # local name -> our module it is bound to
        foreign: set[str] = set()  # local names bound by imports of modules not ours
        for lineno, base, level, aliases, top, tc in sorted(f.imports, key=lambda i: i[0]):
            if base is None:  # import x, import x.y as z
                for name, asname in aliases:
                    if ours(name):
                        result.imports.append(Import(src.module, src.path, lineno, name, (), top, tc))
                        module_names[asname or name.split(".")[0]] = name if asname else name.split(".")[0]
                    else:
                        foreign.add(asname or name.split(".")[0])
                continue
            base = _resolve(src, lineno, base, level)
            if not ours(base):
                foreign.update(asname or name for name, asname in aliases)
                continue
            attrs = []
            for name, asname in aliases:
                sub = f"{base}.{name}"
                if sub in known:
                    result.imports.append(Import(src.module, src.path, lineno, sub, (), top, tc))
                    module_names[asname or name] = sub
                else:
                    attrs.append(name)
            if attrs:
                result.imports.append(Import(src.module, src.path, lineno, base, tuple(attrs), top, tc))
        for lineno, const, top, tc in f.string_calls:
            where = f"{src.path}:{lineno}"
            if const is None:
                result.string_imports.append(Violation(
                    "string", (src.module, "<computed>"),
                    f"{where}: rule 6 (string import): {src.module} imports a module named by a computed string "
                    "(the import graph cannot see it)"))
            elif ours(const):
                result.string_imports.append(Violation(
                    "string", (src.module, const),
                    f"{where}: rule 6 (string import): {src.module} imports {const} by string; import it"))
                result.imports.append(Import(src.module, src.path, lineno, const, (), top, tc, by_string=True))
        for lineno, module, top, tc in f.factories:
            if module in known:
                result.imports.append(Import(src.module, src.path, lineno, module, (), top, tc, by_string=True))
        for lineno, attr, dotted, root, plain, on_super, text in f.reads:  # rule 5
            where = f"{src.path}:{lineno}"
            target = _module_of(dotted, module_names, known) if dotted else None
            if target is not None:
                if target != src.module:
                    result.attribute_reads.append(Violation(
                        "attribute", (src.module, f"{target}.{attr}"),
                        f"{where}: rule 5 (private attribute): {src.module} reads {target}.{attr}, "
                        f"private to {target}"))
                continue
            if plain or on_super or root in foreign or attr in f.names:
                continue
            owners = [m for m in definers.get(attr, ()) if m != src.module]
            if owners:
                result.attribute_reads.append(Violation(
                    "attribute", (src.module, attr),
                    f"{where}: rule 5 (private attribute): {src.module} reads {text}; {attr} is defined in "
                    f"{', '.join(sorted(owners)[:3])}, not here"))
    return result


def _module_of(dotted: str, module_names: Mapping[str, str], known: frozenset[str]) -> str | None:
    """The module of ours an expression like `native` or `engine.ops.native` names, through the file's imports."""
    first, _, rest = dotted.partition(".")
    if first not in module_names:
        return None
    full = module_names[first]
    for part in rest.split(".") if rest else ():
        if f"{full}.{part}" not in known:
            break
        full = f"{full}.{part}"
    return full if full in known else None


# --- packages and layers ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Violation:
    rule: str  # "unplaced", "layers", "cycles", "circles", "private", "attribute", "string"
    key: tuple[str, ...]  # what an Allowance names
    message: str

    def __str__(self) -> str:
        return self.message


def _ranks(layers) -> dict[str, int]:
    return {m: r for r, (ms, _) in enumerate(layers) for m in ms}


def package_of(module: str, layers=LAYERS) -> str:
    """``app``, ``engine`` (the facade), the longest LAYERS member covering an engine module, else engine.X."""
    if module == "engine" or module.split(".")[0] != "engine":
        return module.split(".")[0]
    ranks = _ranks(layers)
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in ranks:
            return ".".join(parts[:n])
    return ".".join(parts[:2])


def layer_of(package: str, layers=LAYERS) -> int | None:
    return _ranks(layers).get(package)


def unplaced(sources: list[Source], layers=LAYERS) -> list[Violation]:
    out = []
    for s in sources:
        pkg = package_of(s.module, layers)
        if layer_of(pkg, layers) is None:
            out.append(Violation("unplaced", (pkg,), f"{s.path}: package {pkg} is on no line of LAYERS"))
    members = {m for ms, _ in layers for m in ms}
    modules = {s.module for s in sources} | EXTENSION_MODULES
    out += [Violation("unplaced", (m,), f"LAYERS names {m}, which does not exist") for m in sorted(members)
            if not any(x == m or x.startswith(m + ".") for x in modules)]
    return list({v.message: v for v in out}.values())


def upward_imports(imports: Iterable[Import], layers=LAYERS) -> list[Violation]:
    errors = []
    for imp in imports:
        a, b = package_of(imp.importer, layers), package_of(imp.target, layers)
        have, want = layer_of(a, layers), layer_of(b, layers)
        if a == b or have is None or want is None:
            continue  # unplaced() reports packages on no line
        if want < have:
            errors.append(Violation("layers", (a, b), f"{imp.where}: rule 1 (layers): {imp.importer} ({a}) "
                                                      f"imports {imp.target} ({b}), a higher layer"))
    return errors


def _components(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iteratively), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
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
                    work.append((child, iter(sorted(edges.get(child, ())))))
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
    return sorted(components)


def _cycle_through(first: str, members: set[str], edges: Mapping[str, Iterable[str]]) -> list[str]:
    """The shortest way from first back to itself inside its component (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [first]
    while first not in came_from:
        nxt = []
        for node in frontier:
            for child in sorted(edges.get(node, ())):
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
    return path


def _cycles(edges: dict[str, dict[str, Import]], rule: str, words: str) -> list[Violation]:
    errors = []
    for component in _components(edges):
        path = _cycle_through(component[0], set(component), edges)
        hops = " -> ".join(f"{a} ({edges[a][b].where})" for a, b in itertools.pairwise(path))
        errors.append(Violation(rule, tuple(component), f"{edges[path[0]][path[1]].where}: {words}: {hops} -> "
                                                        f"{path[0]}"))
    return errors


def package_cycles(imports: Iterable[Import], layers=LAYERS) -> list[Violation]:
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        a, b = package_of(imp.importer, layers), package_of(imp.target, layers)
        if a != b:
            edges.setdefault(a, {}).setdefault(b, imp)
    return _cycles(edges, "cycles", "rule 2 (package cycle)")


def file_circles(imports: Iterable[Import]) -> list[Violation]:
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.importer != imp.target:
            edges.setdefault(imp.importer, {}).setdefault(imp.target, imp)
    return _cycles(edges, "circles", "rule 3 (file circle)")


def private_name_imports(imports: Iterable[Import]) -> list[Violation]:
    errors = []
    for imp in imports:
        if imp.target == imp.importer:
            continue
        for name in imp.names:
            if _is_private(name):
                errors.append(Violation("private", (imp.importer, f"{imp.target}.{name}"),
                                        f"{imp.where}: rule 4 (private names): {imp.importer} imports "
                                        f"{imp.target}.{name}, private to {imp.target}"))
    return errors


def check(result: Scan, layers=LAYERS, allowed: Iterable[Allowance] = ()) -> list[Violation]:
    """Every violation of every rule that no allowance covers."""
    found = (unplaced(result.sources, layers) + upward_imports(result.imports, layers)
             + package_cycles(result.imports, layers) + file_circles(result.imports)
             + private_name_imports(result.imports) + result.attribute_reads + result.string_imports
             + facts_defined_twice(result.sources))
    return [v for v in found if not any(_covers(a, v) for a in allowed)]


def _covers(a: Allowance, v: Violation) -> bool:
    """An allowance names a violation's key, or its first parts and then "*" (a module's every such read)."""
    if a.rule != v.rule:
        return False
    if a.key and a.key[-1] == "*":
        return v.key[: len(a.key) - 1] == a.key[:-1]
    return a.key == v.key


def stale_allowances(result: Scan, allowed: Iterable[Allowance], layers=LAYERS) -> list[Allowance]:
    """The allowances that no violation needs any more."""
    found = check(result, layers)
    return [a for a in allowed if not any(_covers(a, v) for v in found)]


# One source for each fact: these names are assigned at module level in their module only (others import them).
FACTS: Mapping[str, str] = {
    "DEFAULT_MODEL_PACKAGE": "engine.constants",
    "DEFAULT_MODEL_FILE": "engine.constants",
    "GGUF_ARCHITECTURES": "engine.constants",
    "FP8_BLOCK": "engine.constants",
}


def facts_defined_twice(sources: list[Source], facts: Mapping[str, str] = FACTS) -> list[Violation]:
    errors = []
    for src in sources:
        for lineno, name in _facts(src.path, src.text).globals:
            home = facts.get(name)
            if home is not None and home != src.module:
                errors.append(Violation("facts", (src.module, name), f"{src.path}:{lineno}: one source for each "
                                        f"fact: {name} is defined in {home}; import it from there"))
    return errors


# --- docs/ARCHITECTURE.md section 6 -----------------------------------------------------------------------------

BEGIN = "<!-- generated by tests/support/import_graph.py: begin -->"
END = "<!-- generated by tests/support/import_graph.py: end -->"
REGENERATE = ".venv/bin/python -m tests.support.import_graph --write"


def package_edges(imports: Iterable[Import], layers=LAYERS) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in imports:
        a, b = package_of(imp.importer, layers), package_of(imp.target, layers)
        if a != b and ours(b):
            edges.setdefault(a, set()).add(b)
    return edges


def render_section(imports: Iterable[Import], allowed: Iterable[Allowance] = (), layers=LAYERS) -> str:
    """Section 6 of docs/ARCHITECTURE.md: the layers, the engine packages the app imports, the rules."""
    edges = package_edges(imports, layers)
    app_uses = sorted(edges.get("app", ()), key=lambda p: (layer_of(p, layers) or 0, p))
    lines = [
        "## 6. Dependency direction",
        "",
        f"Generated from `LAYERS` in `tests/support/import_graph.py` (regenerate: `{REGENERATE}`;",
        "`tests/unit/test_import_graph.py` fails when this section differs). The packages, top to bottom, one",
        "line each (a line naming several is one layer); a package imports its own layer or lower ones. An engine",
        "module's package is the longest name below that covers it.",
        "",
        "| # | Package | What |",
        "|---|---|---|",
    ]
    for rank, (members, what) in enumerate(layers):
        lines.append(f"| {rank + 1} | {', '.join(f'`{m}`' for m in members)} | {what} |")
    lines += [
        "",
        "The engine packages the app imports (inside functions too): " + ", ".join(f"`{p}`" for p in app_uses) + ".",
    ]
    lines += [
        "",
        "The rules (every import counts: module-level, inside functions, under `TYPE_CHECKING`):",
        "",
        "1. layers: no import of a higher layer (so engine never imports app, and neither imports benchmarks);",
        "2. no package cycle;",
        "3. no file circle (two files that import each other, directly or around a loop);",
        "4. no import of another module's private name (`from x import _y`);",
        "5. no private attribute read across modules (`mod._y` on an imported module; `obj._y` where `_y` is",
        "   defined in another module and not in the reading one; `self` / `cls` / `super()` excepted);",
        "6. no string import of our modules (`importlib.import_module(\"engine.x\")`, or a computed name);",
        "7. one source for each fact: " + ", ".join(f"`{n}`" for n in FACTS) + " are assigned in",
        "   `engine/constants.py` only (torch-free; everything else imports them).",
        "",
    ]
    allowed = list(allowed)
    if allowed:
        lines += ["Known violations, allowed while their owners fix them (`ALLOWED` in the test; it fails when one",
                  "no longer occurs):", ""]
        lines += [f"- {a.rule} `{' / '.join(a.key)}`: {a.why}" for a in allowed]
    else:
        lines.append("Known violations allowed: none.")
    return "\n".join(lines) + "\n"


def doc_section(text: str) -> str | None:
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def replace_section(text: str, section: str) -> str:
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        return f"{head}{BEGIN}\n{section}{END}{tail}"
    start = re.search(r"^## 6\. .*$", text, re.M)
    nxt = re.search(r"^## 7\. .*$", text, re.M)
    if not start or not nxt:
        raise ValueError("docs/ARCHITECTURE.md has no section 6 / 7 headings to place the generated part")
    return f"{text[:start.start()]}{BEGIN}\n{section}{END}\n\n{text[nxt.start():]}"


def report(result: Scan, allowed: Iterable[Allowance], doc_text: str, layers=LAYERS) -> tuple[list[str], bool]:
    """The command's findings on a scan, in words, and whether everything holds: the violations no allowance
    covers, the allowances no longer needed, and whether ``doc_text``'s section 6 is the rendered one."""
    allowed = list(allowed)
    lines: list[str] = []
    violations = check(result, layers, allowed)
    stale = stale_allowances(result, allowed, layers)
    current = doc_section(doc_text) == render_section(result.imports, allowed, layers)
    n = len(result.sources)
    if violations:
        lines.append(f"{len(violations)} violation(s) of the import rules in {n} modules:")
        lines += [f"  {v}" for v in violations]
    else:
        lines.append(f"the import rules hold over {n} modules ({len(allowed)} known violations allowed)")
    if stale:
        lines.append("allowances no longer needed (remove them from ALLOWED in tests/unit/test_import_graph.py):")
        lines += [f"  {a.rule} {' / '.join(a.key)}: {a.why}" for a in stale]
    lines.append(f"section 6 of {DOC.relative_to(ROOT)} is " + ("current" if current else
                                                             f"out of date: regenerate it with {REGENERATE}"))
    return lines, not violations and not stale and current


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.import_graph``: no flag prints the rules' check and whether section 6 is current
    (status 1 when something fails); ``--map`` prints section 6 as rendered; ``--write`` writes it into
    docs/ARCHITECTURE.md; ``--check`` says nothing, its status 1 when section 6 differs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.support.import_graph", allow_abbrev=False,
                                     description="The packages' import graph: its rules and section 6 of "
                                                 "docs/ARCHITECTURE.md.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="regenerate section 6 of docs/ARCHITECTURE.md")
    mode.add_argument("--check", action="store_true", help="exit with status 1 when section 6 is out of date")
    mode.add_argument("--map", action="store_true", help="print section 6 as the graph renders it")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.unit.test_import_graph import ALLOWED  # the allow-list lives beside the tests

    result = scan(scan_tree())
    section = render_section(result.imports, ALLOWED)
    if args.write:
        DOC.write_text(replace_section(DOC.read_text(encoding="utf-8"), section), encoding="utf-8")
        print(f"wrote section 6 of {DOC.relative_to(ROOT)}")
        return 0
    if args.check:
        return 0 if doc_section(DOC.read_text(encoding="utf-8")) == section else 1
    if args.map:
        print(section, end="")
        return 0
    lines, ok = report(result, ALLOWED, DOC.read_text(encoding="utf-8"))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
