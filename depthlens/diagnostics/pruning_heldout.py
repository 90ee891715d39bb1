"""Held-out layer pruning: every criterion chooses its layers on a calibration split and is scored on another.

`pruning.pruning_curves` ranks the layers on the eval windows that then score the cut, so the single-layer skip
loss is optimal at k = 1 by construction. Here the eval windows are split in two folds, stratified by domain
(`window_domains`: prose or code for the offline corpus; within each domain the windows alternate between
fold 0 and fold 1 in stream order). Each criterion ranks the layers on one fold (its calibration split) and the
cut it picks is scored on the other (its held-out split); both folds take each role once (2-fold cross-fitting),
so every window has one held-out loss per criterion and k, from a cut chosen without it. `removed` keeps both
folds' choices; `seq_loss` the per-window held-out losses (nats/token), from which every curve, per domain and
pooled, and every paired interval is computed (`summarize`).

Criteria (each computed on the calibration fold only; layers outside the `protect` policy are never removed):

  angular_block    the contiguous window [l, l+k) with the smallest angular distance d(h_l, h_{l+k}) (Gromov)
  block_influence  the k layers with the smallest one-block angular distance (ShortGPT)
  skip_loss        the k layers whose single removal raises the calibration loss least
  causal           the k layers with the smallest mean downstream effect (current variant, mean aggregator,
                   recomputed from the causal dataset's per-sequence sums over the calibration windows)
  permutation      the k layers whose late swaps raise the calibration loss least (per-sequence ΔL of the
                   permutation dataset, averaged over the calibration windows)
  greedy           SLEB-style: one layer at a time, the one whose removal (given those already removed) raises
                   the calibration loss least (Song et al. 2024); nested cuts
  predicted        the set minimising the predicted Δloss of `PairwiseModel` (additive single-layer ΔL plus
                   measured pairwise interactions among a pool of candidates; greedy then one-swap search on
                   the prediction, no forward pass)

Baselines (`random_baselines`, scored on every window, no calibration needed): `n_random` draws per k, uniform
over all L layers, and stratified: uniform over the layers the criteria may remove (the same `protect` policy).

`protect`: "ends" (default) never removes the first or the last layer, for criteria and the stratified
baseline alike; "none" allows every layer.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from ..errors import DataError, DepthlensError
from ..io.dataset import data_var
from ..io.files import read_json
from ..runtime.evaldata import EvalData, evaluating, model_dataset
from .pruning import _Pruner, same_losses

CRITERIA = ("angular_block", "block_influence", "skip_loss", "causal", "permutation", "greedy", "predicted")
BASELINES = ("random_uniform", "random_stratified")
# `depthlens prune`'s default criterion: greedy (SLEB). It ranks by the certified quantity itself, and on the one
# model with every criterion held out so far (the zoo's preln_l32, reports/pruning-zoo/) it has the smallest mean
# excess over k <= L/4 in its worse domain (tests/test_atlas.py checks it); docs/concepts.md#layer-pruning
DEFAULT_CRITERION = "greedy"
PROTECT = ("ends", "none")
INTERVAL_METHOD = "paired normal interval with bootstrap standard error over held-out eval sequences"
BOUND_METHOD = "one-sided paired Student t upper bound (95 %) over held-out eval sequences"
FOLD_RULE = "2-fold cross-fitting; folds alternate within each domain in stream order"


# ---------------------------------------------------------------------------------------------------------------
# domains and folds


def window_domains(data: EvalData, tokenizer: Any = None) -> list[str] | None:
    """The domain ("english" or "code") of each eval window drawn from the offline corpus, from the corpus
    manifest: documents are packed in manifest order. With a BOS, the k-th BOS of the split's stream starts its
    k-th document; without one, each document's token count is recounted by tokenizing the manifest's sources
    again with `tokenizer` (the model's; checked against the corpus's token count). A window's domain is that
    of the document holding its middle token. None when the windows are not the corpus's (a file, token shards,
    random ids), or without BOS or tokenizer, or when the recount disagrees with the corpus."""
    from ..data.shards import TokenDataset
    from ..runtime.evaldata import pack_stream

    src = str(data.source)
    if not src.endswith(" split)") or "/" not in str(data.name):
        return None
    directory, split = Path(src.rsplit(" (", 1)[0]), src.rsplit("(", 1)[1].split()[0]
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = read_json(manifest_path, "a shard manifest", error=DataError)
    sources = [s for s in manifest.get("sources", []) if s.get("split") == split]
    kinds = [s["kind"] for s in sources]
    bos = (manifest.get("tokenizer") or {}).get("bos_id")
    if not kinds:
        return None
    ds = TokenDataset.from_dir(directory, split)
    stream = np.asarray(ds.tokens(0, ds.n_tokens), dtype=np.int64)
    if bos is not None:
        doc_starts = np.flatnonzero(stream == bos)
    else:
        lengths = _document_lengths(sources, tokenizer, manifest)
        if lengths is None or sum(lengths) != stream.size:
            return None
        doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    if len(doc_starts) != len(kinds):  # a BOS inside a document's text, or another build: unknown
        return None
    T = data.seq_len
    windows = pack_stream(stream, T, bos)
    starts, pos = [], 0  # the stream offset of each window's first body token (pack_stream's own walk)
    for _ in range(windows.shape[0]):
        if bos is not None and pos < stream.size and stream[pos] == bos:
            pos += 1
        starts.append(pos)
        pos += T - 1 if bos is not None else T
    index = {w.tobytes(): i for i, w in enumerate(windows)}
    out = []
    for row in data.tokens.numpy():
        i = index.get(np.asarray(row, dtype=np.int64).tobytes())
        if i is None:
            return None
        mid = starts[i] + (T - 1) // 2
        out.append(kinds[int(np.searchsorted(doc_starts, mid, side="right")) - 1])
    return out


def _document_lengths(sources: list[dict[str, Any]], tokenizer: Any, manifest: dict[str, Any]) -> list[int] | None:
    """Token count of each corpus document (no BOS), tokenizing the packaged source text the corpus used (the
    first `bytes_used` bytes, sha256-checked) with `tokenizer`; None if a source is missing or changed, or the
    tokenizer is not the corpus's."""
    import hashlib

    from ..data.corpus import code_sources, english_sources

    if tokenizer is None or getattr(tokenizer, "name", None) != (manifest.get("tokenizer") or {}).get("name"):
        return None
    by_name = {s.name: s for s in english_sources() + code_sources()}
    lengths = []
    for s in sources:
        src = by_name.get(s["name"])
        if src is None:
            return None
        raw = src.read()
        if hashlib.sha256(raw).hexdigest() != s.get("sha256"):
            return None
        lengths.append(len(tokenizer.encode(raw[: int(s["bytes_used"])].decode("utf-8"))))
    return lengths


