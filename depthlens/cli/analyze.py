"""Analysis commands of one checkpoint: angular, causal, permute, rank, attnres (sweep and compare, over several
checkpoints, are in compare.py; the options and helpers they all share are in common.py).

Each prints a headline (with a bootstrap CI where the metric allows one) and a compact terminal view,
and writes the labelled dataset (netCDF) atomically. `--json` prints the headline as JSON instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from ..diagnostics import registry  # stdlib-only: names, aliases and default thresholds for the help texts
from .app import QuietOpt, app, deprecated, domain_errors, rank0_errors
from .common import (
    DTYPES,
    EVAL_DEFAULTS,
    BatchOpt,
    BootOpt,
    CkptArg,
    CkptsArg,
    Common,
    DataOpt,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    NSeqOpt,
    OutOpt,
    OverwriteOpt,
    PlotOpt,
    SeedOpt,
    SeqLenOpt,
    ThreadsOpt,
    TokensOpt,
    VerboseOpt,
    _common,
    _fmt_share,
    _json,
    _matrix_view,
    _opts,
    _study,
    busy,
    check_choice,
    check_plot,
    check_threshold,
    emit,
    eval_data,
    eval_options,
    headline_line,
    open_model,
    resolve_out,
    save_plot,
    write,
)
from .precision import PrecisionOpt
from .precision import line as precision_line
from .precision import run as precision_run

if TYPE_CHECKING:  # typing only: the CLI imports xarray where a command needs it
    from pathlib import Path

    import xarray as xr

# The analysis commands and what they share, wherever defined (common.py: options and helpers; compare.py: the
# commands over several checkpoints): other commands and tests import them from here.
__all__ = [
    "causal",
    "permute",
    "GRID_MAX",
    "METRIC_CHOICES",
    "compare",
    "parse_grid",
    "sweep",
    "DTYPES",
    "BatchOpt",
    "BootOpt",
    "CkptArg",
    "CkptsArg",
    "Common",
    "DataOpt",
    "DeviceMapOpt",
    "DeviceOpt",
    "DtypeOpt",
    "JsonOpt",
    "NSeqOpt",
    "OutOpt",
    "OverwriteOpt",
    "SeedOpt",
    "SeqLenOpt",
    "ThreadsOpt",
    "TokensOpt",
    "_common",
    "_fmt_share",
    "_json",
    "_matrix_view",
    "_opts",
    "_study",
    "busy",
    "check_choice",
    "check_threshold",
    "emit",
    "eval_data",
    "open_model",
    "resolve_out",
    "write",
]

# --- commands ------------------------------------------------------------------------------------------


@app.command()
@rank0_errors
@domain_errors
@eval_options
def causal(
    ckpt: CkptArg,
    threshold: Annotated[
        float, typer.Option(help="Headline threshold θ (share of late pairs with C > θ).")
    ] = registry.CAUSAL.theta,
    variant: Annotated[Literal["current", "future"], typer.Option(help="current | future")] = "current",
    aggregator: Annotated[
        Literal["max", "mean", "p95", "p99", "pooled"],
        typer.Option(help="Over tokens (the Dataset's aggregator dimension): max | mean | p95 | p99 | pooled"),
    ] = "max",
    agg: Annotated[
        Literal["max", "mean", "p95", "p99", "pooled"] | None,
        typer.Option("--agg", hidden=True, help="Deprecated spelling of --aggregator."),
    ] = None,
    unit: Annotated[Literal["block", "attn", "mlp"], typer.Option(help="block | attn | mlp")] = "block",
    norm: Annotated[
        Literal["update", "resid"],
        typer.Option(
            "--norm", help="Ratio denominator: update (|u_t|, Csordás) | resid (|h_t|, the residual stream entering t)"
        ),
    ] = "update",
    layers: Annotated[Literal["all", "late"], typer.Option(help="Skipped layers: all | late")] = "all",
    direct: Annotated[bool, typer.Option("--direct", help="Also compute the direct-effect companion C_dir.")] = False,
    outputs: Annotated[
        bool,
        typer.Option(
            "--outputs",
            help="Also compute the output effect O[s] and the layer-skip loss ΔL_skip(s) (one LM-head pass per skipped layer).",
        ),
    ] = False,
    window: Annotated[
        Literal["quarter", "half", "zero"], typer.Option(help="Late-window start: quarter | half | zero")
    ] = "quarter",
    c: Common = EVAL_DEFAULTS,  # the shared eval options (common.eval_options)
    n_boot: BootOpt = 1000,
    precision: PrecisionOpt = None,
    out: OutOpt = None,
    plot: PlotOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Causal score C(s, t): skip layer s, how much do later layers' updates change (Csordás et al. 2025)."""
    check_threshold(threshold)
    if agg is not None:
        deprecated("--agg", "--aggregator")
        aggregator = agg
    path, ow = resolve_out(out, ckpt, "causal", overwrite)
    check_plot(plot, path, overwrite)
    from ..diagnostics.sweep import score_matrix

    head = {
        "threshold": threshold,
        "aggregator": aggregator,
        "variant": variant,
        "start": window,
        "n_boot": n_boot,
        "seed": c.seed,
    }
    ds, h = _scored_run(
        "causal",
        "causal",
        ckpt,
        c,
        f"causal {ckpt.name} (layer skips)",
        precision,
        head,
        path,
        ow,
        variants=("current", "future") if variant == "future" else ("current",),
        layers=layers,
        unit=unit,
        norm=norm,
        direct=direct,
        outputs=outputs,
    )
    lines = [headline_line(h, "C", f"{ckpt} ({h['design']}, L={h['n_layer']})")]
    if verbose:
        lines += [
            f"  {h['definition']}, unit={unit}",
            f"  share C > {threshold}: {_fmt_share(h)}",
            f"  noise floor (null intervention): {h.get('noise_floor', float('nan')):.2e}",
        ]
    lines += [
        *_skip_loss_lines(ds),
        *precision_line(ds),
        f"dataset: {path}",
        "rows: skipped layer s, columns: later layer t",
    ]
    from ..plotting.plots import upper_triangle

    C = upper_triangle(
        score_matrix(ds, "causal", aggregator, variant)
    )  # t < s is undefined (NaN): "·", not "no effect"
    save_plot(
        plot, lambda: _figure(C, f"{ckpt.name}: C(s, t) > {threshold:g} in {100 * h['share']:.1f}% of late pairs")
    )
    h["plot"] = str(plot) if plot else None
    emit(h, as_json, lines, _matrix_view(C, 1.0))


