"""The `report` command: every diagnostic on a set of checkpoints → figures, tables, datasets, HTML + Markdown."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ..diagnostics import registry  # stdlib-only: the diagnostics' names for the help text
from ..runtime.defaults import DEFAULT_N_BOOT, DEFAULT_N_SEQ
from .app import QuietOpt, app, domain_errors, dumps, fail, in_default_dir, rank0_errors
from .common import (
    DTYPES,
    BootOpt,
    DataOpt,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    NSeqOpt,
    SeedOpt,
    SeqLenOpt,
    ThreadsOpt,
    check_choice,
)
from .precision import PrecisionOpt


class UntrainedPermFor(StrEnum):  # StudyOptions.untrained_perm_for (a real choice type for --help and errors)
    all = "all"
    claims = "claims"


@app.command()
@rank0_errors
@domain_errors
def report(
    ckpts: Annotated[list[Path], typer.Argument(help="Checkpoint directories (e.g. checkpoints/*/).")],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Report directory (index.html, README.md, figures/, *.nc, summary.json)."),
    ],
    data: DataOpt = None,
    n_seq: NSeqOpt = DEFAULT_N_SEQ,
    seq_len: SeqLenOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    device_map: DeviceMapOpt = None,
    dtype: DtypeOpt = "fp32",
    metrics: Annotated[
        str | None,
        typer.Option(help=f"Comma-separated subset of {', '.join(registry.NAMES)} (default: every diagnostic)."),
    ] = None,
    n_boot: BootOpt = DEFAULT_N_BOOT,
    untrained: Annotated[
        str,
        typer.Option(
            help=f"Diagnostics also run on each checkpoint's untrained model (same config and training seed, the trainer's step-0 weights): a comma-separated subset of {', '.join(registry.UNTRAINED)}, or 'none'."
        ),
    ] = ",".join(registry.UNTRAINED),
    untrained_perm_n_seq: Annotated[
        int,
        typer.Option(
            "--untrained-perm-n-seq", min=0, help="Eval sequences (a prefix) for the untrained permutation; 0 = all."
        ),
    ] = 8,
    untrained_perm_for: Annotated[
        UntrainedPermFor,
        typer.Option(
            "--untrained-perm-for",
            help="Where the untrained permutation runs: every checkpoint (all), or only the designs and depths a permutation claim of the orderings check names (claims).",
        ),
    ] = UntrainedPermFor.all,
    untrained_seeds: Annotated[
        int | None,
        typer.Option(
            "--untrained-seeds",
            min=1,
            help="Untrained twins only for checkpoints whose training seed is < K (no recorded seed counts as 0); the at-init numbers of a design then pool those seeds. Default: every seed.",
        ),
    ] = None,
    perm_n_seq: Annotated[
        int,
        typer.Option(
            "--perm-n-seq",
            min=0,
            help="Eval sequences (a prefix) for the trained permutation, its main cost at depth; 0 = all --n-seq.",
        ),
    ] = 0,
    precision: PrecisionOpt = None,
    threads: ThreadsOpt = 1,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out directory.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print summary.json to stdout.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Report on many checkpoints: heatmaps, design × depth table with CIs, sweeps, robustness (HTML + Markdown).

    Every diagnostic on identical eval data (rank: HC/mHC only; attnres: Full/Block AttnRes only), written atomically.
    Each result comes from the result cache when it holds it (`depthlens --no-cache report ...`: compute all).
    Under torchrun the checkpoints are split over the ranks; rank 0 writes the same report.
    """
    import time

    import matplotlib

    matplotlib.use("Agg")
    from rich.console import Console

    from ..studies.report import ReportOptions, build_report
    from ..studies.study import parse_metrics
    from .feedback import Progress

    if not ckpts:
        fail("give at least one checkpoint directory", 2)
    check_choice(dtype, DTYPES, "--dtype")
    if in_default_dir(out):  # `--out depthlens-out/x`: the git-ignored output folder is made on first use
        out.parent.mkdir(exist_ok=True)
    opts = ReportOptions(
        data=data,
        n_seq=n_seq,
        seq_len=seq_len,
        seed=seed,
        device=device,
        dtype=dtype,
        device_map=device_map,
        metrics=parse_metrics(metrics or registry.names()),
        n_boot=n_boot,
        threads=threads or None,
        untrained=() if untrained.strip() == "none" else parse_metrics(untrained),
        untrained_perm_n_seq=untrained_perm_n_seq or None,
        untrained_perm_for=untrained_perm_for.value,
        untrained_seeds=untrained_seeds,
        perm_n_seq=perm_n_seq or None,
        precision=precision,
    )
    t0 = time.perf_counter()
    with Progress("report") as bar:  # under torchrun only rank 0 shows progress (feedback.mode)
        bar.set_total(None, f"loading {len(ckpts)} checkpoint(s)")
        rep = build_report(
            ckpts,
            out,
            opts,
            overwrite=overwrite,
            progress=bar.step,
            on_loaded=lambda n_steps: bar.set_total(n_steps, "computing"),
        )
    if rep is None:  # a rank other than 0: its checkpoints went to rank 0
        return
    if as_json:
        typer.echo(dumps(rep.records, indent=1))
        return
    from rich.table import Table

    from ..render.pages import table_head, table_rows

    t = Table(title=f"{out} ({len(rep.entries)} checkpoints, {time.perf_counter() - t0:.0f} s)")
    for k, head in enumerate(table_head(terminal=True)):  # d and params are in summary.json and README.md
        t.add_column(head, justify="left" if k == 0 else "right", no_wrap=k == 0 or "[CI]" in head)
    for row in table_rows(rep.records, terminal=True):
        t.add_row(*row)
    con = Console()
    (con if con.is_terminal else Console(width=120)).print(t)  # pipes and logs get the full-width table
    typer.echo(rep.cache_line)
    typer.echo(f"wrote {out / 'index.html'} and {out / 'README.md'}")
