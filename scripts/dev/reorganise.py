#!/usr/bin/env python3
"""Split `depthlens/analysis/` and `depthlens/report/` into folders that say what they hold (issue 21, item 3).

    python scripts/dev/reorganise.py .                     # move (git mv) and rewrite every reference
    python scripts/dev/reorganise.py . --dry-run           # print the plan, change nothing
    python scripts/dev/reorganise.py . --place analysis/foo.py=diagnostics   # a module the table lacks

Re-runnable: a move already done is skipped, and a reference already rewritten no longer matches, so a
second run changes nothing. Run it once on the merged tree, then `ruff check --fix` and the tests.

The folders, bottom to top (a folder imports its own layer and the layers below it, never above;
tests/test_architecture.py checks it):

    models ← io, data ← adapters, training ← runtime, stats ← diagnostics ← render ← studies ← cli

    runtime      where and how a run happens: eval data and devices, torch.distributed helpers, torchrun spread
    stats        pure numerics on arrays: metrics (torch math), shares/bootstrap, which orderings hold
    diagnostics  the registry, the engines, and what reads the registry's scores (threshold sweeps)
    render       figures, plots, terminal heatmaps, HTML/Markdown pages, the track figure
    studies      workflows over many models: the API, report building, track, definition sensitivity

The table (old module → new module; a file not in it stops the run with a list, see --place):

| old                                   | new                                 | why                                        |
|---------------------------------------|-------------------------------------|--------------------------------------------|
| analysis/registry.py                  | diagnostics/registry.py             | the diagnostics' declarations              |
| analysis/angular.py                   | diagnostics/angular.py              | engine                                     |
| analysis/causal.py                    | diagnostics/causal.py               | engine                                     |
| analysis/permutation.py               | diagnostics/permutation.py          | engine                                     |
| analysis/rank.py                      | diagnostics/rank.py                 | engine                                     |
| analysis/attnres.py                   | diagnostics/attnres.py              | engine                                     |
| analysis/nll.py                       | diagnostics/nll.py                  | engine (teacher-forced NLL on domain sets) |
| analysis/vocab.py                     | diagnostics/vocab.py                | engine support: chunked LM-head loss/KL    |
| analysis/sweep.py                     | diagnostics/sweep.py                | reads the registry's scores (θ grids)      |
| analysis/metrics.py                   | stats/metrics.py                    | pure torch math, no model code             |
| analysis/stats.py                     | stats/shares.py                     | shares, crossings, robustness, bootstrap   |
| analysis/intervals.py                 | stats/intervals.py                  | intervals valid for their statistic        |
| report/orderings.py                   | stats/orderings.py                  | which ordinal claims hold (pure logic)     |
| analysis/dataset.py                   | io/dataset.py                       | result format: xarray conventions, netCDF  |
| analysis/evaldata.py                  | runtime/evaldata.py                 | eval tokens, batch sizes, devices          |
| analysis/distributed.py               | runtime/distributed.py              | torch.distributed helpers (torchrun)       |
| analysis/ranks.py                     | runtime/ranks.py                    | checkpoints over torchrun ranks            |
| analysis/progress.py                  | runtime/progress.py                 | progress callbacks of long work            |
| analysis/causal_arms.py               | diagnostics/causal_arms.py          | engine support: the causal score's arms    |
| analysis/pruning.py                   | diagnostics/pruning.py              | engine: layer-pruning curves               |
| analysis/study.py                     | studies/study.py                    | models x diagnostics x one eval set        |
| analysis/summaries.py                 | studies/summaries.py                | what a report row and a track series hold  |
| report/write.py                       | studies/write.py                    | writing a report directory atomically      |
| report/reproducible.py                | studies/reproducible.py             | byte-identical report files, timings apart |
| analysis/plots.py                     | render/plots.py                     | heatmaps, share curves, terminal heatmap   |
| report/figures.py                     | render/figures.py                   | report figures                             |
| report/render.py                      | render/pages.py                     | index.html and README.md                   |
| report/track.py                       | render/track.py                     | the track figure and Markdown section      |
| analysis/api.py                       | studies/api.py                      | Python entry points (workflows)            |
| analysis/track.py                     | studies/track.py                    | every diagnostic over training snapshots   |
| report/build.py                       | studies/report.py                   | compute, summarise and write a report      |
| report/sensitivity.py                 | studies/sensitivity.py              | one model under every definition           |

`analysis/__init__.py` and `report/__init__.py` are removed, not kept as shims: nothing outside the two
packages imports them, and `from depthlens.report import build_report` (the one re-export in use) is rewritten
to `from depthlens.studies.report import build_report` (the re-exports are read from the old `__init__`).

What is rewritten, in depthlens/, tests/, bench/, scripts/ (*.py, *.sh), docs/ (*.md, the notebook), README.md
and pyproject.toml:
- every import (found with `ast`, its exact span replaced; other lines untouched): absolute
  (`import depthlens.analysis.api as dl`, `from depthlens.analysis.causal import x`,
  `from depthlens.analysis import causal, plots` → split per new folder) and relative (resolved against the
  file's own package, mapped, and written again relative to the file's new location);
- every other dotted name (`"depthlens.analysis.branch:branch_share_dataset"`, `mock.patch` targets,
  docstrings) and path (`depthlens/analysis/causal.py`, `report/build.py`) of a moved module;
- tests/test_architecture.py: the old `analysis`/`report` entries of its layer table are dropped;
- a name under `depthlens.analysis` that is no module today (docs/architecture.md's worked example,
  `depthlens/analysis/branch.py`, and the test that builds it) is taken to be a new engine: `diagnostics`.
A file that says `reorganise: leave this file as it is` is left alone (this script's own test).
Afterwards, references to the old packages that no rule could map are printed (exit status 0: review them).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

PKG = "depthlens"
OLD_PACKAGES = ("analysis", "report")
NEW_PACKAGES = {
    "runtime": "Where and how a run happens: eval data and devices, torch.distributed helpers, the torchrun spread.",
    "stats": "Pure numerics on arrays: diagnostic math, late-window shares and the bootstrap, ordinal claims.",
    "diagnostics": "The diagnostic registry, the engines, and the threshold sweeps over the registry's scores.",
    "render": "Figures, plots, terminal views and the HTML/Markdown pages of a report.",
    "studies": "Workflows over many models: the Python API, report building, track, definition sensitivity.",
}
# old module (under depthlens/) -> new module; keep in step with the table in the docstring
MOVES = {
    "analysis.registry": "diagnostics.registry",
    "analysis.angular": "diagnostics.angular",
    "analysis.causal": "diagnostics.causal",
    "analysis.permutation": "diagnostics.permutation",
    "analysis.rank": "diagnostics.rank",
    "analysis.attnres": "diagnostics.attnres",
    "analysis.nll": "diagnostics.nll",
    "analysis.vocab": "diagnostics.vocab",
    "analysis.sweep": "diagnostics.sweep",
    "analysis.metrics": "stats.metrics",
    "analysis.stats": "stats.shares",
    "analysis.intervals": "stats.intervals",
    "report.orderings": "stats.orderings",
    "analysis.dataset": "io.dataset",
    "analysis.evaldata": "runtime.evaldata",
    "analysis.distributed": "runtime.distributed",
    "analysis.ranks": "runtime.ranks",
    "analysis.progress": "runtime.progress",
    "analysis.causal_arms": "diagnostics.causal_arms",
    "analysis.pruning": "diagnostics.pruning",
    "analysis.study": "studies.study",
    "analysis.summaries": "studies.summaries",
    "report.write": "studies.write",
    "report.reproducible": "studies.reproducible",
    "analysis.plots": "render.plots",
    "report.figures": "render.figures",
    "report.render": "render.pages",
    "report.track": "render.track",
    "analysis.api": "studies.api",
    "analysis.track": "studies.track",
    "report.build": "studies.report",
    "report.sensitivity": "studies.sensitivity",
}
TEXT_SUFFIXES = {".md", ".sh", ".toml", ".ipynb", ".yaml", ".yml", ".cfg", ".txt"}
SCAN = ("depthlens", "tests", "bench", "scripts", "docs", "README.md", "pyproject.toml", ".pre-commit-config.yaml")
THIS = Path(__file__).resolve()
LEAVE = "reorganise: leave this file as it is"
NEW_ENGINE_FOLDER = "diagnostics"  # where a name under depthlens.analysis that is no module today goes


class Plan:
    """The full module map (old dotted name -> new dotted name, both absolute) and the old packages' re-exports."""

    def __init__(self, root: Path, places: dict[str, str]):
        self.root = root
        moves = {f"{PKG}.{a}": f"{PKG}.{b}" for a, b in MOVES.items()}
        unknown = []
        for old in OLD_PACKAGES:
            for p in sorted((root / PKG / old).glob("*.py")):
                if p.name == "__init__.py":
                    continue
                key = f"{old}/{p.name}"
                mod = f"{PKG}.{old}.{p.stem}"
                if key in places:
                    moves[mod] = f"{PKG}.{places[key]}.{p.stem}"
                elif mod not in moves:
                    unknown.append(key)
            if (root / PKG / old).is_dir() and any(
                d.is_dir() and d.name != "__pycache__" for d in (root / PKG / old).iterdir()
            ):
                raise SystemExit(f"reorganise: {PKG}/{old}/ has a subpackage; add it to the table by hand")
        if unknown:
            raise SystemExit(
                "reorganise: modules not in the table (add them to MOVES, or pass "
                "--place OLD=FOLDER, FOLDER one of " + ", ".join(NEW_PACKAGES) + "):\n  " + "\n  ".join(unknown)
            )
        self.moves = moves
        self.reexports: dict[str, dict[str, str]] = {}  # old package -> {name: old defining module}
        for old in OLD_PACKAGES:
            init = root / PKG / old / "__init__.py"
            if init.is_file():
                self.reexports[f"{PKG}.{old}"] = _reexports(init, f"{PKG}.{old}")

    def map(self, mod: str) -> str:
        """The new name of an old module or of anything inside it (longest old prefix wins)."""
        parts = mod.split(".")
        for k in range(len(parts), 1, -1):
            head = ".".join(parts[:k])
            if head in self.moves:
                return ".".join([self.moves[head], *parts[k:]])
        return mod

    def is_old_package(self, mod: str) -> bool:
        return mod in {f"{PKG}.{o}" for o in OLD_PACKAGES}


