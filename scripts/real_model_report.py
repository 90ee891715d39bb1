"""Real-model report: every Pre-LN diagnostic on one pretrained model, and the definition-sensitivity table.

    python scripts/real_model_report.py MODEL.gguf --out reports/smollm2 [--n-seq 8 --seq-len 128]

(`scripts/real-model-report.sh` installs SmolLM2-135M-Instruct and calls this.) Stages, each written to
`<out>/data/<stage>.nc` as soon as it is done (`--resume` skips stages whose file exists):

  angular          D_n(l), all tokens but position 0
  causal_update    C(s,t), norm=update, variants current (all s: heatmap, O[s], ΔL_skip(s), noise floor)
                   and future (late s)
  causal_resid     C(s,t), norm=resid, current and future, late s (measure only)
  permutation      P_abs / P_rel / P_KL over the late pairs
  untrained_*      causal_update (late s) and permutation on the untrained twin (the same config, freshly
                   initialised by its family's own init, seed 0; adapters/twin.py): what training did
  pruning          (only with --stages pruning; needs angular and causal_update) loss against k removed layers,
                   k = 1 .. L/2, per criterion of `diagnostics/pruning.py` and a random baseline; permutation
                   importance too once the permutation stage is there (a rerun with --resume adds the criteria
                   whose input stage came later to the kept curves, and records that cost on its own line)
  pruning_heldout  (only with --stages pruning_heldout; uses causal_update and permutation when there) every
                   criterion ranks layers on one fold of the eval windows (stratified by domain: prose, code) and
                   is scored on the other, 2-fold cross-fitting, k = 1 .. --k-max (default L/2), per-sequence
                   losses stored; greedy (SLEB) and the pairwise-predicted search among the criteria
  pruning_random   (only with --stages pruning_random) 20 random cuts per k, uniform over all layers and
                   stratified (never the first or last layer, the criteria's policy), on every window
                   (both pruning stages keep each computed cut in `<out>/data/journal/` as it finishes: a
                   stopped run rerun with --resume continues where it stopped; the folder goes once the stage
                   is written)
  shuffled_*       (only when asked) causal_update (late s) and permutation on the shuffled twin: the trained
                   weights with every matrix's entries permuted (norm gains, biases and each matrix's value
                   distribution kept; adapters/twin.py), the control that keeps the trained scales
  reference        (only with --stages reference) C(s,t), norm=update, current and future, late s, on
                   8 × 128 tokens: the eval set of the reference measurements quoted in issue 10

Then `<out>/summary.json` (every number, with its definition), figures (`<out>/*.png`) and `<out>/README.md`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from depthlens.studies.sensitivity import PAPER_REFERENCE, causal_definition_table, permutation_definition_table  # noqa: E402

STAGES = ("angular", "causal_update", "causal_resid", "permutation", "untrained_causal_update", "untrained_permutation")
# the reference table of the calibration page (8 x 128 tokens, norm=update, late s, current and future), and the
# layer-pruning curves of the atlas (scripts/real-model-atlas.sh)
OPTIONAL = (
    "reference",
    "pruning",
    "pruning_heldout",
    "pruning_random",
    "shuffled_causal_update",
    "shuffled_permutation",
)
TWIN_CONTROLS = ("shuffled_causal_update", "shuffled_permutation")  # the second control, shown when computed
N_RANDOM = 3  # random-removal draws per k in the (in-sample) pruning stage (mean, min and max are reported)
N_RANDOM_HELDOUT = 20  # random draws per k and baseline (uniform, stratified) in the pruning_random stage
# the held-out pruning criteria (diagnostics/pruning_heldout.py); causal and permutation when their stage is there
HELDOUT_CRITERIA = ("angular_block", "block_influence", "skip_loss", "causal", "permutation", "greedy", "predicted")


def compute(
    model_path: Path,
    out: Path,
    n_seq: int,
    seq_len: int,
    seed: int,
    resume: bool,
    threads: int,
    stages: tuple[str, ...] = STAGES,
    on_stage: Callable[[dict], None] | None = None,
    k_max_heldout: int = 0,
    heldout_criteria: tuple[str, ...] = (),
) -> dict:
    """Compute the missing stages; `on_stage(record)` after each one (the caller saves run.json, so a killed run
    keeps the costs of the stages it finished)."""
    import torch

    from depthlens.adapters.load import open_model
    from depthlens.cli.feedback import Progress, spinner
    from depthlens.diagnostics.angular.engine import angular_distances
    from depthlens.diagnostics.causal.engine import causal_scores
    from depthlens.diagnostics.permutation.engine import permutation_scores
    from depthlens.io.dataset import write_netcdf
    from depthlens.runtime.evaldata import load_eval_data

    torch.set_num_threads(threads)
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with spinner(f"loading {model_path.name}") as p:  # a GGUF is dequantised tensor by tensor (~1 min)
        op = open_model(model_path, progress=p.engine())
    model = op.model
    data = load_eval_data(
        None, op.tokenizer, n_seq=n_seq, seq_len=seq_len, seed=seed, max_seq_len=model.config.max_seq_len
    )
    # a later process on a kept record names its load after its stages, so the first load's cost is not replaced
    kept = json.loads((data_dir / "run.json").read_text()) if resume and (data_dir / "run.json").exists() else {}
    load = f"load ({', '.join(stages)} run)" if "load" in kept.get("seconds", {}) else "load"
    seconds = {load: round(time.time() - t0, 1)}
    costs = {load: {"wall_s": seconds[load], "cpu_s": round(time.process_time(), 1), "peak_rss_mib": _peak_rss()}}

    def record() -> dict:
        return {
            "seconds": dict(seconds),
            "costs": dict(costs),
            "provenance": {k: v for k, v in op.provenance.items()},
            "n_seq": data.n_seq,
            "seq_len": data.seq_len,
            "seed": seed,
            "threads": threads,
            "n_layer": int(model.n_layer),
            "family": op.meta.family,
        }

    def stage(name: str, fn, *, done: Callable[[Path], bool] | None = None, cost_key: str | None = None) -> None:
        """Compute stage `name` into data/<name>.nc, unless resuming and it is there and `done(path)` (default:
        it exists). Its cost is recorded under `cost_key` (default: name): an extension of a kept stage
        records its own cost beside the first run's."""
        path = data_dir / f"{name}.nc"
        if name not in stages:
            return
        if resume and path.exists() and (done is None or done(path)):
            print(f"[{name}] kept {path}", flush=True)
            return
        t, cpu = time.time(), time.process_time()
        with Progress(f"{name}", None, every=10.0) as p:  # a bar on a terminal, a line every 10 s in a log
            ds = fn(p.engine())
        ds.attrs["command"] = f"scripts/real_model_report.py {model_path.name} --n-seq {n_seq} --seq-len {seq_len}"
        write_netcdf(ds, path, overwrite=True)
        key = cost_key or name
        seconds[key] = round(time.time() - t, 1)
        # the process's peak resident memory so far (ru_maxrss never falls: a stage's own peak is at most this)
        costs[key] = {
            "wall_s": seconds[key],
            "cpu_s": round(time.process_time() - cpu, 1),
            "peak_rss_mib": _peak_rss(),
        }
        print(f"[{name}] {seconds[key]} s -> {path}", flush=True)
        if on_stage is not None:
            on_stage(record())

    twin: list = []  # built on first use: the untrained twin of `model`

    shuffled: list = []  # built on first use: the trained weights shuffled within each matrix (adapters/twin.py)

    def shuffled_model():
        if not shuffled:
            from depthlens.adapters.twin import shuffled_twin

            shuffled.append(shuffled_twin(model, seed=0))
        return shuffled[0]

    def untrained():
        if not twin:
            from depthlens.adapters.twin import untrained_twin

            twin.append(untrained_twin(model, seed=0))
        return twin[0]

    def causal(norm: str, ev=data, reference: bool = False, progress=None, m=None):
        import xarray as xr

        # current on every s (heatmap, O[s], ΔL_skip) for the default norm of the trained model; the rest
        # (other norms, the reference eval set, the untrained twin) on the late s only
        full = norm == "update" and not reference and m is None
        m = model if m is None else m
        first = [0]  # skip runs of the current-variant run: the future run's count continues from there

        def current(done: int, total: int) -> None:
            first[0] = total
            progress(done, total)

        cur = causal_scores(
            m,
            ev,
            variants=("current",),
            layers="all" if full else "late",
            norm=norm,
            outputs=full,
            progress=current if progress else None,
        )
        fut = causal_scores(
            m,
            ev,
            variants=("future",),
            layers="late",
            norm=norm,
            outputs=False,
            progress=(lambda d, t: progress(first[0] + d, first[0] + t)) if progress else None,
        )
        keep = [
            v
            for v in (
                "causal_score",
                "null_score",
                "seq_max",
                "seq_sum",
                "seq_count",
                "seq_sq_change",
                "seq_sq_update",
                "mean_downstream_effect",
            )
            if v in cur and v in fut
        ]
        both = xr.concat([cur[keep], fut[keep]], dim="variant", combine_attrs="override")
        for v in ("output_effect", "output_effect_seq", "skip_delta_loss", "skip_delta_loss_seq", "clean_loss_seq"):
            if v in cur:
                both[v] = cur[v]
        both.attrs.update(
            variants_json='["current", "future"]',
            layers_current_json=cur.attrs["layers_json"],
            layers_future_json=fut.attrs["layers_json"],
            cut_positions_json=fut.attrs["cut_positions_json"],
        )
        return both

    stage("angular", lambda p: angular_distances(model, data, positions="all", checkpoint=model_path, progress=p))
    stage("causal_update", lambda p: causal("update", progress=p))
    stage("causal_resid", lambda p: causal("resid", progress=p))
    stage("permutation", lambda p: permutation_scores(model, data, pairs="late", checkpoint=model_path, progress=p))
    stage("untrained_causal_update", lambda p: causal("update", progress=p, m=untrained()))
    stage(
        "untrained_permutation",
        lambda p: permutation_scores(untrained(), data, pairs="late", checkpoint=model_path, progress=p),
    )
    stage("shuffled_causal_update", lambda p: causal("update", progress=p, m=shuffled_model()))
    stage(
        "shuffled_permutation",
        lambda p: permutation_scores(shuffled_model(), data, pairs="late", checkpoint=model_path, progress=p),
    )
    if "pruning" in stages:
        import xarray as xr

        from depthlens.diagnostics.pruning import CRITERIA, add_criteria, pruning_curves

        prune_file = data_dir / "pruning.nc"
        perm_file = data_dir / "permutation.nc"

        def wanted() -> list[str]:
            """Every criterion whose input stage is there (permutation importance needs the permutation stage)."""
            return [c for c in CRITERIA if c != "permutation" or perm_file.exists()]

        def missing(path: Path) -> list[str]:
            """The wanted criteria the kept curves at `path` lack."""
            with xr.open_dataset(path) as ds:
                have = set(json.loads(ds.attrs["criteria_json"]))
            return [c for c in wanted() if c not in have]

        def prune(_progress):
            need = {n: data_dir / f"{n}.nc" for n in ("angular", "causal_update")}
            if not all(f.exists() for f in need.values()):
                raise SystemExit(f"pruning: run the stages {', '.join(need)} first (their rankings pick the layers)")
            ang, cau = (xr.load_dataset(f) for f in need.values())
            perm = xr.load_dataset(perm_file) if perm_file.exists() else None
            curves = pruning_curves(
                model,
                data,
                angular=ang,
                causal=cau,
                permutation=perm,
                criteria=added or wanted(),
                n_random=N_RANDOM,
                checkpoint=model_path,
            )
            return add_criteria(xr.load_dataset(prune_file), curves) if added else curves

        # resuming over kept curves: only the criteria whose input stage came later (none: the stage is kept)
        added = missing(prune_file) if resume and prune_file.exists() else []
        stage("pruning", prune, done=lambda _: not added, cost_key=f"pruning (+{', '.join(added)})" if added else None)
    if {"pruning_heldout", "pruning_random"} & set(stages):
        import xarray as xr

        from depthlens.diagnostics.pruning_heldout import (
            heldout_curves,
            merge_heldout,
            random_baselines,
            window_domains,
        )

        held_file = data_dir / "pruning_heldout.nc"
        # each stage's computed cuts, kept as they finish: a stopped run rerun with --resume continues from them
        journals = data_dir / "journal"
        if not resume:  # a fresh run computes every cut again
            shutil.rmtree(journals, ignore_errors=True)
        inputs = {n: data_dir / f"{n}.nc" for n in ("causal_update", "permutation")}
        wanted = [
            c
            for c in (heldout_criteria or HELDOUT_CRITERIA)
            if c not in ("causal", "permutation") or inputs["causal_update" if c == "causal" else c].exists()
        ]
        have: list[str] = []
        if resume and held_file.exists():
            with xr.open_dataset(held_file) as kept:
                have = json.loads(kept.attrs["criteria_json"])
        todo = [c for c in wanted if c not in have]

        def heldout(progress):
            curves = heldout_curves(
                model,
                data,
                domains=window_domains(data, op.tokenizer),
                k_max=k_max_heldout or None,
                criteria=todo,
                causal=xr.load_dataset(inputs["causal_update"]) if "causal" in todo else None,
                permutation=xr.load_dataset(inputs["permutation"]) if "permutation" in todo else None,
                checkpoint=model_path,
                progress=progress,
                journal=journals / "pruning_heldout",
            )
            return merge_heldout(xr.load_dataset(held_file), curves) if have else curves

        stage(
            "pruning_heldout",
            heldout,
            done=lambda _: not todo,
            cost_key=f"pruning_heldout (+{', '.join(todo)})" if have and todo else None,
        )
        stage(
            "pruning_random",
            lambda p: random_baselines(
                model,
                data,
                k_max=k_max_heldout or None,
                n_random=N_RANDOM_HELDOUT,
                checkpoint=model_path,
                progress=p,
                journal=journals / "pruning_random",
            ),
        )
        for name in ("pruning_heldout", "pruning_random"):  # the stage's dataset is written: its journal is spent
            if name in stages and (data_dir / f"{name}.nc").exists():
                shutil.rmtree(journals / name, ignore_errors=True)
    if "reference" in stages:
        ref = load_eval_data(None, op.tokenizer, n_seq=8, seq_len=128, seed=0, max_seq_len=model.config.max_seq_len)
        stage("reference", lambda p: causal("update", ref, reference=True, progress=p))
    return record()


