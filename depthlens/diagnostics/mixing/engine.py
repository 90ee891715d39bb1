"""The depth-mixing matrix M[i → j] of any design: the weight of source i (the embedding, or a sublayer's output)
in the input of sublayer j, averaged over tokens; MoDA's depth-attention mass where a design has no residual mix
(docs/concepts.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xarray as xr

from depthlens.errors import DepthlensError
from depthlens.io.dataset import data_var
from depthlens.models.protocol import LayeredLM
from depthlens.models.readouts import as_readouts
from depthlens.runtime.evaldata import EvalData, default_batch_size, model_dataset, model_device
from depthlens.runtime.progress import Count, ProgressFn


def depth_mixing_dataset(
    model: LayeredLM,
    data: EvalData,
    *,
    batch_size: int | None = None,
    checkpoint: Any = None,
    progress: ProgressFn | None = None,
) -> xr.Dataset:
    """Mean over tokens τ ≥ 1 of the depth-mixing matrix M[i → j] (`model.depth_mixing`): weight of source i
    (0 = embedding, i ≥ 1 = sublayer i−1's output) in the input of sublayer j (j = 2L: the final readout).

    Designs without a residual mix (MoDA) return None there: their `sub{j}.depth_mass` readouts are
    averaged instead (variable `depth_mass`) and the matrix is all NaN with a note. A model with neither (a
    Hugging Face model) is refused with one line (DepthlensError), as is a described model whose description does
    not give the mixing objects (its `depth_mixing` says which field is missing).
    progress: called as (batches done, total) (`depthlens.runtime.progress`).
    """
    L = model.n_layer
    n = 2 * L + 1
    device = model_device(model)
    masses: dict[int, tuple[np.ndarray, int]] = {}  # sublayer -> (summed depth mass, tokens)
    total, count, note = np.zeros((n, n)), 0, None
    batches = list(data.batches(batch_size or default_batch_size(data)))
    done = Count(progress, len(batches))
    for _, toks in batches:
        toks = toks.to(device)
        M = model.depth_mixing(toks) if hasattr(model, "depth_mixing") else None
        if M is not None:
            total += M[:, 1:].double().sum((0, 1)).cpu().numpy()
            count += M.shape[0] * (M.shape[1] - 1)
            done.add()
            continue
        rec = as_readouts(model.readouts(toks) if hasattr(model, "readouts") else {})
        for j in rec.sublayers_with("depth_mass"):
            if j < 2 * L:
                m = torch.as_tensor(rec.sublayer("depth_mass", j)).double()
                summed = m[:, 1:].reshape(m.shape[0] * (m.shape[1] - 1), -1).sum(0).cpu().numpy()
                prev = masses.get(j, (0, 0))
                masses[j] = (prev[0] + summed, prev[1] + toks.shape[0] * (toks.shape[1] - 1))
        if not masses:  # nothing to average: refused, never an all-NaN matrix
            raise DepthlensError(
                f"the depth-mixing matrix is not defined for this model ({type(model).__name__}): it gives no "
                "matrix (model.depth_mixing) and no sub{j}.depth_mass readouts"
            )
        done.add()
    dv: dict[str, Any] = {}
    if count:
        mix = total / count
    else:
        mix = np.full((n, n), np.nan)
        note = "the design has no residual depth mix (model.depth_mixing returned None); " + (
            "see depth_mass" if masses else "no sub{j}.depth_mass readouts either"
        )
    dv["depth_mixing"] = data_var(
        ("source", "destination"), mix, "weight of source i in the input of sublayer j (token mean)"
    )
    coords: dict[str, Any] = {"source": np.arange(n), "destination": np.arange(n)}
    if masses:
        width = max(len(v[0]) for v in masses.values())
        D = np.full((2 * L, width), np.nan)
        for j, (s, c) in masses.items():
            D[j, : len(s)] = s / c
        dv["depth_mass"] = data_var(
            ("sublayer", "depth_source"), D, "depth-attention mass per depth source (token mean)"
        )
        coords.update(sublayer=np.arange(2 * L), depth_source=np.arange(width))
    options = dict(
        token_positions="1..T-1 (BOS excluded)",
        source_index="0 = embedding, i = output of sublayer i-1",
        destination_index="j = input of sublayer j, 2L = final readout",
        note=note,
    )
    axis_names = {
        "source": "source i (0 = embedding, i = output of sublayer i-1)",
        "destination": "destination j (input of sublayer j, 2L = final readout)",
        "sublayer": "sublayer j",
        "depth_source": "depth source (depth-KV slot)",
    }
    title = "depthlens depth-mixing matrix"
    return model_dataset(
        model, data, checkpoint, dv, coords, metric="depth_mixing", title=title, options=options, coord_names=axis_names
    )
