"""The interface every analysed model exposes: native DepthModels and adapters for foreign checkpoints.

The diagnostics engines (depthlens.diagnostics) only talk to this protocol, so a Hugging Face LLaMA/Qwen/GPT-2
model wrapped by an adapter gets every diagnostic for free.

    ctx   = m.context(T)                     # RoPE tables etc. for sequence length T
    state = m.embed(tokens, ctx)             # state before layer 0 (dict of batch-first tensors)
    state = m.run_layers(state, ctx, start, stop, keep={l: (B, T) mask}, unit="block",
                         order=[...], swap="body", on_layer=fn(pos, state_after, update))
    logits = m.head(state, ctx)              # (B, T, V)
    u = m.unembedding()                      # optional: the head split at its one matmul, or None
    m.design.view(state)                     # residual view (B, T, d) of a between-layer state
    m.design.update_norm_dims()              # trailing dims of an update u_l that its norm runs over
    rec = m.readouts(tokens)                 # optional: a `Readouts` of the routers' mixing objects

What a model offers beyond the core is a *capability* (`capabilities(model)`): a diagnostic declares the ones it
needs (`registry.Diagnostic.needs`) and is refused with one line on a model without them, whatever the model's
origin (native, Hugging Face, GGUF).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from .readouts import Readouts
from .residual.base import RunContext, State

__all__ = [
    "CAPABILITIES",
    "LayeredLM",
    "Readouts",
    "Unembedding",
    "capabilities",
    "LayerLoop",
    "LayerStep",
    "OnLayer",
    "check_run_layers_args",
    "same_logits",
    "unembedding_of",
]

# what a model may offer; a diagnostic names the ones it needs (registry.Diagnostic.needs)
CAPABILITIES: dict[str, str] = {
    "layers": "the layered-LM protocol: context, embed, run_layers (skips, orders, on_layer), head",
    "readouts": "readouts(tokens) -> Readouts: the routers' mixing objects of one forward",
    "depth_mixing": "depth_mixing(tokens) -> M[i -> j] per token (or None for a design without a residual mix)",
    "unembedding": "unembedding() -> Unembedding: the head split at its one matmul",
}


UNITS = ("block", "attn", "mlp")


def check_run_layers_args(
    n_layer: int, unit: str, swap: str, order: list[int] | None, units: tuple[str, ...] = UNITS
) -> None:
    """The argument contract of `run_layers`, shared by DepthModel and every adapter (one place, one message)."""
    if unit not in units:
        raise ValueError(f"unit must be one of {', '.join(map(repr, units))}, got {unit!r}")
    if swap not in ("body", "all"):
        raise ValueError(f"swap must be 'body' or 'all', got {swap!r}")
    if order is not None and sorted(order) != list(range(n_layer)):
        raise ValueError(f"order must be a permutation of range({n_layer}), got {order}")


OnLayer = Callable[[int, State, torch.Tensor], None]  # on_layer(pos, state after pos, the layer's update)


@dataclass(frozen=True)
class LayerStep:
    """One position of `run_layers`: the weights of layer `src` run at position `pos`."""

    pos: int
    src: int  # order[pos] (== pos without a reordering)
    keep: torch.Tensor | None  # (B, T): 0 = skip the write(s) at that token; None = keep all
    unit: str  # which sublayer(s) `keep` masks: "block" | "attn" | "mlp"
    swap: str  # "body": routers stay at their position; "all": they move with the body
    want_update: bool  # the caller streams the update (on_layer), so compute it

    @property
    def keep_attn(self) -> torch.Tensor | None:
        return self.keep if self.unit in ("block", "attn") else None

    @property
    def keep_mlp(self) -> torch.Tensor | None:
        return self.keep if self.unit in ("block", "mlp") else None


class LayerLoop:
    """`run_layers` as every model runs it: the argument contract, the loop over positions with the weights of
    layer order[pos] at position pos, that position's keep mask, and the streamed readout. A model supplies one
    position (`run_position`) and the units it can mask (`units`, with `unit_refusal` saying why not)."""

    unit_refusal = ""  # the message for a unit in UNITS this model cannot mask ("" = the generic one); {unit}

    @property
    def n_layer(self) -> int:
        raise NotImplementedError

    @property
    def units(self) -> tuple[str, ...]:
        """The units `run_layers` can skip (default: blocks, attention and MLP sublayers)."""
        return UNITS

    def run_position(self, state: State, ctx: RunContext, step: LayerStep) -> tuple[State, torch.Tensor | None]:
        """Layer `step.src`'s weights at position `step.pos`: (the state after it, its update when
        `step.want_update`, else None)."""
        raise NotImplementedError

    def run_layers(
        self,
        state: State,
        ctx: RunContext,
        start: int = 0,
        stop: int | None = None,
        *,
        keep: dict[int, torch.Tensor] | None = None,
        unit: str = "block",
        order: list[int] | None = None,
        swap: str = "body",
        on_layer: OnLayer | None = None,
    ) -> State:
        """Run layer positions start..stop-1 from `state` (the state *before* layer `start`).

        keep:  {layer position: (B, T) mask}, 0 = skip that layer's write at that token (never use t = 0
               for diagnostics: the caller decides). unit: which sublayer(s) the mask applies to.
        order: order[p] = which layer's weights run at position p (a permutation of range(L)).
        swap:  "body" keeps routers at their position; "all" moves them with the body.
        on_layer(pos, state_after, update): streamed readout, so no full activation cache is needed.
        """
        if unit in UNITS and unit not in self.units and self.unit_refusal:
            raise ValueError(self.unit_refusal.format(unit=unit))
        check_run_layers_args(self.n_layer, unit, swap, order, units=self.units)
        keep = keep or {}
        for pos in range(start, self.n_layer if stop is None else stop):
            src = order[pos] if order is not None else pos
            step = LayerStep(pos, src, keep.get(pos), unit, swap, want_update=on_layer is not None)
            state, update = self.run_position(state, ctx, step)
            if on_layer is not None:
                assert update is not None
                on_layer(pos, state, update)
        return state


def same_logits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two computed logit tensors agree up to the rounding of their dtype (not bit for bit).

    Two batch rows, or one forward at 1 and at 2 threads, may differ in their last bits (kernels split the
    work differently), so a decision such as "the model is causal" must not rest on `torch.equal`.
    max |a - b| <= sqrt(eps) * max(1, max |a|), eps of the coarser dtype (fp32: 3.5e-4 relative to the
    largest logit, bf16: 0.09): a few units in the last place of the largest logit, far below what a later
    token changes in a non-causal model. Shapes must match; NaN never matches; equal infinities do.
    """
    if a.shape != b.shape:
        return False
    eps = max(
        torch.finfo(a.dtype).eps if a.is_floating_point() else 0.0,
        torch.finfo(b.dtype).eps if b.is_floating_point() else 0.0,
    )
    x, y = a.detach().double(), b.detach().to(device=a.device).double()
    if bool(torch.isnan(x).any() or torch.isnan(y).any()):
        return False
    same_inf = torch.isinf(x) & (x == y)
    if bool((torch.isinf(x) ^ torch.isinf(y)).any() or ((torch.isinf(x) & ~same_inf).any())):
        return False
    diff = torch.where(same_inf, torch.zeros_like(x), x - y).abs()
    scale = torch.where(torch.isinf(x), torch.zeros_like(x), x).abs().max() if x.numel() else x.new_zeros(())
    return bool(diff.max() <= eps**0.5 * max(1.0, float(scale))) if x.numel() else True


