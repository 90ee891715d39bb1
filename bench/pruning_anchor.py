"""Benchmark: the held-out greedy and pairwise-predicted pruning criteria with and without anchored cuts.

    OMP_NUM_THREADS=1 .venv/bin/python bench/pruning_anchor.py [--models checkpoints/preln_l32] [--real smollm2-135m-instruct]

`_Pruner.anchor` lets greedy's next step (the chosen cut plus one layer) and the pool's pairs ({i} plus a later j)
start at the added layer instead of the cut's first removed layer (`diagnostics/pruning.py`). For each model,
`heldout_curves` with criteria greedy and predicted runs twice in one process on the same eval data (16 × 128,
k <= 4): anchors off (the method made a no-op), then on. Recorded: the layers actually run (counted at
`run_layers`, a machine-independent cost), CPU and wall seconds, and whether every held-out loss is bit-identical.
Writes reports/bench/pruning_anchor.json (merged with what is there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N_SEQ, SEQ_LEN, K_MAX, CRITERIA = 16, 128, 4, ("greedy", "predicted")


def one(path: str) -> dict[str, Any]:
    import numpy as np
    import torch

    from depthlens.adapters.load import open_model
    from depthlens.diagnostics import pruning
    from depthlens.diagnostics.pruning_heldout import heldout_curves, window_domains
    from depthlens.studies.api import eval_data_for

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    op = open_model(path)
    model = op.model
    data = eval_data_for(model, None, Path(path), n_seq=N_SEQ, seq_len=SEQ_LEN, seed=0)
    domains = window_domains(data, op.tokenizer)
    ran = [0]
    real_run = type(model).run_layers

    def counted(self: Any, state: Any, ctx: Any, start: int = 0, stop: int | None = None, **kw: Any) -> Any:
        ran[0] += ((self.n_layer if stop is None else stop) - start) * int(ctx_rows(state))
        return real_run(self, state, ctx, start, stop, **kw)

    def ctx_rows(state: Any) -> int:
        t = next(iter(state.values())) if isinstance(state, dict) else state
        return int(t.shape[0])

    real_anchor = pruning._Pruner.anchor
    out: dict[str, Any] = {"model": path, "n_layer": int(model.n_layer), "criteria": list(CRITERIA), "k_max": K_MAX}
    results = {}
    for mode in ("off", "on"):
        if mode == "off":
            pruning._Pruner.anchor = lambda self, removed: None  # type: ignore[method-assign]
        else:
            pruning._Pruner.anchor = real_anchor  # type: ignore[method-assign]
        type(model).run_layers = counted
        ran[0] = 0
        t, cpu = time.perf_counter(), time.process_time()
        ds = heldout_curves(model, data, domains=domains, k_max=K_MAX, criteria=CRITERIA)
        out[mode] = {
            "layer_rows_run": ran[0],
            "cpu_s": round(time.process_time() - cpu, 1),
            "wall_s": round(time.perf_counter() - t, 1),
        }
        type(model).run_layers = real_run
        results[mode] = ds
        print(path, mode, out[mode], flush=True)
    pruning._Pruner.anchor = real_anchor  # type: ignore[method-assign]
    out["bit_identical"] = bool(
        np.array_equal(results["off"]["seq_loss"].values, results["on"]["seq_loss"].values, equal_nan=True)
        and np.array_equal(results["off"]["removed"].values, results["on"]["removed"].values)
    )
    out["layer_rows_ratio_on_over_off"] = round(out["on"]["layer_rows_run"] / out["off"]["layer_rows_run"], 4)
    out["cpu_ratio_on_over_off"] = round(out["on"]["cpu_s"] / out["off"]["cpu_s"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["checkpoints/preln_l32"])
    ap.add_argument("--real", nargs="*", default=[], help="real models by name (depthlens.data.real_models)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports/bench/pruning_anchor.json")
    a = ap.parse_args()
    from depthlens.data.real_models import model_path

    paths = [*a.models, *(str(model_path(n)) for n in a.real)]
    old = json.loads(a.out.read_text()) if a.out.exists() else {"runs": []}
    runs = {r["model"]: r for r in old.get("runs", [])}
    for p in paths:
        runs[p] = one(p)
    out = {
        "what": f"held-out {' + '.join(CRITERIA)} pruning, k <= {K_MAX}, {N_SEQ} x {SEQ_LEN}: anchors off vs on",
        "machine": {
            "cores_visible": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "runs": sorted(runs.values(), key=lambda r: r["model"]),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(a.out)


if __name__ == "__main__":
    main()
