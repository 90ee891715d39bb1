"""The Python API: a checkpoint path (or a model) in, a labelled `xarray.Dataset` out; the same options, names
and defaults as the CLI commands (`depthlens causal` is `causal`, its `--n-seq` is `n_seq=`), with a progress bar
(a widget in a notebook; `progress=False` for none). Also importable as `import depthlens as dl`.

    import depthlens as dl
    ds = dl.causal("ckpt/preln_l32")                        # default eval data: held-out corpus split
    ds = dl.permute(model, data, layers="late", swap="body")
    ds = dl.run("permute", "ckpt/hc_l32")                    # any diagnostic by registry name or alias
    both = dl.compare(dl.causal, ["ckpt/preln_l32", "ckpt/hc_l32"])   # stacked along `checkpoint`
    rep = dl.report(["ckpt/preln_l4", "ckpt/hc_l4"], "depthlens-out/report_l4")

Every result records its options and provenance (checkpoint SHA-256, config JSON, design, eval-data hash,
token count, seed, dtype) as attrs. Eval data default: `evaldata.load_eval_data` with the checkpoint's
tokenizer (bytes when the checkpoint has none), seq_len = min(runtime.defaults.DEFAULT_SEQ_LEN, max_seq_len).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import xarray as xr

from depthlens.diagnostics import registry
from depthlens.errors import UsageError
from depthlens.io.dataset import concat_checkpoints
from depthlens.runtime.defaults import DEFAULT_N_BOOT, DEFAULT_N_SEQ
from depthlens.runtime.evaldata import EvalData, eval_set
from depthlens.runtime.evaldata import is_shards as _is_shards
from depthlens.runtime.evaldata import tokenizer_for as _tokenizer_for


def load_model(
    model_or_path: Any,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    device_map: str | None = None,
    progress: Any = None,
) -> tuple[Any, Path | None]:
    """(model in eval mode, checkpoint path or None). Paths go through the one loader
    (`depthlens.adapters.load.open_model`): depthlens checkpoints, local Hugging Face directories, GGUF files;
    `device_map` ("auto" or a JSON {embed, layers, head}, inline or a .json file) places an HF/GGUF model over
    several GPUs instead of `device`; `progress(done, total)` follows a GGUF's tensors as they load."""
    if isinstance(model_or_path, (str, os.PathLike)):
        from depthlens.adapters.load import open_model
        from depthlens.adapters.placement import parse_device_map

        op = open_model(
            model_or_path, device=str(device), dtype=dtype, device_map=parse_device_map(device_map), progress=progress
        )
        return op.model, Path(model_or_path)
    _check_in_memory(model_or_path, device, dtype)
    return (model_or_path.eval() if hasattr(model_or_path, "eval") else model_or_path), None


def _check_in_memory(model: Any, device: str | torch.device, dtype: torch.dtype | None) -> None:
    """An in-memory model runs where and in what precision it is: a `dtype` (or a non-default `device`) it does
    not have is refused rather than silently ignored (the model is the caller's; it is never moved here)."""
    from depthlens.errors import DepthlensError
    from depthlens.runtime.evaldata import model_device

    params = list(model.parameters())[:1] if hasattr(model, "parameters") else []
    if dtype is not None and params and params[0].dtype != dtype:
        raise DepthlensError(
            f"dtype={dtype} but the model's weights are {params[0].dtype}; move the model "
            f"yourself (model.to({dtype})) or pass a checkpoint path"
        )
    want, here = torch.device(device), model_device(model)
    if want.type != "cpu" and (want.type != here.type or want.index not in (None, here.index)):
        raise DepthlensError(
            f"device={device} but the model is on {here}; move the model yourself or pass a checkpoint path"
        )


def eval_data_for(
    model,
    data: Any = None,
    checkpoint: Path | None = None,
    *,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    seed: int = 0,
    tokens: int | None = None,
) -> EvalData:
    """EvalData as given, a tensor/array of ids, a file/shard-dir path, or None (default corpus), checked
    against the model's vocabulary and max_seq_len. seq_len None = min(DEFAULT_SEQ_LEN, the model's max);
    `tokens` (a token budget) sets n_seq = tokens // seq_len instead."""
    cfg = getattr(model, "config", None)
    max_len = getattr(cfg, "max_seq_len", None)
    if isinstance(data, EvalData):
        out = data
    elif isinstance(data, torch.Tensor) or hasattr(data, "__array__"):
        out = EvalData.from_tokens(data)
    else:
        tok = _tokenizer_for(checkpoint, model, required=not _is_shards(data))
        out = eval_set(data, tok, max_seq_len=max_len, n_seq=n_seq, seq_len=seq_len, tokens=tokens, seed=seed)
    out.check_model(getattr(cfg, "vocab_size", None), max_len)
    return out


