"""Angular distance between residual states (Gromov et al. 2024; docs/concepts.md#angular-distance).

  D_n(ℓ) = E_{(b,τ)} d(h_ℓ[b,τ], h_{ℓ+n}[b,τ]),   d(x, y) = (2/π) atan2(‖x̂−ŷ‖, ‖x̂+ŷ‖)

for every state ℓ = 0..L (h_0 = embedding state, h_L = `model.final_hidden`, before the final norm) and
every offset n = 0..L−ℓ. One forward per batch: the states are read in the `on_layer` stream, cut to the
measured positions at once, and folded into a float64 running sum (`metrics.AngularAccumulator`), so no
activation cache over the eval set is ever held.

Representations (`repr`):
  view     the design's residual view `design.view(state)` (B, T, d): h for single-stream designs, the
           stream sum for HC/mHC, the running sum for AttnRes.
  flatten  vec of the n streams (B, T, n·d) for multi-stream designs (= view for single-stream ones).
  input    what block ℓ actually reads: hook point `blocks.{ℓ}.hook_attn_in` (the aggregated depth-softmax
           input for AttnRes). Needs a HookedRootModule (DepthModel).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import torch
import xarray as xr

from depthlens.errors import DepthlensError
from depthlens.io.dataset import data_var, kept_var
from depthlens.io.jsonsafe import finite_or_none
from depthlens.models.protocol import LayeredLM
from depthlens.models.residual.base import State
from depthlens.runtime.evaldata import EvalData, default_batch_size, evaluating, model_dataset, model_device
from depthlens.runtime.progress import Count, ProgressFn
from depthlens.stats.metrics import AngularAccumulator

POSITIONS = ("last", "all")
REPRS = ("view", "flatten", "input", "running_sum")


def measured_positions(T: int, positions: str) -> slice:
    """Token positions measured: `last` = T−1 (packed data has no padding), `all` = 1..T−1 (BOS excluded)."""
    if positions not in POSITIONS:
        raise DepthlensError(f"positions must be one of {POSITIONS}, got {positions!r}")
    if T < 2:
        raise DepthlensError(f"angular distance needs sequences of >= 2 tokens (position 0 is BOS), got T={T}")
    return slice(T - 1, T) if positions == "last" else slice(1, T)


def _state_reader(model: LayeredLM, repr: str) -> Callable[[State], torch.Tensor]:
    """state -> (B, T, D) representation of a between-layer state."""
    design = model.design
    if repr == "flatten" and getattr(design, "multi_stream", False):
        return lambda state: design.streams(state).flatten(-2)
    view: Callable[[State], torch.Tensor] = design.view
    return view


@torch.no_grad()
def _batch_states(model: LayeredLM, tokens: torch.Tensor, repr: str, pos: slice) -> torch.Tensor:
    """(L+1, B·P, D) float32 states of one batch at the measured positions P, on the tokens' device (a model
    placed over several devices hands back each layer's state on that layer's device)."""
    L = model.n_layer
    ctx = model.context(tokens.shape[1], device=tokens.device)
    read = _state_reader(model, repr)
    states: list[torch.Tensor | None] = [None] * (L + 1)

    def keep(l: int, x: torch.Tensor) -> None:
        states[l] = x[:, pos].float().reshape(-1, x.shape[-1]).to(tokens.device)  # fp32 before any norm

    state = model.embed(tokens, ctx)
    if repr == "input":
        if not hasattr(model, "hooks"):
            raise DepthlensError(
                "repr='input' reads the hook point blocks.{l}.hook_attn_in and needs a "
                "HookedRootModule model (DepthModel)"
            )
        hooks = [(f"blocks.{l}.hook_attn_in", (lambda i: lambda x, hook: keep(i, x))(l)) for l in range(L)]
        with model.hooks(fwd_hooks=hooks):
            state = model.run_layers(state, ctx)
    else:
        keep(0, read(state))
        state = model.run_layers(state, ctx, on_layer=lambda p, s, u: keep(p + 1, read(s)) if p + 1 < L else None)
    final = model.final_hidden(state, ctx)
    if repr == "flatten" and getattr(model.design, "multi_stream", False):
        final = read(state)  # stay in the flattened stream space for the last state too
    keep(L, final)
    # every slot is set by now: 0..L−1 by the forward (hooks or on_layer), L by the final state
    return torch.stack(cast(list[torch.Tensor], states))


def angular_distances(
    model: LayeredLM,
    data: EvalData,
    *,
    positions: str = "last",
    repr: str = "view",
    batch_size: int | None = None,
    checkpoint: Any = None,
    progress: ProgressFn | None = None,
) -> xr.Dataset:
    """Angular-distance matrix D[ℓ, n] and profile D_1(ℓ) over `data` (docs/concepts.md#angular-distance).

    Returns a Dataset with `angular_distance` (layer = state ℓ 0..L, block_size = n 0..L; NaN where ℓ+n > L),
    `profile` (layer) = D_1(ℓ), and `prune_start` (block_size) = argmin_ℓ D_n(ℓ) (Gromov's pruning start).
    progress: called as (batches done, total) (`depthlens.runtime.progress`).
    """
    if repr not in REPRS:
        raise DepthlensError(f"repr must be one of {REPRS}, got {repr!r}")
    repr = "view" if repr == "running_sum" else repr
    pos = measured_positions(data.seq_len, positions)
    L = model.n_layer
    device = model_device(model)
    acc = AngularAccumulator(L + 1)
    batches = list(data.batches(batch_size or default_batch_size(data)))
    count = Count(progress, len(batches))
    with evaluating(model):
        for _, toks in batches:
            acc.update(_batch_states(model, toks.to(device), repr, pos))
            count.add()
    D = acc.result().numpy()
    valid = ~np.isnan(D[:, 1:]).all(axis=0)
    prune = np.full(L + 1, np.nan)
    prune[1:][valid] = np.nanargmin(D[:, 1:][:, valid], axis=0)
    options = dict(
        positions=positions,
        repr=repr,
        batch_size=batch_size,
        angle_form="(2/pi) atan2(|x^-y^|, |x^+y^|)",
        compute_dtype="float32 states, float64 sums",
        n_measured_tokens=int(acc.count),
        final_state="model.final_hidden (before the final norm)",
    )
    dv = {
        "angular_distance": data_var(("layer", "block_size"), D, "angular distance d(h_l, h_{l+n})"),
        "profile": data_var(("layer",), D[:, 1], "angular distance of one block d(h_l, h_{l+1})"),
        "prune_start": data_var(("block_size",), prune, "first layer of the n-block window with the smallest D_n"),
    }
    coords = {"layer": np.arange(L + 1), "block_size": np.arange(L + 1)}
    title = "depthlens angular distance between residual states"
    axis_names = {"layer": "start state l (residual before layer l)", "block_size": "block size n (layers)"}
    return model_dataset(
        model, data, checkpoint, dv, coords, metric="angular", title=title, options=options, coord_names=axis_names
    )


def profile_summary(ds: xr.Dataset) -> dict[str, Any]:
    """The one-block profile D_1(l), l = 0..L−1 (the finite entries), and the most prunable single block: the layer
    whose output is closest in angle to its input (argmin D_1; None when nothing is finite)."""
    prof = ds["profile"].values
    prof = prof[np.isfinite(prof)]  # D_1(l) exists for l = 0..L-1
    return {"profile": [float(x) for x in prof], "most_prunable_block": int(np.argmin(prof)) if len(prof) else None}


# ---------------------------------------------------------------------------------------------------------------
# its report row and `track` variables (registry hooks)


def angular_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """The mean angular distance between consecutive residual states (over the model's layers)."""
    if "profile" not in ds:
        return {}
    prof = np.asarray(ds["profile"].values, dtype=float)[: int(row["n_layer"])]
    return {"angular_d1_mean": finite_or_none(np.nanmean(prof)) if np.isfinite(prof).any() else None}


def angular_track(ds: xr.Dataset, opts: Any) -> dict[str, xr.DataArray]:
    prof = kept_var(ds["profile"], "angular distance between consecutive residual states d(h_l, h_l+1)")
    return {"angular_profile": prof.rename(layer="state")}


def angular_view(ds: xr.Dataset, model: Any) -> tuple[dict[str, Any], list[str], Any]:
    """The terminal view of `depthlens angular` (registry hook): the one-block profile D_1(l), the most prunable
    block, and D[l, n] as a terminal heatmap."""
    from depthlens.plotting.plots import terminal_heatmap

    positions, rep = str(ds.attrs.get("positions")), str(ds.attrs.get("repr"))
    summary = profile_summary(ds)
    head = {
        "metric": "angular",
        "design": getattr(model.design, "slug", "?"),
        "n_layer": int(model.n_layer),
        "positions": positions,
        "repr": rep,
        **summary,
    }
    lines = [
        f"angular distance d(h_l, h_l+1), positions={positions}, repr={rep}:",
        "  " + " ".join(f"{x:.3f}" for x in summary["profile"]),
    ]
    m = ds["angular_distance"].values
    labels = [str(i) for i in range(m.shape[0])]
    return head, lines, terminal_heatmap(m, labels, labels, vmin=0.0, vmax=1.0, legend=True)