def _scored_run(
    name: str,
    key: str,
    ckpt: Path,
    c: Common,
    doing: str,
    precision: float | None,
    head: dict[str, Any],
    path: Path,
    ow: bool,
    **engine: Any,
) -> tuple[xr.Dataset, dict[str, Any]]:
    """Diagnostic `name` on `ckpt` with its `engine` options (to --precision when given), then the headline share
    of score `key` (`sweep.headline` with `head`: threshold, start, n_boot, seed; for C also aggregator and
    variant), its interval in the Dataset's attrs, the Dataset written to `path`. Returns (the Dataset, the
    headline with checkpoint, design, n_layer and out)."""
    from ..diagnostics.sweep import headline, interval_attrs

    model, ck = open_model(ckpt, c)
    with busy(doing) as p:
        ds = precision_run(
            name,
            model,
            eval_data(model, ck, c),
            precision,
            {"metric": key, **head},
            checkpoint=ck,
            progress=p.engine(),
            **engine,
            **_opts(c),
        )
    h = headline(ds, key, **head)
    ds.attrs.update(interval_attrs(h))
    write(ds, path, ow)
    h.update(checkpoint=str(ckpt), design=getattr(model.design, "slug", "?"), n_layer=int(model.n_layer), out=str(path))
    return ds, h


def _skip_loss_lines(ds: xr.Dataset) -> list[str]:
    """With --outputs: the layer whose skip costs most, in loss and in output distribution."""
    from ..diagnostics.causal.dataset import skip_summary

    k = skip_summary(ds)
    if k is None:
        return []
    return [
        f"layer-skip loss ΔL_skip: max {k['max_skip_loss']:.3f} nats at layer {k['max_skip_loss_layer']}, "
        f"mean {k['mean_skip_loss']:.3f}; output effect O: max {k['max_output_effect']:.3f} at layer "
        f"{k['max_output_effect_layer']}"
    ]


