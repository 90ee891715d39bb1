"""Progress of an engine run: the optional `progress(done, total)` callback every engine takes.

The engines count finished units of their own work (causal: skip runs, i.e. one skipped layer on one batch of
sequences; permutation: swapped pairs on a batch; angular, mixing, rank, attnres: batches). The callback only
observes: it never changes what is computed or in which order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

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


@contextlib.contextmanager
def progress_bar(what: str, show: bool = True) -> Iterator[ProgressFn | None]:
    """The API's progress: a `tqdm.auto` bar (an ipywidgets bar where a notebook kernel runs, a text bar on stderr
    elsewhere) driven by an engine's `progress(done, total)`; `show=False` yields None (nothing is drawn)."""
    if not show:
        yield None
        return
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    bars: list[Any] = []  # made at the first call, when the engine has said its total

    def update(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(desc=what, total=total, unit="step", leave=True))
        bar = bars[0]
        if bar.total != total:
            bar.reset(total=total)
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()