Dtype = str | torch.dtype | None  # "fp32" | "bf16" | "fp64" (the CLI's --dtype names) or a torch dtype; None = fp32


def _dtype(dtype: Dtype) -> torch.dtype | None:
    return registry.load_dtype(dtype) if isinstance(dtype, str) else dtype


def _label(ckpt: Path | None, model: Any) -> str:
    return ckpt.name if ckpt is not None else f"{getattr(getattr(model, 'design', None), 'slug', 'model')}"


def _run(
    name: str,
    model_or_path: Any,
    data: Any,
    opts: dict[str, Any],
    data_opts: Sequence[str] = ("n_seq", "seq_len", "seed", "tokens"),
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = False,
) -> xr.Dataset:
    """Load, build the eval data, then run diagnostic `name` through the registry (the CLI's path too), with a
    progress bar (`runtime.progress.progress_bar`) when `progress`."""
    from depthlens.runtime.progress import progress_bar

    model, ckpt = load_model(model_or_path, device=device, dtype=_dtype(dtype))
    dkw = {k: opts.pop(k) for k in data_opts if k in opts}
    ev = eval_data_for(model, data, ckpt, **dkw)
    with progress_bar(f"{registry.get(name).name} {_label(ckpt, model)}", progress) as cb:
        return registry.run(name, model, ev, checkpoint=ckpt, progress=cb, **opts)


def run(
    name: str,
    model_or_path: Any,
    data: Any = None,
    *,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
    **opts: Any,
) -> xr.Dataset:
    """Any diagnostic by registry name or alias ("causal", "permute", "rank", ...), with its engine's own options
    as keywords (`n_seq`, `seq_len`, `seed`, `tokens` choose the eval data). The named functions below are the
    same with typed options."""
    return _run(name, model_or_path, data, opts, device=device, dtype=dtype, progress=progress)


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"{old} is deprecated and will be removed in the next version; use {new}", DeprecationWarning, 3)


# The eval-data and placement keywords every function below takes, with the CLI's defaults:
#   data       None (the held-out offline corpus, read with the checkpoint's tokenizer), an EvalData, a (n_seq,
#              seq_len) tensor/array of token ids, or a text/JSONL file or token-shard directory (--data)
#   n_seq      eval sequences (--n-seq, 32); seq_len tokens per sequence (--seq-len; None = min(128, model max));
#   tokens     an eval token budget instead of n_seq (--tokens: n_seq = tokens // seq_len); seed (--seed, 0)
#   batch_size max rows per forward (--batch-size; memory knob, never changes a number)
#   device     "cpu" | "cuda" | "cuda:N" (a path is loaded there; an in-memory model is never moved)
#   dtype      "fp32" | "bf16" | "fp64" or a torch dtype (--dtype); norms, losses and sums stay fp32/fp64
#   progress   a progress bar (tqdm.auto: a notebook widget in Jupyter, text on stderr elsewhere); False: none


