"""Analysis commands: angular, causal, permute, rank, attnres, sweep, compare.

Each prints a headline (with a bootstrap CI where the metric allows one) and a compact terminal view,
and writes the labelled dataset (netCDF) atomically. `--json` prints the headline as JSON instead.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ..analysis import registry  # stdlib-only: names, aliases and default thresholds for the help texts
from .app import app, domain_errors, fail, rank0_errors

# --- shared options ------------------------------------------------------------------------------------
CkptArg = Annotated[Path, typer.Argument(help="Checkpoint: depthlens or Hugging Face directory, or a GGUF file.", show_default=False)]
CkptsArg = Annotated[list[Path], typer.Argument(help="Checkpoints (depthlens/Hugging Face directories, GGUF files).", show_default=False)]
DataOpt = Annotated[Path | None, typer.Option("--data", help="Eval text/JSONL file or shard dir (default: held-out offline corpus).")]
TokensOpt = Annotated[int | None, typer.Option("--tokens", min=2, help="Eval token budget (sets --n-seq = tokens // seq-len).")]
NSeqOpt = Annotated[int, typer.Option("--n-seq", min=1, help="Eval sequences.")]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len", min=2, help="Tokens per sequence (default: min(256, model max)).")]
BatchOpt = Annotated[int | None, typer.Option("--batch-size", min=1, help="Max rows per forward (memory knob).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Eval-data and bootstrap seed.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda | cuda:N")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="fp32 | bf16 | fp64 (weights and activations; norms, losses and sums stay fp32/fp64).")]
DeviceMapOpt = Annotated[str | None, typer.Option("--device-map", help="HF/GGUF models over several GPUs: auto (balanced by parameters over the visible GPUs) or a JSON map {embed, layers, head} (inline or a .json file); replaces --device.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Write the dataset here (netCDF). Default: ./<ckpt>.<metric>.nc")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the headline as JSON.")]
BootOpt = Annotated[int, typer.Option("--n-boot", min=0, help="Bootstrap resamples over sequences (0 = no CI).")]
ThreadsOpt = Annotated[int, typer.Option("--threads", min=0, help="torch CPU threads (1 is fastest for small models; 0 = torch default).")]
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
    """Open a depthlens checkpoint, Hugging Face directory or GGUF file (the one loader) on the requested
    device and dtype."""
    import torch

    if c.threads:
        torch.set_num_threads(c.threads)  # a busy second core slows a default 2-thread run many times
    check_choice(c.dtype, tuple(DTYPES), "--dtype")
    from ..adapters.load import open_model as open_checkpoint
    from ..adapters.placement import parse_device_map

    op = open_checkpoint(ckpt, device=c.device, dtype=registry.load_dtype(c.dtype),
                         device_map=parse_device_map(c.device_map))
    return op.model, ckpt


def eval_data(model: Any, ckpt: Path | None, c: Common) -> Any:
    from ..analysis.api import eval_data_for

    cfg = getattr(model, "config", None)
    max_len = getattr(cfg, "max_seq_len", None) or 256
    T = c.seq_len or min(256, max_len)
    if c.seq_len is not None and c.seq_len > max_len:
        from ..errors import DataError

        raise DataError(f"--seq-len {c.seq_len} exceeds the model's max_seq_len {max_len}")
    n_seq = max(1, c.tokens // T) if c.tokens else c.n_seq
    from .validate import note_capped

    ev = eval_data_for(model, c.data, ckpt, n_seq=n_seq, seq_len=T, seed=c.seed)
    note_capped(ev, "--tokens" if c.tokens else "--n-seq")
    return ev


def resolve_out(out: Path | None, ckpt: Path, metric: str, overwrite: bool) -> tuple[Path, bool]:
    """The netCDF path (default ./<ckpt>.<metric>.nc), checked before any work: an existing file is replaced
    only with --overwrite and only when it is a depthlens netCDF dataset (the default name too)."""
    from ..errors import DepthlensError
    from ..io.atomic import check_target

    out = Path(f"{ckpt.resolve().name}.{metric}.nc") if out is None else out
    if out.is_dir():
        raise DepthlensError(f"{out}: is a directory")
    if not out.parent.exists():
        raise DepthlensError(f"{out.parent}: output directory does not exist")
    check_target(out, overwrite, kinds=("netCDF dataset",))
    return out, overwrite


def write(ds: Any, path: Path, overwrite: bool, command: str) -> None:
    from ..analysis.dataset import write_netcdf
    from ..analysis.distributed import is_main

    if not is_main():  # under torchrun only rank 0 writes the merged dataset
        return

    ds.attrs["command"] = command
    write_netcdf(ds, path, overwrite=overwrite)


def emit(headline: dict[str, Any], as_json: bool, text_lines: list[str], view: Any = None) -> None:
    from ..analysis.distributed import is_main

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
        ci = f" [{100 * h['ci_low']:.1f}%, {100 * h['ci_high']:.1f}%] 95% ({h.get('ci_method')}; resampling " \
             f"{h.get('ci_unit')})"
    full = ""
    if h.get("subsample_m") is not None:
        rising = "; still rising with the eval set" if h.get("still_rising") else ""
        full = f"; at all {h['n_sequences']} sequences {100 * h['share_full']:.1f}% (max: no interval{rising})"
    shards = "" if h.get("shard_mean") is None else \
        f"; 5 disjoint eval shards: {100 * h['shard_mean']:.1f}% ± {100 * h['shard_sd']:.1f}%"
    size = f"at m = {h['subsample_m']} sequences " if h.get("subsample_m") is not None else ""
    return f"{size}{100 * h['share']:.1f}%{ci}  of {h['n_pairs']} late pairs (layers >= {h['window_start']}){full}{shards}"


def _matrix_view(da: Any, vmax: float | None = None) -> Any:
    from ..analysis.plots import terminal_heatmap

    m = da.values
    labels = [str(i) for i in range(m.shape[0])]
    import numpy as np

    hi = vmax if vmax is not None else (float(np.nanmax(m)) if np.isfinite(m).any() else 1.0)
    return terminal_heatmap(m, labels, labels, vmin=0.0, vmax=max(hi, 1e-12))


def _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads=1, device_map=None) -> Common:
    from ..analysis.distributed import device_for_rank

    # under torchrun `--device cuda` is cuda:LOCAL_RANK: one GPU per rank
    return Common(data, tokens, n_seq, seq_len, batch_size, seed, device_for_rank(device), dtype, threads, device_map)


def _opts(c: Common) -> dict[str, Any]:
    return {} if c.batch_size is None else {"batch_size": c.batch_size}


def _cmdline(name: str, ckpt: Path, extra: str = "") -> str:
    return f"depthlens {name} {ckpt} {extra}".strip()


# --- commands ------------------------------------------------------------------------------------------

@app.command()
@domain_errors
def angular(ckpt: CkptArg, positions: Annotated[str, typer.Option(help="last | all (BOS excluded)")] = "last",
            repr: Annotated[str, typer.Option("--repr", help="view | flatten (HC/mHC) | input (AttnRes)")] = "view",
            data: DataOpt = None, tokens: TokensOpt = None, n_seq: NSeqOpt = 32, seq_len: SeqLenOpt = None,
            batch_size: BatchOpt = None, seed: SeedOpt = 0, device: DeviceOpt = "cpu", dtype: DtypeOpt = "fp32",
            device_map: DeviceMapOpt = None, threads: ThreadsOpt = 1, out: OutOpt = None, overwrite: OverwriteOpt = False,
            as_json: JsonOpt = False) -> None:
    """Angular distance D_n(l) between residual states (Gromov et al. 2024)."""
    check_choice(positions, ("last", "all"), "--positions")
    check_choice(repr, ("view", "flatten", "input"), "--repr")
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "angular", overwrite)
    model, ck = open_model(ckpt, c)
    with busy(f"angular distances of {ckpt}"):
        ds = registry.run("angular", model, eval_data(model, ck, c), positions=positions, repr=repr, checkpoint=ck,
                          **_opts(c))
    write(ds, path, ow, _cmdline("angular", ckpt))
    import numpy as np

    prof = ds["profile"].values
    prof = prof[np.isfinite(prof)]  # D_1(l) exists for l = 0..L-1
    head = {"metric": "angular", "positions": positions, "repr": repr, "profile": [float(x) for x in prof],
            "most_prunable_block": int(np.argmin(prof)) if len(prof) else None, "out": str(path)}
    lines = [f"[bold]{ckpt}[/bold] angular distance d(h_l, h_l+1), positions={positions}, repr={repr}:",
             "  " + " ".join(f"{x:.3f}" for x in prof), f"dataset: {path}"]
    emit(head, as_json, lines, _matrix_view(ds["angular_distance"], 1.0))


@app.command()
@rank0_errors
@domain_errors
def causal(ckpt: CkptArg, threshold: Annotated[float, typer.Option(help="Headline threshold θ (share of late pairs with C > θ).")] = registry.CAUSAL.theta,
           variant: Annotated[str, typer.Option(help="current | future")] = "current",
           agg: Annotated[str, typer.Option("--agg", help="max | mean | p95 | p99 | pooled")] = "max",
           unit: Annotated[str, typer.Option(help="block | attn | mlp")] = "block",
           norm: Annotated[str, typer.Option("--norm", help="Ratio denominator: update (|u_t|, Csordás) | resid (|h_t|, the residual stream entering t)")] = "update",
           layers: Annotated[str, typer.Option(help="Skipped layers: all | late")] = "all",
           direct: Annotated[bool, typer.Option("--direct", help="Also compute the direct-effect companion C_dir.")] = False,
           outputs: Annotated[bool, typer.Option("--outputs", help="Also compute the output effect O[s] and the layer-skip loss ΔL_skip(s) (one LM-head pass per skipped layer).")] = False,
           window: Annotated[str, typer.Option(help="Late-window start: quarter | half | zero")] = "quarter",
           data: DataOpt = None, tokens: TokensOpt = None, n_seq: NSeqOpt = 32, seq_len: SeqLenOpt = None,
           batch_size: BatchOpt = None, seed: SeedOpt = 0, device: DeviceOpt = "cpu", dtype: DtypeOpt = "fp32",
           device_map: DeviceMapOpt = None, threads: ThreadsOpt = 1, n_boot: BootOpt = 1000, out: OutOpt = None,
           overwrite: OverwriteOpt = False, as_json: JsonOpt = False) -> None:
    """Causal score C(s, t): skip layer s, how much do later layers' updates change (Csordás et al. 2025)."""
    check_threshold(threshold)
    check_choice(variant, ("current", "future"), "--variant")
    check_choice(agg, ("max", "mean", "p95", "p99", "pooled"), "--agg")
    check_choice(unit, ("block", "attn", "mlp"), "--unit")
    check_choice(norm, ("update", "resid"), "--norm")
    check_choice(layers, ("all", "late"), "--layers")
    check_choice(window, ("quarter", "half", "zero"), "--window")
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "causal", overwrite)
    from ..analysis.sweep import headline, interval_attrs, score_matrix

    model, ck = open_model(ckpt, c)
    variants = ("current", "future") if variant == "future" else ("current",)
    with busy(f"causal scores of {ckpt} (skipping each layer)"):
        ds = registry.run("causal", model, eval_data(model, ck, c), variants=variants, layers=layers, unit=unit,
                          norm=norm, direct=direct, outputs=outputs, checkpoint=ck, **_opts(c))
    h = headline(ds, "causal", threshold, aggregator=agg, variant=variant, start=window, n_boot=n_boot, seed=seed)
    ds.attrs.update(interval_attrs(h))
    write(ds, path, ow, _cmdline("causal", ckpt, f"--threshold {threshold} --variant {variant} --agg {agg} "
                                                 f"--norm {norm}" + (" --outputs" if outputs else "")))
    h.update(checkpoint=str(ckpt), design=getattr(model.design, "slug", "?"), n_layer=int(model.n_layer), out=str(path))
    lines = [f"[bold]{ckpt}[/bold] ({h['design']}, L={h['n_layer']}): {h['definition']}, unit={unit}",
             f"share C > {threshold}: {_fmt_share(h)}",
             f"noise floor (null intervention): {h.get('noise_floor', float('nan')):.2e}",
             *_skip_loss_lines(ds),
             f"dataset: {path}", "rows: skipped layer s, columns: later layer t"]
    emit(h, as_json, lines, _matrix_view(score_matrix(ds, "causal", agg, variant), 1.0))


