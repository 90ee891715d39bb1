"""The command line as a user would type it again, for provenance (report manifests, netCDF history).

Under `torchrun -m depthlens.cli report ...` (or `python -m depthlens.cli`) sys.argv[0] is the path of
depthlens/cli/__main__.py: recorded as "__main__.py report ..." it names no command anyone can run."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

# module entry points -> how the command is written in the docs
_ENTRY_POINTS = {
    ("cli", "__main__.py"): "depthlens",
    ("training", "trainer.py"): "python -m depthlens.training.trainer",
}


def command_line(argv: Sequence[str] | None = None) -> str:
    """`argv` (default sys.argv) as a command: the depthlens program name, then the arguments as given."""
    argv = list(sys.argv if argv is None else argv) or [""]
    prog = Path(argv[0])
    name = prog.name
    if prog.parent.parent.name == "depthlens":
        name = _ENTRY_POINTS.get((prog.parent.name, prog.name), name)
    return " ".join([name, *argv[1:]])
