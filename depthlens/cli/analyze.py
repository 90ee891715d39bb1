"""Analysis commands: angular, causal, permute, rank, attnres, sweep, compare.

Each prints a headline (with a bootstrap CI where the metric allows one) and a compact terminal view,
and writes the labelled dataset (netCDF) atomically. `--json` prints the headline as JSON instead.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..diagnostics import registry  # stdlib-only: names, aliases and default thresholds for the help texts
from .app import QuietOpt, app, domain_errors, fail, in_default_dir, print_table, rank0_errors

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
    int | None, typer.Option("--seq-len", min=2, help="Tokens per sequence (default: min(128, model max)).")
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
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out file.")]
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
    n_seq: int = 32
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


def check_choice(value: str, choices: tuple[str, ...], name: str) -> str:
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
    if ctx is not None and c.seq_len > ctx:
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

    from ..io.atomic import parents_made

    ds.attrs["command"] = invoked_command() or command or ""
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
        con.print(line, highlight=False)
    if view is not None:
        con.print(view)


def _json(x: Any) -> str:
    """JSON text of a headline (NaN → null, numpy → Python, anything else → its str)."""
    from ..io.jsonsafe import jsonable

    return json.dumps(jsonable(x), indent=2, default=str)


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
    from ..render.plots import terminal_heatmap

    m = da.values
    labels = [str(i) for i in range(m.shape[0])]
    import numpy as np

    hi = vmax if vmax is not None else (float(np.nanmax(m)) if np.isfinite(m).any() else 1.0)
    return terminal_heatmap(m, labels, labels, vmin=0.0, vmax=max(hi, 1e-12))


def _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads=1, device_map=None) -> Common:
    from ..runtime.distributed import device_for_rank

    # under torchrun `--device cuda` is cuda:LOCAL_RANK: one GPU per rank
    return Common(data, tokens, n_seq, seq_len, batch_size, seed, device_for_rank(device), dtype, threads, device_map)


def _study(c: Common, n_boot: int = 1000) -> Any:
    """These options as the API's one options object (`studies.study.StudyOptions`)."""
    from ..studies.study import StudyOptions

    return StudyOptions(
        data=c.data,
        n_seq=c.n_seq,
        seq_len=c.seq_len,
        seed=c.seed,
        device=c.device,
        dtype=c.dtype,
        n_boot=n_boot,
        batch_size=c.batch_size,
        threads=c.threads or None,
        device_map=c.device_map,
        tokens=c.tokens,
    )


def _opts(c: Common) -> dict[str, Any]:
    return {} if c.batch_size is None else {"batch_size": c.batch_size}


# --- commands ------------------------------------------------------------------------------------------


