"""The real-model atlas page: several pretrained models' stage data side by side -> <atlas>/README.md.

    python scripts/atlas.py reports/atlas smollm2-135m-instruct gemma-3-270m qwen2.5-coder-0.5b-instruct

Reads what `scripts/real_model_report.py` wrote under `<atlas>/<model>/data/` (`scripts/real-model-atlas.sh`
runs both) and writes `<atlas>/atlas.json` (every number of the page, with its definition and interval method),
`<atlas>/figures/*.png` and `<atlas>/README.md`. Depth is normalised (layer / L) wherever models of different
depth share an axis. Nothing is computed on a model here: only the saved datasets are read, and a stage that is
missing is listed as missing, never filled in.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from depthlens.studies import real_model as rm  # noqa: E402  (after the checkout is on the path)

C_THETA = 0.45  # the causal headline threshold (docs/calibration.md)
N_BOOT_HELDOUT = 1000  # resamples of the held-out pruning curves' paired intervals (per-sequence means: cheap)
N_BOOT = 200  # bootstrap resamples where an interval is a bootstrap (the max aggregator's is a jackknife)
DEFINITIONS = [(v, a) for v in ("current", "future") for a in ("max", "mean")]  # causal variant × aggregator
PERM_NORMS = ("perm_abs", "perm_rel", "perm_kl")  # the permutation score's definitions (docs/calibration.md)
# the stages the page needs (one that is missing is listed as missing), in the study's order: every stage of the
# real-model study's one list but the optional second control (its section is left out when it was not computed)
# and the reference stage (issue 10's measurements, not on this page)
STAGES = tuple(s.name for s in rm.STAGES if s.name not in (*rm.TWIN_CONTROLS, "reference"))
CRITERIA_LABELS = {
    "angular_block": "angular distance of a contiguous block (Gromov et al.)",
    "block_influence": "block influence 1 − cos (ShortGPT)",
    "skip_loss": "single-layer skip loss",
    "causal": "causal importance (mean downstream effect)",
    "permutation": "permutation importance (mean loss rise of the layer's late swaps)",
    "random": "random layers (mean of draws)",
}


def _load(d: Path, name: str):
    import xarray as xr

    p = d / "data" / f"{name}.nc"
    return xr.load_dataset(p) if p.exists() else None


def _interval(h: dict[str, Any] | None) -> dict[str, Any] | None:
    if not h:
        return None
    keys = ("share", "ci_low", "ci_high", "ci_method", "ci_unit", "share_full", "subsample_m", "n_sequences")
    return {k: h.get(k) for k in keys}


def _difference(diff: Any) -> dict[str, Any] | None:
    """A paired trained − twin interval (`paired_share_difference`) as JSON; None when there is none."""
    if diff is None:
        return None
    return {
        "estimate": diff.estimate,
        "low": diff.low,
        "high": diff.high,
        "method": diff.method,
        "unit": diff.unit,
        "n_units": diff.n_units,
    }


def _late_median(ds: Any, metric: str) -> float:
    """Median of a permutation score over the late pairs it was computed on (i < j, both >= floor(L/4))."""
    import numpy as np

    from depthlens.stats.metrics import late_pairs

    m = ds[metric].values
    pairs = late_pairs(m.shape[0], "quarter")
    return float(np.nanmedian(m[pairs[:, 0], pairs[:, 1]]))


def _finite(values: Any) -> list[float | None]:
    """Floats for JSON, None where a value is NaN (a layer the diagnostic did not score)."""
    return [float(x) if x == x else None for x in values]


def model_summary(d: Path) -> dict[str, Any]:
    """Every number the atlas shows for one model directory, from its saved stage datasets."""
    import numpy as np

    from depthlens.diagnostics.sweep import headline, paired_share_difference

    run = json.loads((d / "data" / "run.json").read_text())
    prov = run.get("provenance", {})
    L = int(run["n_layer"])
    ang, cau, twin, prune = (_load(d, n) for n in ("angular", "causal_update", "untrained_causal_update", "pruning"))
    out: dict[str, Any] = {
        "name": d.name,
        "family": run.get("family"),
        "n_layer": L,
        "design": prov.get("residual_design_name"),
        "block_order": prov.get("block_order"),
        # the GGUF file type from the header (general.file_type); a run recorded before depthlens read it kept
        # the most common tensor type, labelled so
        "quantization": prov.get("gguf_quantization")
        if prov.get("gguf_quantization_source") == "general.file_type" or not prov.get("gguf_quantization")
        else f"{prov.get('gguf_quantization')} (most common tensor type; file type not recorded in this run)",
        "eval": {"n_seq": run.get("n_seq"), "seq_len": run.get("seq_len"), "seed": run.get("seed")},
        "costs": run.get("costs", {}),
        "missing_stages": [n for n in STAGES if not (d / "data" / f"{n}.nc").exists()],  # not loaded to check
    }
    if ang is not None:
        out["angular_d1"] = [float(x) for x in ang["profile"].values[:L]]
    lens = lens_summary(d)  # the logit and tuned lens (scripts/lens_atlas.py), trained and twin
    if lens:
        out["lens"] = lens
    # one clean loss, on the positions the pruning curves use (0..T-2; the causal stage's skips 1..T-2)
    if prune is not None:
        out["clean_loss"] = float(prune["loss_clean"])
    if cau is not None:
        rows = []
        # norm=update beside its twin; norm=resid (the causal_resid stage) for the trained model only
        for norm, ds, tw in (("update", cau, twin), ("resid", _load(d, "causal_resid"), None)):
            for variant, agg in DEFINITIONS if ds is not None else ():
                if variant not in ds["variant"].values:
                    continue
                kw = dict(aggregator=agg, variant=variant, n_boot=N_BOOT, seed=0)
                row = {
                    "norm": norm,
                    "variant": variant,
                    "aggregator": agg,
                    "trained": _interval(headline(ds, "causal", C_THETA, **kw)),
                }
                if tw is not None and variant in tw["variant"].values:
                    row["untrained"] = _interval(headline(tw, "causal", C_THETA, **kw))
                    if (variant, agg) == ("current", "max"):  # the headline definition, paired over the same sequences
                        diff = paired_share_difference(ds, tw, "causal", C_THETA, n_boot=N_BOOT, seed=0)
                        row["trained_minus_untrained"] = _difference(diff)
                rows.append(row)
        out["causal_definitions"] = rows
    perm, twin_perm = _load(d, "permutation"), _load(d, "untrained_permutation")
    if perm is not None:
        from depthlens.diagnostics.pruning import permutation_importance

        rows = []
        for metric in PERM_NORMS:
            kw = dict(n_boot=N_BOOT, seed=0)
            h = headline(perm, metric, **kw)
            row = {"metric": metric, "threshold": h["threshold"], "trained": _interval(h)}
            row["median_late"] = _late_median(perm, metric)  # what a pair's swap costs, beside the share above θ
            if twin_perm is not None:
                row["untrained"] = _interval(headline(twin_perm, metric, **kw))
                row["median_late_untrained"] = _late_median(twin_perm, metric)
                row["trained_minus_untrained"] = _difference(paired_share_difference(perm, twin_perm, metric, **kw))
            rows.append(row)
        out["permutation_definitions"] = rows
        out["permutation_pairs"] = len(json.loads(perm.attrs["pairs_json"]))
        out["permutation_max_abs"] = float(np.nanmax(perm["perm_abs"].values))
        out["permutation_importance"] = _finite(permutation_importance(perm))
        if twin_perm is not None:
            out["permutation_importance_untrained"] = _finite(permutation_importance(twin_perm))
    out["shuffled_control"] = _shuffled_control(d, cau, twin, perm, twin_perm)
    if prune is not None:
        loss = prune["loss"]
        clean = float(prune["loss_clean"])
        crit = [str(c) for c in prune["criterion"].values]
        ks = prune["k"].values[1:]
        mean_excess = {c: float((loss.sel(criterion=c).values[1:] - clean).mean()) for c in crit}
        det = [c for c in crit if c != "random"]
        best = [str(b) for b in prune["best_criterion"].values[1:]]
        out["pruning"] = {
            "clean_loss": clean,
            "k": [int(k) for k in ks],
            "loss": {c: [float(x) for x in loss.sel(criterion=c).values[1:]] for c in crit},
            "random_min": [float(x) for x in prune["loss_random_min"].values[1:]],
            "random_max": [float(x) for x in prune["loss_random_max"].values[1:]],
            "n_random": int(prune.attrs.get("n_random", 0)),
            "mean_excess_loss": mean_excess,  # mean over k = 1..L/2 of loss(k) − clean loss, nats/token
            "wins": {c: best.count(c) for c in det},  # k values at which the criterion's cut is the least harmful
            "winner": min(det, key=lambda c: mean_excess[c]) if det else None,
            "removed": {
                c: [np.flatnonzero(prune["removed"].sel(criterion=c, k=int(k)).values).tolist() for k in ks]
                for c in det
            },
        }
    held, rnd = _load(d, "pruning_heldout"), _load(d, "pruning_random")
    if held is not None:
        from depthlens.diagnostics.pruning_heldout import prediction_error, summarize

        summ = summarize(held, rnd, n_boot=N_BOOT_HELDOUT, seed=0)
        pred = prediction_error(held)
        summ["prediction"] = {k: v for k, v in pred.items() if k != "cuts"}
        summ["n_random"] = int(rnd.attrs.get("n_random", 0)) if rnd is not None else 0
        summ["random_k_max"] = int(rnd.attrs.get("k_max", 0)) if rnd is not None else 0
        out["pruning_heldout"] = summ
    return out


def _finish(path: Path, ax: Any, **labels: str) -> str:
    """Label one single-axes figure, add its legend, save it (atomically) and return its file name."""
    from depthlens.plotting.plots import save_figure

    ax.set(**labels)
    ax.legend(fontsize=6)
    return save_figure(ax.figure, path).name


def figures(atlas: Path, dirs: list[Path], summaries: list[dict[str, Any]]) -> dict[str, str]:
    """Angular distance by layer / L, causal share against θ (trained and twin), pruning curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    from depthlens.diagnostics.sweep import share_curves
    from depthlens.plotting.plots import save_figure

    sns.set_theme(style="whitegrid", context="paper")
    colors = dict(zip([s["name"] for s in summaries], sns.color_palette("colorblind", len(summaries))))
    fig_dir = atlas / "figures"
    fig_dir.mkdir(exist_ok=True)
    out = {}

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for s in summaries:
        if "angular_d1" in s:
            L = s["n_layer"]
            ax.plot(
                (np.arange(L) + 0.5) / L,
                s["angular_d1"],
                marker="o",
                ms=3,
                label=f"{s['name']} (L = {L})",
                color=colors[s["name"]],
            )
    out["angular"] = _finish(
        fig_dir / "angular_by_depth.png",
        ax,
        xlabel="layer / L (layer l at (l + ½) / L)",
        ylabel="angular distance d(h_l, h_{l+1}) / π",
        title="Angular distance between consecutive residual states",
    )

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for d, s in zip(dirs, summaries):
        for name, ls in (("causal_update", "-"), ("untrained_causal_update", "--")):
            ds = _load(d, name)
            if ds is None:
                continue
            sc = share_curves(ds, "causal", starts=("quarter",), aggregator="max", variant="current")
            sh = sc["share"].sel(window_start="quarter")
            lab = f"{s['name']}" + (" (untrained twin)" if name.startswith("untrained") else "")
            ax.plot(sc["threshold"].values, np.asarray(sh.values).ravel(), ls=ls, color=colors[s["name"]], label=lab)
    ax.axvline(C_THETA, color="grey", lw=0.8)
    out["causal_share"] = _finish(
        fig_dir / "causal_share_curves.png",
        ax,
        xlabel="threshold θ on C(s, t) (current variant, max aggregator)",
        ylabel="share of late pairs with C > θ",
        title="Causal share against its threshold (late window ⌊L/4⌋…L−1)",
    )

    permuted = [(d, s) for d, s in zip(dirs, summaries) if "permutation_definitions" in s]
    if permuted:
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.4, 3.6))
        top = max(s["permutation_max_abs"] for _, s in permuted)  # the grid reaches every model's largest swap
        grid = np.linspace(0.0, max(top, 0.3), 201)
        for d, s in permuted:
            for name, ls in (("permutation", "-"), ("untrained_permutation", "--")):
                ds = _load(d, name)
                if ds is None:
                    continue
                sc = share_curves(ds, "perm_abs", grid, starts=("quarter",))
                lab = f"{s['name']}" + (" (untrained twin)" if name.startswith("untrained") else "")
                ax.plot(
                    sc["threshold"].values,
                    np.asarray(sc["share"].sel(window_start="quarter").values).ravel(),
                    ls=ls,
                    color=colors[s["name"]],
                    label=lab,
                )
            L = s["n_layer"]
            for key, ls in (("permutation_importance", "-"), ("permutation_importance_untrained", "--")):
                if key in s:
                    y = np.array([np.nan if v is None else v for v in s[key]])
                    bx.plot((np.arange(L) + 0.5) / L, y, ls=ls, marker="o", ms=2.5, color=colors[s["name"]])
        ax.axvline(registry_theta("perm_abs"), color="grey", lw=0.8)
        ax.set(
            xlabel="threshold θ on P_abs(i, j) (nats)",
            ylabel="share of late pairs with P > θ",
            title="Permutation share against θ (late window)",
        )
        ax.legend(fontsize=6)
        bx.set(
            xlabel="layer / L",
            ylabel="mean loss rise of its late swaps (nats)",
            title="Permutation importance (dashed: untrained twin)",
        )
        bx.set_yscale("symlog", linthresh=1e-3)  # a twin's swaps cost ~0 (or lower the loss a little)
        out["permutation"] = save_figure(fig, fig_dir / "permutation.png").name

    pruned = [s for s in summaries if "pruning" in s]
    if pruned:
        fig, axes = plt.subplots(1, len(pruned), figsize=(4.2 * len(pruned), 3.6), squeeze=False, sharey=False)
        pal = dict(zip(CRITERIA_LABELS, sns.color_palette("deep", len(CRITERIA_LABELS))))
        for ax, s in zip(axes[0], pruned):
            p, L = s["pruning"], s["n_layer"]
            x = np.array(p["k"]) / L
            for c, ys in p["loss"].items():
                ax.plot(x, ys, marker="o", ms=2.5, label=c, color=pal.get(c), ls=":" if c == "random" else "-")
            ax.fill_between(x, p["random_min"], p["random_max"], color=pal["random"], alpha=0.15, lw=0)
            ax.axhline(p["clean_loss"], color="black", lw=0.8)
            ax.set(xlabel="removed layers k / L", ylabel="LM loss (nats/token)", title=f"{s['name']} (L = {L})")
        axes[0][0].legend(fontsize=6)
        out["pruning"] = save_figure(fig, fig_dir / "pruning_curves.png").name
    held = _heldout_figure(fig_dir, summaries)
    if held is not None:
        out["pruning_heldout"] = held
    lens = _lens_figure(fig_dir, dirs, summaries)
    if lens is not None:
        out["lens"] = lens
    return out


