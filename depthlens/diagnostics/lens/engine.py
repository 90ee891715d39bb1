"""The lens family of depth readouts: the logit lens and the tuned lens (docs/concepts.md#the-lens-family).

At every layer boundary l = 0..L the residual view after l layers, h_l = `model.final_hidden(state_l)` (the
embedding state for l = 0, the model's own final hidden for l = L), is read out through the model's own final
norm and unembedding as if the model stopped there:

    logit lens   q_l = softmax(W · norm(h_l) + b)                          (nostalgebraist 2020)
    tuned lens   q_l = softmax(W · norm(h_l + A_l h_l + c_l) + b)          (Belrose et al. 2023, arXiv 2303.08112)

The tuned lens's translator is the reference package's (`tuned-lens` 0.2.0, `TunedLens.transform_hidden`): a
d × d affine map added residually, A_l = 0 and c_l = 0 at init, so an untrained tuned lens *is* the logit lens.
It is trained to minimise Σ_l KL(p_L ‖ q_l) over the positions of a training split distinct from the eval
split (`training_data`), with the reference's optimiser: SGD with Nesterov momentum 0.9, lr 1.0 × (1 − 0.9),
weight decay 1e-3, a linear decay to 0, gradients clipped to norm 1 (or Adam, lr 1e-3 with a warm-up), at a
CPU-sized number of tokens per step. Trained translators are cached under `<cache>/tuned-lens/` keyed by the
model's weights hash, the training tokens' hash and every hyperparameter.

Per position τ = 1..T−2 (BOS excluded; position τ predicts token τ+1) and boundary l:

    kl         KL(p_L ‖ q_l) in nats (0 at l = L)
    rank       the target token's rank under q_l: how many other tokens have a larger logit (0 = top-1)
    agree      whether argmax q_l = argmax p_L (top-1 agreement with the final prediction)
    ce         −log q_l(target) in nats (the lens's own next-token loss; at l = L the model's loss)

Each is averaged per sequence (the rank: its per-sequence median) and over sequences, with a bootstrap interval
over sequences (`stats.intervals.mean_interval`). "Where the prediction forms" is the first relative depth l / L
at which the mean top-1 agreement exceeds `forms_at` (0.5 by default), with a bootstrap interval over sequences.

The vocabulary is walked in chunks (`diagnostics.vocab.chunk_size`) whenever the model's head is one matmul
(`models.protocol.Unembedding`): no (rows, V) logits are ever held for evaluation, so Qwen's 151,936-entry
vocabulary fits memory. KL then comes from the final distribution's expected embedding (`vocab.expected_embedding`):
KL(p ‖ q) = (p W)·(g_p − g_q) + (lse_q − lse_p) Σ p.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr

from depthlens.diagnostics.vocab import chunk_size, expected_embedding
from depthlens.errors import DataError, DepthlensError
from depthlens.io.dataset import data_var
from depthlens.models.protocol import LayeredLM, unembedding_of
from depthlens.models.residual.base import RunContext
from depthlens.runtime.evaldata import EvalData, default_batch_size, evaluating, model_dataset, model_device
from depthlens.runtime.progress import Count, ProgressFn
from depthlens.stats.intervals import NORMAL_BOOT, SEQUENCES, bootstrap_counts, mean_interval, normal_interval

KINDS = ("logit", "tuned")
FORMS_AT = 0.5  # "where the prediction forms": the top-1 agreement with the final layer it must exceed
OPTIMIZERS = ("sgd", "adam")
LENS_VERSION = 1  # of the translator training: part of the cache key
CE_UNITS = "nat"


# ---------------------------------------------------------------------------------------------------------------
# reading the residual out through the model's own head


class Readout:
    """A (B, T, d) hidden state in the space of `model.final_hidden` → the head's input and logits.

    `normed(h)` applies the model's own final norm; `logits(h)` the whole head. Native models expose
    `final_norm`; adapters read the normed hidden through their `Unembedding.hidden` of the state {"h": h} (their
    `final_hidden` is `state["h"]`); a model without an Unembedding (logit soft-capping) is read whole by
    `model.head({"h": h})`.
    """

    def __init__(self, model: LayeredLM):
        self.model = model
        self.u = unembedding_of(model)
        norm = getattr(model, "final_norm", None)
        self._norm: Callable[[torch.Tensor], torch.Tensor] | None = norm if callable(norm) else None
        self._ctx: dict[tuple[int, str], RunContext] = {}
        if self._norm is None and self.u is None:
            check_readable(model)

    @property
    def chunked(self) -> bool:
        return self.u is not None

    def ctx(self, h: torch.Tensor) -> RunContext:
        key = (int(h.shape[1]), str(h.device))
        if key not in self._ctx:
            self._ctx[key] = self.model.context(h.shape[1], device=h.device)
        return self._ctx[key]

    def normed(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, d) → the final norm of h (the LM head's input), (B, T, d)."""
        if self._norm is not None:
            return self._norm(h)
        if self.u is None:
            raise DepthlensError("this model's head is not one matmul; read it whole with logits()")
        return self.u.hidden({"h": h}, self.ctx(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, d) → logits (B, T, V) through the final norm and the LM head (and any logit transform)."""
        if self.u is not None:
            return F.linear(self.normed(h), self.u.weight, self.u.bias)
        return self.model.head({"h": h}, self.ctx(h))


def check_readable(model: LayeredLM) -> None:
    """Refuse (one line) a model that says its head cannot read h_l (`lens_refusal()`: a described model whose
    state is not its residual view), before any work; a model without that method is read as the protocol says."""
    refusal = getattr(model, "lens_refusal", None)
    why = refusal() if callable(refusal) else None
    if why:
        raise DepthlensError(why)


def boundary_states(model: LayeredLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    """h_l = model.final_hidden(state after l layers) for l = 0..L at positions 1..T−2, each (b, T−2, d) on the
    tokens' device. The forward covers tokens[:, :T−1] (the last token is only a target)."""
    run = tokens[:, :-1]
    ctx = model.context(run.shape[1], device=run.device)
    out: list[torch.Tensor] = []

    def keep(state: Any) -> None:
        out.append(model.final_hidden(state, ctx)[:, 1:].to(run.device))

    state = model.embed(run, ctx)
    keep(state)
    model.run_layers(state, ctx, on_layer=lambda pos, s, u: keep(s))
    return out


@contextmanager
def frozen(model: Any) -> Iterator[None]:
    """The model's parameters without gradients for the duration (only the translators train), then restored."""
    params = list(model.parameters()) if hasattr(model, "parameters") else []
    was = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, w in zip(params, was):
            p.requires_grad_(w)


# ---------------------------------------------------------------------------------------------------------------
# the translators


class Translators(torch.nn.Module):
    """Per-layer affine translators h ↦ h + A_l h + c_l for l = 0..L−1 (boundary L is the model's output and has
    none), A_l = 0 and c_l = 0 at init: the reference's residual parametrisation (weight decay pulls toward the
    identity). Parameters in float32."""

    def __init__(self, n_layer: int, d_model: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n_layer, d_model, d_model))
        self.bias = torch.nn.Parameter(torch.zeros(n_layer, d_model))

    def forward(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """h (B, T, d) of boundary `layer` → translated (the identity at l = L)."""
        if layer >= self.weight.shape[0]:
            return h
        x = h.float()
        return (x + F.linear(x, self.weight[layer], self.bias[layer])).to(h.dtype)

    def many(self, h: torch.Tensor, layers: slice) -> torch.Tensor:
        """h (k, R, d) of boundaries `layers` (k of them, all < L) → translated, one batched matmul."""
        x = h.float()
        return (x + torch.baddbmm(self.bias[layers][:, None], x, self.weight[layers].transpose(1, 2))).to(h.dtype)


def translate(tr: Translators | None, h: torch.Tensor, layer: int) -> torch.Tensor:
    return h if tr is None else tr(h, layer)


@dataclass(frozen=True)
class TrainOptions:
    """The tuned lens's training: what it trains on and how (every field is part of the cache key)."""

    steps: int = 100  # optimiser steps (the reference: 250 steps of 2^18 tokens on a GPU)
    tokens_per_step: int = 128  # positions per step: a CPU-sized batch
    optimizer: str = "sgd"  # "sgd" (the reference's default: Nesterov, momentum 0.9) | "adam"
    lr: float | None = None  # None: the reference's, 1.0 × (1 − 0.9) for SGD, 1e-3 for Adam
    weight_decay: float = 1e-3
    train_n_seq: int = 32  # sequences of the training split
    seed: int = 0  # of the training windows and of the row sampling

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise DepthlensError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        for name in ("steps", "tokens_per_step", "train_n_seq"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DepthlensError(f"{name} must be an integer >= 1, got {v!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise DepthlensError(f"lr must be a positive number, got {self.lr!r}")

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return float(self.lr)
        return 1.0 * (1 - 0.9) if self.optimizer == "sgd" else 1e-3


class Optimizer:
    """The reference's optimiser and schedule (tuned_lens.scripts.ingredients.Optimizer), written out so that a
    step reads as the method says: SGD with Nesterov momentum 0.9 and no warm-up (torch.optim.SGD's update), or
    Adam (β 0.9, 0.999; torch.optim.Adam's update, weight decay as L2) with min(1000, steps // 5) warm-up steps;
    then a linear decay of the learning rate to 0 at the last step (transformers'
    get_linear_schedule_with_warmup). tests/test_lens_family.py checks it against torch.optim and the schedule."""

    def __init__(self, params: list[torch.nn.Parameter], o: TrainOptions):
        self.params, self.o, self.t = params, o, 0
        self.warmup = 0 if o.optimizer == "sgd" else min(1000, o.steps // 5)
        self.state = [{"m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in params]

    def lr(self, step: int) -> float:
        """The learning rate of step `step` (0-based)."""
        o, w = self.o, self.warmup
        # get_linear_schedule_with_warmup(opt, w, steps - w), as the reference calls it (with w = 0 for SGD)
        total = o.steps - w
        f = step / max(1, w) if step < w else max(0.0, (total - step) / max(1, total - w))
        return o.learning_rate * f

    @torch.no_grad()
    def step(self) -> None:
        lr, o = self.lr(self.t), self.o
        self.t += 1
        for p, st in zip(self.params, self.state):
            if p.grad is None:
                continue
            g = p.grad + o.weight_decay * p
            if o.optimizer == "sgd":
                st["m"] = g.clone() if self.t == 1 else st["m"].mul_(0.9).add_(g)
                p.sub_(lr * (g + 0.9 * st["m"]))
            else:
                st["m"].mul_(0.9).add_(g, alpha=0.1)
                st["v"].mul_(0.999).addcmul_(g, g, value=0.001)
                m_hat = st["m"] / (1 - 0.9**self.t)
                v_hat = st["v"] / (1 - 0.999**self.t)
                p.sub_(lr * m_hat / (v_hat.sqrt() + 1e-8))

    def zero_grad(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float = 1.0) -> float:
    """torch.nn.utils.clip_grad_norm_ (the reference clips at 1.0): scale every gradient by
    min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the norm over all of them. Returns ‖g‖."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return float(total)


def lens_kl_loss(
    readout: Readout, tr: Translators, h: torch.Tensor, final_logp: torch.Tensor, layers: slice
) -> torch.Tensor:
    """Σ over the boundaries `layers` of the mean over rows of KL(p_L ‖ q_l) for the translated lens: the
    reference's training loss per layer (`sum(labels.exp() * (labels - logits.log_softmax(-1)), -1).mean()`,
    labels = final log-probs). h (k, R, d) of those boundaries, final_logp (1, R, V)."""
    logq = readout.logits(tr.many(h, layers)).float().log_softmax(-1)  # (k, R, V)
    return (final_logp.exp() * (final_logp - logq)).sum(-1).mean(-1).sum()


LOGIT_BLOCK_BYTES = 256 << 20  # the (k, R, V) float32 logits of one training block of k layers


def layer_blocks(n_layer: int, rows: int, vocab: int) -> list[slice]:
    """Boundaries 0..L−1 in blocks of k whose (k, rows, V) logits stay under LOGIT_BLOCK_BYTES (k >= 1)."""
    k = max(1, min(n_layer, LOGIT_BLOCK_BYTES // max(1, 4 * rows * vocab)))
    return [slice(a, min(a + k, n_layer)) for a in range(0, n_layer, k)]


def _row_hash(tokens: torch.Tensor) -> set[bytes]:
    return {hashlib.sha256(r.numpy().tobytes()).digest() for r in tokens}


def training_data(
    model: LayeredLM, data: EvalData, checkpoint: Any, o: TrainOptions, train_data: Any = None
) -> EvalData:
    """The tuned lens's training split: `train_data` when given (an EvalData or an (N, T) id array), else the
    `train` split of the project's offline corpus in the model's tokenizer, at the eval sequence length. A
    training sequence identical to an eval sequence is refused (DataError): the eval split must be held out."""
    if train_data is not None:
        td = train_data if isinstance(train_data, EvalData) else EvalData.from_tokens(train_data, "train tokens")
    else:
        from depthlens.adapters.load import opened_of
        from depthlens.runtime.evaldata import load_eval_data, tokenizer_for

        op = opened_of(model)
        tok = op.tokenizer if op is not None and op.tokenizer is not None else getattr(model, "tokenizer", None)
        if tok is None:
            tok = tokenizer_for(checkpoint, model)
        td = load_eval_data(None, tok, n_seq=o.train_n_seq, seq_len=data.seq_len, seed=o.seed, split="train")
    if td.seq_len < 3:
        raise DataError(f"tuned lens: training sequences need >= 3 tokens, got {td.seq_len}")
    if _row_hash(td.tokens) & _row_hash(data.tokens):
        raise DataError("tuned lens: the training split shares sequences with the eval data (give held-out data)")
    return td


def cache_key(model: LayeredLM, td: EvalData, o: TrainOptions) -> str:
    """sha256 of (lens version, the model's weights hash, the training tokens' hash, the options)."""
    from depthlens.runtime.evaldata import _weights_sha256

    blob = json.dumps(
        {"version": LENS_VERSION, "weights": _weights_sha256(model), "train": td.sha256, "options": asdict(o)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def lens_cache_dir(cache: Any = None) -> Path | None:
    """The translators' cache: `cache` if given (False: none), else `<cache>/tuned-lens` (`evaldata.cache_dir`)."""
    if cache is False:
        return None
    if cache is None or cache is True:
        from depthlens.runtime.evaldata import cache_dir

        return cache_dir() / "tuned-lens"
    return Path(os.fspath(cache))


def train_step(readout: Readout, tr: Translators, opt: Optimizer, hs: torch.Tensor, hL: torch.Tensor) -> float:
    """One optimiser step on rows hs (L, R, d) of boundaries 0..L−1 and their final hidden hL (R, d): the loss
    Σ_l mean KL(p_L ‖ q_l) backpropagated (in blocks of layers), gradients clipped to norm 1, one step. Returns
    the loss's mean over layers."""
    L = hs.shape[0]
    with torch.no_grad():
        final_logp = readout.logits(hL[None]).float().log_softmax(-1)
    opt.zero_grad()
    total = 0.0
    for blk in layer_blocks(L, hs.shape[1], final_logp.shape[-1]):
        loss = lens_kl_loss(readout, tr, hs[blk], final_logp, blk)
        torch.autograd.backward(loss)
        total += float(loss.detach())
    clip_grad_norm(list(tr.parameters()), 1.0)
    opt.step()
    return total / L


@torch.no_grad()
def _train_states(model: LayeredLM, td: EvalData, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_l for l < L as (L, rows, d) float32 on the CPU, h_L as (rows, d)) over the training positions."""
    dev = model_device(model)
    hs: list[torch.Tensor] = []
    for _, toks in td.batches(batch_size):
        states = boundary_states(model, toks.to(dev))
        hs.append(torch.stack([s.reshape(-1, s.shape[-1]).float().cpu() for s in states]))
    h = torch.cat(hs, 1)  # (L+1, rows, d)
    return h[:-1].contiguous(), h[-1].contiguous()


def train_translators(
    model: LayeredLM,
    td: EvalData,
    o: TrainOptions,
    *,
    batch_size: int | None = None,
    progress: ProgressFn | None = None,
    heldout: EvalData | None = None,
) -> tuple[Translators, dict[str, Any]]:
    """Train the translators of `model` on `td` (the loss: Σ_l mean KL(p_L ‖ q_l), every layer's translator
    only in its own term). Returns them and a log: the training loss at every step (mean over layers), the
    held-out mean KL before and after when `heldout` is given, the CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    L = model.n_layer
    dev = model_device(model)
    hs, hL = _train_states(model, td, batch_size or default_batch_size(td))
    rows, d = hL.shape
    readout = Readout(model)
    tr = Translators(L, d).to(dev)
    opt = Optimizer(list(tr.parameters()), o)
    g = torch.Generator().manual_seed(o.seed)
    dtype = next(iter(model.parameters())).dtype if hasattr(model, "parameters") else torch.float32
    losses: list[float] = []
    count = Count(progress, o.steps)
    R = min(o.tokens_per_step, rows)
    with frozen(model), evaluating(model), torch.enable_grad():  # the callers may run under no_grad
        for _ in range(o.steps):
            idx = torch.randint(0, rows, (R,), generator=g)
            losses.append(train_step(readout, tr, opt, hs[:, idx].to(dev, dtype), hL[idx].to(dev, dtype)))
            count.add()
    log: dict[str, Any] = {
        "train_loss": losses,
        "train_rows": int(rows),
        "train_data_sha256": td.sha256,
        "train_data": td.name,
        "train_data_source": td.source,
        "train_seconds": round(time.perf_counter() - t0, 3),
        "train_cpu_seconds": round(time.process_time() - c0, 3),
    }
    return tr, log


def load_or_train(
    model: LayeredLM,
    td: EvalData,
    o: TrainOptions,
    *,
    cache: Any = None,
    batch_size: int | None = None,
    progress: ProgressFn | None = None,
) -> tuple[Translators, dict[str, Any]]:
    """The trained translators from the cache when their key is there, else trained now (and cached)."""
    from depthlens.io.atomic import write_with

    key = cache_key(model, td, o)
    folder = lens_cache_dir(cache)
    path = None if folder is None else folder / f"{key}.pt"
    if path is not None and path.is_file():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        tr = Translators(*blob["weight"].shape[:2])
        tr.load_state_dict({"weight": blob["weight"], "bias": blob["bias"]})
        log = json.loads(blob["log"])
        return tr.to(model_device(model)), {**log, "cache": "hit", "cache_key": key}
    tr, log = train_translators(model, td, o, batch_size=batch_size, progress=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in tr.state_dict().items()}
        write_with(path, lambda tmp: torch.save({**state, "log": json.dumps(log)}, tmp))
    return tr, {**log, "cache": "miss" if path is not None else "off", "cache_key": key}


# ---------------------------------------------------------------------------------------------------------------
# the per-position readout


@torch.no_grad()
def _walk(
    g: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logsumexp, argmax, target rank, target logit) of logits F.linear(g, weight, bias), each (R,), with the
    vocabulary walked in chunks. The target logit is taken in float64 from its weight row; the rank counts the
    other tokens whose (float32) logit exceeds it."""
    R, V = g.shape[0], weight.shape[0]
    C = chunk_size(R, V, g.device)
    zt = (g.double() * weight[targets].double()).sum(-1)
    if bias is not None:
        zt = zt + bias[targets].double()
    best = torch.full((R,), -math.inf, dtype=torch.float32, device=g.device)
    arg = torch.zeros(R, dtype=torch.int64, device=g.device)
    rank = torch.zeros(R, dtype=torch.int64, device=g.device)
    maxes, sums = [], []
    floor = torch.finfo(torch.float32).min
    for c0 in range(0, V, C):
        z = F.linear(g, weight[c0 : c0 + C], None if bias is None else bias[c0 : c0 + C]).float()  # (R, C)
        above = z.double() > zt[:, None]
        rel = targets - c0
        inside = (rel >= 0) & (rel < z.shape[1])
        above[inside, rel[inside]] = False  # the target itself never counts
        rank += above.sum(1)
        m, a = z.max(1)
        better = m > best
        best = torch.where(better, m, best)
        arg = torch.where(better, a + c0, arg)
        mm = m.clamp_min(floor)[:, None]
        sums.append(z.sub_(mm).exp_().sum(1))
        maxes.append(mm[:, 0])
    mx, s = torch.stack(maxes, 1), torch.stack(sums, 1)
    top = mx.amax(1)
    lse = top + (s * (mx - top[:, None]).exp()).sum(1).log()
    return lse, arg, rank, zt.float()


@torch.no_grad()
def _whole(z: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same four from whole logits z (R, V) float32."""
    lse = z.logsumexp(-1)
    zt = z.gather(1, targets[:, None])[:, 0]
    rank = (z > zt[:, None]).sum(1)
    return lse, z.argmax(1), rank, zt


class PositionStats:
    """KL(p_L ‖ q_l), target rank, top-1 agreement and CE of every lens readout of one batch against its final
    distribution: `stats = PositionStats(readout, g_final_or_h_final, targets)` then `stats(h_l)`."""

    def __init__(self, readout: Readout, hL: torch.Tensor, targets: torch.Tensor):
        self.r, self.targets = readout, targets  # hL (1, R, d), targets (R,)
        if readout.chunked:
            u = readout.u
            assert u is not None
            gL = readout.normed(hL)[0].float()
            lse, arg, _, _ = _walk(gL.to(u.weight.dtype), u.weight, u.bias, targets)
            pw, psum = expected_embedding(gL.to(u.weight.dtype), u.weight, u.bias, lse)
            self.ref = {"g": gL, "lse": lse, "arg": arg, "pw": pw, "psum": psum}
        else:
            zL = readout.logits(hL)[0].float()
            lse, arg, _, _ = _whole(zL, targets)
            self.ref = {"logp": zL.log_softmax(-1), "arg": arg}

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """h (1, R, d) → {kl, rank, agree, ce}, each (R,)."""
        ref = self.ref
        if self.r.chunked:
            u = self.r.u
            assert u is not None
            g = self.r.normed(h)[0]
            lse, arg, rank, zt = _walk(g.to(u.weight.dtype), u.weight, u.bias, self.targets)
            kl = torch.linalg.vecdot(ref["pw"], ref["g"] - g.float()) + (lse - ref["lse"]) * ref["psum"]
        else:
            z = self.r.logits(h)[0].float()
            lse, arg, rank, zt = _whole(z, self.targets)
            kl = (ref["logp"].exp() * (ref["logp"] - z.log_softmax(-1))).sum(-1)
        return {"kl": kl, "rank": rank, "agree": (arg == ref["arg"]), "ce": lse - zt}


def per_sequence(values: np.ndarray, how: str = "mean") -> np.ndarray:
    """(layer, sequence, position) → (layer, sequence): the position mean (or median)."""
    out: np.ndarray = np.median(values, axis=-1) if how == "median" else values.mean(axis=-1)
    return out


def forms_at_depth(agree_seq: np.ndarray, depth: np.ndarray, level: float) -> float:
    """The first relative depth whose sequence-mean top-1 agreement exceeds `level` (NaN: never)."""
    above = agree_seq.mean(-1) > level
    return float(depth[int(np.argmax(above))]) if above.any() else float("nan")


def forms_interval(
    agree_seq: np.ndarray, depth: np.ndarray, level: float, *, n_boot: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Where the prediction forms, with a normal interval from its bootstrap over sequences (each resample's
    first depth whose agreement exceeds `level`; a resample that never exceeds it counts as depth 1)."""
    est = forms_at_depth(agree_seq, depth, level)
    N = agree_seq.shape[-1]
    out = {"estimate": est, "low": float("nan"), "high": float("nan"), "method": NORMAL_BOOT, "unit": SEQUENCES}
    if N < 2 or n_boot < 1 or not np.isfinite(est):
        return {**out, "n_units": N}
    c = bootstrap_counts(N, n_boot, seed)
    means = (agree_seq @ c.T) / N  # (layer, n_boot)
    above = means > level
    reps = np.where(above.any(0), depth[np.argmax(above, 0)], 1.0)
    iv = normal_interval(est, reps, n_units=N, bounds=(0.0, 1.0))
    return {**out, "low": iv.low, "high": iv.high, "n_units": N}


def _interval_var(
    seq: np.ndarray, n_boot: int, seed: int, bounds: tuple[float, float]
) -> tuple[np.ndarray, dict[str, Any]]:
    """(layer, bound) low/high of each layer's mean over sequences; the interval's attrs."""
    c = bootstrap_counts(seq.shape[-1], n_boot, seed) if n_boot >= 1 and seq.shape[-1] >= 2 else None
    ivs = [mean_interval(row, n_boot=n_boot, seed=seed, counts=c, bounds=bounds)[0] for row in seq]
    lohi = np.array([[iv.low, iv.high] for iv in ivs])
    iv0 = ivs[0]
    return lohi, {"ci_method": iv0.method, "ci_unit": iv0.unit, "ci_n_units": iv0.n_units, "ci_level": iv0.level}


def lens_readout(
    model: LayeredLM,
    data: EvalData,
    *,
    kind: str = "logit",
    forms_at: float = FORMS_AT,
    steps: int = 100,
    tokens_per_step: int = 128,
    optimizer: str = "sgd",
    lr: float | None = None,
    weight_decay: float = 1e-3,
    train_n_seq: int = 32,
    train_seed: int = 0,
    train_data: Any = None,
    translators: Translators | None = None,
    cache: Any = None,
    n_boot: int = 1000,
    batch_size: int | None = None,
    checkpoint: Any = None,
    progress: ProgressFn | None = None,
) -> xr.Dataset:
    """The logit lens (`kind="logit"`) or the tuned lens (`kind="tuned"`) at every layer boundary l = 0..L.

    Returns a Dataset over layer = l (0..L, coordinate `depth` = l / L): `lens_kl` (nats), `target_rank` (the
    sequences' median rank), `top1_agree` (share of positions) and `lens_ce` (nats), each the mean over
    sequences with its `*_seq` (layer, sequence) values and a `*_ci` (layer, bound) bootstrap interval; per
    position `lens_kl_tok` and `target_rank_tok` (layer, sequence, position); `forms_depth` (+ `_low`, `_high`):
    where the prediction forms. The tuned lens trains (or loads from the cache) its translators first, on the
    training split (`training_data`), unless `translators` are given; its training log is in the attrs.
    progress: (units done, total) over training steps and eval batches.
    """
    if kind not in KINDS:
        raise DepthlensError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not (isinstance(forms_at, (int, float)) and 0 < forms_at < 1):
        raise DepthlensError(f"forms_at must be a number in (0, 1), got {forms_at!r}")
    if data.seq_len < 3:
        raise DataError(f"the lens needs sequences of >= 3 tokens (BOS, a position, its target), got {data.seq_len}")
    check_readable(model)
    L = model.n_layer
    dev = model_device(model)
    bs = batch_size or default_batch_size(data)
    train_log: dict[str, Any] = {}
    options: dict[str, Any] = {"kind": kind, "forms_at": forms_at, "batch_size": batch_size}
    if kind == "tuned":
        o = TrainOptions(steps, tokens_per_step, optimizer, lr, weight_decay, train_n_seq, train_seed)
        options.update({k if k.startswith("train_") else f"train_{k}": v for k, v in asdict(o).items()})
        options["train_lr"] = o.learning_rate
        if translators is None:
            td = training_data(model, data, checkpoint, o, train_data)
            translators, train_log = load_or_train(model, td, o, cache=cache, batch_size=batch_size, progress=progress)
            options["train_split"] = td.name  # e.g. corpus-<tokenizer>/train
            options["train_source"] = td.source
        else:
            options["train_split"] = "translators given"
    readout = Readout(model)
    tr = translators if kind == "tuned" else None
    batches = list(data.batches(bs))
    count = Count(progress, len(batches))
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("kl", "rank", "agree", "ce")}
    t0, c0 = time.perf_counter(), time.process_time()
    with evaluating(model), torch.no_grad():
        for _, toks in batches:
            toks = toks.to(dev)
            states = boundary_states(model, toks)  # L+1 × (b, T−2, d)
            b, P = states[0].shape[:2]
            targets = toks[:, 2:].reshape(-1)
            stats = PositionStats(readout, states[-1].reshape(1, b * P, -1), targets)
            per: dict[str, list[np.ndarray]] = {k: [] for k in parts}
            for l, h in enumerate(states):
                hl = h.reshape(1, b * P, -1)
                out = stats(translate(tr, hl, l) if l < L else hl)
                for k, v in out.items():
                    per[k].append(v.reshape(b, P).cpu().numpy())
            for k in parts:
                parts[k].append(np.stack(per[k]))  # (L+1, b, P)
            count.add()
    tok = {k: np.concatenate(v, axis=1) for k, v in parts.items()}  # (L+1, N, P)
    kl_tok = tok["kl"].astype(np.float64)
    rank_tok = tok["rank"].astype(np.int64)
    seq = {
        "lens_kl": per_sequence(kl_tok),
        "target_rank": per_sequence(rank_tok.astype(np.float64), "median"),
        "top1_agree": per_sequence(tok["agree"].astype(np.float64)),
        "lens_ce": per_sequence(tok["ce"].astype(np.float64)),
    }
    depth = np.arange(L + 1) / L
    forms = forms_interval(seq["top1_agree"], depth, forms_at, n_boot=n_boot, seed=0)
    meta = {
        "lens_kl": ("KL(p_final || q_lens), position mean", "nat", (0.0, np.inf)),
        "target_rank": (
            "rank of the target token under the lens (0 = top-1), median over positions",
            "1",
            (0.0, np.inf),
        ),
        "top1_agree": ("top-1 agreement of the lens with the final prediction, share of positions", "1", (0.0, 1.0)),
        "lens_ce": ("cross-entropy of the lens on the next token, position mean", CE_UNITS, (0.0, np.inf)),
    }
    vars_: dict[str, Any] = {}
    for name, (long, units, bounds) in meta.items():
        s = seq[name]
        lohi, ci_attrs = _interval_var(s, n_boot, 0, bounds)
        vars_[name] = data_var(("layer",), s.mean(-1), f"{kind} lens: {long}, sequence mean", units)
        vars_[f"{name}_seq"] = data_var(("layer", "sequence"), s, f"{kind} lens: {long}, per sequence", units)
        vars_[f"{name}_ci"] = data_var(
            ("layer", "bound"), lohi, f"{kind} lens: {long}, 95% interval of the sequence mean", units, **ci_attrs
        )
    vars_["lens_kl_tok"] = data_var(
        ("layer", "sequence", "position"),
        kl_tok.astype(np.float32),
        f"{kind} lens: KL(p_final || q_lens) per position",
        "nat",
    )
    vars_["target_rank_tok"] = data_var(
        ("layer", "sequence", "position"),
        rank_tok.astype(np.int32),
        f"{kind} lens: rank of the target token per position (0 = top-1)",
    )
    forms_attrs = {"units": "1", "forms_at": forms_at, "ci_method": forms["method"], "ci_unit": forms["unit"]}
    for suffix, key, what in (
        ("", "estimate", ""),
        ("_low", "low", ", 95% interval low"),
        ("_high", "high", ", 95% interval high"),
    ):
        vars_[f"forms_depth{suffix}"] = data_var(
            (),
            np.float64(forms[key]),
            f"{kind} lens: first relative depth with top-1 agreement > {forms_at:g}{what}",
            **forms_attrs,
        )
    options.update(
        {
            "n_boot": n_boot,
            "positions": "1..T-2 (BOS excluded; position t predicts token t+1)",
            "head_path": "vocab-chunked" if readout.chunked else "whole-logits",
            "eval_seconds": round(time.perf_counter() - t0, 3),
            "eval_cpu_seconds": round(time.process_time() - c0, 3),
        }
    )
    for k in ("train_seconds", "train_cpu_seconds", "train_rows", "train_data_sha256", "cache", "cache_key"):
        if k in train_log:
            options[k] = train_log[k]
    if "train_loss" in train_log:
        options["train_loss_first"] = train_log["train_loss"][0]
        options["train_loss_last"] = train_log["train_loss"][-1]
    coords = {
        "layer": ("layer", np.arange(L + 1), {"long_name": "layer boundary l (residual after l layers)", "units": "1"}),
        "depth": ("layer", depth, {"long_name": "relative depth l / L", "units": "1"}),
        "sequence": ("sequence", np.arange(tok["kl"].shape[1]), {"long_name": "eval sequence", "units": "1"}),
        "position": ("position", np.arange(1, tok["kl"].shape[2] + 1), {"long_name": "token position", "units": "1"}),
        "bound": ("bound", np.array(["low", "high"]), {"long_name": "interval bound"}),
    }
    title = f"depthlens {kind} lens: KL to the final layer, target rank, top-1 agreement, CE by depth"
    ds = model_dataset(model, data, checkpoint, vars_, coords, metric=f"{kind}_lens", title=title, options=options)
    if train_log.get("train_loss"):
        ds["train_loss"] = xr.DataArray(
            np.asarray(train_log["train_loss"]),
            dims=("train_step",),
            attrs={"long_name": "tuned lens training loss: mean over layers of KL(p_final || q_l)", "units": "nat"},
        )
    return ds


def _checked(opts: dict[str, Any]) -> dict[str, Any]:
    """The options as given, or one line naming an unknown one (a `--opt` typo)."""
    import inspect

    known = set(inspect.signature(lens_readout).parameters) - {"model", "data", "kind"}
    bad = sorted(set(opts) - known)
    if bad:
        raise DepthlensError(f"unknown lens option {', '.join(map(repr, bad))}; choose from {', '.join(sorted(known))}")
    return opts


def logit_lens(model: LayeredLM, data: EvalData, **opts: Any) -> xr.Dataset:
    """The logit lens (`lens_readout(kind="logit")`)."""
    return lens_readout(model, data, kind="logit", **_checked(opts))


def tuned_lens(model: LayeredLM, data: EvalData, **opts: Any) -> xr.Dataset:
    """The tuned lens (`lens_readout(kind="tuned")`)."""
    return lens_readout(model, data, kind="tuned", **_checked(opts))
