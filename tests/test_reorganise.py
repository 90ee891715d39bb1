"""scripts/dev/reorganise.py on a small fake package: relative and absolute imports across moved modules,
a re-export of the old package, a split `from pkg import a, b`, a renamed module, strings and docs; the result
imports and runs, a second run changes nothing, and a module the table lacks stops the run with its name.

reorganise: leave this file as it is (its fake tree names the old packages on purpose)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "dev" / "reorganise.py"

FAKE = {
    "depthlens/__init__.py": "",
    "depthlens/errors.py": "class DepthlensError(Exception):\n    pass\n",
    "depthlens/analysis/__init__.py": '"""old package"""\n',
    "depthlens/analysis/metrics.py": "def late(n):\n    return n // 4\n",
    "depthlens/analysis/stats.py": "from .metrics import late\n\n\ndef share(n):\n    return late(n) + 1\n",
    "depthlens/analysis/registry.py": (
        "from ..errors import DepthlensError\n"
        "from . import stats\n"
        "from depthlens.analysis.evaldata import (rows,\n"
        "                                        seqs)  # keep\n\n"
        'ENGINE = "depthlens.analysis.causal:run"\n\n\n'
        "def lookup(n):\n"
        "    if n < 0:\n"
        "        raise DepthlensError(n)\n"
        "    return stats.share(n) + rows() + seqs()\n"
    ),
    "depthlens/analysis/evaldata.py": "def rows():\n    return 10\n\n\ndef seqs():\n    return 100\n",
    "depthlens/analysis/causal.py": "from .evaldata import rows\n\n\ndef run():\n    return rows()\n",
    "depthlens/analysis/plots.py": "def draw():\n    return 'drawn'\n",
    "depthlens/report/__init__.py": '"""old package"""\n\nfrom .build import build_report\n',
    "depthlens/report/build.py": (
        "import importlib\n\n"
        "from ..analysis import plots, registry\n"
        "from ..analysis.stats import share as sh\n"
        "from .render import page\n\n\n"
        "def build_report(n):\n"
        "    mod, fn = registry.ENGINE.split(':')\n"
        "    run = getattr(importlib.import_module(mod), fn)\n"
        "    return page(registry.lookup(n) + sh(n) + run(), plots.draw())\n"
    ),
    "depthlens/report/render.py": "def page(x, y):\n    return f'{x}:{y}'\n",
    "depthlens/cli/__init__.py": "",
    "depthlens/cli/report.py": (
        "def main(n):\n"
        "    from depthlens.report import build_report\n"
        "    from depthlens.analysis import stats\n"
        "    import depthlens.analysis.api as _unused  # noqa: F401\n"
        "    return build_report(n), stats.share(n)\n"
    ),
    "depthlens/analysis/api.py": '"""import depthlens.analysis.api as dl"""\n',
    "tests/test_architecture.py": 'LAYER = {"models": 0, "analysis": 4, "report": 6, "cli": 7}\n',
    "docs/architecture.md": (
        "See `depthlens/analysis/causal.py` and report/build.py.\n\n```python\n"
        "from depthlens.analysis import plots, registry\n```\n"
        'A new engine: `depthlens/analysis/branch.py`, "depthlens.analysis.branch:run".\n'
    ),
}
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": ["from depthlens.analysis import plots, stats\n", "plots.draw()"],
        }
    ],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def _tree(root: Path) -> None:
    for rel, text in FAKE.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    (root / "docs" / "explore.ipynb").write_text(json.dumps(NOTEBOOK, indent=1) + "\n", encoding="utf-8")


def _run(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root), "--no-git", *extra], capture_output=True, text=True, timeout=60
    )


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_moves_rewrite_imports_and_the_result_runs(tmp_path):
    _tree(tmp_path)
    r = _run(tmp_path)
    assert r.returncode == 0, r.stderr
    pkg = tmp_path / "depthlens"
    assert not (pkg / "analysis").exists() and not (pkg / "report").exists()
    assert (pkg / "stats" / "shares.py").is_file() and (pkg / "render" / "pages.py").is_file()
    assert (pkg / "studies" / "report.py").is_file() and (pkg / "runtime" / "evaldata.py").is_file()
    build = (pkg / "studies" / "report.py").read_text()
    assert "from ..render import plots\nfrom ..diagnostics import registry\n" in build  # split per folder
    assert "from ..stats.shares import share as sh\n" in build and "from ..render.pages import page\n" in build
    reg = (pkg / "diagnostics" / "registry.py").read_text()
    assert "from ..stats import shares as stats\n" in reg  # renamed module keeps its local name
    assert "from depthlens.runtime.evaldata import (rows,\n" in reg and "seqs)  # keep" in reg  # layout kept
    assert '"depthlens.diagnostics.causal:run"' in reg
    cli = (pkg / "cli" / "report.py").read_text()
    assert "from depthlens.studies.report import build_report" in cli  # the old package's re-export
    assert "import depthlens.studies.api as _unused" in cli
    assert (tmp_path / "tests" / "test_architecture.py").read_text() == 'LAYER = {"models": 0, "cli": 7}\n'
    doc = (tmp_path / "docs" / "architecture.md").read_text()
    assert "`depthlens/diagnostics/causal.py` and studies/report.py" in doc
    assert "from depthlens.render import plots\nfrom depthlens.diagnostics import registry\n" in doc
    assert '`depthlens/diagnostics/branch.py`, "depthlens.diagnostics.branch:run"' in doc  # no module today
    nb = json.loads((tmp_path / "docs" / "explore.ipynb").read_text())
    assert nb["cells"][0]["source"][:2] == [
        "from depthlens.render import plots\n",
        "from depthlens.stats import shares as stats\n",
    ]
    # the moved package imports and computes what it did before the move
    out = subprocess.run(
        [sys.executable, "-c", "from depthlens.cli.report import main; print(main(8))"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('126:drawn', 3)"  # lookup (3+10+100) + sh 3 + run 10; share(8) = 8//4 + 1
    # a second run finds nothing to do
    before = _snapshot(tmp_path)
    r2 = _run(tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert _snapshot(tmp_path) == before
    assert "move " not in r2.stdout and "rewrote" not in r2.stdout


def test_an_unknown_module_stops_the_run_or_is_placed(tmp_path):
    _tree(tmp_path)
    (tmp_path / "depthlens" / "analysis" / "branch.py").write_text("from .metrics import late\n")
    before = _snapshot(tmp_path)
    r = _run(tmp_path)
    assert r.returncode != 0 and "analysis/branch.py" in r.stderr
    assert _snapshot(tmp_path) == before  # nothing touched
    r = _run(tmp_path, "--place", "analysis/branch.py=diagnostics")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "depthlens" / "diagnostics" / "branch.py").read_text() == "from ..stats.metrics import late\n"


def test_the_table_in_the_docstring_is_the_table_in_the_code():
    spec = importlib.util.spec_from_file_location("reorganise", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = {}
    for line in mod.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].endswith(".py") and cells[1].endswith(".py"):
            rows[cells[0][:-3].replace("/", ".")] = cells[1][:-3].replace("/", ".")
    assert rows == mod.MOVES
    assert set(v.split(".")[0] for v in mod.MOVES.values()) <= set(mod.NEW_PACKAGES) | {"io"}


def test_every_moved_module_exists_today_or_was_moved():
    """The table names real modules (before the move) or their new homes (after it)."""
    spec = importlib.util.spec_from_file_location("reorganise", SCRIPT)
    r = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(r)
    root = Path(__file__).parents[1] / "depthlens"
    for old, new in r.MOVES.items():
        assert (root / (old.replace(".", "/") + ".py")).is_file() or (root / (new.replace(".", "/") + ".py")).is_file()