def _tokenizer_of(model: Any) -> Any:
    """The tokenizer the loader found with `model` (None for an in-memory model)."""
    from ..adapters.load import opened_of

    op = opened_of(model)
    return None if op is None else op.tokenizer


def assign_folds(domains: Sequence[str]) -> np.ndarray:
    """(N,) fold 0/1 of each window: within each domain, alternating in order (0, 1, 0, ...)."""
    seen: dict[str, int] = {}
    folds = []
    for d in domains:
        folds.append(seen.get(d, 0) % 2)
        seen[d] = seen.get(d, 0) + 1
    f = np.asarray(folds, dtype=int)
    if not ((f == 0).any() and (f == 1).any()):
        raise DepthlensError("held-out pruning needs at least 2 eval sequences (one per fold)")
    return f


def allowed_layers(L: int, protect: str) -> list[int]:
    """The layers a criterion may remove: all, or all but the first and the last ("ends")."""
    if protect not in PROTECT:
        raise DepthlensError(f"protect must be one of {', '.join(PROTECT)}, got {protect!r}")
    return list(range(L)) if protect == "none" else list(range(1, L - 1))


def subset(data: EvalData, idx: np.ndarray) -> EvalData:
    """The eval windows `idx` (in order) as their own EvalData."""
    return replace(data, tokens=data.tokens[torch.as_tensor(np.asarray(idx, dtype=np.int64))])


# ---------------------------------------------------------------------------------------------------------------
# the pairwise prediction model


@dataclass
class PairwiseModel:
    """Predicted Δloss of removing a set S: Σ_{l∈S} δ_l + Σ_{i<j ∈ S, both in the pool} γ_ij.

    δ_l: the measured Δloss of removing l alone; γ_ij = Δ({i, j}) − δ_i − δ_j, measured for every pair of the
    pool (the layers of smallest δ). Pairs outside the pool count as additive (γ = 0)."""

    delta: dict[int, float]
    gamma: dict[tuple[int, int], float]
    pool: list[int]

    def predict(self, layers: Sequence[int], *, additive: bool = False) -> float:
        s = sorted(set(int(l) for l in layers))
        out = sum(self.delta[l] for l in s)
        if not additive:
            out += sum(self.gamma.get((i, j), 0.0) for i, j in itertools.combinations(s, 2))
        return float(out)

    def search(self, k: int, allowed: Sequence[int]) -> list[int]:
        """A k-set of small predicted Δloss: greedy on the prediction, then one-layer swaps while one helps."""
        chosen: list[int] = []
        for _ in range(k):
            rest = [l for l in allowed if l not in chosen]
            chosen.append(min(rest, key=lambda l: (self.predict(chosen + [l]), l)))
        best = self.predict(chosen)
        improved = True
        while improved:
            improved = False
            for out_l in list(chosen):
                for in_l in allowed:
                    if in_l in chosen:
                        continue
                    trial = [l for l in chosen if l != out_l] + [in_l]
                    p = self.predict(trial)
                    if p < best - 1e-12:
                        chosen, best, improved = trial, p, True
                        break
                if improved:
                    break
        return sorted(chosen)


# ---------------------------------------------------------------------------------------------------------------
# one fold's rankings


