"""Own-model bench: the causal run on a user's model described to depthlens (depthlens.wrap) vs the same weights
loaded into depthlens's native design, in one process (issue 29: at most 1.3x).

    nice -n 10 .venv/bin/python bench/own_model.py [--threads 1] [--n-seq 4] [--seq-len 64] [--repeats 5]

The model: a 12-layer, d = 256, 4-stream Hyper-Connections LM built with lucidrains' `hyper-connections`
(examples/hc_model.py, random init: timing only), described by its worked adapter (examples/hc_model.describe), and
the native HC carrying the same weights (tests/shared_weights.native_multistream). Both run
`causal_scores(variants=("current",), layers="all")` on the same random tokens; first their scores are checked to
agree (max |Δ|), then each callable is timed, interleaved within a round so that load drift on a shared machine
hits all alike: best of --repeats runs, process CPU time (steadier than wall time on a shared machine) with wall time
beside it.

Plain-forward equivalents (as bench/diagnostics.py): time / time of one plain forward of the same batch, each
model's own (`user_plain_forward`: the described model's forward, i.e. the user's modules called by depthlens;
`native_plain_forward`: the native model's). The headline ratio is CPU time, description / native (the same work on
the same weights). Writes reports/bench/own_model.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

from diagnostics import machine  # noqa: E402
from hc_model import HCModel, describe  # noqa: E402

from depthlens.diagnostics.causal.engine import causal_scores  # noqa: E402
from depthlens.runtime.evaldata import random_eval_data  # noqa: E402
from shared_weights import native_multistream  # noqa: E402

TARGET = 1.3


def interleaved_times(fns: dict[str, Any], repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Best wall and best process-CPU time of each callable over `repeats` rounds, interleaved within a round (as
    bench/diagnostics.interleaved_times, plus CPU time: on a shared machine the steadier of the two)."""
    wall: dict[str, float] = {k: float("inf") for k in fns}
    cpu = dict(wall)
    with torch.no_grad():
        for _ in range(repeats):
            for k, fn in fns.items():
                t, c = time.perf_counter(), time.process_time()
                fn()
                wall[k], cpu[k] = min(wall[k], time.perf_counter() - t), min(cpu[k], time.process_time() - c)
    return wall, cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "own_model.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab, d, L = 512, args.d_model, args.n_layer
    user = HCModel(vocab=vocab, d=d, n_layer=L, n_head=d // 64, d_ff=4 * d).eval()
    native = native_multistream(user)  # before describe: the adapter's hooks change the blocks' calling convention
    described = describe(user)
    data = random_eval_data(vocab, n_seq=args.n_seq, seq_len=args.seq_len, seed=0, bos_id=0)
    tokens = data.tokens
    rows = args.n_seq  # rows per forward = one plain forward over the eval set (the memory budget)
    if native.config.max_seq_len < args.seq_len:
        raise SystemExit(f"--seq-len {args.seq_len} exceeds the native model's max_seq_len {native.config.max_seq_len}")

    def run(model: Any) -> Any:
        return causal_scores(model, data, variants=("current",), layers="all", null=False, batch_size=rows)

    fns = {
        "user_plain_forward": lambda: described(tokens),
        "native_plain_forward": lambda: native(tokens),
        "causal_described": lambda: run(described),
        "causal_native": lambda: run(native),
    }
    with torch.no_grad():
        a, b = run(described), run(native)
        agree = float(np.nanmax(np.abs(a.causal_score.values - b.causal_score.values)))
        logits = float((described(tokens) - native(tokens)).abs().max())
    wall, t = interleaved_times(fns, args.repeats)
    ratio = t["causal_described"] / t["causal_native"]
    report = {
        "machine": machine(),
        "timing_method": f"best of {args.repeats} interleaved runs, process CPU time (wall beside it), "
        f"torch.set_num_threads({args.threads})",
        "model": {
            "package": "hyper-connections (lucidrains) HyperConnections, 4 streams, examples/hc_model.py",
            "n_layer": L,
            "d_model": d,
            "vocab": vocab,
            "n_params": sum(p.numel() for p in user.parameters()),
        },
        "eval": {"n_seq": args.n_seq, "seq_len": args.seq_len, "batch_size": rows},
        "seconds_cpu": t,
        "seconds_wall": wall,
        "ratio_described_over_native_wall": wall["causal_described"] / wall["causal_native"],
        "full_pass_equivalents": {
            "described (user plain forward)": t["causal_described"] / t["user_plain_forward"],
            "native (native plain forward)": t["causal_native"] / t["native_plain_forward"],
            "bound": 1 + (L + 1) / 2,
        },
        "ratio_described_over_native": ratio,
        "plain_forward_ratio_user_over_native": t["user_plain_forward"] / t["native_plain_forward"],
        "target": TARGET,
        "max_abs_diff": {"causal_score": agree, "logits": logits},
    }
    print(
        f"causal: described {t['causal_described']:.3f}s, native {t['causal_native']:.3f}s, ratio x{ratio:.2f} "
        f"(target <= {TARGET}); plain forward user/native x{report['plain_forward_ratio_user_over_native']:.2f}; "
        f"max |dC| {agree:.1e}",
        flush=True,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
