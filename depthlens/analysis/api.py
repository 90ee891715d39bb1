"""Convenience entry points: a checkpoint path (or a model) in, a labelled `xarray.Dataset` out.

    import depthlens.analysis.api as dl
    ds = dl.causal("ckpt/preln_l32")                        # default eval data: held-out corpus split
    ds = dl.permutation(model, data, pairs="late", swap="body")
    ds = dl.run("permute", "ckpt/hc_l32")                    # any diagnostic by registry name or alias
    both = dl.compare(dl.causal, ["ckpt/preln_l32", "ckpt/hc_l32"])   # stacked along `checkpoint`

Every result records its options and provenance (checkpoint SHA-256, config JSON, design, eval-data hash,
token count, seed, dtype) as attrs. Eval data default: `evaldata.load_eval_data` with the checkpoint's
tokenizer (bytes when the checkpoint has none), seq_len = min(256, max_seq_len).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import xarray as xr

from depthlens.analysis import registry
from depthlens.analysis.dataset import concat_checkpoints
from depthlens.analysis.evaldata import DEFAULT_N_SEQ, DEFAULT_SEQ_LEN, EvalData, load_eval_data


def load_model(model_or_path: Any, *, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> tuple[Any, Path | None]:
    """(model in eval mode, checkpoint path or None). Paths go through the one loader
    (`depthlens.adapters.load.open_model`): depthlens checkpoints, local Hugging Face directories, GGUF files."""
    if isinstance(model_or_path, (str, os.PathLike)):
        from depthlens.adapters.load import open_model

        return open_model(model_or_path, device=str(device), dtype=dtype).model, Path(model_or_path)
    _check_in_memory(model_or_path, device, dtype)
    return (model_or_path.eval() if hasattr(model_or_path, "eval") else model_or_path), None


def _check_in_memory(model: Any, device: str | torch.device, dtype: torch.dtype | None) -> None:
    """An in-memory model runs where and in what precision it is: a `dtype` (or a non-default `device`) it does
    not have is refused rather than silently ignored (the model is the caller's; it is never moved here)."""
    from depthlens.analysis.evaldata import model_device
    from depthlens.errors import DepthlensError

    params = list(model.parameters())[:1] if hasattr(model, "parameters") else []
    if dtype is not None and params and params[0].dtype != dtype:
        raise DepthlensError(f"dtype={dtype} but the model's weights are {params[0].dtype}; move the model "
                             f"yourself (model.to({dtype})) or pass a checkpoint path")
    want, here = torch.device(device), model_device(model)
    if want.type != "cpu" and (want.type != here.type or want.index not in (None, here.index)):
        raise DepthlensError(f"device={device} but the model is on {here}; move the model yourself or pass a "
                             "checkpoint path")


def _tokenizer_for(checkpoint: Path | None, model: Any = None, *, required: bool = True) -> Any:
    """The tokenizer the loader found with the model; bytes for byte-vocabulary models; otherwise refuse
    (random ids would silently measure noise). required=False (token shards, read as they are): the
    loader's tokenizer or None, only used to check the shard manifest."""
    from depthlens.adapters.load import opened_of

    op = opened_of(model)
    if op is not None and op.tokenizer is not None:
        return op.tokenizer
    if not required:
        return None
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if model is None or vocab in (None, 257):
        return "bytes"
    from depthlens.errors import DataError

    raise DataError(f"{checkpoint or 'model'}: no tokenizer found for a vocabulary of {vocab}; "
                    "pass eval data as token shards (--data DIR) or an EvalData")


def eval_data_for(model, data: Any = None, checkpoint: Path | None = None, *, n_seq: int = DEFAULT_N_SEQ,
                  seq_len: int | None = None, seed: int = 0) -> EvalData:
    """EvalData as given, a tensor/array of ids, a file/shard-dir path, or None (default corpus), checked
    against the model's vocabulary and max_seq_len."""
    cfg = getattr(model, "config", None)
    max_len = getattr(cfg, "max_seq_len", None)
    if isinstance(data, EvalData):
        out = data
    elif isinstance(data, torch.Tensor) or hasattr(data, "__array__"):
        out = EvalData.from_tokens(data)
    else:
        T = seq_len or min(DEFAULT_SEQ_LEN, max_len or DEFAULT_SEQ_LEN)
        tok = _tokenizer_for(checkpoint, model, required=not _is_shards(data))
        out = load_eval_data(data, tok, n_seq=n_seq, seq_len=T, seed=seed, max_seq_len=max_len)
    out.check_model(getattr(cfg, "vocab_size", None), max_len)
    return out


def _is_shards(data: Any) -> bool:
    """A directory of token shards needs no tokenizer (ids are read as they are)."""
    return isinstance(data, (str, os.PathLike)) and Path(data).is_dir()


def _run(name: str, model_or_path: Any, data: Any, opts: dict[str, Any],
         data_opts: Sequence[str] = ("n_seq", "seq_len", "seed"), device: str = "cpu",
         dtype: torch.dtype | None = None) -> xr.Dataset:
    """Load, build the eval data, then run diagnostic `name` through the registry (the CLI's path too)."""
    model, ckpt = load_model(model_or_path, device=device, dtype=dtype)
    dkw = {k: opts.pop(k) for k in data_opts if k in opts}
    return registry.run(name, model, eval_data_for(model, data, ckpt, **dkw), checkpoint=ckpt, **opts)


def run(name: str, model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
        **opts: Any) -> xr.Dataset:
    """Any diagnostic by registry name or alias ("causal", "permute", "rank", ...), with its engine's opts."""
    return _run(name, model_or_path, data, opts, device=device, dtype=dtype)


def angular(model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
            **opts: Any) -> xr.Dataset:
    """Angular distance D_n(ℓ) (opts: positions='last'|'all', repr='view'|'flatten'|'input', batch_size)."""
    return _run("angular", model_or_path, data, opts, device=device, dtype=dtype)


def causal(model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
           **opts: Any) -> xr.Dataset:
    """Causal score C(s, t) (opts: variants, layers, unit, norm, direct, outputs, n_cuts, batch_size, ...)."""
    return _run("causal", model_or_path, data, opts, device=device, dtype=dtype)


def layer_skip_loss(model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
                    **opts: Any) -> xr.Dataset:
    """ΔL_skip(s) and O[s] for every layer (the `current` skip, no update ratios: cost (L+1)/2 passes)."""
    opts = {"layers": "all", **opts, "variants": ("current",), "measure": False, "null": False, "outputs": True}
    ds = _run("causal", model_or_path, data, opts, device=device, dtype=dtype)
    ds.attrs.update(metric="layer_skip_loss", title="depthlens layer-skip loss")
    return ds


def permutation(model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
                **opts: Any) -> xr.Dataset:
    """Permutation score P_abs/P_rel/P_KL (opts: pairs='late'|'all'|[(i, j)], swap='body'|'all', batch_size)."""
    return _run("permutation", model_or_path, data, opts, device=device, dtype=dtype)


def effective_rank(model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
                   **opts: Any) -> xr.Dataset:
    """Effective rank of residual-mixing products (multi-stream designs; opts: widths, batch_size)."""
    return _run("rank", model_or_path, data, opts, device=device, dtype=dtype)


def attnres(model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
            **opts: Any) -> xr.Dataset:
    """AttnRes self-weight, dead prefix k*(ε), consumption, mass families (opts: eps_grid, batch_size)."""
    return _run("attnres", model_or_path, data, opts, device=device, dtype=dtype)


def depth_mixing(model_or_path: Any, data: Any = None, *, device: str = "cpu", dtype: torch.dtype | None = None,
                 **opts: Any) -> xr.Dataset:
    """Token-mean depth-mixing matrix M[i → j] for any design."""
    return _run("mixing", model_or_path, data, opts, device=device, dtype=dtype)


def compare(fn: Callable[..., xr.Dataset] | str, checkpoints: Sequence[Any], data: Any = None, *,
            names: Sequence[str] | None = None, **opts: Any) -> xr.Dataset:
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
    names = list(names) if names is not None else [
        Path(c).name if isinstance(c, (str, os.PathLike)) else f"{getattr(c.design, 'slug', 'model')}_{k}"
        for k, c in enumerate(checkpoints)]
    if isinstance(fn, str):
        fn = functools.partial(run, registry.get(fn).name)
    return concat_checkpoints([fn(c, data, **opts) for c in checkpoints], names)