class _Calibration:
    """Every criterion's choice for k layers, from the calibration windows of one fold."""

    def __init__(
        self,
        model: Any,
        cal: EvalData,
        cal_idx: np.ndarray,
        pruner: _Pruner,
        allowed: list[int],
        criteria: Sequence[str],
        *,
        angular_positions: str,
        causal: xr.Dataset | None,
        permutation: xr.Dataset | None,
        n_pool: int,
        batch_size: int | None,
    ):
        self.model, self.pruner, self.allowed, self.L = model, pruner, allowed, model.n_layer
        self._memo: dict[tuple[int, ...], float] = {}
        self.clean = self.loss([])
        self.single = (
            {l: self.loss([l]) for l in allowed} if {"skip_loss", "greedy", "predicted"} & set(criteria) else {}
        )
        self.greedy_sets: list[list[int]] = [[]]
        self.D = None
        if {"angular_block", "block_influence"} & set(criteria):
            from .angular.engine import angular_distances

            self.D = angular_distances(model, cal, positions=angular_positions, batch_size=batch_size)[
                "angular_distance"
            ].values
        self.causal_effect = _causal_effect(causal, cal_idx, self.L) if "causal" in criteria else None
        self.perm_score = _perm_importance(permutation, cal_idx, self.L) if "permutation" in criteria else None
        self.pairwise: PairwiseModel | None = None
        if "predicted" in criteria:
            delta = {l: self.single[l] - self.clean for l in allowed}
            pool = sorted(sorted(allowed, key=lambda l: (delta[l], l))[: max(2, n_pool)])
            gamma = {}
            for i, j in itertools.combinations(pool, 2):
                pruner.anchor([i])  # the pairs {i, j > i} start at j
                gamma[i, j] = self.loss([i, j]) - self.clean - delta[i] - delta[j]
            self.pairwise = PairwiseModel(delta, gamma, pool)

    def loss(self, layers: Sequence[int]) -> float:
        """Mean calibration loss with `layers` removed (memoised: a set is run once)."""
        key = tuple(sorted(set(int(l) for l in layers)))
        if key not in self._memo:
            self._memo[key] = float(self.pruner.seq_loss(key).mean())
        return self._memo[key]

    def pick(self, crit: str, k: int) -> list[int] | None:
        """The k layers `crit` removes (None: it cannot choose k, e.g. fewer scored layers)."""
        allowed = self.allowed
        if k > len(allowed):
            return None
        if crit == "skip_loss":
            return sorted(sorted(allowed, key=lambda l: (self.single[l], l))[:k])
        if crit == "greedy":
            while len(self.greedy_sets) <= k:
                prev = self.greedy_sets[-1]
                rest = [l for l in allowed if l not in prev]
                self.pruner.anchor(prev)  # each candidate adds one layer to prev: it starts at that layer
                nxt = min(rest, key=lambda l: (self.loss(prev + [l]), l))
                self.greedy_sets.append(sorted(prev + [nxt]))
            return self.greedy_sets[k]
        if crit == "block_influence":
            assert self.D is not None  # computed when an angular criterion is asked for
            return _smallest({l: self.D[l, 1] for l in allowed}, k)
        if crit == "angular_block":
            D = self.D
            assert D is not None
            lo, hi = allowed[0], allowed[-1]
            starts = [l for l in range(lo, hi - k + 2) if np.isfinite(D[l, k])]
            if not starts:
                return None
            s = min(starts, key=lambda l: (D[l, k], l))
            return list(range(s, s + k))
        if crit == "causal":
            assert self.causal_effect is not None
            return _smallest({l: self.causal_effect[l] for l in allowed}, k)
        if crit == "permutation":
            assert self.perm_score is not None
            return _smallest({l: self.perm_score[l] for l in allowed}, k)
        if crit == "predicted":
            assert self.pairwise is not None
            return self.pairwise.search(k, allowed)
        raise DepthlensError(f"unknown pruning criterion {crit!r}; known: {', '.join(CRITERIA)}")


def _smallest(score: dict[int, float], k: int) -> list[int] | None:
    """The k layers of smallest finite score (ties to the lower layer); None when fewer than k are scored."""
    finite = [l for l, v in score.items() if v == v]
    if len(finite) < k:
        return None
    return sorted(sorted(finite, key=lambda l: (score[l], l))[:k])


def _causal_effect(causal: xr.Dataset | None, idx: np.ndarray, L: int) -> np.ndarray:
    """(L,) mean downstream effect, mean aggregator, current variant, over the windows `idx` only:
    C(s, t) = Σ_n seq_sum / Σ_n seq_count, averaged over the computed t > s (NaN for an unscored s)."""
    if causal is None:
        raise DepthlensError("the causal criterion needs the causal dataset of the same eval data")
    ssum = causal["seq_sum"].sel(variant="current").values[..., idx].sum(-1)
    cnt = causal["seq_count"].sel(variant="current").values[..., idx]
    cnt = np.where(np.isnan(cnt), 0, cnt).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        C = np.where(cnt > 0, ssum / np.maximum(cnt, 1), np.nan)
    out = np.full(L, np.nan)
    scored = json.loads(causal.attrs.get("layers_current_json", causal.attrs.get("layers_json", "[]"))) or range(L)
    for s in scored:
        later = C[s, s + 1 :]
        if s < L - 1 and np.isfinite(later).any():
            out[s] = float(np.nanmean(later))
    return out


def _perm_importance(permutation: xr.Dataset | None, idx: np.ndarray, L: int) -> np.ndarray:
    """(L,) mean over the computed partners j of layer l of the mean swap ΔL over the windows `idx`."""
    if permutation is None:
        raise DepthlensError("the permutation criterion needs the permutation dataset of the same eval data")
    from .pruning import permutation_importance

    dl = permutation["delta_loss_seq"].values[..., idx].mean(-1)
    score = permutation_importance(xr.Dataset({"perm_abs": (("layer", "layer_other"), dl)}))
    if score.shape != (L,):
        raise DepthlensError(f"the permutation dataset has {score.shape[0]} layers; the model has {L}")
    return score


def _same_data(ds: xr.Dataset | None, data: EvalData, what: str) -> None:
    if ds is not None and ds.attrs.get("eval_data_sha256") not in (None, data.sha256):
        raise DepthlensError(f"the {what} dataset was computed on other eval data than these curves")


# ---------------------------------------------------------------------------------------------------------------
# the curves


