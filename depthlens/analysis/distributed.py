"""Analysis over many processes with torch.distributed (launched by torchrun; no scheduler of our own).

    torchrun --nproc_per_node 4 -m depthlens.cli causal CKPT      # the arms (skipped layers) split over 4 ranks
    torchrun --nproc_per_node 4 -m depthlens.cli permute CKPT     # the swap pairs split over 4 ranks

Each rank holds the whole model (one model per process: on a multi-GPU node set CUDA_VISIBLE_DEVICES per
rank or pass `--device cuda:LOCAL_RANK`), runs its share of the interventions on every sequence, and the
per-rank result arrays are merged with one `all_gather_object` over a gloo group: every cell of a result
array is written by exactly one rank (NaN or 0 elsewhere), so the merge is an element-wise fmax / sum and
the merged dataset is the one a single process builds. Only rank 0 writes files and prints.

Failure: a rank that raises exits non-zero; torchrun then stops the other ranks (they never reach the
merge), and since only rank 0 writes, after the merge, atomically, no partial file is left.

Outside torchrun (WORLD_SIZE unset or 1) every function here is a no-op: rank 0 of 1.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta
from typing import Any, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, world size). Initialises the default process group (gloo: only small numpy results travel) when
    launched by torchrun with WORLD_SIZE > 1; (0, 1) otherwise."""
    import torch.distributed as dist

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