def _skip_loss_lines(ds) -> list[str]:
    """With --outputs: the layer whose skip costs most, in loss and in output distribution."""
    if "skip_delta_loss" not in ds:
        return []
    import numpy as np

    dl, o = ds.skip_delta_loss.values, ds.output_effect.sel(variant="current").values
    s, so = int(np.nanargmax(dl)), int(np.nanargmax(o))
    return [f"layer-skip loss ΔL_skip: max {dl[s]:.3f} nats at layer {s}, mean {np.nanmean(dl):.3f}; "
            f"output effect O: max {o[so]:.3f} at layer {so}"]


@app.command()
@rank0_errors
@domain_errors
def permute(ckpt: CkptArg, threshold: Annotated[float, typer.Option(help="Headline threshold θ (nats for abs).")] = registry.PERM_ABS.theta,
            norm: Annotated[str, typer.Option(help="abs (nats) | rel | kl")] = "abs",
            swap: Annotated[str, typer.Option(help="body (routing stays) | all")] = "body",
            pairs: Annotated[str, typer.Option(help="late | all")] = "late",
            window: Annotated[str, typer.Option(help="Late-window start: quarter | half | zero")] = "quarter",
            data: DataOpt = None, tokens: TokensOpt = None, n_seq: NSeqOpt = 32, seq_len: SeqLenOpt = None,
            batch_size: BatchOpt = None, seed: SeedOpt = 0, device: DeviceOpt = "cpu", dtype: DtypeOpt = "fp32",
            device_map: DeviceMapOpt = None, threads: ThreadsOpt = 1, n_boot: BootOpt = 1000, out: OutOpt = None,
            overwrite: OverwriteOpt = False, as_json: JsonOpt = False) -> None:
    """Permutation score P(i, j): swap layers i and j, how much does the LM loss rise."""
    check_threshold(threshold)
    check_choice(norm, ("abs", "rel", "kl"), "--norm")
    check_choice(swap, ("body", "all"), "--swap")
    check_choice(pairs, ("late", "all"), "--pairs")
    check_choice(window, ("quarter", "half", "zero"), "--window")
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads, device_map)
    path, ow = resolve_out(out, ckpt, "permutation", overwrite)
    from ..analysis.sweep import headline, interval_attrs, score_matrix

    model, ck = open_model(ckpt, c)
    with busy(f"permutation scores of {ckpt} (swapping layer pairs)"):
        ds = registry.run("permutation", model, eval_data(model, ck, c), pairs=pairs, swap=swap, checkpoint=ck,
                          **_opts(c))
    metric = f"perm_{norm}"
    h = headline(ds, metric, threshold, start=window, n_boot=n_boot, seed=seed)
    ds.attrs.update(interval_attrs(h))
    write(ds, path, ow, _cmdline("permute", ckpt, f"--threshold {threshold}"))
    h.update(checkpoint=str(ckpt), design=getattr(model.design, "slug", "?"), n_layer=int(model.n_layer), out=str(path))
    lines = [f"[bold]{ckpt}[/bold] ({h['design']}, L={h['n_layer']}): {h['definition']}",
             f"clean loss {h.get('clean_loss', float('nan')):.4f} nats; share P > {threshold}: {_fmt_share(h)}",
             f"dataset: {path}"]
    emit(h, as_json, lines, _matrix_view(score_matrix(ds, metric, None, None)))


