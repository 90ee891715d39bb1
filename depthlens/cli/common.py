"""What every analysis command shares: the typer option types (`CkptArg`, `DataOpt`, `OutOpt`, ...), the eval
settings they collect (`Common`), and the steps around an engine run: open the checkpoint (`open_model`), draw
the eval tokens (`eval_data`), check and write the output (`resolve_out`, `write`), print the headline (`emit`)
and show progress (`busy`). The commands are built in `diagnostic.py` from the specs (one checkpoint; `analyze.py` registers them) and in `compare.py` (several).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..diagnostics import registry  # stdlib-only: names, aliases and default thresholds for the help texts
from ..runtime.defaults import DEFAULT_N_BOOT, DEFAULT_N_SEQ, DEFAULT_SEQ_LEN
from .app import fail, in_default_dir

if TYPE_CHECKING:  # typing only: feedback (rich) is imported where a command shows progress
    from .feedback import Progress

# --- shared options ------------------------------------------------------------------------------------
CkptArg = Annotated[
    Path, typer.Argument(help="Checkpoint: depthlens or Hugging Face directory, or a GGUF file.", show_default=False)
]
CkptsArg = Annotated[
    list[Path], typer.Argument(help="Checkpoints (depthlens/Hugging Face directories, GGUF files).", show_default=False)
]
DataOpt = Annotated[
    Path | None, typer.Option("--data", help="Eval text/JSONL file or shard dir (default: held-out offline corpus).")
]
TokensOpt = Annotated[
    int | None, typer.Option("--tokens", min=2, help="Eval token budget (sets --n-seq = tokens // seq-len).")
]
NSeqOpt = Annotated[int, typer.Option("--n-seq", min=1, help="Eval sequences.")]
SeqLenOpt = Annotated[
    int | None,
    typer.Option("--seq-len", min=2, help=f"Tokens per sequence (default: min({DEFAULT_SEQ_LEN}, model max))."),
]
BatchOpt = Annotated[int | None, typer.Option("--batch-size", min=1, help="Max rows per forward (memory knob).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Eval-data and bootstrap seed.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda | cuda:N")]
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype", help="fp32 | bf16 | fp64 (weights and activations; norms, losses and sums stay fp32/fp64)."
    ),
]
DeviceMapOpt = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        help="HF/GGUF models over several GPUs: auto (balanced by parameters over the visible GPUs) or a JSON map {embed, layers, head} (inline or a .json file); replaces --device.",
    ),
]
OutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        help="Write the dataset here (netCDF); DIR/ (trailing slash) "
        "writes the default name into DIR. Default: depthlens-out/<ckpt>.<metric>.nc",
    ),
]
OverwriteOpt = Annotated[
    bool,
    typer.Option(
        "--overwrite", help="Replace an existing --out file (output of depthlens in depthlens-out/ is replaced anyway)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the headline as JSON.")]
BootOpt = Annotated[int, typer.Option("--n-boot", min=0, help="Bootstrap resamples over sequences (0 = no CI).")]
ThreadsOpt = Annotated[
    int, typer.Option("--threads", min=0, help="torch CPU threads (1 is fastest for small models; 0 = torch default).")
]
DTYPES = registry.DTYPES


@dataclass
class Common:
    data: Path | None = None
    tokens: int | None = None
    n_seq: int = DEFAULT_N_SEQ
    seq_len: int | None = None
    batch_size: int | None = None
    seed: int = 0
    device: str = "cpu"
    dtype: str = "fp32"
    threads: int = 1
    device_map: str | None = None  # --device-map: "auto" or a JSON {embed, layers, head} (HF/GGUF models)


def check_threshold(value: float, name: str = "--threshold") -> float:
    if value is None or math.isnan(value) or math.isinf(value) or value < 0:
        fail(f"{name} must be a finite number >= 0, got {value}", 2)
    return value


def check_choice(value: str, choices: Collection[str], name: str) -> str:
    if value not in choices:
        fail(f"{name} must be one of {', '.join(choices)}; got {value!r}", 2)
    return value


def open_model(ckpt: Path, c: Common) -> tuple[Any, Path]:
    """The API's one loader (`api.load_model`: depthlens checkpoint, Hugging Face directory or GGUF file, with
    --device-map) on the requested device and dtype."""
    import torch

    if c.threads:
        torch.set_num_threads(c.threads)  # a busy second core slows a default 2-thread run many times
    check_choice(c.dtype, tuple(DTYPES), "--dtype")
    from ..adapters.load import declared_context
    from ..studies.api import load_model
    from .feedback import spinner

    ctx = declared_context(ckpt) if c.seq_len else None  # from the header: refused before a minute-long load
    if ctx is not None and c.seq_len is not None and c.seq_len > ctx:  # ctx is None when seq_len is unset
        from ..errors import DataError

        raise DataError(f"--seq-len {c.seq_len} exceeds the {ctx} tokens of context {ckpt} declares")
    with spinner(f"loading {Path(ckpt).name}") as p:  # the device map is checked against this machine first
        model, _ = load_model(
            ckpt, device=c.device, dtype=registry.load_dtype(c.dtype), device_map=c.device_map, progress=p.engine()
        )
    params = getattr(model, "parameters", None)
    if callable(params) and not any(bool(p.detach().any()) for p in params()):
        from ..errors import DepthlensError

        raise DepthlensError(
            f"{ckpt}: every weight is zero, so every layer's output is zero and every depth score "
            "would be 0/0; nothing to measure (an untrained or wiped checkpoint?)"
        )
    return model, ckpt


def eval_data(model: Any, ckpt: Path | None, c: Common) -> Any:
    """The API's eval data for these options (`api.eval_data_for`), with a note on stderr when it was capped."""
    from ..studies.api import eval_data_for
    from .validate import note_capped

    ev = eval_data_for(model, c.data, ckpt, n_seq=c.n_seq, seq_len=c.seq_len, seed=c.seed, tokens=c.tokens)
    note_capped(ev, "--tokens" if c.tokens else "--n-seq")
    return ev