def _reexports(init: Path, package: str) -> dict[str, str]:
    out = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            src = _resolve(node.module, node.level, package)
            for a in node.names:
                out[a.asname or a.name] = src
    return out


def _resolve(module: str | None, level: int, package: str) -> str:
    """Absolute module of `from <level dots><module> import ...` written in `package`."""
    if not level:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - level + 1]
    return ".".join(base + ([module] if module else []))


def _relative(target: str, package: str) -> tuple[int, str]:
    """(level, module) such that `from <level dots><module>` in `package` names `target`."""
    t, p = target.split("."), package.split(".")
    common = 0
    while common < min(len(t), len(p)) and t[common] == p[common]:
        common += 1
    return len(p) - common + 1, ".".join(t[common:])


def _module_of(path: Path, root: Path) -> tuple[str, str]:
    """(module, package) of a .py file under root."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        mod = ".".join(parts[:-1])
        return mod, mod
    mod = ".".join(parts)
    return mod, mod.rpartition(".")[0]


class Rewriter:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.old_modules = set(plan.moves)
        dotted = sorted(plan.moves, key=len, reverse=True)
        self._dotted = re.compile(r"(?<![\w.])(" + "|".join(re.escape(d) for d in dotted) + r")(?![\w])")
        paths = {}
        for old, new in plan.moves.items():
            o, n = old.split(".")[1:], new.split(".")[1:]
            paths["/".join(o)] = "/".join(n)
        self._paths = paths
        keys = sorted(paths, key=len, reverse=True)
        self._path_re = re.compile(
            r"(?<![\w.-])((?:depthlens/)?)(" + "|".join(re.escape(k) for k in keys) + r")(?=\.py\b|[.:`\s)]|$)"
        )

    # --- text -----------------------------------------------------------------------------------
    _NEW_ENGINE = re.compile(r"(?<![\w.])depthlens([./])analysis\1(?=[a-z_]\w*)")

    def text(self, s: str) -> str:
        s = self._dotted.sub(lambda m: self.plan.map(m.group(1)), s)
        s = self._path_re.sub(lambda m: m.group(1) + self._paths[m.group(2)], s)
        return self._NEW_ENGINE.sub(lambda m: f"depthlens{m.group(1)}{NEW_ENGINE_FOLDER}{m.group(1)}", s)

    # --- imports --------------------------------------------------------------------------------
    def _targets(
        self, node: ast.ImportFrom, package: str, moving: bool = False
    ) -> list[tuple[str, str, str | None]] | None:
        """For each alias: (new 'from' module, imported name, asname), absolute; None if nothing moves
        (`moving`: the importing file itself moves, so a relative import is written again anyway)."""
        base = _resolve(node.module, node.level, package)
        if (
            not base.startswith(f"{PKG}.")
            or not (moving and node.level)
            and not any(base == o or base.startswith(o + ".") or o.startswith(base + ".") for o in self.old_modules)
        ):
            return None
        out, moved = [], False
        for a in node.names:
            full = f"{base}.{a.name}"
            if full in self.old_modules:  # `from pkg import module`
                new = self.plan.map(full)
                parent, _, name = new.rpartition(".")
                asname = a.asname or (a.name if name != a.name else None)
                out.append((parent, name, asname))
                moved = True
            elif self.plan.is_old_package(base) and a.name != "*":
                src = self.plan.reexports.get(base, {}).get(a.name)
                if src is None:
                    raise SystemExit(
                        f"reorganise: `from {base} import {a.name}`: not a module and not a "
                        f"re-export of {base}/__init__.py; rewrite it by hand"
                    )
                out.append((self.plan.map(src), a.name, a.asname))
                moved = True
            else:
                new = self.plan.map(base)
                moved |= new != base
                out.append((new, a.name, a.asname))
        return out if moved or (moving and node.level) else None

    def _emit(self, groups: dict[str, list[tuple[str, str | None]]], relative_in: str | None, indent: str) -> str:
        lines = []
        for mod, names in groups.items():
            if relative_in is not None:
                level, rel = _relative(mod, relative_in)
                src = "." * level + rel
            else:
                src = mod
            items = [n if a is None else f"{n} as {a}" for n, a in names]
            line = f"from {src} import {', '.join(items)}"
            if len(indent) + len(line) > 120:  # hanging indent aligned with the parenthesis, as the code base does
                head = f"from {src} import ("
                rows, cur = [], head
                for i, item in enumerate(items):
                    piece = item + (")" if i == len(items) - 1 else ",")
                    if cur != head and len(indent) + len(cur) + 1 + len(piece) > 120:
                        rows.append(cur)
                        cur = " " * len(head) + piece
                    else:
                        cur += ("" if cur == head else " ") + piece
                rows.append(cur)
                line = ("\n" + indent).join(rows)
            lines.append(line)
        return ("\n" + indent).join(lines)

    def python(self, src: str, package: str, new_package: str) -> str:
        """Rewrite imports of moved modules in Python source (module `package` before the move,
        `new_package` after), then every other dotted name and path."""
        try:
            tree = ast.parse(src)
        except SyntaxError:
            return self.lines(src)
        lines = src.splitlines(keepends=True)
        offsets = [0]
        for ln in lines:
            offsets.append(offsets[-1] + len(ln))
        edits = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = self._targets(node, package, moving=package != new_package)
                if targets is None:
                    continue
                start = offsets[node.lineno - 1] + node.col_offset
                end = offsets[node.end_lineno - 1] + node.end_col_offset
                indent = " " * node.col_offset
                groups: dict[str, list[tuple[str, str | None]]] = {}
                for mod, name, asname in targets:
                    groups.setdefault(mod, []).append((name, asname))
                old_text = src[start:end]
                same_names = [(a.name, a.asname) for a in node.names] == [(n, a) for _, n, a in targets]
                if len(groups) == 1 and same_names:  # keep the statement's own layout: swap the module only
                    (mod,) = groups
                    if node.level:
                        level, rel = _relative(mod, new_package)
                        new_src = "." * level + rel
                    else:
                        new_src = mod
                    new_text = re.sub(r"^from\s+[.\w]+", "from " + new_src, old_text, count=1)
                else:
                    new_text = self._emit(groups, new_package if node.level else None, indent)
                edits.append((start, end, new_text))
            elif isinstance(node, ast.Import):
                # plain `import a.b.c [as x]`: the dotted-name pass below rewrites it in place
                for a in node.names:
                    if self.plan.is_old_package(a.name):
                        raise SystemExit(
                            f"reorganise: `import {a.name}` imports a package that is removed; rewrite it by hand"
                        )
        out = src
        for start, end, new_text in sorted(edits, reverse=True):
            out = out[:start] + new_text + out[end:]
        return self.text(out)

    _IMPORT_LINE = re.compile(
        r"^(\s*)(from\s+depthlens\.(?:analysis|report)\b[^\n]*|import\s+depthlens\.[^\n]*)$", re.M
    )

    def lines(self, s: str) -> str:
        """Non-Python text (Markdown code, notebook cells that do not parse): one-line absolute imports, then
        dotted names and paths."""

        def one(m: re.Match[str]) -> str:
            indent, stmt = m.group(1), m.group(2)
            code, hash_, comment = stmt.partition("  #")
            try:
                node = ast.parse(code.strip()).body[0]
            except (SyntaxError, IndexError):
                return m.group(0)
            if isinstance(node, ast.ImportFrom) and not node.level:
                targets = self._targets(node, PKG)
                if targets is not None:
                    groups: dict[str, list[tuple[str, str | None]]] = {}
                    for mod, name, asname in targets:
                        groups.setdefault(mod, []).append((name, asname))
                    return indent + self._emit(groups, None, indent) + (hash_ + comment if hash_ else "")
            return m.group(0)

        return self.text(self._IMPORT_LINE.sub(one, s))

    def notebook(self, raw: str) -> str:
        nb = json.loads(raw)
        for cell in nb.get("cells", []):
            src = "".join(cell.get("source", []))
            new = self.python(src, PKG, PKG) if cell.get("cell_type") == "code" else self.text(src)
            if new != src:
                cell["source"] = new.splitlines(keepends=True)
        indent = 1 if raw.startswith('{\n "') else 2
        return json.dumps(nb, indent=indent, ensure_ascii=False) + ("\n" if raw.endswith("\n") else "")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True)


def _files(root: Path) -> list[Path]:
    out = []
    for entry in SCAN:
        p = root / entry
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [
                f
                for f in sorted(p.rglob("*"))
                if f.is_file() and "__pycache__" not in f.parts and (f.suffix == ".py" or f.suffix in TEXT_SUFFIXES)
            ]
    return [f for f in out if f.resolve() != THIS and LEAVE not in f.read_text(encoding="utf-8")]


def _drop_old_layers(src: str) -> str:
    """tests/test_architecture.py: remove the `"analysis": n, "report": n` entries of the layer table."""
    return re.sub(r',?\s*"(?:analysis|report)":\s*\d+(?=\s*[,}])', "", src)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="the repository root")
    ap.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    ap.add_argument(
        "--place",
        action="append",
        default=[],
        metavar="OLD=FOLDER",
        help="put a module the table lacks, e.g. analysis/foo.py=diagnostics",
    )
    ap.add_argument("--no-git", action="store_true", help="plain renames instead of `git mv` (tests)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    places = {}
    for item in args.place:
        old, _, folder = item.partition("=")
        if folder not in NEW_PACKAGES and folder not in ("io", "data", "adapters", "training", "cli"):
            raise SystemExit(f"reorganise: --place {item}: unknown folder {folder!r}")
        places[old] = folder
    plan = Plan(root, places)
    todo = []
    for old, new in plan.moves.items():
        src = root / (old.replace(".", "/") + ".py")
        dst = root / (new.replace(".", "/") + ".py")
        if src.is_file() and dst.is_file():
            raise SystemExit(f"reorganise: both {src.relative_to(root)} and {dst.relative_to(root)} exist")
        if src.is_file():
            todo.append((old, new, src, dst))
    for old, new, *_ in todo:
        print(f"move {old} -> {new}")
    if args.dry_run:
        return 0
    rw = Rewriter(plan)
    new_of = {src: dst for _, _, src, dst in todo}

    # 1. rewrite every file where it lies (its old package resolves its relative imports)
    for f in _files(root):
        raw = f.read_text(encoding="utf-8")
        if f.suffix == ".py":
            mod, package = _module_of(f, root)
            dst = new_of.get(f, f)
            _, new_package = _module_of(dst, root)
            if f.parent.name in OLD_PACKAGES and f.name == "__init__.py" and f.parent.parent.name == PKG:
                continue  # removed below
            out = rw.python(raw, package, new_package)
            if f.name == "test_architecture.py":
                out = _drop_old_layers(out)
        elif f.suffix == ".ipynb":
            out = rw.notebook(raw)
        else:
            out = rw.lines(raw)
        if out != raw:
            f.write_text(out, encoding="utf-8")
            print(f"rewrote {f.relative_to(root)}")

    # 2. new packages, then the moves
    for name, doc in NEW_PACKAGES.items():
        init = root / PKG / name / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(f'"""{doc}"""\n', encoding="utf-8")
            if not args.no_git:
                _git(root, "add", str(init.relative_to(root)))
    for _, _, src, dst in todo:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if args.no_git:
            src.rename(dst)
        else:
            _git(root, "mv", str(src.relative_to(root)), str(dst.relative_to(root)))
    for old in OLD_PACKAGES:
        d = root / PKG / old
        left = [p for p in d.glob("*.py") if p.name != "__init__.py"] if d.is_dir() else []
        if d.is_dir() and not left:
            init = d / "__init__.py"
            if init.exists():
                if args.no_git:
                    init.unlink()
                else:
                    _git(root, "rm", "-q", str(init.relative_to(root)))
            for cache in d.glob("__pycache__/*"):
                cache.unlink()
            for sub in (d / "__pycache__", d):
                if sub.is_dir() and not any(sub.iterdir()):
                    sub.rmdir()

    # 3. what no rule could map
    left_re = re.compile(r"depthlens[./](?:analysis|report)\b(?!s)")
    leftovers = []
    for f in _files(root):
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if left_re.search(line):
                leftovers.append(f"{f.relative_to(root)}:{i}: {line.strip()[:110]}")
    if leftovers:
        print("references to the old packages left for a person to rewrite:", *leftovers, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
