"""The `plan` command: how many training runs and eval sequences the claims' differences need (power planner)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..runtime.defaults import DEFAULT_N_BOOT
from .app import QuietOpt, app, domain_errors, fail, print_table
from .common import EVAL_DEFAULTS, BootOpt, CkptsArg, Common, JsonOpt, _json, _study, busy, some_eval_options


def _report_dir(paths: list[Path]) -> Path | None:
    """The one report directory given (it holds summary.json and manifest.json), else None."""
    if len(paths) == 1 and (paths[0] / "summary.json").is_file() and (paths[0] / "manifest.json").is_file():
        return paths[0]
    return None


@app.command()
@domain_errors
@some_eval_options("data", "n_seq", "seq_len", "seed", "device", "dtype", "threads", n_seq=16)
def plan(
    ckpts: CkptsArg,
    power: Annotated[float, typer.Option(min=0.5, max=0.99, help="Target power of the 95 % interval.")] = 0.8,
    sequences: Annotated[
        str | None, typer.Option(help="Comma-separated eval-sequence counts to plan at (default: N, 2N, 4N).")
    ] = None,
    c: Common = EVAL_DEFAULTS,  # --data .. --threads (common.some_eval_options)
    n_boot: BootOpt = DEFAULT_N_BOOT,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Runs per design (and eval sequences) for 80 % power on DepthBench's claims, from the crossed seed ×
    sequence variance components of checkpoints (or of a report directory's datasets, computing nothing)."""
    from ..stats import plans as P
    from ..stats.orderings import CLAIMS
    from ..studies import claims as K
    from .shapes import parse_list

    Ns = [int(x) for x in parse_list(sequences, int, "--sequences", 1_000_000) or []]
    rep = _report_dir([Path(p) for p in ckpts])
    if rep is not None:
        runs: Any = K.runs_from_report(rep)
    else:
        from ..studies.study import run_study

        opts = _study(c, n_boot)
        from dataclasses import replace

        needed = K.claimed(CLAIMS)
        opts = replace(opts, metrics=needed, untrained=())
        with busy(f"{' and '.join(needed)} scores of {len(ckpts)} checkpoint(s)"):
            study = run_study(ckpts, opts)
        if study is None:  # a torchrun rank other than 0
            return
        runs = {(e.slug, e.n_layer, e.seed): e.datasets for e in study.entries}
    rows = K.crossed_rows(runs, {}, CLAIMS, n_boot=n_boot, seed=c.seed)
    plans = P.plan_rows(rows, CLAIMS, target=power, sequences=Ns)
    if not plans:
        fail(
            "no claim of the orderings check has two runs (training seeds) of each design it compares among these "
            "checkpoints; `depthlens plan` needs >= 2 seeds per design (e.g. hc_l32, hc_l32_s1, preln_l32, ...)",
            2,
        )
    if as_json:
        typer.echo(_json(plans))
        return
    from rich.table import Table

    t = Table(title=f"runs per design for {100 * power:.0f} % power (95 % crossed interval)", caption=P.PLAN_NOTE)
    for col in P.PLAN_HEAD:
        t.add_column(col)
    for row in P.plan_table(plans):
        t.add_row(*row)
    print_table(t)
