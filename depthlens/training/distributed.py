"""torch.distributed plumbing: torchrun env -> process group, DDP / FSDP2 wrapping, gradient-sync toggles,
and full (unsharded) state dicts so the resume state is one safetensors file whatever the world size.

Without WORLD_SIZE in the environment (plain `python -m ...`) everything is a single process and no
process group is created.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def pick_device(pref: str) -> torch.device:
    if pref == "cuda" or (pref == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' requested but CUDA is not available")
        return torch.device("cuda")
    return torch.device("cpu")


def init_distributed(device_pref: str = "auto") -> DistInfo:
    """Read the torchrun env (RANK, WORLD_SIZE, LOCAL_RANK) and join the process group (nccl on CUDA, else gloo)."""
    device = pick_device(device_pref)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=datetime.timedelta(minutes=30),
            device_id=device if device.type == "cuda" else None,
        )
    return DistInfo(rank=rank, world=world, local_rank=local_rank, device=device)


def shutdown() -> None:
    """Leave the process group (at process exit: a new group on the same rendezvous could hang)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, info: DistInfo, *, fsdp: bool) -> nn.Module:
    """DDP (default) or FSDP2: `fully_shard` every block, then the root (torchtitan's order), so each
    block's parameters are gathered just before it runs and freed after."""
    if not info.distributed:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        # FSDP2 cannot shard 0-D parameters (HC's and mHC's gate scales): they stay replicated, outside
        # FSDP, and `sync_replicated_grads` averages their gradients by hand
        replicated = replicated_params(model)
        scalars = set(replicated)
        blocks: nn.ModuleList = model.blocks  # type: ignore[assignment]  # a DepthModel's blocks
        for block in blocks:
            fully_shard(block, ignored_params=scalars)
        fully_shard(model, ignored_params=scalars)
        setattr(model, "_replicated_params", replicated)  # noqa: B010  # read by sync_replicated_grads
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    # DDP's default reducer waits for every gradient; some designs leave parameters out of the loss
    # (MoDA's last-layer depth K/V are read only by later layers), so turn on detection just for them
    return DDP(
        model,
        device_ids=[info.device.index] if info.device.type == "cuda" else None,
        find_unused_parameters=bool(unused_parameters(model, info.device)),
    )


def replicated_params(model: nn.Module) -> list[nn.Parameter]:
    """The 0-D parameters, ordered by name. Every rank must all-reduce them in the same order: the k-th
    all-reduce of rank 0 is paired with the k-th of rank 1. Names are the same on every rank; `id()`
    (a memory address) is not, and ordering by it averaged one gate's gradient with another's."""
    return [p for _, p in sorted(model.named_parameters(), key=lambda np_: np_[0]) if p.dim() == 0]


def unused_parameters(model: nn.Module, device: torch.device) -> list[str]:
    """Names of parameters that get no gradient from a forward pass (a probe on 8 tokens)."""
    model(torch.zeros(1, 8, dtype=torch.long, device=device)).float().sum().backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce gradients across ranks only when `enabled` (the last micro-step of an accumulation)."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        getattr(model, "set_requires_gradient_sync")(enabled)  # noqa: B009  # an FSDP2 module's method
        yield
    elif hasattr(model, "no_sync") and not enabled:  # DDP
        with getattr(model, "no_sync")():  # noqa: B009  # DDP's method
            yield
    else:
        yield


def sync_replicated_grads(model: nn.Module, info: DistInfo) -> None:
    """Average the gradients of the parameters FSDP2 left replicated (call after the last backward)."""
    for p in getattr(model, "_replicated_params", ()):
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= info.world


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global grad-norm clip; handles FSDP2's mix of sharded (DTensor) and replicated gradients."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not hasattr(model, "_replicated_params"):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    sharded = [p for p in params if hasattr(p.grad, "full_tensor")]
    plain = [p for p in params if not hasattr(p.grad, "full_tensor")]
    norms = [
        torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None])
        for group in (sharded, plain)
        if group
    ]
    norm = torch.stack([n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]).norm()
    for group in (sharded, plain):
        if group:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm


def all_reduce(values: list[float], info: DistInfo, op: str = "mean") -> list[float]:
    """Sum or mean of a few floats over ranks (float64, so the result does not depend on the rank order much)."""
    if not info.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    if op == "mean":
        t /= info.world
    return t.tolist()


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's `obj` on every rank (a small picklable value made by our own code, e.g. a hash string)."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


# -------------------------------------------------------------------------------------------------
# full state dicts (work for plain modules, DDP and FSDP2 alike; keys are the unwrapped module's FQNs)


def _options(**kw: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state, optimizer state) gathered to full CPU tensors, keyed by parameter FQN."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model_sd: dict[str, Any] = get_model_state_dict(model, options=_options())
    optim_sd: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=_options())
    return model_sd, optim_sd


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model state alone, gathered like `full_state`. Asking for the optimizer state before the first
    step would make torch initialise it with a zero-gradient step, which perturbs the run (AdamW's step
    count and decay): snapshots must not change training."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(model, options=_options())
    return state


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, torch.Tensor], optim_sd: dict[str, Any]
) -> None:
    """Inverse of `full_state` (every rank passes the same full state; FSDP2 keeps its own shard)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    full: dict[str, Any] = dict(model_sd)  # torch types the values as its ValueType union
    set_model_state_dict(model, full, options=_options(strict=True))
    # not strict: a parameter that never gets a gradient (MoDA's last-layer depth K/V) has no AdamW state, and
    # a strict load refuses its absence. The caller (trainer.load_state -> state.check_complete) has already
    # checked that the state covers exactly the parameters that do get one.
    set_optimizer_state_dict(model, optimizer, optim_sd, options=_options(strict=False))
