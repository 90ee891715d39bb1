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
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
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
    load_full_state,
    shutdown,
    sync_replicated_grads,
    unused_parameters,
    wrap_model,
)
from .provenance import code_version
from .schedule import lr_at
from .state import STATE_JSON, STATE_TENSORS, check_complete, has_state, read_meta, read_state, write_state  # noqa: F401

LOG = "log.jsonl"


class TrainingDiverged(DepthlensError):
    """The training loss became NaN or infinite (the run stops; its last good resume state stays)."""


SNAPSHOTS = "snapshots"
SNAPSHOT_JSON = "snapshot.json"


def snapshot_dir(out: str | os.PathLike, step: int) -> Path:
    """Where the analysis snapshot of `step` lives: zero-padded so a plain sort is step order."""
    return Path(out) / SNAPSHOTS / f"step_{step:07d}"


# Dense bf16 peak FLOP/s per device for MFU (torchtitan's table); None = no meaningful peak (CPU).
PEAK_FLOPS: dict[str, float | None] = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "V100": 125e12,
    "cpu": None,
}

Callback = Callable[[int, dict[str, Any]], None]


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return PEAK_FLOPS["cpu"]
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k != "cpu" and k in name), None)


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """6·N_matmul + 12·L·d·T (nanoGPT / torchtitan): every parameter but the input embedding table is
    a matmul weight (the LM head counts even when tied); attention adds 12·L·(H·d_h)·T, causality not discounted."""
    cfg = model.config
    n = sum(p.numel() for p in model.parameters())  # unique parameters: a tied table counts once
    n_matmul = n - cfg.vocab_size * cfg.d_model + (cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0)
    return 6.0 * n_matmul + 12.0 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len


def train_bytes(cfg: RunConfig, micro: int, world: int = 1, device: str = "cpu") -> float:
    """A deliberately low estimate of one rank's training memory, so only runs that cannot fit are refused:
    fp32 weights + grads + AdamW moments (16 B per parameter, sharded under FSDP), plus what one micro-batch
    keeps for backward: >= 16·d per token and layer (2·n·d more for the n streams of HC/mHC), the logits
    (2·V per token), and on CPU the attention probabilities (H·T² per layer: the math attention path
    materialises them; CUDA's flash path does not)."""
    c = cfg.model_config().resolved()
    n = 12 * c.n_layer * c.d_model**2 + c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    state = 16.0 * n / (world if cfg.fsdp else 1)
    streams = c.hc_streams if c.arch in ("hc", "mhc") else 0
    elem = 2.0 if cfg.dtype == "bf16" else 4.0
    tokens = micro * cfg.seq_len
    acts = elem * tokens * ((16 + 2 * streams) * c.d_model * c.n_layer + 2 * c.vocab_size)
    attn = elem * micro * c.n_head * cfg.seq_len**2 * c.n_layer if device == "cpu" else 0.0
    return state + acts + attn


