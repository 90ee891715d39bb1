"""Causal score: skip layer s, measure how much every later layer's update changes (Csordás et al. 2025;
docs/concepts.md#causal-score).

    C(s, t) = AGG_{(b,τ) ∈ F}  ‖u_t^{do(skip s on I)}(b,τ) − u_t(b,τ)‖ / max(‖n_t(b,τ)‖, ε)

u_t is the update that `run_layers` hands to `on_layer` (norm over `design.update_norm_dims()` trailing
dims), the skip is the design's own `keep` mask (docs/concepts.md#notation). The denominator n_t is a named option
`norm`:
`update` (default, Csordás' test_effect) n_t = u_t, the clean update itself; `resid` n_t = h_t, the clean
residual state entering layer t (the design's residual view; all n streams, Frobenius, for HC/mHC), i.e. the
change of what layer t writes relative to the stream it writes into. Variants: `current` I = F = [1, T);
`future` I = [1, c), F = [c, T) for K cut positions c per sequence (Csordás: one random.Random(123) per run;
each sequence, in eval order, reshuffles range(8, T−4, 8) and takes the first K = 4; docs/concepts.md#causal-score).
Aggregators max | mean | p95 | p99 | pooled come from one pass.

How it is cheap (docs/performance.md#what-the-engine-does), per batch of b sequences:
  1. the clean prefix (layers < min s) runs once;
  2. interventions ("arms" = (variant, s, cut)) run in chunks along the batch, as a staircase: the rows of
     arm s join when the chunk reaches layer s, copied from the clean state there, so blocks < s never
     rerun (prefix reuse). The first chunk also carries the b clean rows (the trunk), which leave behind
     the clean updates u_t and the clean states later chunks branch from;
  3. each layer's intervened update is reduced at once to per-token ratios (never L²·T·d in memory).
Memory: rows per forward ≤ batch_size, plus the clean updates u_t (t ≥ min s) and branch states of b
sequences.
Companions from the same runs, when asked (`outputs=True`: they put the LM head on every arm): output effect
O[s] = max ‖p' − p‖₂, layer-skip loss ΔL_skip(s) (nats). Always: the null-intervention noise floor (an arm
that skips nothing, through the same batched path). The direct effect C_dir (docs/concepts.md#causal-score) feeds each
later layer its clean input minus the clean u_s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
import xarray as xr

from depthlens.diagnostics.causal.arms import (  # noqa: F401  (Arm, _CellStore, the cut tables: re-exported)
    Arm,
    _CellStore,
    _nanmax,
    future_cut_table,
    future_cuts,
    make_arms,
)
from depthlens.diagnostics.causal.dataset import (  # noqa: F401  (AGGREGATORS: re-exported)
    AGGREGATORS,
    _dataset,
    _Results,
)
from depthlens.errors import DepthlensError
from depthlens.models.protocol import LayeredLM
from depthlens.models.residual.base import RunContext, State, state_cat, state_repeat
from depthlens.runtime.distributed import merge, shard, world
from depthlens.runtime.evaldata import EvalData, default_rows, each_batch, model_device
from depthlens.runtime.progress import Count, ProgressFn
from depthlens.stats.metrics import late_window, loss_log_probs, loss_logits

VARIANTS = ("current", "future")
UNITS = ("block", "attn", "mlp")
NORMS = ("update", "resid")
NORM_DEFINITIONS = {
    "update": "|u_t' - u_t| / max(|u_t|, eps): relative to the clean update of layer t (Csordas test_effect)",
    "resid": "|u_t' - u_t| / max(|h_t|, eps): relative to the clean residual state entering layer t "
    "(design view; Frobenius over all streams for HC/mHC)",
}
EPS = 1e-6
_T = TypeVar("_T")


# ---------------------------------------------------------------------------------------------------------------
# shared helpers (permutation.py uses them too)


def resolve_layers(L: int, layers: str | Sequence[int]) -> list[int]:
    """'all' → 0..L−1, 'late' → ⌊L/4⌋..L−1 (docs/concepts.md#late-window), or an explicit list of layer indices."""
    if isinstance(layers, str):
        if layers == "all":
            return list(range(L))
        if layers == "late":
            return list(range(late_window(L), L))
        raise DepthlensError(f"layers must be 'all', 'late' or a list of layer indices, got {layers!r}")
    out = sorted({int(l) for l in layers})
    bad = [l for l in out if not 0 <= l < L]
    if bad or not out:
        raise DepthlensError(f"layer indices must be in [0, {L - 1}], got {list(layers)}")
    return out


def token_nll(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token NLL (nats) at positions τ = 1..T−2 (BOS position excluded): (B, T−2) float32."""
    return -loss_log_probs(logits).gather(-1, tokens[:, 2:, None]).squeeze(-1)


def _flat_update(u: torch.Tensor, ndims: int) -> torch.Tensor:
    """(rows, T, *D) → (rows, T, prod D) float32; the norm of u_l runs over its last `ndims` dims."""
    return u.float().flatten(start_dim=u.dim() - ndims) if ndims > 1 else u.float()


def residual_sq(model: LayeredLM, state: State) -> torch.Tensor:
    """‖h‖² per token (B, T) float32 of a between-layer state: the residual view, or all n streams (HC/mHC)."""
    design = model.design
    x: torch.Tensor = (
        design.streams(state).flatten(-2) if getattr(design, "multi_stream", False) else design.view(state)
    )
    return x.float().square().sum(-1)


def skip_mode(model: LayeredLM) -> str:
    """How the design implements do(skip s) on I (docs/concepts.md#notation), recorded with every result."""
    cfg = getattr(model, "config", None)
    slug = getattr(model.design, "slug", "?")
    if getattr(model.design, "multi_stream", False):
        return f"{slug}: multistream_skip={getattr(cfg, 'multistream_skip', '?')}"
    from depthlens.designs import DESIGNS, has_capability

    if has_capability(slug, "depth_softmax"):
        return f"{slug}: attnres_skip={getattr(cfg, 'attnres_skip', '?')}"

    if slug in DESIGNS and DESIGNS[slug].group != "baseline" and DESIGNS[slug].group != "norm":
        return f"{slug}: the design's keep mask"
    return f"{slug}: h_(s+1) := h_s on I (Csordas merge_io)"


# ---------------------------------------------------------------------------------------------------------------
# the engine


@dataclass
class _Clean:
    """Clean-run products for one batch of b sequences, filled by the trunk rows of the first chunk."""

    need_states: set[int]  # layers p whose clean input state later chunks (or C_dir) spawn from
    states: dict[int, State] = field(default_factory=dict)  # state before layer p (batch of b)
    updates: dict[int, torch.Tensor] = field(default_factory=dict)  # u_p (b, T, D) float32, flattened dims
    den_sq: dict[int, torch.Tensor] = field(default_factory=dict)  # ‖n_p‖² per token (b, T): the denominator
    norm: str = "update"  # which clean norm the ratios divide by (NORMS)
    final: State | None = None  # state after the last layer
    probs: torch.Tensor | None = None  # (b, T, V) float32
    nll: torch.Tensor | None = None  # (b, T−2)


def _keep_rows(arms: list[Arm], seqs: slice) -> torch.Tensor:
    """(len(arms)·b, T) keep mask of the b sequences `seqs`, arm-major (matches state_repeat's block order)."""
    k = torch.stack([a.keep(seqs) for a in arms])  # (A, b, T)
    return k.reshape(-1, k.shape[-1])


@torch.no_grad()
def _run_chunk(
    model: LayeredLM,
    ctx: RunContext,
    clean: _Clean,
    arms: list[Arm],
    seqs: slice,
    unit: str,
    ndims: int,
    on_update: Callable[[int, list[Arm], torch.Tensor], None],
    trunk: State | None = None,
    start: int | None = None,
) -> tuple[State | None, list[Arm]]:
    """Staircase over the chunk's arms (sorted by s): the rows of arm a join at layer a.s as a copy of the
    clean state before a.s, so layers below a.s never rerun for it.

    With `trunk` (the clean state before layer `start`), the clean rows ride along as the first b rows
    (docs/performance.md#what-the-engine-does: the clean branch plus one branch per skipped s) and fill `clean` on the
    way: the states later chunks
    spawn from, the clean updates u_p the ratios compare to, and the final state. Returns the arms' final
    state (None without arms) and the arms.
    """
    L = model.n_layer
    b = seqs.stop - seqs.start
    nc = 0 if trunk is None else b
    state: State | None = trunk
    active: list[Arm] = []
    first = arms[0].s if trunk is None else start
    assert first is not None  # `start` comes with `trunk`
    for p in range(first, L):
        if trunk is not None and p in clean.need_states:
            assert state is not None  # with `trunk`, state is the trunk rows' state from the start
            clean.states[p] = {k: v[:b].clone() for k, v in state.items()}  # a copy: outlives the batched rows
        new = [a for a in arms if a.s == p]
        keep = None
        if new:
            if trunk is None:
                src = clean.states[p]
            else:
                assert state is not None  # with `trunk`, state is the trunk rows' state from the start
                src = {k: v[:b] for k, v in state.items()}
            spawn = state_repeat(src, len(new))
            keep_new = _keep_rows(new, seqs).to(ctx.cos.device)
            if state is None:
                state, keep = spawn, keep_new
            else:
                keep = torch.cat(
                    [
                        torch.ones(nc + len(active) * b, keep_new.shape[1], dtype=torch.bool, device=keep_new.device),
                        keep_new,
                    ]
                )
                state = state_cat([state, spawn])
            active = active + new
        assert state is not None  # `trunk`, or the spawn of the first arm (arms are sorted by s)
        if trunk is not None and clean.norm == "resid":
            clean.den_sq[p] = residual_sq(model, {k: v[:b] for k, v in state.items()})
        got: list[torch.Tensor] = []
        state = model.run_layers(
            state,
            ctx,
            p,
            p + 1,
            keep={p: keep} if keep is not None else None,
            unit=unit,
            on_layer=lambda pos, s, u: got.append(u),  # noqa: B023 (runs in this step)
        )
        if trunk is not None:
            clean.updates[p] = _flat_update(got[0][:b], ndims).clone()  # a copy, not a view of all rows
            if clean.norm == "update":
                clean.den_sq[p] = clean.updates[p].square().sum(-1)
        if active:
            on_update(p, active, got[0][nc:])
    if trunk is not None:
        assert state is not None  # with `trunk`, state is the trunk rows' state from the start
        clean.final = {k: v[:b] for k, v in state.items()}
        state = {k: v[b:] for k, v in state.items()} if active else None
    return state, active


def _split(xs: list[_T], n: int) -> list[list[_T]]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]


def _arm_chunks(arms: list[Arm], per_chunk: int) -> list[list[Arm]]:
    """Consecutive arms (sorted by s); the first chunk also carries the b clean rows, so it takes one arm less
    (none when a chunk holds a single arm: the clean rows then run alone, as a plain clean pass)."""
    first = per_chunk - 1
    return [arms[:first]] + _split(arms[first:], per_chunk)


def _subtract_update(state: State, u: torch.Tensor, positions: torch.Tensor) -> State:
    """state − u_s on `positions` (docs/concepts.md#causal-score), for designs whose state is one tensor shaped like
    the update.

    u: the flattened update (b, T, D); positions: (b, T) bool.
    """
    key, x = next(iter(state.items()))
    if len(state) != 1 or x.numel() != u.numel():
        raise NotImplementedError(
            f"C_dir needs a state that is one tensor shaped like the update (state keys {sorted(state)})"
        )
    u = u.view(x.shape).to(x.device, x.dtype)  # u_s lives on layer s's device, the state on layer t's
    m = positions.view(*positions.shape, *([1] * (u.dim() - 2))).to(x.device, x.dtype)
    return {key: x - u * m}


@torch.no_grad()
def _direct_unsupported(model: LayeredLM) -> str | None:
    """None if C_dir applies to the design (its state is one tensor shaped like the update), else why not."""
    device = model_device(model)
    ctx = model.context(2, device=device)
    state = model.embed(torch.zeros(1, 2, dtype=torch.long, device=device), ctx)
    got: list[torch.Tensor] = []
    model.run_layers(state, ctx, 0, 1, on_layer=lambda p, s, u: got.append(u))
    if len(state) == 1 and next(iter(state.values())).shape == got[0].shape:
        return None
    return f"direct effect not computed: the state ({sorted(state)}) is not one tensor shaped like the update"


@torch.no_grad()
def causal_scores(
    model: LayeredLM,
    data: EvalData,
    *,
    variants: Sequence[str] = VARIANTS,
    layers: str | Sequence[int] = "all",
    unit: str = "block",
    norm: str = "update",
    n_cuts: int = 4,
    cut_seed: int = 123,
    first_seq: int = 0,
    eps: float = EPS,
    direct: bool = False,
    null: bool = True,
    outputs: bool = False,
    measure: bool = True,
    batch_size: int | None = None,
    seq_batch: int | None = None,
    checkpoint: Any = None,
    progress: ProgressFn | None = None,
) -> xr.Dataset:
    """Causal-score matrices C(s, t) (docs/concepts.md#causal-score), with O[s], ΔL_skip(s), the noise floor and C_dir.

    layers: which s to skip ('all', 'late' or a list). norm: the ratio's denominator, 'update' (‖u_t‖, default)
    or 'resid' (‖h_t‖, the clean residual state entering layer t); see NORM_DEFINITIONS. batch_size: max rows in one forward (memory knob;
    default ≈ 4096 tokens); seq_batch: sequences per clean pass (default: batch_size // min(arms, 4)).
    outputs=True adds the companions O[s] and ΔL_skip(s) (and the clean loss): one LM-head pass per skipped
    layer, a (rows, V) softmax each, about a third of the default run's cost on a 49K-vocabulary model, so
    they are computed only when asked. measure=False skips the update ratios (only O and ΔL_skip).
    first_seq: the index of data's first sequence in a larger eval set this run is a part of (the `future` cuts
    continue that set's cut sequence, so parts concatenated equal one run over the set: studies/precision.py).
    progress: called as (skip runs done, total), a skip run = one arm (skipped layer, variant, cut) on one batch.
    Returns a Dataset; see `_dataset` for the variables.
    """
    for v in variants:
        if v not in VARIANTS:
            raise DepthlensError(f"variant must be one of {VARIANTS}, got {v!r}")
    if unit not in UNITS:
        raise DepthlensError(f"unit must be one of {UNITS}, got {unit!r}")
    if norm not in NORMS:
        raise DepthlensError(f"norm must be one of {NORMS}, got {norm!r}")
    if not variants:
        raise DepthlensError("need at least one variant")
    if not (measure or outputs):
        raise DepthlensError("nothing to compute: measure=False needs outputs=True (O[s] and ΔL_skip)")
    L, N, T = model.n_layer, data.n_seq, data.seq_len
    if T < 2:
        raise DepthlensError(f"causal score needs seq_len >= 2 (position 0 is never intervened on), got {T}")
    S = resolve_layers(L, layers)
    ndims = int(model.design.update_norm_dims())
    arms, cuts = make_arms(T, N, S, variants, n_cuts, cut_seed, null and measure, first_seq=first_seq)
    rows = batch_size or default_rows(data, model)
    per_chunk = max(1, min(len([a for a in arms if a.variant == variants[0]]), 4, rows))
    b_seq = seq_batch or max(1, min(N, rows // per_chunk))  # few sequences: more arms per chunk instead
    per_chunk = max(1, rows // b_seq)
    K = {v: cuts[v].shape[1] for v in variants}  # cut slots per sequence
    direct_note = _direct_unsupported(model) if direct and measure else None
    res = _Results(
        store={v: _CellStore(S, L, N, K[v], T) for v in variants} if measure else {},
        null_store={v: _CellStore(S[:1], L, N, K[v], T) for v in variants} if measure and null else {},
        dstore={v: _CellStore(S, L, N, K[v], T, t_min_offset=1) for v in variants}
        if direct and measure and direct_note is None
        else {},
        O={v: np.full((L, N), np.nan) for v in variants},
        dloss=np.full((L, N), np.nan),
        clean_loss=np.full(N, np.nan),
    )
    batches, mine = _my_share(list(data.batches(b_seq)), arms, S)
    own_layers = sorted({a.s for a in mine})
    count = Count(progress, len(batches) * sum(not a.null for a in mine) if mine else 0)

    def run_batch(toks: torch.Tensor, seqs: slice) -> None:
        _batch(model, toks, seqs, own_layers, mine, unit, norm, eps, per_chunk, outputs, measure, res, count)

    each_batch(model, batches if mine else [], run_batch)
    _merge_ranks(res)
    return _dataset(
        model,
        data,
        checkpoint,
        S,
        variants,
        cuts,
        res,
        dict(
            variants=list(variants),
            layers=S,
            unit=unit,
            norm=norm,
            norm_definition=NORM_DEFINITIONS[norm],
            n_cuts=n_cuts,
            cut_seed=cut_seed,
            eps=eps,
            direct=direct,
            null=null,
            outputs=outputs,
            measure=measure,
            batch_size=rows,
            seq_batch=b_seq,
            arms_per_chunk=per_chunk,
            skip_mode=skip_mode(model),
            update_norm_dims=ndims,
            direct_note=direct_note,
        ),
    )


def _my_share(
    batches: list[tuple[int, torch.Tensor]], arms: list[Arm], S: list[int]
) -> tuple[list[tuple[int, torch.Tensor]], list[Arm]]:
    """This process's (sequence batches, arms) under torchrun (depthlens.runtime.distributed): the sequence
    batches split over ranks when there are enough of them, otherwise the skipped layers (round-robin). One
    process: everything."""
    rank, n = world()
    if n == 1:
        return batches, arms
    if len(batches) >= n:
        return shard(batches, rank, n), arms
    own = set(shard(S, rank, n))
    return batches, [a for a in arms if a.s in own]


def _merge_ranks(res: _Results) -> None:
    """Merge every rank's results in place (each cell was computed by one rank): ratios, O, ΔL, losses by
    fmax over NaN, the pooled sums by addition. A no-op in one process."""
    if world()[1] == 1:
        return
    arrays: dict[str, np.ndarray] = {"dloss": res.dloss, "clean_loss": res.clean_loss}
    how = {"dloss": "fmax", "clean_loss": "fmax"}
    for v, o in res.O.items():
        arrays[f"O/{v}"], how[f"O/{v}"] = o, "fmax"
    for name in ("store", "null_store", "dstore"):
        for v, st in getattr(res, name).items():
            for f, h in (("R", "fmax"), ("num", "sum"), ("den", "sum")):
                arrays[f"{name}/{v}/{f}"], how[f"{name}/{v}/{f}"] = getattr(st, f), h
    merged = merge(arrays, how)
    res.dloss[...], res.clean_loss[...] = merged["dloss"], merged["clean_loss"]
    for v in res.O:
        res.O[v][...] = merged[f"O/{v}"]
    for name in ("store", "null_store", "dstore"):
        for v, st in getattr(res, name).items():
            for f in ("R", "num", "den"):
                getattr(st, f)[...] = merged[f"{name}/{v}/{f}"]


@torch.no_grad()
def _batch(
    model: LayeredLM,
    toks: torch.Tensor,
    seqs: slice,
    S: list[int],
    arms: list[Arm],
    unit: str,
    norm: str,
    eps: float,
    per_chunk: int,
    outputs: bool,
    measure: bool,
    res: _Results,
    count: Count,
) -> None:
    """All arms on one batch of sequences: clean run, staircase chunks, companions; results go to `res`."""
    L, (b, T) = model.n_layer, toks.shape
    ndims = int(model.design.update_norm_dims())
    ctx = model.context(T, device=toks.device)
    chunks = _arm_chunks(arms, per_chunk)
    # clean states are kept only where a later chunk (or C_dir, at every layer) branches off the trunk
    later = {a.s for chunk in chunks[1:] for a in chunk}
    clean = _Clean(need_states=set(range(S[0], L)) if res.dstore else later, norm=norm)
    trunk: State | None = model.run_layers(
        model.embed(toks, ctx), ctx, 0, S[0]
    )  # the clean prefix, shared by every arm

    def on_update(p: int, active: list[Arm], u: torch.Tensor) -> None:
        if not measure:
            return
        U = _flat_update(u, ndims).view(len(active), b, T, -1)
        diff_sq = (U - clean.updates[p]).square().sum(-1)  # (arms, b, T)
        den_sq = clean.den_sq[p].to(diff_sq.device)  # norm=resid: the state's device (a placed model's layers differ)
        ratio = (diff_sq.sqrt() / den_sq.sqrt().clamp_min(eps)).cpu().numpy()
        diff_np, clean_sq = diff_sq.double().cpu().numpy(), den_sq.double().cpu().numpy()
        for (null, variant), idx in _groups(active).items():
            (res.null_store if null else res.store)[variant].add(
                [active[i] for i in idx], p, seqs, ratio[idx], diff_np[idx], clean_sq
            )

    for k, chunk in enumerate(chunks):
        if not chunk and k > 0:
            continue
        state, active = _run_chunk(
            model, ctx, clean, chunk, seqs, unit, ndims, on_update, trunk=trunk if k == 0 else None, start=S[0]
        )
        if k == 0:
            trunk = None
            # the clean loss always (one head call per batch: the report's and track's eval loss); the clean
            # distribution only for the companions
            assert clean.final is not None  # the first chunk ran the trunk, which sets it
            probs: torch.Tensor | None
            probs, clean.nll = _probs_nll(model.head(clean.final, ctx), toks)
            clean.probs = probs if outputs else None
            if T > 2:
                res.clean_loss[seqs] = clean.nll.mean(-1).double().cpu().numpy()
            clean.final = probs = None
        if outputs and active:
            assert state is not None  # the arms' rows
            _outputs(model, ctx, state, active, b, toks, clean, seqs, res.O, res.dloss)
        del state
        count.add(sum(not a.null for a in chunk))
    if res.dstore:
        _direct(model, ctx, clean, [a for a in arms if not a.null], b, seqs, per_chunk, res.dstore, eps)


def _groups(arms: list[Arm]) -> dict[tuple[bool, str], list[int]]:
    """Arm indices grouped by (null, variant): each group goes to one store."""
    out: dict[tuple[bool, str], list[int]] = {}
    for i, a in enumerate(arms):
        out.setdefault((a.null, a.variant), []).append(i)
    return out


def _probs_nll(logits: torch.Tensor, toks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p (b, T, V), next-token NLL (b, T−2)) from logits (b, T, V), consumed in place (fp32 logits).

    softmax's own steps (m = max z, e = exp(z − m), p = e / Σe) with the NLL read off the same pass,
    −log p[target] = log Σe − (z[target] − m), instead of a second log-softmax over the vocabulary. The clean
    run and every arm go through this function, so identical logits give identical outputs (O = ΔL = 0).
    """
    z = logits.float()
    m = z.amax(-1, keepdim=True)  # (b, T, 1)
    zt = loss_logits(z).gather(-1, toks[:, 2:, None].to(z.device)).squeeze(-1)  # (b, T−2), before z is consumed
    e = z.sub_(m).exp_()
    se = e.sum(-1, keepdim=True)
    nll = se[:, 1:-1, 0].log() - (zt - m[:, 1:-1, 0])  # the same loss positions τ = 1..T−2
    return e.div_(se), nll


def _outputs(
    model: LayeredLM,
    ctx: RunContext,
    state: State,
    active: list[Arm],
    b: int,
    toks: torch.Tensor,
    clean: _Clean,
    seqs: slice,
    O: dict[str, np.ndarray],
    dloss: np.ndarray,
) -> None:
    """O[s] = max over F of ‖p' − p‖₂ and ΔL_skip(s) (current variant) for the chunk's arms.

    One head call per arm (b rows, the size of the clean pass's head call, so the (rows, T, V) logits never
    exceed one plain forward's), none for the null arm (it has no output effect). The vocabulary work is done
    in place on the logits (`_probs_nll`), then p' − p and its norm.
    """
    assert clean.nll is not None and clean.probs is not None  # the first chunk set them (outputs=True)
    for i, a in enumerate(active):
        if a.null:
            continue
        p, nll = _probs_nll(model.head({k: v[i * b : (i + 1) * b] for k, v in state.items()}, ctx), toks)
        if a.variant == "current" and nll.shape[1] > 0:
            dloss[a.s, seqs] = (nll - clean.nll).mean(-1).double().cpu().numpy()
        dp = p.sub_(clean.probs).norm(dim=-1)  # (b, T): ‖p' − p‖₂
        o = dp.masked_fill(~a.measure[seqs].to(dp.device), -1.0).amax(-1)  # ‖·‖ ≥ 0, so −1 never wins
        O[a.variant][a.s, seqs] = np.fmax(O[a.variant][a.s, seqs], o.double().cpu().numpy())


def _direct(
    model: LayeredLM,
    ctx: RunContext,
    clean: _Clean,
    arms: list[Arm],
    b: int,
    seqs: slice,
    per_chunk: int,
    dstore: dict[str, _CellStore],
    eps: float,
) -> None:
    """C_dir(s, t): layer t alone, fed its clean input minus the clean u_s on I; compared to u_t on F."""
    L = model.n_layer
    ndims = int(model.design.update_norm_dims())
    for t in range(arms[0].s + 1 if arms else L, L):
        todo = [a for a in arms if a.s < t]
        for chunk in _split(todo, per_chunk):
            parts = [
                _subtract_update(clean.states[t], clean.updates[a.s], a.intervene[seqs].to(clean.updates[a.s].device))
                for a in chunk
            ]
            got: list[torch.Tensor] = []
            model.run_layers(state_cat(parts), ctx, t, t + 1, on_layer=lambda pos, s, u: got.append(u))  # noqa: B023 (runs in this step)
            U = _flat_update(got[0], ndims).view(len(chunk), b, -1, clean.updates[t].shape[-1])
            diff_sq = (U - clean.updates[t]).square().sum(-1)
            den_sq = clean.den_sq[t].to(diff_sq.device)
            ratio = (diff_sq.sqrt() / den_sq.sqrt().clamp_min(eps)).cpu().numpy()
            diff_np, clean_sq = diff_sq.double().cpu().numpy(), den_sq.double().cpu().numpy()
            for (_, variant), idx in _groups(chunk).items():
                dstore[variant].add([chunk[i] for i in idx], t, seqs, ratio[idx], diff_np[idx], clean_sq)
