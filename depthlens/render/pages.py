"""index.html (self-contained: inline CSS, no scripts, only relative links to files in the report) and
README.md (the same tables and figure links, so a code host renders the results)."""

from __future__ import annotations

import html
from typing import Any

from depthlens.designs import DESIGNS
from depthlens.diagnostics import registry
from depthlens.stats import orderings, plans

NA = "—"


def metric_titles() -> dict[str, str]:
    """Figure captions per diagnostic (the registry's `Diagnostic.title`)."""
    return {d.name: d.title for d in registry.diagnostics()}


def table_columns(terminal: bool = False) -> list[tuple[str, Any]]:
    """(heading, cell(record) -> str) of every diagnostic's table columns, in registry order: the headline share
    with its 95% interval where it has one (for a max-aggregated share also the ordinary share at all N
    sequences), its untrained value and trained − untrained, then its own columns, each with its untrained value
    where the report has one (NA for designs it does not apply to)."""
    cols: list[tuple[str, Any]] = []
    for d in registry.diagnostics():
        if d.headline:
            s = d.headline
            head = f"{s.symbol} > {s.theta:g} [CI]" if terminal else f"share {s.symbol} > {s.theta:g} [95% CI]"
            cols.append((head, lambda r, p=d.prefix: _share(r, p)))
            if not terminal and s.select.get("aggregator") == "max":
                cols.append((f"{s.symbol} > {s.theta:g} at all N seqs", lambda r, p=d.prefix: _full(r, p)))
            if not terminal:
                cols.append(
                    (f"{s.symbol} untrained; trained − untrained [95%]", lambda r, p=d.prefix: _untrained(r, p))
                )
        for c in d.columns:
            init = not terminal and c.field in registry.UNTRAINED_RECORD_FIELDS
            cols.append(
                (
                    (c.short if terminal else c.head) + ("; untrained" if init else ""),
                    lambda r, d=d, c=c, init=init: (
                        (
                            _with_init(r.get(c.field), r.get(f"{c.field}_untrained"), c.fmt)
                            if init
                            else _num(r.get(c.field), c.fmt)
                        )
                        if d.applies(r["design"]) or r.get(c.field) is not None  # a described design: if run
                        else NA
                    ),
                )
            )
    return cols


def table_head(terminal: bool = False) -> tuple[str, ...]:
    base = (
        ("design", "L", "val loss")
        if terminal
        else ("design", "L", "seed", "d", "params", "LR", "val loss (train.json)", "eval loss (report)")
    )
    return (*base, *(h for h, _ in table_columns(terminal)))


INTERVAL_NOTE = (
    "Intervals are 95 %, each for the number it follows, with its method and unit of resampling in "
    "`summary.json` (`*_ci_method`, `*_ci_unit`). The causal share uses the max aggregator, an extreme-value "
    "statistic that grows with the eval set and has no valid bootstrap at all N sequences: the share with the "
    "interval is the size-fixed share at m = ⌈N/2⌉ sequences (the mean over every m-subset; delete-one "
    "jackknife over sequences, t interval); the next column is the ordinary share at all N (no interval; ↑: "
    "still rising, it grew by more than 0.01 over the last doubling of the eval set). Permutation shares: "
    "normal interval with a bootstrap standard error over sequences. 'untrained': the same diagnostic on the "
    "model of the same config and training seed at initialisation (the trainer's step-0 weights; a described "
    "model FILE.py:FUNCTION: its function's own init under a fixed torch seed, `untrained_init`); the "
    "difference is paired over the same sequences (for the permutation, the first sequences of the eval set: "
    "the untrained permutation runs on a prefix, since it is most of a report's cost; '—' where it did not run: "
    "the eval line above says where it ran). One row per checkpoint: these intervals exclude training "
    "variance (seeds are pooled in the claims below)."
)


LOSS_NOTE = (
    "Two losses, both in nats per token: 'val loss (train.json)' is the trainer's `final_val_loss` on its own "
    "held-out batches (train.json `val_batches` × batch × sequence length tokens; '—' where none is recorded: a "
    "model depthlens did not train, such as a described model FILE.py:FUNCTION or a Hugging Face or GGUF model, "
    "has no train.json); 'eval "
    "loss (report)' is the clean next-token loss on this report's eval set (the tokens of the eval line "
    "above), the loss the claims below use."
)


