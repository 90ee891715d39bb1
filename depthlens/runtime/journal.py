"""A stage's finished units of work on disk, so a stopped run resumes where it stopped instead of from zero.

The held-out pruning stages of a 0.5B model are hours of forward passes on one core and write their dataset only
at the end; a run stopped at 90 % used to lose everything. A `Journal` is an append-only JSON-lines file: one line
per finished unit (a key and the unit's float64 result), flushed as it is written. A rerun replays the lines whose
key it asks for and computes the rest, so the finished dataset is the same bit for bit as an unbroken run's.

The first line is the identity of the run that wrote it: whatever the caller says the results depend on (the eval
tokens' hash, the clean result, the thread count, library versions). A journal whose identity differs is moved
aside (`<name>.stale`), never mixed in: a changed model, eval set or thread count starts afresh. Floats are written
by `repr`, which Python reads back exactly; a line cut short by a kill is ignored. Reads and writes hold a file
lock (`<name>.lock`), so two runs on the same journal (two `depthlens prune` of one model) share it safely.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import filelock
import numpy as np


def _key(parts: Sequence[int]) -> str:
    return ",".join(str(int(p)) for p in parts)


class Journal:
    """`get(key)` the result a previous run stored for `key` (None: not stored); `put(key, values)` stores one.

    path: the JSON-lines file (its folder is created). identity: JSON-able facts the results depend on.
    """

    def __init__(self, path: str | os.PathLike[str], identity: dict[str, Any]):
        self.path = Path(path)
        self.identity = json.loads(json.dumps(identity))  # as it reads back: tuples become lists
        self.replayed = 0  # units answered from the file, for the caller's progress line
        self._stored: dict[str, list[float]] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = filelock.FileLock(str(self.path.with_name(self.path.name + ".lock")))
        with self._lock:
            if self.path.exists():
                self._read()
            if not self.path.exists():
                with self.path.open("w") as f:
                    f.write(json.dumps({"identity": self.identity}) + "\n")

    def _read(self) -> None:
        text = self.path.read_text()
        lines = text.splitlines()
        try:
            head = json.loads(lines[0])["identity"] if lines else None
        except (ValueError, KeyError, TypeError):
            head = None
        if head != self.identity:  # another model, eval set, thread count or version: start afresh
            self.path.replace(self.path.with_name(self.path.name + ".stale"))
            return
        for line in lines[1:]:
            try:
                rec = json.loads(line)
                self._stored[str(rec["key"])] = [float(v) for v in rec["values"]]
            except (ValueError, KeyError, TypeError):  # a line cut short when the run was stopped
                continue
        if not text.endswith("\n"):  # the cut line ends here, so the next unit starts a line of its own
            with self.path.open("a") as f:
                f.write("\n")

    def get(self, key: Sequence[int]) -> np.ndarray | None:
        values = self._stored.get(_key(key))
        if values is None:
            return None
        self.replayed += 1
        return np.asarray(values, dtype=np.float64)

    def put(self, key: Sequence[int], values: np.ndarray) -> None:
        k = _key(key)
        row = [float(v) for v in np.asarray(values, dtype=np.float64).ravel()]
        self._stored[k] = row
        with self._lock, self.path.open("a") as f:
            f.write(json.dumps({"key": k, "values": row}) + "\n")