@app.command()
@domain_errors
def rank(ckpt: CkptArg, data: DataOpt = None, tokens: TokensOpt = None, n_seq: NSeqOpt = 8, seq_len: SeqLenOpt = None,
         batch_size: BatchOpt = None, seed: SeedOpt = 0, device: DeviceOpt = "cpu", dtype: DtypeOpt = "fp32",
         threads: ThreadsOpt = 1, out: OutOpt = None, overwrite: OverwriteOpt = False, as_json: JsonOpt = False) -> None:
    """Effective rank of HC/mHC residual-mixing products, with Amax gains (per token, then averaged)."""
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads)
    path, ow = resolve_out(out, ckpt, "rank", overwrite)
    model, ck = open_model(ckpt, c)
    with busy(f"effective rank of {ckpt}"):
        ds = registry.run("rank", model, eval_data(model, ck, c), checkpoint=ck, **_opts(c))
    write(ds, path, ow, _cmdline("rank", ckpt))
    er = ds["erank"]
    stat = "mean" if "statistic" in er.dims and "mean" in er["statistic"].values else None
    h: dict[str, Any] = {"metric": "erank", "checkpoint": str(ckpt), "design": getattr(model.design, "slug", "?"),
                         "n_layer": int(model.n_layer), "out": str(path)}
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
            lines.append(f"  maps that cannot receive gradient (stay at their init): sublayers {frozen}; "
                         "'interior' leaves out the first and last")
    from ..designs import has_capability

    init = (getattr(model.config, "mhc_init", None)
            if has_capability(getattr(model.design, "slug", ""), "stochastic_maps") else None)
    if init is not None:
        h["mhc_init"] = init
        lines.append(f"  mHC init: {init}" + (" (H_res = J/n at init: products are rank 1 by construction)"
                                               if init == "zero" else ""))
    lines.append(f"dataset: {path}")
    emit(h, as_json, lines)