def device_bytes(device: torch.device) -> float | None:
    """Total memory of `device` (physical RAM for the CPU); None when unknown."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg: RunConfig, micro: int, dist: DistInfo) -> None:
    """Refuse up front (one line) a run whose memory estimate exceeds the device: seq_len or global_batch of
    10^6 must fail here, not with an out-of-memory kill after minutes."""
    need, have = train_bytes(cfg, micro, dist.world, dist.device.type), device_bytes(dist.device)
    if have is not None and need > have:
        raise ValueError(
            f"run config: training needs at least {need / 2**30:,.1f} GiB per rank (micro_batch={micro}, "
            f"seq_len={cfg.seq_len}, model {cfg.model_config().n_layer}x{cfg.model_config().d_model}) but "
            f"{dist.device.type} memory is {have / 2**30:,.1f} GiB; lower micro_batch or seq_len"
        )


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
    total, count = all_reduce([total, float(count)], dist, op="sum")
    return total / count


# -------------------------------------------------------------------------------------------------
# resume state: safetensors for tensors, JSON for the rest, with a checksummed manifest (state.py)


def save_state(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any], dist: DistInfo
) -> None:
    """Every rank joins the gather (FSDP); rank 0 writes <path>/ as a whole directory swap."""
    model_sd, optim_sd = full_state(model, optimizer)
    if not dist.is_main:
        barrier(dist)
        return
    tensors = {f"model/{k}": v.contiguous() for k, v in model_sd.items()}
    for fqn, st in optim_sd["state"].items():
        for key, v in st.items():
            tensors[f"optim/{fqn}/{key}"] = v.detach().cpu().contiguous() if torch.is_tensor(v) else torch.tensor(v)
    tensors["rng/cpu"] = torch.get_rng_state()
    if dist.device.type == "cuda":
        tensors["rng/cuda"] = torch.cuda.get_rng_state(dist.device)
    write_state(path, tensors, {**meta, "param_groups": optim_sd["param_groups"]})
    barrier(dist)


def load_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, dist: DistInfo) -> dict[str, Any]:
    """Restore model, optimizer and RNG from <path> after checking it against its manifest and against
    this run's model; returns the JSON metadata (step, trajectory, ...)."""
    tensors, meta = read_state(path)
    raw = getattr(model, "module", model)  # DDP wraps; FSDP2 keeps the module (and its global shapes)
    trainable = {n for n, p in raw.named_parameters() if p.requires_grad}
    updated = trainable - set(unused_parameters(raw, dist.device)) if meta.get("step") else trainable
    check_complete(path, tensors, meta, {k: tuple(v.shape) for k, v in raw.state_dict().items()}, trainable, updated)
    model_sd = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    state: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            fqn, key = k[len("optim/") :].rsplit("/", 1)
            state.setdefault(fqn, {})[key] = v
    load_full_state(model, optimizer, model_sd, {"state": state, "param_groups": meta["param_groups"]})
    torch.set_rng_state(tensors["rng/cpu"])
    if dist.device.type == "cuda" and "rng/cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng/cuda"], dist.device)
    return meta


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
        loss_sum = 0.0
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
        loss, grad_norm = all_reduce([float(loss_sum) / self.accum, float(norm)], self.dist)
        return {"loss": loss, "lr": lr, "grad_norm": grad_norm}

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
            files = {**self.tokenizer_files(), SNAPSHOT_JSON: json.dumps(info, indent=1, sort_keys=True) + "\n"}
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


def run_owner(cfg: RunConfig) -> dict[str, str]:
    """Who owns what a run writes (its marker's owner): the run directory, as an absolute path."""
    return {"run": str(Path(cfg.out).resolve())}


def adopt_recipe_export(cfg: RunConfig) -> bool:
    """A shipped checkpoint is this run's own export when its train.json says that this very recipe run made it
    there (the same run name and the same `export` path as the recipe writes it): a clone carries no ownership
    markers (they are git-ignored), yet `depthlens train <recipe> --run NAME` must retrain the zoo checkpoint the
    recipe names. Such a checkpoint is marked as this run's; anything else is left for the refusal."""
    from ..io.atomic import legacy_kind, read_marker, write_marker
    from ..io.files import read_json

    d = cfg.export_dir
    if not cfg.name or not d.is_dir() or read_marker(d) is not None or legacy_kind(d) != "checkpoint":
        return False
    try:
        record = read_json(d / "train.json", "training record")
    except DepthlensError:
        return False
    recipe = record.get("recipe") if isinstance(record, dict) else None
    if not isinstance(recipe, dict) or record.get("name") != cfg.name or recipe.get("export") != cfg.export:
        return False
    write_marker(d, "checkpoint", **run_owner(cfg))
    return True


@contextmanager
def owned_outputs(cfg: RunConfig, dist: DistInfo) -> Iterator[None]:
    """Before any work, rank 0 checks that the run directory is new, empty or a depthlens run directory (its
    marker), and that the export is new, empty or this run's own export (a user's directory or a checkpoint
    made elsewhere is never replaced); then it holds both for the whole run (one trainer per run directory
    and per export: a second refuses naming the first). Every rank raises the same one-line refusal."""
    from ..io.atomic import check_target, claim_dir, output_lock

    owner = run_owner(cfg)
    error: Exception | None = None
    with ExitStack() as held:
        if dist.is_main:
            try:
                adopt_recipe_export(cfg)
                claim_dir(cfg.out, "run", create=False)  # created (and marked) by run(), after the setup
                check_target(cfg.export_dir, False, kinds=("checkpoint",), flag="", owner=owner, make_parents=True)
                held.enter_context(output_lock(cfg.out, "run directory"))
                if cfg.export_dir.resolve().parent != Path(cfg.out).resolve():  # else the run directory's lock holds it
                    held.enter_context(output_lock(cfg.export_dir, "export"))
            except DepthlensError as e:
                error = e
        message = broadcast_object(None if error is None else str(error), dist)
        if error is not None:
            raise error
        if message is not None:
            raise DepthlensError(message)
        yield


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
    rest, names = [], []
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
