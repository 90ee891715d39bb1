"""The lens family on the real models of the atlas: the logit lens and the tuned lens, trained and untrained twin.

    .venv/bin/python scripts/lens_atlas.py smollm2-135m-instruct [--n-seq 16] [--seq-len 128] [--steps 60]
        [--tokens-per-step 64] [--kinds logit,tuned] [--twin/--no-twin]

Reads the GGUF file that `scripts/fetch-real-models.sh` assembled (`data.real_models.model_path`) and the atlas's
eval sequences (the offline corpus's held-out `val` split in the model's own tokenizer, N_SEQ × SEQ_LEN, seed 0);
the tuned lens's translators train on the corpus's `train` split (`diagnostics.lens.engine.training_data`). Writes, under
`reports/atlas/<model>/data/`: `logit_lens.nc`, `tuned_lens.nc`, `untrained_logit_lens.nc`,
`untrained_tuned_lens.nc` (the twin: the same config freshly initialised, seed 0, `adapters/twin.py`) and
`lens_run.json` (the options and each stage's wall and CPU seconds). A stage whose file exists is kept
(delete it to recompute). The atlas page reads these files (`scripts/atlas.py`, "Where the prediction forms").
One thread; run it niced.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATLAS = ROOT / "reports" / "atlas"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--n-seq", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tokens-per-step", type=int, default=64)
    ap.add_argument("--train-n-seq", type=int, default=32)
    ap.add_argument("--kinds", default="logit,tuned")
    ap.add_argument("--no-twin", action="store_true")
    ap.add_argument("--out", type=Path, default=ATLAS)
    a = ap.parse_args(argv)

    import torch

    from depthlens.adapters.load import open_model
    from depthlens.adapters.twin import untrained_twin
    from depthlens.data.real_models import model_path
    from depthlens.diagnostics.lens.engine import lens_readout
    from depthlens.io.dataset import write_netcdf
    from depthlens.io.jsonsafe import jsonable
    from depthlens.runtime.evaldata import load_eval_data

    torch.set_num_threads(1)
    for name in a.models:
        path = model_path(name)
        if not path.is_file():
            print(f"lens_atlas: {path}: not there (run scripts/fetch-real-models.sh {name})", file=sys.stderr)
            return 1
        data_dir = a.out / name / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        run_file = data_dir / "lens_run.json"
        run = json.loads(run_file.read_text()) if run_file.is_file() else {"stages": {}}
        op = open_model(path)
        model = op.model
        data = load_eval_data(
            None, op.tokenizer, n_seq=a.n_seq, seq_len=a.seq_len, seed=0, max_seq_len=model.config.max_seq_len
        )
        opts = dict(steps=a.steps, tokens_per_step=a.tokens_per_step, train_n_seq=a.train_n_seq)
        run["options"] = {"n_seq": a.n_seq, "seq_len": a.seq_len, "eval_split": data.source, **opts}
        twin = None
        for kind in a.kinds.split(","):  # each lens on the trained model, then on its twin
            for untrained in (False, True) if not a.no_twin else (False,):
                stage = f"{'untrained_' if untrained else ''}{kind}_lens"
                if (data_dir / f"{stage}.nc").is_file():
                    continue
                if untrained and twin is None:
                    twin = untrained_twin(model, seed=0)
                    twin.tokenizer = op.tokenizer  # the training split in the same tokenizer
                m = twin if untrained else model
                t0, c0 = time.perf_counter(), time.process_time()
                print(f"lens_atlas: {name}: {stage} ...", file=sys.stderr, flush=True)
                ds = lens_readout(m, data, kind=kind, checkpoint=path, **(opts if kind == "tuned" else {}))
                write_netcdf(ds, data_dir / f"{stage}.nc")
                run["stages"][stage] = {
                    "wall_s": round(time.perf_counter() - t0, 1),
                    "cpu_s": round(time.process_time() - c0, 1),
                    **{k: ds.attrs.get(k) for k in ("train_cpu_seconds", "eval_cpu_seconds", "cache")},
                }
                run_file.write_text(json.dumps(jsonable(run), indent=1) + "\n")
                print(f"lens_atlas: {name}: {stage}: {run['stages'][stage]}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