@app.command()
@domain_errors
def angular(
    ckpt: CkptArg,
    positions: Annotated[Literal["last", "all"], typer.Option(help="last | all (BOS excluded)")] = "last",
    repr: Annotated[
        Literal["view", "flatten", "input"], typer.Option("--repr", help="view | flatten (HC/mHC) | input (AttnRes)")
    ] = "view",
    data: DataOpt = None,
    tokens: TokensOpt = None,
    n_seq: NSeqOpt = 32,
    seq_len: SeqLenOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    device_map: DeviceMapOpt = None,
    threads: ThreadsOpt = 1,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Angular distance D_n(l) between residual states (Gromov et al. 2024)."""
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "angular", overwrite)
    model, ck = open_model(ckpt, c)
    with busy(f"angular {ckpt.name}") as p:
        ds = registry.run(
            "angular",
            model,
            eval_data(model, ck, c),
            positions=positions,
            repr=repr,
            checkpoint=ck,
            progress=p.engine(),
            **_opts(c),
        )
    write(ds, path, ow)
    import numpy as np

    prof = ds["profile"].values
    prof = prof[np.isfinite(prof)]  # D_1(l) exists for l = 0..L-1
    head = {
        "metric": "angular",
        "positions": positions,
        "repr": repr,
        "profile": [float(x) for x in prof],
        "most_prunable_block": int(np.argmin(prof)) if len(prof) else None,
        "out": str(path),
    }
    lines = [
        f"[bold]{ckpt}[/bold] angular distance d(h_l, h_l+1), positions={positions}, repr={repr}:",
        "  " + " ".join(f"{x:.3f}" for x in prof),
        f"dataset: {path}",
    ]
    emit(head, as_json, lines, _matrix_view(ds["angular_distance"], 1.0))


@app.command()
@rank0_errors
@domain_errors
def causal(
    ckpt: CkptArg,
    threshold: Annotated[
        float, typer.Option(help="Headline threshold θ (share of late pairs with C > θ).")
    ] = registry.CAUSAL.theta,
    variant: Annotated[Literal["current", "future"], typer.Option(help="current | future")] = "current",
    agg: Annotated[
        Literal["max", "mean", "p95", "p99", "pooled"], typer.Option("--agg", help="max | mean | p95 | p99 | pooled")
    ] = "max",
    unit: Annotated[Literal["block", "attn", "mlp"], typer.Option(help="block | attn | mlp")] = "block",
    norm: Annotated[
        Literal["update", "resid"],
        typer.Option(
            "--norm", help="Ratio denominator: update (|u_t|, Csordás) | resid (|h_t|, the residual stream entering t)"
        ),
    ] = "update",
    layers: Annotated[Literal["all", "late"], typer.Option(help="Skipped layers: all | late")] = "all",
    direct: Annotated[bool, typer.Option("--direct", help="Also compute the direct-effect companion C_dir.")] = False,
    outputs: Annotated[
        bool,
        typer.Option(
            "--outputs",
            help="Also compute the output effect O[s] and the layer-skip loss ΔL_skip(s) (one LM-head pass per skipped layer).",
        ),
    ] = False,
    window: Annotated[
        Literal["quarter", "half", "zero"], typer.Option(help="Late-window start: quarter | half | zero")
    ] = "quarter",
    data: DataOpt = None,
    tokens: TokensOpt = None,
    n_seq: NSeqOpt = 32,
    seq_len: SeqLenOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    device_map: DeviceMapOpt = None,
    threads: ThreadsOpt = 1,
    n_boot: BootOpt = 1000,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Causal score C(s, t): skip layer s, how much do later layers' updates change (Csordás et al. 2025)."""
    check_threshold(threshold)
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "causal", overwrite)
    from ..diagnostics.sweep import headline, interval_attrs, score_matrix

    model, ck = open_model(ckpt, c)
    variants = ("current", "future") if variant == "future" else ("current",)
    with busy(f"causal {ckpt.name} (layer skips)") as p:
        ds = registry.run(
            "causal",
            model,
            eval_data(model, ck, c),
            variants=variants,
            layers=layers,
            unit=unit,
            norm=norm,
            direct=direct,
            outputs=outputs,
            checkpoint=ck,
            progress=p.engine(),
            **_opts(c),
        )
    h = headline(ds, "causal", threshold, aggregator=agg, variant=variant, start=window, n_boot=n_boot, seed=seed)
    ds.attrs.update(interval_attrs(h))
    write(ds, path, ow)
    h.update(checkpoint=str(ckpt), design=getattr(model.design, "slug", "?"), n_layer=int(model.n_layer), out=str(path))
    lines = [
        f"[bold]{ckpt}[/bold] ({h['design']}, L={h['n_layer']}): {h['definition']}, unit={unit}",
        f"share C > {threshold}: {_fmt_share(h)}",
        f"noise floor (null intervention): {h.get('noise_floor', float('nan')):.2e}",
        *_skip_loss_lines(ds),
        f"dataset: {path}",
        "rows: skipped layer s, columns: later layer t",
    ]
    from ..render.plots import upper_triangle

    # t < s is undefined (stored as 0): "·" in the view, not the shade of "no effect"
    emit(h, as_json, lines, _matrix_view(upper_triangle(score_matrix(ds, "causal", agg, variant)), 1.0))