class RunRecord:
    """`<out>/data/run.json`, shared by every process computing stages of one model.

    Each save merges this process's stages into the record on disk *now*, under a lock, so runs on disjoint
    stages in parallel (one per core) keep each other's costs; reading the record once at start would let the
    last writer drop the stages the other finished meanwhile. `wall_seconds` is the resumed total: what is on
    disk, less this process's earlier contribution, plus its elapsed time.
    """

    def __init__(self, path: Path, *, resume: bool):
        self.path, self.resume = path, resume
        self.started = time.time()
        self.added = 0.0  # wall seconds this process has already put into the record's total

    def save(self, run: dict) -> None:
        import filelock

        from depthlens.io.atomic import atomic_write_text

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(self.path.parent / f".{self.path.name}.lock"), timeout=120):
            disk = json.loads(self.path.read_text()) if self.path.exists() else {}
            run["seconds"] = {**disk.get("seconds", {}), **run["seconds"]}
            run["costs"] = {**disk.get("costs", {}), **run.get("costs", {})}
            elapsed = round(time.time() - self.started, 1)
            base = disk.get("wall_seconds", 0.0) - self.added if self.resume else 0.0
            run["wall_seconds"] = round(base + elapsed, 1)
            self.added = elapsed
            atomic_write_text(self.path, json.dumps(run, indent=1, default=str))


