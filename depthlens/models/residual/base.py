"""The contract between the shared backbone and a residual design.

A residual design is two things:

* a **Design** (stateless strategy): how the embedding becomes the residual *state*, what the residual
  *view* `[B, T, d]` of a state is, how a state becomes the final hidden `h_L`, and which routers to build;
* **Routers** (`nn.Module`, one per sublayer, plus an optional final one): the design's own parameters,
  which decide what a sublayer reads from the state and how its output is written back.

A state is a `dict[str, Tensor]` whose tensors all have the batch as dim 0, so the analysis engine can
stack interventions along the batch (`state_cat`), branch from a cached prefix (`state_select`) and never
recompute blocks below the intervened layer.

`keep` masks implement skips: `keep[b, t] = 0` drops a sublayer's write at (b, t). Designs interpret
"drop the write" as docs/concepts.md#notation defines (e.g. HC keeps its stream mixing, AttnRes removes the
source from later depth softmaxes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..config import ModelConfig
from ..readouts import readout_key

if TYPE_CHECKING:  # backbone imports this module at run time
    from ..backbone import Sublayer

State = dict[str, torch.Tensor]
Branch = Callable[..., torch.Tensor]  # branch(x, **kw) -> y: hooks + body of one sublayer


def state_cat(states: list[State]) -> State:
    """Concatenate states along the batch."""
    return {k: torch.cat([s[k] for s in states], 0) for k in states[0]}


def state_select(state: State, index: torch.Tensor | slice) -> State:
    """Rows `index` of every tensor of the state (an index tensor follows each tensor's device: a model placed
    over several GPUs hands states back on the device of the layer that produced them)."""
    if isinstance(index, torch.Tensor):
        return {k: v[index.to(v.device)] for k, v in state.items()}
    return {k: v[index] for k, v in state.items()}


def state_repeat(state: State, n: int) -> State:
    """Repeat the batch n times (block-wise: [s, s, ..., s])."""
    return {k: v.repeat(n, *([1] * (v.dim() - 1))) for k, v in state.items()}


@dataclass
class RunContext:
    """Per-forward constants and the optional readout recorder."""

    cos: torch.Tensor  # (T, head_dim) RoPE table
    sin: torch.Tensor
    record: dict[str, Any] | None = None  # when not None, routers store their mixing objects here
    extras: dict[Any, Any] = field(default_factory=dict)  # str keys here; adapters cache by tuple keys too

    def put(self, name: str, value: Any, sublayer: int | None = None, *, final: bool = False) -> None:
        """Record readout `name` of sublayer `sublayer` (or of the final router, or model-level) under its
        `readout_key`."""
        if self.record is not None:
            key = readout_key(name, sublayer, final=final)
            self.record[key] = value.detach() if isinstance(value, torch.Tensor) else value


def apply_keep(y: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Zero the write y (B, T, ...) where keep (B, T) is 0."""
    if keep is None:
        return y
    k = keep.to(y.dtype)
    return y * k.view(*k.shape, *([1] * (y.dim() - 2)))


