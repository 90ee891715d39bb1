"""Option checks that run before any command does work (called by `app.domain_errors` on every command).

Options with the same name mean the same thing in every command, so they are checked once, here, by name:
a bad value is one stderr line naming the option, exit 2 (usage) or 1 (domain: e.g. no CUDA in this
torch build), before a checkpoint is read or a tensor allocated.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from ..errors import DepthlensError, UsageError  # noqa: F401  (UsageError: re-exported, its old home)

SEED_MAX = 2**63 - 1  # seeds are stored as int64 netCDF attributes and fed to torch/numpy generators
N_BOOT_MAX = 100_000  # bootstrap resamples: beyond this the CI does not move, the run just never ends
INT_OPTION_MAX = 2**31 - 1  # counts and sizes: stored as netCDF int attributes, and no run needs more
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")  # "auto" is --device-map's (a torch device it is not)


def device(value: str, option: str = "--device") -> str:
    if not _DEVICE.match(value):
        hint = " (several GPUs: --device-map auto)" if value == "auto" else ""
        raise UsageError(f"{option} must be cpu, cuda, cuda:N or mps; got {value!r}{hint}")
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            build = "a CPU-only torch build" if torch.version.cuda is None else "no visible CUDA device"
            raise DepthlensError(f"{option} {value}: {build} (torch {torch.__version__}); use --device cpu")
        idx = int(value.split(":")[1]) if ":" in value else 0
        if idx >= torch.cuda.device_count():
            raise DepthlensError(f"{option} {value}: only {torch.cuda.device_count()} CUDA device(s) visible")
    if value == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise DepthlensError(f"{option} mps: MPS is not available on this machine; use --device cpu")
    return value


def input_path(path: Path | None, option: str) -> Path | None:
    """A regular file or a directory. A FIFO would block for ever and /dev/zero never ends: refused."""
    if path is None:
        return None
    from ..io.files import _kind, path_mode  # one stat before any open, one wording of what a path is

    mode = path_mode(path, lambda why: DepthlensError(f"{option} {path}: {why}"))
    if mode is None:
        raise DepthlensError(f"{option} {path}: no such file or directory")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = _kind(mode)  # bad data, as `prepare` says of the same file: exit 1 (docs/cli.md)
        raise DepthlensError(f"{option} {path}: is {kind}; give a regular file or a directory")
    return path


def in_range(value: Any, option: str, lo: float | None = None, hi: float | None = None) -> None:
    if value is None:
        return
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]" if lo is not None else f"<= {hi}"
        raise UsageError(f"{option} must be {rng}; got {value}")


# option name (the Python parameter) -> check
def check_options(params: dict[str, Any]) -> None:
    """Check every option this module knows, by parameter name; unknown names are left to the command."""
    if isinstance(params.get("device"), str):
        device(params["device"])
    for name in ("data", "recipe_data"):
        if isinstance(params.get(name), Path):
            input_path(params[name], "--" + name.replace("_", "-"))
    if isinstance(params.get("tokenizer"), str):
        tok = params["tokenizer"]
        if tok not in ("bytes", "gpt2") and not (tok.startswith("bpe:") and len(tok) > 4):
            raise UsageError(f"--tokenizer must be bytes, gpt2 or bpe:<dir or tokenizer.json>; got {tok!r}")
    if isinstance(params.get("seed"), int):
        in_range(params["seed"], "--seed", 0, SEED_MAX)
    if isinstance(params.get("n_boot"), int):
        in_range(params["n_boot"], "--n-boot", 0, N_BOOT_MAX)
    if isinstance(params.get("n_seq"), int):
        in_range(params["n_seq"], "--n-seq", 1, INT_OPTION_MAX)  # more than the source holds: capped, with a note
    if isinstance(params.get("threads"), int):
        cpus = os.cpu_count()
        in_range(params["threads"], "--threads", 0, cpus and 4 * cpus or 1024)
    for name in ("tokens", "seq_len", "batch_size", "limit"):
        v = params.get(name)
        if isinstance(v, int) and not isinstance(v, bool):
            in_range(v, "--" + name.replace("_", "-"), 1, INT_OPTION_MAX)


def note_capped(ev: Any, option: str = "--n-seq") -> None:
    """Say on stderr when the eval source held fewer windows than asked for (never a silent cap)."""
    import sys

    meta = getattr(ev, "meta", None) or {}
    asked = meta.get("n_seq_requested")
    if isinstance(asked, int) and asked > ev.n_seq:
        sys.stderr.write(
            f"depthlens: note: {option} {asked} capped to {ev.n_seq}: the eval source holds only "
            f"{meta.get('n_windows_available', ev.n_seq)} sequences of {ev.seq_len} tokens\n"
        )
