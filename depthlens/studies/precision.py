"""Eval to a stated precision: grow the eval set in doublings until the headline share's interval is narrow enough.

    ds = to_precision("causal", model, data, target=0.03)      # data: the eval set at the cap (--n-seq)

The eval set is `data` (its N sequences are the cap). The diagnostic runs on the first `n_start` sequences, then
on the next ones only (n_start, 2·n_start, 4·n_start, ... sequences in all), and the parts are concatenated:
per-sequence results are independent, so a part never changes what another part computed. After each step the
headline share's 95 % interval (`sweep.headline`, the same interval the report shows) is computed on the
sequences so far; the run stops at the first size where its half-width (high − low)/2 is at most `target`, or at
N. The rule reads only the interval's width, never the estimate; the result records it:

    precision_target        the half-width asked for
    precision_half_width    the half-width reached (NaN: no interval at that size)
    precision_n_seq         the sequences used
    precision_cap_hit       1 when N stopped it before the target was reached, else 0
    precision_steps_json    [[n, half-width], ...] at every size tried
    precision_metric        the headline score the rule watched (causal: max aggregator, current variant)

What the concatenation re-derives from the per-sequence variables is each diagnostic's own (`Hooks.regrow`,
beside its engine): causal `causal_score` for the max, mean and pooled aggregators (max of per-sequence maxima,
ratio of summed sums / counts and of squared sums: exactly what one run over all the sequences computes) and
`mean_downstream_effect`; p95/p99 need every token's ratio, which a part does not keep, so they are NaN in a
concatenated result (`precision_dropped` says so). Permutation: every aggregate (perm_abs/rel/kl are sequence
means, perm_abs_se their standard error, clean_loss the mean clean loss). A diagnostic without `regrow` cannot
grow its eval set.
tests/test_sequential.py checks concatenation against one run and the coverage of the interval under the rule.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DepthlensError

N_START = 16  # smaller first steps stop on chance-narrow intervals and undercover (tests/test_sequential.py)


def supported() -> dict[str, str]:
    """The diagnostics that can grow their eval set (they name the aggregates their `Hooks.regrow` re-derives), each
    with the headline score it watches."""
    from ..diagnostics import registry

    return {d.name: d.headline.key for d in registry.diagnostics() if d.regrown and d.headline is not None}


def half_width(ds: Any, metric: str, threshold: float | None = None, **headline_kw: Any) -> float:
    """Half-width of the headline share's interval on `ds` (NaN when it has none)."""
    from ..diagnostics.sweep import headline

    h = headline(ds, metric, threshold, **headline_kw)
    lo, hi = h.get("ci_low"), h.get("ci_high")
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return float("nan")
    return (float(hi) - float(lo)) / 2


def sizes(n_start: int, cap: int) -> list[int]:
    """The doubling sizes n_start, 2·n_start, ... up to the cap (the cap itself last)."""
    if n_start < 2:
        raise DepthlensError(f"the first precision step needs at least 2 sequences, got {n_start}")
    out, n = [], n_start
    while n < cap:
        out.append(n)
        n *= 2
    return [*out, cap]


def grow(
    width_at: Callable[[int], float], target: float, n_start: int, cap: int
) -> tuple[int, list[list[float]], bool]:
    """The stopping rule: evaluate `width_at(n)` (the interval half-width on the first n sequences) at n_start,
    2·n_start, ..., cap; stop at the first n where it is finite and <= target. Only widths are read.
    Returns (n used, [[n, width], ...], whether the cap stopped it without reaching the target)."""
    steps: list[list[float]] = []
    ns = sizes(min(n_start, cap), cap) if cap >= 2 else [cap]
    for n in ns:
        w = float(width_at(n))
        steps.append([n, w])
        if math.isfinite(w) and w <= target:
            return n, steps, False
    return ns[-1], steps, True


def _slice(data: Any, a: int, b: int) -> Any:
    return dataclasses.replace(data, tokens=data.tokens[a:b])


