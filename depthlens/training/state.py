"""The trainer's resume state on disk: <out>/resume/{state.safetensors, state.json}, with a manifest.

state.json carries, next to the run metadata, a manifest: the step and every tensor's name, shape, dtype
and SHA-256. The safetensors header repeats the step and the manifest's own SHA-256, so the two files
cannot be paired wrongly. `read_state` checks all of it and refuses a mismatch (a missing or extra tensor,
a changed shape, a flipped bit, a truncated file, a step that disagrees with the optimizer's step count)
with one line naming the file: a corrupt state must never train on silently.

Writing goes through depthlens.io.atomic.atomic_dir (temp dir, then a recoverable two-rename swap), so a
kill at any instant leaves the previous or the new complete state, and `read_state` repairs an interrupted
swap before reading.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import DepthlensError
from ..io.atomic import atomic_dir, recover
from .distributed import DistInfo, barrier, full_state, load_full_state, unused_parameters

STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"
FORMAT = "depthlens resume state v2"


class StateError(DepthlensError):
    """A resume state that is incomplete, corrupt or inconsistent."""


def digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (dtype-agnostic: bf16 included)."""
    b = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(b.data).hexdigest()  # the array's buffer: no copy


def make_manifest(tensors: dict[str, torch.Tensor], step: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "step": step,
        "tensors": {
            k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."), "sha256": digest(v)}
            for k, v in sorted(tensors.items())
        },
    }


