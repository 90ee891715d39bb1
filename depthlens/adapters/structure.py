"""A foreign model's residual design, read from its block structure instead of assumed from its family.

One forward of three tokens records the order in which a decoder block calls its direct children. Children
whose class is a normalisation (`*Norm*`) are norms; children with parameters otherwise are sublayers
(attention or MLP). The design follows from where the norms sit around the two sublayers:

    norm attn | norm mlp                   Pre-LN        (LLaMA, Qwen2, Mistral, GPT-2)
    norm attn norm | norm mlp norm         Sandwich-LN   (Gemma 2/3: pre- and post-norm around each sublayer)
    attn norm | mlp norm                   other (Post-LN: a norm after each sublayer, none before)
    anything else                          other (<the call order>)

Only Pre-LN and Sandwich-LN are designs of the ten; anything else is labelled "other (...)" so no report
calls a block something it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..designs import DESIGNS

if TYPE_CHECKING:  # typing only: transformers is imported where a foreign model is loaded
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class ResidualStructure:
    slug: str  # a design slug of the ten ("preln", "sandwich") or "other"
    name: str  # what reports print: "Pre-LN", "Sandwich-LN" or "other (...)"
    block_order: str  # the recorded call order of one block, e.g. "norm attn norm | norm mlp norm"

    def attrs(self) -> dict[str, str]:
        return {"residual_design": self.slug, "residual_design_name": self.name, "block_order": self.block_order}


def _kind(name: str, module: nn.Module) -> str | None:
    if "norm" in type(module).__name__.lower():
        return "norm"
    if not any(True for _ in module.parameters()):
        return None  # dropout, activations, rotary tables: not a sublayer
    return "attn" if "attn" in name.lower() or "attention" in name.lower() else "mlp"


def classify(order: list[str]) -> tuple[str, str]:
    """(slug, name) for a block's call order of norms and sublayers (see the module docstring). Consecutive
    calls of the same sublayer kind are one sublayer (OPT's MLP is two children, fc1 then fc2)."""
    order = [k for i, k in enumerate(order) if k == "norm" or i == 0 or order[i - 1] != k]
    subs = [i for i, k in enumerate(order) if k != "norm"]
    if len(subs) != 2:
        return "other", f"other ({' '.join(order) or 'no sublayers found'})"
    before, between, after = subs[0], subs[1] - subs[0] - 1, len(order) - subs[1] - 1
    if (before, between, after) == (1, 1, 0):
        return "preln", DESIGNS["preln"].name
    if (before, between, after) == (1, 2, 1):
        return "sandwich", DESIGNS["sandwich"].name
    if (before, between, after) == (0, 1, 1):
        return "other", "other (Post-LN: a norm after each sublayer, none before)"
    return "other", f"other ({' '.join(order)})"


def residual_structure(hf_model: PreTrainedModel, block: nn.Module) -> ResidualStructure:
    """Run `hf_model` on three tokens and classify `block` (one of its decoder layers) by its call order."""
    order: list[str] = []
    handles = []
    for name, child in block.named_children():
        kind = _kind(name, child)
        if kind is not None:
            handles.append(child.register_forward_pre_hook(lambda m, a, k=kind: order.append(k)))
    try:
        dev = cast(torch.Tensor, hf_model.get_input_embeddings().weight).device
        with torch.no_grad():
            hf_model(input_ids=torch.tensor([[1, 2, 3]], device=dev), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    order = [k for i, k in enumerate(order) if k == "norm" or i == 0 or order[i - 1] != k]
    slug, name = classify(order)  # the block runs once per forward, so `order` is one call of it
    text = " ".join(order)
    if slug != "other":
        split = [i for i, k in enumerate(order) if k != "norm"][0] + (2 if slug == "sandwich" else 1)
        text = " ".join(order[:split]) + " | " + " ".join(order[split:])
    return ResidualStructure(slug, name, text)


def structure_of(model: Any) -> ResidualStructure:
    """The residual structure of a depthlens adapter model (hand-mapped or generic-blocks)."""
    return residual_structure(model.hf, model.layers[0])