def heldout_curves(
    model: Any,
    data: EvalData,
    *,
    domains: Sequence[str] | None = None,
    k_max: int | None = None,
    criteria: Sequence[str] = CRITERIA,
    protect: str = "ends",
    n_pool: int = 6,
    angular_positions: str = "all",
    causal: xr.Dataset | None = None,
    permutation: xr.Dataset | None = None,
    batch_size: int | None = None,
    checkpoint: Any = None,
    progress: Callable[[int, int], None] | None = None,
    journal: Path | None = None,
) -> xr.Dataset:
    """Held-out loss with k = 0..k_max layers removed (default L // 2), per criterion, by 2-fold cross-fitting.

    domains: one label per eval window (default `window_domains(data)`, else one domain "all"). causal /
    permutation: the model's datasets of those diagnostics on the same eval data (with per-sequence sums); if
    absent and the criterion is asked for, they are computed here (causal: every layer, current variant;
    permutation: the late pairs).

    Returns `seq_loss` (criterion, k, sequence): each window's held-out loss (nats/token) under the cut chosen
    on the other fold; `removed` (fold, criterion, k, layer): the cut chosen on fold f's windows (0/1; all 0
    where the criterion could not choose k layers, whose seq_loss is NaN); `calibration_loss` (fold, criterion,
    k): the chosen cut's mean loss on its own calibration windows, where it was measured anyway (skip_loss at
    k = 1, greedy; NaN elsewhere); `clean_seq` (sequence); `pair_gamma` (fold, layer, layer_other): the
    measured pairwise interactions of the `predicted` criterion's model (NaN outside its pool); `single_delta`
    (fold, layer); coords `domain` and `fold` on the sequence axis.

    journal: a folder keeping each fold's computed cuts (`runtime/journal.py`): a stopped run, rerun with the
    same folder, replays them and computes only the rest; the result is the same bit for bit.
    """
    unknown = [c for c in criteria if c not in CRITERIA]
    if unknown:
        raise DepthlensError(f"unknown pruning criteria {unknown}; known: {', '.join(CRITERIA)}")
    L, N = model.n_layer, data.n_seq
    allowed = allowed_layers(L, protect)
    k_max = L // 2 if k_max is None else int(k_max)
    if not 1 <= k_max <= len(allowed):
        raise DepthlensError(
            f"k_max must be in [1, {len(allowed)}] for a {L}-layer model (protect={protect}), got {k_max}"
        )
    if domains is None:
        domains = window_domains(data, _tokenizer_of(model)) or ["all"] * N
    domains = [str(d) for d in domains]
    if len(domains) != N:
        raise DepthlensError(f"{len(domains)} domain labels for {N} eval sequences")
    folds = assign_folds(domains)
    idx = [np.flatnonzero(folds == f) for f in (0, 1)]
    _same_data(causal, data, "causal")
    _same_data(permutation, data, "permutation")
    C, K = len(criteria), k_max + 1
    seq_loss = np.full((C, K, N), np.nan)
    removed = np.zeros((2, C, K, L))
    cal_loss = np.full((2, C, K), np.nan)
    gamma = np.full((2, L, L), np.nan)
    single = np.full((2, L), np.nan)
    with evaluating(model), torch.no_grad():
        if "causal" in criteria and causal is None:
            from .causal.engine import causal_scores

            causal = causal_scores(model, data, variants=("current",))
        if "permutation" in criteria and permutation is None:
            from .permutation.engine import permutation_scores

            permutation = permutation_scores(model, data, pairs="late")
        sub = [subset(data, i) for i in idx]
        pruners = [
            _Pruner(model, s, batch_size, journal / f"fold{f}.jsonl" if journal is not None else None)
            for f, s in enumerate(sub)
        ]
        clean = np.empty(N)
        for f in (0, 1):
            clean[idx[f]] = pruners[f].seq_loss([])
        done, total = 0, 2 * C * k_max
        for f in (0, 1):
            cal = _Calibration(
                model,
                sub[f],
                idx[f],
                pruners[f],
                allowed,
                criteria,
                angular_positions=angular_positions,
                causal=causal,
                permutation=permutation,
                n_pool=n_pool,
                batch_size=batch_size,
            )
            held, memo = pruners[1 - f], {}
            for l, v in cal.single.items():
                single[f, l] = v - cal.clean
            if cal.pairwise is not None:
                for (i, j), g in cal.pairwise.gamma.items():
                    gamma[f, i, j] = gamma[f, j, i] = g
            for c, crit in enumerate(criteria):
                seq_loss[c, 0, idx[1 - f]] = clean[idx[1 - f]]
                for k in range(1, K):
                    layers = cal.pick(crit, k)
                    done += 1
                    if progress is not None:
                        progress(done, total)
                    if layers is None:
                        continue
                    removed[f, c, k, layers] = 1
                    key = tuple(layers)
                    if key in cal._memo:
                        cal_loss[f, c, k] = cal._memo[key]
                    if key not in memo:
                        memo[key] = held.seq_loss(key)
                    seq_loss[c, k, idx[1 - f]] = memo[key]
    options = dict(
        k_max=k_max,
        criteria=list(criteria),
        protect=protect,
        allowed_layers=allowed,
        n_pool=n_pool,
        angular_positions=angular_positions,
        folds=FOLD_RULE,
        removal="block-level skip (keep[l] = 0): the layer's whole write dropped",
        loss="mean next-token NLL over positions 0..T-2 (nats/token), per sequence",
        vocab_size=int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0),
        layers_run=int(sum(p.forward_layers for p in pruners)),
    )
    dv = {
        "seq_loss": data_var(
            ("criterion", "k", "sequence"),
            seq_loss,
            "held-out LM loss of the window, cut chosen on the other fold",
            "nats/token",
        ),
        "removed": data_var(
            ("fold", "criterion", "k", "layer"),
            removed,
            "layers removed by the cut chosen on this fold's calibration windows",
        ),
        "calibration_loss": data_var(
            ("fold", "criterion", "k"),
            cal_loss,
            "the cut's mean loss on its own calibration windows (NaN: not run)",
            "nats/token",
        ),
        "clean_seq": data_var(("sequence",), clean, "LM loss of the whole model", "nats/token"),
        "single_delta": data_var(
            ("fold", "layer"), single, "calibration Δloss of removing the layer alone", "nats/token"
        ),
        "pair_gamma": data_var(
            ("fold", "layer", "layer_other"),
            gamma,
            "calibration pairwise interaction Δ({i,j}) − δ_i − δ_j",
            "nats/token",
        ),
    }
    coords = {
        "criterion": list(criteria),
        "k": np.arange(K),
        "sequence": np.arange(N),
        "fold": [0, 1],
        "layer": np.arange(L),
        "layer_other": np.arange(L),
        "domain": ("sequence", np.array(domains, dtype=str)),
        "seq_fold": ("sequence", folds),
    }
    title = "depthlens held-out layer-pruning curves"
    return model_dataset(model, data, checkpoint, dv, coords, metric="pruning_heldout", title=title, options=options)