@app.command()
@domain_errors
def attnres(ckpt: CkptArg, eps: Annotated[float, typer.Option(help="Dead-prefix threshold ε on the self-weight.")] = 0.05,
            data: DataOpt = None, tokens: TokensOpt = None, n_seq: NSeqOpt = 16, seq_len: SeqLenOpt = None,
            batch_size: BatchOpt = None, seed: SeedOpt = 0, device: DeviceOpt = "cpu", dtype: DtypeOpt = "fp32",
            threads: ThreadsOpt = 1, out: OutOpt = None, overwrite: OverwriteOpt = False, as_json: JsonOpt = False) -> None:
    """AttnRes depth-attention weights: self-weight per layer, dead prefix k*(ε), embedding weight."""
    check_threshold(eps, "--eps")
    if eps > 1:
        fail(f"--eps must be <= 1 (a softmax weight), got {eps}", 2)
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads)
    path, ow = resolve_out(out, ckpt, "attnres", overwrite)
    from ..analysis.attnres import EPS_GRID

    model, ck = open_model(ckpt, c)
    grid = tuple(sorted(set(EPS_GRID) | {eps}))
    with busy(f"AttnRes weights of {ckpt}"):
        ds = registry.run("attnres", model, eval_data(model, ck, c), eps_grid=grid, checkpoint=ck, **_opts(c))
    write(ds, path, ow, _cmdline("attnres", ckpt))
    sw = [float(x) for x in ds["self_weight"].values]
    k = int(ds["dead_prefix"].sel(eps=eps))
    by_eps = {f"{float(e):g}": int(ds["dead_prefix"].sel(eps=e)) for e in ds["eps"].values}
    h = {"metric": "attnres", "checkpoint": str(ckpt), "design": getattr(model.design, "slug", "?"),
         "n_layer": int(model.n_layer), "eps": eps, "dead_prefix": k, "dead_prefix_by_eps": by_eps,
         "self_weight": sw, "out": str(path)}
    if getattr(model.config, "arch", None) == "block_attnres":  # the only design with a block schedule
        h["block_starts"] = list(model.config.block_starts)
    lines = [f"[bold]{ckpt}[/bold] ({h['design']}, L={h['n_layer']}): AttnRes self-weight per layer",
             "  " + " ".join("  nan" if math.isnan(x) else f"{x:.3f}" for x in sw),
             f"dead prefix k*({eps}) = {k} layer(s)",
             "  k*(ε) over the grid: " + ", ".join(f"ε={e}: {v}" for e, v in by_eps.items())]
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
            if (b - a) / s + 1 > GRID_MAX:  # sized before allocating: 10^7 points would write 1.3 GB
                fail(f"--thresholds {text}: {int((b - a) / s) + 1:,} points; at most {GRID_MAX:,}", 2)
            vals = list(np.round(np.arange(a, b + s / 2, s), 10))
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