def resolve_out(out: str | Path | None, ckpt: Path, metric: str, overwrite: bool) -> tuple[Path, bool]:
    """The netCDF path (default depthlens-out/<ckpt>.<metric>.nc, its name shortened with a hash when the filesystem would
    not hold it; `-o DIR/`: that name inside DIR, created if new), checked before any work: an existing file is
    replaced only with --overwrite and only when it is a depthlens netCDF dataset; the directory must take files."""
    from ..errors import DepthlensError
    from ..io.atomic import check_name, check_target, fit_name, name_max
    from .app import DEFAULT_OUT_DIR

    raw = None if out is None else os.fspath(out)
    into = Path(raw) if raw is not None and raw.endswith(("/", os.sep)) else None  # a trailing slash: a directory
    if into is not None and into.exists() and not into.is_dir():
        raise DepthlensError(f"{raw}: exists and is not a directory (a trailing slash names a directory to write into)")
    if raw is None or into is not None:
        suffix = f".{metric}.nc"
        where = into if into is not None else DEFAULT_OUT_DIR  # one git-ignored folder, not the working directory
        room = name_max(where) - len(os.fsencode(suffix))
        path = where / (fit_name(ckpt.resolve().name, room) + suffix)
    else:
        path = Path(raw)
    check_name(path)  # before any stat: a name over the limit makes os.stat itself fail
    if path.is_dir():
        raise DepthlensError(f"{path}: is a directory (end it with / to write {metric} output inside it)")
    if into is None and not path.parent.exists() and not in_default_dir(path):  # the default folder: made on write
        raise DepthlensError(f"{path.parent}: output directory does not exist")
    check_target(path, overwrite, kinds=("netCDF dataset",), make_parents=into is not None or in_default_dir(path))
    return path, overwrite


def write(ds: Any, path: Path, overwrite: bool, command: str | None = None) -> None:
    """Write `ds` (rank 0 only). Its `command` attr is the command line as given (every option the user set),
    `command` only outside a CLI invocation."""
    from ..io.dataset import write_netcdf
    from ..runtime.distributed import is_main
    from .app import invoked_command

    if not is_main():  # under torchrun only rank 0 writes the merged dataset
        return

    from .._version import __version__
    from ..io.atomic import parents_made

    ds.attrs["command"] = invoked_command() or command or ""
    # what makes the file recognisably ours (io.ownership.recognise), so a re-run may replace it: a sweep's curves
    # are built by concat, not make_dataset, and had no `source`, so its re-run into depthlens-out/ was refused
    ds.attrs.setdefault("source", f"depthlens {__version__}")
    with parents_made(path):  # `-o NEWDIR/`: created now, removed again if the write fails
        write_netcdf(ds, path, overwrite=overwrite)