@dataclass(frozen=True)
class Unembedding:
    """The LM head split at its one matmul: head(state) == F.linear(hidden(state, ctx), weight, bias).

    A model offers it only when that identity is exact (no soft-capping or other logit transform after the
    projection), so the analysis can walk the vocabulary in chunks of `weight` rows instead of materialising
    (rows, V) logits (depthlens.diagnostics.vocab).
    """

    hidden: Callable[[State, RunContext], torch.Tensor]  # state -> (B, T, d): final norm applied
    weight: torch.Tensor  # (V, d)
    bias: torch.Tensor | None  # (V,) or None


def head_hooked(module: Any) -> bool:
    """Whether a PyTorch forward hook or pre-hook sits on an LM head module: F.linear on its weight (the split
    head, `Unembedding`) would bypass it, so a hooked head is never split."""
    return bool(getattr(module, "_forward_hooks", None) or getattr(module, "_forward_pre_hooks", None))


def unembedding_of(model: Any) -> Unembedding | None:
    """The model's `Unembedding`, or None when it has none (its head is then only callable whole)."""
    fn = getattr(model, "unembedding", None)
    return fn() if callable(fn) else None


@runtime_checkable
class LayeredLM(Protocol):
    design: Any  # has .slug, .view(state), .update_norm_dims(), .multi_stream, .editable_view

    @property
    def n_layer(self) -> int: ...

    def context(self, seq_len: int, *, record: bool = False, device: torch.device | None = None) -> RunContext: ...

    def embed(self, tokens: torch.Tensor, ctx: RunContext) -> State: ...

    def run_layers(
        self,
        state: State,
        ctx: RunContext,
        start: int = 0,
        stop: int | None = None,
        *,
        keep: dict[int, torch.Tensor] | None = None,
        unit: str = "block",
        order: list[int] | None = None,
        swap: str = "body",
        on_layer: Any = None,
    ) -> State: ...

    def final_hidden(self, state: State, ctx: RunContext) -> torch.Tensor: ...

    def head(self, state: State, ctx: RunContext) -> torch.Tensor: ...


def capabilities(model: Any) -> frozenset[str]:
    """The `CAPABILITIES` `model` offers (checked by attribute, so adapters and native models are treated alike)."""
    have = set()
    if all(callable(getattr(model, m, None)) for m in ("context", "embed", "run_layers", "head")):
        have.add("layers")
    for name in ("readouts", "depth_mixing", "unembedding"):
        if callable(getattr(model, name, None)):
            have.add(name)
    return frozenset(have)
