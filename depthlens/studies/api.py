"""Convenience entry points: a checkpoint path (or a model) in, a labelled `xarray.Dataset` out.

    import depthlens.studies.api as dl
    ds = dl.causal("ckpt/preln_l32")                        # default eval data: held-out corpus split
    ds = dl.permutation(model, data, pairs="late", swap="body")
    ds = dl.run("permute", "ckpt/hc_l32")                    # any diagnostic by registry name or alias
    both = dl.compare(dl.causal, ["ckpt/preln_l32", "ckpt/hc_l32"])   # stacked along `checkpoint`

Every result records its options and provenance (checkpoint SHA-256, config JSON, design, eval-data hash,
token count, seed, dtype) as attrs. Eval data default: `evaldata.load_eval_data` with the checkpoint's
tokenizer (bytes when the checkpoint has none), seq_len = min(evaldata.DEFAULT_SEQ_LEN, max_seq_len).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import xarray as xr

from depthlens.diagnostics import registry
from depthlens.errors import UsageError
from depthlens.io.dataset import concat_checkpoints
from depthlens.runtime.evaldata import DEFAULT_N_SEQ, DEFAULT_SEQ_LEN, EvalData, load_eval_data
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
        if seq_len is not None and max_len is not None and seq_len > max_len:
            from depthlens.errors import DataError

            raise DataError(f"--seq-len {seq_len} exceeds the model's max_seq_len {max_len}")
        T = seq_len or min(DEFAULT_SEQ_LEN, max_len or DEFAULT_SEQ_LEN)
        n_seq = max(1, tokens // T) if tokens else n_seq
        tok = _tokenizer_for(checkpoint, model, required=not _is_shards(data))
        out = load_eval_data(data, tok, n_seq=n_seq, seq_len=T, seed=seed, max_seq_len=max_len)
    out.check_model(getattr(cfg, "vocab_size", None), max_len)
    return out


def _run(
    name: str,
    model_or_path: Any,
    data: Any,
    opts: dict[str, Any],
    data_opts: Sequence[str] = ("n_seq", "seq_len", "seed"),
    device: str = "cpu",
    dtype: torch.dtype | None = None,
) -> xr.Dataset:
    """Load, build the eval data, then run diagnostic `name` through the registry (the CLI's path too)."""
    model, ckpt = load_model(model_or_path, device=device, dtype=dtype)
    dkw = {k: opts.pop(k) for k in data_opts if k in opts}
    return registry.run(name, model, eval_data_for(model, data, ckpt, **dkw), checkpoint=ckpt, **opts)


def run(
    name: str,
    model_or_path: Any,
    data: Any = None,
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    **opts: Any,
) -> xr.Dataset:
    """Any diagnostic by registry name or alias ("causal", "permute", "rank", ...), with its engine's opts."""
    return _run(name, model_or_path, data, opts, device=device, dtype=dtype)


def angular(
    model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
) -> xr.Dataset:
    """Angular distance D_n(ℓ) (opts: positions='last'|'all', repr='view'|'flatten'|'input', batch_size)."""
    return _run("angular", model_or_path, data, opts, device=device, dtype=dtype)


def causal(
    model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
) -> xr.Dataset:
    """Causal score C(s, t) (opts: variants, layers, unit, norm, direct, outputs, n_cuts, batch_size, ...)."""
    return _run("causal", model_or_path, data, opts, device=device, dtype=dtype)


def layer_skip_loss(
    model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
) -> xr.Dataset:
    """ΔL_skip(s) and O[s] for every layer (the `current` skip, no update ratios: cost (L+1)/2 passes)."""
    opts = {"layers": "all", **opts, "variants": ("current",), "measure": False, "null": False, "outputs": True}
    ds = _run("causal", model_or_path, data, opts, device=device, dtype=dtype)
    ds.attrs.update(metric="layer_skip_loss", title="depthlens layer-skip loss")
    return ds


def permutation(
    model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
) -> xr.Dataset:
    """Permutation score P_abs/P_rel/P_KL (opts: pairs='late'|'all'|[(i, j)], swap='body'|'all', batch_size)."""
    return _run("permutation", model_or_path, data, opts, device=device, dtype=dtype)


def effective_rank(
    model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
) -> xr.Dataset:
    """Effective rank of residual-mixing products (multi-stream designs; opts: widths, batch_size)."""
    return _run("rank", model_or_path, data, opts, device=device, dtype=dtype)


def attnres(
    model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
) -> xr.Dataset:
    """AttnRes self-weight, dead prefix k*(ε), consumption, mass families (opts: eps_grid, batch_size)."""
    return _run("attnres", model_or_path, data, opts, device=device, dtype=dtype)


def depth_mixing(
    model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
) -> xr.Dataset:
    """Token-mean depth-mixing matrix M[i → j] for any design."""
    return _run("mixing", model_or_path, data, opts, device=device, dtype=dtype)


def compare(
    fn: Callable[..., xr.Dataset] | str,
    checkpoints: Sequence[Any],
    data: Any = None,
    *,
    names: Sequence[str] | None = None,
    **opts: Any,
) -> xr.Dataset:
    """Run one of the functions above (or a diagnostic by registry name, e.g. "permute") on several
    checkpoints with the same eval data; stack along `checkpoint`.

    The default eval data is built once (from the first checkpoint's tokenizer) and reused, so every
    checkpoint sees identical tokens.
    """
    if not checkpoints:
        raise ValueError("compare needs at least one checkpoint")
    if data is None or not isinstance(data, EvalData):
        model, ckpt = load_model(checkpoints[0], device=opts.get("device", "cpu"))
        dkw = {k: opts.pop(k) for k in ("n_seq", "seq_len", "seed") if k in opts}
        data = eval_data_for(model, data, ckpt, **dkw)
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
    return concat_checkpoints([fn(c, data, **opts) for c in checkpoints], names)


def __getattr__(name: str) -> Callable[..., xr.Dataset]:
    """Every diagnostic of the registry as an API function, registered ones included:
    `api.branch_share(path)` == `api.run("branch_share", path)`."""
    try:
        d = registry.get(name)
    except Exception:  # noqa: BLE001  (any unknown attribute is an AttributeError, as for a plain module)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

    def diagnostic(
        model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None, **opts: Any
    ) -> xr.Dataset:
        return _run(d.name, model_or_path, data, opts, device=device, dtype=dtype)

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
    bad = [k for k in wanted if k not in every]
    if bad or not wanted:
        raise UsageError(f"{option} must be one of {', '.join(every)}; got {', '.join(map(repr, bad)) or 'none'}")
    return tuple(wanted)


def headline_shares(
    checkpoints: Sequence[Any], keys: str | Sequence[str] = ("causal", "perm_abs"), opts: Any = None
) -> list[dict[str, Any]]:
    """Headline shares (with bootstrap CIs) of score `keys` for several checkpoints on identical eval data:
    [{checkpoint, design, n_layer, <key>: `sweep.headline` dict}] in the given order (one engine run per
    diagnostic, however many of its scores are asked for)."""
    from depthlens.diagnostics.sweep import headline

    keys = check_scores(keys)
    study = _late_study(checkpoints, keys, opts)
    if study is None:
        return []
    n_boot, seed = (opts.n_boot, opts.seed) if opts is not None else (1000, 0)
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
    key: str = "causal",
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
