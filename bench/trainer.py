"""Trainer throughput vs a plain nanoGPT-style loop, and the step-time overhead of each design over Pre-LN.

    .venv/bin/python bench/trainer.py [--steps 30] [--rounds 3] [--out reports/bench/trainer.json]

1. Same model class and shape (the zoo's preln_l8: L=8, d=48, d_ff=112, bytes vocab), same batch
   (16 x 128 tokens), same AdamW + clip: the trainer (`depthlens.training.trainer.train`, data from
   token shards, LR schedule, logging) against a minimal hand-written loop over pre-loaded batches.
   The two run one step each in turn (the plain step inside the trainer's per-step callback, timed
   apart), so co-runners on a shared CPU hit both alike; everything the trainer does per step counts.
   The ratio uses each side's median step over all rounds.
2. Each design that builds, at the same backbone shape (L=8 d=48 and L=16 d=32), timed with the plain
   loop: fastest step relative to Pre-LN's at that shape (rounds cycle through the designs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from depthlens.data.shards import write_shard  # noqa: E402
from depthlens.data.tokenizers import ByteTokenizer  # noqa: E402
from depthlens.designs import SLUGS  # noqa: E402
from depthlens.models.config import ModelConfig  # noqa: E402
from depthlens.models.model import build_model  # noqa: E402
from depthlens.training.config import RunConfig  # noqa: E402
from depthlens.training.trainer import param_groups, train  # noqa: E402

SHAPE = dict(arch="preln", n_layer=8, d_model=48, n_head=3, d_ff=112, vocab_size=257, max_seq_len=128)
BATCH, SEQ = 16, 128


def machine() -> dict:
    cpu = (
        next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "loadavg_start": os.getloadavg()[0],
    }


def make_data(directory: Path) -> Path:
    """Bytes shards of the packaged corpus text when available, else a synthetic stand-in (same shapes)."""
    tok = ByteTokenizer()
    try:
        from depthlens.data.corpus import english_sources

        text = b"".join(s.read() for s in english_sources()[:3]).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - the bench only needs some tokens
        text = "".join(chr(32 + (i * 7919) % 95) for i in range(2_000_000))
    ids = np.array([tok.bos_id] + tok.encode(text[:2_000_000]))
    write_shard(directory / "train_000.bin", ids[:-100_000])
    write_shard(directory / "val_000.bin", ids[-100_000:])
    return directory


class PlainLoop:
    """nanoGPT's core loop, nothing else: forward, loss, backward, clip, AdamW step over pre-loaded batches."""

    def __init__(self, cfg: ModelConfig, batches: torch.Tensor, lr: float = 3e-3):
        self.model = build_model(cfg, seed=0)
        self.opt = torch.optim.AdamW(param_groups(self.model, 0.1), lr=lr, betas=(0.9, 0.95))
        self.batches, self.s = batches, 0

    def step(self) -> float:
        """One optimizer step; returns its wall time."""
        t0 = time.perf_counter()
        xy = self.batches[self.s % len(self.batches)]
        self.s += 1
        logits = self.model(xy[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), xy[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        loss.item()  # the trainer logs the loss every step, so sync here too
        return time.perf_counter() - t0


def paired(data: Path, out: Path, batches: torch.Tensor, steps: int) -> tuple[list[float], list[float]]:
    """The real trainer and the plain loop, one step each in turn (the plain step runs inside the trainer's
    per-step callback and is timed apart), so a co-runner's burst hits both alike.

    A trainer step is the time from the end of the previous callback to the start of this one: the whole
    loop body (data from shards, LR schedule, step, logging, save checks) counts."""
    plain = PlainLoop(ModelConfig(**SHAPE), batches)
    cfg = RunConfig(
        model=SHAPE,
        data=str(data),
        seq_len=SEQ,
        global_batch=BATCH,
        steps=steps,
        lr=3e-3,
        warmup=2,
        out=str(out),
        final_eval_batches=1,
        resume=False,
        device="cpu",
    )
    t_plain, t_trainer, resumed = [], [], [None]

    def cb(step: int, rec: dict) -> None:
        now = time.perf_counter()
        if resumed[0] is not None:
            t_trainer.append(now - resumed[0])
        t_plain.append(plain.step())
        resumed[0] = time.perf_counter()

    train(cfg, callback=cb)
    return t_plain[1:], t_trainer  # the first plain step pairs with the trainer's untimed first step


def plain_loop(cfg: ModelConfig, batches: torch.Tensor, steps: int) -> list[float]:
    loop = PlainLoop(cfg, batches)
    return [loop.step() for _ in range(steps)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--design-steps", type=int, default=8)
    p.add_argument("--out", default="reports/bench/trainer.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    info = machine()
    warm = 3
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = make_data(tmp / "data")
        from depthlens.data.shards import TokenDataset

        ds = TokenDataset.from_dir(data)
        rng = np.random.default_rng(0)
        batches = torch.from_numpy(ds.batch(rng.integers(0, ds.n_sequences(SEQ), 16 * BATCH), SEQ)).view(
            16, BATCH, SEQ + 1
        )
        plain, trainer = [], []
        for r in range(args.rounds):
            p_, t_ = paired(data, tmp / f"run{r}", batches, args.steps + warm)
            plain += p_[warm:]
            trainer += t_[warm:]
            print(
                f"round {r}: plain {statistics.median(p_) * 1e3:.1f} ms, trainer {statistics.median(t_) * 1e3:.1f} ms",
                flush=True,
            )
        tok = BATCH * SEQ
        throughput = {
            "shape": SHAPE,
            "batch": BATCH,
            "seq_len": SEQ,
            "steps_per_round": args.steps,
            "rounds": args.rounds,
            "plain_step_ms_median": statistics.median(plain) * 1e3,
            "trainer_step_ms_median": statistics.median(trainer) * 1e3,
            "plain_tok_s": tok / statistics.median(plain),
            "trainer_tok_s": tok / statistics.median(trainer),
        }
        throughput["trainer_over_plain"] = throughput["trainer_tok_s"] / throughput["plain_tok_s"]
        throughput["meets_0.95"] = throughput["trainer_over_plain"] >= 0.95
        print(json.dumps(throughput, indent=1), flush=True)

        # design overheads: rounds cycle through the designs so a co-runner's burst hits them all alike;
        # the overhead uses each design's fastest step (the least-disturbed estimate of its own cost)
        shapes = ((8, 48), (16, 32))
        cfgs = {
            (slug, L): ModelConfig(
                **{**SHAPE, "arch": slug, "n_layer": L, "d_model": d, "n_head": d // 16, "d_ff": None}
            )
            for L, d in shapes
            for slug in SLUGS
        }
        times: dict[tuple[str, int], list[float]] = {}
        designs: dict[str, dict] = {slug: {} for slug in SLUGS}
        for key, cfg in cfgs.items():
            try:
                designs[key[0]][f"L{key[1]}"] = {"params": sum(p.numel() for p in build_model(cfg).parameters())}
                times[key] = []
            except ValueError as e:  # a design not implemented in this build
                designs[key[0]][f"L{key[1]}"] = {"error": str(e)}
        for _ in range(args.rounds):
            for key in times:
                times[key] += plain_loop(cfgs[key], batches, args.design_steps + 2)[2:]
        for L, d in shapes:
            base = min(times[("preln", L)])
            for slug in SLUGS:
                if (slug, L) not in times:
                    continue
                row = designs[slug][f"L{L}"]
                t = times[(slug, L)]
                row.update(
                    step_ms_min=min(t) * 1e3,
                    step_ms_median=statistics.median(t) * 1e3,
                    overhead_vs_preln=min(t) / base - 1,
                )
                print(
                    f"L={L} d={d} {slug:14s} {row['step_ms_min']:8.1f} ms  {row['overhead_vs_preln']:+.0%}", flush=True
                )
    info["loadavg_end"] = os.getloadavg()[0]
    result = {
        "machine": info,
        "throughput": throughput,
        "designs": designs,
        "note": "1 torch thread; shared 2-core box: loadavg shows co-runners, rounds alternate to share the noise",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
