"""Benchmark: depthlens causal (late window) and permutation (late pairs) vs a naive loop and nnsight.

    .venv/bin/python bench/diagnostics.py [--layers 8 16 32] [--n-seq 8] [--seq-len 128] [--repeats 3]

Tiny Pre-LN models (d = 64, T = 128, a few sequences, one CPU thread). For each L:
  causal       depthlens `causal_scores(variants=("current",), layers="late")` (C, O[s], ΔL_skip)
               vs (a) naive: one full forward per skipped layer (+ the clean one), updates via `on_layer`:
                   over all s as Csordás' loop is written (1 + L passes, the naive count in docs/performance.md), and
                   over
                   the late s only (1 + |Λ| passes)
               vs (b) nnsight: `NNsight(model)`, one trace per late s, skip = patch blocks[s].hook_resid_post with
                   the merged input (docs/concepts.md#notation: h_{s+1} := h_s on [1, T)), updates from
                   hook_resid_pre/post
  permutation  depthlens `permutation_scores(pairs="late")` vs (a) naive full forward per pair with `order`
               vs (b) nnsight: one trace per pair, `model.forward(order=...)` under the tracer
Results must agree (max abs diff reported). Peak memory = peak bytes of live torch tensors allocated during
the call (TorchDispatchMode tracker; parameters and inputs excluded), relative to one plain forward over the
same sequences. Writes reports/bench/diagnostics.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from depthlens.diagnostics.causal.engine import causal_scores, token_nll  # noqa: E402
from depthlens.diagnostics.permutation.engine import permutation_scores, swapped_order  # noqa: E402
from depthlens.models.config import ModelConfig  # noqa: E402
from depthlens.models.model import build_model  # noqa: E402
from depthlens.runtime.evaldata import random_eval_data  # noqa: E402
from depthlens.stats.metrics import late_pairs, late_window  # noqa: E402

EPS = 1e-6


# ---------------------------------------------------------------------------------------------------------------
# measurement helpers


class PeakTensorMemory(TorchDispatchMode):
    """Peak bytes of tensor storages created inside the block and still alive (views counted once)."""

    def __init__(self, exclude: set[int] = frozenset()):
        super().__init__()
        self.exclude = set(exclude)  # storages that existed before (weights, inputs): views of them are free
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}  # data_ptr -> [bytes, n live tensors]

    def _release(self, key: int) -> None:
        rec = self._storages.get(key)
        if rec is None:
            return
        rec[1] -= 1
        if rec[1] == 0:
            self.live -= rec[0]
            del self._storages[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                key = st.data_ptr()
                if key == 0 or key in self.exclude:
                    continue
                rec = self._storages.get(key)
                if rec is None:
                    self._storages[key] = rec = [st.nbytes(), 0]
                    self.live += st.nbytes()
                    self.peak = max(self.peak, self.live)
                rec[1] += 1
                weakref.finalize(t, self._release, key)
        return out


def peak_memory(fn: Callable[[], Any], *owners: Any) -> int:
    """Peak live tensor bytes allocated by fn(); storages of `owners` (modules, tensors) are not counted."""
    exclude = set()
    for o in owners:
        for t in o.state_dict().values() if hasattr(o, "state_dict") else [o]:
            exclude.add(t.untyped_storage().data_ptr())
    with torch.no_grad(), PeakTensorMemory(exclude) as m:
        fn()
    return m.peak


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import nnsight

    return {
        "cpu": cpu,
        "torch": torch.__version__,
        "nnsight": nnsight.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# ---------------------------------------------------------------------------------------------------------------
# baselines: the same quantities (C max/mean/pooled over [1, T), O[s], ΔL_skip) from one full forward per s


def _causal_reduce(clean_u, new_u, s: int, L: int, out: dict) -> None:
    for t in range(s, L):
        diff = (new_u[t] - clean_u[t]).float()
        den = clean_u[t].float()
        r = diff.norm(dim=-1) / den.norm(dim=-1).clamp_min(EPS)
        r, num, dd = r[:, 1:], diff[:, 1:].square().sum(), den[:, 1:].square().sum()
        out["max"][s, t] = float(r.max())
        out["mean"][s, t] = float(r.double().mean())
        out["pooled"][s, t] = float((num.double() / dd.double()).sqrt())


def _empty(L: int) -> dict[str, np.ndarray]:
    return {k: np.full((L, L), np.nan) for k in ("max", "mean", "pooled")}


@torch.no_grad()
def naive_causal(model, tokens: torch.Tensor, layers) -> dict[str, np.ndarray]:
    L, T = model.n_layer, tokens.shape[1]

    def run(keep=None):
        ctx = model.context(T)
        ups: dict[int, torch.Tensor] = {}
        st = model.run_layers(model.embed(tokens, ctx), ctx, keep=keep, on_layer=lambda p, s, u: ups.__setitem__(p, u))
        return ups, model.head(st, ctx)

    clean_u, clean_logits = run()
    p0, nll0 = clean_logits.softmax(-1), token_nll(clean_logits, tokens)
    out = _empty(L)
    out["O"], out["dloss"] = np.full(L, np.nan), np.full(L, np.nan)
    mask = torch.ones(tokens.shape, dtype=torch.bool)
    mask[:, 1:] = False
    for s in layers:
        new_u, logits = run({s: mask})
        _causal_reduce(clean_u, new_u, s, L, out)
        out["O"][s] = float((logits.softmax(-1) - p0).norm(dim=-1)[:, 1:].max())
        out["dloss"][s] = float((token_nll(logits, tokens) - nll0).mean())
    return out


def nnsight_skip_trace(nn_model, L: int, tokens: torch.Tensor, s: int | None) -> tuple[dict, torch.Tensor]:
    """One nnsight trace: every update u_t = h_(t+1) − h_t and the logits, with layer s skipped on [1, T)
    (Csordás' merge_io) when s is not None. Shared by this bench and bench/real_scale.py."""
    import nnsight

    pos = torch.arange(tokens.shape[1], device=tokens.device)[None, :, None]
    with torch.no_grad(), nn_model.trace(tokens):
        ups = []
        for t in range(L):
            h_in = nn_model.blocks[t].hook_resid_pre.output
            if t == s:  # merge_io: positions [1, T) take the block input, position 0 keeps the output
                nn_model.blocks[t].hook_resid_post.output = torch.where(
                    pos >= 1, h_in, nn_model.blocks[t].hook_resid_post.output
                )
            ups.append(nn_model.blocks[t].hook_resid_post.output - h_in)
        ups = nnsight.save(ups)
        logits = nn_model.output.save()
    return dict(enumerate(ups)), logits


def nnsight_causal(nn_model, model, tokens: torch.Tensor, layers) -> dict[str, np.ndarray]:
    L = model.n_layer

    def run(s: int | None):
        return nnsight_skip_trace(nn_model, L, tokens, s)

    clean_u, clean_logits = run(None)
    p0, nll0 = clean_logits.softmax(-1), token_nll(clean_logits, tokens)
    out = _empty(L)
    out["O"], out["dloss"] = np.full(L, np.nan), np.full(L, np.nan)
    for s in layers:
        new_u, logits = run(s)
        _causal_reduce(clean_u, new_u, s, L, out)
        out["O"][s] = float((logits.softmax(-1) - p0).norm(dim=-1)[:, 1:].max())
        out["dloss"][s] = float((token_nll(logits, tokens) - nll0).mean())
    return out


def _perm_reduce(model_call, tokens, L) -> np.ndarray:
    P = np.full((L, L), np.nan)
    base = token_nll(model_call(None), tokens).mean()
    for i, j in late_pairs(L):
        P[i, j] = P[j, i] = float(token_nll(model_call(swapped_order(L, int(i), int(j))), tokens).mean() - base)
    return P


@torch.no_grad()
def naive_permutation(model, tokens: torch.Tensor) -> np.ndarray:
    return _perm_reduce(lambda order: model(tokens, order=order), tokens, model.n_layer)


def nnsight_permutation(nn_model, model, tokens: torch.Tensor) -> np.ndarray:
    def call(order):
        with torch.no_grad(), nn_model.trace(tokens, order=order):
            logits = nn_model.output.save()
        return logits

    return _perm_reduce(call, tokens, model.n_layer)


# ---------------------------------------------------------------------------------------------------------------


def interleaved_times(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Best wall time of each callable over `repeats` rounds, the callables interleaved within a round so that
    load drift on a shared machine hits all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for _ in range(repeats):
            for k, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
    return {k: min(v) for k, v in times.items()}


def _maxdiff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.nanmax(np.abs(a - b)))


def bench_one(L: int, n_seq: int, T: int, repeats: int, with_nnsight: bool, d_model: int = 64) -> dict[str, Any]:
    cfg = ModelConfig(
        arch="preln", n_layer=L, d_model=d_model, n_head=max(1, d_model // 16), vocab_size=257, max_seq_len=max(256, T)
    )
    model = build_model(cfg, seed=0).eval()
    data = random_eval_data(257, n_seq=n_seq, seq_len=T, seed=0, bos_id=256)
    tokens, lw = data.tokens, late_window(L)
    rows = n_seq  # rows per forward = one plain forward over the eval set (the memory budget)
    fns: dict[str, Callable[[], Any]] = {
        "plain_forward": lambda: model(tokens),
        "causal_depthlens": lambda: causal_scores(
            model, data, variants=("current",), layers="late", null=False, batch_size=rows
        ),
        # the same with 4 sequences per clean pass: fewer, fuller calls for a larger clean-state cache
        "causal_depthlens_seq_batch4": lambda: causal_scores(
            model, data, variants=("current",), layers="late", null=False, batch_size=rows, seq_batch=4
        ),
        "causal_naive_all_layers": lambda: naive_causal(model, tokens, range(L)),
        "causal_naive_late": lambda: naive_causal(model, tokens, range(lw, L)),
        "perm_depthlens": lambda: permutation_scores(model, data, pairs="late", batch_size=rows),
        "perm_naive": lambda: naive_permutation(model, tokens),
    }
    if with_nnsight:
        from nnsight import NNsight

        nn_model = NNsight(model)
        fns["causal_nnsight_late"] = lambda: nnsight_causal(nn_model, model, tokens, range(lw, L))
        fns["perm_nnsight"] = lambda: nnsight_permutation(nn_model, model, tokens)
    # --- agreement (one run each)
    with torch.no_grad():
        outs = {k: fn() for k, fn in fns.items() if k != "plain_forward"}
    C = outs["causal_depthlens"].causal_score.sel(variant="current")
    ds = outs["causal_depthlens"]
    agree_c: dict[str, Any] = {}
    for ref_name in [k for k in outs if k.startswith("causal_") and not k.startswith("causal_depthlens")]:
        ref = outs[ref_name]
        d = {a: _maxdiff(C.sel(aggregator=a).values[lw:], ref[a][lw:]) for a in ("max", "mean", "pooled")}
        if "O" in ref:
            d["O"] = _maxdiff(ds.output_effect.sel(variant="current").values[lw:], ref["O"][lw:])
            d["dloss"] = _maxdiff(ds.skip_delta_loss.values[lw:], ref["dloss"][lw:])
        agree_c[ref_name] = d
    P = outs["perm_depthlens"].perm_abs.values
    agree_p = {
        k: _maxdiff(P[lw:, lw:], outs[k][lw:, lw:]) for k in outs if k.startswith("perm_") and k != "perm_depthlens"
    }
    # --- timing
    t = interleaved_times(fns, repeats)
    plain = t["plain_forward"]
    causal = {
        "seconds": {k: v for k, v in t.items() if k.startswith("causal_")},
        "speedup_vs_naive_all_layers": t["causal_naive_all_layers"] / t["causal_depthlens"],
        "speedup_vs_naive_late": t["causal_naive_late"] / t["causal_depthlens"],
        "seq_batch4": {
            f"speedup_vs_naive_{k}": t[f"causal_naive_{k}"] / t["causal_depthlens_seq_batch4"]
            for k in ("all_layers", "late")
        },
        "full_pass_equivalents": {
            "depthlens_theory": 1 + sum(L - s for s in range(lw, L)) / L,
            "depthlens_measured": t["causal_depthlens"] / plain,
            "naive_all_layers (Csordas as written)": 1 + L,
            "naive_late": 1 + L - lw,
        },
        "max_abs_diff": agree_c,
        "options": {k: ds.attrs[k] for k in ("batch_size", "seq_batch", "arms_per_chunk")},
    }
    perm = {
        "seconds": {k: v for k, v in t.items() if k.startswith("perm_")},
        "speedup_vs_naive": t["perm_naive"] / t["perm_depthlens"],
        "full_pass_equivalents": {
            "depthlens_theory": 1 + sum(L - int(i) for i, _ in late_pairs(L)) / L,
            "depthlens_measured": t["perm_depthlens"] / plain,
            "naive": 1 + len(late_pairs(L)),
        },
        "max_abs_diff": agree_p,
        "options": {k: outs["perm_depthlens"].attrs[k] for k in ("batch_size", "seq_batch", "pairs_per_chunk")},
    }
    if with_nnsight:
        causal["speedup_vs_nnsight_late"] = t["causal_nnsight_late"] / t["causal_depthlens"]
        perm["speedup_vs_nnsight"] = t["perm_nnsight"] / t["perm_depthlens"]
    # --- memory (separate runs: the tracker slows every op)
    m_plain = peak_memory(fns["plain_forward"], model, tokens)
    causal["peak_vs_plain_forward"] = peak_memory(fns["causal_depthlens"], model, tokens) / m_plain
    causal["seq_batch4"]["peak_vs_plain_forward"] = (
        peak_memory(fns["causal_depthlens_seq_batch4"], model, tokens) / m_plain
    )
    causal["naive_late_peak_vs_plain_forward"] = peak_memory(fns["causal_naive_late"], model, tokens) / m_plain
    perm["peak_vs_plain_forward"] = peak_memory(fns["perm_depthlens"], model, tokens) / m_plain
    return {
        "L": L,
        "d_model": d_model,
        "seq_len": T,
        "n_seq": n_seq,
        "late_window_start": lw,
        "n_late_layers": L - lw,
        "n_late_pairs": int(len(late_pairs(L))),
        "plain_forward_s": plain,
        "plain_forward_peak_bytes": m_plain,
        "causal": causal,
        "permutation": perm,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--n-seq", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-nnsight", action="store_true")
    ap.add_argument("--d-model", type=int, default=64, help="width (64: overhead-bound; 256: compute-bound)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "diagnostics.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    report = {
        "machine": machine(),
        "targets": {
            "causal_speedup_vs_naive_all_layers_L32": 3.0,
            "permutation_speedup_vs_naive_L32": 1.8,
            "peak_memory_vs_plain_forward": 2.0,
        },
        "memory_method": "peak live torch tensor bytes inside the call (TorchDispatchMode), params excluded",
        "timing_method": f"best of {args.repeats} wall-clock runs, torch.set_num_threads(1)",
        "results": [],
    }
    for L in args.layers:
        r = bench_one(L, args.n_seq, args.seq_len, args.repeats, not args.no_nnsight, args.d_model)
        report["results"].append(r)
        c, p = r["causal"], r["permutation"]
        print(
            f"L={L:3d}  causal x{c['speedup_vs_naive_all_layers']:.2f} vs naive (all s), "
            f"x{c['speedup_vs_naive_late']:.2f} vs naive (late s)"
            + (f", x{c['speedup_vs_nnsight_late']:.2f} vs nnsight (late s)" if "speedup_vs_nnsight_late" in c else "")
            + f", mem x{c['peak_vs_plain_forward']:.2f} | perm x{p['speedup_vs_naive']:.2f} vs naive"
            + (f", x{p['speedup_vs_nnsight']:.2f} vs nnsight" if "speedup_vs_nnsight" in p else "")
            + f", mem x{p['peak_vs_plain_forward']:.2f}",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