def _peak_rss() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def summarise(out: Path, run: dict) -> dict:
    """Every number of the report, from the stage datasets present (missing stages are listed, not faked)."""
    import xarray as xr

    from depthlens.diagnostics.sweep import headline

    d = {
        name: xr.load_dataset(out / "data" / f"{name}.nc")
        for name in (*STAGES, *TWIN_CONTROLS)
        if (out / "data" / f"{name}.nc").exists()
    }
    causal = {n: d[f"causal_{n}"] for n in ("update", "resid") if f"causal_{n}" in d}
    perm = d.get("permutation")
    L = int(run["n_layer"])
    heads = {}
    if "update" in causal:
        heads["causal"] = headline(causal["update"], "causal", 0.45, n_boot=200, seed=0)
    if perm is not None:
        heads["permutation"] = headline(perm, "perm_abs", 0.15, n_boot=200, seed=0)
    cu = causal.get("update")
    from depthlens.diagnostics.sweep import paired_share_difference
    from depthlens.stats.metrics import late_window

    def twin_headlines(prefix: str) -> dict:
        """A twin's headlines, and trained − twin paired over the same eval sequences (the `untrained_*` or
        `shuffled_*` stages; empty when not computed)."""
        out: dict = {}
        for key, trained, twin, metric, theta in (
            ("causal", cu, d.get(f"{prefix}_causal_update"), "causal", 0.45),
            ("permutation", perm, d.get(f"{prefix}_permutation"), "perm_abs", 0.15),
        ):
            if trained is None or twin is None:
                continue
            diff = paired_share_difference(trained, twin, metric, theta, n_boot=200, seed=0)
            out[key] = {
                **headline(twin, metric, theta, n_boot=200, seed=0),
                "trained_minus_untrained": diff.estimate,  # trained − this twin
                "diff_ci_low": diff.low,
                "diff_ci_high": diff.high,
                "diff_ci_method": diff.method,  # names its pairing
            }
        return out

    a = late_window(L)
    return {
        **run,
        "late_window_start": a,
        "n_late_pairs": (L - a) * (L - a - 1) // 2,
        "headlines": heads,
        "untrained_twin": twin_headlines("untrained"),
        "shuffled_twin": twin_headlines("shuffled"),
        "missing_stages": [x for x in STAGES if x not in d],
        "causal_definitions": causal_definition_table(causal, thresholds=(0.45,)),
        "permutation_definitions": permutation_definition_table(perm, thresholds=(0.15,)) if perm is not None else [],
        "paper_reference": PAPER_REFERENCE,
        "noise_floor": {
            n: {v: float(ds["null_score"].sel(variant=v)) for v in ds["variant"].values}
            for n, ds in causal.items()
            if "null_score" in ds
        },
        "clean_loss": float(perm["clean_loss"]) if perm is not None else None,
        "skip_delta_loss": [float(x) for x in cu["skip_delta_loss"].values] if cu is not None else None,
        "output_effect": [float(x) for x in cu["output_effect"].sel(variant="current").values]
        if cu is not None
        else None,
        "angular_d1": [float(x) for x in d["angular"]["profile"].values[:L]] if "angular" in d else None,
        "reference_8x128": _reference(out),
    }


