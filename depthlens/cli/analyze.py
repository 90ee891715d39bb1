"""The analysis commands: of one checkpoint, each diagnostic's, built from its spec (cli/diagnostic.py; those
with a command of their own are registered here, first), and of several checkpoints, sweep and compare
(compare.py); the options and helpers they all share are in common.py.

Each prints a headline (with a bootstrap CI where the metric allows one) and a compact terminal view,
and writes the labelled dataset (netCDF) atomically. `--json` prints the headline as JSON instead.
"""

from __future__ import annotations

from ..diagnostics import registry  # stdlib-only: each diagnostic's spec, its own command's among them
from .app import app
from .common import (
    DTYPES,
    BatchOpt,
    BootOpt,
    CkptArg,
    CkptsArg,
    Common,
    DataOpt,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    NSeqOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SeqLenOpt,
    ThreadsOpt,
    TokensOpt,
    _common,
    _fmt_share,
    _json,
    _matrix_view,
    _opts,
    _study,
    busy,
    check_choice,
    check_threshold,
    emit,
    eval_data,
    open_model,
    resolve_out,
    write,
)
from .diagnostic import command_function

# The analysis commands and what they share, wherever defined (common.py: options and helpers; compare.py: the
# commands over several checkpoints): other commands and tests import them from here.
__all__ = [
    "GRID_MAX",
    "METRIC_CHOICES",
    "compare",
    "parse_grid",
    "sweep",
    "DTYPES",
    "BatchOpt",
    "BootOpt",
    "CkptArg",
    "CkptsArg",
    "Common",
    "DataOpt",
    "DeviceMapOpt",
    "DeviceOpt",
    "DtypeOpt",
    "JsonOpt",
    "NSeqOpt",
    "OutOpt",
    "OverwriteOpt",
    "SeedOpt",
    "SeqLenOpt",
    "ThreadsOpt",
    "TokensOpt",
    "_common",
    "_fmt_share",
    "_json",
    "_matrix_view",
    "_opts",
    "_study",
    "busy",
    "check_choice",
    "check_threshold",
    "emit",
    "eval_data",
    "open_model",
    "resolve_out",
    "write",
]

# --- commands ------------------------------------------------------------------------------------------

# The command of each diagnostic whose spec declares one of its own (`Diagnostic.command`: causal, permute), built
# from the spec (cli/diagnostic.py), in registry order; the other diagnostics get the generic command on demand.
for _d in registry.DIAGNOSTICS:
    if _d.command is not None:
        app.command(name=_d.command.name)(command_function(_d))


# The commands over several checkpoints, registered after the ones above (so `--help` lists them in the same
# order) and re-exported: callers import them, and the threshold grid parser, from here.
from .compare import GRID_MAX, METRIC_CHOICES, compare, parse_grid, sweep  # noqa: E402
