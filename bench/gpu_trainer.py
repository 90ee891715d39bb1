"""Trainer throughput on synthetic shards: tokens/s and MFU of one recipe run, as JSON (bench/gpu.sh step b).

    python bench/gpu_trainer.py --work DIR --report FILE [--tokens N] -- RECIPE --run NAME key=value ...

1. writes `train_000.bin` / `val_000.bin` of uniform random GPT-2 ids (0..50256, seed 0) into DIR/data
   (no manifest: TokenDataset.from_dir finds `*train_<digits>.bin`), so the recipe's corpus is not needed;
2. runs the recipe in this process (depthlens.training.trainer.run_recipe) with the given overrides plus
   data=DIR/data tokenizer=gpt2 out=DIR/run export=DIR/ckpt log_every=1 resume=false (appended last, so
   they win);
3. reads DIR/run/log.jsonl and writes FILE: median tok_s and mfu over the logged steps after the first
   10 % (at least the first step: compile and allocator warm-up), the whole-run tokens_per_s of train.json,
   the device name and the torch version. mfu is null on CPU (no meaningful peak; see trainer.PEAK_FLOPS).
Random tokens: the loss is meaningless (≈ ln 50257); only the speed is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPT2_VOCAB = 50257


def write_synthetic(directory: Path, n_train: int, n_val: int) -> None:
    from depthlens.data.shards import write_shard

    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    write_shard(directory / "train_000.bin", rng.integers(0, GPT2_VOCAB, n_train, dtype=np.int64).astype(np.uint16))
    write_shard(directory / "val_000.bin", rng.integers(0, GPT2_VOCAB, n_val, dtype=np.int64).astype(np.uint16))


def summarize(log: Path, record: dict) -> dict:
    import torch

    rows = [json.loads(ln) for ln in log.read_text(encoding="utf-8").splitlines() if ln.strip()]
    rows = [r for r in rows if "tok_s" in r]
    if not rows:
        raise SystemExit(f"{log}: no step records")
    skip = max(1, len(rows) // 10) if len(rows) > 1 else 0
    steady = rows[skip:]
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    dev = record.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = str(dev).startswith("cuda") and torch.cuda.is_available()
    return {
        "tokens_per_s": statistics.median(r["tok_s"] for r in steady),
        "mfu": statistics.median(mfus) if mfus else None,
        "tokens_per_s_whole_run": record.get("tokens_per_s"),
        "steps_logged": len(rows),
        "steps_skipped_as_warmup": skip,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(0) if on_cuda else "cpu",
        "torch": torch.__version__,
        "n_params": (record.get("params") or {}).get("total"),
        "steps": record.get("steps"),
        "tokens": record.get("tokens"),
        "wall_time_s": record.get("wall_time_s"),
        "method": "median of the per-step log.jsonl tok_s / mfu after the first 10% of steps (warm-up); "
        "synthetic uniform GPT-2 ids",
    }


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="scratch dir: data/, run/, ckpt/")
    ap.add_argument("--report", type=Path, required=True, help="JSON summary written here")
    ap.add_argument("--tokens", type=int, default=2_000_000, help="synthetic train tokens (val: a tenth + 1 window)")
    args = ap.parse_args(ours)
    if not rest:
        ap.error("give the trainer's arguments after --: RECIPE [--run NAME] [key=value ...]")
    data = args.work / "data"
    write_synthetic(data, args.tokens, args.tokens // 10 + 8192)
    from depthlens.io.atomic import atomic_write_text
    from depthlens.training.trainer import LOG, run_recipe

    p = argparse.ArgumentParser()
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--run")
    t = p.parse_intermixed_args(rest)
    forced = [
        f"data={data}",
        "tokenizer=gpt2",
        f"out={args.work / 'run'}",
        f"export={args.work / 'ckpt'}",
        "log_every=1",
        "resume=false",
    ]
    record = run_recipe(t.recipe, [*t.overrides, *forced], run=t.run)
    summary = {
        "recipe": t.recipe,
        "run": t.run,
        "overrides": [*t.overrides, *forced],
        **summarize(args.work / "run" / LOG, record),
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.report, json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("tokens_per_s", "mfu", "device_name")}), flush=True)
    return summary


if __name__ == "__main__":
    main()