def causal(
    model_or_path: Any,
    data: Any = None,
    *,
    variant: Literal["current", "future"] = "current",
    layers: Literal["all", "late"] | Sequence[int] = "all",
    unit: Literal["block", "attn", "mlp"] = "block",
    norm: Literal["update", "resid"] = "update",
    direct: bool = False,
    outputs: bool = False,
    null: bool = True,
    n_cuts: int = 4,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
    variants: Sequence[str] | None = None,
) -> xr.Dataset:
    """Causal score C(s, t) (docs/concepts.md#causal-score): skip layer s, how much does layer t's update change,
    as a ratio of norms (dimensionless, ≥ 0; 1 = the update changed by its own size). `depthlens causal`.

    variant: "current" (the skip removes s's write where t reads it) or "future" (also computes the "future"
    variant: the variant dimension then holds both). layers: the skipped layers s ("all", "late" = the last
    three quarters, or a list). unit: what is skipped (a whole block, its attention or its MLP). norm: the
    ratio's denominator ("update": ‖u_t‖; "resid": ‖h_t‖, the residual stream entering t). direct: also the
    direct-effect companion `causal_direct`. outputs: also the output effect O[s] and the layer-skip loss
    ΔL_skip(s) in nats (one LM-head pass per skipped layer). null: the noise floor of a null intervention.

    Returns an xarray Dataset: `causal_score` (variant, aggregator, skipped s, target t) with L = n_layer, the
    aggregators max | mean | p95 | p99 | pooled over tokens, NaN where t ≤ s (undefined); per-sequence scores
    (variant, eval_seq, s, t) for the intervals; with `outputs`, `output_effect` and `skip_loss` (s), in nats.
    The headline share is `depthlens.diagnostics.sweep.headline(ds, "causal")`. `variants=` is the old spelling
    of `variant` (deprecated)."""
    if variants is not None:
        _deprecated("causal(variants=...)", "variant='current' | 'future' (as the CLI's --variant)")
        vs = tuple(variants)
    else:
        vs = ("current", "future") if variant == "future" else ("current",)
    opts: dict[str, Any] = {
        "variants": vs,
        "layers": layers if isinstance(layers, str) else list(layers),
        "unit": unit,
        "norm": norm,
        "direct": direct,
        "outputs": outputs,
        "null": null,
        "n_cuts": n_cuts,
        "batch_size": batch_size,
        "n_seq": n_seq,
        "seq_len": seq_len,
        "tokens": tokens,
        "seed": seed,
    }
    return _run("causal", model_or_path, data, opts, device=device, dtype=dtype, progress=progress)


def layer_skip_loss(
    model_or_path: Any,
    data: Any = None,
    *,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
) -> xr.Dataset:
    """ΔL_skip(s) (nats: the loss rise when layer s is skipped) and the output effect O[s] for every layer s
    (dims: skipped (L,)); the `current` skip, no update ratios: cost (L+1)/2 passes."""
    opts: dict[str, Any] = {
        "layers": "all",
        "variants": ("current",),
        "measure": False,
        "null": False,
        "outputs": True,
        "batch_size": batch_size,
        "n_seq": n_seq,
        "seq_len": seq_len,
        "tokens": tokens,
        "seed": seed,
    }
    ds = _run("causal", model_or_path, data, opts, device=device, dtype=dtype, progress=progress)
    ds.attrs.update(metric="layer_skip_loss", title="depthlens layer-skip loss")
    return ds


def permutation(
    model_or_path: Any,
    data: Any = None,
    *,
    layers: Literal["late", "all"] | Sequence[tuple[int, int]] = "late",
    swap: Literal["body", "all"] = "body",
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
    pairs: str | Sequence[tuple[int, int]] | None = None,
) -> xr.Dataset:
    """Permutation score P(i, j) (docs/concepts.md#permutation-score): swap layers i < j, how much the LM loss
    rises. `depthlens permute`.

    layers: which pairs are swapped ("late": both layers in the late window; "all": every pair; or a list of
    (i, j) pairs). swap: "body" (the layers' computation moves, routing stays) or "all".

    Returns an xarray Dataset: `perm_abs` (i, j) in nats (loss rise), `perm_rel` (the rise over the clean loss,
    dimensionless) and `perm_kl` (nats: KL from the clean prediction), NaN where the pair was not swapped;
    per-sequence values (eval_seq, i, j) for the intervals; `clean_loss` in nats. `pairs=` is the old spelling
    of `layers` (deprecated)."""
    if pairs is not None:
        _deprecated("permutation(pairs=...)", "layers= (the one way to choose layers and pairs, as the CLI's --layers)")
        layers = pairs  # type: ignore[assignment]
    opts: dict[str, Any] = {
        "pairs": layers if isinstance(layers, str) else [tuple(p) for p in layers],
        "swap": swap,
        "batch_size": batch_size,
        "n_seq": n_seq,
        "seq_len": seq_len,
        "tokens": tokens,
        "seed": seed,
    }
    return _run("permutation", model_or_path, data, opts, device=device, dtype=dtype, progress=progress)


permute = permutation  # the CLI's command name