def to_precision(
    name: str,
    model: Any,
    data: Any,
    target: float,
    *,
    n_start: int = N_START,
    headline_kw: dict[str, Any] | None = None,
    metric: str | None = None,
    **opts: Any,
) -> Any:
    """Run diagnostic `name` (causal or permutation) on prefixes of `data` that double until the headline
    interval's half-width is at most `target` (module docstring); the concatenated dataset, with the rule's
    record in its attrs. metric: the headline score the rule watches (default causal, perm_abs); headline_kw:
    its threshold and options as `sweep.headline` takes them."""
    from ..diagnostics import registry

    d = registry.get(name)
    if d.name not in supported():
        raise DepthlensError(f"--precision applies to {' and '.join(supported())}, not {name}")
    if not (isinstance(target, float | int) and 0 < target < 0.5):
        raise DepthlensError(f"--precision must be a half-width in (0, 0.5), got {target}")
    if opts.get("outputs"):
        raise DepthlensError(
            "--precision does not combine with --outputs: O[s] and ΔL_skip are whole-run maxima with no "
            "per-sequence values to concatenate"
        )
    metric = metric or supported()[d.name]
    hkw = dict(headline_kw or {})
    threshold = hkw.pop("threshold", None)
    parts: list[Any] = []
    state: dict[str, Any] = {"done": 0, "ds": None}

    def width_at(n: int) -> float:
        extra = {d.part_start: state["done"]} if d.part_start else {}  # e.g. causal: the cuts continue
        parts.append(registry.run(d.name, model, _slice(data, state["done"], n), **opts, **extra))  # new ones only
        state["done"] = n
        state["ds"] = concat_sequences(parts, d.name, _slice(data, 0, n))
        w = half_width(state["ds"], metric, threshold, **hkw)
        if len(parts) == 1 and not math.isfinite(w):  # nothing to watch: doubling to the cap would only hide that
            agg = hkw.get("aggregator")
            raise DepthlensError(
                f"--precision: the headline share ({metric}{f', aggregator {agg}' if agg else ''}) has no interval "
                f"at {n} sequences, so no stopping rule can watch it (p95 and p99 are not decomposable per "
                "sequence); use --aggregator max, mean or pooled, or drop --precision"
            )
        return w

    done, steps, cap_hit = grow(width_at, float(target), n_start, int(data.n_seq))
    ds = state["ds"]
    w = steps[-1][1]
    ds.attrs.update(
        {
            "precision_target": float(target),
            "precision_half_width": float(w),
            "precision_n_seq": int(done),
            "precision_cap_hit": int(cap_hit),
            "precision_steps_json": json.dumps([[int(n), None if not math.isfinite(x) else x] for n, x in steps]),
            "precision_metric": metric,
            "precision_rule": "doubling from n_start; stop at the first size whose interval half-width <= target",
        }
    )
    return ds


def concat_sequences(parts: list[Any], name: str, data: Any) -> Any:
    """One dataset over the sequences of consecutive `parts` (runs of diagnostic `name` on consecutive slices
    of `data`, which is their union), aggregates re-derived (module docstring)."""
    import xarray as xr

    from ..diagnostics import registry

    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    tok = ["eval_tokens"] if "eval_tokens" in first else []
    seq_vars = [v for v in first.data_vars if "sequence" in first[v].dims]
    per_seq, per_tok, off = [], [], 0
    for p in parts:
        n = p.sizes["sequence"]
        q = p[seq_vars]
        per_seq.append(q.assign_coords(sequence=np.arange(off, off + n)) if "sequence" in q.coords else q)
        if tok:
            t = p[tok]
            per_tok.append(t.assign_coords(eval_seq=np.arange(off, off + n)) if "eval_seq" in t.coords else t)
        off += n
    drop = [*seq_vars, *tok, *[c for c in ("sequence", "eval_seq") if c in first.coords]]
    ds = first.drop_vars(drop).copy()
    ds = ds.merge(xr.concat(per_seq, dim="sequence"), combine_attrs="override")
    if tok:
        ds = ds.merge(xr.concat(per_tok, dim="eval_seq"), combine_attrs="override")
    ds.attrs = dict(first.attrs)
    ds.attrs.update(data.provenance() if hasattr(data, "provenance") else {})
    ds.attrs["eval_n_seq"] = int(data.n_seq)
    ds.attrs["n_tokens"] = int(sum(int(p.attrs.get("n_tokens", 0)) for p in parts))
    d = registry.get(name)
    dropped: list[str] = []
    for v in ds.data_vars:
        if v in d.regrown or "sequence" in ds[v].dims or "eval_seq" in ds[v].dims:
            continue
        if not all(np.array_equal(p[v].values, first[v].values, equal_nan=True) for p in parts[1:]):
            ds[v] = (ds[v].dims, np.full(ds[v].shape, np.nan), ds[v].attrs)  # a whole-run aggregate we cannot rebuild
            dropped.append(str(v))
    regrow = d.loaded().regrow
    assert regrow is not None  # concat_sequences serves only the diagnostics that can grow
    dropped = regrow(ds, parts) + dropped  # its own aggregates: those it could not rebuild
    ds.attrs["precision_dropped"] = ",".join(dropped) if dropped else "none"
    return ds
