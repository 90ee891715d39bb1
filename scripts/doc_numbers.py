"""Regenerate the report-derived numbers in docs/ from the committed data.

    .venv/bin/python scripts/doc_numbers.py          # rewrite every generated fragment in place
    .venv/bin/python scripts/doc_numbers.py --check  # exit 1 and name the stale fragments

A fragment sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->` in a Markdown file; its
text is GENERATORS[NAME](repository root). tests/test_doc_numbers.py runs the check, so a regenerated zoo or
report cannot leave a stale number in the docs.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FRAGMENT = re.compile(r"(<!-- generated:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _train_records(root: Path) -> list[dict]:
    out = []
    for p in sorted((root / "checkpoints").glob("*/train.json")):
        t = json.loads(p.read_text(encoding="utf-8"))
        model = (t.get("recipe") or {}).get("model") or {}
        if "arch" in model and "n_layer" in model:
            out.append(
                {
                    "design": model["arch"],
                    "L": int(model["n_layer"]),
                    "seed": t.get("seed", 0),
                    "loss": t.get("final_val_loss"),
                    "params": (t.get("params") or {}).get("total"),
                    "lr": (t.get("recipe") or {}).get("lr"),
                    "minutes": (t.get("wall_time_s") or 0) / 60,
                }
            )
    return out


def zoo_losses(root: Path) -> str:
    """The CPU-zoo table of docs/training.md: final validation loss per design and depth (seed 0; with more
    seeds, their mean and range), achieved params, peak LR (per seed where they differ) and training wall time of
    seed 0, from checkpoints/*/train.json."""
    from depthlens.designs import SLUGS
    from depthlens.stats.orderings import seed_list

    recs = _train_records(root)
    if not recs:
        return "(no checkpoints/ here)\n"
    depths = sorted({r["L"] for r in recs})
    lines = ["| design | " + " | ".join(f"L={L}" for L in depths) + " |", "|---|" + "---|" * len(depths)]
    for design in [s for s in SLUGS if any(r["design"] == s for r in recs)]:
        cells = []
        for L in depths:
            rs = sorted((r for r in recs if r["design"] == design and r["L"] == L), key=lambda r: r["seed"])
            if not rs:
                cells.append("—")
                continue
            r0 = rs[0]
            loss = f"{r0['loss']:.3f}"
            if len(rs) > 1:
                v = np.array([r["loss"] for r in rs])
                loss = f"{v.mean():.3f} ({len(rs)} seeds {v.min():.3f}–{v.max():.3f})"
            lrs: dict[float, list[int]] = {}
            for r in rs:
                lrs.setdefault(r["lr"], []).append(r["seed"])
            # the seeds of one cell trained at different LRs (an earlier recipe beside the current one) say which
            lr = f"{r0['lr']:g}" if len(lrs) == 1 else " / ".join(f"{v:g} ({seed_list(s)})" for v, s in lrs.items())
            cells.append(f"{loss} ({round(r0['params'] / 1000)}K, LR {lr}, {r0['minutes']:.1f} min)")
        lines.append(f"| {design} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def zoo_recipe_status(root: Path) -> str:
    """Which zoo runs the shipped checkpoints hold from the current recipe (depthlens/recipes/zoo_cpu.json), which
    from an earlier one (the trainer's own staleness rule, `training.recipes.stale_runs`: any recipe field but
    where it is written) and which the recipe names but `checkpoints/` lacks: a summary line and a design x depth
    table of training seeds."""
    import contextlib

    from depthlens.designs import SLUGS
    from depthlens.stats.orderings import seed_list
    from depthlens.training.config import load_recipe, read_recipe, recipe_runs
    from depthlens.training.recipes import stale_runs

    zoo = root / "depthlens" / "recipes" / "zoo_cpu.json"
    names = list(recipe_runs(read_recipe(zoo)))
    with contextlib.chdir(root):  # stale_runs reads each run's export path relative to the working directory
        stale = set(stale_runs(zoo, names))
    cells: dict[tuple[str, int], dict[str, list[int]]] = {}
    for name in names:
        r = load_recipe(zoo, run=name).to_dict()
        have = (root / r["export"] / "train.json").is_file()
        state = "not trained" if not have else ("earlier" if name in stale else "current")
        key = (r["model"]["arch"], int(r["model"]["n_layer"]))
        cells.setdefault(key, {}).setdefault(state, []).append(int(r.get("seed", 0)))
    count = {s: sum(len(c.get(s, [])) for c in cells.values()) for s in ("current", "earlier", "not trained")}
    depths = sorted({L for _, L in cells})
    lines = [
        f"{len(names)} runs in the recipe: {count['current']} trained from it, {count['earlier']} from an earlier "
        f"recipe, {count['not trained']} not trained yet (seeds per design and depth):",
        "",
        "| design | " + " | ".join(f"L={L}" for L in depths) + " |",
        "|---|" + "---|" * len(depths),
    ]
    for design in [s for s in SLUGS if any(d == s for d, _ in cells)]:
        row = []
        for L in depths:
            c = cells.get((design, L), {})
            parts = [
                f"{state} {seed_list(sorted(c[state]))}"
                for state in ("current", "earlier", "not trained")
                if c.get(state)
            ]
            row.append(", ".join(parts) or "—")
        lines.append(f"| {design} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# per-checkpoint timings stay out of the docs, in the git-ignored reports/zoo/timings.json (machine facts); the
# wall times of README's commands are committed runs (reports/bench/wall_times.json, bench/wall_times.py).
# README's rows: what each measured command is, and the wall time this project aims for (a goal, not a measurement)
WALL_TIME_ROWS = {
    "main-job": ("`bash scripts/zoo-report.sh`, the main job (wall time)", 15),
    "suite": ("`bash scripts/test.sh`, the whole suite (pytest's time, from a fresh clone)", 10),
    "quick": ('`-m "not slow"`, the quick check (pytest\'s time)', 2),
}


def _seconds(r: dict) -> float:
    return float(r["wall_s"] if r["what"] == "main-job" else r["pytest_s"])


def _duration(s: float) -> str:
    return f"{s:.0f} s ({s / 60:.1f} min)" if s >= 120 else f"{s:.0f} s"


def _run_facts(r: dict) -> str:
    """What a run measured besides its time: checkpoints or tests, the docs readers, the CPU."""
    facts = []
    if r.get("checkpoints"):
        facts.append(f"{r['checkpoints']} checkpoints")
    tests = r.get("tests") or {}
    if tests:
        facts.append(", ".join(f"{n} {k}" for k, n in tests.items()))
    readers = r.get("docs_readers_s") or {}
    if readers:
        facts.append("docs readers " + " and ".join(f"{v:.0f} s" for v in readers.values()))
    cpu = r["machine"].get("cpu") or "CPU not recorded"
    kernel = r["machine"].get("kernel")  # tells hosts with the same CPU model apart (bench/wall_times.py machine)
    facts.append(f"{cpu} (kernel {kernel})" if kernel else cpu)
    if r.get("env"):  # the scripts' knobs the run set (RUNS=/nonexistent: the track step found no snapshots)
        facts.append("with " + " ".join(f"{k}={v}" for k, v in r["env"].items()))
    return "; ".join(facts)


def wall_times(root: Path) -> str:
    """README's table of measured times: per command, its latest run and the range of the earlier ones, from
    reports/bench/wall_times.json (bench/wall_times.py appends a run)."""
    path = root / "reports" / "bench" / "wall_times.json"
    if not path.is_file():
        return "(no reports/bench/wall_times.json here)\n"
    runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    lines = ["| command | latest run | earlier runs | aim |", "|---|---|---|---|"]
    for what, (label, aim) in WALL_TIME_ROWS.items():
        mine = [r for r in runs if r["what"] == what]
        if not mine:
            continue
        last, earlier = mine[-1], mine[:-1]
        latest = f"{_duration(_seconds(last))} on {last['date']}: {_run_facts(last)}"
        before = "—"
        if earlier:
            secs = [x for r in earlier for x in (r.get("pytest_s_range") or [_seconds(r)])]
            cpus = sorted({r["machine"].get("cpu") or "CPU not recorded" for r in earlier})
            days = sorted({r["date"] for r in earlier})
            span = f"{days[0]} to {days[-1]}" if len(days) > 1 else days[0]
            sizes = sorted({r["checkpoints"] for r in earlier if r.get("checkpoints")})
            passed = sorted({r["tests"]["passed"] for r in earlier if (r.get("tests") or {}).get("passed")})
            size = f"{'/'.join(map(str, sizes))} checkpoints; " if sizes else ""
            size += f"{passed[0]}–{passed[-1]} tests passed; " if len(passed) > 1 else ""
            n = f"{len(earlier)} run{'s' if len(earlier) > 1 else ''}"
            before = f"{min(secs):.0f}–{max(secs):.0f} s ({n}, {span}; {size}{', '.join(cpus)})"
        lines.append(f"| {label} | {latest} | {before} | {aim} min |")
    return "\n".join(lines) + "\n"


def main_job_timing(root: Path) -> str:
    """docs/performance.md's sentence on the main job's latest timing (reports/bench/wall_times.json), with the
    size it ran at: its checkpoint count and the report's compute and figure seconds."""
    path = root / "reports" / "bench" / "wall_times.json"
    runs = [r for r in json.loads(path.read_text(encoding="utf-8"))["runs"] if r["what"] == "main-job"]
    if not runs:
        return "(the main job has not been timed here: `bench/wall_times.py main-job`)\n"
    r = runs[-1]
    rep = r.get("report_seconds") or {}
    parts = (
        f", of which the report's compute was {rep['compute']:.0f} s and its figures {rep['figures']:.0f} s"
        if rep
        else ""
    )
    cache = r.get("results_cache", "result cache not recorded")
    return (
        f"The latest timing, {r['date']} at commit {r['commit']} on {r['machine'].get('cpu') or 'a CPU not recorded'} "
        f"({r.get('checkpoints', '?')} checkpoints; result cache: {cache}; load average before "
        f"{r['load_average_before'][0]:.2f}): {r['wall_s']:.0f} s ({r['wall_s'] / 60:.1f} minutes){parts}.\n"
    )


GENERATORS: dict[str, Callable[[Path], str]] = {
    "zoo-losses": zoo_losses,
    "zoo-recipe-status": zoo_recipe_status,
    "wall-times": wall_times,
    "main-job-timing": main_job_timing,
}


def render(text: str, root: Path = ROOT) -> str:
    """`text` with every generated fragment replaced by its generator's output."""

    def sub(m: re.Match) -> str:
        gen = GENERATORS.get(m.group("name"))
        return m.group(0) if gen is None else m.group(1) + gen(root) + m.group(4)

    return FRAGMENT.sub(sub, text)


def stale(root: Path = ROOT) -> list[str]:
    """Files whose generated fragments differ from what the committed data gives."""
    out = []
    for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = p.read_text(encoding="utf-8")
        if FRAGMENT.search(text) and render(text, root) != text:
            out.append(str(p.relative_to(root)))
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for p in bad:
            print(f"{p}: generated numbers are stale; run .venv/bin/python scripts/doc_numbers.py", file=sys.stderr)
        return 1 if bad else 0
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = p.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            p.write_text(new, encoding="utf-8")
            print(f"rewrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
