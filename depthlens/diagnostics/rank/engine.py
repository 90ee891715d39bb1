"""Effective rank of residual-mixing products for multi-stream designs (HC, mHC; docs/concepts.md#effective-rank).

Convention (column action, later factor on the left), as the HC/mHC routers record it in
`readouts['sub{j}.res_map']` (B, T, n, n):

    x_{k+1} = H_k x_k,        P_{a→b}(τ) = H_{b−1}(τ) ··· H_a(τ)

Per token τ ≥ 1 (BOS excluded): erank(P) = exp H(σ/Σσ) in float64, then mean / median / quartiles over
tokens (the mean of per-token eranks, not the erank of the mean product). Products:
  full      P_{0→2L}
  late      P_{2⌊L/4⌋→2L} (the late window in sublayers)
  interior  P_{1→2L−1}: without the first and last maps. In mHC those two are structurally gradient-free:
            the first acts on identical (replicated) streams and has rows summing to 1, the last feeds a
            sum/mean collapse and has columns summing to 1, so neither can change the output and both stay
            at their init; the interior product is the part of the full product training can move.
  window  w ∈ {1, 2, 4, …}: mean over starts a of erank(P_{a→a+w})
plus the mHC "Amax" gains (forward ∞-norm, backward 1-norm), and the same products of the static maps
alone (`static.sub{j}.res_map`, the bias-only part with α = 0) when the routers expose them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from depthlens.designs import has_capability
from depthlens.errors import DepthlensError
from depthlens.io.dataset import data_var, kept_var
from depthlens.io.jsonsafe import finite_or_none
from depthlens.models.protocol import LayeredLM
from depthlens.models.readouts import as_readouts
from depthlens.runtime.evaldata import EvalData, default_batch_size, model_dataset, model_device
from depthlens.runtime.progress import Count, ProgressFn
from depthlens.stats.metrics import amax_gain, effective_rank, late_window, mixing_products, window_profile

PRODUCTS = ("full", "late", "interior")
STOCHASTIC_TOL = 1e-3  # |row/column sum − 1| that still counts as stochastic: 20 Sinkhorn steps leave ~3e-5 on columns
STATISTICS = ("mean", "median", "q25", "q75", "max")


def default_widths(n_sub: int) -> list[int]:
    """1, 2, 4, … up to the number of sublayers 2L."""
    w, out = 1, []
    while w <= n_sub:
        out.append(w)
        w *= 2
    return out


def res_maps(record: Mapping[str, Any], n_sub: int) -> torch.Tensor:
    """Stack `sub{j}.res_map` for j = 0..n_sub−1 into (B, T, K, n, n) float64."""
    maps = as_readouts(record).per_sublayer("res_map", n_sub)
    missing = [j for j, m in enumerate(maps) if m is None]
    if missing:
        raise DepthlensError(
            "effective rank needs a multi-stream design (hc, mhc): the model records no "
            f"'sub{{j}}.res_map' readout (missing for sublayers {missing[:4]}...)"
        )
    return torch.stack([torch.as_tensor(m).double() for m in maps], dim=2)


def static_res_maps(record: Mapping[str, Any], n_sub: int) -> tuple[torch.Tensor | None, str | None]:
    """(K, n, n) static maps from the routers' `static.sub{j}.res_map` readouts, or (None, note)."""
    found = as_readouts(record).per_sublayer("res_map", n_sub, static=True)
    if all(m is not None for m in found):
        maps = [torch.as_tensor(m).double() for m in found]
        if all(m.dim() == 2 and m.shape[0] == m.shape[1] for m in maps):
            return torch.stack(maps), None
    return None, "no static residual map readouts (static.sub{j}.res_map); static part skipped"


def _stats(x: np.ndarray) -> np.ndarray:
    """[STATISTICS] over the last axis (NaN-aware; all-NaN gives NaN)."""
    x = x[~np.isnan(x)]
    if x.size == 0:
        return np.full(len(STATISTICS), np.nan)
    q25, med, q75 = np.quantile(x, [0.25, 0.5, 0.75])
    return np.array([x.mean(), med, q25, q75, x.max()])


def product_tokens(H: torch.Tensor, n_layer: int, widths: Sequence[int]) -> dict[str, torch.Tensor]:
    """Per-token quantities from per-token maps H (..., K, n, n): eranks and gains of the full and late
    products, window profiles (..., len(widths)) and single-map eranks (..., K)."""
    K = H.shape[-3]
    a = 2 * late_window(n_layer)
    out: dict[str, torch.Tensor] = {}
    for name, start, stop in (("full", 0, K), ("late", a, K), ("interior", min(1, K), max(K - 1, min(1, K)))):
        Pm = mixing_products(H, start, stop)
        out[f"erank_{name}"] = effective_rank(Pm)
        out[f"gain_fwd_{name}"], out[f"gain_bwd_{name}"] = amax_gain(Pm)
    out["window"] = window_profile(H, widths)
    out["single"] = effective_rank(H)
    return out


