"""Layer-pruning curves: remove k layers chosen by a criterion and measure the LM loss, for k = 0 .. k_max.

The practical question people bring to depth diagnostics is which layers can go. Each criterion ranks the
layers (or, for the contiguous-block rule, the windows) of one model on the eval set; the loss of the model
with those layers removed is then measured on the same eval set, so the criteria are compared on what they
are for: the least harmful cut.

Criteria (all computed on the eval set itself):

  angular_block    contiguous window [l, l+k) whose input and output states are closest in angle
                   (Gromov et al. 2024: argmin_l d(h_l, h_{l+k}); the `prune_start` of the angular diagnostic)
  block_influence  the k layers whose output is most similar to their input (ShortGPT, Men et al. 2024:
                   BI_l = 1 - cos(h_l, h_{l+1}); ranked by the one-block angular distance, a monotone function
                   of the same cosine)
  skip_loss        the k layers whose single removal raises the loss least (each layer removed alone, once)
  causal           the k layers with the smallest mean downstream effect (the causal diagnostic's
                   `mean_downstream_effect`, current variant, mean aggregator)
  permutation      the k layers whose swaps with the other scored layers raise the loss least
                   (`permutation_importance`: mean P_abs(l, j) over the layers j it was swapped with; a layer the
                   model does not mind moving is taken as one it relies on least. Only the layers of the
                   permutation dataset's pairs are scored (the late window by default, l >= L/4, which holds at
                   least L/2 + 1 layers, so k <= L/2 never reaches an unscored layer)
  random           k layers drawn uniformly without replacement, `n_random` draws per k (mean, min and max)

"Remove layer l" is the block-level skip of every diagnostic (`keep[l] = 0`): the layer's whole write is
dropped, which for a Pre-LN or Sandwich-LN block (every foreign family here) is the block replaced by the
identity. Clean states before the first removed layer are reused from one clean pass, so a cut starting at
layer l costs L - l layers, not L.

Loss: mean next-token NLL (nats/token) over every position but the last, through the chunked LM head when
the model offers one (`diagnostics/vocab.py`), so 152K- and 262K-id vocabularies never form (rows, V) logits.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr

from ..errors import DepthlensError
from ..io.dataset import data_var
from ..models.protocol import unembedding_of
from ..runtime.evaldata import EvalData, default_batch_size, evaluating, model_dataset, model_device
from ..runtime.journal import Journal

CRITERIA = ("angular_block", "block_influence", "skip_loss", "causal", "permutation", "random")


@torch.no_grad()
def _sequence_nll(model: Any, ctx: Any, state: dict[str, torch.Tensor], toks: torch.Tensor) -> torch.Tensor:
    """(b,) summed next-token NLL of each sequence from a state after the last layer (float64)."""
    targets = toks[:, 1:].reshape(-1)
    u = unembedding_of(model)
    if u is not None:
        from .vocab import logsumexp_and_target

        h = u.hidden(state, ctx)[:, :-1]
        lse, z = logsumexp_and_target(h.reshape(-1, h.shape[-1]), u.weight, u.bias, targets.to(h.device))
        nll = (lse - z).double()
    else:
        logits = model.head(state, ctx)[:, :-1].float()
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.to(logits.device), reduction="none"
        ).double()
    return nll.reshape(toks.shape[0], -1).sum(1).cpu()


class _Pruner:
    """Loss of the model with a set of layers removed, summed over the eval set, clean prefixes reused.

    A cut starts at its first removed layer from the clean states of one clean pass. `anchor(A)` also keeps the
    states of the model with A removed (built when first needed), so a cut S that agrees with A on every layer
    below p starts at p from A's states: greedy's next step (A plus one layer) and a pool's pairs ({i} plus a
    later j) run from the added layer, not from A's first. The same operations on the same states: the sums are
    bit-identical either way (tests/test_pruning.py).
    """

    def __init__(self, model: Any, data: EvalData, batch_size: int | None, journal: Path | None = None):
        """journal: a JSON-lines file keeping every computed cut's sums (`runtime/journal.py`), so a stopped
        stage resumes where it stopped; tied to the eval tokens, the clean sums, the batch size and threads."""
        self.model, self.data = model, data
        self.L = model.n_layer
        self.device = model_device(model)
        self.batches = []  # (tokens, ctx, [state before layer l for l in 0..L])
        batch_size = batch_size or default_batch_size(data)
        for _, toks in data.batches(batch_size):
            toks = toks.to(self.device)
            ctx = model.context(toks.shape[1], device=toks.device)
            states = [model.embed(toks, ctx)]
            model.run_layers(states[0], ctx, on_layer=lambda p, s, u, states=states: states.append(s))
            self.batches.append((toks, ctx, states))
        self.n_tokens = data.n_seq * (data.seq_len - 1)
        # the cost record: each evaluated cut counted from its first removed layer, the clean prefix reused; a
        # deterministic measure (anchors and journal replays run fewer layers, by how much depends on the path)
        self.forward_layers = 0
        self._clean: np.ndarray | None = None  # the clean sums, asked for by every caller: run once
        self._anchor: tuple[int, ...] = ()
        self._anchor_states: list[list[Any]] | None = None  # per batch: the state before layer l, l = 0..L
        self.journal: Journal | None = None
        if journal is not None:
            from .._version import __version__

            identity = {
                "eval_tokens_sha256": hashlib.sha256(data.tokens.numpy().tobytes()).hexdigest(),
                "clean_sums": self.seq_sums([]).tolist(),  # bit-exact: another model or dtype differs here
                "batch_size": int(batch_size),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "depthlens": __version__,
            }
            self.journal = Journal(journal, identity)

    def anchor(self, removed: Sequence[int]) -> None:
        """Start the next cuts from the states of the model with `removed` cut where they agree with it (the
        states are run on the first cut that gains from them, so a step answered from the journal runs none)."""
        key = tuple(sorted(set(int(l) for l in removed)))
        if key != self._anchor:
            self._anchor, self._anchor_states = key, None

    def _start(self, removed: list[int]) -> tuple[int, list[list[Any]]]:
        """Where the cut `removed` starts, and the per-batch states it starts from."""
        start = removed[0] if removed else self.L
        clean = [states for _, _, states in self.batches]
        if not self._anchor or not removed:
            return start, clean
        differ = sorted(set(self._anchor) ^ set(removed))
        agree_below = differ[0] if differ else self.L  # the cut and the anchor remove the same layers below this
        if agree_below <= start:
            return start, clean
        if self._anchor_states is None:
            first = self._anchor[0]
            self._anchor_states = []
            for toks, ctx, states in self.batches:
                keep = {l: torch.zeros(toks.shape, device=toks.device) for l in self._anchor}
                run = list(states[: first + 1])
                self.model.run_layers(
                    states[first], ctx, first, keep=keep, on_layer=lambda p, s, u, run=run: run.append(s)
                )
                self._anchor_states.append(run)
        return agree_below, self._anchor_states

    def seq_sums(self, removed: Sequence[int]) -> np.ndarray:
        """(N,) summed next-token NLL of each eval sequence with the layers `removed` (float64)."""
        removed = sorted(set(int(l) for l in removed))
        if not removed and self._clean is not None:
            return self._clean.copy()
        self.forward_layers += (self.L - (removed[0] if removed else self.L)) * self.data.n_seq
        stored = self.journal.get(removed) if self.journal is not None and removed else None
        if stored is not None and stored.shape == (self.data.n_seq,):  # computed by an earlier, stopped run
            return stored
        start, source = self._start(removed)
        out = []
        for (toks, ctx, _), states in zip(self.batches, source, strict=True):
            keep = {l: torch.zeros(toks.shape, device=toks.device) for l in removed if l >= start}
            state = self.model.run_layers(states[start], ctx, start, keep=keep) if start < self.L else states[-1]
            out.append(_sequence_nll(self.model, ctx, state, toks).numpy())
        sums = np.concatenate(out)
        if not removed:
            self._clean = sums.copy()
        if self.journal is not None and removed:
            self.journal.put(removed, sums)
        return sums

    def seq_loss(self, removed: Sequence[int]) -> np.ndarray:
        """(N,) mean next-token NLL (nats/token) of each eval sequence with the layers `removed`."""
        return self.seq_sums(removed) / (self.data.seq_len - 1)

    def loss(self, removed: Sequence[int]) -> float:
        return float(self.seq_sums(removed).sum()) / self.n_tokens


def permutation_importance(permutation: xr.Dataset) -> np.ndarray:
    """(L,) mean loss rise (nats) over the swaps of layer l with every layer it was paired with: the mean of
    the non-NaN off-diagonal `perm_abs[l, j]`; NaN for a layer in no computed pair."""
    m = np.asarray(permutation["perm_abs"].values, dtype=float).copy()
    np.fill_diagonal(m, np.nan)
    scored = ~np.isnan(m)
    n = scored.sum(1)
    total = np.where(scored, m, 0.0).sum(1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def _smallest(score: np.ndarray, k: int) -> list[int]:
    """Indices of the k smallest scores (ties to the lower index, NaN last)."""
    order = np.lexsort((np.arange(len(score)), np.where(np.isnan(score), np.inf, score)))
    return sorted(order[:k].tolist())


def pruning_curves(
    model: Any,
    data: EvalData,
    *,
    k_max: int | None = None,
    criteria: Sequence[str] = CRITERIA,
    n_random: int = 8,
    seed: int = 0,
    angular: xr.Dataset | None = None,
    causal: xr.Dataset | None = None,
    permutation: xr.Dataset | None = None,
    positions: str = "all",
    batch_size: int | None = None,
    checkpoint: Any = None,
) -> xr.Dataset:
    """Loss against the number of removed layers k = 0..k_max (default L // 2), per criterion.

    angular / causal / permutation: the model's datasets of those diagnostics on the same eval data, if
    already computed (else computed here when a criterion needs them; permutation over the late pairs).
    positions: token positions of the angular criteria ("all" as ShortGPT, "last" as Gromov et al.).

    Returns `loss` (criterion, k) in nats/token, `removed` (criterion, k, layer) a 0/1 mask of the removed
    layers (for random: how often each layer was drawn), `loss_random_min/max` (k), `loss_clean` and
    `best_criterion` (k): the criterion with the lowest loss at each k (random excluded).
    """
    unknown = [c for c in criteria if c not in CRITERIA]
    if unknown:
        raise DepthlensError(f"unknown pruning criteria {unknown}; known: {', '.join(CRITERIA)}")
    L = model.n_layer
    k_max = L // 2 if k_max is None else int(k_max)
    if not 1 <= k_max < L:
        raise DepthlensError(f"k_max must be in [1, {L - 1}] for a {L}-layer model, got {k_max}")
    # no autograd: without it every stored clean state held its forward's whole graph (a 0.5B model's pruning
    # stage grew past 17 GB of resident memory; the losses are the same either way)
    with evaluating(model), torch.no_grad():
        pruner = _Pruner(model, data, batch_size)
        if {"angular_block", "block_influence"} & set(criteria) and angular is None:
            from .angular.engine import angular_distances

            angular = angular_distances(model, data, positions=positions, batch_size=batch_size)
        if "causal" in criteria and causal is None:
            from .causal.engine import causal_scores

            causal = causal_scores(model, data, variants=("current",))
        perm_score = None
        if "permutation" in criteria:
            if permutation is None:
                from .permutation.engine import permutation_scores

                permutation = permutation_scores(model, data, pairs="late")
            perm_score = permutation_importance(permutation)
            if perm_score.shape != (L,):
                raise DepthlensError(f"the permutation dataset has {perm_score.shape[0]} layers; the model has {L}")
        ks = np.arange(k_max + 1)
        loss = np.full((len(criteria), len(ks)), np.nan)
        removed = np.zeros((len(criteria), len(ks), L))
        clean = pruner.loss([])
        skip = np.array([pruner.loss([l]) for l in range(L)]) if "skip_loss" in criteria else None
        rng = np.random.default_rng(seed)
        rand = np.full((len(ks), n_random), np.nan)
        for c, crit in enumerate(criteria):
            for k in ks:
                if k == 0:
                    loss[c, 0] = clean
                    continue
                if crit == "random":
                    for r in range(n_random):
                        layers = sorted(rng.choice(L, size=k, replace=False).tolist())
                        rand[k, r] = pruner.loss(layers)
                        removed[c, k, layers] += 1 / n_random
                    loss[c, k] = rand[k].mean()
                    continue
                if crit == "angular_block":
                    assert angular is not None  # computed above for either angular criterion
                    start = int(angular["prune_start"].values[k])
                    layers = list(range(start, start + k))
                elif crit == "block_influence":
                    assert angular is not None  # computed above for either angular criterion
                    layers = _smallest(angular["profile"].values[:L], k)
                elif crit == "skip_loss":
                    assert skip is not None  # computed above when skip_loss is a criterion
                    layers = _smallest(skip, k)
                elif crit == "permutation":
                    assert perm_score is not None  # computed above when permutation is a criterion
                    if k > int(np.isfinite(perm_score).sum()):
                        raise DepthlensError(
                            f"the permutation criterion scores {int(np.isfinite(perm_score).sum())} layers; "
                            f"k_max = {k_max} needs {k} (compute more pairs, or lower k_max)"
                        )
                    layers = _smallest(perm_score, k)
                else:  # causal
                    assert causal is not None  # computed above when causal is a criterion
                    effect = causal["mean_downstream_effect"].sel(variant="current", aggregator="mean").values
                    layers = _smallest(effect, k)
                removed[c, k, layers] = 1
                if crit == "skip_loss" and k == 1:
                    assert skip is not None  # computed above when skip_loss is a criterion
                    loss[c, k] = skip[layers[0]]
                else:
                    loss[c, k] = pruner.loss(layers)
    deterministic = [i for i, c in enumerate(criteria) if c != "random"]
    best = np.array(
        [criteria[deterministic[int(np.argmin(loss[deterministic, k]))]] if deterministic else "" for k in ks],
        dtype=object,
    ).astype(str)
    rand[0] = clean
    drawn = ~np.isnan(rand).all(1)  # no draws when random is not a criterion: the band is NaN there
    rand_min, rand_max = np.full(len(ks), np.nan), np.full(len(ks), np.nan)
    rand_min[drawn], rand_max[drawn] = np.nanmin(rand[drawn], 1), np.nanmax(rand[drawn], 1)
    options = dict(
        k_max=k_max,
        criteria=list(criteria),
        n_random=n_random,
        random_seed=seed,  # of the random draws ("seed" is the eval data's, in the provenance)
        positions=positions,
        batch_size=batch_size,
        removal="block-level skip (keep[l] = 0): the layer's whole write dropped",
        loss="mean next-token NLL over positions 0..T-2",
        layers_run=pruner.forward_layers,
    )
    dv = {
        "loss": data_var(("criterion", "k"), loss, "LM loss with k layers removed", "nats/token"),
        "removed": data_var(("criterion", "k", "layer"), removed, "removed layers (random: fraction of draws)"),
        "loss_random_min": data_var(("k",), rand_min, "random removal: lowest loss of the draws", "nats/token"),
        "loss_random_max": data_var(("k",), rand_max, "random removal: highest loss of the draws", "nats/token"),
        "loss_clean": data_var((), clean, "LM loss of the whole model", "nats/token"),
        "best_criterion": data_var(("k",), best, "criterion with the lowest loss (random excluded)"),
    }
    coords = {"criterion": list(criteria), "k": ks, "layer": np.arange(L)}
    title = "depthlens layer-pruning curves"
    return model_dataset(model, data, checkpoint, dv, coords, metric="pruning", title=title, options=options)


def same_losses(a: Any, b: Any, dtype: Any) -> bool:
    """Whether two runs' losses are the same measurement up to the rounding of the model's `dtype` (an attr:
    "float32", "bfloat16", ...): `models.protocol.same_logits` on them in that dtype, so a run at another thread
    count or on another machine (last bits of every sum) still matches, and another model or data does not."""
    from ..models.protocol import same_logits

    name = str(dtype)
    dt = torch.bfloat16 if "bfloat16" in name else torch.float16 if "float16" in name else torch.float32
    x, y = torch.as_tensor(np.asarray(a, dtype=np.float64)), torch.as_tensor(np.asarray(b, dtype=np.float64))
    return same_logits(x.to(dt), y.to(dt))


def add_criteria(base: xr.Dataset, extra: xr.Dataset) -> xr.Dataset:
    """`base`'s curves with the criteria of `extra` it lacks added, e.g. a criterion whose input diagnostic
    was computed after the curves. Both must be of the same weights on the same eval data with the same k
    (else one line: DepthlensError). `best_criterion` is recomputed over every deterministic criterion; the
    random band is `base`'s; `layers_run` is the sum of both runs."""
    for key in ("weights_sha256", "eval_data_sha256", "k_max"):
        if str(base.attrs.get(key)) != str(extra.attrs.get(key)):
            raise DepthlensError(
                f"pruning curves to merge differ in {key} ({base.attrs.get(key)} vs {extra.attrs.get(key)})"
            )
    if not same_losses(base["loss_clean"].values, extra["loss_clean"].values, base.attrs.get("dtype")):
        raise DepthlensError(
            f"pruning curves to merge differ in the clean loss ({float(base['loss_clean']):.6f} vs "
            f"{float(extra['loss_clean']):.6f}): not the same model on the same data"
        )
    new = [str(c) for c in extra["criterion"].values if c not in base["criterion"].values and c != "random"]
    if not new:
        return base
    crits = [str(c) for c in base["criterion"].values] + new
    loss = xr.concat([base["loss"], extra["loss"].sel(criterion=new)], "criterion")
    removed = xr.concat([base["removed"], extra["removed"].sel(criterion=new)], "criterion")
    out = base.drop_vars(["loss", "removed", "best_criterion", "criterion"]).assign(
        loss=loss.assign_coords(criterion=crits), removed=removed.assign_coords(criterion=crits)
    )
    det = [c for c in crits if c != "random"]
    vals = out["loss"].sel(criterion=det).values
    out["best_criterion"] = (
        ("k",),
        np.array([det[int(np.argmin(vals[:, k]))] for k in range(vals.shape[1])]).astype(str),
        dict(base["best_criterion"].attrs),
    )
    out.attrs = {
        **base.attrs,
        "criteria_json": json.dumps(crits),
        "layers_run": int(base.attrs.get("layers_run", 0)) + int(extra.attrs.get("layers_run", 0)),
        "criteria_added": ", ".join(new),
    }
    return out
