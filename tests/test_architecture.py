"""The package's layers, read from its own source with `ast` (docs/architecture.md):

    models ← io, data ← adapters, training ← runtime, stats, plotting ← diagnostics ← render ← studies ← cli

A module may import its own layer and the layers below it, never one above (function-level imports
count: a lazy import is still an edge). The root modules (designs, errors, _version) import nothing of
depthlens but each other, and no depthlens module imports the package root back. No import cycles
between modules, lazy or not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).parents[1] / "depthlens"
LAYER = {
    "models": 0,
    "io": 1,
    "data": 1,
    "adapters": 2,
    "training": 2,
    "runtime": 3,
    "stats": 3,
    "plotting": 3,
    "diagnostics": 4,
    "render": 5,
    "studies": 6,
    "cli": 7,
}
ROOT_MODULES = {"depthlens.designs", "depthlens.errors", "depthlens._version", "depthlens.schema"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_edges(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported module) for every depthlens import, at module level or inside functions.
    `from pkg import name` counts as an import of `pkg.name` when that is a module, else of `pkg`."""
    edges = set()
    for mod, path in modules.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
                src = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src for a in node.names]
            else:
                continue
            edges |= {(mod, t) for t in targets if t.split(".")[0] == "depthlens" and t != mod}
    return edges


def _layer(mod: str) -> int | None:
    parts = mod.split(".")
    return LAYER.get(parts[1]) if len(parts) > 1 else None


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def edges() -> frozenset[tuple[str, str]]:
    """The package's import edges, parsed once for this module's tests (about a second each; they only read it)."""
    return frozenset(import_edges(_modules()))


def test_the_checker_sees_edges_and_cycles(edges):
    """The parser finds a known lazy edge, and the cycle finder flags a planted cycle."""
    assert ("depthlens.io.checkpoint", "depthlens._version") in edges  # a function-level import
    assert ("depthlens.cli.analyze", "depthlens.diagnostics.registry") in edges  # `from .. import`
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]


def test_no_import_from_a_lower_layer_up(edges):
    up = sorted(
        f"{a} -> {b}" for a, b in edges if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)
    )
    assert not up, "imports from a lower layer up to a higher one:\n" + "\n".join(up)


# a "module:function" string imported on first use, or its "module:" prefix joined to names later
HOOK = re.compile(r"""["'](depthlens(?:\.\w+)+):\w*["']""")


def string_hook_edges(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(module, hook module) for every "depthlens.x.y:function" string in the package: an import on first use
    that `import_edges` cannot see."""
    return {
        (mod, m.group(1))
        for mod, path in modules.items()
        for m in HOOK.finditer(path.read_text(encoding="utf-8"))
        if m.group(1) != mod
    }


def test_string_named_hooks_never_point_up_and_close_no_cycle(edges):
    """A shipped diagnostic's hooks are callables whose deferred imports are plain edges (checked above); a
    "module:function" hook string (a plug-in's form) is an import edge too, and none may point up or close a cycle."""
    modules = _modules()
    hooks = string_hook_edges(modules)
    assert ("depthlens.diagnostics.causal", "depthlens.diagnostics.causal.engine") in edges
    assert HOOK.search('"depthlens.diagnostics.causal.engine:causal_scores"')  # the checker would see a string
    assert all(b in modules for _, b in hooks), sorted(b for _, b in hooks if b not in modules)
    up = sorted(f"{a} -> {b}" for a, b in hooks if (_layer(a) or 0) < (_layer(b) or 0))
    assert not up, "string hooks pointing up a layer:\n" + "\n".join(up)
    cycles = _cycles(edges | hooks)
    assert not cycles, "import cycles through string hooks:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_root_modules_import_no_layer_and_nothing_imports_the_root(edges):
    bad = sorted(f"{a} -> {b}" for a, b in edges if a in ROOT_MODULES and b not in ROOT_MODULES)
    bad += sorted(f"{a} -> {b}" for a, b in edges if b == "depthlens" and a != "depthlens")
    assert not bad, "\n".join(bad)


def test_no_import_cycle(edges):
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_explicit_design_registry_covers_every_slug():
    """models/residual lists its families explicitly (no registration by import side effect)."""
    from depthlens.designs import SLUGS
    from depthlens.models.residual import _DESIGNS

    assert tuple(_DESIGNS) == SLUGS  # same designs, same order as the slug registry
    src = (PKG / "models" / "residual").glob("*.py")
    assert not [p.name for p in src if "@register" in p.read_text(encoding="utf-8")]
