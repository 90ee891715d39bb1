"""A described model named on the command line: `FILE.py:FUNCTION` with `--weights W` (docs/own-model.md#command-line).

The CLI attaches each `--weights W`, in order, to the FILE.py:FUNCTION arguments as `W@/abs/FILE.py:FUNCTION` before
any command parses them, so every command that takes checkpoint paths takes described models too, and the path's
last component (what tables and default output names show) stays `FILE.py:FUNCTION`. String handling only (no torch);
the loading is `described.open_described`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError

REF = re.compile(r"^(?:(?P<weights>.+)@)?(?P<file>[^@]+\.py):(?P<function>[A-Za-z_]\w*)$")
PICKLE_HINT = 'safetensors.torch.save_file(model.state_dict(), "model.safetensors")'


@dataclass(frozen=True)
class Ref:
    """A described model named on the command line: the user's file, its function, and the weights (or None)."""

    file: str
    function: str
    weights: str | None = None

    @property
    def name(self) -> str:
        """The model's name in tables and default output files: FILE.py:FUNCTION without the folders."""
        return f"{Path(self.file).name}:{self.function}"

    def __str__(self) -> str:
        return ("" if self.weights is None else f"{self.weights}@") + f"{self.file}:{self.function}"


def parse_ref(text: Any) -> Ref | None:
    """The Ref of "FILE.py:FUNCTION" or "WEIGHTS@FILE.py:FUNCTION", or None for any other path."""
    m = REF.match(str(text))
    return None if m is None else Ref(m["file"], m["function"], m["weights"])


def pair_weights(args: Sequence[str]) -> list[str]:
    """The command line with every `--weights W` (or `--weights=W`) attached, in order, to the FILE.py:FUNCTION
    arguments that name no weights yet (W@FILE.py:FUNCTION); the arguments as they are when none is given."""
    out: list[str] = []
    weights: list[str] = []
    it = iter(args)
    for a in it:
        if a == "--":
            out.append(a)
            out.extend(it)
            break
        if a == "--weights":
            w = next(it, None)
            if w is None:
                raise UsageError("--weights needs a value: a safetensors file or a Hugging Face directory")
            weights.append(w)
        elif a.startswith("--weights="):
            weights.append(a.split("=", 1)[1])
        else:
            out.append(a)
    if not weights:
        return out
    slots = [i for i, a in enumerate(out) if (r := parse_ref(a)) is not None and r.weights is None]
    if len(slots) != len(weights):
        raise UsageError(
            f"{len(weights)} --weights for {len(slots)} FILE.py:FUNCTION model(s) without weights; give one "
            "--weights per FILE.py:FUNCTION, in order"
        )
    for i, w in zip(slots, weights):  # the file made absolute: the path's last component is FILE.py:FUNCTION
        r = parse_ref(out[i])
        assert r is not None
        out[i] = f"{w}@{os.path.abspath(r.file)}:{r.function}"
    return out
