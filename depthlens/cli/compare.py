"""Analysis commands over several checkpoints: `sweep` (a headline share as a function of its threshold θ,
with the ranking robustness of the checkpoints) and `compare` (the headline shares of several checkpoints side
by side). Their shared options and helpers are in `common.py`; `analyze.py` registers this module after its own
commands, so `depthlens --help` lists them in the same order as before.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from ..diagnostics import registry  # stdlib-only: names, aliases and default thresholds for the help texts
from ..runtime.defaults import DEFAULT_N_BOOT
from .app import QuietOpt, app, domain_errors, fail, print_table
from .common import (
    EVAL_DEFAULTS,
    BootOpt,
    CkptsArg,
    Common,
    JsonOpt,
    OutOpt,
    OverwriteOpt,
    _json,
    _study,
    busy,
    check_plot,
    check_threshold,
    emit,
    eval_options,
    resolve_out,
    save_plot,
    write,
)

GRID_MAX = 10_000  # threshold grid points: share(θ) curves are smooth far below this


def parse_grid(text: str) -> list[float]:
    """'0:1.5:0.05' (start:stop:step, inclusive) or '0.1,0.2,0.5'."""
    import numpy as np

    try:
        if ":" in text:
            a, b, s = (float(x) for x in text.split(":"))
            if not (s > 0 and b >= a and math.isfinite(a) and math.isfinite(b)):
                raise ValueError
            n = (b - a) / s + 1  # sized before allocating: 10^7 points would write 1.3 GB; inf for a 1e-320 step
            if not math.isfinite(n) or n > GRID_MAX:
                many = f"{int(n):,}" if n < 1e15 else "too many"
                fail(f"--thresholds {text}: {many} points; at most {GRID_MAX:,}", 2)
            vals = [round(float(v), 10) for v in np.arange(a, b + s / 2, s)]  # Python's round: no overflow at 1e308
        else:
            vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--thresholds: expected start:stop:step or a comma list, got {text!r}", 2)
        raise
    if len(vals) > GRID_MAX:
        fail(f"--thresholds: {len(vals):,} points; at most {GRID_MAX:,}", 2)
    for v in vals:
        check_threshold(v, "--thresholds")
    if not vals:
        fail("--thresholds is empty", 2)
    return vals


METRIC_CHOICES = (
    registry.SWEEPABLE
)  # shipped: causal, perm_abs, perm_rel, perm_kl (registry.sweepable() adds registered)
# each diagnostic's headline score, in registry order: compare's default scores; the first is sweep's default
HEADLINES = registry.HEADLINES
HEADLINE_THETAS = tuple(registry.score(k).theta for k in HEADLINES)  # their default θ (the help texts)


@app.command()
@domain_errors
@eval_options
def sweep(
    ckpts: CkptsArg,
    metric: Annotated[str, typer.Option(help=" | ".join(METRIC_CHOICES))] = HEADLINES[0],
    thresholds: Annotated[
        str | None, typer.Option(help="θ grid, start:stop:step or comma list (default per metric).")
    ] = None,
    headline_threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold", help=f"Headline θ to mark (default {' / '.join(f'{t:g}' for t in HEADLINE_THETAS)})."
        ),
    ] = None,
    order: Annotated[
        str | None, typer.Option(help="Expected ranking, comma-separated checkpoint names (low to high).")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the share(θ) curves plot here (PNG).")] = None,
    c: Common = EVAL_DEFAULTS,  # the shared eval options (common.eval_options)
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Threshold-sensitivity sweep: share(θ) curves per checkpoint, crossing points, ranking robustness."""
    from ..studies.api import check_scores

    check_scores([metric], "--metric")
    grid = parse_grid(thresholds) if thresholds else None
    if headline_threshold is not None:
        check_threshold(headline_threshold)
    path, ow = resolve_out(out, Path("sweep"), metric, overwrite)
    check_plot(plot, path, overwrite)  # now, so a bad --plot cannot fail after the dataset was written
    if len({p.resolve().name for p in ckpts}) != len(ckpts):
        fail("checkpoint names must be distinct", 2)
    from ..studies.study import _names

    names = _names(ckpts)  # the names the study gives them (file-name safe: a described model's FILE.py_FUNCTION)
    rank_order = [s.strip() for s in order.split(",")] if order else None
    if rank_order is not None and sorted(rank_order) != sorted(names):
        fail(f"--order must list each checkpoint name once ({', '.join(names)}); got {order!r}", 2)
    from ..studies import api

    with busy(f"sweep of {metric} over {len(ckpts)} checkpoint(s)"):
        res = api.sweep(ckpts, metric, grid, theta=headline_threshold, order=rank_order, opts=_study(c))
    ds, headline_curves, sel, theta, rob = (
        res["dataset"],
        res["curves"],
        res["selection"],
        res["theta"],
        res["robustness"],
    )
    write(ds, path, ow)
    from ..plotting.plots import share_curves as draw

    save_plot(plot, lambda: draw(headline_curves, headline=theta))
    from ..diagnostics.sweep import definition

    owner = registry.score_owner(metric)[0]
    defn = definition(
        metric,
        variant=sel.get("variant"),
        aggregator=sel.get("aggregator"),
        swap={**owner.report_opts, **owner.late_opts}.get("swap"),  # the engine option the sweep's study ran with
    )
    h: dict[str, Any] = {
        "metric": metric,
        "definition": defn,
        "headline_threshold": theta,
        "checkpoints": names,
        "out": str(path),
        "plot": str(plot) if plot else None,
    }
    if rob is not None:
        h["ranking_order"] = rank_order
        h["ranking_fraction"] = float(rob["fraction"])
    lines = [f"share(θ) for {defn} over {len(ds['threshold'])} thresholds, {len(names)} checkpoint(s)"]
    if "crossing" in ds:
        lines.append("crossing points θ_q (share falls to q):")
        cr = ds["crossing"]
        cr = cr.sel({k: v for k, v in sel.items() if k in cr.dims})
        for name in names:
            row = cr.sel(checkpoint=name)
            lines.append(
                f"  {name:>20}: "
                + "  ".join(f"q={float(q):g}: {float(v):.3g}" for q, v in zip(row["q"].values, row.values))
            )
            h.setdefault("crossings", {})[name] = {str(float(q)): float(v) for q, v in zip(row["q"].values, row.values)}
    if rob is not None:
        assert rank_order is not None  # api.sweep computes robustness only against a given order
        lines.append(f"ranking {' < '.join(rank_order)} holds on {100 * float(rob['fraction']):.0f}% of the θ grid")
    elif len(names) > 1:
        lines.append("ranking robustness: give the expected order with --order a,b,... (low to high)")
    lines.append(f"dataset: {path}" + (f"; plot: {plot}" if plot else ""))
    emit(h, as_json, lines)


