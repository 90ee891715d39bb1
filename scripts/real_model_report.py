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
The study itself (its stages, the runner, the summary) is `depthlens/studies/real_model.py`; this is its command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from depthlens.errors import DepthlensError, UsageError  # noqa: E402
from depthlens.studies import real_model as rm  # noqa: E402


@contextlib.contextmanager
def _shown(what: str, every: float) -> Iterator:
    """A bar on a terminal, a line every `every` seconds in a log."""
    from depthlens.cli.feedback import Progress

    with Progress(what, None, every=every) as p:
        yield p.engine()


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
        default=",".join(rm.DEFAULT_STAGES),
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
    if a.model is None and not a.render_only:
        ap.error("give the model (a GGUF file or model directory), or --render-only")
    try:
        stages = rm.parse_stages(a.stages)
    except UsageError as err:
        ap.error(str(err))
    a.out.mkdir(parents=True, exist_ok=True)
    run_file = a.out / "data" / "run.json"
    try:
        if a.render_only:
            run = json.loads(run_file.read_text())
        else:
            opts = rm.RealModelOptions(
                a.model,
                a.out,
                n_seq=a.n_seq,
                seq_len=a.seq_len,
                seed=a.seed,
                threads=a.threads,
                resume=a.resume,
                stages=stages,
                k_max_heldout=a.k_max,
                heldout_criteria=tuple(x for x in a.heldout_criteria.split(",") if x),
                command=f"scripts/real_model_report.py {a.model.name} --n-seq {a.n_seq} --seq-len {a.seq_len}",
            )
            record = rm.RunRecord(run_file, resume=a.resume)
            run = rm.compute(opts, on_stage=record.save, show=_shown)
            record.save(run)
            if a.no_render:
                return 0
            if not set(rm.DEFAULT_STAGES) <= set(stages) and rm.missing_defaults(a.out):
                print("stages missing; render later with --render-only", flush=True)
                return 0
        missing = rm.missing_defaults(a.out)
        if missing:
            print(f"rendering without stage(s) {', '.join(missing)} (listed as missing in the report)", flush=True)
        calibration = None if str(a.calibration) == "none" else a.calibration
        rm.render(a.out, run, calibration=calibration, report_name=str(a.out))
    except DepthlensError as err:
        print(f"real_model_report: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"wrote {a.out}/README.md, summary.json and figures", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