def emit(headline: dict[str, Any], as_json: bool, text_lines: list[str], view: Any = None) -> None:
    from ..runtime.distributed import is_main

    if not is_main():  # under torchrun only rank 0 prints
        return
    if as_json:
        typer.echo(_json(headline))
        return
    from rich.console import Console

    con = Console()
    for line in text_lines:
        con.print(line, highlight=False, soft_wrap=True)  # one line in a log or pipe, not wrapped at 80 columns
    if view is not None:
        con.print(view, soft_wrap=True)


def _json(x: Any) -> str:
    """JSON text of a headline (NaN → null, numpy → Python, anything else → its str)."""
    from ..io.jsonsafe import jsonable

    return json.dumps(jsonable(x), indent=2, default=str)


VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="Also the definition, the share at all sequences, shard spread, noise floor, method."
    ),
]


def short_method(h: dict[str, Any]) -> str:
    """The interval's method in a few words: '95% CI, jackknife over 32 eval sequences at m = 16'."""
    if h.get("ci_method") is None or math.isnan(h.get("ci_low", float("nan"))):
        return "no interval"
    how = "jackknife" if "jackknife" in str(h["ci_method"]) else "bootstrap"
    n, unit = h.get("ci_n_units") or h.get("n_sequences"), h.get("ci_unit") or "eval sequences"
    at = f" at m = {h['subsample_m']}" if h.get("subsample_m") is not None else ""
    return f"{100 * h.get('level', 0.95):.0f}% CI, {how} over {n} {unit}{at}"


def headline_line(h: dict[str, Any], symbol: str, name: str) -> str:
    """The one default line: the share with its interval and its method in a few words.
    'hc_l32: 36.2% [32.5, 40.0] of 276 late pairs have C > θ (95% CI, jackknife over 32 eval sequences at m = 16)'"""
    ci = "" if math.isnan(h.get("ci_low", float("nan"))) else f" [{100 * h['ci_low']:.1f}, {100 * h['ci_high']:.1f}]"
    return (
        f"[bold]{name}[/bold]: {100 * h['share']:.1f}%{ci} of {h['n_pairs']} late pairs have {symbol} > "
        f"{h['threshold']:g} ({short_method(h)})"
    )


def _fmt_share(h: dict[str, Any]) -> str:
    """'70.0% [64.6%, 74.9%] 95% (method; unit) ...': the interval always qualifies the number before it."""
    ci = ""
    if not math.isnan(h.get("ci_low", float("nan"))):
        ci = (
            f" [{100 * h['ci_low']:.1f}%, {100 * h['ci_high']:.1f}%] 95% ({h.get('ci_method')}; resampling "
            f"{h.get('ci_unit')})"
        )
    full = ""
    if h.get("subsample_m") is not None:
        rising = "; still rising with the eval set" if h.get("still_rising") else ""
        full = f"; at all {h['n_sequences']} sequences {100 * h['share_full']:.1f}% (max: no interval{rising})"
    shards = (
        ""
        if h.get("shard_mean") is None
        else f"; 5 disjoint eval shards: {100 * h['shard_mean']:.1f}% ± {100 * h['shard_sd']:.1f}%"
    )
    size = f"at m = {h['subsample_m']} sequences " if h.get("subsample_m") is not None else ""
    return (
        f"{size}{100 * h['share']:.1f}%{ci}  of {h['n_pairs']} late pairs (layers >= {h['window_start']}){full}{shards}"
    )


def _matrix_view(da: Any, vmax: float | None = None) -> Any:
    from ..plotting.plots import terminal_heatmap

    m = da.values
    labels = [str(i) for i in range(m.shape[0])]
    import numpy as np

    hi = vmax if vmax is not None else (float(np.nanmax(m)) if np.isfinite(m).any() else 1.0)
    return terminal_heatmap(m, labels, labels, vmin=0.0, vmax=max(hi, 1e-12), legend=True)


PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Also draw the matrix as a figure here (.png, .pdf or .svg).")
]


def check_plot(plot: Path | None, out: Path, overwrite: bool) -> None:
    """Refuse a bad --plot before any work: a format we cannot write, the same path as --out, or a file that may not
    be replaced (as --out: depthlens's own figure in depthlens-out/ is replaced on a re-run)."""
    if plot is None:
        return
    from ..io.atomic import check_target, distinct_outputs

    distinct_outputs({"--out": out, "--plot": plot})  # one path for both: the plot would replace the dataset
    if plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        fail(f"--plot {plot}: use a .png, .pdf or .svg file name", 2)
    if plot.parent.exists() or not in_default_dir(plot):
        check_target(plot, overwrite, kinds=("figure",))


