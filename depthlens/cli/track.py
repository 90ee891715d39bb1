"""The `track` command: depth diagnostics over training snapshots → one dataset (run, step), a figure and a section."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..runtime.defaults import DEFAULT_N_BOOT, DEFAULT_N_SEQ
from .app import QuietOpt, app, domain_errors, dumps, fail, in_default_dir, invoked_command, print_table
from .common import (
    DTYPES,
    BatchOpt,
    BootOpt,
    DataOpt,
    DeviceOpt,
    DtypeOpt,
    NSeqOpt,
    SeedOpt,
    SeqLenOpt,
    ThreadsOpt,
    check_choice,
)

if TYPE_CHECKING:  # typing only: the command imports these where it runs
    import xarray as xr

    from ..studies.snapshots import Series
    from ..studies.track import TrackOptions

OUT_FILES = ("track.nc", "track.png", "README.md")


def check_out(out: Path) -> None:
    """`out` may be new, empty, or a previous track output (a directory with depthlens's marker: then it is
    resumed and its files replaced, unless the user edited one of them). Refuses before any work."""
    from ..errors import DepthlensError
    from ..io.atomic import MARKER, check_unedited, claim_dir, legacy_kind, read_marker

    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise DepthlensError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and (read_marker(out) or {}).get("kind") != "track":
        hint = (
            f" (a track output from a depthlens before markers: mark it once with `python -m depthlens.io.atomic "
            f"adopt {out}`)"
            if legacy_kind(out) == "track"
            else ""
        )
        raise DepthlensError(
            f"{out}: exists and is not a track output directory (no {MARKER} marker of one); refusing "
            f"to write into it{hint}"
        )
    if not out.exists() and not out.parent.is_dir():
        raise DepthlensError(f"{out.parent}: output directory does not exist")
    claim_dir(out, "track", create=False)  # name length, a writable directory
    if out.is_dir():
        check_unedited(out, OUT_FILES)


@app.command()
@domain_errors
def track(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories with snapshots/ (one series each), or checkpoint "
            "directories / GGUF files in training order (one series).",
            show_default=False,
        ),
    ],
    metric: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            "--metric",
            help="Comma list of the diagnostics to "
            "follow (registry names or aliases; default: every tracked one: "
            "causal,permutation,erank,attnres,angular).",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Output directory: track.nc, track.png, README.md (every per-snapshot result is kept in the "
            "result cache: a rerun computes only what is new; `depthlens --no-cache track ...`: compute all).",
        ),
    ] = Path("depthlens-out/track"),
    recipe: Annotated[
        list[Path] | None,
        typer.Option(
            help="Recipe (or a checkpoint's train.json) the runs were trained "
            "with, repeatable: each run takes the first that names it. Default: "
            "found in the run (checkpoint/train.json, a snapshot's train.json, "
            "resume/state.json). Its requested snapshot steps are checked for gaps."
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Run name of a checkpoint list (default: their parent directory).")
    ] = None,
    tokens_per_step: Annotated[
        float | None,
        typer.Option(
            "--tokens-per-step", min=1, help="Tokens per step for a checkpoint list whose steps come from names."
        ),
    ] = None,
    data: DataOpt = None,
    n_seq: NSeqOpt = DEFAULT_N_SEQ,
    seq_len: SeqLenOpt = None,
    seed: SeedOpt = 0,
    n_boot: BootOpt = DEFAULT_N_BOOT,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    threads: ThreadsOpt = 1,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only validate the series (configs and snapshot.json; no "
            "weights read, nothing written): exit 0, or 1 with the reason.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-run summary as JSON.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Depth over training: every diagnostic on every snapshot of a run, same eval tokens, resumable (result cache).

    Writes OUT/track.nc (dims run, step; coords tokens, design, n_layer), OUT/track.png (shares vs tokens with
    95% CIs, validation loss on a twin axis) and OUT/README.md (the "Depth over training" section).
    """
    import matplotlib

    matplotlib.use("Agg")
    import torch

    from ..studies.snapshots import scan
    from ..studies.track import TrackOptions, parse_metrics

    if not runs:
        fail("give at least one run directory or checkpoint", 2)
    check_choice(dtype, DTYPES, "--dtype")
    metrics = parse_metrics(metric) if metric is not None else TrackOptions().metrics
    opts = TrackOptions(
        metrics=metrics,
        data=None if data is None else str(data),
        n_seq=n_seq,
        seq_len=seq_len,
        seed=seed,
        n_boot=n_boot,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
    )
    if threads:
        torch.set_num_threads(threads)
    series = scan(runs, recipes=recipe or (), name=name, tokens_per_step=tokens_per_step)  # refuses before any write
    if check and as_json:  # strict JSON on stdout, as every --json
        runs_info = [
            {
                "name": s.name,
                "steps": [x.step for x in s.snapshots],
                "requested_by": s.requested_from if s.requested is not None else None,
                "pending": list(s.pending) if s.pending else [],
            }
            for s in series
        ]
        typer.echo(dumps({"runs": runs_info}, indent=1))
        return
    if check:
        for s in series:
            typer.echo(
                f"{s.name}: {len(s.snapshots)} snapshots, steps {[x.step for x in s.snapshots]}"
                + (f"; requested by {s.requested_from}" if s.requested is not None else "")
                + (f"; pending {s.pending}" if s.pending else "")
            )
        return
    if in_default_dir(out):  # `--out depthlens-out/x`: the git-ignored output folder is made on first use
        out.parent.mkdir(exist_ok=True)
    check_out(out)
    from ..io.atomic import output_lock

    with output_lock(out, "track output"):  # one writer per output directory, from here to the last write
        _track_into(out, series, opts, runs, metric, as_json)