def angular(
    model_or_path: Any,
    data: Any = None,
    *,
    positions: Literal["last", "all"] = "last",
    repr: Literal["view", "flatten", "input"] = "view",
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
) -> xr.Dataset:
    """Angular distance D_n(ℓ) = arccos(cos(h_ℓ, h_ℓ+n)) / π between residual states (Gromov et al. 2024), in
    [0, 1]. `depthlens angular`.

    positions: "last" token or "all" (BOS excluded). repr: the state read ("view": the design's residual view;
    "flatten": every HC/mHC stream; "input": an AttnRes layer's input).

    Returns an xarray Dataset: `angular_distance` (layer ℓ = 0..L, block_size n = 0..L; NaN where ℓ + n > L),
    `profile` (layer) = D_1(ℓ) and `prune_start` (block_size) = argmin_ℓ D_n(ℓ)."""
    opts: dict[str, Any] = {
        "positions": positions,
        "repr": repr,
        "batch_size": batch_size,
        "n_seq": n_seq,
        "seq_len": seq_len,
        "tokens": tokens,
        "seed": seed,
    }
    return _run("angular", model_or_path, data, opts, device=device, dtype=dtype, progress=progress)


def effective_rank(
    model_or_path: Any,
    data: Any = None,
    *,
    widths: Sequence[int] | None = None,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
) -> xr.Dataset:
    """Effective rank (exp of the entropy of the normalised singular values; between 1 and n streams) of the
    residual-mixing products of HC/mHC models, with their Amax gains, per token then averaged. `depthlens rank`.

    widths: product lengths (default: the design's). Returns an xarray Dataset: `erank` (product[, statistic]),
    `gain_fwd`/`gain_bwd` (dimensionless), `structural_zero_grad` (sublayer, bool)."""
    opts: dict[str, Any] = {
        "widths": None if widths is None else list(widths),
        "batch_size": batch_size,
        "n_seq": n_seq,
        "seq_len": seq_len,
        "tokens": tokens,
        "seed": seed,
    }
    return _run("rank", model_or_path, data, opts, device=device, dtype=dtype, progress=progress)


rank = effective_rank  # the CLI's command name


def attnres(
    model_or_path: Any,
    data: Any = None,
    *,
    eps_grid: Sequence[float] | None = None,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
) -> xr.Dataset:
    """AttnRes depth-attention readouts (Full/Block AttnRes): the self-weight per layer (a softmax weight in
    [0, 1]), the dead prefix k*(ε) (layers) for each ε of `eps_grid`, consumption and mass families.
    `depthlens attnres`. Returns an xarray Dataset: `self_weight` (layer), `dead_prefix` (eps), ..."""
    from depthlens.diagnostics.attnres.engine import EPS_GRID

    opts: dict[str, Any] = {
        "eps_grid": tuple(EPS_GRID if eps_grid is None else eps_grid),
        "batch_size": batch_size,
        "n_seq": n_seq,
        "seq_len": seq_len,
        "tokens": tokens,
        "seed": seed,
    }
    return _run("attnres", model_or_path, data, opts, device=device, dtype=dtype, progress=progress)


def depth_mixing(
    model_or_path: Any,
    data: Any = None,
    *,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
) -> xr.Dataset:
    """Token-mean depth-mixing matrix M[i → j] (the weight of source i, 0 = embedding, in the input of sublayer
    j; dimensionless) for any design. `depthlens mixing`."""
    opts: dict[str, Any] = {
        "batch_size": batch_size,
        "n_seq": n_seq,
        "seq_len": seq_len,
        "tokens": tokens,
        "seed": seed,
    }
    return _run("mixing", model_or_path, data, opts, device=device, dtype=dtype, progress=progress)