def structural_zero_grad(H: torch.Tensor, constrained: bool = True) -> np.ndarray:
    """(K,) bool: maps whose entries cannot receive gradient, whatever the data (docs/concepts.md#effective-rank,
    `interior`).

    Only a design whose maps are *constrained* to be stochastic (mHC's Sinkhorn projection) qualifies: any
    parameter change keeps the sums at 1, so the gradient vanishes up to the Sinkhorn residual. HC's maps
    are unconstrained (its identity init merely starts stochastic), so `constrained=False` flags nothing.

    H: (N_tokens, K, n, n). Map 0 acts on the replicated embedding, so with rows summing to 1 its output is
    the input; map K−1 feeds the sum/mean collapse, so with columns summing to 1 the collapsed output does
    not depend on it. Both conditions are checked on every token (mHC meets them up to the Sinkhorn error;
    HC's unconstrained maps do not)."""
    K = H.shape[-3]
    flags = np.zeros(K, dtype=bool)
    if K == 0 or not constrained:
        return flags
    flags[0] = bool((H[:, 0].sum(-1) - 1).abs().max() < STOCHASTIC_TOL)
    flags[K - 1] = flags[K - 1] or bool((H[:, K - 1].sum(-2) - 1).abs().max() < STOCHASTIC_TOL)
    return flags


def _summaries(tok: Mapping[str, Any], n_widths: int) -> dict[str, np.ndarray]:
    """Statistics over tokens of the per-token quantities of `product_tokens` (tensors), plus "zero_grad" (the
    (K,) bool array of `structural_zero_grad`)."""
    return {
        "erank": np.stack([_stats(tok[f"erank_{p}"].numpy()) for p in PRODUCTS]),
        "gain_fwd": np.stack([_stats(tok[f"gain_fwd_{p}"].numpy()) for p in PRODUCTS]),
        "gain_bwd": np.stack([_stats(tok[f"gain_bwd_{p}"].numpy()) for p in PRODUCTS]),
        "erank_window": np.stack([_stats(tok["window"][:, k].numpy()) for k in range(n_widths)]),
        "erank_sublayer": tok["single"].nanmean(0).numpy(),
        "zero_grad": tok["zero_grad"],
    }


def _static_summaries(static: torch.Tensor, n_layer: int, widths: Sequence[int]) -> dict[str, np.ndarray]:
    st = product_tokens(static, n_layer, widths)
    return {
        f"{k}_static": np.array([float(st[f"{k}_{p}"]) for p in PRODUCTS]) for k in ("erank", "gain_fwd", "gain_bwd")
    }


def effective_rank_from_maps(
    H: torch.Tensor,
    n_layer: int,
    widths: Sequence[int] | None = None,
    static: torch.Tensor | None = None,
    constrained: bool = False,
) -> dict[str, np.ndarray]:
    """Summaries over tokens. H: (N_tokens, K, n, n) per-token maps (BOS already dropped); static: (K, n, n).

    Returns arrays keyed like the Dataset variables: erank (product, statistic), gain_fwd/gain_bwd (product,
    statistic), erank_window (window, statistic), erank_sublayer (sublayer), and *_static (product) when given.
    """
    widths = list(widths or default_widths(H.shape[-3]))
    tok = {**product_tokens(H, n_layer, widths), "zero_grad": structural_zero_grad(H, constrained)}
    res = _summaries(tok, len(widths))
    if static is not None:
        res.update(_static_summaries(static, n_layer, widths))
    return res