def save_plot(plot: Path | None, draw: Any) -> None:
    """`draw()` (an Axes or Figure) saved atomically at --plot (its folder made when it is the default one)."""
    if plot is None:
        return
    from ..plotting.plots import save_figure

    plot.parent.mkdir(parents=True, exist_ok=True)  # only the default folder can be missing here (check_plot)
    save_figure(draw(), plot)


def _common(
    data: Path | None,
    tokens: int | None,
    n_seq: int,
    seq_len: int | None,
    batch_size: int | None,
    seed: int,
    device: str,
    dtype: str,
    device_map: str | None = None,
    threads: int = 1,
) -> Common:
    from ..runtime.distributed import device_for_rank

    # under torchrun `--device cuda` is cuda:LOCAL_RANK: one GPU per rank
    return Common(data, tokens, n_seq, seq_len, batch_size, seed, device_for_rank(device), dtype, threads, device_map)


EVAL_DEFAULTS = Common()  # a command's `c` before `eval_options` replaces it with the options it declares
# the eval options every analysis command takes, in their help order: (name, annotation, default)
EVAL_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("data", DataOpt, None),
    ("tokens", TokensOpt, None),
    ("n_seq", NSeqOpt, DEFAULT_N_SEQ),
    ("seq_len", SeqLenOpt, None),
    ("batch_size", BatchOpt, None),
    ("seed", SeedOpt, 0),
    ("device", DeviceOpt, "cpu"),
    ("dtype", DtypeOpt, "fp32"),
    ("device_map", DeviceMapOpt, None),
    ("threads", ThreadsOpt, 1),
)


def eval_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command's `c: Common` parameter becomes the shared eval options (`EVAL_OPTIONS`: --data .. --threads), in
    its place in the signature, so `--help` lists them where the command put `c`; the command receives them as
    one `Common`. Written once here instead of ten declarations in every command."""
    return _with_options(fn, EVAL_OPTIONS)


def some_eval_options(*names: str, **defaults: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`eval_options` for a command that takes only the options `names` (in `EVAL_OPTIONS` order), with its own
    `defaults` where they differ (plan and prune: --n-seq 16); the options it does not take are
    `EVAL_DEFAULTS`' (tokens and batch size unset, cpu, fp32, no device map)."""
    chosen = tuple((name, ann, defaults.get(name, default)) for name, ann, default in EVAL_OPTIONS if name in names)
    assert [name for name, _, _ in chosen] == list(names) and set(defaults) <= set(names), (names, defaults)
    return lambda fn: _with_options(fn, chosen)


def _with_options(fn: Callable[..., Any], options: tuple[tuple[str, Any, Any], ...]) -> Callable[..., Any]:
    hints = typing.get_type_hints(fn, include_extras=True)  # the module's names are defined by now
    sig = inspect.signature(fn)
    names = [name for name, _, _ in options]
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        if p.name == "c":
            params += [
                inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=ann)
                for name, ann, default in options
            ]
        else:
            params.append(p.replace(annotation=hints.get(p.name, p.annotation)))
    assert len(params) == len(sig.parameters) + len(names) - 1, f"{fn.__name__} has no `c: Common` parameter"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c = _common(**{**dataclasses.asdict(EVAL_DEFAULTS), **{name: kwargs.pop(name) for name in names}})
        return fn(*args, c=c, **kwargs)

    wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=hints.get("return", sig.return_annotation)
    )
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": hints.get("return", None)}
    return wrapper


def _study(c: Common, n_boot: int = DEFAULT_N_BOOT) -> Any:
    """These options as the API's one options object (`studies.study.StudyOptions`): each of them is the
    StudyOptions field of its name (--threads 0, torch's default, is its None)."""
    from ..studies.study import StudyOptions

    return StudyOptions(**{**dataclasses.asdict(c), "threads": c.threads or None}, n_boot=n_boot)


def _opts(c: Common) -> dict[str, Any]:
    return {} if c.batch_size is None else {"batch_size": c.batch_size}


def busy(what: str) -> Progress:
    """Progress of a single-checkpoint computation (`feedback.Progress`; its `engine()` is the engine's callback):
    fine-grained engine steps, so plain lines at most every 10 s."""
    from .feedback import Progress

    return Progress(what, None, every=10.0)