METRIC_CHOICES = registry.SWEEPABLE  # causal, perm_abs, perm_rel, perm_kl


@app.command()
@domain_errors
def sweep(ckpts: CkptsArg, metric: Annotated[str, typer.Option(help="causal | perm_abs | perm_rel | perm_kl")] = "causal",
          thresholds: Annotated[str | None, typer.Option(help="θ grid, start:stop:step or comma list (default per metric).")] = None,
          headline_threshold: Annotated[float | None, typer.Option("--threshold", help=f"Headline θ to mark (default {registry.CAUSAL.theta:g} / {registry.PERM_ABS.theta:g}).")] = None,
          order: Annotated[str | None, typer.Option(help="Expected ranking, comma-separated checkpoint names (low to high).")] = None,
          plot: Annotated[Path | None, typer.Option(help="Write the share(θ) curves plot here (PNG).")] = None,
          data: DataOpt = None, tokens: TokensOpt = None, n_seq: NSeqOpt = 32, seq_len: SeqLenOpt = None,
          batch_size: BatchOpt = None, seed: SeedOpt = 0, device: DeviceOpt = "cpu", dtype: DtypeOpt = "fp32",
          threads: ThreadsOpt = 1, out: OutOpt = None, overwrite: OverwriteOpt = False, as_json: JsonOpt = False) -> None:
    """Threshold-sensitivity sweep: share(θ) curves per checkpoint, crossing points, ranking robustness."""
    check_choice(metric, METRIC_CHOICES, "--metric")
    grid = parse_grid(thresholds) if thresholds else None
    if headline_threshold is not None:
        check_threshold(headline_threshold)
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads)
    path, ow = resolve_out(out, Path("sweep"), metric, overwrite)
    if plot is not None:  # checked now, so a bad --plot cannot fail after the dataset was written
        from ..io.atomic import check_target

        if plot.suffix.lower() not in (".png", ".pdf", ".svg"):
            fail(f"--plot {plot}: use a .png, .pdf or .svg file name", 2)
        check_target(plot, overwrite, kinds=("figure",))
    from ..analysis.dataset import concat_checkpoints
    from ..analysis.sweep import robustness

    names = [p.resolve().name for p in ckpts]
    if len(set(names)) != len(names):
        fail("checkpoint names must be distinct", 2)
    rank_order = [s.strip() for s in order.split(",")] if order else None
    if rank_order is not None and sorted(rank_order) != sorted(names):
        fail(f"--order must list each checkpoint name once ({', '.join(names)}); got {order!r}", 2)
    curves = []
    ev = None
    for p in _progress(ckpts, "sweep"):
        model, ck = open_model(p, c)
        ev = ev or eval_data(model, ck, c)  # identical tokens for every checkpoint
        curves.append(_metric_curves(model, ev, ck, metric, grid, c))
    ds = concat_checkpoints(curves, names)
    theta = registry.score(metric).theta if headline_threshold is None else headline_threshold
    sel = {k: _first(ds, k) for k in ("window_start", "aggregator", "variant") if k in ds["share"].dims}
    headline_curves = ds["share"].sel(sel)
    rob = robustness(headline_curves, rank_order or names, theta) if len(names) > 1 else None
    if rob is not None:
        ds.attrs["ranking_order_json"] = json.dumps(rank_order or names)
        ds.attrs["ranking_fraction"] = float(rob["fraction"])
    write(ds, path, ow, "depthlens sweep " + " ".join(str(p) for p in ckpts) + f" --metric {metric}")
    if plot is not None:
        from ..analysis.plots import save_figure
        from ..analysis.plots import share_curves as draw

        save_figure(draw(headline_curves, headline=theta), plot)
    from ..analysis.sweep import definition

    defn = definition(metric, variant=sel.get("variant"), aggregator=sel.get("aggregator"),
                      swap="body" if metric != "causal" else None)
    h: dict[str, Any] = {"metric": metric, "definition": defn, "headline_threshold": theta, "checkpoints": names,
                         "out": str(path), "plot": str(plot) if plot else None}
    if rob is not None:
        h["ranking_order"] = rank_order or names
        h["ranking_fraction"] = float(rob["fraction"])
    lines = [f"share(θ) for {defn} over {len(ds['threshold'])} thresholds, {len(names)} checkpoint(s)"]
    if "crossing" in ds:
        lines.append("crossing points θ_q (share falls to q):")
        cr = ds["crossing"]
        cr = cr.sel({k: v for k, v in sel.items() if k in cr.dims})
        for name in names:
            row = cr.sel(checkpoint=name)
            lines.append(f"  {name:>20}: " + "  ".join(f"q={float(q):g}: {float(v):.3g}" for q, v in zip(row["q"].values, row.values)))
            h.setdefault("crossings", {})[name] = {str(float(q)): float(v) for q, v in zip(row["q"].values, row.values)}
    if rob is not None:
        lines.append(f"ranking {' < '.join(rank_order or names)} holds on {100 * float(rob['fraction']):.0f}% of the θ grid")
    lines.append(f"dataset: {path}" + (f"; plot: {plot}" if plot else ""))
    emit(h, as_json, lines)