def random_baselines(
    model: Any,
    data: EvalData,
    *,
    k_max: int | None = None,
    n_random: int = 20,
    protect: str = "ends",
    seed: int = 0,
    batch_size: int | None = None,
    checkpoint: Any = None,
    progress: Callable[[int, int], None] | None = None,
    journal: Path | None = None,
) -> xr.Dataset:
    """`n_random` random cuts per k, uniform over all L layers and stratified (uniform over the layers the
    `protect` policy lets a criterion remove), each scored on every eval window: `seq_loss` (baseline, k, draw,
    sequence), `removed` (baseline, k, draw, layer). journal: as for `heldout_curves` (the draws are seeded, so
    a rerun asks for the same cuts)."""
    L, N = model.n_layer, data.n_seq
    allowed = allowed_layers(L, protect)
    k_max = L // 2 if k_max is None else int(k_max)
    if not 1 <= k_max <= len(allowed) or n_random < 1:
        raise DepthlensError(f"need 1 <= k_max <= {len(allowed)} and n_random >= 1, got {k_max}, {n_random}")
    rng = np.random.default_rng(seed)
    K = k_max + 1
    seq_loss = np.full((2, K, n_random, N), np.nan)
    removed = np.zeros((2, K, n_random, L))
    with evaluating(model), torch.no_grad():
        pruner = _Pruner(model, data, batch_size, journal / "all.jsonl" if journal is not None else None)
        clean = pruner.seq_loss([])
        seq_loss[:, 0] = clean
        done, total = 0, 2 * k_max * n_random
        for b, pool in enumerate((list(range(L)), allowed)):
            for k in range(1, K):
                for r in range(n_random):
                    layers = sorted(rng.choice(pool, size=k, replace=False).tolist())
                    removed[b, k, r, layers] = 1
                    seq_loss[b, k, r] = pruner.seq_loss(layers)
                    done += 1
                    if progress is not None:
                        progress(done, total)
    options = dict(
        k_max=k_max,
        n_random=n_random,
        random_seed=seed,
        protect=protect,
        allowed_layers=allowed,
        loss="mean next-token NLL over positions 0..T-2 (nats/token), per sequence",
        layers_run=int(pruner.forward_layers),
    )
    dv = {
        "seq_loss": data_var(
            ("baseline", "k", "draw", "sequence"), seq_loss, "LM loss of the window with a random cut", "nats/token"
        ),
        "removed": data_var(("baseline", "k", "draw", "layer"), removed, "layers of the draw"),
        "clean_seq": data_var(("sequence",), clean, "LM loss of the whole model", "nats/token"),
    }
    coords = {"baseline": list(BASELINES), "k": np.arange(K), "draw": np.arange(n_random), "layer": np.arange(L)}
    title = "depthlens random layer-pruning baselines"
    return model_dataset(model, data, checkpoint, dv, coords, metric="pruning_random", title=title, options=options)


# ---------------------------------------------------------------------------------------------------------------
# reading the curves


def cut_key(ds: xr.Dataset, crit: str, k: int) -> tuple[tuple[int, ...], ...]:
    """The cut `crit` makes at k in each fold (layer tuples): two criteria with one key tie exactly."""
    return tuple(tuple(np.flatnonzero(ds["removed"].sel(fold=f, criterion=crit, k=k).values).tolist()) for f in (0, 1))


