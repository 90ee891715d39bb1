"""device_map placement: a foreign model too large for one GPU, split over several by whole parts.

    p = resolve_device_map("auto", sizes)                           # balanced over the visible GPUs
    p = resolve_device_map({"embed": "cuda:0", "layers": ["cuda:0"] * 16 + ["cuda:1"] * 16, "head": "cuda:1"}, sizes)
    model.place(p)                                                  # HFLayeredModel moves each part there

The parts are the embedding, each decoder layer and the head (final norm + LM head). The adapter's
`run_layers` moves the residual state to the device of the layer that runs, and hands it back on the home
device of the position (so a swapped pair's rows stay together); rotary tables and masks are cached once per
device in the RunContext. Pipeline-style: one device computes at a time, nothing is overlapped.

"auto" puts the head on the embedding's device (the logits come back where the token ids are, and a tied head
shares the embedding's matrix anyway), then splits [embed + head, layer 0, ..., layer L−1], in model order, into
contiguous runs of near-equal parameter count (the split that minimises the largest device's share), one run
per visible CUDA device. An explicit map may put the head elsewhere (not with tied embeddings).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import DepthlensError


@dataclass(frozen=True)
class Placement:
    """Where each part of a layered model lives."""

    embed: torch.device  # token (and position) embeddings, rotary tables; token ids go here
    layers: tuple[torch.device, ...]  # decoder layer l's weights (and the home of position l's state)
    head: torch.device  # final norm + LM head; logits come back here

    @property
    def devices(self) -> list[torch.device]:
        """The distinct devices, in model order."""
        return list(dict.fromkeys([self.embed, *self.layers, self.head]))

    def as_dict(self) -> dict[str, Any]:
        """JSON form (provenance): {"embed": "cuda:0", "layers": [...], "head": "cuda:1"}."""
        return {"embed": str(self.embed), "layers": [str(d) for d in self.layers], "head": str(self.head)}


@dataclass(frozen=True)
class PartSizes:
    """Parameter counts of the parts, the input of "auto"."""

    embed: int
    layers: tuple[int, ...]
    head: int  # 0 when the LM head is tied to the embedding (it owns no matrix of its own)
    tied: bool = False


def contiguous_split(weights: Sequence[int], n_parts: int) -> list[int]:
    """Part index of each item: `weights` cut, in order, into at most `n_parts` contiguous runs, minimising the
    largest run's sum (exact DP, O(n²·k): n ≈ 100 parts, k ≤ 16 devices). Ties go to the earlier cut."""
    n = len(weights)
    k = max(1, min(n_parts, n))
    pre = [0]
    for w in weights:
        pre.append(pre[-1] + w)
    INF = float("inf")
    # best[j][i]: the smallest max-run sum splitting items[:i] into j runs; cut[j][i]: where run j starts
    best = [[INF] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for s in range(j - 1, i):
                v = max(best[j - 1][s], pre[i] - pre[s])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, s
    j = min(range(1, k + 1), key=lambda j: (best[j][n], -j))  # among optimal splits, the most devices (memory)
    out, i = [0] * n, n
    while j > 0:
        s = cut[j][i]
        out[s:i] = [j - 1] * (i - s)
        i, j = s, j - 1
    return out


def auto_placement(sizes: PartSizes, devices: Sequence[str | torch.device]) -> Placement:
    """Balanced contiguous placement of [embed, layer 0..L−1, head] over `devices` (see module docstring)."""
    devs = [torch.device(d) for d in devices]
    if not devs:
        raise DepthlensError(
            "device_map='auto' needs at least one visible CUDA device (found none); "
            "pass an explicit map or use --device"
        )
    part = contiguous_split([sizes.embed + sizes.head, *sizes.layers], len(devs))
    embed = devs[part[0]]
    return Placement(embed, tuple(devs[p] for p in part[1:]), embed)


def visible_gpus() -> list[str]:
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def resolve_device_map(
    spec: str | dict[str, Any] | Placement, sizes: PartSizes, devices: Sequence[str] | None = None
) -> Placement:
    """A Placement from "auto" (over `devices`, default the visible GPUs), one device name for everything, or
    a dict {"embed": dev, "layers": [dev per layer], "head": dev}. DepthlensError (one line) when it does not fit
    the model."""
    L = len(sizes.layers)
    if isinstance(spec, Placement):
        p = spec
    elif spec == "auto":
        return auto_placement(sizes, visible_gpus() if devices is None else devices)
    elif isinstance(spec, str):
        d = _device(spec, "device_map")
        p = Placement(d, (d,) * L, d)
    elif isinstance(spec, dict):
        from ..schema import validate

        checked: dict[str, Any] = validate(_map_schema(), spec, "device_map").model_dump()  # keys, types, device names
        spec = checked  # (a typed name: the dump is Any, which would leave `spec` its declared union)
        layers = spec["layers"]
        if isinstance(layers, str):
            layers = [layers] * L
        if not isinstance(layers, (list, tuple)) or len(layers) != L:
            raise DepthlensError(
                f"device_map['layers'] must name one device per layer ({L}), got "
                f"{len(layers) if isinstance(layers, (list, tuple)) else layers!r}"
            )
        p = Placement(
            _device(spec["embed"], "embed"),
            tuple(_device(x, f"layers[{i}]") for i, x in enumerate(layers)),
            _device(spec["head"], "head"),
        )
    else:
        raise DepthlensError(f"device_map must be 'auto', a device name or a dict, got {type(spec).__name__}")
    if sizes.tied and p.head != p.embed:
        raise DepthlensError(
            f"the LM head is tied to the embedding: device_map must put both on one device "
            f"(embed {p.embed}, head {p.head})"
        )
    return p


def _device(x: Any, where: str) -> torch.device:
    try:
        d = torch.device(x if not isinstance(x, int) else f"cuda:{x}")
    except (RuntimeError, TypeError):
        raise DepthlensError(f"device_map {where}: {x!r} is not a device name") from None
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda:0")  # one name per device, so per-device caches do not hold two copies
    return d


def move(x: Any, dev: torch.device) -> Any:
    """`x` with every tensor inside (tuples, lists, dicts) on `dev`; anything else as it is."""
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, (tuple, list)):
        return type(x)(move(v, dev) for v in x)
    if isinstance(x, dict):
        return {k: move(v, dev) for k, v in x.items()}
    return x


