"""AdapterSpec: where a foreign decoder keeps its pieces, and how its weight names map to depthlens names.

One small frozen record per model family (torchtitan's `StateDictAdapter` idea, without the class
hierarchy). `HFLayeredModel` (hf.py) reads only this record, so adding a family is one file with one
`AdapterSpec(...)` and one explicit key map; nothing else changes.

Key maps use `{}` for the layer index, in both directions:

    "model.layers.{}.self_attn.q_proj.weight": "blocks.{}.attn.fn.q_proj.weight"

A value of `None` marks an HF tensor with no depthlens counterpart (Qwen2 q/k/v biases, Qwen3 q/k norms):
such a checkpoint can be analysed through the adapter but not imported as a native depthlens model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import CheckpointError

if TYPE_CHECKING:
    from transformer_lens import HookedRootModule

KeyMap = Mapping[str, "str | None"]


@dataclass(frozen=True)
class AdapterSpec:
    """Module paths of one HF `*ForCausalLM` family (dotted, relative to the `*ForCausalLM` module)."""

    family: str  # short name used in metadata and docs: "llama", "qwen2", "gpt2", ...
    model_types: tuple[str, ...]  # config.json `model_type` values this spec serves
    blocks: str  # nn.ModuleList of decoder layers, e.g. "model.layers"
    embed: str  # token embedding (V, d)
    final_norm: str  # norm applied to h_L before the LM head
    lm_head: str  # (d -> V) projection
    # inside one decoder layer: the two Pre-LN sublayers, h += attn(attn_norm(h)); h += mlp(mlp_norm(h))
    attn_norm: str
    attn: str
    mlp_norm: str
    mlp: str
    rotary: str | None = None  # RoPE module, called as rotary(x, position_ids) -> (cos, sin), each (1, T, dh)
    pos_embed: str | None = None  # learned absolute position embedding (GPT-2 `wpe`)
    residual: str = "hidden_states"  # how to read the residual: the (B, T, d) tensor passed between layers
    key_map: KeyMap = field(default_factory=dict)  # HF key -> depthlens key (None: no counterpart)

    @property
    def importable(self) -> bool:
        """True if every HF tensor has a depthlens counterpart (the checkpoint imports as `preln`)."""
        return bool(self.key_map) and all(v is not None for v in self.key_map.values())


def resolve(root: nn.Module, path: str) -> nn.Module:
    """The submodule at a dotted path ("model.layers")."""
    return root.get_submodule(path)


# --- weight-key maps ------------------------------------------------------------------------------------


@cache
def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\{\}", r"(\d+)") + "$")


def map_key(key: str, table: KeyMap) -> tuple[bool, str | None]:
    """(matched, mapped key) for one state-dict key under a `{}`-templated table."""
    for src, dst in table.items():
        m = _pattern(src).match(key)
        if m:
            return True, (None if dst is None else dst.replace("{}", m.group(1)) if m.groups() else dst)
    return False, None


def invert(table: KeyMap) -> dict[str, str]:
    """depthlens key -> HF key (entries without a counterpart dropped)."""
    return {v: k for k, v in table.items() if v is not None}


def rename(state: Mapping[str, torch.Tensor], table: KeyMap, *, what: str) -> dict[str, torch.Tensor]:
    """Rename every key through `table`. Raises CheckpointError on a key the table does not know, or one
    that has no counterpart (None), naming the first offender."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        ok, new = map_key(k, table)
        if not ok:
            raise CheckpointError(f"{what}: tensor {k!r} is not in the {what} key map")
        if new is None:
            raise CheckpointError(f"{what}: tensor {k!r} has no depthlens counterpart (not a plain Pre-LN LLaMA)")
        out[new] = v
    return out


# --- what an adapted model exposes as its config ---------------------------------------------------------


@dataclass(frozen=True)
class ForeignConfig:
    """The few ModelConfig fields the engine reads (vocab and length checks, provenance) for an HF model."""

    family: str
    model_type: str
    n_layer: int
    d_model: int
    vocab_size: int
    max_seq_len: int
    hf_config: dict[str, Any]  # the full HF config (JSON-safe)
    arch: str = "preln"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _lens_config(**kw: Any) -> Any:
    from transformer_lens.config import TransformerLensConfig

    return TransformerLensConfig(d_head=kw["d_model"] // kw["n_heads"], **kw)


def setup_own_hooks(root: HookedRootModule, inner: str = "hf") -> None:
    """HookedRootModule.setup over a wrapper's own modules and hook points, skipping the wrapped model under
    `root.<inner>` (an HF model's, or a described user module's, names stay untouched)."""
    from transformer_lens.hook_points import HookPoint  # heavy: only when a wrapper is built

    root.mod_dict, root.hook_dict = {}, {}
    for name, module in root.named_modules():
        if name in ("", inner) or name.startswith(inner + "."):
            continue
        module.name = name
        root.mod_dict[name] = module
        if isinstance(module, HookPoint):
            root.hook_dict[name] = module