HELDOUT_LABELS = {
    **{k: v for k, v in CRITERIA_LABELS.items() if k != "random"},
    "greedy": "greedy, one layer at a time, the least harmful given those removed (SLEB-style)",
    "predicted": "the set of smallest predicted Δloss (single-layer Δ plus measured pair interactions)",
}


def _distinguishable(rows: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """The k at which every other criterion's paired interval against the best lies above 0 (the best is
    distinguishable), and the k at which some other criterion's interval reaches 0 (tied cuts count as tied)."""
    yes, no = [], []
    for r in rows:
        if not r.get("best"):
            continue
        others = [iv for c, iv in r["vs_best"].items() if c not in r["tied"]]
        clear = len(r["tied"]) == 1 and all(iv["low"] is not None and iv["low"] > 0 for iv in others)
        (yes if clear else no).append(r["k"])
    return yes, no


def _heldout_section(summaries: list[dict[str, Any]], figs: dict[str, str]) -> list[str]:
    """Held-out pruning: per model and domain, each criterion's loss with its paired interval against the best."""
    have = [s for s in summaries if s.get("pruning_heldout")]
    lines = ["## Layer pruning, held out: which criterion finds the least harmful cut?", ""]
    if not have:
        return lines + ["Not computed for any model yet (`--stages pruning_heldout,pruning_random`).", ""]
    h0 = have[0]["pruning_heldout"]
    lines += [
        "Every criterion chooses its layers on one fold of the eval windows (its calibration split) and is scored "
        "on the other (held out); the folds alternate within each domain (prose, code) and take each role once "
        "(2-fold cross-fitting), so every window has one held-out loss per criterion and k, from a cut chosen "
        "without it (`diagnostics/pruning_heldout.py`). No criterion removes the first or the last layer; the "
        "stratified random baseline draws from the same layers, the uniform one from all of them. Loss: mean "
        "next-token NLL over positions 0..T−2 (nats/token) on the scope's windows. Cells: held-out loss, then "
        "its difference to the best criterion at that k with a 95 % interval "
        f"({h0['interval_method']}); **bold**: the best, and every criterion whose cut is the same layers in both "
        "folds (a tie, counted as a win for each); † past ln V (the loss of a uniform guess over the vocabulary).",
        "",
    ]
    if "pruning_heldout" in figs:
        lines += [f"![held-out pruning curves](figures/{figs['pruning_heldout']})", ""]
    for s in have:
        h = s["pruning_heldout"]
        crits = h["criteria"]
        ks = h["k"]
        lines += [
            f"### {s['name']} (L = {s['n_layer']}, k = 1 … {ks[-1]}; windows per scope: "
            + ", ".join(f"{sc} {n}" for sc, n in h["n_sequences"].items())
            + (
                f"; {h['n_random']} random draws per k and baseline)"
                if h["n_random"]
                else "; no random draws yet: `--stages pruning_random`)"
            ),
            "",
            "| scope | k | " + " | ".join(crits) + " | random uniform (min–max) | random stratified (min–max) |",
            "|---|---|" + "---|" * (len(crits) + 2),
        ]
        for scope, summ in h["scopes"].items():
            for r in summ["rows"]:
                cells = []
                for c in crits:
                    v = summ["loss"][c][r["k"] - 1]
                    if v != v:
                        cells.append("—")
                        continue
                    mark = "†" if c in r["past_ln_v"] else ""
                    if c in r["tied"]:
                        cells.append(f"**{v:.3f}**{mark}")
                    else:
                        iv = r["vs_best"][c]
                        cells.append(f"{v:.3f}{mark} ({_signed_iv(iv)})")
                for bl in ("random_uniform", "random_stratified"):
                    rr = (r.get("random") or {}).get(bl)
                    if rr is None:
                        cells.append("—")
                        continue
                    mark = "†" if h.get("ln_vocab") and rr["mean"] > h["ln_vocab"] else ""
                    cells.append(
                        f"{rr['mean']:.3f}{mark} ({_signed_iv(rr['vs_best'])}; {rr['min']:.2f}–{rr['max']:.2f})"
                    )
                lines.append(f"| {scope} | {r['k']} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| scope | clean loss | mean excess loss over k ≤ L/4 computed (wins at those k, ties included) | "
            "lowest | first k past ln V | lowest mean excess over every k before it | the best cut distinguishable "
            "(every other interval above 0) at k | not at k |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for scope, summ in h["scopes"].items():
            yes, no = _distinguishable(summ["rows"])
            ex = ", ".join(
                f"{c} {v:.3f} ({summ['wins_quarter'][c]})"
                for c, v in summ["mean_excess_quarter"].items()
                if v is not None
            )
            lines.append(
                f"| {scope} | {summ['clean_loss']:.3f} | {ex} | **{summ['winner_quarter']}** | "
                f"{summ['first_k_past_ln_v'] or 'none'} | {summ['winner_before_ln_v']} | "
                f"{', '.join(map(str, yes)) or 'none'} | "
                f"{', '.join(map(str, no)) or 'none'} |"
            )
        pr = h.get("prediction", {})
        q = pr.get("quarter", {})
        if q.get("pairwise") and not pr.get("n_pairs_measured"):  # no pairs: only the additive model exists
            lines += [
                "",
                f"Predicting a cut's held-out Δloss before running it, additively (Σ of the calibration fold's "
                f"single-layer Δloss; no pair was measured, as the `predicted` criterion was not run): over the "
                f"{q['n']} distinct cuts of k ≤ L/4, mean absolute error {q['additive']['mae']:.3f} nats (median "
                f"{q['additive']['median_ae']:.3f}, Spearman ρ {q['additive']['spearman']:.2f}).",
            ]
        elif q.get("pairwise"):
            lines += [
                "",
                f"Predicting a cut's held-out Δloss before running it ({pr['definition']}): over the "
                f"{q['n']} distinct cuts of k ≤ L/4, mean absolute error {q['pairwise']['mae']:.3f} nats "
                f"(median {q['pairwise']['median_ae']:.3f}, Spearman ρ {q['pairwise']['spearman']:.2f}); "
                f"additive only {q['additive']['mae']:.3f} (ρ {q['additive']['spearman']:.2f}). The `predicted` "
                "criterion searches sets on this prediction (greedy, then one-layer swaps) without a forward pass.",
            ]
        lines.append("")
    lines += ["Criteria: " + "; ".join(f"`{k}`: {v}" for k, v in HELDOUT_LABELS.items()) + ".", ""]
    return lines


def _signed_iv(iv: dict[str, Any]) -> str:
    if iv.get("low") is None:
        return f"{iv['estimate']:+.3f}"
    return f"{iv['estimate']:+.3f} [{iv['low']:+.3f}, {iv['high']:+.3f}]"


def _heldout_figure(fig_dir: Path, summaries: list[dict[str, Any]]) -> str | None:
    """One panel per model and scope: held-out loss against k, each criterion, random means with their range."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from depthlens.plotting.plots import save_figure

    have = [s for s in summaries if s.get("pruning_heldout")]
    if not have:
        return None
    n = max(len(s["pruning_heldout"]["scopes"]) for s in have)
    fig, axes = plt.subplots(len(have), n, figsize=(4.0 * n, 3.3 * len(have)), squeeze=False)
    names = list(HELDOUT_LABELS) + ["random_uniform", "random_stratified"]
    pal = dict(zip(names, sns.color_palette("deep", len(names))))
    for row, s in zip(axes, have):
        h = s["pruning_heldout"]
        for ax, (scope, summ) in zip(row, h["scopes"].items()):
            ks = h["k"]
            for c, ys in summ["loss"].items():
                ax.plot(ks, ys, marker="o", ms=3, label=c, color=pal.get(c))
            for bl, ls in (("random_uniform", ":"), ("random_stratified", "--")):
                rows = [r for r in summ["rows"] if r.get("random")]
                if rows:
                    kk = [r["k"] for r in rows]
                    ax.plot(kk, [r["random"][bl]["mean"] for r in rows], ls=ls, color=pal[bl], label=bl)
                    ax.fill_between(
                        kk,
                        [r["random"][bl]["min"] for r in rows],
                        [r["random"][bl]["max"] for r in rows],
                        color=pal[bl],
                        alpha=0.12,
                        lw=0,
                    )
            ax.axhline(summ["clean_loss"], color="black", lw=0.8)
            if h.get("ln_vocab"):
                ax.axhline(h["ln_vocab"], color="grey", lw=0.8, ls="--")
            ax.set(xlabel="removed layers k", ylabel="held-out loss (nats/token)", title=f"{s['name']}: {scope}")
    axes[0][0].legend(fontsize=6)
    return save_figure(fig, fig_dir / "pruning_heldout.png").name


def registry_theta(metric: str) -> float:
    """The documented headline threshold of a score (docs/calibration.md)."""
    from depthlens.diagnostics import registry

    return float(registry.score(metric).theta)


def _cell(x: Any) -> str:
    """A Markdown table cell: code-formatted, with the table's own separator escaped."""
    return "—" if x is None else "`" + str(x).replace("|", "\\|") + "`"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _iv(h: dict[str, Any] | None) -> str:
    if not h or h.get("share") is None:
        return "—"
    return f"{_pct(h['share'])} [{_pct(h['ci_low'])}, {_pct(h['ci_high'])}]"


def _cli_headline(r: dict[str, Any]) -> str:
    j = r.get("json")
    if r["exit"]:
        return f"failed: {r.get('stderr_last') or '?'}"
    if not isinstance(j, dict):
        return "—"
    if r["command"] == "info":
        return str(j.get("design_name", "—"))
    if r["command"] == "angular":
        prof = j.get("profile") or []
        return f"{len(prof)} layers; mean profile {sum(prof) / len(prof):.3f}" if prof else "—"
    if "share" in j:
        return f"{j['metric']} share at θ = {j['threshold']}: {_iv(j)}"
    return "—"


def _cli_section(cli: dict[str, Any] | None) -> list[str]:
    """The commands a user types, on each GGUF file by path (scripts/real-model-cli.sh -> cli.json)."""
    if not cli:
        return []
    lines = [
        "",
        "## From the command line, by path",
        "",
        "`bash scripts/real-model-cli.sh` runs `depthlens info | angular | causal | permute <model>.gguf` with the "
        "default eval data (the offline corpus through the model's own tokenizer) at a small size, to show every "
        "command runs on every family; the numbers of this page are from the atlas's own stages at its eval size.",
        "",
        "| model | command | eval (seqs × tokens) | exit | wall (s) | what it printed (`--json`) |",
        "|---|---|---|---|---|---|",
    ]
    for r in cli["runs"]:
        lines.append(
            f"| {r['model']} | `{r['command']}` | {r.get('eval', '—')} | {r['exit']} | {r['wall_s']} | "
            f"{_cli_headline(r).replace('|', chr(92) + '|')} |"
        )
    return lines


def _prune_section(prune: dict[str, Any] | None) -> list[str]:
    """`depthlens prune` on each GGUF file by path and on a depthlens checkpoint, each pruned model reloaded by its
    own loader and its held-out loss recomputed outside depthlens' model code (scripts/real-model-prune.sh ->
    prune.json)."""
    if not prune:
        return []
    lines = [
        "",
        "## `depthlens prune` on the three models",
        "",
        "`bash scripts/real-model-prune.sh` runs `depthlens prune <model> --tolerance T --k-max K --json` (default "
        "criterion and eval data) on each GGUF file by path and on a depthlens checkpoint. The GGUF models are "
        "written as Hugging Face directories; a separate Python process loads each with plain "
        "`transformers.AutoModelForCausalLM.from_pretrained` (a depthlens checkpoint with `depthlens.load`), reads "
        "the certificate's eval windows again (SHA-256 checked) and recomputes each domain's held-out loss on the "
        "certificate's positions (column recomputed − certified). Δloss and its bound are the certificate's "
        "(held-out, paired, one-sided 95 % t bound; nats/token); k is the largest within the tolerance in every "
        "domain, or --k-max where it says so (the scan stopped there).",
        "",
        "| model | eval (seqs × tokens) | tolerance | criterion | removed (k of L) | domain (held-out seqs) | Δloss | "
        "bound | certified loss | recomputed − certified | exit | wall / CPU (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(prune["runs"], key=lambda r: not str(r["path"]).endswith(".gguf")):  # the GGUF files first
        cost = f"{r['wall_s']:.0f} / {r['cpu_s']:.0f}"
        if r["exit"]:
            lines.append(
                f"| {r['model']} | {r['eval']} | {r['tolerance']} | — | — | — | — | — | — | — | {r['exit']} "
                f"({(r.get('stderr_last') or '?').replace('|', chr(92) + '|')}) | {cost} |"
            )
            continue
        cap = ", = --k-max" if r["k"] == r.get("k_max") else ""
        removed = f"{r['layers_removed']} ({r['k']} of {r['n_layer_before']}{cap})"
        for d, v in r["domains"].items():
            diff = v.get("pruned_loss_difference")
            lines.append(
                f"| {r['model']} | {r['eval']} | {r['tolerance']} | {r['criterion']} | {removed} | "
                f"{d} ({v['n_sequences']}) | {v['delta']:+.4f} | {v['upper_bound']:.4f} | {v['pruned_loss']:.4f} | "
                f"{'—' if diff is None else f'{diff:+.1e}'} | {r['exit']} | {cost} |"
            )
    loaded = sorted(
        {v for r in prune["runs"] for v in [r.get("check", {}).get("versions", {}).get("transformers")] if v}
    )
    if loaded:
        lines += ["", "Reloaded with transformers " + ", ".join(loaded) + "."]
    return lines


def _shuffled_control(d: Path, cau: Any, twin: Any, perm: Any, twin_perm: Any) -> dict[str, Any]:
    """The headline shares (causal: current, max; permutation: P_abs) of the trained model, the fresh-init twin and
    the shuffled twin (`adapters/twin.py`: the trained weights permuted within each matrix), with trained − shuffled
    paired over the same sequences; {} where the shuffled_* stages were not computed."""
    from depthlens.diagnostics.sweep import headline, paired_share_difference

    out: dict[str, Any] = {}
    for key, trained, fresh, stage, metric, kw in (
        ("causal", cau, twin, "shuffled_causal_update", "causal", dict(aggregator="max", variant="current")),
        ("perm_abs", perm, twin_perm, "shuffled_permutation", "perm_abs", {}),
    ):
        shuffled = _load(d, stage)
        if trained is None or shuffled is None:
            continue
        theta = C_THETA if metric == "causal" else None
        h = [None if m is None else headline(m, metric, theta, n_boot=N_BOOT, seed=0, **kw) for m in (trained, fresh)]
        out[key] = {
            "threshold": h[0]["threshold"] if h[0] else theta,
            "trained": _interval(h[0]),
            "untrained": _interval(h[1]),
            "shuffled": _interval(headline(shuffled, metric, theta, n_boot=N_BOOT, seed=0, **kw)),
            "trained_minus_shuffled": _difference(
                paired_share_difference(trained, shuffled, metric, theta, n_boot=N_BOOT, seed=0)
            ),
        }
    return out


def _shuffled_section(summaries: list[dict[str, Any]]) -> list[str]:
    """Trained, fresh-init twin and shuffled twin side by side: what training put in beyond the weights' scales."""
    lines = [
        "## The second control: the shuffled twin",
        "",
        "A freshly initialised twin differs from the trained model in two ways at once: its weights hold no learned "
        "structure, and their scales (norm gains, each matrix's spread, the embedding's size) are the init's. The "
        "shuffled twin keeps every scale and removes only the structure: each weight matrix of the trained model "
        "with its entries permuted at random (vectors such as norm gains and biases kept; seed 0; "
        "`adapters/twin.py`). A share that the shuffled twin also shows comes from the scales; trained − shuffled is "
        "paired over the same sequences (the headline definitions: causal C at θ = 0.45, current variant, max; "
        "P_abs at its documented θ).",
        "",
        "| model | score | θ | trained [95 %] | fresh-init twin [95 %] | shuffled twin [95 %] | "
        "trained − shuffled [95 %] |",
        "|---|---|---|---|---|---|---|",
    ]
    missing, verdicts = [], []
    for s in summaries:
        rows = s.get("shuffled_control") or {}
        if not rows:
            missing.append(s["name"])
        for key, r in rows.items():
            symbol = "C" if key == "causal" else "P_abs"
            lines.append(
                f"| {s['name']} | {symbol} | {r['threshold']} | {_iv(r['trained'])} | "
                f"{_iv(r.get('untrained'))} | {_iv(r['shuffled'])} | {_diff(r.get('trained_minus_shuffled'))} |"
            )
            d = r.get("trained_minus_shuffled")
            if d is not None:
                where = (
                    "not distinguishable from" if d["low"] <= 0 <= d["high"] else ("above" if d["low"] > 0 else "below")
                )
                verdicts.append(f"{s['name']}'s {symbol} share is {where} its shuffled twin's")
    if verdicts:
        lines += [
            "",
            "From the paired intervals: " + "; ".join(verdicts) + ". Where the trained share is not above the "
            "shuffled twin's, the weights' scales alone give it, so it is no evidence of what training learned.",
        ]
    if missing:
        lines += [
            "",
            "Not computed yet for " + ", ".join(missing) + " (`scripts/real_model_report.py MODEL --out "
            "reports/atlas/<model> --stages shuffled_causal_update,shuffled_permutation --resume`).",
        ]
    return [*lines, ""]


def _diff(d: dict[str, Any] | None) -> str:
    return "—" if d is None else f"{100 * d['estimate']:+.1f} pp [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def _permutation_section(summaries: list[dict[str, Any]], figs: dict[str, str]) -> list[str]:
    """Permutation shares under each norm, trained beside the twin, and the per-layer importance figure."""
    have = [s for s in summaries if s.get("permutation_definitions")]
    if not have:
        return []
    lines = [
        "## Permutation score, trained and untrained twin",
        "",
        "Swap two late layers i < j (both ≥ ⌊L/4⌋; "
        + ", ".join(f"{s['permutation_pairs']} pairs for {s['name']}" for s in have)
        + ") and measure the rise of the LM loss on the same tokens: P_abs in nats, P_rel = P_abs / clean loss, "
        "P_KL = mean KL(p_id ‖ p_swapped) (nats). Share of late pairs above the documented θ, with its interval (method below), "
        "resampling sequences; trained − twin is paired over the same sequences (the same resamples).",
        "",
        "| model | score | θ | trained [95 %] | untrained twin [95 %] | trained − twin [95 %] | "
        "median late pair, trained / twin |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in have:
        for r in s["permutation_definitions"]:
            med = [r.get(k) for k in ("median_late", "median_late_untrained")]
            lines.append(
                f"| {s['name']} | {r['metric']} | {r['threshold']} | {_iv(r['trained'])} | "
                f"{_iv(r.get('untrained'))} | {_diff(r.get('trained_minus_untrained'))} | "
                + " / ".join("—" if x is None else f"{x:.3g}" for x in med)
                + " |"
            )
    methods = sorted(
        {r["trained"]["ci_method"] for s in have for r in s["permutation_definitions"] if r["trained"].get("ci_method")}
    )
    lines += ["", "Interval methods: " + "; ".join(f"`{m}`" for m in methods) + ".", ""]
    if "permutation" in figs:
        lines += [
            f"![permutation share against θ, and permutation importance by layer / L](figures/{figs['permutation']})",
            "",
            "Right: each layer's permutation importance (the mean loss rise over its late swaps), the ranking the "
            "`permutation` pruning criterion removes layers by (least important first).",
            "",
        ]
    return lines


LENS_STAGES = ("logit_lens", "tuned_lens", "untrained_logit_lens", "untrained_tuned_lens")


def lens_summary(d: Path) -> dict[str, Any] | None:
    """The lens family of one model (its `*_lens.nc` stages): per stage, where the prediction forms with its
    interval, and KL to the final layer and top-1 agreement by relative depth; None when no stage is there."""
    out: dict[str, Any] = {}
    for stage in LENS_STAGES:
        ds = _load(d, stage)
        if ds is None:
            continue
        f = ds["forms_depth"]
        out[stage] = {
            "forms": {
                "estimate": float(f),
                "low": float(ds["forms_depth_low"]),
                "high": float(ds["forms_depth_high"]),
                "forms_at": float(f.attrs["forms_at"]),
                "ci_method": str(f.attrs["ci_method"]),
                "ci_unit": str(f.attrs["ci_unit"]),
            },
            "depth": [float(x) for x in ds["depth"].values],
            "kl": _finite(ds["lens_kl"].values),
            "top1_agree": _finite(ds["top1_agree"].values),
            "n_seq": int(ds.sizes["sequence"]),
            **{k: _attr(ds.attrs[k]) for k in ("train_split", "train_steps", "train_tokens_per_step") if k in ds.attrs},
        }
    if not out:
        return None
    run = d / "data" / "lens_run.json"
    if run.exists():
        doc = json.loads(run.read_text())
        out["costs"] = doc.get("stages", {})
        if doc.get("options"):
            out["options"] = doc["options"]  # the eval size and the training budget the stages ran at
    return out


def _attr(v: Any) -> Any:
    """A netCDF attribute as JSON (numpy scalars to Python)."""
    return v.item() if hasattr(v, "item") else v


def _lens_figure(fig_dir: Path, dirs: list[Path], summaries: list[dict[str, Any]]) -> str | None:
    """KL to the final layer and top-1 agreement by relative depth: each model's logit and tuned lens, trained
    (solid) and untrained twin (dashed), with their 95 % bands over sequences."""
    import matplotlib.pyplot as plt

    from depthlens.diagnostics.lens.figure import draw_lens
    from depthlens.plotting.plots import save_figure

    have = [(d, s) for d, s in zip(dirs, summaries) if s.get("lens")]
    if not have:
        return None
    fig, axes = plt.subplots(len(have), 4, figsize=(16, 3.4 * len(have)), squeeze=False)
    for row, (d, s) in zip(axes, have):
        for j, kind in enumerate(("logit", "tuned")):
            pair = (row[2 * j], row[2 * j + 1])
            for stage, label, dashed in ((f"{kind}_lens", "trained", False), (f"untrained_{kind}_lens", "twin", True)):
                ds = _load(d, stage)
                if ds is not None:
                    draw_lens(pair, ds, label, color="C7" if dashed else "C0", dashed=dashed)
            pair[0].set(xlabel="layer / L", ylabel="KL(p_final ‖ q_l) (nats)", title=f"{s['name']}: {kind} lens")
            pair[0].set_yscale("symlog", linthresh=1e-2)
            pair[1].set(xlabel="layer / L", ylabel="top-1 agreement with the final layer", ylim=(0, 1.02))
            pair[1].axhline(0.5, color="black", lw=0.6, ls=":")
            if pair[0].get_legend_handles_labels()[0]:  # a lens not computed yet leaves its panels empty
                pair[0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, fig_dir / "lens.png").name


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _forms(iv: dict[str, Any] | None) -> str:
    if iv is None:
        return "—"
    if iv["estimate"] != iv["estimate"]:
        return f"never > {iv['forms_at']:g}"
    ci = f" [{iv['low']:.2f}, {iv['high']:.2f}]" if iv["low"] == iv["low"] else ""
    return f"{iv['estimate']:.2f}{ci}"


def _lens_sizes(have: list[dict[str, Any]]) -> str:
    """The lens stages' eval size, "8 windows × 128 tokens" (per model where they differ)."""
    sizes = {}
    for s in have:
        o = s["lens"].get("options", {})
        sizes[s["name"]] = f"{o['n_seq']} windows × {o['seq_len']} tokens" if "n_seq" in o else "size not recorded"
    if len(set(sizes.values())) == 1:
        return next(iter(sizes.values()))
    return "; ".join(f"{n}: {v}" for n, v in sizes.items())


def _lens_section(summaries: list[dict[str, Any]], figs: dict[str, str]) -> list[str]:
    """Where each model's prediction forms by relative depth (logit and tuned lens), trained beside the twin."""
    have = [s for s in summaries if s.get("lens")]
    if not have:
        return []
    lines = [
        "## Where the prediction forms: the logit lens and the tuned lens",
        "",
        "At every layer boundary l the residual after l layers is read out through the model's own final norm and "
        "unembedding (logit lens), or first through a trained per-layer affine translator (tuned lens, Belrose et "
        "al. 2023; docs/concepts.md#the-lens-family). *Forms at* is the first relative depth l / L at which the "
        "readout's top-1 prediction agrees with the final layer's on more than half of the positions (`forms_at` "
        "0.5), with its interval from a bootstrap over the eval sequences; the untrained twin is the same config "
        "freshly initialised (seed 0). Computed by `scripts/lens_atlas.py` on the offline corpus's held-out "
        f"split ({_lens_sizes(have)}, seed 0); the tuned lens's translators trained on its `train` split.",
        "",
        "| model | lens | forms at, trained [95 %] | untrained twin [95 %] | mean KL over l < L, trained / twin (nats) "
        "| translators trained on | CPU s (trained + twin) |",
        "|---|---|---|---|---|---|---|",
    ]
    methods = set()
    for s in have:
        lens = s["lens"]
        for kind in ("logit", "tuned"):
            tr, tw = lens.get(f"{kind}_lens"), lens.get(f"untrained_{kind}_lens")
            if tr is None:
                continue
            methods.add(f"{tr['forms']['ci_method']} (resampling {tr['forms']['ci_unit']})")
            kl = ["—" if x is None else f"{_mean([v for v in x['kl'][:-1] if v is not None]):.3g}" for x in (tr, tw)]
            train = (
                f"{tr.get('train_split', '—')}, {tr.get('train_steps')} steps × {tr.get('train_tokens_per_step')} "
                "positions"
                if kind == "tuned"
                else "—"
            )
            costs = lens.get("costs", {})
            cpu = [costs.get(st, {}).get("cpu_s") for st in (f"{kind}_lens", f"untrained_{kind}_lens")]
            lines.append(
                f"| {s['name']} | {kind} | {_forms(tr['forms'])} | {_forms(tw['forms'] if tw else None)} | "
                f"{kl[0]} / {kl[1]} | {train} | " + " + ".join("—" if c is None else f"{c:.0f}" for c in cpu) + " |"
            )
    lines += ["", "Interval method: " + "; ".join(sorted(methods)) + ".", ""]
    missing = [
        f"{s['name']}: {', '.join(st for st in LENS_STAGES if st not in s['lens'])}"
        for s in have
        if not set(LENS_STAGES) <= set(s["lens"])
    ]
    if missing:  # a stage not run is said, not left as a dash to be guessed at
        lines += [
            "Not computed (yet): " + "; ".join(missing) + " (`scripts/lens_atlas.py <model>` runs what is missing).",
            "",
        ]
    if "lens" in figs:
        lines += [
            f"![KL to the final layer and top-1 agreement by layer / L](figures/{figs['lens']})",
            "",
            "Solid: trained; dashed: the untrained twin; bands: 95 % intervals over sequences. A twin's output is "
            "near uniform, so its KL to the final layer is small at every depth while its top-1 agreement stays "
            "low: the two curves together, not KL alone, say where a prediction forms.",
            "",
        ]
    return lines


def readme(
    summaries: list[dict[str, Any]],
    figs: dict[str, str],
    exactness: dict[str, Any] | None = None,
    absent: list[str] | None = None,
    cli: dict[str, Any] | None = None,
    prune: dict[str, Any] | None = None,
) -> str:
    ev = summaries[0]["eval"] if summaries else {}
    lines = [
        "# Real-model atlas: how three pretrained families use their depth, and what pruning it costs",
        "",
        "Generated by `bash scripts/real-model-atlas.sh` (opt-in: it downloads the models as data; "
        "`scripts/fetch-real-models.sh`) from the stage datasets under `<model>/data/`; every number here is in "
        "`atlas.json`, and each model's own page is `<model>/README.md`.",
        "",
        f"Eval data: the held-out split of the offline corpus (the same documents for every model, each read "
        f"through its own tokenizer), {ev.get('n_seq')} windows × {ev.get('seq_len')} tokens drawn with seed "
        f"{ev.get('seed')} from each model's token stream (so the windows cover the same documents, not "
        "character for character the same spans). Weights: the GGUF files dequantised to fp32 on the CPU.",
        "",
        "## The models",
        "",
        "| model | family | layers | residual design (read from the block structure) | block | weights (GGUF "
        "file type) | clean loss (nats/token, positions 0..T−2, the pruning curves') |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        cl = s.get("clean_loss")
        lines.append(
            f"| {s['name']} | {s['family']} | {s['n_layer']} | {s['design']} | {_cell(s['block_order'])} | "
            f"{s.get('quantization') or '—'} | {'—' if cl is None else f'{cl:.3f}'} |"
        )
    ex = exactness or {}
    if ex:
        lines += [
            "",
            "Exact against Hugging Face on the real weights (`tests/test_real_models_exact.py`, run by the atlas "
            "script; 2 × 12 random tokens, fp32): the largest |logit difference| of depthlens' layered forward and "
            "of a one-layer skip against the HF forward with a hook that passes the layer's input through.",
            "",
            "| model | forward | layer skip | largest |logit| |",
            "|---|---|---|---|",
        ]
        for s in summaries:
            e = ex.get(s["name"], {})
            cells = [e.get(k) for k in ("max_abs_logit_diff", "max_abs_logit_diff_skip", "max_abs_logit")]
            lines.append(f"| {s['name']} | " + " | ".join("—" if c is None else f"{c:.2e}" for c in cells) + " |")
    lines += _cli_section(cli)
    lines += _prune_section(prune)
    lines += [
        "",
        "## Causal share, trained and untrained twin, under every definition",
        "",
        f"Share of late pairs (s < t, both ≥ ⌊L/4⌋) with C(s, t) > {C_THETA}, per norm, variant and aggregator "
        "(docs/calibration.md): norm = update divides the change of a later update by its own size, norm = resid by "
        "the residual stream's (measured on the trained model only). Max: the size-fixed share at m = ⌈N/2⌉ "
        "sequences with its jackknife t interval (an extreme-value statistic has no valid bootstrap at all N); "
        "mean: the share at all N with a bootstrap interval. The untrained twin is the same config freshly "
        "initialised by its family's own init (seed 0, `adapters/twin.py`), on the same eval tokens; trained − twin "
        "is paired over the same sequences.",
        "",
        "| model | norm | variant | aggregator | trained [95 %] | untrained twin [95 %] | trained − twin [95 %] |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        for r in s.get("causal_definitions", []):
            lines.append(
                f"| {s['name']} | {r.get('norm', 'update')} | {r['variant']} | {r['aggregator']} | "
                f"{_iv(r['trained'])} | {_iv(r.get('untrained'))} | {_diff(r.get('trained_minus_untrained'))} |"
            )
    methods = sorted(
        {
            r["trained"]["ci_method"]
            for s in summaries
            for r in s.get("causal_definitions", [])
            if r.get("trained") and r["trained"].get("ci_method")
        }
    )
    lines += ["", "Interval methods: " + "; ".join(f"`{m}`" for m in methods) + ".", ""]
    lines += _permutation_section(summaries, figs)
    lines += _shuffled_section(summaries)
    lines += _lens_section(summaries, figs)
    lines += [
        "## Angular distance by depth",
        "",
        f"![angular distance by layer / L](figures/{figs['angular']})" if "angular" in figs else "(not computed)",
        "",
        f"![causal share against θ](figures/{figs['causal_share']})" if "causal_share" in figs else "",
        "",
    ]
    lines += _heldout_section(summaries, figs)
    lines += [
        "## Layer pruning in sample (superseded where the held-out curves above exist)",
        "",
        "The first pruning stage: remove k = 1 … L/2 layers (block-level skip: the layer's write dropped) chosen by "
        "each criterion ranked on the same eval windows that score the cut (`diagnostics/pruning.py`), so "
        "`skip_loss` is optimal at k = 1 by construction; ties are credited to the first-listed criterion; the random "
        "baseline is 3 draws per k over all layers (most of them include layer 0), and the means include points "
        "past ln V. Kept as computed; read the held-out section for which criterion cuts best. Mean excess loss = "
        "mean over k of loss(k) − clean loss (nats/token); wins = the k at which the criterion's cut had the lowest "
        "loss. Random: mean of the draws, the band spans their min and max.",
        "",
    ]
    if "pruning" in figs:
        lines += [f"![pruning curves](figures/{figs['pruning']})", ""]
    crits = list(CRITERIA_LABELS)
    lines += [
        "| model | " + " | ".join(crits) + " | least harmful (mean excess) |",
        "|---|" + "---|" * (len(crits) + 1),
    ]
    for s in summaries:
        p = s.get("pruning")
        if not p:
            lines.append(f"| {s['name']} | " + " | ".join("—" for _ in crits) + " | not computed |")
            continue
        cells = []
        for c in crits:
            if c not in p["mean_excess_loss"]:
                cells.append("—")
                continue
            w = p["wins"].get(c)
            cells.append(f"{p['mean_excess_loss'][c]:.3f}" + ("" if w is None else f" ({w} wins)"))
        lines.append(f"| {s['name']} | " + " | ".join(cells) + f" | **{p['winner']}** |")
    lines += ["", "Criteria: " + "; ".join(f"`{k}`: {v}" for k, v in CRITERIA_LABELS.items()) + ".", ""]
    lines += [
        "## Cost",
        "",
        "Per stage: wall and CPU seconds (one thread) and the process's peak resident memory after the stage "
        "(it never falls, so a stage's own peak is at most this). Wall time also counts any time the process "
        "shared its core or was paused (this run was paused while the main job and the test suite were timed): "
        "the CPU column is the cost.",
        "",
        "| model | stage | wall (s) | CPU (s) | peak RSS (MiB) |",
        "|---|---|---|---|---|",
    ]
    for s in summaries:
        for stage, c in s.get("costs", {}).items():
            cells = ["—" if c.get(k) is None else str(c[k]) for k in ("wall_s", "cpu_s", "peak_rss_mib")]
            lines.append(f"| {s['name']} | {stage} | " + " | ".join(cells) + " |")
    notes = [f"{s['name']}: {c['note']}" for s in summaries for c in s.get("costs", {}).values() if c.get("note")]
    if notes:
        lines += ["", "Notes: " + "; ".join(dict.fromkeys(notes)) + "."]
    missing = [f"{s['name']}: {', '.join(s['missing_stages'])}" for s in summaries if s["missing_stages"]]
    gaps = []
    if missing:
        gaps.append("* Stages missing from this run: " + "; ".join(missing) + ".")
    if absent:
        gaps.append(
            "* Models with no stage data yet (their exactness check above ran; `MODELS=<name> bash "
            "scripts/real-model-atlas.sh` computes them): " + ", ".join(f"`{n}`" for n in absent) + "."
        )
    if gaps:  # what is not here is said, never left to be noticed
        lines += ["", "## Not in this atlas", "", *gaps]
    return "\n".join(lines) + "\n"


def pruning_page(atlas: Path, names: list[str]) -> int:
    """`--pruning-only`: the held-out pruning section alone (e.g. a zoo checkpoint's, reports/pruning-zoo/), from
    the same stage data: <atlas>/pruning.json (every number) and <atlas>/README.md."""
    import matplotlib

    matplotlib.use("Agg")
    from depthlens.io.atomic import atomic_write_text

    dirs = [atlas / n for n in names if (atlas / n / "data" / "pruning_heldout.nc").exists()]
    if not dirs:
        print(f"atlas: no held-out pruning data under {atlas}", file=sys.stderr)
        return 1
    summaries = [model_summary(d) for d in dirs]
    (atlas / "figures").mkdir(exist_ok=True)
    figs = {"pruning_heldout": _heldout_figure(atlas / "figures", summaries)}
    doc = {"models": summaries, "figures": figs}
    atomic_write_text(atlas / "pruning.json", json.dumps(doc, indent=1) + "\n")
    ev = summaries[0]["eval"]
    lines = [
        "# Held-out layer pruning: " + ", ".join(s["name"] for s in summaries),
        "",
        f"Generated by `python scripts/atlas.py {atlas} {' '.join(names)} --pruning-only` from the stage datasets "
        f"under `<model>/data/` (`scripts/real_model_report.py --stages angular,causal_update,permutation,"
        f"pruning_heldout,pruning_random`); every number is in `pruning.json`. Eval data: the held-out split of the "
        f"offline corpus, {ev.get('n_seq')} windows × {ev.get('seq_len')} tokens, seed {ev.get('seed')}.",
        "",
        *_heldout_section(summaries, figs),
    ]
    atomic_write_text(atlas / "README.md", "\n".join(lines) + "\n")
    print(f"wrote {atlas}/README.md, pruning.json and figures/")
    return 0


def main(argv: list[str]) -> int:
    from depthlens.io.atomic import atomic_write_text

    if "--pruning-only" in argv:
        return pruning_page(Path(argv[0]), [a for a in argv[1:] if a != "--pruning-only"])
    atlas, names = Path(argv[0]), argv[1:]
    dirs = [atlas / n for n in names if (atlas / n / "data" / "run.json").exists()]
    if not dirs:
        print(f"atlas: no model data under {atlas} (run scripts/real-model-atlas.sh)", file=sys.stderr)
        return 1
    summaries = [model_summary(d) for d in dirs]
    figs = figures(atlas, dirs, summaries)
    ex_path = atlas / "exactness.json"
    exactness = json.loads(ex_path.read_text()) if ex_path.exists() else None
    cli_path = atlas / "cli.json"
    cli = json.loads(cli_path.read_text()) if cli_path.exists() else None
    prune_path = atlas / "prune.json"
    prune = json.loads(prune_path.read_text()) if prune_path.exists() else None
    doc = {"models": summaries, "figures": figs, "exactness": exactness, "cli": cli, "prune": prune}
    atomic_write_text(atlas / "atlas.json", json.dumps(doc, indent=1) + "\n")
    absent = [n for n in names if not (atlas / n / "data" / "run.json").exists()]
    atomic_write_text(atlas / "README.md", readme(summaries, figs, exactness, absent, cli, prune))
    print(f"wrote {atlas}/README.md, atlas.json and figures/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
