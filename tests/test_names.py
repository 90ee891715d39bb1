"""A diagnostic lives in its package (docs/architecture.md): no module outside `depthlens/diagnostics/<pkg>/` names
one of that package's diagnostics (its name or an alias as a string, docstrings aside) or imports the package,
apart from the registry's list of packages.

The places that still do are listed in KNOWN with the reason each remains; the list only shrinks. The test fails
on a module that names a diagnostic it is not listed for, and on a listed name a module no longer uses (take it
off the list). A plug-in's own names are checked the same way against its package.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

from depthlens.diagnostics import registry

PKG = Path(__file__).resolve().parents[1] / "depthlens"

# module (relative to depthlens/) -> {the diagnostics it names}. Why each remains:
KNOWN: dict[str, set[str]] = {
    # the public facade: one function per shipped diagnostic, typed for IDEs and mypy
    "__init__.py": {"angular", "attnres", "causal", "mixing", "permutation", "rank"},
    "studies/api.py": {"angular", "attnres", "causal", "mixing", "permutation", "rank"},
    # pruning's criteria are the engines' scores, run by name
    "diagnostics/pruning.py": {"angular", "causal", "permutation"},
    "diagnostics/pruning_heldout.py": {"angular", "causal", "permutation"},
    # the paper's claims and the calibration against the paper name the scores the paper reports
    "stats/crossed.py": {"causal", "permutation"},
    "stats/orderings.py": {"causal", "permutation"},
    "studies/claims.py": {"causal", "permutation"},  # the crossed interval method per claimed score (KIND)
    "studies/sensitivity.py": {"angular", "causal", "permutation"},
    # the real-model study's stages are these engines with its own options (both causal variants under each norm,
    # the late pairs) and the pruning criteria they feed (scripts/real_model_report.py, which named them, is its CLI)
    "studies/real_model.py": {"angular", "causal", "permutation"},
    # words that are also names: a lens readout's target "rank", the model capability "depth_mixing"
    "diagnostics/lens/engine.py": {"rank"},
    "diagnostics/lens/summary.py": {"rank"},
    "models/protocol.py": {"mixing"},
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def naming(root: Path = PKG) -> dict[str, set[str]]:
    """module (relative to `root`, a depthlens package tree) -> the diagnostics it names from outside their
    package."""
    names = {n: d.name for d in registry.DIAGNOSTICS for n in (d.name, *d.aliases)}
    package = {
        d.name: p for p in registry.PACKAGES for d in importlib.import_module(f"depthlens.diagnostics.{p}").SPECS
    }
    specs_of = defaultdict(set)
    for name, p in package.items():
        specs_of[p].add(name)
    out: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "diagnostics/registry.py":  # the list of packages
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        here = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if node.value in names:
                    here.add(names[node.value])
            elif isinstance(node, ast.ImportFrom) and node.module:
                here_pkg = ["depthlens", *Path(rel).parent.parts]
                base = here_pkg[: len(here_pkg) - node.level + 1] if node.level else []
                parts = [*base, *node.module.split(".")]
                if parts[:2] == ["depthlens", "diagnostics"] and len(parts) > 2 and parts[2] in specs_of:
                    here |= specs_of[parts[2]]
        own = {n for n, p in package.items() if rel.startswith(f"diagnostics/{p}/")}
        if here - own:
            out[rel] = here - own
    return dict(out)


def test_no_module_names_a_diagnostic_outside_its_package():
    found = naming()
    new = {m: sorted(n - KNOWN.get(m, set())) for m, n in found.items() if n - KNOWN.get(m, set())}
    assert not new, f"modules naming a diagnostic outside its package (use the registry's fields and hooks): {new}"
    stale = {m: sorted(n - found.get(m, set())) for m, n in KNOWN.items() if n - found.get(m, set())}
    assert not stale, f"no longer named there: take these off KNOWN: {stale}"


def test_the_check_sees_a_name_and_an_import(tmp_path):
    """The checker's own positive control, on a planted tree: an alias as a string, relative and absolute imports of
    a package, and a package's own name inside it (allowed); a docstring is not a use."""
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "x.py").write_text('"""perm in a docstring."""\nMETRIC = "perm"\n')
    (tmp_path / "diagnostics" / "rank").mkdir(parents=True)
    (tmp_path / "diagnostics" / "y.py").write_text("from .angular.engine import angular_distances\n")
    (tmp_path / "diagnostics" / "rank" / "z.py").write_text('NAME = "rank"\nfrom ..causal import CAUSAL\n')
    (tmp_path / "w.py").write_text('"""No name here: causal."""\n')
    assert naming(tmp_path) == {
        "cli/x.py": {"permutation"},
        "diagnostics/y.py": {"angular"},
        "diagnostics/rank/z.py": {"causal"},
    }