def _ci(v: Any, lo: Any, hi: Any, fmt: str = ".2f", signed: bool = False) -> str:
    if v is None:
        return NA
    f = ("+" if signed else "") + fmt
    return format(v, f) + (f" [{format(lo, f)}, {format(hi, f)}]" if lo is not None and hi is not None else "")


def _untrained(r: dict[str, Any], key: str) -> str:
    u = r.get(f"{key}_share_untrained")
    if u is None:
        return NA
    d = _ci(
        r.get(f"{key}_untrained_diff"),
        r.get(f"{key}_untrained_diff_low"),
        r.get(f"{key}_untrained_diff_high"),
        signed=True,
    )
    n, N = r.get(f"{key}_untrained_n_seq"), (r.get(f"{key}_eval_sizes") or [None])[-1]
    return f"{u:.2f}; {d}" + (f" (first {n} seqs)" if n and N and n < N else "")


def _full(r: dict[str, Any], key: str) -> str:
    v = r.get(f"{key}_share_full")
    return NA if v is None else f"{v:.2f}" + (" ↑" if r.get(f"{key}_still_rising") else "")


def _with_init(v: Any, u: Any, fmt: str) -> str:
    return NA if v is None else format(v, fmt) + ("" if u is None else f"; {format(u, fmt)}")


def _num(v: Any, fmt: str = ".3f", none: str = NA) -> str:
    return none if v is None else format(v, fmt) if fmt else str(v)


def _share(r: dict[str, Any], key: str) -> str:
    s = r.get(f"{key}_share")
    if s is None:
        return NA
    lo, hi = r.get(f"{key}_ci_low"), r.get(f"{key}_ci_high")
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{s:.2f}{ci}"


def table_rows(records: list[dict[str, Any]], terminal: bool = False) -> list[list[str]]:
    """The paper-form table as strings: design × depth, NA where no validation loss is recorded (`table_head`)."""
    cols = table_columns(terminal)
    rows = []
    for r in records:
        base = [r.get("design_name") or r["design"], str(r["n_layer"])]
        if not terminal:
            base += [
                NA if r.get("seed") is None else str(r["seed"]),
                str(r["d_model"]),
                f"{r['params_total']:,}" if r.get("params_total") is not None else NA,
                _num(r.get("lr"), "g"),
            ]
        losses = [_num(r.get("val_loss"), ".3f")] + ([] if terminal else [_num(r.get("eval_loss"), ".3f")])
        rows.append([*base, *losses, *(cell(r) for _, cell in cols)])
    return rows


def crossing_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            r["checkpoint"],
            _num(r.get("causal_theta_50"), ".3f"),
            _num(r.get("causal_theta_10"), ".3f"),
            _num(r.get("perm_theta_50"), ".4f"),
            _num(r.get("perm_theta_10"), ".4f"),
            _num(r.get("causal_noise_floor"), ".2e"),
        ]
        for r in records
    ]


def _headlined() -> list[tuple[registry.Diagnostic, registry.Score]]:
    """(diagnostic, its headline score) of every diagnostic with a headline share, in registry order."""
    return [(d, d.headline) for d in registry.diagnostics() if d.headline is not None]


def _first(r: dict[str, Any], field: str) -> Any:
    """`<prefix>_<field>` of the first diagnostic with a headline share whose record has it (None: none has)."""
    return next((r[k] for d, _ in _headlined() if r.get(k := f"{d.prefix}_{field}")), None)


def eval_size_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    """Shares on nested prefixes of the eval set (1/8, 1/4, 1/2, all of it); ↑ = still rising at the size used."""
    out = []
    for r in records:
        sizes, toks = _first(r, "eval_sizes"), _first(r, "eval_size_tokens")
        if not sizes:
            continue
        size = " / ".join(f"{n}" + (f" ({t})" if toks else "") for n, t in zip(sizes, toks or sizes))
        cells = []
        for key in (d.prefix for d, _ in _headlined()):
            v = r.get(f"{key}_eval_size_shares")
            cells.append(
                NA if not v else " / ".join(f"{x:.2f}" for x in v) + (" ↑" if r.get(f"{key}_still_rising") else "")
            )
        out.append([r["checkpoint"], size, *cells])
    return out