@app.command()
@rank0_errors
@domain_errors
@eval_options
def permute(
    ckpt: CkptArg,
    threshold: Annotated[float, typer.Option(help="Headline threshold θ (nats for abs).")] = registry.PERM_ABS.theta,
    metric: Annotated[
        Literal["perm_abs", "perm_rel", "perm_kl"],
        typer.Option(help="The score (a Dataset variable): perm_abs (nats) | perm_rel | perm_kl (nats)"),
    ] = "perm_abs",
    norm: Annotated[
        Literal["abs", "rel", "kl"] | None, typer.Option(hidden=True, help="Deprecated spelling of --metric.")
    ] = None,
    swap: Annotated[Literal["body", "all"], typer.Option(help="body (routing stays) | all")] = "body",
    layers: Annotated[
        Literal["late", "all"],
        typer.Option(help="Swapped pairs: late (both layers in the late window) | all (every pair)"),
    ] = "late",
    pairs: Annotated[
        Literal["late", "all"] | None, typer.Option(hidden=True, help="Deprecated spelling of --layers.")
    ] = None,
    window: Annotated[
        Literal["quarter", "half", "zero"], typer.Option(help="Late-window start: quarter | half | zero")
    ] = "quarter",
    c: Common = EVAL_DEFAULTS,  # the shared eval options (common.eval_options)
    n_boot: BootOpt = 1000,
    precision: PrecisionOpt = None,
    out: OutOpt = None,
    plot: PlotOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Permutation score P(i, j): swap layers i and j, how much does the LM loss rise."""
    check_threshold(threshold)
    if pairs is not None:
        deprecated("--pairs", "--layers")
        layers = pairs
    if norm is not None:
        deprecated(f"--norm {norm}", f"--metric perm_{norm}")
        metric = f"perm_{norm}"  # type: ignore[assignment]
    path, ow = resolve_out(out, ckpt, "permutation", overwrite)
    check_plot(plot, path, overwrite)
    from ..diagnostics.sweep import score_matrix

    ds, h = _scored_run(
        "permutation",
        metric,
        ckpt,
        c,
        f"permute {ckpt.name} (layer pairs)",
        precision,
        {"threshold": threshold, "start": window, "n_boot": n_boot, "seed": c.seed},
        path,
        ow,
        pairs=layers,
        swap=swap,
    )
    symbol = {"perm_abs": "P_abs", "perm_rel": "P_rel", "perm_kl": "P_KL"}[metric]
    lines = [headline_line(h, symbol, f"{ckpt} ({h['design']}, L={h['n_layer']})")]
    if verbose:
        lines += [
            f"  {h['definition']}",
            f"  clean loss {h.get('clean_loss', float('nan')):.4f} nats; share {symbol} > {threshold}: {_fmt_share(h)}",
        ]
    lines += [*precision_line(ds), f"dataset: {path}", "rows: swapped layer i, columns: swapped layer j"]
    P = score_matrix(ds, metric, None, None)
    save_plot(
        plot, lambda: _figure(P, f"{ckpt.name}: {symbol} > {threshold:g} in {100 * h['share']:.1f}% of late pairs")
    )
    h["plot"] = str(plot) if plot else None
    emit(h, as_json, lines, _matrix_view(P))


def _figure(da: xr.DataArray, title: str) -> Any:
    """The (layer, layer_other) matrix as a heatmap (axes and colour bar labelled from the Dataset's attrs)."""
    import matplotlib

    matplotlib.use("Agg")
    from ..plotting.plots import heatmap

    return heatmap(da, vmin=0.0, title=title)


# The commands over several checkpoints, registered after the ones above (so `--help` lists them in the same
# order) and re-exported: callers import them, and the threshold grid parser, from here.
from .compare import GRID_MAX, METRIC_CHOICES, compare, parse_grid, sweep  # noqa: E402