def effective_rank_dataset(
    model: LayeredLM,
    data: EvalData,
    *,
    widths: Sequence[int] | None = None,
    batch_size: int | None = None,
    checkpoint: Any = None,
    progress: ProgressFn | None = None,
) -> xr.Dataset:
    """Effective rank of the residual-mixing products of a multi-stream model over `data`
    (docs/concepts.md#effective-rank).

    progress: called as (batches done, total) (`depthlens.runtime.progress`)."""
    if not hasattr(model, "readouts"):
        raise DepthlensError("effective rank reads model.readouts(tokens) (sub{j}.res_map); this model has none")
    L = model.n_layer
    K = 2 * L
    widths = list(widths or default_widths(K))
    device = model_device(model)
    parts: list[dict[str, torch.Tensor]] = []
    static, note, n_streams = None, None, None
    zero_grad = np.ones(K, dtype=bool)
    constrained = has_capability(getattr(model.design, "slug", ""), "stochastic_maps")  # Sinkhorn-projected maps
    batches = list(data.batches(batch_size or default_batch_size(data)))
    count = Count(progress, len(batches))
    for _, toks in batches:
        rec = model.readouts(toks.to(device))
        H = res_maps(rec, K)[:, 1:].cpu()  # drop the BOS position: (B, T-1, K, n, n)
        n_streams = int(H.shape[-1])
        # reduce each batch to per-token scalars at once: the maps themselves are never held for the eval set
        flat = H.reshape(-1, *H.shape[2:])
        parts.append(product_tokens(flat, L, widths))
        zero_grad &= structural_zero_grad(flat, constrained)  # a flag must hold on every token of every batch
        if static is None and note is None:
            static, note = static_res_maps(rec, K)
        count.add()
    tok = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    res = _summaries({**tok, "zero_grad": zero_grad}, len(widths))
    if static is not None:
        res.update(_static_summaries(static, L, widths))
    dv = {
        "erank": data_var(("product", "statistic"), res["erank"], "effective rank of the residual-mixing product"),
        "gain_fwd": data_var(
            ("product", "statistic"), res["gain_fwd"], "forward Amax gain (max row abs sum) of the product"
        ),
        "gain_bwd": data_var(
            ("product", "statistic"), res["gain_bwd"], "backward Amax gain (max column abs sum) of the product"
        ),
        "erank_window": data_var(
            ("window", "statistic"),
            res["erank_window"],
            "effective rank of w-sublayer window products, mean over starts",
        ),
        "erank_sublayer": data_var(
            ("sublayer",), res["erank_sublayer"], "effective rank of one sublayer's residual map (token mean)"
        ),
        "structural_zero_grad": data_var(
            ("sublayer",),
            res["zero_grad"].astype(np.int8),
            "1 where the residual map cannot receive gradient (first map row-stochastic on replicated streams, "
            "last map column-stochastic before the sum/mean collapse)",
            flag_values=[0, 1],
        ),
    }
    for key in ("erank_static", "gain_fwd_static", "gain_bwd_static"):
        if key in res:
            dv[key] = data_var(("product",), res[key], f"{key.replace('_', ' ')} (static maps, alpha = 0)")
    coords = {
        "product": list(PRODUCTS),
        "statistic": list(STATISTICS),
        "window": widths,
        "sublayer": np.arange(K),
        "n_streams": n_streams,
    }
    options = dict(
        widths=widths,
        late_start_sublayer=2 * late_window(L),
        convention="x_{k+1} = H_k x_k; P_{a->b} = H_{b-1} ... H_a (later factor on the left)",
        token_positions="1..T-1 (BOS excluded)",
        svd_dtype="float64",
        static_note=note,
        n_token_maps=int(tok["single"].shape[0]),
    )
    title = "depthlens effective rank of residual-mixing products"
    return model_dataset(model, data, checkpoint, dv, coords, metric="effective_rank", title=title, options=options)


# ---------------------------------------------------------------------------------------------------------------
# its report row and `track` variables (registry hooks)


def rank_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """erank of the full and the late-window product (token mean), and the stream count."""
    out = {
        "erank_full": finite_or_none(ds["erank"].sel(product="full", statistic="mean").values),
        "erank_late": finite_or_none(ds["erank"].sel(product="late", statistic="mean").values),
    }
    if "n_streams" in ds.coords:
        out["n_streams"] = int(ds["n_streams"].values)
    return out


def rank_track(ds: xr.Dataset, opts: Any) -> dict[str, xr.DataArray]:
    mean = ds["erank"].sel(statistic="mean")
    return {"erank": kept_var(mean, "effective rank of the residual-mixing product (token mean)")}


def rank_view(ds: xr.Dataset, model: Any) -> tuple[dict[str, Any], list[str], None]:
    """The terminal view of `depthlens rank` (registry hook): erank and Amax gains per product, the maps that
    cannot receive gradient, and an mHC init that pins the products at rank 1."""
    er = ds["erank"]
    stat = "mean" if "statistic" in er.dims and "mean" in er["statistic"].values else None
    slug = getattr(model.design, "slug", "?")
    h: dict[str, Any] = {"metric": "erank", "design": slug, "n_layer": int(model.n_layer)}
    lines = ["effective rank of residual-mixing products"]
    for p in er["product"].values:
        sel = {"product": p, **({"statistic": stat} if stat else {})}
        v = float(er.sel(sel))
        gf, gb = (float(ds[g].sel(sel)) if g in ds else float("nan") for g in ("gain_fwd", "gain_bwd"))
        h[f"erank_{p}"], h[f"gain_fwd_{p}"], h[f"gain_bwd_{p}"] = v, gf, gb
        lines.append(f"  {p:>12}: erank {v:.3f}   Amax gain fwd {gf:.3g} / bwd {gb:.3g}")
    if "structural_zero_grad" in ds:
        frozen = [int(j) for j in ds["sublayer"].values[ds["structural_zero_grad"].values.astype(bool)]]
        h["structural_zero_grad_sublayers"] = frozen
        if frozen:
            lines.append(
                f"  maps that cannot receive gradient (stay at their init): sublayers {frozen}; "
                "'interior' leaves out the first and last"
            )
    init = getattr(model.config, "mhc_init", None) if has_capability(slug, "stochastic_maps") else None
    if init is not None:
        h["mhc_init"] = init
        zero = " (H_res = J/n at init: products are rank 1 by construction)" if init == "zero" else ""
        lines.append(f"  mHC init: {init}{zero}")
    return h, lines, None
