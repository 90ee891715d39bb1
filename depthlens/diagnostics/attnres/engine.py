"""AttnRes depth-softmax readouts (self-weight, dead prefix, consumption) and depth mixing for every design
(docs/concepts.md#attnres-dead-prefix).

AttnRes routers record per sublayer j (readouts of one forward, `model.readouts(tokens)`):
    sub{j}.alpha             depth-softmax weights over sources (B, T, S) (or (S, B, T)); sums to 1 over S
    sub{j}.source_labels     S labels; "partial" = the current block's running sum (Block AttnRes)
    sub{j}.self_weight       (B, T) weight on the partial (NaN where it duplicates the embedding)
    sub{j}.embedding_weight  (B, T) weight on the token embedding b_0

Definitions (means over tokens τ ≥ 1, NaN-aware):
    self-weight per sublayer, per layer s_l = E_τ ½(α^self_{2l} + α^self_{2l+1})
    dead prefix k*(ε) = max{k : s_l < ε for all l < k}, ε ∈ {0.01, 0.02, 0.05, 0.1, 0.2}
    consumption κ_m = Σ_{sublayers k that read completed source m} E_τ α_{m→k}
    mass families: embedding b_0, current (the partial), history (every other completed source)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr
from einops import rearrange

from depthlens.diagnostics.attnres.headline import DEAD_PREFIX_EPS
from depthlens.errors import DepthlensError
from depthlens.io.dataset import data_var, kept_var, scalar_var
from depthlens.models.protocol import LayeredLM
from depthlens.models.readouts import as_readouts, readout_key
from depthlens.runtime.evaldata import EvalData, default_batch_size, model_dataset, model_device
from depthlens.runtime.progress import Count, ProgressFn
from depthlens.stats.metrics import dead_prefix

EPS_GRID = (0.01, 0.02, 0.05, 0.1, 0.2)
FAMILIES = ("embedding", "current", "history")
PARTIAL = "partial"  # Block AttnRes label of the current block's running sum


def _alpha(record: Mapping[str, Any], j: int, labels: Sequence[str]) -> torch.Tensor:
    """sub{j}.alpha as (S, B, T) float64 from the routers' (B, T, S) layout."""
    key = readout_key("alpha", sublayer=j)
    a = torch.as_tensor(record[key]).double()
    S = len(labels)
    if a.dim() == 3 and a.shape[-1] == S:
        return rearrange(a, "b t s -> s b t")
    raise DepthlensError(f"{key} has shape {tuple(a.shape)}, expected (B, T, {S}) for {S} source labels")


class _Means:
    """NaN-aware running sums/counts of named arrays (averaged over tokens τ ≥ 1 across batches)."""

    def __init__(self) -> None:
        self.sum: dict[Any, float] = {}
        self.count: dict[Any, int] = {}

    def add(self, key: Any, x: torch.Tensor) -> None:
        """x: (B, T) per-token values; position 0 is dropped here."""
        x = x[:, 1:].double()
        ok = ~torch.isnan(x)
        self.sum[key] = self.sum.get(key, 0.0) + float(x[ok].sum())
        self.count[key] = self.count.get(key, 0) + int(ok.sum())

    def mean(self, key: Any) -> float:
        n = self.count.get(key, 0)
        return self.sum[key] / n if n else float("nan")


