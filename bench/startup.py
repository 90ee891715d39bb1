"""Benchmark: whole-process start-up of `depthlens --help` and `depthlens info checkpoints/hc_l16`.

    .venv/bin/python bench/startup.py [--runs 9] [--baseline 67760f3]

Each command runs `--runs` times as a fresh process (the CLI as `python -m depthlens.cli ...` runs it, from
a given source tree); the JSON records the median wall time and the median CPU time (user + system of the child,
which a busy machine inflates less than wall time), the machine (CPU model, cores visible, torch threads)
and the load average before and after. `--baseline REF` times the same commands on the code of git commit
REF too (a temporary `git worktree`, run with the same interpreter and packages), interleaved run by
run with the current code so both see the same load. Writes reports/bench/startup.json.

Bytecode is cached as in an installed package: the child processes run without PYTHONDONTWRITEBYTECODE (which a
sandbox may set, and which makes every run compile each depthlens module again) and write their .pyc files to a
temporary PYTHONPYCACHEPREFIX, never into the source tree; the warm-up run (not counted) fills it. The JSON
records this under "bytecode".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"help": ["--help"], "info": ["info", "checkpoints/hc_l16"]}


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "cpu": cpu,
        "cores_visible": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# the package from a given source tree: the editable install's finder (which would pick this checkout whatever
# sys.path says) is taken off, the tree put first; then the CLI runs as `python -m depthlens.cli` would run it
_RUN = (
    "import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in type(f).__name__]; "
    "sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'depthlens'; "
    "runpy.run_module('depthlens.cli', run_name='__main__', alter_sys=True)"
)


_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # PYTHONPYCACHEPREFIX: main()


def one_run(args: list[str], tree: Path) -> tuple[float, float]:
    """(wall s, child CPU s) of one process running the CLI of source tree `tree` with ARGS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", _RUN, str(tree), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=_ENV,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"bench/startup.py: depthlens {' '.join(args)} failed: {r.stderr.strip()[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _head() -> str | None:
    """The commit of the tree measured as "current" (with " + edits" when it has uncommitted changes)."""
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "depthlens"], cwd=ROOT, capture_output=True, text=True
    )
    if sha.returncode != 0:
        return None
    return sha.stdout.strip() + (" + edits" if dirty.stdout.strip() else "")


def summary(samples: list[tuple[float, float]]) -> dict[str, Any]:
    walls, cpus = [w for w, _ in samples], [c for _, c in samples]
    return {
        "median_wall_s": round(statistics.median(walls), 3),
        "median_cpu_s": round(statistics.median(cpus), 3),
        "min_wall_s": round(min(walls), 3),
        "runs": len(samples),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--baseline", default=None, help="git commit to time as well (a temporary worktree)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports/bench/startup.json")
    a = ap.parse_args()
    pycache = tempfile.mkdtemp(prefix="dl-startup-pyc-")
    _ENV["PYTHONPYCACHEPREFIX"] = pycache
    variants: dict[str, Path] = {"current": ROOT}
    tmp = None
    if a.baseline:
        tmp = tempfile.mkdtemp(prefix="dl-startup-")
        subprocess.run(
            ["git", "worktree", "add", "--detach", tmp, a.baseline], cwd=ROOT, check=True, capture_output=True
        )
        variants["baseline"] = Path(tmp)
    load_before = os.getloadavg()
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {v: {c: [] for c in COMMANDS} for v in variants}
    torch_runs = []
    try:
        for pp in variants.values():  # warm the file cache and the bytecode cache (first run not counted)
            for args in COMMANDS.values():
                one_run(args, pp)
        for _ in range(a.runs):
            for v, pp in variants.items():
                for c, args in COMMANDS.items():
                    samples[v][c].append(one_run(args, pp))
        load_after = os.getloadavg()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, env=_ENV)  # warm-up, not counted
        for _ in range(a.runs):  # the floor of any command that builds a model: `import torch` alone
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch"], check=True, env=_ENV)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            torch_runs.append((time.perf_counter() - t0, cpu))
    finally:
        if tmp:
            subprocess.run(["git", "worktree", "remove", "--force", tmp], cwd=ROOT, check=False, capture_output=True)
        shutil.rmtree(pycache, ignore_errors=True)
    out: dict[str, Any] = {
        "what": "whole-process start-up: `python -m depthlens.cli --help` and `... info checkpoints/hc_l16`",
        "machine": machine(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "commit_current": _head(),
        "commit_baseline": a.baseline,
        "bytecode": "cached: PYTHONDONTWRITEBYTECODE unset, .pyc files in a temporary PYTHONPYCACHEPREFIX "
        "(filled by an uncounted warm-up run), as an installed package has them",
        "targets_s": {"help": 0.3, "info": 1.5},
    }
    for v in variants:
        out[v] = {c: summary(s) for c, s in samples[v].items()}
    out["import_torch_alone"] = summary(torch_runs)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
