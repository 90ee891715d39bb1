"""Benchmark: forward passes `--precision` saves against the fixed 32 × 128 default.

    .venv/bin/python bench/precision.py [--target 0.03] [--models checkpoints/hc_l16 ...] [--real smollm2-135m-instruct]

For each model and diagnostic (causal: max share over late pairs; permutation: perm_abs share), the doubling
run (`studies.precision.to_precision`, 16 → 32 sequences of 128 tokens, the default eval data) is timed and its
record kept: sequences used, half-width reached, whether the cap stopped it. Forward passes scale with the
sequences an engine runs (every pass runs a batch of sequences; the per-sequence work is the same), so the
passes saved are 1 − used/32 of the fixed run's. Writes reports/bench/precision.json (merged with what is there,
so models can be added one at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CAP, SEQ_LEN = 32, 128


def one(path: str, name: str, target: float) -> dict[str, Any]:
    import torch

    from depthlens.adapters.load import open_model
    from depthlens.studies.api import eval_data_for
    from depthlens.studies.precision import to_precision

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    op = open_model(path)
    data = eval_data_for(op.model, None, Path(path), n_seq=CAP, seq_len=SEQ_LEN, seed=0)
    t0 = time.perf_counter()
    ds = to_precision(name, op.model, data, target)
    wall = time.perf_counter() - t0
    a = ds.attrs
    used = int(a["precision_n_seq"])
    return {
        "model": path,
        "diagnostic": name,
        "target_half_width": target,
        "sequences_used": used,
        "sequences_fixed": CAP,
        "seq_len": int(data.seq_len),
        "half_width_reached": float(a["precision_half_width"]),
        "cap_hit": bool(a["precision_cap_hit"]),
        "steps": json.loads(a["precision_steps_json"]),
        "forward_passes_saved_fraction": round(1 - used / CAP, 4),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, default=0.03)
    ap.add_argument(
        "--models", nargs="*", default=["checkpoints/preln_l16", "checkpoints/hc_l16", "checkpoints/mhc_l16"]
    )
    ap.add_argument("--real", nargs="*", default=[], help="real models by name (depthlens.data.real_models)")
    ap.add_argument("--diagnostics", nargs="*", default=["causal", "permutation"])
    ap.add_argument("--out", type=Path, default=ROOT / "reports/bench/precision.json")
    a = ap.parse_args()
    from depthlens.data.real_models import model_path

    paths = [*a.models, *(str(model_path(n)) for n in a.real)]
    old = json.loads(a.out.read_text()) if a.out.exists() else {"runs": []}
    runs = {(r["model"], r["diagnostic"], r["target_half_width"]): r for r in old.get("runs", [])}
    for p in paths:
        for d in a.diagnostics:
            r = one(p, d, a.target)
            runs[(r["model"], r["diagnostic"], r["target_half_width"])] = r
            print(json.dumps(r), flush=True)
    out = {
        "what": "sequences (∝ forward passes) --precision uses against the fixed 32 × 128 default",
        "cpu_threads": int(os.environ.get("OMP_NUM_THREADS", "1")),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "runs": sorted(runs.values(), key=lambda r: (r["model"], r["diagnostic"], r["target_half_width"])),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
