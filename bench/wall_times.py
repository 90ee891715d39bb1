"""Benchmark: the wall time of README's two commands and of the quick check, run the way a user runs them.

    .venv/bin/python bench/wall_times.py main-job   # `bash scripts/zoo-report.sh` in this checkout (rewrites reports/zoo),
                                                    # with an empty result cache (--warm: the user's own cache)
    .venv/bin/python bench/wall_times.py suite      # `bash scripts/test.sh -p no:cacheprovider --durations=30`
    .venv/bin/python bench/wall_times.py quick      # the same with -m "not slow"

`suite` and `quick` run in a fresh clone of HEAD into a temporary folder named `depthlens` (the natural name, which
a test once tripped over), with this checkout's venv linked and an empty depthlens cache: what CI and a new user
start from, less the set-up. Run them on idle cores: the record keeps the load average before and after, so a
busy run shows as one. A run that fails is reported and not recorded (it is not a timing of the job).

Each run is appended to reports/bench/wall_times.json: the command, its wall time, pytest's own time and counts
(suite, quick) or the checkpoints and compute/figure seconds of the report (main job), the docs readers' times,
the machine (CPU model, cores), the commit, the date. README's table of measured times is generated from this
file (scripts/doc_numbers.py, fragment `wall-times`); the runs before this script existed are in it too, as their
commit messages recorded them (`source` names the commit), with what those messages did not record left out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "bench" / "wall_times.json"
PYTEST_ARGS = ["-p", "no:cacheprovider", "--durations=30"]
COMMANDS = {
    "main-job": ["bash", "scripts/zoo-report.sh"],
    "suite": ["bash", "scripts/test.sh", *PYTEST_ARGS],
    "quick": ["bash", "scripts/test.sh", "-m", "not slow", *PYTEST_ARGS],
}
JOB_ENV = ("RUNS", "RANKS", "TRACK_ARGS", "TEST_WORKERS")  # the scripts' knobs, recorded when set
DOCS_READER = re.compile(
    r"([\d.]+)s call\s+tests/test_docs\.py::test_every_page_in_readme_order_in_a_fresh_copy\[(.+?)\]"
)


def machine() -> dict[str, Any]:
    """The CPU as train.json records it (`training.provenance.cpu_identity`: model name), the cores visible and the
    host's kernel build: runs on machines that name the same CPU model timed the same suite up to ~1.7x apart on
    different days at a similar load (this file's records), and the kernel build tells such hosts apart."""
    import platform

    from depthlens.training.provenance import cpu_identity

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_identity()["model"], "cores_visible": cores, "kernel": platform.release()}


def commit(tree: Path = ROOT) -> str:
    """The commit measured: this checkout's (main job) or the fresh clone's (suite, quick), "+ edits" if dirty."""
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True, check=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree, capture_output=True, text=True
    )
    return sha.stdout.strip() + (" + edits" if dirty.stdout.strip() else "")


def pytest_summary(log: str) -> dict[str, Any]:
    """pytest's own wall time and counts from its last summary line ('1672 passed, 17 skipped in 909.61s'), and the
    two docs readers' call times from --durations."""
    line = [ln for ln in log.splitlines() if re.search(r"\bin [\d.]+s\b", ln) and ("passed" in ln or "failed" in ln)]
    if not line:
        raise SystemExit("bench/wall_times.py: no pytest summary line in the output")
    last = line[-1]
    counts = {k: int(m.group(1)) for k in ("passed", "skipped", "failed") if (m := re.search(rf"(\d+) {k}", last))}
    seconds = float(re.search(r"\bin ([\d.]+)s\b", last).group(1))  # type: ignore[union-attr]
    readers = {name: float(s) for s, name in DOCS_READER.findall(log)}
    return {"pytest_s": seconds, "tests": counts, "docs_readers_s": readers}


def fresh_clone(tmp: Path) -> Path:
    """A clone of HEAD into tmp/depthlens with this checkout's venv linked (set-up is not what is timed)."""
    clone = tmp / "depthlens"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    return clone


def run(what: str, warm: bool = False) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS")}
    tmp = Path(tempfile.mkdtemp(prefix="dl-wall-"))
    try:
        cwd = ROOT if what == "main-job" else fresh_clone(tmp)
        measured = commit(cwd)
        if what != "main-job":
            env["DEPTHLENS_CACHE"] = str(tmp / "cache")  # an empty cache, as on a new machine
        elif not warm:  # the results of an earlier report would make this a timing of a cache read
            env["DEPTHLENS_RESULTS_CACHE"] = str(tmp / "results")
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        p = subprocess.run(COMMANDS[what], cwd=cwd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        load_after = os.getloadavg()
        log = p.stdout + p.stderr
        if p.returncode != 0:
            sys.stderr.write(log[-4000:])
            raise SystemExit(f"bench/wall_times.py: {shlex.join(COMMANDS[what])} failed ({p.returncode}); not recorded")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rec: dict[str, Any] = {
        "what": what,
        "command": shlex.join(COMMANDS[what]),
        "wall_s": round(wall, 1),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "commit": measured,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "source": "bench/wall_times.py",
    }
    overrides = {k: os.environ[k] for k in JOB_ENV if k in os.environ}
    if overrides:  # what the job was told to do differently (RUNS=/nonexistent: the track step found no snapshots)
        rec["env"] = overrides
    if what == "main-job":
        rec["results_cache"] = "the user's (--warm)" if warm else "empty (a temporary directory)"
        rec["results"] = next((ln.strip() for ln in log.splitlines() if ln.startswith("results: ")), None)
        manifest = json.loads((ROOT / "reports/zoo/manifest.json").read_text())
        timings = json.loads((ROOT / "reports/zoo/timings.json").read_text())
        rec["checkpoints"] = len(manifest["checkpoints"])
        rec["report_seconds"] = timings["seconds"]
    else:
        rec.update(pytest_summary(log))
        rec["where"] = "fresh clone into a folder named depthlens, venv linked, empty DEPTHLENS_CACHE"
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=sorted(COMMANDS))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--warm", action="store_true", help="main-job: keep the user's result cache (default: empty)")
    a = ap.parse_args()
    rec = run(a.what, warm=a.warm)
    data = json.loads(a.out.read_text()) if a.out.exists() else {"runs": []}
    data["runs"].append(rec)
    tmp = a.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(a.out)
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