def accumulate_record(acc: _Means, record: Mapping[str, Any], n_sub: int) -> list[list[str]]:
    """Add one batch's AttnRes readouts; returns the source labels per sublayer."""
    record = as_readouts(record)
    if not record.has("alpha", 0):
        raise DepthlensError("AttnRes self-weight needs sub{j}.alpha readouts (full_attnres, block_attnres)")
    labels = []
    for j in range(n_sub):
        lab = [str(x) for x in record.sublayer("source_labels", j)]
        labels.append(lab)
        a = _alpha(record, j, lab)
        self_w = torch.as_tensor(record.sublayer("self_weight", j)).double()
        emb_w = torch.as_tensor(record.sublayer("embedding_weight", j)).double()
        acc.add(("self", j), self_w)
        acc.add(("emb", j), emb_w)
        acc.add(("hist", j), 1.0 - torch.nan_to_num(self_w) - emb_w)
        # layer value s_l: per token nanmean of the two sublayers (the first one can be undefined)
        if j % 2 == 1:
            prev = torch.as_tensor(record.sublayer("self_weight", j - 1))
            pair = torch.stack([prev.double(), self_w])
            both = torch.where(
                torch.isnan(pair).all(0),
                torch.nan,
                torch.nan_to_num(pair).sum(0) / (~torch.isnan(pair)).sum(0).clamp_min(1),
            )
            acc.add(("layer", j // 2), both)
        for s, name in enumerate(lab):
            if name != PARTIAL:  # completed sources only: the current block's partial sum is "self"
                acc.add(("src", j, name), a[s])
    return labels


def attnres_summary(
    acc: _Means, labels: list[list[str]], n_layer: int, eps_grid: Sequence[float] = EPS_GRID
) -> dict[str, Any]:
    """Arrays for the Dataset from accumulated means."""
    n_sub = 2 * n_layer
    sub = np.array([acc.mean(("self", j)) for j in range(n_sub)])
    layer = np.array([acc.mean(("layer", l)) for l in range(n_layer)])
    fam = np.array([[acc.mean(("emb", j)), sub[j], acc.mean(("hist", j))] for j in range(n_sub)])
    sources = list(dict.fromkeys(lab for labs in labels for lab in labs if lab != PARTIAL))
    W = np.full((n_sub, len(sources)), np.nan)
    for j, labs in enumerate(labels):
        for lab in labs:
            if lab != PARTIAL:
                W[j, sources.index(lab)] = acc.mean(("src", j, lab))
    # a completed source appears only in sublayers after it (its own block reads it as the partial), so summing
    # its column gives κ_m = Σ_{k after block m} E_τ α_{m→k}
    kappa = np.where(np.isnan(W), 0, W).sum(axis=0)
    kstar = np.array([dead_prefix(layer, e, nan_policy="skip") for e in eps_grid])
    return {
        "self_weight_sublayer": sub,
        "self_weight_layer": layer,
        "mass_family": fam,
        "source_weight": W,
        "consumption": kappa,
        "dead_prefix": kstar,
        "sources": sources,
        "self_weight_site": sub.reshape(n_layer, 2),
    }


def attnres_from_record(
    record: Mapping[str, Any], n_layer: int, eps_grid: Sequence[float] = EPS_GRID
) -> dict[str, Any]:
    """Summary of one readout record (e.g. hand-built in tests)."""
    acc = _Means()
    labels = accumulate_record(acc, record, 2 * n_layer)
    return attnres_summary(acc, labels, n_layer, eps_grid)


def attnres_dataset(
    model: LayeredLM,
    data: EvalData,
    *,
    eps_grid: Sequence[float] = EPS_GRID,
    eps: float | None = None,
    batch_size: int | None = None,
    checkpoint: Any = None,
    progress: ProgressFn | None = None,
) -> xr.Dataset:
    """Self-weight, dead prefix, consumption and mass families of an AttnRes model over `data`
    (docs/concepts.md#attnres-dead-prefix). The dead prefix k*(ε) is computed at every ε of `eps_grid` and at `eps`
    (the headline ε: the command's --eps).

    progress: called as (batches done, total) (`depthlens.runtime.progress`)."""
    if not hasattr(model, "readouts"):
        raise DepthlensError("AttnRes diagnostics read model.readouts(tokens); this model has none")
    if eps is not None:
        eps_grid = tuple(sorted({*eps_grid, float(eps)}))
    L = model.n_layer
    device = model_device(model)
    acc, labels = _Means(), None
    batches = list(data.batches(batch_size or default_batch_size(data)))
    count = Count(progress, len(batches))
    for _, toks in batches:
        labels = accumulate_record(acc, model.readouts(toks.to(device)), 2 * L)
        count.add()
    assert labels is not None  # EvalData is never empty, so the loop ran at least once
    r = attnres_summary(acc, labels, L, eps_grid)
    dv = {
        "self_weight_sublayer": data_var(
            ("sublayer",), r["self_weight_sublayer"], "depth-softmax weight on the current block's partial sum"
        ),
        "self_weight": data_var(
            ("layer",), r["self_weight_layer"], "self-weight s_l of the layer (mean of its two sublayers)"
        ),
        "self_weight_site": data_var(
            ("layer", "site"), r["self_weight_site"], "self-weight per attention / MLP sublayer"
        ),
        "mass_family": data_var(
            ("sublayer", "family"),
            r["mass_family"],
            "depth-softmax mass on embedding / current partial / older history",
        ),
        "source_weight": data_var(
            ("sublayer", "source"), r["source_weight"], "depth-softmax weight on each completed source"
        ),
        "consumption": data_var(
            ("source",), r["consumption"], "consumption: total weight later sublayers put on the source"
        ),
        "dead_prefix": data_var(
            ("eps",), r["dead_prefix"], "dead prefix k*: leading layers with self-weight below eps"
        ),
    }
    coords = {
        "sublayer": np.arange(2 * L),
        "layer": np.arange(L),
        "site": ["attn", "mlp"],
        "family": list(FAMILIES),
        "source": r["sources"],
        "eps": list(eps_grid),
    }
    options = dict(
        eps_grid=list(eps_grid),
        **({} if eps is None else {"eps": float(eps)}),  # the headline ε, when one was asked for
        token_positions="1..T-1 (BOS excluded)",
        self_source="router readout sub{j}.self_weight (Block: weight on 'partial'; Full: on the "
        "previous sublayer's output)",
        consumption="sum over sublayers of the token-mean weight on each completed source (not 'partial')",
        nan_policy="undefined self-weights (partial = embedding) are skipped in means and in k*",
    )
    title = "depthlens AttnRes self-weight and dead prefix"
    return model_dataset(model, data, checkpoint, dv, coords, metric="attnres", title=title, options=options)


# ---------------------------------------------------------------------------------------------------------------
# its report row and `track` variables (registry hooks)


def _dead_prefix_at(ds: xr.Dataset, eps_wanted: float, tol: float) -> float | None:
    """k*(ε) at ε = eps_wanted when the engine's ε grid holds it, else None."""
    eps = np.asarray(ds["eps"].values, dtype=float)
    k = int(np.argmin(np.abs(eps - eps_wanted)))
    return float(ds["dead_prefix"].values[k]) if abs(eps[k] - eps_wanted) < tol else None


def attnres_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """The dead prefix k*(ε) at the report's ε."""
    if "dead_prefix" not in ds:
        return {}
    k = _dead_prefix_at(ds, DEAD_PREFIX_EPS, 1e-9)
    return {} if k is None else {"dead_prefix": int(k)}


def attnres_track(ds: xr.Dataset, opts: Any) -> dict[str, xr.DataArray]:
    """The self-weight per layer and k*(ε) at track's `--eps`."""
    dead = _dead_prefix_at(ds, opts.eps, 1e-12)
    return {
        "self_weight": kept_var(ds["self_weight"], "AttnRes self-weight per layer (token mean)"),
        "dead_prefix": scalar_var(
            np.nan if dead is None else dead,
            f"dead prefix k*({opts.eps:g}): leading layers with self-weight below {opts.eps:g}",
        ),
    }


def attnres_view(ds: xr.Dataset, model: Any) -> tuple[dict[str, Any], list[str], None]:
    """The terminal view of `depthlens attnres` (registry hook): the self-weight per layer, k*(ε) at the headline
    ε and over the grid, and Block AttnRes's block starts."""
    eps = float(ds.attrs.get("eps", DEAD_PREFIX_EPS))
    sw = [float(x) for x in ds["self_weight"].values]
    by_eps = {f"{float(e):g}": int(ds["dead_prefix"].sel(eps=e)) for e in ds["eps"].values}
    k = int(ds["dead_prefix"].sel(eps=eps))
    h: dict[str, Any] = {
        "metric": "attnres",
        "design": getattr(model.design, "slug", "?"),
        "n_layer": int(model.n_layer),
        "eps": eps,
        "dead_prefix": k,
        "dead_prefix_by_eps": by_eps,
        "self_weight": sw,
    }
    lines = [
        "AttnRes self-weight per layer",
        "  " + " ".join("  nan" if np.isnan(x) else f"{x:.3f}" for x in sw),
        f"dead prefix k*({eps:g}) = {k} layer(s)",
        "  k*(ε) over the grid: " + ", ".join(f"ε={e}: {v}" for e, v in by_eps.items()),
    ]
    if getattr(model.config, "arch", None) == "block_attnres":  # the only design with a block schedule
        h["block_starts"] = list(model.config.block_starts)
        lines.append(f"  block starts: {h['block_starts']}")
    return h, lines, None