def _skip_loss_lines(ds) -> list[str]:
    """With --outputs: the layer whose skip costs most, in loss and in output distribution."""
    if "skip_delta_loss" not in ds:
        return []
    import numpy as np

    dl, o = ds.skip_delta_loss.values, ds.output_effect.sel(variant="current").values
    s, so = int(np.nanargmax(dl)), int(np.nanargmax(o))
    return [
        f"layer-skip loss ΔL_skip: max {dl[s]:.3f} nats at layer {s}, mean {np.nanmean(dl):.3f}; "
        f"output effect O: max {o[so]:.3f} at layer {so}"
    ]


@app.command()
@rank0_errors
@domain_errors
def permute(
    ckpt: CkptArg,
    threshold: Annotated[float, typer.Option(help="Headline threshold θ (nats for abs).")] = registry.PERM_ABS.theta,
    norm: Annotated[Literal["abs", "rel", "kl"], typer.Option(help="abs (nats) | rel | kl")] = "abs",
    swap: Annotated[Literal["body", "all"], typer.Option(help="body (routing stays) | all")] = "body",
    pairs: Annotated[Literal["late", "all"], typer.Option(help="late | all")] = "late",
    window: Annotated[
        Literal["quarter", "half", "zero"], typer.Option(help="Late-window start: quarter | half | zero")
    ] = "quarter",
    data: DataOpt = None,
    tokens: TokensOpt = None,
    n_seq: NSeqOpt = 32,
    seq_len: SeqLenOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    device_map: DeviceMapOpt = None,
    threads: ThreadsOpt = 1,
    n_boot: BootOpt = 1000,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Permutation score P(i, j): swap layers i and j, how much does the LM loss rise."""
    check_threshold(threshold)
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "permutation", overwrite)
    from ..diagnostics.sweep import headline, interval_attrs, score_matrix

    model, ck = open_model(ckpt, c)
    with busy(f"permute {ckpt.name} (layer pairs)") as p:
        ds = registry.run(
            "permutation",
            model,
            eval_data(model, ck, c),
            pairs=pairs,
            swap=swap,
            checkpoint=ck,
            progress=p.engine(),
            **_opts(c),
        )
    metric = f"perm_{norm}"
    h = headline(ds, metric, threshold, start=window, n_boot=n_boot, seed=seed)
    ds.attrs.update(interval_attrs(h))
    write(ds, path, ow)
    h.update(checkpoint=str(ckpt), design=getattr(model.design, "slug", "?"), n_layer=int(model.n_layer), out=str(path))
    lines = [
        f"[bold]{ckpt}[/bold] ({h['design']}, L={h['n_layer']}): {h['definition']}",
        f"clean loss {h.get('clean_loss', float('nan')):.4f} nats; share P > {threshold}: {_fmt_share(h)}",
        f"dataset: {path}",
    ]
    emit(h, as_json, lines, _matrix_view(score_matrix(ds, metric, None, None)))


@app.command()
@domain_errors
def rank(
    ckpt: CkptArg,
    data: DataOpt = None,
    tokens: TokensOpt = None,
    n_seq: NSeqOpt = 32,
    seq_len: SeqLenOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    device_map: DeviceMapOpt = None,
    threads: ThreadsOpt = 1,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Effective rank of HC/mHC residual-mixing products, with Amax gains (per token, then averaged)."""
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "rank", overwrite)
    model, ck = open_model(ckpt, c)
    with busy(f"rank {ckpt.name} (batches)") as p:
        ds = registry.run("rank", model, eval_data(model, ck, c), checkpoint=ck, progress=p.engine(), **_opts(c))
    write(ds, path, ow)
    er = ds["erank"]
    stat = "mean" if "statistic" in er.dims and "mean" in er["statistic"].values else None
    h: dict[str, Any] = {
        "metric": "erank",
        "checkpoint": str(ckpt),
        "design": getattr(model.design, "slug", "?"),
        "n_layer": int(model.n_layer),
        "out": str(path),
    }
    lines = [f"[bold]{ckpt}[/bold] ({h['design']}, L={h['n_layer']}): effective rank of residual-mixing products"]
    for p in er["product"].values:
        sel = {"product": p, **({"statistic": stat} if stat else {})}
        v = float(er.sel(sel))
        gf = float(ds["gain_fwd"].sel(sel)) if "gain_fwd" in ds else float("nan")
        gb = float(ds["gain_bwd"].sel(sel)) if "gain_bwd" in ds else float("nan")
        h[f"erank_{p}"], h[f"gain_fwd_{p}"], h[f"gain_bwd_{p}"] = v, gf, gb
        lines.append(f"  {p:>12}: erank {v:.3f}   Amax gain fwd {gf:.3g} / bwd {gb:.3g}")
    if "structural_zero_grad" in ds:
        frozen = [int(j) for j in ds["sublayer"].values[ds["structural_zero_grad"].values.astype(bool)]]
        h["structural_zero_grad_sublayers"] = frozen
        if frozen:
            lines.append(
                f"  maps that cannot receive gradient (stay at their init): sublayers {frozen}; "
                "'interior' leaves out the first and last"
            )
    from ..designs import has_capability

    init = (
        getattr(model.config, "mhc_init", None)
        if has_capability(getattr(model.design, "slug", ""), "stochastic_maps")
        else None
    )
    if init is not None:
        h["mhc_init"] = init
        lines.append(
            f"  mHC init: {init}"
            + (" (H_res = J/n at init: products are rank 1 by construction)" if init == "zero" else "")
        )
    lines.append(f"dataset: {path}")
    emit(h, as_json, lines)