def _track_into(
    out: Path, series: Sequence[Series], opts: TrackOptions, runs: list[Path], metric: str | None, as_json: bool
) -> None:
    from ..io.atomic import claim_dir
    from ..studies.cache import Tally, folder_in_use
    from ..studies.track import eval_tokens
    from ..studies.track import track as run_track
    from .feedback import Progress

    ev = eval_tokens(series, opts)
    claim_dir(out, "track")
    total = sum(len(s.snapshots) for s in series)
    tally = Tally(folder_in_use())
    # the run's name in every line: track-zoo.sh runs several `track` processes on one stderr
    with Progress("track" + (f" {series[0].name}" if len(series) == 1 else ""), total * len(opts.metrics)) as bar:
        ds = run_track(series, opts, ev, progress=bar.step, tally=tally)
    write_outputs(ds, out, invoked_command() or "depthlens track")  # every option given, as given
    from ..render.track import track_rows

    rows = track_rows(ds)
    if as_json:
        typer.echo(dumps(summary(ds), indent=1))
        return
    from rich.table import Table

    from ..render.track import track_columns

    t = Table(title=f"{out} ({len(series)} run(s), {total} snapshots)")
    for col in track_columns(ds, short=True):  # one header per cell of track_rows, in its order
        t.add_column(col)
    for r in rows:
        t.add_row(*r)
    print_table(t)  # aligned and never cropped, on a terminal or in a pipe
    typer.echo(tally.line())
    typer.echo(f"wrote {out / 'track.nc'}, {out / 'track.png'} and {out / 'README.md'}")


def write_outputs(ds: xr.Dataset, out: Path, command: str) -> None:
    """Dataset, figure and Markdown section, each written atomically; their hashes go into the directory's
    marker, so a rerun can tell a README the user edited (kept: refused) from the one it wrote (replaced)."""
    from ..io.atomic import atomic_write_text, check_unedited, record_files
    from ..io.dataset import write_netcdf
    from ..plotting.plots import save_figure
    from ..render.track import fig_track, track_markdown
    from ..studies.reproducible import reproducible

    check_unedited(out, OUT_FILES)  # again: the user may have edited one while we computed
    # no time stamp in the tracked file: a rerun on the same snapshots leaves track.nc byte-identical
    ds.attrs["history"] = command
    write_netcdf(reproducible(ds), out / "track.nc", overwrite=True)
    save_figure(fig_track(ds), out / "track.png")
    atomic_write_text(out / "README.md", track_markdown(ds, "track.png", heading="#"))
    record_files(out, OUT_FILES)


def summary(ds: xr.Dataset) -> list[dict[str, Any]]:
    """Per run: design, L, and per step the headline shares with CIs and the validation loss (JSON-safe)."""
    import math

    def f(v: Any) -> float | None:
        v = float(v)
        return None if math.isnan(v) else v

    out: list[dict[str, Any]] = []
    for run in ds["run"].values:
        sel = ds.sel(run=run)
        keep = sel["snapshot"].values.astype(str) != ""
        rec: dict[str, Any] = {
            "run": str(run),
            "design": str(sel["design"].values),
            "n_layer": int(sel["n_layer"].values),
            "step": [int(s) for s in sel["step"].values[keep]],
            "tokens": [f(t) for t in sel["tokens"].values[keep]],
            "val_loss": [f(v) for v in sel["val_loss"].values[keep]],
        }
        for k in (
            "causal_share",
            "causal_ci_low",
            "causal_ci_high",
            "perm_share",
            "perm_ci_low",
            "perm_ci_high",
            "dead_prefix",
        ):
            if k in sel:
                rec[k] = [f(v) for v in sel[k].values[keep]]
        out.append(rec)
    return out