def compare(
    fn: Callable[..., xr.Dataset] | str,
    checkpoints: Sequence[Any],
    data: Any = None,
    *,
    names: Sequence[str] | None = None,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: Dtype = None,
    progress: bool = True,
    **options: Any,
) -> xr.Dataset:
    """Run one of the functions above (or a diagnostic by registry name, e.g. "permute") on several
    checkpoints with the same eval data; stack along a new `checkpoint` dimension (named by `names`, default
    the directory names). `options` are `fn`'s own (e.g. `layers="late"`).

    The default eval data is built once (from the first checkpoint's tokenizer) and reused, so every
    checkpoint sees identical tokens.
    """
    if not checkpoints:
        raise UsageError("compare needs at least one checkpoint")
    if data is None or not isinstance(data, EvalData):
        model, ckpt = load_model(checkpoints[0], device=device, dtype=_dtype(dtype))
        data = eval_data_for(model, data, ckpt, n_seq=n_seq, seq_len=seq_len, seed=seed, tokens=tokens)
    names = (
        list(names)
        if names is not None
        else [
            Path(c).name if isinstance(c, (str, os.PathLike)) else f"{getattr(c.design, 'slug', 'model')}_{k}"
            for k, c in enumerate(checkpoints)
        ]
    )
    if isinstance(fn, str):
        fn = functools.partial(run, registry.get(fn).name)
    kw = {"device": device, "dtype": dtype, "progress": progress, **options}
    return concat_checkpoints([fn(c, data, **kw) for c in checkpoints], names)


def report(
    checkpoints: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] = "depthlens-out/report",
    *,
    metrics: str | Sequence[str] | None = None,
    data: str | os.PathLike[str] | None = None,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
    untrained: str | Sequence[str] | None = None,
    untrained_seeds: int | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    overwrite: bool = False,
    progress: bool = True,
) -> Any:
    """`depthlens report`: every diagnostic (or `metrics`, names or aliases) on every checkpoint (paths) on one
    eval set, the untrained baselines beside them (`untrained`: metric names, () for none; default the report's;
    `untrained_seeds` K: only for checkpoints of training seed < K, as `--untrained-seeds`; None: every seed),
    written atomically to the directory `out` (HTML, Markdown, summary.json, netCDF). Returns the Report
    (`.records`: one dict per checkpoint, the numbers of summary.json)."""
    from depthlens.io.ownership import in_scratch
    from depthlens.runtime.progress import progress_bar
    from depthlens.studies.report import ReportOptions, build_report
    from depthlens.studies.study import parse_metrics

    opts = ReportOptions(
        data=data,
        n_seq=n_seq,
        seq_len=seq_len,
        tokens=tokens,
        seed=seed,
        device=device,
        dtype=dtype,
        n_boot=n_boot,
        metrics=parse_metrics(metrics or registry.names()),
        untrained=registry.untrained_names() if untrained is None else (parse_metrics(untrained) if untrained else ()),
        untrained_seeds=untrained_seeds,
    )
    if in_scratch(out):  # the default folder depthlens-out/ is made on first use
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    with progress_bar("report", progress) as cb:
        steps = {"n": 0, "total": 0}

        def sized(n: int) -> None:
            steps["total"] = n
            if cb is not None:
                cb(0, n)

        def step(_: str) -> None:
            steps["n"] += 1
            if cb is not None and steps["total"]:
                cb(min(steps["n"], steps["total"]), steps["total"])

        return build_report(list(checkpoints), out, opts, overwrite=overwrite, progress=step, on_loaded=sized)


def __getattr__(name: str) -> Callable[..., xr.Dataset]:
    """Every diagnostic of the registry as an API function, registered ones included:
    `api.branch_share(path)` == `api.run("branch_share", path)`."""
    try:
        d = registry.get(name)
    except Exception:  # noqa: BLE001  (any unknown attribute is an AttributeError, as for a plain module)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

    def diagnostic(
        model_or_path: Any,
        data: Any = None,
        *,
        device: str = "cpu",
        dtype: Dtype = None,
        progress: bool = True,
        **opts: Any,
    ) -> xr.Dataset:
        return _run(d.name, model_or_path, data, opts, device=device, dtype=dtype, progress=progress)

    diagnostic.__name__ = diagnostic.__qualname__ = d.name
    diagnostic.__doc__ = f"{d.summary} (registry diagnostic {d.name!r}; opts go to its engine)."
    return diagnostic


# ---------------------------------------------------------------------------------------------------------------
# studies: several checkpoints, one eval set (the `compare` and `sweep` commands are these, then a rendering)


def _late_study(checkpoints: Sequence[Any], keys: Sequence[str], opts: Any) -> Any:
    """A study of the diagnostics owning score `keys`, each restricted to its late-window headline."""
    import dataclasses

    from depthlens.errors import DepthlensError
    from depthlens.studies.study import StudyOptions, run_study

    owners = tuple(dict.fromkeys(registry.score_owner(k)[0].name for k in keys))
    opts = dataclasses.replace(opts or StudyOptions(), metrics=owners, late=True)
    study = run_study(checkpoints, opts)
    if study is None:
        return None
    for e in study.entries:
        for m in owners:
            if m not in e.datasets:  # a share that cannot be computed is refused, never left out silently
                raise DepthlensError(next((n for n in e.notes if n.startswith(f"{m}:")), f"{e.name}: no {m}"))
    return study