@app.command()
@domain_errors
def attnres(
    ckpt: CkptArg,
    eps: Annotated[float, typer.Option(help="Dead-prefix threshold ε on the self-weight.")] = 0.05,
    data: DataOpt = None,
    tokens: TokensOpt = None,
    n_seq: NSeqOpt = 32,
    seq_len: SeqLenOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    device_map: DeviceMapOpt = None,
    threads: ThreadsOpt = 1,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """AttnRes depth-attention weights: self-weight per layer, dead prefix k*(ε), embedding weight."""
    check_threshold(eps, "--eps")
    if eps > 1:
        fail(f"--eps must be <= 1 (a softmax weight), got {eps}", 2)
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "attnres", overwrite)
    from ..diagnostics.attnres import EPS_GRID

    model, ck = open_model(ckpt, c)
    grid = tuple(sorted(set(EPS_GRID) | {eps}))
    with busy(f"attnres {ckpt.name} (batches)") as p:
        ds = registry.run(
            "attnres", model, eval_data(model, ck, c), eps_grid=grid, checkpoint=ck, progress=p.engine(), **_opts(c)
        )
    write(ds, path, ow)
    sw = [float(x) for x in ds["self_weight"].values]
    k = int(ds["dead_prefix"].sel(eps=eps))
    by_eps = {f"{float(e):g}": int(ds["dead_prefix"].sel(eps=e)) for e in ds["eps"].values}
    h = {
        "metric": "attnres",
        "checkpoint": str(ckpt),
        "design": getattr(model.design, "slug", "?"),
        "n_layer": int(model.n_layer),
        "eps": eps,
        "dead_prefix": k,
        "dead_prefix_by_eps": by_eps,
        "self_weight": sw,
        "out": str(path),
    }
    if getattr(model.config, "arch", None) == "block_attnres":  # the only design with a block schedule
        h["block_starts"] = list(model.config.block_starts)
    lines = [
        f"[bold]{ckpt}[/bold] ({h['design']}, L={h['n_layer']}): AttnRes self-weight per layer",
        "  " + " ".join("  nan" if math.isnan(x) else f"{x:.3f}" for x in sw),
        f"dead prefix k*({eps}) = {k} layer(s)",
        "  k*(ε) over the grid: " + ", ".join(f"ε={e}: {v}" for e, v in by_eps.items()),
    ]
    if "block_starts" in h:
        lines.append(f"  block starts: {h['block_starts']}")
    lines.append(f"dataset: {path}")
    emit(h, as_json, lines)


GRID_MAX = 10_000  # threshold grid points: share(θ) curves are smooth far below this


