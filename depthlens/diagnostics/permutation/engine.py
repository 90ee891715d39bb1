"""Permutation score: swap layers i and j, measure the rise in LM loss (docs/concepts.md#permutation-score).

    P_abs(i, j) = L(π_ij) − L(id)   (nats)      P_rel = P_abs / L(id)
    P_KL(i, j)  = mean over tokens of KL(p_id ‖ p_π_ij)

L is the mean next-token CE over positions τ = 1..T−2 (BOS excluded), identical token sets for every swap
(paired design). `swap="body"` swaps the block bodies and keeps routing parameters at their depth;
`swap="all"` moves them too (`run_layers(order=..., swap=...)`).

How it is cheap: per batch, after one clean forward (the reference distribution), the clean trunk is walked
layer by layer and every pair (i, j) branches from the trunk state before layer i (blocks < i never rerun
for a swap; one clean state is held). Pairs sharing i can run together along the batch: at position i each
pair runs its own layer j; from there on, rows run the unswapped layer p except the pair whose j == p,
which runs layer i (at most two groups per position). Per-sequence ΔL is kept (dim `sequence`) for
paired standard errors and bootstrap CIs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from depthlens.diagnostics.vocab import LossAgainstReference, head_path
from depthlens.errors import DepthlensError
from depthlens.io.dataset import data_var, kept_var
from depthlens.io.jsonsafe import finite_or_none
from depthlens.models.protocol import LayeredLM
from depthlens.models.residual.base import RunContext, State, state_cat, state_select
from depthlens.runtime.distributed import merge, shard, world
from depthlens.runtime.evaldata import EvalData, default_rows, each_batch, model_dataset
from depthlens.runtime.progress import Count, ProgressFn
from depthlens.stats.metrics import late_pairs, late_window
from depthlens.stats.shares import PerSequence, paired_se

SWAPS = ("body", "all")
TRUNK_CACHE_BYTES = 1 << 30  # clean states before each first-swapped layer i kept from the reference pass


def resolve_pairs(L: int, pairs: str | Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """'late' (start ≤ i < j ≤ L−1, start = ⌊L/4⌋), 'all' (0 ≤ i < j ≤ L−1) or explicit pairs (sorted,
    deduplicated; diagonal pairs are dropped: P(i, i) = 0 by definition)."""
    if isinstance(pairs, str):
        if pairs not in ("late", "all"):
            raise DepthlensError(f"pairs must be 'late', 'all' or a list of (i, j), got {pairs!r}")
        return [(int(i), int(j)) for i, j in late_pairs(L, "quarter" if pairs == "late" else 0)]  # rows (i, j)
    out = set()
    for p in pairs:
        i, j = sorted(int(x) for x in p)
        if not 0 <= i <= j < L:
            raise DepthlensError(f"layer pair {tuple(p)} out of range [0, {L - 1}]")
        if i != j:
            out.add((i, j))
    return sorted(out)


def swapped_order(L: int, i: int, j: int) -> list[int]:
    """π_ij: order[p] = layer whose weights run at position p, with i and j exchanged."""
    order = list(range(L))
    order[i], order[j] = j, i
    return order


@torch.no_grad()
def _run_position(
    model: LayeredLM, state: State, ctx: RunContext, p: int, groups: list[tuple[torch.Tensor, list[int]]], swap: str
) -> State:
    """Run position p on row groups, each with its own order (a full permutation), and restore row order."""
    if len(groups) == 1:
        return model.run_layers(state, ctx, p, p + 1, order=groups[0][1], swap=swap)
    outs = [model.run_layers(state_select(state, idx), ctx, p, p + 1, order=order, swap=swap) for idx, order in groups]
    inv = torch.argsort(torch.cat([idx for idx, _ in groups]))
    return state_select(state_cat(outs), inv.to(next(iter(outs[0].values())).device))


@torch.no_grad()
def _run_pairs(model: LayeredLM, ctx: RunContext, cached: State, i: int, js: list[int], b: int, swap: str) -> State:
    """Rows: len(js) blocks of b sequences; block k runs π_{i, js[k]} from the cached state before layer i."""
    L = model.n_layer
    device = next(iter(cached.values())).device
    # position i: every pair runs its own layer j (a separate call per pair)
    state = state_cat([model.run_layers(cached, ctx, i, i + 1, order=swapped_order(L, i, j), swap=swap) for j in js])
    rows = torch.arange(len(js) * b, device=device).view(len(js), b)
    ident = list(range(L))
    for p in range(i + 1, L):
        if p in js:
            k = js.index(p)
            other = torch.cat([rows[:k], rows[k + 1 :]]).reshape(-1)
            groups = [(rows[k], swapped_order(L, i, p))] + ([(other, ident)] if other.numel() else [])
        else:
            groups = [(rows.reshape(-1), ident)]
        state = _run_position(model, state, ctx, p, groups, swap)
    return state


@torch.no_grad()
def permutation_scores(
    model: LayeredLM,
    data: EvalData,
    *,
    pairs: str | Sequence[tuple[int, int]] = "late",
    swap: str = "body",
    batch_size: int | None = None,
    seq_batch: int | None = None,
    chunked_head: bool = True,
    checkpoint: Any = None,
    progress: ProgressFn | None = None,
) -> xr.Dataset:
    """P_abs, P_rel, P_KL for the requested pairs (docs/concepts.md#permutation-score), symmetric [L, L] matrices with a zero diagonal.

    batch_size: max rows per forward (default: `default_rows`); seq_batch: sequences per clean pass.
    chunked_head: walk the LM head in vocabulary chunks when the model's head is one matmul (`vocab`); False
    forces whole (rows, V) logits (same numbers within float32 rounding; the reference path for tests).
    progress: called as (pairs done, total) over (pair, batch) units (`depthlens.runtime.progress`).
    Returns a Dataset; pairs not computed are NaN.
    """
    if swap not in SWAPS:
        raise DepthlensError(f"swap must be one of {SWAPS}, got {swap!r}")
    L, N, T = model.n_layer, data.n_seq, data.seq_len
    if T < 3:
        raise DepthlensError(f"permutation score needs seq_len >= 3 (a target after the BOS position), got {T}")
    P = resolve_pairs(L, pairs)
    by_i: dict[int, list[int]] = {}
    for i, j in P:
        by_i.setdefault(i, []).append(j)
    rows = batch_size or default_rows(data, model)
    # pairs differ in which layer runs at positions i and j, so their rows cannot share those calls: prefer many
    # sequences per call (b = all rows) and batch several pairs (sharing i) when there are fewer sequences
    # than rows, so every call carries about `rows` rows
    b_seq = seq_batch or max(1, min(rows, N))
    per_chunk = max(1, rows // b_seq)
    dl = np.full((L, L, N), np.nan)
    kl = np.full((L, L, N), np.nan)
    clean_loss = np.full(N, np.nan)
    batches, mine = _my_share(list(data.batches(b_seq)), by_i)
    count = Count(progress, len(batches) * sum(len(js) for js in mine.values()) if mine else 0)

    def run_batch(toks: torch.Tensor, seqs: slice) -> None:
        _batch(model, toks, seqs, mine, per_chunk, swap, dl, kl, clean_loss, chunked_head, count)

    each_batch(model, batches if mine else [], run_batch)
    dl, kl, clean_loss = _merge_ranks(dl, kl, clean_loss)
    for l in range(L):
        dl[l, l] = kl[l, l] = 0.0
    return _dataset(
        model,
        data,
        checkpoint,
        P,
        dl,
        kl,
        clean_loss,
        dict(
            pairs=[list(p) for p in P],
            pair_set=pairs if isinstance(pairs, str) else "explicit",
            swap=swap,
            batch_size=rows,
            seq_batch=b_seq,
            pairs_per_chunk=per_chunk,
            head_path=head_path(model, chunked_head),
            late_window_start=late_window(L),
            loss_positions="tau in [1, T-2] predicting token tau+1",
            kl_direction="KL(p_id || p_swapped)",
        ),
    )


def _my_share(
    batches: list[tuple[int, torch.Tensor]], by_i: dict[int, list[int]]
) -> tuple[list[tuple[int, torch.Tensor]], dict[int, list[int]]]:
    """This process's (sequence batches, pairs by i) under torchrun: the sequence batches split over ranks when
    there are enough of them, otherwise the pairs (round-robin over the sorted pairs). One process: all."""
    rank, n = world()
    if n == 1:
        return batches, by_i
    if len(batches) >= n:
        return shard(batches, rank, n), by_i
    mine: dict[int, list[int]] = {}
    for i, j in shard([(a, b) for a in sorted(by_i) for b in by_i[a]], rank, n):
        mine.setdefault(i, []).append(j)
    return batches, mine


def _merge_ranks(dl: np.ndarray, kl: np.ndarray, clean_loss: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's (dl, kl, clean_loss) merged by fmax over NaN (each cell computed by one rank, or by every
    rank identically for clean_loss). One process: unchanged."""
    m = merge({"dl": dl, "kl": kl, "clean_loss": clean_loss}, {"dl": "fmax", "kl": "fmax", "clean_loss": "fmax"})
    return m["dl"], m["kl"], m["clean_loss"]


@torch.no_grad()
def _batch(
    model: LayeredLM,
    toks: torch.Tensor,
    seqs: slice,
    by_i: dict[int, list[int]],
    per_chunk: int,
    swap: str,
    dl: np.ndarray,
    kl: np.ndarray,
    clean_loss: np.ndarray,
    chunked: bool | None,
    count: Count,
) -> None:
    """Every pair on one batch of sequences. Fills dl/kl [i, j, seqs] (both triangles).

    Runs cover toks[:, :T−1]: the last token is only a target, and by causality no loss position depends on
    it. One clean forward gives the reference distribution and, on the way, the clean state before every i
    that starts a pair; each pair (i, j) branches from that state. When those states would exceed
    TRUNK_CACHE_BYTES, only one is held and the clean trunk is walked a second time instead (one extra
    partial pass). Losses and KLs come from `vocab.LossAgainstReference` (the head walked in vocabulary
    chunks when it is one matmul).
    """
    b, T = toks.shape
    x = toks[:, :-1]  # (b, T−1)
    ctx = model.context(T - 1, device=toks.device)
    loss = LossAgainstReference(model, ctx, toks, chunked=chunked)
    starts = sorted(by_i)
    state = model.embed(x, ctx)
    cache_all = len(starts) * sum(v.numel() * v.element_size() for v in state.values()) <= TRUNK_CACHE_BYTES
    cached: dict[int, State] = {}
    at = 0
    for i in starts if cache_all else []:
        state, at = model.run_layers(state, ctx, at, i), i
        cached[i] = state
    nll0 = loss.reference(model.run_layers(state, ctx, at))  # (b, T−2)
    clean_loss[seqs] = nll0.mean(-1).double().cpu().numpy()
    trunk, at = model.embed(x, ctx), 0
    for i in starts:
        if cache_all:
            trunk = cached.pop(i)
        else:
            trunk, at = model.run_layers(trunk, ctx, at, i), i
        js = by_i[i]
        for c in range(0, len(js), per_chunk):
            chunk = js[c : c + per_chunk]
            nll, kl_tok = loss(_run_pairs(model, ctx, trunk, i, chunk, b, swap))  # (len(chunk)·b, T−2) each
            d_seq = (nll.view(len(chunk), b, -1) - nll0).mean(-1).double().cpu().numpy()  # (pairs, b)
            kl_seq = kl_tok.view(len(chunk), b, -1).mean(-1).double().cpu().numpy()
            for k, j in enumerate(chunk):
                dl[i, j, seqs] = dl[j, i, seqs] = d_seq[k]
                kl[i, j, seqs] = kl[j, i, seqs] = kl_seq[k]
            count.add(len(chunk))


def _dataset(
    model: LayeredLM,
    data: EvalData,
    checkpoint: Any,
    P: list[tuple[int, int]],
    dl: np.ndarray,
    kl: np.ndarray,
    clean_loss: np.ndarray,
    options: dict[str, Any],
) -> xr.Dataset:
    L = model.n_layer
    LL = ("layer", "layer_other")
    base = float(clean_loss.mean())
    abs_ = dl.mean(-1)
    se = np.full((L, L), np.nan)
    for i, j in P:
        se[i, j] = se[j, i] = paired_se(dl[i, j])
    dv = {
        "perm_abs": data_var(LL, abs_, "loss increase when layers i and j are swapped", "nat"),
        "perm_rel": data_var(LL, abs_ / base, "relative loss increase when layers i and j are swapped"),
        "perm_kl": data_var(LL, kl.mean(-1), "KL(p_id || p_swapped) when layers i and j are swapped", "nat"),
        "perm_abs_se": data_var(LL, se, "paired standard error of the swap loss increase", "nat"),
        "delta_loss_seq": data_var((*LL, "sequence"), dl, "per-sequence loss increase of the swap", "nat"),
        "kl_seq": data_var((*LL, "sequence"), kl, "per-sequence mean KL(p_id || p_swapped)", "nat"),
        "clean_loss_seq": data_var(("sequence",), clean_loss, "per-sequence clean next-token loss", "nat"),
        "clean_loss": data_var((), base, "clean next-token loss", "nat"),
    }
    coords = {"layer": np.arange(L), "layer_other": np.arange(L), "sequence": np.arange(data.n_seq)}
    title = "depthlens permutation score (swap layers i and j)"
    axis_names = {"layer": "swapped layer i", "layer_other": "swapped layer j"}
    return model_dataset(
        model, data, checkpoint, dv, coords, metric="permutation", title=title, options=options, coord_names=axis_names
    )


# ---------------------------------------------------------------------------------------------------------------
# its report row and `track` variables (registry hooks; the headline share itself is the generic summary's)


def permutation_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """The eval loss from the identity order, where the causal engine did not give it."""
    if row.get("eval_loss") is None and "clean_loss" in ds:
        return {"eval_loss": finite_or_none(ds["clean_loss"].values)}
    return {}


def permutation_track(ds: xr.Dataset, opts: Any) -> dict[str, xr.DataArray]:
    """Besides the headline share: P_abs under its full name."""
    return {"perm_abs": kept_var(ds["perm_abs"], "loss increase when layers i and j swap (P_abs)", "nat")}


def describe_headline(
    score: Any, *, variant: str | None, aggregator: str | None, norm: str | None, swap: str | None
) -> str:
    """`Score.describe` of P_abs, P_rel and P_KL: 'permutation P_abs = L(swap i,j) - L(id), nats, swap=body'."""
    line: str = score.definition
    return line + (f", swap={swap}" if swap else "")


def headline_fields(ds: xr.Dataset, metric: str, variant: str) -> dict[str, Any]:
    """`Score.headline_fields` of P_abs, P_rel and P_KL: the norm in the score's name (abs, rel, kl), and the
    identity-order loss L(id) when the Dataset has it."""
    out: dict[str, Any] = {"norm": metric.removeprefix("perm_")}
    if "clean_loss" in ds:
        out["clean_loss"] = float(ds["clean_loss"].values)
    return out


def perm_rel_per_sequence(ds: xr.Dataset, aggregator: str, variant: str) -> PerSequence:
    """P_rel = P_abs / L(id) as per-sequence parts (`Score.per_sequence`): Σc·ΔL / Σc·L(id)."""
    if "delta_loss_seq" not in ds or "clean_loss_seq" not in ds:
        raise DepthlensError("P_rel's interval needs delta_loss_seq and clean_loss_seq")
    num = np.asarray(ds["delta_loss_seq"].values)
    return PerSequence("ratio", num=num, den=np.broadcast_to(ds["clean_loss_seq"].values[None, None, :], num.shape))


def regrow(ds: xr.Dataset, parts: Sequence[xr.Dataset]) -> list[str]:
    """`Hooks.regrow` of the permutation scores (--precision): in `ds`, concatenated over the sequences of
    `parts`, every aggregate re-derived from the per-sequence variables (P_abs, P_rel, P_KL are sequence means,
    perm_abs_se their standard error, clean_loss the mean clean loss). It rebuilds them all: returns []."""
    n = ds.sizes["sequence"]
    clean = float(ds["clean_loss_seq"].mean("sequence"))
    ds["clean_loss"] = ((), clean, ds["clean_loss"].attrs)
    dl = ds["delta_loss_seq"]
    for v, val in (
        ("perm_abs", dl.mean("sequence")),
        ("perm_rel", dl.mean("sequence") / clean),
        ("perm_kl", ds["kl_seq"].mean("sequence")),
        ("perm_abs_se", dl.std("sequence", ddof=1) / math.sqrt(n)),
    ):
        if v in ds:
            old = ds[v].values
            ds[v] = (ds[v].dims, np.where(np.isnan(old), np.nan, val.transpose(*ds[v].dims).values), ds[v].attrs)
    return []
