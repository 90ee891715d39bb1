"""Numbers in README.md and docs/ that come from a committed report are checked against its data here, so a
regenerated report cannot leave a stale number behind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "reports" / "smollm2" / "summary.json"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


@pytest.fixture(scope="module")
def smollm2():
    if not SMOLLM2.is_file():
        pytest.skip("reports/smollm2 not generated")
    return json.loads(SMOLLM2.read_text())


def test_readme_smollm2_range(smollm2):
    defs = smollm2["causal_definitions"]
    default = next(d for d in defs if (d["norm"], d["variant"], d["aggregator"]) == ("update", "current", "max"))
    others = [d["share_gt_0.45"] for d in defs if d is not default]
    text = (ROOT / "README.md").read_text()
    want = (
        f"scores {round(100 * default['share_gt_0.45'])} % late causal pairs above 0.45\nunder the default "
        f"definition and {round(100 * min(others))}–{round(100 * max(others))} % under the other definitions"
    )
    assert want in text, want
    twin = smollm2["untrained_twin"]["causal"]["share"]
    assert f"its untrained\ntwin (same config, fresh init) scores {round(100 * twin)} %" in text


def test_calibration_table_matches_the_report(smollm2):
    text = (ROOT / "docs" / "calibration.md").read_text()
    by = {(d["variant"], d["aggregator"], d["norm"]): d["share_gt_0.45"] for d in smollm2["causal_definitions"]}
    for variant in ("current", "future"):
        for agg in ("max", "mean", "p95", "p99", "pooled"):
            row = re.search(rf"^\| {variant} \| {agg} \| ([0-9.]+ %) \| ([0-9.]+ %) \|", text, re.M)
            assert row, (variant, agg)
            assert row.group(1) == _pct(by[(variant, agg, "update")]) and row.group(2) == _pct(
                by[(variant, agg, "resid")]
            )


def test_performance_causal_rows_and_like_for_like_ratio():
    path = ROOT / "reports" / "bench" / "real_scale.json"
    if not path.is_file():
        pytest.skip("reports/bench/real_scale.json not generated")
    res = {r["model"]: r for r in json.loads(path.read_text())["results"]}
    text = (ROOT / "docs" / "performance.md").read_text()
    eq = {m: {k: v["cpu"] for k, v in r["causal"]["full_pass_equivalents"].items()} for m, r in res.items()}
    (other,) = [m for m in res if m != "smollm2"]
    row = re.search(r"^\| `causal --outputs` \(\+ O\[s\], ΔL_skip\) \| ([0-9.]+) \| ([0-9.]+) \|", text, re.M)
    assert row and (row.group(1), row.group(2)) == (
        f"{eq['smollm2']['outputs_depthlens']:.1f}",
        f"{eq[other]['outputs_depthlens']:.1f}",
    )
    row = re.search(
        r"^\| naive hook loop / nnsight loop \| ([0-9.]+) / ([0-9.]+) \| ([0-9.]+) / ([0-9.]+) \|", text, re.M
    )
    assert row and row.groups() == tuple(f"{eq[m][k]:.1f}" for m in ("smollm2", other) for k in ("naive", "nnsight"))
    s, o = eq["smollm2"], eq[other]
    want = (
        f"on SmolLM2 {s['naive']:.1f} / {s['outputs_depthlens']:.1f} = {s['naive'] / s['outputs_depthlens']:.1f}× "
        f"(on the 120M model {o['naive']:.1f} / {o['outputs_depthlens']:.1f}\n= "
        f"{o['naive'] / o['outputs_depthlens']:.1f}×). Against the default run, which skips the companions, the "
        f"ratio is {s['naive'] / s['depthlens']:.1f}×"
    )
    assert " ".join(want.split()) in " ".join(text.split()), want


def test_generated_fragments_match_the_committed_data():
    """docs/training.md's zoo table and docs/depth-over-training.md's cost line are generated from
    checkpoints/*/train.json (scripts/doc_numbers.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_numbers", ROOT / "scripts" / "doc_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "<!-- generated:zoo-losses -->" in (ROOT / "docs" / "training.md").read_text()
    assert mod.stale(ROOT) == [], "stale generated numbers: run .venv/bin/python scripts/doc_numbers.py"
    # the generator against the data it reads: one cell by hand (HC at L = 32: seed 0, and its seeds when shipped)
    runs = [ROOT / "checkpoints" / n / "train.json" for n in ("hc_l32", *(f"hc_l32_s{k}" for k in range(1, 8)))]
    ts = [json.loads(p.read_text()) for p in runs if p.is_file()]
    losses = [t["final_val_loss"] for t in ts]
    loss = f"{losses[0]:.3f}"
    if len(ts) > 1:
        loss = f"{sum(losses) / len(losses):.3f} ({len(ts)} seeds {min(losses):.3f}–{max(losses):.3f})"
    t = ts[0]
    assert f"{loss} ({round(t['params']['total'] / 1000)}K, LR {t['recipe']['lr']:g}" in mod.zoo_losses(ROOT)


def test_decay_mixing_report_shows_the_erank_its_dataset_holds():
    """reports/decay_mixing (HC L = 16 with decay_mixing off and on): the README's erank column is the first and
    last snapshot of track.nc, and training moved both runs off the identity-initialised rank 4."""
    import numpy as np
    import xarray as xr

    from depthlens.render.track import track_markdown

    path = ROOT / "reports" / "decay_mixing" / "track.nc"
    if not path.is_file():
        pytest.skip("reports/decay_mixing not generated")
    ds = xr.load_dataset(path)
    text = (ROOT / "reports" / "decay_mixing" / "README.md").read_text()
    rows = [line for line in track_markdown(ds).splitlines() if line.startswith("| HC ")]
    assert len(rows) == 2 and all(r in text for r in rows)  # the README is this dataset's table
    for run in ds["run"].values:
        e = ds["erank"].sel(run=run).values  # (step, product)
        first, last = "/".join(f"{v:.2f}" for v in e[0]), "/".join(f"{v:.2f}" for v in e[-1])
        assert f"{first} → {last}" in text
        np.testing.assert_allclose(e[0], 4.0, rtol=1e-6)  # HC's maps start at the identity: every stream
        assert (e[-1] < 2).all()


def test_performance_qwen_paragraph_matches_its_bench():
    path = ROOT / "reports" / "bench" / "real_scale_qwen.json"
    if not path.is_file():
        pytest.skip("reports/bench/real_scale_qwen.json not generated")
    (r,) = json.loads(path.read_text())["results"]
    c = {k: v["cpu"] for k, v in r["causal"]["full_pass_equivalents"].items()}
    p = {k: v["cpu"] for k, v in r["permutation"]["full_pass_equivalents"].items()}
    want = (
        f"`causal` {c['depthlens']:.1f} (bound {r['causal']['bound']:.1f}; naive loop {c['naive']:.1f}), "
        f"`causal --outputs` {c['outputs_depthlens']:.1f}, `permute` {p['depthlens']:.1f} over the "
        f"{r['n_late_pairs']} late pairs (layer-work bound {r['permutation']['bound']:.1f}, with a plain head per "
        f"pair {r['permutation']['with_plain_head']:.1f}; naive {p['naive']:.1f})"
    )
    text = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    assert want in text, want
    assert (
        f"causal {r['causal']['peak_vs_plain_forward']:.2f}×, permute {r['permutation']['peak_vs_plain_forward']:.2f}×"
        in text
    )
    assert f"causal {c['depthlens'] / r['causal']['bound']:.2f} of the bound here" in text
    smol = next(
        x
        for x in json.loads((ROOT / "reports/bench/real_scale.json").read_text())["results"]
        if x["model"] == "smollm2"
    )
    assert f"{smol['causal']['full_pass_equivalents']['depthlens']['cpu'] / smol['causal']['bound']:.2f} there" in text


def test_readme_info_time_is_the_startup_bench():
    """The README's `info` time is reports/bench/startup.json's median whole-process wall time, rounded."""
    bench = json.loads((ROOT / "reports" / "bench" / "startup.json").read_text())
    want = f"overhead vs Pre-LN ({bench['current']['info']['median_wall_s']:.1f} s)"
    assert want in (ROOT / "README.md").read_text(), want
    assert bench["current"]["info"]["median_wall_s"] < bench["targets_s"]["info"]
    assert bench["current"]["help"]["median_wall_s"] < bench["targets_s"]["help"]


def test_performance_pruning_anchor_numbers_are_the_bench():
    """docs/performance.md's anchored-cut ratios are reports/bench/pruning_anchor.json's, and bit-identical."""
    runs = {
        ("smollm2" if "smollm2" in r["model"] else "preln_l32"): r
        for r in json.loads((ROOT / "reports" / "bench" / "pruning_anchor.json").read_text())["runs"]
    }
    s, p = runs["smollm2"], runs["preln_l32"]
    assert s["bit_identical"] and p["bit_identical"]
    assert s["on"]["layer_rows_run"] < s["off"]["layer_rows_run"]
    want = (
        f"this runs {s['layer_rows_ratio_on_over_off']:.2f} of the layer work on SmolLM2-135M "
        f"({s['cpu_ratio_on_over_off']:.2f} of the CPU time) and {p['layer_rows_ratio_on_over_off']:.2f} on the "
        "zoo's preln_l32, every held-out loss bit-identical"
    )
    text = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    assert want in text, want


def test_performance_precision_table_is_the_bench():
    """docs/performance.md's --precision table is reports/bench/precision.json, row by row."""
    runs = json.loads((ROOT / "reports" / "bench" / "precision.json").read_text())["runs"]
    text = (ROOT / "docs" / "performance.md").read_text()
    for r in runs:
        name = r["model"].split("/")[-1].removesuffix(".gguf")
        cap = " (the cap stopped it)" if r["cap_hit"] else ""
        row = (
            f"| {name} | {r['diagnostic']} | {r['sequences_used']} | {r['half_width_reached']:.3f}{cap} | "
            f"{100 * r['forward_passes_saved_fraction']:.0f} % |"
        )
        assert row in text, row
        assert r["forward_passes_saved_fraction"] == 1 - r["sequences_used"] / r["sequences_fixed"]
    qwen = next(r for r in runs if "qwen2.5-coder-0.5b" in r["model"] and r["diagnostic"] == "causal")
    assert any("smollm2" in r["model"] for r in runs)  # the zoo, SmolLM2 and Qwen, as the speed issue asks
    assert f"causal headline was ±{qwen['steps'][0][1]:.3f} at {qwen['steps'][0][0]}" in " ".join(text.split())


def test_zoo_recipe_status_reads_each_checkpoint_against_its_recipe():
    """The generated "which runs are current" table (README, docs/training.md), cell by cell against the files:
    a run is current when its train.json recipe equals the recipe's run (but where it is written), earlier when it
    differs, not trained when checkpoints/ lacks it; and the summary line's counts add up to the recipe's runs."""
    import importlib.util

    from depthlens.training.config import load_recipe, read_recipe, recipe_runs

    spec = importlib.util.spec_from_file_location("doc_numbers", ROOT / "scripts" / "doc_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.zoo_recipe_status(ROOT)
    zoo = ROOT / "depthlens" / "recipes" / "zoo_cpu.json"
    want: dict[tuple[str, int], dict[str, set[int]]] = {}
    for name in recipe_runs(read_recipe(zoo)):
        r = load_recipe(zoo, run=name).to_dict()
        p = ROOT / r["export"] / "train.json"
        if not p.is_file():
            state = "not trained"
        else:
            have = json.loads(p.read_text())["recipe"]
            same = {k: v for k, v in have.items() if k not in ("resume", "out", "meta")} == {
                k: v for k, v in r.items() if k not in ("resume", "out", "meta")
            }
            state = "current" if same else "earlier"
        want.setdefault((r["model"]["arch"], r["model"]["n_layer"]), {}).setdefault(state, set()).add(r["seed"])
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    depths = [int(c.strip(" |").removeprefix("L=")) for c in rows[0][1:]]
    got: dict[tuple[str, int], dict[str, set[int]]] = {}
    for row in rows[1:]:
        design = row[0].strip("| ")
        for L, cell in zip(depths, row[1:]):
            for part in re.findall(r"(current|earlier|not trained) seeds? ([0-9,\-]+)", cell):
                seeds = set()
                for piece in part[1].strip(",").split(","):
                    lo, _, hi = piece.partition("-")
                    seeds |= set(range(int(lo), int(hi or lo) + 1))
                got.setdefault((design, L), {})[part[0]] = seeds
    assert got == want
    n = {s: sum(len(c.get(s, ())) for c in want.values()) for s in ("current", "earlier", "not trained")}
    assert text.startswith(
        f"{sum(n.values())} runs in the recipe: {n['current']} trained from it, {n['earlier']} from an earlier "
        f"recipe, {n['not trained']} not trained yet"
    )


def test_readme_wall_times_are_the_committed_runs():
    """README's table of measured times, read back from the page and recomputed from reports/bench/wall_times.json
    without the generator: per command, the latest run's seconds and the earlier runs' min–max (a run that gave
    only a range counts both ends) and count."""
    runs = json.loads((ROOT / "reports" / "bench" / "wall_times.json").read_text())["runs"]
    text = (ROOT / "README.md").read_text()
    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^\| `[^`]*(zoo-report\.sh|test\.sh|not slow)[^`]*`.*$", text, re.M)
    }
    for what, key in (("main-job", "zoo-report.sh"), ("suite", "test.sh"), ("quick", "not slow")):
        mine = [r for r in runs if r["what"] == what]
        secs = [r["wall_s"] if what == "main-job" else r["pytest_s"] for r in mine]
        cells = rows[key].split(" | ")
        assert cells[1].startswith(f"{secs[-1]:.0f} s") and mine[-1]["date"] in cells[1], cells[1]
        earlier = [x for r, s in zip(mine[:-1], secs[:-1], strict=True) for x in (r.get("pytest_s_range") or [s])]
        if earlier:
            n = len(mine) - 1
            assert cells[2].startswith(f"{min(earlier):.0f}–{max(earlier):.0f} s ({n} run"), cells[2]


def test_wall_times_reads_pytests_summary_and_the_docs_readers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("wall_times", ROOT / "bench" / "wall_times.py")
    assert spec is not None and spec.loader is not None
    wt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wt)
    log = (
        "492.66s call     tests/test_docs.py::test_every_page_in_readme_order_in_a_fresh_copy[training-onward]\n"
        "371.04s call     tests/test_docs.py::test_every_page_in_readme_order_in_a_fresh_copy[readme-and-cli]\n"
        "77.36s call     tests/test_retrain.py::test_shipped_checkpoint_retrains_bit_for_bit[preln_l4]\n"
        "1672 passed, 17 skipped in 909.61s (0:15:09)\n"
    )
    got = wt.pytest_summary(log)
    assert got == {
        "pytest_s": 909.61,
        "tests": {"passed": 1672, "skipped": 17},
        "docs_readers_s": {"training-onward": 492.66, "readme-and-cli": 371.04},
    }
    with pytest.raises(SystemExit, match="no pytest summary"):
        wt.pytest_summary("nothing here\n")


def test_performance_main_job_timing_is_the_latest_committed_run():
    """docs/performance.md's main-job sentence, read back from the page: the latest main-job record's wall seconds,
    minutes, checkpoint count and the report's compute and figure seconds (recomputed here, not by the generator),
    and the job's aim of 15 minutes met by that run."""
    runs = [
        r for r in json.loads((ROOT / "reports/bench/wall_times.json").read_text())["runs"] if r["what"] == "main-job"
    ]
    last = runs[-1]
    text = (ROOT / "docs" / "performance.md").read_text()
    m = re.search(r"<!-- generated:main-job-timing -->\n(.*?)<!-- /generated:main-job-timing -->", text, re.S)
    assert m is not None
    sentence = " ".join(m.group(1).split())
    assert f"({last['checkpoints']} checkpoints;" in sentence and last["date"] in sentence
    assert f"{last['wall_s']:.0f} s ({last['wall_s'] / 60:.1f} minutes)" in sentence
    rep = last["report_seconds"]
    assert f"compute was {rep['compute']:.0f} s and its figures {rep['figures']:.0f} s" in sentence
    assert last["wall_s"] < 15 * 60 and last["results_cache"].startswith("empty")  # a cold run, within its aim
    zoo = len([p for p in (ROOT / "checkpoints").iterdir() if (p / "config.json").is_file()])
    assert last["checkpoints"] == zoo  # timed on every shipped checkpoint