@app.command()
@domain_errors
@eval_options
def compare(
    ckpts: CkptsArg,
    metrics: Annotated[str, typer.Option(help=f"Comma list of {', '.join(METRIC_CHOICES)}.")] = ",".join(HEADLINES),
    c: Common = EVAL_DEFAULTS,  # the shared eval options (common.eval_options)
    n_boot: BootOpt = DEFAULT_N_BOOT,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Headline shares (with CIs) side by side for several checkpoints on identical eval data."""
    from ..studies import api

    wanted = api.check_scores(metrics)
    with busy(f"headline shares of {len(ckpts)} checkpoint(s)"):
        rows = api.headline_shares(ckpts, wanted, opts=_study(c, n_boot))
    if as_json:
        typer.echo(_json(rows))
        return
    from rich.table import Table

    defs = "; ".join(dict.fromkeys(r[m]["definition"] for r in rows for m in wanted))
    methods = "; ".join(
        dict.fromkeys(
            f"{m}: {r[m]['ci_method']} over {r[m]['ci_unit']}" for r in rows for m in wanted if r[m].get("ci_method")
        )
    )
    t = Table(title="headline shares over the late window (95% interval)", caption=f"{defs}\n{methods}")
    for col in ("checkpoint", "design", "L", *wanted):
        t.add_column(col)
    for r in rows:
        cells = []
        for m in wanted:
            h = r[m]
            ci = "" if math.isnan(h["ci_low"]) else f" [{100 * h['ci_low']:.0f}, {100 * h['ci_high']:.0f}]"
            size = (
                f" at m = {h['subsample_m']} seqs; all {h['n_sequences']}: {100 * h['share_full']:.1f}%"
                if h.get("subsample_m") is not None
                else ""
            )
            cells.append(f"{100 * h['share']:.1f}%{ci} (> {h['threshold']}){size}")
        t.add_row(r["checkpoint"], r["design"], str(r["n_layer"]), *cells)
    print_table(t)