def _manifest_sha(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def write_state(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write the state directory atomically; `meta["step"]` is the step the state is at."""
    from safetensors.torch import save_file

    manifest = make_manifest(tensors, int(meta["step"]))
    header = {"format": FORMAT, "step": str(meta["step"]), "manifest_sha256": _manifest_sha(manifest)}
    with atomic_dir(path, overwrite=True, kinds=("resume state",), flag="resume") as tmp:
        save_file(tensors, str(tmp / STATE_TENSORS), metadata=header)
        data = json.dumps({**meta, "manifest": manifest}, indent=1, sort_keys=True) + "\n"
        with open(tmp / STATE_JSON, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp / STATE_TENSORS, "rb+") as f:
            os.fsync(f.fileno())


def has_state(path: Path) -> bool:
    """Is there a state at `path` (after repairing an interrupted swap)?"""
    recover(path)
    return (path / STATE_JSON).exists() or (path / STATE_TENSORS).exists()


def read_meta(path: Path) -> dict[str, Any]:
    """state.json, checked to be an object with a manifest (tensors not read)."""
    from ..io.files import read_json

    f = path / STATE_JSON
    if not os.path.lexists(f):
        raise StateError(f"{f}: missing (incomplete resume state; delete {path} or use resume=false)")
    meta = read_json(f, "the resume state", error=StateError, object_only=False)
    man = meta.get("manifest") if isinstance(meta, dict) else None
    if not isinstance(man, dict) or man.get("format") != FORMAT or not isinstance(man.get("tensors"), dict):
        raise StateError(
            f"{f}: no {FORMAT!r} manifest (written by an older depthlens or edited); delete {path} or use resume=false"
        )
    if not isinstance(meta.get("step"), int) or meta["step"] != man.get("step") or meta["step"] < 0:
        raise StateError(f"{f}: step {meta.get('step')!r} disagrees with the manifest's step {man.get('step')!r}")
    return meta


def read_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, meta) of a state directory, verified against its manifest."""
    from safetensors import SafetensorError, safe_open

    recover(path)
    meta = read_meta(path)
    man = meta["manifest"]
    f = path / STATE_TENSORS
    try:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            header = sf.metadata() or {}
            tensors = {k: sf.get_tensor(k) for k in sf.keys()}  # noqa: SIM118 (a safe_open handle, not a dict)
    except FileNotFoundError:
        raise StateError(f"{f}: missing (incomplete resume state)") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise StateError(f"{f}: unreadable (truncated or corrupt: {str(e).splitlines()[0][:120]})") from None
    if header.get("step") != str(meta["step"]) or header.get("manifest_sha256") != _manifest_sha(man):
        raise StateError(
            f"{f}: does not belong to {STATE_JSON} next to it (step {header.get('step')} vs "
            f"{meta['step']}, or a different manifest)"
        )
    want = man["tensors"]
    if set(tensors) != set(want):
        missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
        raise StateError(f"{f}: tensors differ from the manifest (missing {missing[:2]}, unexpected {extra[:2]})")
    for k, v in tensors.items():
        w = want[k]
        if list(v.shape) != w["shape"] or str(v.dtype).removeprefix("torch.") != w["dtype"]:
            raise StateError(
                f"{f}: tensor {k} is {str(v.dtype)}{list(v.shape)}, manifest says {w['dtype']}{w['shape']}"
            )
        if digest(v) != w["sha256"]:
            raise StateError(f"{f}: tensor {k} fails its checksum (corrupt resume state)")
    return tensors, meta


def check_complete(
    path: Path,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    model_shapes: dict[str, tuple[int, ...]],
    trainable: set[str],
    updated: set[str],
) -> None:
    """The state holds exactly this model's tensors and a coherent optimizer state at `meta["step"]`:
    after step 0, AdamW state for exactly the `updated` parameters (trainable ones that get a gradient)."""
    f = path / STATE_TENSORS
    have = {k[len("model/") :]: tuple(v.shape) for k, v in tensors.items() if k.startswith("model/")}
    if set(have) != set(model_shapes):
        missing, extra = sorted(set(model_shapes) - set(have)), sorted(set(have) - set(model_shapes))
        raise StateError(
            f"{f}: model tensors do not match the run's model (missing {missing[:2]}, unexpected {extra[:2]})"
        )
    for k, shape in model_shapes.items():
        if have[k] != tuple(shape):
            raise StateError(f"{f}: model tensor {k} has shape {list(have[k])}, the run's model needs {list(shape)}")
    optim: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            fqn, key = k[len("optim/") :].rsplit("/", 1)
            optim.setdefault(fqn, {})[key] = v
    step = meta["step"]
    if step > 0 and set(optim) != updated:
        missing, extra = sorted(updated - set(optim)), sorted(set(optim) - updated)
        raise StateError(
            f"{f}: optimizer state does not cover the model's parameters (missing {len(missing)} "
            f"e.g. {missing[:1]}, unexpected {extra[:2]})"
        )
    for fqn, st in optim.items():
        if fqn not in trainable:
            raise StateError(f"{f}: optimizer state for {fqn}, which is not a trainable parameter")
        if set(st) != {"step", "exp_avg", "exp_avg_sq"}:
            raise StateError(f"{f}: optimizer state of {fqn} is incomplete ({sorted(st)})")
        for key in ("exp_avg", "exp_avg_sq"):
            if tuple(st[key].shape) != tuple(model_shapes[fqn]):
                raise StateError(f"{f}: optimizer {key} of {fqn} has shape {list(st[key].shape)}")
    if optim and int(max(float(st["step"]) for st in optim.values())) != step:
        raise StateError(
            f"{f}: the optimizer has taken {int(max(float(s['step']) for s in optim.values()))} "
            f"steps but the state says step {step}"
        )
    if "rng/cpu" not in tensors:
        raise StateError(f"{f}: no RNG state")


# -------------------------------------------------------------------------------------------------
# a run's model, optimizer and RNG into and out of that format (every rank joins: FSDP gathers)


def save_state(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any], dist: DistInfo
) -> None:
    """Every rank joins the gather (FSDP); rank 0 writes <path>/ as a whole directory swap."""
    model_sd, optim_sd = full_state(model, optimizer)
    if not dist.is_main:
        barrier(dist)
        return
    tensors = {f"model/{k}": v.contiguous() for k, v in model_sd.items()}
    for fqn, st in optim_sd["state"].items():
        for key, v in st.items():
            tensors[f"optim/{fqn}/{key}"] = v.detach().cpu().contiguous() if torch.is_tensor(v) else torch.tensor(v)
    tensors["rng/cpu"] = torch.get_rng_state()
    if dist.device.type == "cuda":
        tensors["rng/cuda"] = torch.cuda.get_rng_state(dist.device)
    write_state(path, tensors, {**meta, "param_groups": optim_sd["param_groups"]})
    barrier(dist)


def load_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, dist: DistInfo) -> dict[str, Any]:
    """Restore model, optimizer and RNG from <path> after checking it against its manifest and against
    this run's model; returns the JSON metadata (step, trajectory, ...)."""
    tensors, meta = read_state(path)
    raw = getattr(model, "module", model)  # DDP wraps; FSDP2 keeps the module (and its global shapes)
    trainable = {n for n, p in raw.named_parameters() if p.requires_grad}
    updated = trainable - set(unused_parameters(raw, dist.device)) if meta.get("step") else trainable
    check_complete(path, tensors, meta, {k: tuple(v.shape) for k, v in raw.state_dict().items()}, trainable, updated)
    model_sd = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    state: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            fqn, key = k[len("optim/") :].rsplit("/", 1)
            state.setdefault(fqn, {})[key] = v
    load_full_state(model, optimizer, model_sd, {"state": state, "param_groups": meta["param_groups"]})
    torch.set_rng_state(tensors["rng/cpu"])
    if dist.device.type == "cuda" and "rng/cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng/cuda"], dist.device)
    return meta