def lr_rows(sweep: dict[str, Any] | None, records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(head, rows): the peak LR each design trained with per depth (train.json) and the sweep's choice.

    Reads both sweep formats: {"chosen": {design: lr}} (one depth) and {"chosen": {design: {L: lr}},
    "interior": {design: {L: bool}}}."""
    sweep = sweep or {}
    chosen, interior, losses = sweep.get("chosen", {}), sweep.get("interior", {}), sweep.get("val_loss", {})
    depths = sorted({int(r["n_layer"]) for r in records})
    budget = f"{sweep['steps']} steps, one seed per LR" if sweep.get("steps") else "short budget"
    head = [
        "design",
        *[f"LR used at L = {L}" for L in depths],
        f"sweep ({budget}): chosen LR per swept depth (grid; interior?)",
    ]
    check = lr400_results()
    if check:
        head.append("check at the zoo's budget (400 steps): lowest mean loss (LRs run; seeds shared)")
    out = []
    for design in dict.fromkeys(r["design"] for r in records):
        used = []
        for L in depths:
            lrs = sorted({r["lr"] for r in records if r["design"] == design and r["n_layer"] == L and r.get("lr")})
            used.append(", ".join(f"{x:g}" for x in lrs) or NA)
        c = chosen.get(design)
        if isinstance(c, dict):
            parts = []
            for L, lr in sorted(c.items(), key=lambda kv: int(kv[0])):
                grid = sorted(float(x) for x in (losses.get(design, {}).get(L) or {}))
                flag = interior.get(design, {}).get(L)
                parts.append(
                    f"L = {L}: {float(lr):g} ({len(grid)} LRs {grid[0]:g}–{grid[-1]:g}; "
                    f"{'interior' if flag else 'AT AN EDGE' if flag is not None else '?'})"
                    if grid
                    else f"L = {L}: {float(lr):g}"
                )
            swept = "; ".join(parts)
        elif c is not None:
            grid = sorted(float(x) for x in (losses.get(design) or {}))
            at_edge = grid and float(c) in (grid[0], grid[-1])
            swept = (
                f"{float(c):g} (one depth; grid {', '.join(f'{g:g}' for g in grid)}"
                + ("; AT AN EDGE of the grid" if at_edge else "; interior")
                + ")"
            )
        else:
            swept = NA
        row = [design, *used, swept]
        if check:
            cells = {k: v for k, v in (check.get("cells") or {}).items() if k.rsplit("_l", 1)[0] == design}
            row.append(
                "; ".join(
                    f"L = {k.rsplit('_l', 1)[1]}: not run yet (only the current LR)"
                    if len(c["per_lr"]) < 3
                    else f"L = {k.rsplit('_l', 1)[1]}: {c['winner']:g} ({', '.join(c['per_lr'])}; "
                    f"{c['common_seeds']} seed(s)"
                    + ("" if c.get("interior") else "; AT AN EDGE, still extending")
                    + (
                        f"; within 2 SE: {', '.join(c['indistinguishable_from_winner'])}"
                        if c.get("indistinguishable_from_winner")
                        else ""
                    )
                    + "".join(
                        f"; {lr} diverged (seed {', '.join(map(str, seeds))})"
                        for lr, seeds in (c.get("diverged") or {}).items()
                    )
                    + ")"
                    for k, c in sorted(cells.items(), key=lambda kv: int(kv[0].rsplit("_l", 1)[1]))
                )
                or NA
            )
        out.append(row)
    return head, out


def lr400_results() -> dict[str, Any] | None:
    """The committed LR check at the zoo's budget (depthlens/recipes/zoo_cpu_lr400_results.json), None when absent."""
    try:
        import json

        from depthlens.training.lr400 import RESULTS_PATH

        return json.loads(RESULTS_PATH.read_text(encoding="utf-8")) if RESULTS_PATH.is_file() else None
    except (OSError, ValueError, ImportError):
        return None


def lr_sweep() -> dict[str, Any] | None:
    """The committed LR sweep (depthlens/recipes/zoo_cpu_lr_sweep.json), None when absent."""
    try:
        from depthlens.training.recipes import zoo_lr_results

        return zoo_lr_results() or None
    except (OSError, ValueError, ImportError):
        return None


EVAL_SIZE_NOTE = (
    "The ordinary share (at all sequences of the prefix, max aggregator for the causal score) on nested "
    "prefixes of the one eval set: 1/8, 1/4, 1/2 and all of it. ↑: the share grew by more than 0.01 "
    "over the last doubling, so it is still rising at the size used and a larger eval set would "
    "give a larger number."
)
LR_NOTE = (
    "The peak learning rate each checkpoint trained with (train.json), and what the committed sweep "
    "(depthlens/recipes/zoo_cpu_lr_sweep.json) chose per design and swept depth, with its grid and budget; "
    "an optimum at an edge of its grid is not a tuned learning rate, and one at a shorter budget with one "
    "seed per LR is a proxy. Where present, the check at the zoo's own budget "
    "(depthlens/recipes/zoo_cpu_lr400_results.json): the LR with the lowest mean final validation loss over "
    "the seeds its finalists share (the LRs run with 2 seeds or more: the seed-0 winner and its neighbours; "
    "the grid's other points were eliminated on seed 0), the finalists within 2 seed-to-seed SEs of it "
    "(indistinguishable at this many seeds), and the LRs where a run diverged (ended more than 0.5 nats/byte "
    "above the cell's best run: unstable, left out of the seed SD)."
)


TRAINED_WITH_NOTE = (
    "The code each checkpoint was trained with (train.json `git_sha`; `depthlens info` warns when the training "
    "code changed since) and its weight-decay rule for residual-mixing and scaling parameters (`decay_mixing`; "
    "'not recorded': trained before the option existed, when every parameter with ≥ 2 dims was decayed, "
    "HC's static maps included). A different decay rule (or LR, table above) is a different recipe: "
    "compare designs within one rule."
)
TRAINED_WITH_HEAD = ("training code (git)", "decay_mixing", "checkpoints")


def trained_with_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    """Checkpoints grouped by (training code, decay_mixing), largest group first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in records:
        dm = r.get("decay_mixing")
        key = (r.get("train_git_sha") or NA, "not recorded" if dm is None else str(dm).lower())
        groups.setdefault(key, []).append(str(r["checkpoint"]))
    return [
        [sha, dm, f"{len(names)}: {', '.join(names)}"]
        for (sha, dm), names in sorted(groups.items(), key=lambda kv: -len(kv[1]))
    ]


def _eval_size_head() -> tuple[str, ...]:
    shares = (f"{d.name} share {s.symbol} > {s.theta:g} on each prefix" for d, s in _headlined())
    return ("checkpoint", "sequences (tokens)", *shares)


CROSSING_HEAD = (
    "checkpoint",
    "causal θ₀.₅",
    "causal θ₀.₁",
    "P_abs θ₀.₅ [nat]",
    "P_abs θ₀.₁ [nat]",
    "causal noise floor",
)
ROBUST_HEAD = (
    "metric",
    "L",
    "ranking at the headline θ (lowest → highest share)",
    "Kendall τ vs ranking over the θ grid (mean / min)",
)


def robustness_rows(rob: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rob:
        names = [DESIGNS[s].name if s in DESIGNS else s for s in r["order"]]
        vals = r["shares_at_headline"]
        order = f"{names[0]} ({vals[0]:.2f})" + "".join(
            f" {'<' if b > a else '≤'} {n} ({b:.2f})" for n, a, b in zip(names[1:], vals, vals[1:])
        )
        tau = f"{_num(r.get('kendall_tau_mean'), '.2f')} / {_num(r.get('kendall_tau_min'), '.2f')}"
        out.append([r["metric"], str(r["n_layer"]), order, tau])
    return out


def _coverage_line(rep) -> str:
    """The per-checkpoint intervals' simulated coverage at this report's sizes (stats.crossed.COVERAGE)."""
    from depthlens.stats.crossed import sequence_coverage_note

    n = rep.data.n_seq
    k = rep.options.perm_n_seq
    return sequence_coverage_note(n, k if k and k < n else n)


def _perm_prefix(k: int | None, n: int) -> str:
    return f", on the first {k} of the {n} sequences" if k and k < n else ""


def _eval_line(rep) -> str:
    d, o = rep.data, rep.options
    return (
        f"{len(rep.entries)} checkpoints · eval data `{d.name}` ({d.n_seq} sequences × {d.seq_len} tokens, "
        f"seed {d.seed}, sha256 {d.sha256[:12]}…, the same tokens for every checkpoint) · causal: current "
        f"variant, max aggregator, skipped layers: {o.causal_layers} · permutation: {o.perm_pairs} pairs, body "
        f"swap{_perm_prefix(o.perm_n_seq, d.n_seq)} · late window ⌊L/4⌋…L−1 · intervals over sequences: jackknife (causal max, size-fixed at m = "
        f"⌈N/2⌉) and {o.n_boot} bootstrap resamples (permutation) · untrained baselines: "
        f"{', '.join(o.untrained) or 'none'}{_untrained_scope(o, d.n_seq)}"
    )


def _untrained_scope(o, n: int) -> str:
    """What each untrained run that does not see the whole report covers: its eval sequences capped to a prefix
    (`Diagnostic.seq_caps`), its cells only those a claim names (`untrained_where_claimed`), its checkpoints only
    those of the first training seeds (`untrained_seeds`)."""
    out = ""
    for d in registry.diagnostics():
        if d.name not in o.untrained or not (d.seq_caps or d.untrained_where_claimed):
            continue
        k = min(x for x in (*(getattr(o, c) for c in d.seq_caps), n) if x)
        where = (
            f" at the designs and depths a {d.name} claim names (--untrained-perm-for claims)"
            if d.untrained_where_claimed and o.untrained_perm_for == "claims"
            else ""
        )
        out += f" (the untrained {d.name} on the first {k} sequences{where})"
    if o.untrained_seeds is not None and o.untrained:
        k = o.untrained_seeds
        out += (
            f" (untrained twins only for training seeds < {k}, --untrained-seeds {k}: every at-init number pools "
            "the seeds that have one, and the claims below say how many)"
        )
    return out


def _timing_line(rep) -> str:
    # timings differ run to run: they live in the untracked timings.json, so a rerun leaves this page unchanged
    return "timings: timings.json (not tracked)"


# ---------------------------------------------------------------------------------------------------------------
# HTML

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1400px;
padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
img{max-width:100%;height:auto;border:1px solid #eee}
.grid{display:flex;flex-wrap:wrap;gap:10px}.grid figure{margin:0;flex:1 1 420px;max-width:640px}
figcaption{font-size:12px;color:#555}.note{color:#a40}code{background:#f5f5f5;padding:0 3px}
nav a{margin-right:.8em}
"""


def _h(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _html_table(head, rows) -> str:
    th = "".join(f"<th>{_h(c)}</th>" for c in head)
    body = "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>\n<thead><tr>{th}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _img(path: str, caption: str) -> str:
    return (
        f'<figure><a href="{_h(path)}"><img src="{_h(path)}" alt="{_h(caption)}" loading="lazy"></a>'
        f"<figcaption>{_h(caption)}</figcaption></figure>"
    )


def render_html(rep) -> str:
    recs = rep.records
    main_rows = [[_h(c) for c in row] for row in table_rows(recs)]
    for row, r in zip(main_rows, recs):
        row[0] = f'<a href="#{_h(r["checkpoint"])}">{row[0]}</a>'
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>depthlens report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>depthlens report: does this residual design turn extra layers into extra computation?</h1>",
        f"<p>{_h(_eval_line(rep))}</p>",
        '<nav><a href="#table">table</a><a href="#sweeps">threshold sweeps</a><a href="#robustness">robustness</a>'
        '<a href="#overview">overview</a><a href="#checkpoints">per checkpoint</a><a href="#files">files</a></nav>',
        '<h2 id="table">Design × depth</h2>',
        "<p>Shares are over the late pairs (i &lt; j, both in ⌊L/4⌋…L−1), strict &gt;. "
        f"{_h(INTERVAL_NOTE)} {_h(_coverage_line(rep))} {_h(LOSS_NOTE)} LR: the peak learning rate it "
        "trained with. erank: HC/mHC only; k*(0.05): Full/Block AttnRes only.</p>",
        _html_table(table_head(), main_rows),
    ]
    if eval_size_rows(recs):
        parts.append('<h2 id="evalsize">Share against eval-set size</h2>')
        parts.append(f"<p>{_h(EVAL_SIZE_NOTE)}</p>")
        parts.append(_html_table(_eval_size_head(), [[_h(c) for c in row] for row in eval_size_rows(recs)]))
    lr_head, lr_body = lr_rows(lr_sweep(), recs)
    parts.append('<h2 id="lr">Learning rates</h2>')
    parts.append(f"<p>{_h(LR_NOTE)}</p>")
    parts.append(_html_table(lr_head, [[_h(c) for c in row] for row in lr_body]))
    parts.append('<h2 id="trained-with">Trained with</h2>')
    parts.append(f"<p>{_h(TRAINED_WITH_NOTE)}</p>")
    parts.append(_html_table(TRAINED_WITH_HEAD, [[_h(c) for c in row] for row in trained_with_rows(recs)]))
    if "summary" in rep.figures:
        parts.append(f'<div class="grid">{_img(rep.figures["summary"], "headline numbers against depth")}</div>')
    checked = orderings.check_all(rep.records, rep.comparisons)
    parts.append('<h2 id="orderings">DepthBench\'s claims at this scale</h2>')
    parts.append(f"<p>{_h(orderings.CAVEAT)}</p>")
    parts.append(_html_table(orderings.HEAD, [[_h(c) for c in row] for row in orderings.rows(checked)]))
    parts.append(f"<p>{_h(orderings.summary_line(checked))}</p>")
    todo = plans.unresolved_plans(rep.comparisons, checked)
    if todo:
        parts.append(f'<h2 id="plan">{_h(plans.PLAN_TITLE)}</h2>')
        parts.append(f"<p>{_h(plans.PLAN_NOTE)}</p>")
        parts.append(_html_table(plans.PLAN_HEAD, [[_h(c) for c in row] for row in plans.plan_table(todo)]))
    parts.append('<h2 id="sweeps">Threshold sweeps and crossing points</h2>')
    parts.append(
        "<p>S(θ): share of late pairs above θ, one curve per checkpoint, grouped by depth; the dashed line "
        "is the headline θ. θ_q is where S falls to q (NaN/— when the grid never brackets it).</p>"
    )
    sweeps = [
        _img(p, f"threshold sweep: {k.removeprefix('sweep_')}")
        for k, p in rep.figures.items()
        if k.startswith("sweep_")
    ]
    if sweeps:
        parts.append('<div class="grid">' + "".join(sweeps) + "</div>")
    parts.append(_html_table(CROSSING_HEAD, [[_h(c) for c in row] for row in crossing_rows(recs)]))
    parts.append('<h2 id="robustness">Ranking robustness</h2>')
    if rep.robustness:
        parts.append(
            "<p>Designs of one depth ranked by their share at the headline θ (ties, shown as ≤, broken by "
            "the curve's integral = the mean score), and Kendall τ-b between the shares at each θ of the "
            "grid and that ranking (θ where all shares tie skipped).</p>"
        )
        parts.append(_html_table(ROBUST_HEAD, [[_h(c) for c in row] for row in robustness_rows(rep.robustness)]))
    else:
        parts.append("<p>Needs at least two checkpoints of the same depth.</p>")
    overview = [_img(p, k.replace("_", ": ")) for k, p in rep.figures.items() if k.startswith("overview_")]
    parts.append('<h2 id="overview">Overview</h2>')
    if overview:
        parts.append('<div class="grid">' + "".join(overview) + "</div>")
    parts.append('<h2 id="checkpoints">Per checkpoint</h2>')
    for e, r in zip(rep.entries, recs):
        parts.append(
            f'<h3 id="{_h(e.name)}">{_h(e.name)} — {_h(r.get("design_name"))}, L = {e.n_layer}, '
            f"d = {e.d_model}, {r.get('params_total') or 0:,} params</h3>"
        )
        parts.append(
            f"<p><code>{_h(e.path)}</code> · val loss {_h(_num(r.get('val_loss'), '.3f', 'not recorded'))} · "
            f"eval loss {_h(_num(r.get('eval_loss'), '.3f'))}</p>"
        )
        imgs = [_img(p, metric_titles().get(m, m)) for m, p in e.figures.items()]
        if imgs:
            parts.append('<div class="grid">' + "".join(imgs) + "</div>")
        for n in e.notes:
            parts.append(f'<p class="note">{_h(n)}</p>')
    parts.append('<h2 id="files">Files</h2><ul>')
    parts.append('<li><a href="summary.json">summary.json</a> — the table as records</li>')
    parts.append(
        '<li><a href="manifest.json">manifest.json</a> — options, eval data, file index; timings.json: compute times and machine (not tracked)</li>'
    )
    parts.append('<li><a href="README.md">README.md</a> — this report in Markdown</li>')
    for f, names in rep.files.items():
        parts.append(f'<li><a href="{_h(f)}">{_h(f)}</a> — {_h(", ".join(names))}</li>')
    parts.append("</ul>")
    if rep.notes:
        parts += [f'<p class="note">{_h(n)}</p>' for n in rep.notes]
    parts.append(f"<p><small>{_h(_timing_line(rep))} · {_h(rep.command)}</small></p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Markdown


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|")


def _md_table(head, rows) -> str:
    lines = ["| " + " | ".join(_md_cell(c) for c in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plan_section(rows: list[dict[str, Any]] | Any) -> str:
    """The power plan's markdown section for `stats.plans` rows ("" when there are none)."""
    if not rows:
        return ""
    return (
        "\n".join(
            [f"## {plans.PLAN_TITLE}", "", plans.PLAN_NOTE, "", _md_table(plans.PLAN_HEAD, plans.plan_table(rows)), ""]
        )
        + "\n"
    )


def render_markdown(rep) -> str:
    recs = rep.records
    out = [
        "# depthlens report",
        "",
        "Does this residual design turn extra layers into extra computation? Open `index.html` for the full page.",
        "",
        _eval_line(rep) + ".",
        "",
        "## Design × depth",
        "",
        "Shares over the late pairs (strict >). "
        + INTERVAL_NOTE
        + " "
        + _coverage_line(rep)
        + " "
        + LOSS_NOTE
        + " LR: the peak learning "
        "rate it trained with. erank: HC/mHC only; k*(0.05): Full/Block AttnRes only.",
        "",
        _md_table(table_head(), table_rows(recs)),
        "",
    ]
    if eval_size_rows(recs):
        out += [
            "## Share against eval-set size",
            "",
            EVAL_SIZE_NOTE,
            "",
            _md_table(_eval_size_head(), eval_size_rows(recs)),
            "",
        ]
    lr_head, lr_body = lr_rows(lr_sweep(), recs)
    out += ["## Learning rates", "", LR_NOTE, "", _md_table(lr_head, lr_body), ""]
    out += ["## Trained with", "", TRAINED_WITH_NOTE, "", _md_table(TRAINED_WITH_HEAD, trained_with_rows(recs)), ""]
    if "summary" in rep.figures:
        out += [f"![headline numbers against depth]({rep.figures['summary']})", ""]
    checked = orderings.check_all(recs, rep.comparisons)
    out += [orderings.markdown(checked), ""]
    plan_md = plan_section(plans.unresolved_plans(rep.comparisons, checked))
    if plan_md:
        out += [plan_md]
    out += ["## Threshold sweeps and crossing points", ""]
    for k, p in rep.figures.items():
        if k.startswith("sweep_"):
            out += [f"![threshold sweep {k.removeprefix('sweep_')}]({p})", ""]
    out += [_md_table(CROSSING_HEAD, crossing_rows(recs)), "", "## Ranking robustness", ""]
    if rep.robustness:
        out += [
            "Designs of one depth ranked by their share at the headline θ (ties, shown as ≤, broken by the mean "
            "score), and Kendall τ-b between the shares at each θ of the grid and that ranking (θ where all "
            "shares tie skipped).",
            "",
            _md_table(ROBUST_HEAD, robustness_rows(rep.robustness)),
            "",
        ]
    else:
        out += ["Needs at least two checkpoints of the same depth.", ""]
    overview = [(k, p) for k, p in rep.figures.items() if k.startswith("overview_")]
    if overview:
        out += ["## Overview", ""] + [f"![{k}]({p})\n" for k, p in overview]
    titles = metric_titles()
    metrics = [m for m in titles if any(m in e.figures for e in rep.entries)]
    out += ["## Per-checkpoint figures", ""]
    rows = [[e.name] + [f"[png]({e.figures[m]})" if m in e.figures else NA for m in metrics] for e in rep.entries]
    out += [_md_table(["checkpoint"] + [titles[m] for m in metrics], rows), ""]
    notes = [f"- {e.name}: {n}" for e in rep.entries for n in e.notes] + [f"- {n}" for n in rep.notes]
    if notes:
        out += ["## Notes", ""] + notes + [""]
    out += [
        "## Files",
        "",
        "- `summary.json`: the table as records; `manifest.json`: options, eval data, "
        "file index; `timings.json`: compute times and machine facts (not tracked: they change run to run)",
    ]
    out += [f"- [`{f}`]({f}): {', '.join(names)}" for f, names in rep.files.items()]
    out += ["", f"<sub>{_timing_line(rep)} · `{rep.command}`</sub>", ""]
    return "\n".join(out)