def _first(ds: Any, dim: str) -> Any:
    if dim not in ds.dims:
        return None
    vals = list(ds[dim].values)
    pref = {"window_start": "quarter", "aggregator": "max", "variant": "current"}.get(dim)
    return pref if pref in vals else vals[0]


def _late_run(d: registry.Diagnostic, model: Any, ev: Any, ck: Path | None, c: Common) -> Any:
    """Diagnostic `d` restricted to what its late-window headline needs (compare and sweep)."""
    return registry.run(d.name, model, ev, **d.report_opts, **d.late_opts, checkpoint=ck, **_opts(c))


def _metric_curves(model: Any, ev: Any, ck: Path, metric: str, grid: list[float] | None, c: Common) -> Any:
    from ..analysis.sweep import share_curves

    return share_curves(_late_run(registry.score_owner(metric)[0], model, ev, ck, c), metric, grid)


def _progress(items: list[Path], what: str):
    from rich.progress import Progress

    with Progress(transient=True, console=_stderr_console()) as prog:
        task = prog.add_task(what, total=len(items))
        for it in items:
            prog.update(task, description=f"{what}: {it}")
            yield it
            prog.advance(task)


def busy(what: str):
    """A spinner on stderr while a single-checkpoint computation runs (silent when stderr is not a terminal)."""
    return _stderr_console().status(what, spinner="dots")


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


