"""The depthlens trainer: one readable loop in the nanoGPT / torchtitan mould.

    python -m depthlens.training.trainer RECIPE.json [run=NAME] [key=value ...]
    torchrun --standalone --nproc_per_node=8 -m depthlens.training.trainer RECIPE.json run=NAME

What it guarantees:

* data order is a pure function of (data_seed, step): step s trains on global samples s·B .. s·B+B-1
  (depthlens.data.shards.batch_indices); rank r takes a contiguous slice and micro-step a a contiguous
  slice of that, so world size and accumulation never change which sequences a step sees;
* the LR is a pure function of the step (schedule.py), so a resume needs only the step;
* the resume state (<out>/resume: safetensors + JSON, written atomically) holds model, optimizer, step
  and RNG; a run killed at any point and rerun with the same command ends bit-identical on CPU;
* at the end the model is exported as a depthlens checkpoint (depthlens.io.checkpoint) with train.json;
* optional analysis snapshots (`snapshots` / `snapshot_every_log2`): <out>/snapshots/step_NNNNNNN/ is a normal
  checkpoint plus snapshot.json {step, tokens, val_loss, run}, so `depthlens track` can follow depth use
  over training without retraining.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.shards import TokenDataset, batch_indices
from ..errors import DepthlensError
from ..io.atomic import atomic_write_text
from ..models.model import build_model
from .budget import PEAK_FLOPS, check_memory, device_bytes, flops_per_token, peak_flops, train_bytes  # noqa: F401
from .config import RunConfig, load_recipe, read_recipe, recipe_runs
from .distributed import (
    DistInfo,
    all_reduce,
    barrier,
    broadcast_object,
    clip_grad_norm,
    full_model_state,
    full_state,
    grad_sync,
    init_distributed,
    shutdown,
    sync_replicated_grads,
    wrap_model,
)
from .outputs import adopt_recipe_export, check_recipe_export, owned_outputs, run_owner  # noqa: F401
from .provenance import code_version, cpu_identity
from .schedule import lr_at
from .state import STATE_JSON, STATE_TENSORS, has_state, load_state, read_meta, save_state  # noqa: F401

LOG = "log.jsonl"


class TrainingDiverged(DepthlensError):
    """The training loss became NaN or infinite (the run stops; its last good resume state stays)."""


SNAPSHOTS = "snapshots"
SNAPSHOT_JSON = "snapshot.json"


def snapshot_dir(out: str | os.PathLike, step: int) -> Path:
    """Where the analysis snapshot of `step` lives: zero-padded so a plain sort is step order."""
    return Path(out) / SNAPSHOTS / f"step_{step:07d}"


Callback = Callable[[int, dict[str, Any]], None]


def param_groups(model: nn.Module, weight_decay: float, *, decay_mixing: bool = False) -> list[dict[str, Any]]:
    """AdamW groups: decay matrices and embeddings (>= 2-D), never gains, scalars or mixing logits (< 2-D);
    the residual design's own parameters (those of its Routers) only when `decay_mixing`."""
    from ..models.residual.base import Router

    mixing = set()
    if not decay_mixing:
        mixing = {id(p) for m in model.modules() if isinstance(m, Router) for p in m.parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    decayed = [p for p in params if p.dim() >= 2 and id(p) not in mixing]
    return [
        {"params": decayed, "weight_decay": weight_decay},
        {"params": [p for p in params if not (p.dim() >= 2 and id(p) not in mixing)], "weight_decay": 0.0},
    ]


def open_data(data: str | os.PathLike | TokenDataset, split: str) -> TokenDataset:
    return data if isinstance(data, TokenDataset) else TokenDataset.from_dir(data, split)


def micro_batch_ids(
    step: int, global_batch: int, data_seed: int, n_sequences: int, *, rank: int = 0, world: int = 1, micro: int = 0
) -> list[np.ndarray]:
    """Sequence ids of each micro-step of `rank` at `step`: rank r takes the r-th contiguous slice of the
    step's global ids, micro-step a the a-th contiguous slice of that. Concatenated over ranks and
    micro-steps they are always the step's global batch, in order."""
    ids = batch_indices(step, global_batch, data_seed, n_sequences)
    local = global_batch // world
    micro = micro or local
    mine = ids[rank * local : (rank + 1) * local]
    return [mine[a : a + micro] for a in range(0, local, micro)]


# -------------------------------------------------------------------------------------------------
# evaluation


def autocast(device: torch.device, dtype: str):
    return torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: str | os.PathLike | TokenDataset,
    seq_len: int,
    *,
    batch_size: int = 16,
    max_sequences: int = 0,
    dtype: str = "fp32",
    dist: DistInfo | None = None,
) -> float:
    """Mean next-token loss (nats/token) over the first `max_sequences` windows of the val split (all when 0),
    `batch_size` windows per forward. Ranks take every world-th batch and sum in float64, so the result does
    not depend on the world size; all ranks run the same number of forwards (padding with a zero-weight
    batch) so FSDP's collectives stay matched."""
    dist = dist or DistInfo(device=next(model.parameters()).device)
    ds = open_data(data, "val")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(vocab, int):
        ds.require_vocab(vocab)
    n = ds.n_sequences(seq_len)
    if max_sequences:
        n = min(n, max_sequences)
    if n == 0:
        raise ValueError(f"validation split has no complete sequence of {seq_len + 1} tokens")
    starts = list(range(0, n, batch_size))
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for k in range(math.ceil(len(starts) / dist.world)):
        i = k * dist.world + dist.rank
        real = i < len(starts)
        s = starts[i] if real else 0
        xy = torch.from_numpy(ds.batch(np.arange(s, min(s + batch_size, n)), seq_len)).to(dist.device)
        with autocast(dist.device, dtype):
            logits = model(xy[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), xy[:, 1:].flatten(), reduction="sum")
        if real:
            total += loss.item()
            count += xy[:, 1:].numel()
    model.train(was)
    total, n_tokens = all_reduce([total, float(count)], dist, op="sum")
    return total / n_tokens