def _paired(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> dict[str, Any]:
    """a − b (per-window losses of the same windows) with its paired bootstrap interval (`stats.intervals`)."""
    from ..stats.intervals import bootstrap_counts, mean_interval, paired_difference

    n = len(a)
    if n < 2:
        return {"estimate": float(np.mean(a - b)), "low": None, "high": None, "method": INTERVAL_METHOD, "n_units": n}
    counts = bootstrap_counts(n, n_boot, seed)
    ia, ra = mean_interval(a, counts=counts)
    ib, rb = mean_interval(b, counts=counts)
    iv = paired_difference(ia.estimate, ib.estimate, ra, rb, bounds=(-np.inf, np.inf), n_units=n)
    return {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "method": INTERVAL_METHOD, "n_units": n}


def upper_bound(delta: np.ndarray, level: float = 0.95) -> float:
    """One-sided Student t upper bound of the mean of per-window Δloss: mean + t_{n−1, level} · sd / √n."""
    from scipy import stats

    d = np.asarray(delta, dtype=np.float64)
    if d.size < 2:
        return float("inf")
    return float(d.mean() + stats.t.ppf(level, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))


def summarize(ds: xr.Dataset, rnd: xr.Dataset | None = None, *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Every number of the held-out curves, pooled and per domain (JSON-ready).

    Per scope and k: each criterion's held-out loss (mean over the scope's windows); the best criterion (lowest
    loss) and the criteria tied with it (the same cut in both folds: identical losses); each criterion's
    difference to the best with its paired interval; the random baselines' mean loss (mean over draws, paired
    against the best too) and the min/max of the draws. `past_ln_v`: the criteria whose loss exceeds ln V at k.
    Summaries: mean excess loss (loss − clean) over k ≤ L/4 and over k < k_lnV (the first k at which any
    criterion's loss passes ln V; all k when none does); wins: at each k, every criterion tied for the lowest
    loss counts one (ties counted for each, and listed)."""
    crits = [str(c) for c in ds["criterion"].values]
    L = int(ds.sizes["layer"])
    V = int(ds.attrs.get("vocab_size", 0) or 0)
    ln_v = math.log(V) if V > 1 else float("inf")
    ks = [int(k) for k in ds["k"].values[1:]]
    dom = [str(d) for d in ds["domain"].values]
    scopes = {"pooled": np.arange(len(dom))} | {d: np.flatnonzero(np.array(dom) == d) for d in sorted(set(dom))}
    if len(scopes) == 2:  # one domain: it is the pooled scope
        scopes = {"pooled": scopes["pooled"]}
    seq = ds["seq_loss"].values  # (C, K, N)
    clean = ds["clean_seq"].values
    out: dict[str, Any] = {
        "criteria": crits,
        "k": ks,
        "ln_vocab": ln_v if np.isfinite(ln_v) else None,
        "quarter": L // 4,
        "interval_method": INTERVAL_METHOD,
        "folds": ds.attrs.get("folds"),
        "protect": ds.attrs.get("protect"),
        "n_sequences": {s: int(len(i)) for s, i in scopes.items()},
        "removed": {c: [[list(x) for x in cut_key(ds, c, k)] for k in ks] for c in crits},
        "scopes": {},
    }
    for name, ix in scopes.items():
        loss = {c: [float(np.mean(seq[ci, k, ix])) for k in ks] for ci, c in enumerate(crits)}
        rows: list[dict[str, Any]] = []
        for k in ks:
            vals = {c: loss[c][k - 1] for c in crits if np.isfinite(loss[c][k - 1])}
            if not vals:
                rows.append({"k": k, "best": None, "tied": [], "vs_best": {}, "past_ln_v": []})
                continue
            best = min(vals, key=lambda c: (vals[c], crits.index(c)))
            key = cut_key(ds, best, k)
            tied = [c for c in vals if cut_key(ds, c, k) == key]
            b = seq[crits.index(best), k, ix]
            vs = {c: _paired(seq[crits.index(c), k, ix], b, n_boot, seed) for c in vals if c != best}
            row: dict[str, Any] = {
                "k": k,
                "best": best,
                "tied": tied,
                "vs_best": vs,
                "past_ln_v": [c for c in vals if vals[c] > ln_v],
            }
            if rnd is not None and k < rnd.sizes["k"]:
                row["random"] = {}
                for bl in rnd["baseline"].values:
                    draws = rnd["seq_loss"].sel(baseline=bl, k=k).values[:, ix]  # (draw, n)
                    pooled = draws.mean(1)
                    row["random"][str(bl)] = {
                        "mean": float(pooled.mean()),
                        "min": float(pooled.min()),
                        "max": float(pooled.max()),
                        "vs_best": _paired(draws.mean(0), b, n_boot, seed),
                    }
            rows.append(row)
        first = next((r["k"] for r in rows if r["past_ln_v"]), None)
        upto = [k for k in ks if first is None or k < first]
        quarter = [k for k in ks if k <= L // 4]
        c0 = float(np.mean(clean[ix]))

        def excess(c: str, kk: list[int], loss: dict[str, list[float]] = loss, c0: float = c0) -> float | None:
            v = [loss[c][k - 1] - c0 for k in kk]
            return float(np.mean(v)) if v and all(np.isfinite(v)) else None

        wins = {c: sum(c in r["tied"] for r in rows) for c in crits}
        wins_quarter = {c: sum(c in r["tied"] for r in rows if r["k"] in quarter) for c in crits}
        summ: dict[str, Any] = {
            "clean_loss": c0,
            "loss": loss,
            "rows": rows,
            "first_k_past_ln_v": first,
            "k_quarter": quarter,
            "k_before_ln_v": upto,
            "mean_excess_quarter": {c: excess(c, quarter) for c in crits},
            "mean_excess_before_ln_v": {c: excess(c, upto) for c in crits},
            "wins": wins,
            "wins_quarter": wins_quarter,
            "ties": [{"k": r["k"], "tied": r["tied"]} for r in rows if len(r["tied"]) > 1],
        }
        if rnd is not None:
            summ["random_mean"] = {
                str(bl): [
                    float(rnd["seq_loss"].sel(baseline=bl, k=k).values[:, ix].mean()) for k in ks if k < rnd.sizes["k"]
                ]
                for bl in rnd["baseline"].values
            }
        q = {c: v for c, v in summ["mean_excess_quarter"].items() if v is not None}
        summ["winner_quarter"] = min(q, key=lambda c: (q[c], crits.index(c))) if q else None
        u = {c: v for c, v in summ["mean_excess_before_ln_v"].items() if v is not None}
        summ["winner_before_ln_v"] = min(u, key=lambda c: (u[c], crits.index(c))) if u else None
        out["scopes"][name] = summ
    return out


def prediction_error(ds: xr.Dataset) -> dict[str, Any]:
    """How well the pairwise model (fold f's δ and γ, measured on its calibration windows) predicts the measured
    held-out Δloss of every distinct cut of the curves (the other fold's windows): mean absolute error and
    Spearman rank correlation, for the pairwise and the additive-only prediction, over k ≤ L/4 and all k."""
    from scipy import stats

    L = int(ds.sizes["layer"])
    seq, clean, folds = ds["seq_loss"].values, ds["clean_seq"].values, ds["seq_fold"].values
    crits = [str(c) for c in ds["criterion"].values]
    rows: list[dict[str, Any]] = []
    for f in (0, 1):
        held = np.flatnonzero(folds == 1 - f)
        delta = {l: float(v) for l, v in enumerate(ds["single_delta"].values[f]) if np.isfinite(v)}
        g = ds["pair_gamma"].values[f]
        if not delta:
            continue
        gamma = {(i, j): float(g[i, j]) for i in range(L) for j in range(i + 1, L) if np.isfinite(g[i, j])}
        model = PairwiseModel(delta, gamma, sorted({i for p in gamma for i in p}))
        seen = set()
        for ci in range(len(crits)):
            for k in ds["k"].values[1:]:
                layers = tuple(np.flatnonzero(ds["removed"].values[f, ci, k]).tolist())
                if not layers or layers in seen or not set(layers) <= set(delta):
                    continue
                seen.add(layers)
                measured = float(np.mean(seq[ci, k, held] - clean[held]))
                rows.append(
                    {
                        "fold": f,
                        "k": int(k),
                        "layers": list(layers),
                        "measured": measured,
                        "pairwise": model.predict(layers),
                        "additive": model.predict(layers, additive=True),
                    }
                )

    def err(sel: list[dict[str, Any]]) -> dict[str, Any]:
        if len(sel) < 3:
            return {"n": len(sel)}
        m = np.array([r["measured"] for r in sel])
        res: dict[str, Any] = {"n": len(sel)}
        for kind in ("pairwise", "additive"):
            p = np.array([r[kind] for r in sel])
            res[kind] = {
                "mae": float(np.mean(np.abs(p - m))),
                "median_ae": float(np.median(np.abs(p - m))),
                "spearman": float(stats.spearmanr(p, m).statistic),
            }
        return res

    n_pairs = int(np.isfinite(ds["pair_gamma"].values).sum() // 2)  # both folds, each pair stored twice
    return {
        "n_pairs_measured": n_pairs,
        "definition": "Δloss(S) ≈ Σ δ_l + Σ γ_ij (pairs of the pool), δ and γ measured on the calibration fold; "
        "error against the measured held-out Δloss of every distinct cut of the curves",
        "quarter": err([r for r in rows if r["k"] <= L // 4]),
        "all": err(rows),
        "cuts": rows,
    }


# ---------------------------------------------------------------------------------------------------------------
# a certified cut: `depthlens prune`

SELECTION = (
    "fixed-sequence testing over k = 1, 2, ...: k passes when the bound is within the tolerance in every domain "
    "(and pooled) and every smaller k passed; the first failure stops the scan, so no multiplicity correction"
)


def certify(
    model: Any,
    data: EvalData,
    *,
    criterion: str,
    tolerance: float,
    domains: Sequence[str] | None = None,
    k_max: int | None = None,
    protect: str = "ends",
    n_pool: int = 6,
    level: float = 0.95,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    journal: Path | None = None,
) -> dict[str, Any]:
    """Choose layers on the calibration fold (fold 0 of `assign_folds`) with `criterion`, and return the largest
    k whose held-out (fold 1), paired, one-sided upper bound on the mean Δloss (`upper_bound`) is within
    `tolerance` nats/token in every domain and pooled (`SELECTION`), with the per-domain largest k, every
    step's numbers and the eval data's hashes. causal / permutation criteria compute their diagnostic on the
    calibration windows only. journal: a folder keeping every computed cut (`runtime/journal.py`), so a rerun
    after a stop, or with another tolerance or criterion, replays the cuts it shares; the result is the same."""
    if criterion not in CRITERIA:
        raise DepthlensError(f"unknown pruning criterion {criterion!r}; known: {', '.join(CRITERIA)}")
    if not (tolerance > 0 and math.isfinite(tolerance)):
        raise DepthlensError(f"the tolerance must be a finite number > 0 (nats/token), got {tolerance}")
    L, N = model.n_layer, data.n_seq
    allowed = allowed_layers(L, protect)
    k_max = len(allowed) if k_max is None else min(int(k_max), len(allowed))
    if domains is None:
        domains = window_domains(data, _tokenizer_of(model)) or ["all"] * N
    domains = [str(d) for d in domains]
    folds = assign_folds(domains)
    cal_idx, held_idx = np.flatnonzero(folds == 0), np.flatnonzero(folds == 1)
    held_dom = np.array(domains)[held_idx]
    scopes = {"pooled": np.arange(len(held_idx))}
    if len(set(held_dom)) > 1:
        scopes |= {d: np.flatnonzero(held_dom == d) for d in sorted(set(held_dom))}
    cal_data, held_data = subset(data, cal_idx), subset(data, held_idx)
    with evaluating(model), torch.no_grad():
        causal = permutation = None
        if criterion == "causal":
            from .causal.engine import causal_scores

            causal = causal_scores(model, cal_data, variants=("current",))
        if criterion == "permutation":
            from .permutation.engine import permutation_scores

            permutation = permutation_scores(model, cal_data, pairs="late")
        cal_pruner, held = (
            _Pruner(model, d, batch_size, journal / f"{name}.jsonl" if journal is not None else None)
            for name, d in (("calibration", cal_data), ("heldout", held_data))
        )
        cal = _Calibration(
            model,
            cal_data,
            np.arange(len(cal_idx)),
            cal_pruner,
            allowed,
            [criterion],
            angular_positions="all",
            causal=causal,
            permutation=permutation,
            n_pool=n_pool,
            batch_size=batch_size,
        )
        clean = held.seq_loss([])
        steps: list[dict[str, Any]] = []
        best = {s: 0 for s in scopes}
        alive = set(scopes)
        for k in range(1, k_max + 1):
            layers = cal.pick(criterion, k)
            if layers is None or not alive:
                break
            loss = held.seq_loss(layers)
            row: dict[str, Any] = {"k": k, "layers": layers, "scopes": {}}
            for s, ix in scopes.items():
                d = loss[ix] - clean[ix]
                ub = upper_bound(d, level)
                row["scopes"][s] = {
                    "loss": float(loss[ix].mean()),
                    "delta": float(d.mean()),
                    "upper_bound": ub,
                    "within": bool(ub <= tolerance),
                }
                if s in alive and ub <= tolerance:
                    best[s] = k
                else:
                    alive.discard(s)
            steps.append(row)
            if progress is not None:
                progress(k, k_max)
    chosen = min(best.values())
    final = steps[chosen - 1] if chosen else None
    return {
        "criterion": criterion,
        "tolerance": tolerance,
        "level": level,
        "k": chosen,
        "layers_removed": final["layers"] if final else [],
        "n_layer_before": L,
        "n_layer_after": L - chosen,
        "k_within_tolerance": best,
        "result": {
            s: {
                "n_sequences": int(len(ix)),
                "clean_loss": float(clean[ix].mean()),
                "pruned_loss": final["scopes"][s]["loss"] if final else float(clean[ix].mean()),
                "delta": final["scopes"][s]["delta"] if final else 0.0,
                "upper_bound": final["scopes"][s]["upper_bound"] if final else 0.0,
            }
            for s, ix in scopes.items()
        },
        "steps": steps,
        "method": {
            "bound": BOUND_METHOD,
            "selection": SELECTION,
            "split": "calibration = fold 0, held-out = fold 1 (" + FOLD_RULE.split("; ")[1] + ")",
            "protect": protect,
            "loss": "mean next-token NLL over positions 0..T-2 of each sequence, mean over sequences (nats/token)",
            "removal": "the layers taken out of the model (the diagnostics' block-level skip)",
        },
        "eval_data": {
            **{k: v for k, v in data.provenance().items() if k in ("eval_data", "eval_data_source", "eval_seed")},
            "n_seq": N,
            "seq_len": data.seq_len,
            "sha256": data.sha256,
            "domains": domains,
            "calibration_sequences": cal_idx.tolist(),
            "heldout_sequences": held_idx.tolist(),
            "calibration_sha256": cal_data.sha256,
            "heldout_sha256": held_data.sha256,
        },
    }


def merge_heldout(base: xr.Dataset, extra: xr.Dataset) -> xr.Dataset:
    """`base`'s held-out curves with the criteria of `extra` it lacks added (a criterion computed later, e.g.
    greedy after the cheap rankings). Both must be of the same weights, eval data, folds, domains, k and
    protect policy (else one line); `layers_run` is the sum of both runs."""
    for key in ("weights_sha256", "eval_data_sha256", "k_max", "protect", "folds"):
        if str(base.attrs.get(key)) != str(extra.attrs.get(key)):
            raise DepthlensError(
                f"held-out curves to merge differ in {key} ({base.attrs.get(key)} vs {extra.attrs.get(key)})"
            )
    if list(base["domain"].values) != list(extra["domain"].values) or not same_losses(
        base["clean_seq"].values, extra["clean_seq"].values, base.attrs.get("dtype")
    ):
        raise DepthlensError("held-out curves to merge differ in their windows' domains or clean losses")
    new = [str(c) for c in extra["criterion"].values if c not in base["criterion"].values]
    if not new:
        return base
    crits = [str(c) for c in base["criterion"].values] + new
    merged = {
        v: xr.concat([base[v], extra[v].sel(criterion=new)], "criterion").assign_coords(criterion=crits)
        for v in ("seq_loss", "removed", "calibration_loss")
    }
    out = base.drop_vars(["seq_loss", "removed", "calibration_loss", "criterion"]).assign(merged)
    for v in ("single_delta", "pair_gamma"):  # the later run's measurements where the first had none
        out[v] = base[v].fillna(extra[v])
    out.attrs = {
        **base.attrs,
        "criteria_json": json.dumps(crits),
        "layers_run": int(base.attrs.get("layers_run", 0)) + int(extra.attrs.get("layers_run", 0)),
        "criteria_added": ", ".join(new),
    }
    return out