def parse_grid(text: str) -> list[float]:
    """'0:1.5:0.05' (start:stop:step, inclusive) or '0.1,0.2,0.5'."""
    import numpy as np

    try:
        if ":" in text:
            a, b, s = (float(x) for x in text.split(":"))
            if not (s > 0 and b >= a and math.isfinite(a) and math.isfinite(b)):
                raise ValueError
            n = (b - a) / s + 1  # sized before allocating: 10^7 points would write 1.3 GB; inf for a 1e-320 step
            if not math.isfinite(n) or n > GRID_MAX:
                many = f"{int(n):,}" if n < 1e15 else "too many"
                fail(f"--thresholds {text}: {many} points; at most {GRID_MAX:,}", 2)
            vals = [round(float(v), 10) for v in np.arange(a, b + s / 2, s)]  # Python's round: no overflow at 1e308
        else:
            vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--thresholds: expected start:stop:step or a comma list, got {text!r}", 2)
        raise
    if len(vals) > GRID_MAX:
        fail(f"--thresholds: {len(vals):,} points; at most {GRID_MAX:,}", 2)
    for v in vals:
        check_threshold(v, "--thresholds")
    if not vals:
        fail("--thresholds is empty", 2)
    return vals


METRIC_CHOICES = (
    registry.SWEEPABLE
)  # shipped: causal, perm_abs, perm_rel, perm_kl (registry.sweepable() adds registered)