# -------------------------------------------------------------------------------------------------
# the loop


class Trainer:
    """Owns the model, optimizer, data and logs of one run; `run()` trains to the end (or `stop_after`)."""

    def __init__(self, cfg: RunConfig, dist: DistInfo, callback: Callback | None = None):
        self.cfg, self.dist, self.callback = cfg, dist, callback
        self.out = Path(cfg.out)
        if cfg.global_batch % dist.world:
            raise ValueError(f"global_batch={cfg.global_batch} is not divisible by the world size {dist.world}")
        self.local_batch = cfg.global_batch // dist.world
        self.micro = cfg.micro_batch or self.local_batch
        if self.local_batch % self.micro:
            raise ValueError(
                f"micro_batch={self.micro} must divide the per-rank batch {self.local_batch} "
                f"(global_batch={cfg.global_batch} / world={dist.world})"
            )
        self.accum = self.local_batch // self.micro
        check_memory(cfg, self.micro, dist)  # before the data is opened or the model allocated

        self.train_data = open_data(cfg.data, "train")
        self.n_train = self.train_data.n_sequences(cfg.seq_len)
        # the corpus builder's hash covers every split + the manifest; else hash the train shards ourselves,
        # on rank 0 only (FineWeb-Edu is ~20 GB: one read, not one per rank)
        self.data_hash = (self.train_data.manifest or {}).get("data_hash") or broadcast_object(
            self.train_data.data_hash() if dist.is_main else None, dist
        )
        mcfg = cfg.model_config()
        self._check_tokenizer(mcfg.vocab_size)
        self.train_data.require_vocab(mcfg.vocab_size)  # ids past the embedding: one line, not an IndexError

        torch.manual_seed(cfg.seed)  # same on every rank: nothing random happens per rank
        self.raw = build_model(mcfg, seed=cfg.seed).to(dist.device)  # identical init on every rank
        self.n_params = sum(p.numel() for p in self.raw.parameters())
        self.flops_per_token = flops_per_token(self.raw, cfg.seq_len)
        self.peak = peak_flops(dist.device)
        if cfg.compile:  # per block (torchtitan), in place: parameter names (and so checkpoints) do not change
            import torch._dynamo.config as dynamo_config

            # routers may differ per layer (e.g. AttnRes reads a growing set of sources): one graph per block
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 2 * mcfg.n_layer + 8)
            for block in self.raw.blocks:
                block.compile()
        self.model = wrap_model(self.raw, dist, fsdp=cfg.fsdp)
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, cfg.weight_decay, decay_mixing=cfg.decay_mixing),
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            fused=dist.device.type == "cuda" or None,
        )
        self.step = 0
        self.elapsed = 0.0  # training wall time summed over resumes
        self.last_val: float | None = None

    def _check_tokenizer(self, vocab_size: int) -> None:
        from ..data.tokenizers import get_tokenizer

        self.tokenizer = get_tokenizer(self.cfg.tokenizer)
        if self.tokenizer.vocab_size > vocab_size:
            raise ValueError(
                f"tokenizer {self.tokenizer.name!r} has {self.tokenizer.vocab_size} ids but "
                f"model.vocab_size={vocab_size}"
            )
        manifest_tok = (self.train_data.manifest or {}).get("tokenizer")
        name = manifest_tok.get("name") if isinstance(manifest_tok, dict) else manifest_tok
        if name is not None and name != self.tokenizer.name:
            raise ValueError(
                f"{self.cfg.data}: shards were tokenized with {name!r}, recipe says {self.tokenizer.name!r}"
            )

    # --- pieces --------------------------------------------------------------------------------------
    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """This rank's micro-batches of `step`: (micro, seq_len + 1) token windows each."""
        ids = micro_batch_ids(
            step,
            self.cfg.global_batch,
            self.cfg.data_seed,
            self.n_train,
            rank=self.dist.rank,
            world=self.dist.world,
            micro=self.micro,
        )
        return [
            torch.from_numpy(self.train_data.batch(i, self.cfg.seq_len)).to(self.dist.device, non_blocking=True)
            for i in ids
        ]

    def train_step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        lr = lr_at(step, cfg)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        loss_sum: torch.Tensor | float = 0.0
        batches = self.micro_batches(step)
        for a, xy in enumerate(batches):
            with grad_sync(self.model, a == self.accum - 1), autocast(self.dist.device, cfg.dtype):
                logits = self.model(xy[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), xy[:, 1:].flatten())
                (loss / self.accum).backward()  # so the summed micro-grads are the mean over the local batch
            loss_sum += loss.detach()
        sync_replicated_grads(self.model, self.dist)
        norm = clip_grad_norm(self.model, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        mean_loss, grad_norm = all_reduce([float(loss_sum) / self.accum, float(norm)], self.dist)
        return {"loss": mean_loss, "lr": lr, "grad_norm": grad_norm}

    def log(self, record: dict[str, Any]) -> None:
        if self.dist.is_main:
            with open(self.out / LOG, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def _truncate_log(self, step: int) -> None:
        """After a resume at `step`, drop log lines of steps the killed run did past its last save."""
        path = self.out / LOG
        if self.dist.is_main and path.exists():
            keep = [ln for ln in path.read_text(encoding="utf-8").splitlines() if _log_step(ln) <= step]
            atomic_write_text(path, "".join(ln + "\n" for ln in keep))

    def state_meta(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "elapsed_s": self.elapsed,
            "last_val": self.last_val,
            "world": self.dist.world,
            "trajectory": self.cfg.trajectory(),
            "data_hash": self.data_hash,
            "torch": torch.__version__,
        }

    def save(self) -> None:
        save_state(self.out / "resume", self.model, self.optimizer, self.state_meta(), self.dist)

    def maybe_resume(self) -> None:
        path = self.out / "resume"
        if not (self.cfg.resume and has_state(path)):  # has_state repairs an interrupted swap first
            return
        meta = read_meta(path)
        if meta["trajectory"] != self.cfg.trajectory():
            diff = sorted(k for k in meta["trajectory"] if meta["trajectory"][k] != self.cfg.trajectory().get(k))
            raise ValueError(
                f"{path}: resume state was written by a different run (differs in: {', '.join(diff)}); "
                "use another out= or resume=false"
            )
        if meta["data_hash"] != self.data_hash:
            raise ValueError(f"{path}: resume state was trained on different data (hash mismatch)")
        meta = load_state(path, self.model, self.optimizer, self.dist)
        self.step, self.elapsed, self.last_val = meta["step"], meta["elapsed_s"], meta.get("last_val")
        self._truncate_log(self.step)

    # --- run -----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg, dist = self.cfg, self.dist
        if dist.is_main:
            from ..io.atomic import claim_dir

            claim_dir(self.out, "run")  # new: created with its marker; else checked again
        barrier(dist)
        self.maybe_resume()
        if self.step == 0:
            self._truncate_log(0)
        self.model.train()
        stop = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps
        snap_steps = set(cfg.snapshot_steps)
        if self.step == 0 and 0 in snap_steps:
            self.snapshot()
        while self.step < stop:
            t0 = time.perf_counter()
            rec = self.train_step(self.step)
            dt = time.perf_counter() - t0
            self.elapsed += dt
            self.step += 1
            tok_s = cfg.tokens_per_step / dt
            rec = {
                "step": self.step,
                **rec,
                "tokens": self.step * cfg.tokens_per_step,
                "tok_s": tok_s,
                "mfu": tok_s * self.flops_per_token / (self.peak * dist.world) if self.peak else None,
            }
            # a non-finite gradient norm poisons the update just made even when the loss was still finite: stop
            # before that state could be saved
            if not (math.isfinite(rec["loss"]) and math.isfinite(rec["grad_norm"])):
                self.diverged(rec["loss"], rec["grad_norm"])
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                self.last_val = rec["val_loss"] = self.evaluate(cfg.eval_batches)
            if rec.get("val_loss") is not None or self.step % cfg.log_every == 0 or self.step in (1, cfg.steps):
                self.log(rec)
            if self.step in snap_steps:  # before the resume save: a kill in between redoes (and rewrites) it
                self.snapshot(rec.get("val_loss"))
            if (cfg.save_every and self.step % cfg.save_every == 0) or self.step == stop:
                self.save()
            if self.callback is not None:
                self.callback(self.step, rec)
        if self.step < cfg.steps:  # stopped early on purpose: the resume state is on disk
            return {"step": self.step, "stopped": True}
        return self.finish()

    def diverged(self, loss: float, grad_norm: float) -> None:
        """Stop on a NaN/inf loss with one line: the step, the resume state left on disk (the weights now in
        memory took a step on non-finite gradients, so nothing is saved after the last good state), and how
        to go on from it."""
        state = self.out / "resume"
        at = read_meta(state)["step"] if has_state(state) else None
        kept = (
            f"the last good resume state (step {at}) is kept in {state}: rerun the same command to resume from it"
            if at is not None
            else f"no resume state was saved before it (save_every={self.cfg.save_every}): a rerun starts from step 0"
        )
        what = f"loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm}"
        raise TrainingDiverged(
            f"training stopped: {what} at step {self.step}; {kept} (a deterministic run "
            "diverges again there: to change lr, warmup or grad_clip start anew with resume=false "
            "or another out=)"
        )

    def evaluate(self, batches: int) -> float:
        model = self.model if self.cfg.fsdp else self.raw  # DDP replicas are identical: no collectives needed
        return evaluate(
            model,
            self.cfg.data,
            self.cfg.seq_len,
            batch_size=self.micro,
            max_sequences=batches * self.cfg.global_batch,
            dtype=self.cfg.dtype,
            dist=self.dist,
        )

    def snapshot(self, val_loss: float | None = None) -> Path:
        """Write the model as it is now to <out>/snapshots/step_NNNNNNN/ (a normal depthlens checkpoint,
        no optimizer state) with snapshot.json = {step, tokens, val_loss, run}. Every rank joins the gather."""
        from ..io import checkpoint

        cfg = self.cfg
        if val_loss is None:
            val_loss = self.evaluate(cfg.snapshot_eval_batches)
        model_sd = full_model_state(self.model)
        path = snapshot_dir(self.out, self.step)
        if self.dist.is_main:
            model = build_model(cfg.model_config(), seed=None)
            model.load_state_dict(model_sd)
            info = {
                "step": self.step,
                "tokens": self.step * cfg.tokens_per_step,
                "val_loss": val_loss,
                "val_batches": cfg.snapshot_eval_batches or "all",
                "run": cfg.name,
                "seed": cfg.seed,
                "data_hash": self.data_hash,
            }
            files: dict[str, str | bytes] = {
                **self.tokenizer_files(),
                SNAPSHOT_JSON: json.dumps(info, indent=1, sort_keys=True) + "\n",
            }
            checkpoint.save(model, path, extra_files=files, owner=run_owner(cfg))
        barrier(self.dist)
        return path

    def finish(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        val = self.evaluate(cfg.final_eval_batches)
        eval_s = time.perf_counter() - t0
        model_sd, _ = full_state(self.model, self.optimizer)  # collective under FSDP: every rank joins
        record = self.train_record(val, eval_s)
        if self.dist.is_main:
            from ..io import checkpoint

            export = build_model(cfg.model_config(), seed=None)
            export.load_state_dict(model_sd)
            record["checkpoint"] = str(
                checkpoint.save(
                    export, cfg.export_dir, train=record, extra_files=self.tokenizer_files(), owner=run_owner(cfg)
                )
            )
            self.log({"step": self.step, "final_val_loss": val})
        barrier(self.dist)
        return record

    def tokenizer_files(self) -> dict[str, bytes]:
        """The tokenizer's own saved files (tokenizer_config.json, + HF tokenizer.json for BPE), so
        `load_tokenizer(checkpoint_dir)` works on the exported checkpoint."""
        with tempfile.TemporaryDirectory() as tmp:
            self.tokenizer.save(tmp)
            return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}

    def train_record(self, val: float, eval_s: float) -> dict[str, Any]:
        cfg = self.cfg
        c = self.raw.config
        emb = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
        return {
            "name": cfg.name,
            "recipe": cfg.to_dict(),
            "meta": cfg.meta,
            "seed": cfg.seed,
            "data_seed": cfg.data_seed,
            "data": cfg.data,
            "data_hash": self.data_hash,
            "tokenizer": self.tokenizer.name,
            "steps": self.step,
            "tokens": self.step * cfg.tokens_per_step,
            "final_val_loss": val,
            "val_batches": cfg.final_eval_batches or "all",
            "eval_s": eval_s,
            "params": {"total": self.n_params, "embedding": emb, "non_embedding": self.n_params - emb},
            "flops_per_token": self.flops_per_token,
            "wall_time_s": self.elapsed,
            "tokens_per_s": self.step * cfg.tokens_per_step / self.elapsed if self.elapsed else None,
            "world_size": self.dist.world,
            "device": str(self.dist.device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpu": cpu_identity(),  # the kernels' CPU: a bit-for-bit retrain holds on the same one
            **code_version(),
        }


def _log_step(line: str) -> float:
    """The step of a log line; +inf for a blank or partial line (a kill in the middle of an append)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return math.inf
    return rec.get("step", 0) if isinstance(rec, dict) else math.inf


# -------------------------------------------------------------------------------------------------
# entry points


def train(cfg: RunConfig, *, callback: Callback | None = None) -> dict[str, Any]:
    """Train one run (single process, or one rank of a torchrun job). Returns the train record (with
    `final_val_loss` and `checkpoint`), or {"step", "stopped": True} when `stop_after` ended it early."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # joins the torchrun job's process group on the first call; later calls in the same process reuse it
    # (re-creating a group on the same rendezvous can hang); run_recipe tears it down at the end
    dist = init_distributed(cfg.device)
    with owned_outputs(cfg, dist):
        return Trainer(cfg, dist, callback).run()


def split_run_name(overrides: Sequence[str], run: str | None = None) -> tuple[list[str], str | None]:
    """Take the run name out of the key=value arguments: `run=NAME` is how the documented launch lines name a
    grid recipe's run, because torchrun's own parser reads every `--option` after the module and refuses
    `--run` as an ambiguous abbreviation of its `--run-path`. `--run NAME` still works without torchrun."""
    rest: list[str] = []
    names: list[str] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        (names if sep and key == "run" else rest).append(value if sep and key == "run" else item)
    if run is not None:
        names.insert(0, run)
    if len(set(names)) > 1:
        err = ValueError(f"two run names given ({', '.join(repr(n) for n in names)}): name one with run=NAME")
        err.usage = True  # type: ignore[attr-defined]
        raise err
    return rest, (names[0] if names else None)


def run_recipe(
    recipe: str | os.PathLike, overrides: Sequence[str] = (), run: str | None = None, callback: Callback | None = None
) -> dict[str, Any]:
    """`depthlens train`: load a recipe (one run of it, named by `run` or a `run=NAME` argument), apply
    key=value overrides, train. One call per process under torchrun: it leaves the process group at the end."""
    try:
        overrides, run = split_run_name(overrides, run)
        check_recipe_export(recipe, overrides, run)  # a changed training never lands on the recipe's export
        return train(load_recipe(recipe, overrides, run=run), callback=callback)
    finally:
        shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m depthlens.training.trainer",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("recipe", help="recipe JSON (one run, or a grid with base + runs)")
    p.add_argument(
        "overrides",
        nargs="*",
        help="run=NAME (a grid recipe's run) and key=value overrides (model.n_layer=8, lr=1e-3, steps=200)",
    )
    p.add_argument("--run", help="run name in a grid recipe (under torchrun write run=NAME: torchrun reads --run)")
    p.add_argument("--list", action="store_true", help="list the recipe's runs and exit")
    args = p.parse_intermixed_args(argv)  # overrides may follow --run NAME
    if args.list:
        for name in recipe_runs(read_recipe(args.recipe)):
            print(name)
        return 0
    try:
        record = run_recipe(args.recipe, args.overrides, run=args.run)
    except (DepthlensError, ValueError) as e:  # one line, as `depthlens train` prints it; rank 0 says it once
        if int(os.environ.get("RANK", "0")) == 0:
            sys.stderr.write(f"depthlens: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")
        return 2 if getattr(e, "usage", False) else 1
    if int(os.environ.get("RANK", "0")) == 0:
        keys = ("name", "steps", "tokens", "final_val_loss", "wall_time_s", "checkpoint", "stopped")
        print(json.dumps({k: record[k] for k in keys if k in record}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
