"""Progress on stderr for every long command: the one idiom of the CLI.

- stderr a terminal: a transient rich bar (what, bar, done/total, elapsed, ETA, extra fields) that leaves no trace;
- stderr a pipe or a file (a CI log, `| tee`, `2>log`): one plain line per finished step, e.g.
  `[12/57] report: hc_l16: causal 7.7 s, eta 5m10s` (train: `... · loss 2.31`), but only once the work has run for `PLAIN_AFTER_S` seconds
  (short commands stay silent) and, for fine-grained engine steps, at most one line per `every` seconds;
- `--quiet` (read by `app.domain_errors` into `QUIET`), or a torchrun rank other than 0: nothing.

Progress never goes to stdout, so `--json` output stays clean. `DEPTHLENS_PROGRESS=bar|lines|off` overrides the
terminal test (tests; CI systems that want bars).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

QUIET = False  # --quiet of the running command (set by app.domain_errors)
_LIVE: list[Any] = []  # the rich display of the outermost bar; nested work (loading inside sweep) adds a row to it
PLAIN_AFTER_S = 2.0  # plain lines only for work that has run at least this long
T = TypeVar("T")


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def _other_rank() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and int(os.environ.get("RANK", "0") or 0) != 0


def mode() -> str | None:
    """ "bar", "lines" or None (silent) for the current command."""
    if QUIET or _other_rank():
        return None
    forced = os.environ.get("DEPTHLENS_PROGRESS", "").strip().lower()
    if forced in ("off", "0", "none"):
        return None
    if forced in ("bar", "lines"):
        return forced
    return "bar" if stderr_is_tty() else "lines"


def active() -> bool:
    return mode() is not None


def console() -> Any:
    from rich.console import Console

    return Console(stderr=True, force_terminal=stderr_is_tty())


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def _fields(fields: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items() if v is not None)


class Progress:
    """Progress of one long piece of work; use as a context manager.

    what: the work's name (first column / line prefix). total: the number of steps (None: not known yet; the bar
    pulses until `set_total` or `update` gives it). every: the least seconds between two plain lines (0: a line
    per step; engine callbacks that fire per batch chunk use a few seconds). show=False: silent.
    """

    def __init__(self, what: str, total: int | None = None, *, every: float = 0.0, show: bool = True):
        self.what, self.total, self.every = what, total, every
        self.mode = mode() if show else None
        self.done = 0
        self._ref: tuple[float, int] | None = None  # (time, done) the ETA's rate is measured from
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        self.t0 = time.perf_counter()
        self._t_line = -float("inf")
        if self.mode == "bar":
            self._outer = not _LIVE
            if self._outer:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )
                from rich.progress import Progress as RichProgress

                live = RichProgress(
                    SpinnerColumn(),
                    TextColumn("[bold]{task.fields[what]}[/]"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("eta"),
                    TimeRemainingColumn(),
                    TextColumn("{task.description}"),
                    console=console(),
                    transient=True,
                )
                live.__enter__()
                _LIVE.append(live)
            self._bar = _LIVE[0]
            self._task = self._bar.add_task("", total=self.total, what=self.what)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            if self._outer:
                _LIVE.clear()
                self._bar.__exit__(*exc)
            else:
                self._bar.remove_task(self._task)
            self._bar = None
        elif self.mode == "lines" and exc[0] is None and self.total is None and self.done == 0:
            dt = time.perf_counter() - self.t0
            if dt >= PLAIN_AFTER_S:  # a single long step (loading a GGUF): its time
                self._line(f"{self.what}: {dt:.1f} s")

    def set_total(self, total: int | None, desc: str | None = None) -> None:
        self.total = total
        if total is not None and self._ref is None:  # the count starts now: loading before it is not in the rate
            self._ref = (time.perf_counter(), self.done)
        if self._bar is not None:
            self._bar.update(self._task, total=total, **({} if desc is None else {"description": desc}))

    def step(self, desc: str = "", n: int = 1, **fields: Any) -> None:
        """`n` more steps finished; `desc` names the finished one, `fields` (loss=...) are shown after it."""
        self._advance_to(self.done + n, desc, fields)

    def update(self, done: int, total: int | None = None) -> None:
        """Absolute progress, the engines' callback signature: `done` of `total` units finished."""
        if total is not None and total != self.total:
            self.set_total(total)
        if done != self.done:
            self._advance_to(done, "", {})

    def _advance_to(self, done: int, desc: str, fields: dict[str, Any]) -> None:
        now = time.perf_counter()
        self.done = done
        extra = _fields(fields)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, description="  ".join(x for x in (desc, extra) if x))
            return
        if self.mode != "lines":
            return
        last = self.total is not None and done >= self.total
        if now - self.t0 < PLAIN_AFTER_S and not (last and self._t_line > -float("inf")):
            return  # short work stays silent (a line already printed: the last one completes the record)
        if now - self._t_line < self.every and not last:
            return
        count = f"[{done}/{self.total}]" if self.total else f"[{done}]"
        eta = ""
        t_ref, d_ref = self._ref or (self.t0, 0)
        if self.total and d_ref < done < self.total:
            eta = f", eta {_clock((now - t_ref) / (done - d_ref) * (self.total - done))}"
        since = now - max(self._t_line, self.t0)  # the steps this line covers (one, unless lines are throttled)
        self._line(
            f"{count} {self.what}"
            + (f": {desc}" if desc else "")
            + f" {since:.1f} s{eta}"
            + (f" · {extra}" if extra else "")
        )

    def _line(self, text: str) -> None:
        self._t_line = time.perf_counter()
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def engine(self) -> Callable[[int, int], None]:
        """The callback the engines take (`progress=`): `(done, total)`."""
        return self.update


@contextlib.contextmanager
def spinner(what: str, show: bool = True) -> Iterator[Progress]:
    """A single long call (loading a large checkpoint): a pulsing bar, which a callback may turn into a count."""
    with Progress(what, None, every=5.0, show=show) as p:
        yield p


@contextlib.contextmanager
def bar(what: str, total: int | None, show: bool = True, every: float = 0.0) -> Iterator[Callable[..., None]]:
    """A progress bar; yields `advance(n=1, **fields)` (fields: e.g. loss=..., shown after the bar)."""
    with Progress(what, total, every=every, show=show) as p:
        yield lambda n=1, **fields: p.step("", n, **fields)


def each(items: Iterable[T], what: str, name: Callable[[T], str] = str) -> Iterator[T]:
    """Iterate `items` with a step per item (sweep, compare: one checkpoint each)."""
    items = list(items)
    with Progress(what, len(items)) as p:
        for it in items:
            if p._bar is not None:
                p._bar.update(p._task, description=name(it))
            yield it
            p.step(name(it))