@app.command()
@domain_errors
def sweep(
    ckpts: CkptsArg,
    metric: Annotated[str, typer.Option(help="causal | perm_abs | perm_rel | perm_kl")] = "causal",
    thresholds: Annotated[
        str | None, typer.Option(help="θ grid, start:stop:step or comma list (default per metric).")
    ] = None,
    headline_threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold", help=f"Headline θ to mark (default {registry.CAUSAL.theta:g} / {registry.PERM_ABS.theta:g})."
        ),
    ] = None,
    order: Annotated[
        str | None, typer.Option(help="Expected ranking, comma-separated checkpoint names (low to high).")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the share(θ) curves plot here (PNG).")] = None,
    data: DataOpt = None,
    tokens: TokensOpt = None,
    n_seq: NSeqOpt = 32,
    seq_len: SeqLenOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    device_map: DeviceMapOpt = None,
    threads: ThreadsOpt = 1,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Threshold-sensitivity sweep: share(θ) curves per checkpoint, crossing points, ranking robustness."""
    from ..studies.api import check_scores

    check_scores([metric], "--metric")
    grid = parse_grid(thresholds) if thresholds else None
    if headline_threshold is not None:
        check_threshold(headline_threshold)
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, Path("sweep"), metric, overwrite)
    if plot is not None:  # checked now, so a bad --plot cannot fail after the dataset was written
        from ..io.atomic import check_target, distinct_outputs

        distinct_outputs({"--out": path, "--plot": plot})  # one path for both: the plot would replace the dataset
        if plot.suffix.lower() not in (".png", ".pdf", ".svg"):
            fail(f"--plot {plot}: use a .png, .pdf or .svg file name", 2)
        if plot.parent.exists() or not in_default_dir(plot):
            check_target(plot, overwrite, kinds=("figure",))
    names = [p.resolve().name for p in ckpts]
    if len(set(names)) != len(names):
        fail("checkpoint names must be distinct", 2)
    rank_order = [s.strip() for s in order.split(",")] if order else None
    if rank_order is not None and sorted(rank_order) != sorted(names):
        fail(f"--order must list each checkpoint name once ({', '.join(names)}); got {order!r}", 2)
    from ..studies import api

    with busy(f"sweep of {metric} over {len(ckpts)} checkpoint(s)"):
        res = api.sweep(ckpts, metric, grid, theta=headline_threshold, order=rank_order, opts=_study(c))
    ds, headline_curves, sel, theta, rob = (
        res["dataset"],
        res["curves"],
        res["selection"],
        res["theta"],
        res["robustness"],
    )
    write(ds, path, ow)
    if plot is not None:
        from ..render.plots import save_figure
        from ..render.plots import share_curves as draw

        plot.parent.mkdir(parents=True, exist_ok=True)  # only the default folder can be missing here
        save_figure(draw(headline_curves, headline=theta), plot)
    from ..diagnostics.sweep import definition

    defn = definition(
        metric,
        variant=sel.get("variant"),
        aggregator=sel.get("aggregator"),
        swap="body" if metric != "causal" else None,
    )
    h: dict[str, Any] = {
        "metric": metric,
        "definition": defn,
        "headline_threshold": theta,
        "checkpoints": names,
        "out": str(path),
        "plot": str(plot) if plot else None,
    }
    if rob is not None:
        h["ranking_order"] = rank_order
        h["ranking_fraction"] = float(rob["fraction"])
    lines = [f"share(θ) for {defn} over {len(ds['threshold'])} thresholds, {len(names)} checkpoint(s)"]
    if "crossing" in ds:
        lines.append("crossing points θ_q (share falls to q):")
        cr = ds["crossing"]
        cr = cr.sel({k: v for k, v in sel.items() if k in cr.dims})
        for name in names:
            row = cr.sel(checkpoint=name)
            lines.append(
                f"  {name:>20}: "
                + "  ".join(f"q={float(q):g}: {float(v):.3g}" for q, v in zip(row["q"].values, row.values))
            )
            h.setdefault("crossings", {})[name] = {str(float(q)): float(v) for q, v in zip(row["q"].values, row.values)}
    if rob is not None:
        lines.append(f"ranking {' < '.join(rank_order)} holds on {100 * float(rob['fraction']):.0f}% of the θ grid")
    elif len(names) > 1:
        lines.append("ranking robustness: give the expected order with --order a,b,... (low to high)")
    lines.append(f"dataset: {path}" + (f"; plot: {plot}" if plot else ""))
    emit(h, as_json, lines)


def busy(what: str):
    """Progress of a single-checkpoint computation (`feedback.Progress`; its `engine()` is the engine's callback):
    fine-grained engine steps, so plain lines at most every 10 s."""
    from .feedback import Progress

    return Progress(what, None, every=10.0)


@app.command()
@domain_errors
def compare(
    ckpts: CkptsArg,
    metrics: Annotated[
        str, typer.Option(help="Comma list of causal, perm_abs, perm_rel, perm_kl.")
    ] = "causal,perm_abs",
    data: DataOpt = None,
    tokens: TokensOpt = None,
    n_seq: NSeqOpt = 32,
    seq_len: SeqLenOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    device_map: DeviceMapOpt = None,
    threads: ThreadsOpt = 1,
    n_boot: BootOpt = 1000,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Headline shares (with CIs) side by side for several checkpoints on identical eval data."""
    from ..studies import api

    wanted = api.check_scores(metrics)
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    with busy(f"headline shares of {len(ckpts)} checkpoint(s)"):
        rows = api.headline_shares(ckpts, wanted, opts=_study(c, n_boot))
    if as_json:
        typer.echo(_json(rows))
        return
    from rich.table import Table

    defs = "; ".join(dict.fromkeys(r[m]["definition"] for r in rows for m in wanted))
    methods = "; ".join(
        dict.fromkeys(
            f"{m}: {r[m]['ci_method']} over {r[m]['ci_unit']}" for r in rows for m in wanted if r[m].get("ci_method")
        )
    )
    t = Table(title="headline shares over the late window (95% interval)", caption=f"{defs}\n{methods}")
    for col in ("checkpoint", "design", "L", *wanted):
        t.add_column(col)
    for r in rows:
        cells = []
        for m in wanted:
            h = r[m]
            ci = "" if math.isnan(h["ci_low"]) else f" [{100 * h['ci_low']:.0f}, {100 * h['ci_high']:.0f}]"
            size = (
                f" at m = {h['subsample_m']} seqs; all {h['n_sequences']}: {100 * h['share_full']:.1f}%"
                if h.get("subsample_m") is not None
                else ""
            )
            cells.append(f"{100 * h['share']:.1f}%{ci} (> {h['threshold']}){size}")
        t.add_row(r["checkpoint"], r["design"], str(r["n_layer"]), *cells)
    print_table(t)