def keep_input(out: torch.Tensor, inp: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """A whole block skipped where keep (B, T) is 0: its output `out` (B, T, ...) there replaced by its input `inp`
    (the generic-blocks and described paths, which cannot reach inside a block)."""
    k = keep.to(out.device, out.dtype).view(*keep.shape, *([1] * (out.dim() - 2)))
    return k * out + (1 - k) * inp.to(out.device)


@dataclass(frozen=True)
class SublayerCall:
    """What a router needs to run one sublayer (the record `Block.forward` hands every router).

    branch: callable x -> y running the body (with hooks); extra kwargs go to the body
    sub:    the body module (`Sublayer`), for designs that reuse its norm (DeepNorm)
    j:      sublayer position 0..2L-1 (2l = attention, 2l+1 = MLP of layer l) where this runs
    pos:    layer position l where this runs (differs from the router's home only under swaps)
    ctx:    the forward's RunContext (RoPE tables, readout recorder)
    keep:   (B, T) mask, 0 = drop this sublayer's write at that token, or None
    carry:  the layer's accumulated *update* u_l so far (None before the first sublayer)
    """

    branch: Branch
    sub: nn.Module
    j: int
    pos: int
    ctx: RunContext
    keep: torch.Tensor | None = None
    carry: torch.Tensor | None = None


class Router(nn.Module):
    """One sublayer's residual logic. Subclasses implement `forward`.

    forward(state, call: SublayerCall) -> (state, carry): the residual state before the sublayer in, the state
    after it and the layer's update so far (`call.carry` plus this sublayer's contribution) out.
    """

    def forward(self, state: State, call: SublayerCall) -> tuple[State, torch.Tensor]:
        raise NotImplementedError

    def readout(self) -> dict[str, Any]:
        """Static mixing object of this router (fixed scalars, static parts)."""
        return {}


class Design:
    """Stateless strategy of a residual family. One instance per model."""

    slug: str = ""
    editable_view: bool = True  # whether hook_resid_* edits write back into the state
    view_name: str = "residual stream h"  # what hook_resid_* exposes, for `depthlens hooks`
    multi_stream: bool = False  # state holds n streams (B, T, n, d): blocks get hook_streams_*
    branch_prenorm: bool = True  # each body normalises its input (blocks get ln1/ln2 hook sites)
    # Whether the branch pre-norms read the residual view itself (input of ln1 == hook_resid_pre, of ln2 ==
    # hook_resid_mid) and the final norm reads the view after the last layer: only then do TransformerLens'
    # LN-scaled stacks (apply_ln_to_stack, accumulated_resid/decompose_resid with apply_ln) mean what they say.
    norm_reads_view: bool = True
    final_reads_view: bool = True

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    # --- construction -----------------------------------------------------------------------------
    def make_router(self, j: int) -> Router:
        raise NotImplementedError

    def make_final_router(self) -> nn.Module | None:
        return None

    def post_norm_on_branch(self) -> bool:
        return False

    def make_sublayer(self, kind: str) -> Sublayer:
        """The body of one sublayer (pre-norm + Attn/MLP [+ post-norm]); MoDA overrides the attention."""
        from ..backbone import Sublayer

        return Sublayer(self.cfg, kind, post_norm=self.post_norm_on_branch())

    def init_weights(self, model: nn.Module) -> None:
        """Design-specific re-initialisation after the common one (DeepNorm's beta, ...)."""

    # --- state --------------------------------------------------------------------------------------
    def init_state(self, h0: torch.Tensor) -> State:  # h0: (B, T, d)
        return {"h": h0}

    def view(self, state: State) -> torch.Tensor:
        """Residual view (B, T, d) of a state between layers (hook_resid_pre/post)."""
        return state["h"]

    def set_view(self, state: State, value: torch.Tensor) -> State:
        return {**state, "h": value}

    def streams(self, state: State) -> torch.Tensor:
        """Multi-stream designs: the streams (B, T, n, d)."""
        raise NotImplementedError

    def set_streams(self, state: State, value: torch.Tensor) -> State:
        raise NotImplementedError

    def final(self, state: State, final_router: nn.Module | None, ctx: RunContext) -> torch.Tensor:
        """h_L (B, T, d), before the final norm."""
        return state["h"]

    def update_norm_dims(self) -> int:
        """Number of trailing dims of an update u_l that a Frobenius norm runs over (1: d; 2: n, d)."""
        return 1

    # --- readouts ------------------------------------------------------------------------------------
    def depth_mixing(self, record: dict[str, Any], n_sub: int) -> torch.Tensor | None:
        """M[i -> j]: weight of source i (0 = embedding, i >= 1 = sublayer i) in the input of sublayer j.

        Returns (B, T, 2L+1 sources, 2L+1 destinations) where destination 2L is the final readout, or None
        if the design has no residual mix (MoDA). Entries with i >= j+1 are zero.
        """
        return None