def check_scores(keys: str | Sequence[str], option: str = "--metrics") -> tuple[str, ...]:
    """Score keys (a comma list or a sequence) checked against `registry.sweepable()`; ValueError (usage)."""
    wanted = [k.strip() for k in (keys.split(",") if isinstance(keys, str) else keys) if k.strip()]
    every = registry.sweepable()
    by_var = {registry.score(k).var: k for k in every}  # a Dataset variable name is the score's name too
    wanted = [by_var.get(k, k) for k in wanted]
    bad = [k for k in wanted if k not in every]
    if bad or not wanted:
        raise UsageError(f"{option} must be one of {', '.join(every)}; got {', '.join(map(repr, bad)) or 'none'}")
    return tuple(wanted)


def headline_shares(
    checkpoints: Sequence[Any], keys: str | Sequence[str] = registry.HEADLINES, opts: Any = None
) -> list[dict[str, Any]]:
    """Headline shares (with bootstrap CIs) of score `keys` for several checkpoints on identical eval data:
    [{checkpoint, design, n_layer, <key>: `sweep.headline` dict}] in the given order (one engine run per
    diagnostic, however many of its scores are asked for)."""
    from depthlens.diagnostics.sweep import headline

    keys = check_scores(keys)
    study = _late_study(checkpoints, keys, opts)
    if study is None:
        return []
    n_boot, seed = (opts.n_boot, opts.seed) if opts is not None else (DEFAULT_N_BOOT, 0)
    rows = []
    for e in study.entries:
        row: dict[str, Any] = {"checkpoint": e.name, "design": e.slug, "n_layer": e.n_layer}
        row.update(
            {k: headline(e.datasets[registry.score_owner(k)[0].name], k, n_boot=n_boot, seed=seed) for k in keys}
        )
        rows.append(row)
    return rows


def _first(ds: xr.Dataset, dim: str) -> Any:
    if dim not in ds.dims:
        return None
    vals = list(ds[dim].values)
    pref = {"window_start": "quarter", "aggregator": "max", "variant": "current"}.get(dim)
    return pref if pref in vals else vals[0]


def sweep(
    checkpoints: Sequence[Any],
    key: str = registry.HEADLINES[0],  # the registry's first headline score
    thresholds: Sequence[float] | None = None,
    *,
    theta: float | None = None,
    order: Sequence[str] | None = None,
    opts: Any = None,
) -> dict[str, Any]:
    """Threshold sweep of score `key` over several checkpoints on identical eval data: share(θ) curves and
    crossing points for every window start (and aggregator/variant where the score has them), plus the ranking
    robustness of the headline curves (window quarter, max, current) when there are two or more checkpoints.

    Returns {"dataset": the curves stacked along `checkpoint`, "curves": the headline curves, "selection",
    "theta", "order", "robustness": xr.Dataset or None}. `order` (checkpoint names, low to high): without it
    no robustness is computed."""
    from depthlens.diagnostics.sweep import robustness, share_curves

    key = check_scores([key], "--metric")[0]
    study = _late_study(checkpoints, [key], opts)
    if study is None:
        return {}
    owner = registry.score_owner(key)[0].name
    names = [e.name for e in study.entries]
    ds = concat_checkpoints([share_curves(e.datasets[owner], key, thresholds) for e in study.entries], names)
    theta = registry.score(key).theta if theta is None else float(theta)
    sel = {k: _first(ds, k) for k in ("window_start", "aggregator", "variant") if k in ds["share"].dims}
    curves = ds["share"].sel(sel)
    # a ranking's robustness means something only against an order the caller expects, not the argument order
    order = list(order) if order else None
    rob = robustness(curves, order, theta) if order is not None and len(names) > 1 else None
    if rob is not None:
        import json

        ds.attrs["ranking_order_json"] = json.dumps(order)
        ds.attrs["ranking_fraction"] = float(rob["fraction"])
    return {"dataset": ds, "curves": curves, "selection": sel, "theta": theta, "order": order, "robustness": rob}
