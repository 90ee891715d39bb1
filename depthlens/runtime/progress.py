"""Progress of an engine run: the optional `progress(done, total)` callback every engine takes.

The engines count finished units of their own work (causal: skip runs, i.e. one skipped layer on one batch of
sequences; permutation: swapped pairs on a batch; angular, mixing, rank, attnres: batches). The callback only
observes: it never changes what is computed or in which order.
"""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[int, int], None]  # (units done, units in total)


class Count:
    """Finished units of one engine run, reported to `progress` (None: nothing is reported)."""

    def __init__(self, progress: ProgressFn | None, total: int):
        self.progress, self.total, self.done = progress, int(total), 0
        if progress is not None:
            progress(0, self.total)

    def add(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)