def _reference(out: Path) -> list[dict] | None:
    """The issue-10 reference table (8 × 128 tokens, norm=update) when the `reference` stage was run."""
    import xarray as xr

    path = out / "data" / "reference.nc"
    if not path.exists():
        return None
    ds = xr.load_dataset(path)
    return causal_definition_table({"update": ds}, thresholds=(0.45,))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, nargs="?", help="GGUF file or model directory (not with --render-only)")
    ap.add_argument("--out", type=Path, default=Path("reports/smollm2"))
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--calibration",
        type=Path,
        default=HERE / "docs" / "calibration.md",
        help="also write this calibration page (docs/calibration.md); 'none': do not",
    )
    ap.add_argument("--resume", action="store_true", help="keep stages already written under <out>/data")
    ap.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="comma list of stages to compute (run several processes on disjoint stages, then --render-only)",
    )
    ap.add_argument("--k-max", type=int, default=0, help="pruning_heldout / pruning_random: largest k (0: L/2)")
    ap.add_argument(
        "--heldout-criteria",
        default="",
        help="pruning_heldout: comma list of criteria (default all); a rerun with --resume adds the missing ones",
    )
    ap.add_argument("--no-render", action="store_true", help="compute the stages only (render later)")
    ap.add_argument("--render-only", action="store_true", help="only rebuild summary, figures and README")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    run_file = a.out / "data" / "run.json"
    if a.model is None and not a.render_only:
        ap.error("give the model (a GGUF file or model directory), or --render-only")
    if a.render_only:
        run = json.loads(run_file.read_text())
    else:
        stages = tuple(x.strip() for x in a.stages.split(",") if x.strip())
        if set(stages) - set(STAGES + OPTIONAL):
            ap.error(
                f"--stages: unknown {sorted(set(stages) - set(STAGES + OPTIONAL))}; "
                f"choose from {', '.join(STAGES + OPTIONAL)}"
            )
        record = RunRecord(run_file, resume=a.resume)
        run = compute(
            a.model,
            a.out,
            a.n_seq,
            a.seq_len,
            a.seed,
            a.resume,
            a.threads,
            stages,
            on_stage=record.save,
            k_max_heldout=a.k_max,
            heldout_criteria=tuple(x for x in a.heldout_criteria.split(",") if x),
        )
        record.save(run)
        if a.no_render:
            return 0
        if not set(STAGES) <= set(stages) and not all((a.out / "data" / f"{x}.nc").exists() for x in STAGES):
            print("stages missing; render later with --render-only", flush=True)
            return 0
    missing = [x for x in STAGES if not (a.out / "data" / f"{x}.nc").exists()]
    if missing:
        print(f"rendering without stage(s) {', '.join(missing)} (listed as missing in the report)", flush=True)
    summary = summarise(a.out, run)
    from depthlens.studies.sensitivity import render_real_model_report

    calibration = None if str(a.calibration) == "none" else a.calibration
    render_real_model_report(a.out, summary, calibration=calibration, report_name=str(a.out))
    print(f"wrote {a.out}/README.md, summary.json and figures", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