DEVICE_NAME = r"^(cpu|mps|meta|cuda(:\d{1,4})?)$"  # meta: shapes only (tests, planning)


def parse_device_map(text: str | None) -> str | dict[str, Any] | None:
    """The CLI's --device-map: 'auto', a device name, or the dict as JSON (inline or a .json file path), checked
    by the schema layer and against the devices this machine has, before any model is read."""
    if text is None or text in ("auto",):
        return text
    from ..io.files import loads_json, read_json
    from ..schema import validate

    if text.lstrip().startswith("{") or text.endswith(".json"):
        raw = (
            read_json(text, "a --device-map", object_only=False)
            if text.endswith(".json")
            else loads_json(text, "--device-map", "the map")
        )
        where = text if text.endswith(".json") else "--device-map"
        checked: dict[str, Any] = validate(_map_schema(), raw, where, usage=True).model_dump(exclude_unset=True)
        out: str | dict[str, Any] = checked
        names = [
            checked["embed"],
            checked["head"],
            *([checked["layers"]] if isinstance(checked["layers"], str) else checked["layers"]),
        ]
    else:
        import re

        from ..errors import SchemaError

        if not re.match(DEVICE_NAME, text):
            raise SchemaError(
                f"expected auto, cpu, mps, cuda, cuda:N or a JSON map {{embed, layers, head}}, got "
                f"{text[:60]!r}{f' ... ({len(text):,} characters)' if len(text) > 60 else ''}",
                where="--device-map",
                usage=True,
            )
        out, names = text, [text]
    for name in dict.fromkeys(names):
        _check_present(name if isinstance(name, str) else f"cuda:{name}")
    return out


def _check_present(name: str) -> None:
    """DepthlensError (one line) when this machine has no such device (cuda:7 on a CPU machine)."""
    d = torch.device(name)
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (d.index or 0) >= n:
            raise DepthlensError(f"--device-map names {name}, but this machine has {n} visible CUDA device(s)")
    if d.type == "mps" and not torch.backends.mps.is_available():
        raise DepthlensError("--device-map names mps, which this machine does not have")


@functools.cache
def _map_schema() -> Any:
    """{"embed": dev, "layers": dev or [dev per layer], "head": dev}: device names only."""
    import re
    from typing import Annotated

    from pydantic import AfterValidator, BaseModel, ConfigDict

    from ..schema import Check

    def device_name(x: Any) -> bool:  # a name, or a CUDA index (the Python API's int)
        return bool(re.match(DEVICE_NAME, x)) if isinstance(x, str) else isinstance(x, int) and x >= 0

    Dev = Annotated[str | int, AfterValidator(Check(device_name, "a device name (cpu, mps, cuda, cuda:N)"))]

    class DeviceMap(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        embed: Dev  # token embeddings, rotary tables: where token ids go
        layers: Dev | list[Dev]  # one device for all layers, or one per layer (checked against the model later)
        head: Dev  # final norm + LM head: where the logits come back

    return DeviceMap
