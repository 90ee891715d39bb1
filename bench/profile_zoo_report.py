"""Where the main job's time goes: the zoo report's diagnostics on shipped L = 32 checkpoints, by torch operator.

    .venv/bin/python bench/profile_zoo_report.py [--n-seq 8] [--ckpts preln_l32 hc_l32]

The main job (scripts/zoo-report.sh) spends most of its time in the permutation score of the L = 32 checkpoints.
The zoo's models are tiny (d = 24, head_dim 8, 3 heads, 127-token rows), so a forward is not dominated by its
matmuls: this profiles one permutation run per checkpoint (one thread, the report's options, the first
--n-seq eval sequences) and reports each operator's share of the self CPU time (torch.profiler), beside the
same run's wall time and the wall time of one plain forward of the same rows (the permutation in plain-forward
equivalents). Writes reports/bench/profile_zoo_report.json, with the machine noted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diagnostics import machine  # noqa: E402

from depthlens.diagnostics.permutation.engine import permutation_scores  # noqa: E402
from depthlens.studies.api import eval_data_for, load_model  # noqa: E402

TOP = 8  # operators listed per checkpoint


def profile_one(name: str, n_seq: int) -> dict:
    model, path = load_model(ROOT / "checkpoints" / name)
    data = eval_data_for(model, None, path, n_seq=n_seq)
    toks = data.tokens[:, :-1]
    with torch.no_grad():
        ctx = model.context(toks.shape[1])
        model.run_layers(model.embed(toks, ctx), ctx, 0)  # warm-up
        t = time.perf_counter()
        model.run_layers(model.embed(toks, ctx), ctx, 0)
        plain = time.perf_counter() - t
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        permutation_scores(model, data)
        wall = time.perf_counter() - t
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:TOP]
    return {
        "checkpoint": name,
        "design": model.config.arch,
        "n_layer": model.n_layer,
        "d_model": model.config.d_model,
        "eval": {"n_seq": data.n_seq, "seq_len": data.seq_len},
        "permutation_wall_s": round(wall, 3),
        "plain_forward_wall_s": round(plain, 5),
        "permutation_plain_forward_equivalents": round(wall / plain, 1),
        "operators": [
            {"op": e.key, "calls": e.count, "self_cpu_share": round(e.self_cpu_time_total / total, 4)} for e in top
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-seq", type=int, default=8)
    ap.add_argument("--ckpts", nargs="+", default=["preln_l32", "hc_l32"])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "profile_zoo_report.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = [profile_one(n, a.n_seq) for n in a.ckpts]
    doc = {"machine": machine(), "threads": 1, "checkpoints": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        ops = ", ".join(f"{o['op']} {100 * o['self_cpu_share']:.0f} %" for o in r["operators"][:4])
        print(
            f"{r['checkpoint']}: permutation {r['permutation_wall_s']} s "
            f"({r['permutation_plain_forward_equivalents']} plain forwards); {ops}"
        )


if __name__ == "__main__":
    main()