@app.command()
@domain_errors
def compare(ckpts: CkptsArg,
            metrics: Annotated[str, typer.Option(help="Comma list of causal, perm_abs, perm_rel, perm_kl.")] = "causal,perm_abs",
            data: DataOpt = None, tokens: TokensOpt = None, n_seq: NSeqOpt = 32, seq_len: SeqLenOpt = None,
            batch_size: BatchOpt = None, seed: SeedOpt = 0, device: DeviceOpt = "cpu", dtype: DtypeOpt = "fp32",
            threads: ThreadsOpt = 1, n_boot: BootOpt = 1000, as_json: JsonOpt = False) -> None:
    """Headline shares (with CIs) side by side for several checkpoints on identical eval data."""
    wanted = [m.strip() for m in metrics.split(",") if m.strip()]
    if not wanted:
        fail(f"--metrics {metrics!r} names no metric; give a comma list of {', '.join(METRIC_CHOICES)}", 2)
    for m in wanted:
        check_choice(m, METRIC_CHOICES, "--metrics")
    c = _common(data, tokens, n_seq, seq_len, batch_size, seed, device, dtype, threads)
    from ..analysis.sweep import headline

    rows, ev = [], None
    for p in _progress(ckpts, "compare"):
        model, ck = open_model(p, c)
        ev = ev or eval_data(model, ck, c)
        row: dict[str, Any] = {"checkpoint": p.resolve().name, "design": getattr(model.design, "slug", "?"),
                               "n_layer": int(model.n_layer)}
        for d in registry.DIAGNOSTICS:  # one engine run per diagnostic, however many of its scores are wanted
            keys = [m for m in wanted if registry.score_owner(m)[0] is d]
            if keys:
                ds = _late_run(d, model, ev, ck, c)
                row.update({m: headline(ds, m, n_boot=n_boot, seed=seed) for m in keys})
        rows.append(row)
    if as_json:
        typer.echo(_json(rows))
        return
    from rich.console import Console
    from rich.table import Table

    defs = "; ".join(dict.fromkeys(r[m]["definition"] for r in rows for m in wanted))
    methods = "; ".join(dict.fromkeys(f"{m}: {r[m]['ci_method']} over {r[m]['ci_unit']}" for r in rows for m in wanted
                                      if r[m].get("ci_method")))
    t = Table(title="headline shares over the late window (95% interval)", caption=f"{defs}\n{methods}")
    for col in ("checkpoint", "design", "L", *wanted):
        t.add_column(col)
    for r in rows:
        cells = []
        for m in wanted:
            h = r[m]
            ci = "" if math.isnan(h["ci_low"]) else f" [{100 * h['ci_low']:.0f}, {100 * h['ci_high']:.0f}]"
            size = f" at m = {h['subsample_m']} seqs; all {h['n_sequences']}: {100 * h['share_full']:.1f}%" \
                if h.get("subsample_m") is not None else ""
            cells.append(f"{100 * h['share']:.1f}%{ci} (> {h['threshold']}){size}")
        t.add_row(r["checkpoint"], r["design"], str(r["n_layer"]), *cells)
    Console().print(t)
