"""Analysis over many processes with torch.distributed (launched by torchrun; no scheduler of our own).

    torchrun --nproc_per_node 4 -m depthlens.cli causal CKPT      # the arms (skipped layers) split over 4 ranks
    torchrun --nproc_per_node 4 -m depthlens.cli permute CKPT     # the swap pairs split over 4 ranks

Each rank holds the whole model (one model per process: on a multi-GPU node `--device cuda` is
cuda:LOCAL_RANK, `device_for_rank`), runs its share of the interventions on every sequence, and the
per-rank result arrays are merged with one `all_gather_object` over a gloo group: every cell of a result
array is written by exactly one rank (NaN or 0 elsewhere), so the merge is an element-wise fmax / sum and
the merged dataset is the one a single process builds. Only rank 0 writes files and prints.

    torchrun --nproc_per_node 4 -m depthlens.cli report CKPTS... --out DIR   # whole checkpoints per rank

`report` gives each rank whole checkpoints (depthlens.runtime.ranks) and runs the engines inside
`local_only()`, so they do not split their arms over the ranks a second time.

Failure: a rank that raises exits non-zero; torchrun then stops the other ranks (they never reach the
merge), and since only rank 0 writes, after the merge, atomically, no partial file is left. `agree` is the
orderly form for long, uneven shares of work (report): every rank reports ok or its error, and all of them
stop with the failing rank's one line instead of some waiting in a collective.

Outside torchrun (WORLD_SIZE unset or 1) every function here is a no-op: rank 0 of 1.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np

from depthlens.errors import DepthlensError

T = TypeVar("T")
_local_depth = 0  # open local_only() blocks


@contextmanager
def local_only() -> Iterator[None]:
    """While active, world() is (0, 1) in this process: the engines run whole here and merge nothing.

    For callers that already split the work themselves (report: whole checkpoints per rank); the process
    group stays up, and is_main() still tells rank 0 (the one that prints and writes)."""
    global _local_depth
    _local_depth += 1
    try:
        yield
    finally:
        _local_depth -= 1


def world() -> tuple[int, int]:
    """(rank, world size). Initialises the default process group (gloo: only small numpy results travel) when
    launched by torchrun with WORLD_SIZE > 1; (0, 1) otherwise, and inside local_only()."""
    import torch.distributed as dist

    if _local_depth:
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    n = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if n <= 1 or not dist.is_available():
        return 0, 1
    minutes = float(os.environ.get("DEPTHLENS_DIST_TIMEOUT_MIN", "60"))
    dist.init_process_group(backend="gloo", timeout=timedelta(minutes=minutes))
    # tear the group down before interpreter shutdown: a gloo group left to the C++ destructors at exit
    # aborts the process ("terminate called without an active exception", SIGABRT) now and then
    atexit.register(_shutdown)
    return dist.get_rank(), dist.get_world_size()


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that writes files and prints."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0") or 0) == 0


def shard(items: Sequence[T], rank: int, n: int) -> list[T]:
    """Round-robin share of rank `rank` out of `n` (balanced for staircase costs that fall with the index)."""
    return list(items[rank::n])


def merge(arrays: dict[str, np.ndarray], how: dict[str, str]) -> dict[str, np.ndarray]:
    """Element-wise merge of every rank's arrays (same keys and shapes on every rank), returned on every rank.

    how[key]: "fmax" (NaN where a rank computed nothing) or "sum" (0 where a rank computed nothing).
    """
    rank, n = world()
    if n == 1:
        return arrays
    import torch.distributed as dist

    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, arrays)
    out = {}
    for key in arrays:
        parts = [g[key] for g in gathered]
        if how[key] == "sum":
            out[key] = np.sum(parts, axis=0)
        else:
            acc = parts[0].copy()
            for p in parts[1:]:
                acc = np.fmax(acc, p)
            out[key] = acc
    return out


def launched() -> bool:
    """True under torchrun (or any launcher that sets WORLD_SIZE > 1), before or after the group is up."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def device_for_rank(device: str) -> str:
    """`cuda` → `cuda:<LOCAL_RANK mod visible GPUs>` under torchrun: one GPU per rank on a node (and cuda:0
    when CUDA_VISIBLE_DEVICES gives each rank a single GPU). Anything else, and one process: unchanged."""
    if device != "cuda" or not launched():
        return device
    import torch

    n_gpu = torch.cuda.device_count()
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0') or 0) % n_gpu}" if n_gpu else device


# Collectives that wait on whole shares of work (report: a rank waits for the slowest rank's checkpoints, which
# can take hours) get their own group with a long timeout. A rank that dies is not found by this timeout: its
# sockets close (gloo raises at once in its peers) and torchrun stops every rank when one exits non-zero.
LONG_WAIT = timedelta(days=3)


def long_wait_group() -> Any:
    """A gloo group over every rank with the LONG_WAIT timeout (collective: every rank calls it, in order)."""
    import torch.distributed as dist

    world()
    return dist.new_group(backend="gloo", timeout=LONG_WAIT)


class RankFailed(DepthlensError):
    """Another rank failed; raised on the ranks that did not (the message is the failing rank's one line)."""


def error_line(err: BaseException) -> str:
    """The one line the CLI prints for `err` (depthlens.cli.app.domain_errors: class name for OS/runtime errors)."""
    msg = str(err).splitlines()[0] if str(err) else ""
    return msg if isinstance(err, (DepthlensError, ValueError)) else f"{type(err).__name__}: {msg}"


def agree(error: BaseException | None, payload: Any = None, group: Any = None) -> list[Any]:
    """Every rank reports ok (error None) or its error, with a small picklable payload; returns every rank's
    payload, in rank order, when all are ok. If any rank failed, every rank raises: a rank that failed its own
    exception (rank 0's as a single process would), the others RankFailed("rank k: <line>") for the lowest
    failing rank k. One process: the error re-raised, or [payload]."""
    rank, n = world()
    if n == 1:
        if error is not None:
            raise error
        return [payload]
    import torch.distributed as dist

    mine = (None, payload) if error is None else (error_line(error), None)
    got: list[Any] = [None] * n
    try:
        dist.all_gather_object(got, mine, group=group)
    except Exception:  # noqa: BLE001  (a peer died: gloo raises "connection closed"; our own error says more)
        if error is None:
            raise
    if error is not None:
        raise error
    failed = [k for k, (line, _) in enumerate(got) if line is not None]
    if failed:
        raise RankFailed(f"rank {failed[0]}: {got[failed[0]][0]}")
    return [p for _, p in got]


def gather_to_main(obj: Any, group: Any = None) -> list[Any] | None:
    """Every rank's `obj`, in rank order, on rank 0 (None on the others). One process: [obj]."""
    rank, n = world()
    if n == 1:
        return [obj]
    import torch.distributed as dist

    got: list[Any] | None = [None] * n if rank == 0 else None
    dist.gather_object(obj, got, dst=0, group=group)
    return got
