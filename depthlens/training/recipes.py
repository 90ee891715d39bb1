"""The committed recipes, generated from one place so every number in them has a stated origin.

    python -m depthlens.training.recipes          # rewrite depthlens/recipes/{zoo_cpu,paper_gpu}.json

* `zoo_cpu.json`: the shipped CPU zoo, ten designs x L in {4, 8, 16, 32} at one iso-parameter budget on
  the offline bytes corpus (seq 128), each design at its own peak LR (from the sweep below); the L = 16
  and 32 runs of Pre-LN, HC, mHC and Full/Block AttnRes keep log-spaced analysis snapshots.
* `zoo_cpu_lr.json`: the per-design LR sweep behind it (3 peak LRs at L = 8, half the token budget);
  its results are committed as `zoo_cpu_lr_sweep.json` (`collect_lr_sweep`) and read back here.
* `paper_gpu.json`: the paper-scale grid, ten designs x seven depths at ~400M total params (GPT-2 vocab,
  seq 2048, 2^19-token batches, 20 tokens/param) x a per-design peak-LR sweep; launched with torchrun.

Widths come from the shape planner (depthlens.training.shapes) per design, including the design's own
parameter overhead; at CPU scale the residual left by rounding d is absorbed in d_ff (docs/training.md#shapes),
so every zoo model lands within a few percent of the target. The recipes record the planned counts; the
trainer records the achieved ones in each checkpoint's train.json.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..designs import SLUGS, checkpoint_name
from ..io.atomic import atomic_write_text
from .shapes import GPT2_VOCAB, param_counts, solve_width

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"

# --- the CPU zoo ------------------------------------------------------------------------------------
ZOO_DEPTHS = (4, 8, 16, 32)  # 32: the paper's deep end (276 late pairs), the mission's `hc_l32` example
ZOO_LRS = (1.5e-3, 3e-3, 6e-3, 1.2e-2)  # the sweep's start grid: x2 steps around the 3e-3 of the first zoo ...
ZOO_LR_CANDIDATES = tuple(3e-3 * 2.0**k for k in range(-4, 5))  # ... extended by x2 steps until the optimum is interior
ZOO_SWEEP_DEPTH, ZOO_SWEEP_STEPS = 8, 150  # a mid depth at ~40 % of the budget: what one core affords for 40 runs
ZOO_CONFIRM_DEPTH = 32  # the optimum re-checked at the deep end, where the paper's claims are made ...
ZOO_CONFIRM_DESIGNS = ("preln", "hc", "mhc", "full_attnres", "block_attnres")  # ... for the designs they name
# Training seeds (init and data order) per (design, depth): a design-level claim is about training runs, so it needs
# their spread. 8 where the paper's headline claims live (Pre-LN, HC, Full AttnRes at L = 16, 32): with 3, a
# simulation from the observed variances gave 0.42 power for "permutation share: Full AttnRes > Pre-LN", 0.86 with
# 5 and 1.00 with 10 (issue 32); 5 for mHC and Block AttnRes at L = 32, 3 at L = 16; one seed elsewhere.
ZOO_SEED_DESIGNS, ZOO_SEED_DEPTHS = ZOO_CONFIRM_DESIGNS, (16, 32)
ZOO_SEED_COUNTS: dict[tuple[str, int], int] = {
    **{(d, L): 8 for d in ("preln", "hc", "full_attnres") for L in ZOO_SEED_DEPTHS},
    **{(d, 32): 5 for d in ("mhc", "block_attnres")},
    **{(d, 16): 3 for d in ("mhc", "block_attnres")},
}
ZOO_DEFAULT_LR = 3e-3  # used for a design until the sweep has a result for it
ZOO_SNAPSHOT_DESIGNS = ("preln", "hc", "mhc", "full_attnres", "block_attnres")  # depth over training (track)
ZOO_SNAPSHOT_DEPTHS = (16, 32)
ZOO_TARGET = 230_000  # total params: the middle of the 200-250K band where the width grid fits all designs best
ZOO_CORPUS = {"source": "packages", "tokenizer": "bytes", "max_bytes": 8_000_000, "val_fraction": 0.05, "seed": 0}
ZOO_DATA = ".cache/depthlens/corpus-bytes-8M"  # derived, git-ignored; scripts/train_zoo.sh builds it from ZOO_CORPUS

# --- the paper grid ---------------------------------------------------------------------------------
PAPER_DEPTHS = (16, 20, 24, 32, 40, 56, 70)  # spans the paper's 16x1216 .. 70x640 endpoints
PAPER_TARGET = 407_000_000  # lands exactly on 16x1216 and 70x640 for Pre-LN (docs/training.md#shapes)
PAPER_LRS = (1.5e-3, 3e-3, 6e-3, 1.2e-2)  # per-design sweep: x2 steps around the usual 3e-3 at 400M
PAPER_SEQ = 2048
PAPER_BATCH = 256  # sequences: 2^19 tokens per step (build-nanogpt's FineWeb-Edu batch)


def iso_shape(
    design: str,
    n_layer: int,
    target: int,
    vocab_size: int,
    *,
    multiple: int = 16,
    head_dim: int = 16,
    ffn_step: int = 16,
    ffn_ratio: tuple[float, float] = (1.0, 6.0),
) -> dict[str, Any]:
    """Width d (a multiple of `multiple`, from the planner) and d_ff (a multiple of `ffn_step` with
    d_ff/d in `ffn_ratio`) whose total params are nearest `target`; ties prefer d_ff/d near 8/3."""
    d = solve_width(target, n_layer, design, vocab_size, multiple, head_dim=head_dim, ffn_multiple=ffn_step)
    lo, hi = math.ceil(ffn_ratio[0] * d / ffn_step), math.floor(ffn_ratio[1] * d / ffn_step)

    def cost(d_ff: int) -> tuple[float, float]:
        total = param_counts(design, n_layer, d, vocab_size, d_ff=d_ff, head_dim=head_dim)["total"]
        return abs(total / target - 1), abs(math.log(d_ff / d / (8 / 3)))

    d_ff = min((k * ffn_step for k in range(lo, hi + 1)), key=cost)
    c = param_counts(design, n_layer, d, vocab_size, d_ff=d_ff, head_dim=head_dim)
    return {
        "d_model": d,
        "n_head": d // head_dim,
        "d_ff": d_ff,
        "planned_total": c["total"],
        "planned_rel_error": round(c["total"] / target - 1, 4),
        "ffn_ratio": round(d_ff / d, 3),
    }


def zoo_lr_results(path: Path | None = None) -> dict[str, Any]:
    """The committed LR-sweep results ({"val_loss": {design: {lr: loss}}, "chosen": {design: lr}}), or {}."""
    path = path or RECIPES_DIR / "zoo_cpu_lr_sweep.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _zoo_base() -> dict[str, Any]:
    return {
        "model": {"vocab_size": 257, "max_seq_len": 128},
        "data": ZOO_DATA,
        "tokenizer": "bytes",
        "seq_len": 128,
        # 400 steps x 16 x 128 = 819K tokens per model (~3.5 tokens/param): what one core affords for
        # 30 models in about an hour given the slowest designs (mHC, MoDA, AttnRes at L=16)
        "global_batch": 16,
        "micro_batch": 0,
        "steps": 400,
        # peak LR: per design from the sweep (zoo_cpu_lr_sweep.json); this default only until it has run
        "lr": ZOO_DEFAULT_LR,
        "min_lr_factor": 0.1,
        "warmup": 20,
        "schedule": "wsd",
        "decay_frac": 0.2,
        "weight_decay": 0.1,
        "decay_mixing": False,
        "betas": [0.9, 0.95],
        "grad_clip": 1.0,
        "seed": 0,
        "data_seed": 0,
        "eval_every": 100,
        "eval_batches": 4,
        "final_eval_batches": 64,
        "log_every": 10,
        "save_every": 100,
        "device": "cpu",
        "dtype": "fp32",
        "threads": 1,
    }


def _zoo_model(design: str, L: int) -> tuple[dict[str, Any], dict[str, Any]]:
    # head_dim 8 and width/FFN steps of 8: at L = 32 the budget leaves d = 16-24, where steps of 16 miss the
    # target by up to 18 %; with 8 every design and depth lands within 4 % of it
    shape = iso_shape(design, L, ZOO_TARGET, 257, multiple=8, head_dim=8, ffn_step=8)
    return (
        {"arch": design, "n_layer": L, "d_model": shape["d_model"], "n_head": shape["n_head"], "d_ff": shape["d_ff"]},
        shape,
    )


def sweep_run(
    model: dict[str, Any], shape: dict[str, Any], lr: float, out: str, sweep: str, **meta: Any
) -> dict[str, Any]:
    """One run of an LR sweep on the zoo's iso-parameter shapes: the model at peak LR `lr`, trained in `out`
    (its checkpoint exported inside), with the meta its result is read back by (`meta`: the sweep's own)."""
    return {
        "model": model,
        "lr": lr,
        "out": out,
        "export": f"{out}/checkpoint",
        "meta": {"iso_target_params": ZOO_TARGET, "sweep": sweep, **shape, **meta},
    }


def lr_sweep_name(design: str, n_layer: int, lr: float) -> str:
    return f"{checkpoint_name(design, n_layer)}_lr{lr:g}"


def zoo_lr_recipe() -> dict[str, Any]:
    """Every run the per-design LR sweep may need: each design at each sweep depth and each candidate LR
    (ZOO_SWEEP_STEPS steps). Which of them actually run is decided by `lr_sweep_pending` from the results."""
    base = {**_zoo_base(), "steps": ZOO_SWEEP_STEPS, "eval_every": 0, "final_eval_batches": 32, "save_every": 50}
    runs = {}
    for design in SLUGS:
        for L in (ZOO_SWEEP_DEPTH, ZOO_CONFIRM_DEPTH):
            if L == ZOO_CONFIRM_DEPTH and design not in ZOO_CONFIRM_DESIGNS:
                continue
            model, shape = _zoo_model(design, L)
            for lr in ZOO_LR_CANDIDATES:
                name = lr_sweep_name(design, L, lr)
                runs[name] = sweep_run(model, shape, lr, f".cache/depthlens/runs/zoo_lr/{name}", "zoo_lr")
    return {
        "description": f"Per-design peak-LR sweep for the CPU zoo: {ZOO_SWEEP_STEPS} steps at L={ZOO_SWEEP_DEPTH} "
        f"(every design) and L={ZOO_CONFIRM_DEPTH} (the designs the paper's claims name), LR on "
        "a x2 grid extended until the optimum is interior. Run by `scripts/train_zoo.sh --sweep`; "
        "results in zoo_cpu_lr_sweep.json.",
        "corpus": ZOO_CORPUS,
        "base": base,
        "runs": runs,
    }


def _sweep_losses(recipe: dict[str, Any]) -> dict[str, dict[str, dict[float, float]]]:
    """{design: {str(L): {lr: final val loss}}} of the sweep runs that have finished."""
    losses: dict[str, dict[str, dict[float, float]]] = {}
    for run in recipe["runs"].values():
        train = Path(run["export"]) / "train.json"
        if train.exists():
            design, L = run["model"]["arch"], str(run["model"]["n_layer"])
            losses.setdefault(design, {}).setdefault(L, {})[float(run["lr"])] = json.loads(train.read_text())[
                "final_val_loss"
            ]
    return losses


def _next_lrs(tried: dict[float, float], start: tuple[float, ...]) -> list[float]:
    """The LRs still to run at one (design, depth): the start grid, then one x2 step beyond an edge optimum."""
    todo = [lr for lr in start if lr not in tried]
    if todo:
        return todo
    lrs = sorted(tried)
    best = min(tried, key=tried.__getitem__)
    if best == lrs[-1]:
        return [best * 2]
    if best == lrs[0]:
        return [best / 2]
    return []


def lr_sweep_pending(recipe: dict[str, Any] | None = None) -> list[str]:
    """Names of the sweep runs to train next (empty when every optimum is interior): the L = ZOO_SWEEP_DEPTH
    grid first; then, for ZOO_CONFIRM_DESIGNS, the x2 neighbourhood of that optimum at L = ZOO_CONFIRM_DEPTH."""
    recipe = recipe or zoo_lr_recipe()
    losses = _sweep_losses(recipe)
    pending = []
    for design in SLUGS:
        shallow = losses.get(design, {}).get(str(ZOO_SWEEP_DEPTH), {})
        lrs = _next_lrs(shallow, ZOO_LRS)
        if not lrs and design in ZOO_CONFIRM_DESIGNS:
            best = min(shallow, key=shallow.__getitem__)
            deep = losses.get(design, {}).get(str(ZOO_CONFIRM_DEPTH), {})
            todo = [(ZOO_CONFIRM_DEPTH, lr) for lr in _next_lrs(deep, (best / 2, best, best * 2))]
        else:
            todo = [(ZOO_SWEEP_DEPTH, lr) for lr in lrs]
        for L, lr in todo:
            name = lr_sweep_name(design, L, lr)
            if name not in recipe["runs"]:
                raise ValueError(f"LR sweep: {design} at L={L} needs LR {lr:g}, outside ZOO_LR_CANDIDATES")
            pending.append(name)
    return pending


def collect_lr_sweep(recipe: dict[str, Any] | None = None, path: Path | None = None) -> dict[str, Any]:
    """Read the sweep runs' final validation losses, pick the best LR per design and depth, write the results."""
    recipe = recipe or zoo_lr_recipe()
    losses = _sweep_losses(recipe)
    chosen = {d: {L: min(v, key=v.__getitem__) for L, v in by_depth.items()} for d, by_depth in losses.items()}
    interior = {d: {L: min(v) < chosen[d][L] < max(v) for L, v in by_depth.items()} for d, by_depth in losses.items()}
    res = {
        "description": f"Final validation loss (nats/byte, 32 val batches) after {ZOO_SWEEP_STEPS} steps, per "
        f"design and depth (L={ZOO_SWEEP_DEPTH}: every design; L={ZOO_CONFIRM_DEPTH}: the designs "
        "the paper's claims name). `chosen` = the argmin, used by zoo_cpu.json at that depth (other "
        f"depths use L={ZOO_SWEEP_DEPTH}'s); `interior` says the optimum is not at an edge of the "
        "grid. A short-budget proxy: the best LR at 400 steps may be one notch lower.",
        "steps": ZOO_SWEEP_STEPS,
        "decay_mixing": _zoo_base()["decay_mixing"],
        "val_loss": {
            d: {L: {f"{lr:g}": v for lr, v in sorted(by_lr.items())} for L, by_lr in by_depth.items()}
            for d, by_depth in losses.items()
        },
        "chosen": chosen,
        "interior": interior,
        "pending": lr_sweep_pending(recipe),
    }
    path = path or RECIPES_DIR / "zoo_cpu_lr_sweep.json"
    atomic_write_text(path, json.dumps(res, indent=1, sort_keys=True) + "\n")
    return res


def zoo_lr(design: str, n_layer: int, results: dict[str, Any] | None = None) -> tuple[float, str]:
    """(peak LR, where it comes from) for one zoo run: the sweep's optimum at this depth if it was swept
    there, else at ZOO_SWEEP_DEPTH, else the default."""
    chosen = (zoo_lr_results() if results is None else results).get("chosen", {}).get(design, {})
    if not isinstance(chosen, dict):  # a zoo-v2 results file: one LR per design (L = 8)
        return float(chosen), f"zoo_cpu_lr_sweep.json (L={ZOO_SWEEP_DEPTH})"
    for L in (str(n_layer), str(ZOO_SWEEP_DEPTH)):
        if L in chosen:
            return float(chosen[L]), f"zoo_cpu_lr_sweep.json (L={L})"
    return ZOO_DEFAULT_LR, "default"


def zoo_seeds(design: str, n_layer: int) -> tuple[int, ...]:
    """The training seeds of one (design, depth) of the zoo: 0 .. n-1 (ZOO_SEED_COUNTS; one elsewhere)."""
    return tuple(range(ZOO_SEED_COUNTS.get((design, n_layer), 1)))


def lr400_adopted(path: Path | None = None) -> dict[tuple[str, int], tuple[float, str]]:
    """{(design, depth): (LR, source)} from the LR check at the zoo's budget, once its plan is done (nothing while
    runs are pending: a half-read check is not adopted). The check's winner per cell (depthlens/training/lr400.py)."""
    path = path or RECIPES_DIR / "zoo_cpu_lr400_results.json"
    res = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if not res or res.get("pending"):
        return {}
    out = {}
    for cell, c in res.get("cells", {}).items():
        design, L = cell.rsplit("_l", 1)
        out[design, int(L)] = (
            float(c["winner"]),
            f"zoo_cpu_lr400_results.json (400 steps, {c['common_seeds']} seeds over {len(c['finalists'])} LRs)",
        )
    return out


def zoo_recipe() -> dict[str, Any]:
    base = _zoo_base()
    results, adopted = zoo_lr_results(), lr400_adopted()
    runs = {}
    for design in SLUGS:
        for L in ZOO_DEPTHS:
            model, shape = _zoo_model(design, L)
            lr, source = adopted.get((design, L)) or zoo_lr(design, L, results)
            for seed in zoo_seeds(design, L):
                name = checkpoint_name(design, L) + (f"_s{seed}" if seed else "")
                runs[name] = {
                    "model": model,
                    "lr": lr,
                    "out": f".cache/depthlens/runs/zoo/{name}",
                    "export": f"checkpoints/{name}",
                    "meta": {"iso_target_params": ZOO_TARGET, **shape, "lr_source": source},
                }
                if seed:  # a training run's seed: its init and its data order
                    runs[name].update(seed=seed, data_seed=seed)
                if seed == 0 and design in ZOO_SNAPSHOT_DESIGNS and L in ZOO_SNAPSHOT_DEPTHS:
                    runs[name]["snapshot_every_log2"] = True
    return {
        "description": "CPU zoo v3: 10 designs x L in {4, 8, 16, 32} at ~230K total params (bytes corpus, "
        "seq 128), per-design peak LR from zoo_cpu_lr_sweep.json (150 steps) or, where adopted, "
        "zoo_cpu_lr400_results.json (the zoo's 400 steps; each run's meta.lr_source says which), training seeds "
        "(init and data order) 0 .. n-1 with n = "
        + ", ".join(f"{n} for {d} at L = {L}" for (d, L), n in ZOO_SEED_COUNTS.items())
        + " (`<name>_s<seed>`). Generated by "
        "`python -m depthlens.training.recipes`; run with scripts/train_zoo.sh.",
        "corpus": ZOO_CORPUS,
        "base": base,
        "runs": runs,
    }


def paper_recipe() -> dict[str, Any]:
    tokens = 20 * PAPER_TARGET  # Chinchilla: 20 tokens per (total) parameter
    steps = math.ceil(tokens / (PAPER_BATCH * PAPER_SEQ))
    base = {
        "model": {"vocab_size": GPT2_VOCAB, "max_seq_len": 4096, "ffn_multiple": 64},
        "data": "data/finewebedu10B",
        "tokenizer": "gpt2",
        "seq_len": PAPER_SEQ,
        "global_batch": PAPER_BATCH,
        "micro_batch": 16,
        "steps": steps,
        "lr": 3e-3,
        "min_lr_factor": 0.1,
        "warmup": 700,
        "schedule": "wsd",
        "decay_frac": 0.2,
        "weight_decay": 0.1,
        "betas": [0.9, 0.95],
        "grad_clip": 1.0,
        "seed": 0,
        "data_seed": 0,
        "eval_every": 500,
        "eval_batches": 20,
        "final_eval_batches": 80,
        "log_every": 10,
        "save_every": 500,
        "device": "cuda",
        "dtype": "bf16",
        "compile": True,
        "fsdp": False,
    }
    runs = {}
    for design in SLUGS:
        for L in PAPER_DEPTHS:
            d = solve_width(PAPER_TARGET, L, design, GPT2_VOCAB, 64, head_dim=64, ffn_multiple=64)
            c = param_counts(design, L, d, GPT2_VOCAB, head_dim=64, ffn_multiple=64)
            for lr in PAPER_LRS:
                name = f"{checkpoint_name(design, L)}_lr{lr:g}"
                runs[name] = {
                    "model": {"arch": design, "n_layer": L, "d_model": d, "n_head": d // 64},
                    "lr": lr,
                    "out": f"runs/paper/{name}",
                    "export": f"checkpoints/paper/{name}",
                    "meta": {
                        "iso_target_params": PAPER_TARGET,
                        "planned_total": c["total"],
                        "planned_rel_error": round(c["total"] / PAPER_TARGET - 1, 4),
                    },
                }
    return {
        "description": f"Paper-scale grid: 10 designs x L in {list(PAPER_DEPTHS)} at ~407M params, "
        f"x peak LR in {list(PAPER_LRS)}; FineWeb-Edu GPT-2 shards, {steps} steps of "
        f"{PAPER_BATCH}x{PAPER_SEQ} tokens (20 tokens/param). See docs/training.md.",
        "base": base,
        "runs": runs,
    }


def corpus_command(spec: dict[str, Any], out: str | os.PathLike) -> str:
    """The `depthlens prepare` command that builds what a recipe's `corpus` block describes into `out`."""
    import shlex

    if spec.get("source") != "packages":
        raise ValueError(
            f"corpus source {spec.get('source')!r}: only the packaged offline corpus ('packages') is built"
        )
    words = [
        "depthlens",
        "prepare",
        "--out",
        str(out),
        "--tokenizer",
        str(spec["tokenizer"]),
        "--val-fraction",
        f"{spec['val_fraction']:g}",
        "--seed",
        str(spec["seed"]),
    ]
    if spec.get("max_bytes") is not None:
        words += ["--max-bytes", str(spec["max_bytes"])]
    return shlex.join(words)


def prepare_zoo_data(
    recipe: dict[str, Any], data_dir: str | os.PathLike | None = None, *, log: Callable[[str], None] | None = None
) -> Path:
    """Build the zoo corpus described by the recipe's `corpus` block, unless it is already there.
    `log` (e.g. a stderr writer) hears one line before a build starts and one when it is done."""
    import time

    from ..data.corpus import build_corpus
    from ..data.shards import read_manifest
    from ..data.tokenizers import get_tokenizer

    spec = recipe["corpus"]
    out = Path(data_dir or recipe["base"]["data"])
    m = read_manifest(out)
    opts = (m or {}).get("options", {})
    if (
        m is not None
        and all(opts.get(k) == spec[k] for k in ("source", "max_bytes", "val_fraction", "seed"))
        and m.get("tokenizer", {}).get("name") == get_tokenizer(spec["tokenizer"]).name
    ):
        return out
    if log is not None:
        log(f"building the recipe's corpus into {out} (once; the same as `{corpus_command(spec, out)}`) ...")
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    manifest = build_corpus(
        out,
        get_tokenizer(spec["tokenizer"]),
        max_bytes=spec["max_bytes"],
        val_fraction=spec["val_fraction"],
        seed=spec["seed"],
    )
    if log is not None:
        n = {k: v.get("n_tokens") for k, v in manifest.get("splits", {}).items()}
        log(f"corpus ready: {', '.join(f'{k} {v:,} tokens' for k, v in n.items())} in {time.perf_counter() - t0:.1f} s")
    return out


def stale_runs(recipe_path: Path, names: list[str]) -> list[str]:
    """The runs of `names` whose export has to be (re)trained: missing, or trained from another recipe than the
    one `recipe_path` gives now (an older zoo: other LR, seed, weight-decay rule, ...). The run directory and
    `resume` do not count: they do not change the weights."""
    from .config import load_recipe

    out = []
    for name in names:
        want = load_recipe(recipe_path, run=name).to_dict()
        train = Path(want["export"]) / "train.json"
        have = json.loads(train.read_text(encoding="utf-8")).get("recipe", {}) if train.is_file() else None
        ignore = ("resume", "out", "meta")  # meta: where the recipe's numbers came from (lr_source, ...), not training
        if have is None or {k: v for k, v in have.items() if k not in ignore} != {
            k: v for k, v in want.items() if k not in ignore
        }:
            out.append(name)
    return out


def write_recipes(directory: Path = RECIPES_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, recipe in (
        ("zoo_cpu.json", zoo_recipe()),
        ("zoo_cpu_lr.json", zoo_lr_recipe()),
        ("paper_gpu.json", paper_recipe()),
    ):
        path = directory / name
        atomic_write_text(path, json.dumps(recipe, indent=1) + "\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["collect-lr-sweep"]:
        print(json.dumps(collect_lr_sweep()["chosen"]))
    elif sys.argv[1:2] == ["stale"]:  # stale RECIPE NAME...: the runs to (re)train
        sys.stdout.write("".join(f"{n}\n" for n in stale_runs(Path(sys.argv[2]), sys.argv[3:])))
    elif sys.argv[1:2] == ["lr-sweep-pending"]:
        sys.stdout.write("".join(f"{n}\n" for n in lr_sweep_pending()))
    elif sys.argv[1:2] == ["prepare-zoo-data"]:
        print(prepare_zoo_data(json.loads((RECIPES_DIR / "zoo_cpu.json").read_text())))
    else:
        for p in write_recipes():
            print(p)
