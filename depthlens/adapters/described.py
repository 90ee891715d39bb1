"""Your own residual design, analysed in place: a model described by its embed, blocks and head (docs/own-model.md).

    model = depthlens.wrap(net, embed=net.embed, blocks=net.blocks, head=net.head)        # one stream, Pre-LN-like
    model = depthlens.wrap(net, embed=..., blocks=..., head=..., view=lambda x: x.sum(-2),  # HC: n streams
                           sublayers=lambda b: (b.attn, b.mlp), mixing=my_maps, design="my_hc")

The user names what only they know (`Description`); depthlens derives the rest of the layered-LM protocol
(`models.protocol.LayeredLM`): keep masks, orders, `on_layer`, sublayer units, readouts, placement.

A *user state* is what `embed` returns and every block takes and returns: a tensor (B, T, ...) or a tuple / dict
of such tensors (batch first, then positions). Inside depthlens it is a `State` dict (`{"h": x}` for a tensor,
`{"s0": .., "s1": ..}` for a tuple, the user's keys for a dict), so the engines' batching (`state_cat`,
`state_select`, `state_repeat`) works on it unchanged.

Interventions (docs/own-model.md#semantics):

* skip (keep = 0 at token (b, t)): with `sublayers`, the outputs of the block's writers are zeroed at those
  tokens by forward hooks (unit "block": every writer; "attn": the first; "mlp": the second) and the block runs
  otherwise as written (HC/mHC keep their stream mixing: native `multistream_skip="mix"`; AttnRes writes a
  zero value: native `attnres_skip="zero_value"`; Block AttnRes adds nothing to the partial); without
  `sublayers`, the block's input passes through as its output there (every tensor of the state).
* order / swap: block `order[p]` runs at position p, whole (its mixing moves with it: native `swap="all"`);
  `swap="body"` means the same here, since a described block has no separate routing parameters.
* the update u_l handed to `on_layer`: with stream maps (`mixing` gives `res_map` per sublayer; the state's first
  tensor holds the streams X (B, T, n, d)) u_l = X_{l+1} - R_{2l+1} R_{2l} X_l, normed over (n, d), native HC/mHC's
  update; otherwise u_l = view(state_{l+1}) - view(state_l) (B, T, d): h_{l+1} - h_l for one stream, v_2l + v_2l+1
  for AttnRes (the view is the embedding plus every write), native's update in both cases.

Bad descriptions are refused with one line (`DescriptionError`) when `wrap` runs them once on a probe batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from ..data.shards import sha256_file  # the one streamed file hash
from ..errors import DepthlensError
from ..models.hook_contract import fire_read_only
from ..models.protocol import LayerLoop, LayerStep, same_logits
from ..models.readouts import Readouts, readout_key, sublayer_label
from ..models.residual.base import Design, RunContext, State, apply_keep, keep_input
from .base import _lens_config, setup_own_hooks
from .placement import Placement, move
from .userref import PICKLE_HINT, Ref, pair_weights, parse_ref

UserState = Any  # torch.Tensor | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]
Mix = Mapping[str, Any]

__all__ = [
    "DescribedModel",
    "Description",
    "DescriptionError",
    "Ref",
    "open_described",
    "pair_weights",
    "parse_ref",
    "wrap",
]


class DescriptionError(DepthlensError):
    """A model description that depthlens cannot analyse honestly (one line; the CLI exits 1)."""


@dataclass(frozen=True)
class Description:
    """What the user names about their model; everything else is derived (docs/own-model.md).

    embed:     tokens (B, T) long -> state (a tensor (B, T, ...), or a tuple/dict of them)
    blocks:    the ordered blocks; block(state) -> state of the same structure and shapes
    head:      state after the last block -> logits (B, T, V)
    view:      state -> the residual view (B, T, d); None: the state itself (one tensor (B, T, d))
    sublayers: block -> its writers (attention, MLP), whose outputs a skip zeroes; None: a skip passes the
               block's input through
    mixing:    mixing(block) -> one mapping per writer of the block's last call (stream designs: "res_map"
               (B, T, n, n) [dest, source], "pre", "post" (B, T, n); AttnRes: "alpha" (B, T, S) [+
               "source_labels", "self_weight", "embedding_weight"]); mixing(None) -> the final readout's
               mapping (AttnRes: "alpha" of the output operator; streams: optional "collapse" (n,)), or {}
    design:    the name in tables and provenance
    final:     state -> h_L (B, T, d), the head's input before its final norm; None: the view
    max_seq_len: the longest sequence the model takes; None: no limit of its own
    """

    embed: Callable[[torch.Tensor], UserState]
    blocks: Sequence[nn.Module]
    head: Callable[[UserState], torch.Tensor]
    view: Callable[[UserState], torch.Tensor] | None = None
    sublayers: Callable[[nn.Module], Sequence[nn.Module]] | None = None
    mixing: Callable[[nn.Module | None], Any] | None = None
    design: str = "custom"
    final: Callable[[UserState], torch.Tensor] | None = None
    max_seq_len: int | None = None


# --- the user's state <-> depthlens's State ----------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """How a user state maps onto a State dict: kind ("tensor" | "tuple" | "dict") and the keys, in order."""

    kind: str
    keys: tuple[str, ...]

    @staticmethod
    def of(x: UserState, what: str) -> _Layout:
        if isinstance(x, torch.Tensor):
            return _Layout("tensor", ("h",))
        if isinstance(x, (tuple, list)) and x and all(isinstance(v, torch.Tensor) for v in x):
            return _Layout("tuple", tuple(f"s{i}" for i in range(len(x))))
        if (
            isinstance(x, Mapping)
            and x
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in x.items())
        ):
            return _Layout("dict", tuple(x))
        raise DescriptionError(
            f"{what} returned {type(x).__name__}; a state is a tensor (B, T, ...) or a non-empty tuple or dict "
            "(string keys) of tensors"
        )

    def to_state(self, x: UserState) -> State:
        if self.kind == "tensor":
            return {"h": x}
        if self.kind == "tuple":
            return dict(zip(self.keys, x))
        return dict(x)

    def to_user(self, state: State) -> UserState:
        if self.kind == "tensor":
            return state["h"]
        if self.kind == "tuple":
            return tuple(state[k] for k in self.keys)
        return {k: state[k] for k in self.keys}


def _shapes(state: State) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


# --- the design object the engines read ---------------------------------------------------------------------


class DescribedDesign(Design):
    """The residual view, update norm and stream access of a described model (`model.design`)."""

    editable_view = False
    view_name = "the description's residual view"
    norm_reads_view = final_reads_view = False  # the model's norms are its own; nothing is assumed

    def __init__(self, slug: str, layout: _Layout, view: Callable[[UserState], torch.Tensor] | None, streams: bool):
        super().__init__(cfg=None)  # type: ignore[arg-type]
        self.slug = slug
        self.layout = layout
        self._view = view
        self.multi_stream = streams
        # the design capabilities (depthlens.designs.CAPABILITIES) its description gives: "multistream" with stream
        # maps, "depth_softmax" with AttnRes weights; a report runs `rank` / `attnres` on it by these, not its name
        self.capabilities: frozenset[str] = frozenset()

    def view(self, state: State) -> torch.Tensor:
        if self._view is None:
            return state[self.layout.keys[0]]
        return self._view(self.layout.to_user(state))

    def set_view(self, state: State, value: torch.Tensor) -> State:
        raise NotImplementedError(f"{self.slug}: the residual view of a described model is read-only")

    def streams(self, state: State) -> torch.Tensor:
        """The streams X (B, T, n, d): the state's first tensor (stream designs only)."""
        return state[self.layout.keys[0]]

    def update_norm_dims(self) -> int:
        return 2 if self.multi_stream else 1


@dataclass(frozen=True)
class DescribedConfig:
    """The few config fields the engines and provenance read (vocab, length, depth, skip semantics)."""

    n_layer: int
    d_model: int
    vocab_size: int
    max_seq_len: int
    arch: str
    skip: str  # "zero writers" (sublayers declared) or "pass input through"
    streams: int = 0  # n for a stream design (mixing gives res_map), else 0
    multistream_skip: str | None = None  # "mix" when a stream design zeroes its writers (native equivalent)

    def to_dict(self) -> dict[str, Any]:
        import dataclasses

        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


class _Switch:
    """Which writers the hooks zero right now: (block index, keep (B, T), writer indices), or None."""

    def __init__(self) -> None:
        self.now: tuple[int, torch.Tensor, tuple[int, ...]] | None = None


def _zero_where(out: Any, keep: torch.Tensor, where: str) -> Any:
    """A writer's output with its write zeroed where keep == 0 (a tensor, or a tuple/list led by one)."""
    if isinstance(out, torch.Tensor):
        return apply_keep(out, keep.to(out.device))
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return type(out)([apply_keep(out[0], keep.to(out[0].device)), *out[1:]])
    raise DescriptionError(f"{where} returned {type(out).__name__}; a writer returns a tensor (B, T, ...)")


class DescribedModel(LayerLoop, HookedRootModule):
    """The LayeredLM protocol over a user's module, from its `Description` (see the module docstring); a
    TransformerLens `HookedRootModule` with read-only hook points on the residual view: `hook_embed`,
    `blocks.{i}.hook_resid_pre` / `hook_resid_post` and `hook_resid_final` (edit the model's own modules instead)."""

    adapter_path = "described"

    def __init__(self, module: nn.Module, description: Description):
        super().__init__()
        self.module = module
        self.description = description
        d = description
        _check_design_name(d.design)
        self._blocks = _check_blocks(module, d.blocks)
        self._writers = _writers(self._blocks, d.sublayers)
        self.placement: Placement | None = None
        self.tokenizer: Any = None
        self._switch = _Switch()
        self._handles = [
            w.register_forward_hook(self._zero_hook(b, i))
            for b, ws in enumerate(self._writers)
            for i, w in enumerate(ws)
        ]
        self._probe()
        from .generic import _BlockHooks

        self.hook_embed = HookPoint()  # type: ignore[no-untyped-call]
        self.blocks = nn.ModuleList([_BlockHooks() for _ in self._blocks])
        self.hook_resid_final = HookPoint()  # type: ignore[no-untyped-call]
        self.cfg = _lens_config(
            n_layers=self.n_layer, d_model=self.d_model, n_heads=1, n_ctx=self.max_seq_len, d_vocab=self.vocab_size
        )
        self.setup()

    def setup(self) -> None:
        """HookedRootModule.setup over this wrapper's own hook points only (the user's module keeps its names)."""
        setup_own_hooks(self, inner="module")

    def _fire(self, hook: HookPoint, state: State) -> None:
        """A read-only hook point on the residual view of `state` (the view is computed only when hooked)."""
        if hook._forward_hooks or hook._backward_hooks or hook._backward_pre_hooks:
            fire_read_only(hook, self.design.view(state), self.design.view_name, "the model's own modules")

    def _hook(self, pos: int, where: str) -> HookPoint:
        """blocks.{pos}.hook_resid_{where}."""
        hook: HookPoint = getattr(self.blocks[pos], f"hook_resid_{where}")
        return hook

    def hook_names(self) -> list[str]:
        return list(self.hook_dict)

    # --- shape ------------------------------------------------------------------------------------------------
    @property
    def n_layer(self) -> int:
        return len(self._blocks)

    @property
    def layers(self) -> tuple[nn.Module, ...]:
        return self._blocks

    @property
    def input_device(self) -> torch.device:
        if self.placement is not None:
            return self.placement.embed
        for p in self.module.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def units(self) -> tuple[str, ...]:
        """The units `run_layers` can skip: blocks, and attn/mlp when every block declares two writers."""
        two = self.description.sublayers is not None and all(len(w) == 2 for w in self._writers)
        return ("block", "attn", "mlp") if two else ("block",)

    # --- the probe: derive the shapes, refuse a bad description (one line each) ------------------------------
    def _probe(self) -> None:
        d = self.description
        T = 4 if d.max_seq_len is None else min(4, int(d.max_seq_len))
        if T < 2:
            raise DescriptionError(f"max_seq_len must be at least 2, got {d.max_seq_len}")
        dev = self.input_device
        tokens = torch.tensor([[1, 0, 1, 1], [1, 0, 1, 0]], device=dev)[:, :T]
        was = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                self._probe_run(tokens)
        finally:
            self.module.train(was)

    def _probe_run(self, tokens: torch.Tensor) -> None:
        d = self.description
        B, T = tokens.shape
        raw = d.embed(tokens)
        self.layout = _Layout.of(raw, "embed")
        state = self.layout.to_state(raw)
        for k, v in state.items():
            if v.dim() < 2 or tuple(v.shape[:2]) != (B, T):
                raise DescriptionError(
                    f"embed: state tensor {k!r} has shape {tuple(v.shape)}; every state tensor is batch first, "
                    f"then positions: ({B}, {T}, ...) for tokens ({B}, {T})"
                )
        first = state[self.layout.keys[0]]
        self.d_model = int(first.shape[-1])
        self.design = DescribedDesign(d.design, self.layout, d.view, streams=False)
        self._check_view(state, "the embed output")
        mixes: list[list[Mix]] = []
        for i in range(len(self._blocks)):
            new = self._call(i, state)
            if _shapes(new) != _shapes(state):
                raise DescriptionError(
                    f"block {i} changes the state's shape: {_describe_shapes(state)} -> {_describe_shapes(new)}; "
                    "a block returns a state of the same structure and shapes"
                )
            self._check_view(new, f"the output of block {i}")
            if d.mixing is not None:
                mixes.append(self._mixing(i))
            state = new
        logits = d.head(self.layout.to_user(state))
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != (B, T):
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise DescriptionError(f"head returned {shape}; it must return logits (B, T, V) = ({B}, {T}, V)")
        self.vocab_size = int(logits.shape[-1])
        if d.final is not None:
            h = d.final(self.layout.to_user(state))
            if not isinstance(h, torch.Tensor) or tuple(h.shape) != (B, T, self.d_model):
                raise DescriptionError(
                    f"final returned {_shape_of(h)}; it must return h_L (B, T, d) = {(B, T, self.d_model)}"
                )
        if not same_logits(logits[0, : T - 1], logits[1, : T - 1]):
            raise DescriptionError(
                "the model is not causal: its logits at earlier positions change with the last token "
                "(depthlens analyses decoder-only causal LMs)"
            )
        n = self._stream_count(mixes, first)
        self.design.multi_stream = n > 0
        softmax = bool(mixes) and all(ms and all("alpha" in m for m in ms) for ms in mixes)
        self.design.capabilities = frozenset({"multistream"} if n else set()) | (
            {"depth_softmax"} if softmax else set()
        )
        self.max_seq_len = int(d.max_seq_len) if d.max_seq_len is not None else 1 << 20
        self.config = DescribedConfig(
            n_layer=self.n_layer,
            d_model=self.d_model,
            vocab_size=self.vocab_size,
            max_seq_len=self.max_seq_len,
            arch=d.design,
            skip="zero writers" if d.sublayers is not None else "pass input through",
            streams=n,
            multistream_skip=("mix" if d.sublayers is not None else "identity") if n else None,
        )

    def _check_view(self, state: State, where: str) -> None:
        v = self.design.view(state)
        first = next(iter(state.values()))
        want = (*first.shape[:2], self.d_model)
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != want:
            raise DescriptionError(
                f"the view of {where} has shape {_shape_of(v)}; it must be (B, T, d) = {want}, d = the last dim "
                "of the embed output"
            )

    def _stream_count(self, mixes: list[list[Mix]], first: torch.Tensor) -> int:
        """n when every block's mixing gives a res_map (n, n) per writer over a first state tensor (B, T, n, d)."""
        if not mixes or not all(all("res_map" in m for m in ms) and ms for ms in mixes):
            return 0
        n = int(torch.as_tensor(mixes[0][0]["res_map"]).shape[-1])
        if first.dim() != 4 or first.shape[2] != n:
            raise DescriptionError(
                f"mixing gives residual maps over {n} streams, but the state's first tensor has shape "
                f"{tuple(first.shape)}; a stream design keeps its streams there as (B, T, {n}, d)"
            )
        if self.description.sublayers is None or any(len(ms) != len(w) for ms, w in zip(mixes, self._writers)):
            raise DescriptionError(
                "mixing gives residual maps: declare the writers too (sublayers), one map per writer"
            )
        return n

    # --- the pieces of a forward pass ------------------------------------------------------------------------
    def context(self, seq_len: int, *, record: bool = False, device: torch.device | None = None) -> RunContext:
        if seq_len > self.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds the model's max_seq_len {self.max_seq_len}")
        empty = torch.empty(0, device=device or self.input_device)
        return RunContext(cos=empty, sin=empty, record={} if record else None)

    def embed(self, tokens: torch.Tensor, ctx: RunContext) -> State:
        state = self.layout.to_state(self.description.embed(tokens.to(self.input_device)))
        ctx.put("h0", self.design.view(state))
        self._fire(self.hook_embed, state)
        return state

    unit_refusal = "unit={unit!r} needs the description's sublayers (two writers per block: attention, MLP)"

    def run_position(self, state: State, ctx: RunContext, step: LayerStep) -> tuple[State, torch.Tensor | None]:
        """Block `src` at position `pos`; keep (B, T): 0 = skip its write(s) there. The mixing objects are
        computed only for a readout or a recording context."""
        pos, src = step.pos, step.src
        home, dev = self._home(pos, state), self._home(src, state)
        before = move(state, dev)
        self._fire(self._hook(pos, "pre"), before)
        after = self._call(src, before, step.keep, step.unit)
        self._fire(self._hook(pos, "post"), after)
        update = None
        if step.want_update or ctx.record is not None:
            mix = self._mixing(src) if self.description.mixing is not None else []
            if ctx.record is not None:
                for i, m in enumerate(mix):
                    for name, v in m.items():
                        ctx.put(name, v, sublayer=2 * pos + i)
            if step.want_update:
                update = self._update(before, after, mix).to(home)
        return move(after, home), update

    def _call(self, i: int, state: State, keep: torch.Tensor | None = None, unit: str = "block") -> State:
        """Block i on `state`; keep (B, T): 0 = skip (writers zeroed, or the input passed through)."""
        block = self._blocks[i]
        if keep is None:
            return self._out(i, block(self.layout.to_user(state)))
        if self.description.sublayers is not None:
            which = {"block": tuple(range(len(self._writers[i]))), "attn": (0,), "mlp": (1,)}[unit]
            self._switch.now = (i, keep, which)
            try:
                return self._out(i, block(self.layout.to_user(state)))
            finally:
                self._switch.now = None
        out = self._out(i, block(self.layout.to_user(state)))
        return {k: keep_input(out[k], state[k], keep) for k in state}

    def _out(self, i: int, raw: UserState) -> State:
        state = self.layout.to_state(raw) if _Layout.of(raw, f"block {i}") == self.layout else None
        if state is None:
            raise DescriptionError(f"block {i} returned a state of another structure than the embed output")
        return state

    def _zero_hook(self, b: int, i: int) -> Callable[..., Any]:
        switch = self._switch

        def hook(module: nn.Module, args: Any, out: Any) -> Any:
            now = switch.now
            if now is None or now[0] != b or i not in now[2]:
                return None
            return _zero_where(out, now[1], f"writer {i} of block {b}")

        return hook

    def _mixing(self, i: int | None) -> list[Mix]:
        """The block's (or, i = None, the final readout's) mixing objects, checked."""
        mixing = self.description.mixing
        assert mixing is not None
        got = mixing(None if i is None else self._blocks[i])
        if i is None:
            got = [got] if got else []
        if not isinstance(got, Sequence) or not all(isinstance(m, Mapping) for m in got):
            raise DescriptionError(
                f"mixing({'None' if i is None else f'block {i}'}) returned {type(got).__name__}; "
                "it returns one mapping of named tensors per writer (mixing(None): one mapping or {})"
            )
        return list(got)

    def _update(self, before: State, after: State, mix: list[Mix]) -> torch.Tensor:
        """u_l (module docstring): X' - R_m R_a X for stream designs, else view' - view."""
        if not self.design.multi_stream:
            return self.design.view(after) - self.design.view(before)
        x, new = self.design.streams(before), self.design.streams(after)
        wide = torch.promote_types(x.dtype, torch.float32)
        mixed = x.to(wide)
        for m in mix:
            mixed = torch.einsum("btik,btkd->btid", torch.as_tensor(m["res_map"]).to(mixed.device, wide), mixed)
        return (new.to(wide) - mixed).to(x.dtype)

    def final_hidden(self, state: State, ctx: RunContext) -> torch.Tensor:
        """h_L (B, T, d): the description's `final`, or the view."""
        f = self.description.final
        h = f(self.layout.to_user(state)) if f is not None else self.design.view(state)
        if self.hook_resid_final._forward_hooks or self.hook_resid_final._backward_hooks:
            fire_read_only(self.hook_resid_final, h, "h_L", "the model's own modules")
        return h

    def head(self, state: State, ctx: RunContext) -> torch.Tensor:
        if self.hook_resid_final._forward_hooks or self.hook_resid_final._backward_hooks:
            self.final_hidden(state, ctx)  # what the head reads, before its own norm, shown at hook_resid_final
        return self.description.head(self.layout.to_user(move(state, self.input_device)))

    def forward(self, tokens: torch.Tensor, **run_kw: Any) -> torch.Tensor:
        ctx = self.context(tokens.shape[1])
        return self.head(self.run_layers(self.embed(tokens, ctx), ctx, **run_kw), ctx)

    # --- placement over several devices ---------------------------------------------------------------------
    def part_sizes(self) -> Any:
        """Blocks by parameter count; everything else counts as the embedding (the head stays with it)."""
        from .placement import PartSizes

        layers = tuple(sum(p.numel() for p in b.parameters()) for b in self._blocks)
        return PartSizes(embed=sum(p.numel() for p in self.module.parameters()) - sum(layers), layers=layers, head=0)

    def place(self, device_map: Any, devices: list[str] | None = None) -> DescribedModel:
        """Each block on its device of `device_map`, the rest of the module (embedding, head) on the embedding's."""
        from .placement import resolve_device_map

        p = resolve_device_map(device_map, self.part_sizes(), devices)
        if p.head != p.embed:
            raise DepthlensError(
                f"device_map: a described model keeps its head on the embedding's device (embed {p.embed}, head {p.head})"
            )
        self.module.to(p.embed)
        for block, dev in zip(self._blocks, p.layers):
            block.to(dev)
        self.placement = p
        return self

    def _home(self, layer: int, state: State) -> torch.device:
        if self.placement is None:
            return next(iter(state.values())).device
        return self.placement.layers[layer]

    def extra_repr(self) -> str:
        return f"design={self.description.design!r}, n_layer={self.n_layer}, d_model={self.d_model}"

    # --- what the description does not give: refused with the field that is missing, never NaN ---------------
    def depth_mixing(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Refused (DescriptionError): M[i -> j] is composed from the blocks' mixing objects, and this description
        has no `mixing`. A block seen from outside does not say how its input was mixed from earlier outputs
        (a Pre-LN block and a parallel or scaled one look alike), so nothing is assumed."""
        raise DescriptionError(
            "the depth-mixing matrix needs the description's `mixing` field (the blocks' stream maps res_map, pre, "
            "post, or their AttnRes depth weights alpha; docs/own-model.md#fields); this description has none"
        )

    def lens_refusal(self) -> str | None:
        """Why the logit and tuned lens cannot read this model (None: they can). They read h_l = final_hidden(state)
        through the head as if the model stopped there, so the head must take h_l as it takes the last state: one
        tensor (B, T, d) that is its own residual view, with no `view` and no `final`."""
        d, fields = self.description, [f for f in ("view", "final") if getattr(self.description, f) is not None]
        if self.layout.kind == "tensor" and not fields:
            return None
        what = f"gives `{'` and `'.join(fields)}`" if fields else f"keeps its state as a {self.layout.kind}"
        return (
            f"the logit and tuned lens read h_l through the description's head, which takes the state; "
            f"{d.design!r} {what}, so its head does not take h_l (a lens needs one state tensor (B, T, d) and no "
            "`view` or `final`)"
        )


class MixingDescribedModel(DescribedModel):
    """A described model whose blocks expose their mixing objects: readouts and the depth-mixing matrix too."""

    @torch.no_grad()
    def readouts(self, tokens: torch.Tensor) -> Readouts:
        """One forward recording every writer's mixing objects under `readout_key(name, j)` (j = 2l + i for
        writer i of layer l), the final readout's under `final.*`, and `h0`; AttnRes extras derived from alpha."""
        ctx = self.context(tokens.shape[1], record=True)
        self.head(self.run_layers(self.embed(tokens, ctx), ctx), ctx)
        rec = Readouts(ctx.record or {})
        for m in self._mixing(None):
            for name, v in m.items():
                rec[readout_key(name, final=True)] = v.detach() if isinstance(v, torch.Tensor) else v
        _derive_attnres(rec, 2 * self.n_layer)
        return rec

    @torch.no_grad()
    def depth_mixing(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """M[i -> j] (B, T, 2L+1, 2L+1) from the readouts, as the native HC/mHC, Full or Block AttnRes design
        composes it (stream maps: res_map, pre, post; Full AttnRes: alpha over [emb, every earlier write]; Block
        AttnRes: alpha over [completed blocks, partial] with the block starts, `_block_starts`). Refused
        (DescriptionError, naming what `mixing` left out) when the mixing objects do not determine it."""
        rec = self.readouts(tokens)
        n_sub = 2 * self.n_layer
        from ..models.residual.attnres import BlockAttnRes, FullAttnRes
        from ..models.residual.streams import MultiStreamDesign

        if all(rec.has("res_map", j) for j in range(n_sub)):
            lacking = [k for k in ("pre", "post") if not all(rec.has(k, j) for j in range(n_sub))]
            if lacking:
                raise DescriptionError(
                    f"the depth-mixing matrix needs {' and '.join(map(repr, lacking))} next to 'res_map' in every "
                    "mapping `mixing(block)` returns (the branch's read and write weights over the streams)"
                )
            n = int(rec.sublayer("res_map", 0).shape[-1])
            cfg = SimpleNamespace(hc_streams=n, hc_collapse="sum", multistream_skip="mix")
            shim = MultiStreamDesign(cfg)  # type: ignore[no-untyped-call]
            if rec.has("collapse", final=True):
                c = torch.as_tensor(rec.final("collapse")).double()
                shim.collapse_vector = lambda dtype=torch.float64, device=None: c.to(device, dtype)  # type: ignore[method-assign]
            return shim.depth_mixing(rec, n_sub)
        if not all(rec.has("alpha", j) for j in range(n_sub)):
            raise DescriptionError(
                "the depth-mixing matrix needs 'res_map', 'pre' and 'post' (stream designs) or 'alpha' (AttnRes) in "
                "the mapping `mixing(block)` returns for every writer; this description's mixing gives neither"
            )
        if not rec.has("alpha", final=True):
            raise DescriptionError(
                "the depth-mixing matrix needs the final readout's depth weights: `mixing(None)` must return "
                "{'alpha': ...} (B, T, S) over the sources the head reads; this description's returns none"
            )
        starts = _block_starts(rec, self.n_layer)
        if starts is not None:
            return BlockAttnRes(SimpleNamespace(block_starts=starts)).depth_mixing(rec, n_sub)  # type: ignore[arg-type]
        full = all(rec.sublayer("alpha", j).shape[-1] == j + 1 for j in range(n_sub))
        if full and rec.final("alpha").shape[-1] == n_sub + 1:
            return FullAttnRes(SimpleNamespace(attnres_skip="zero_value")).depth_mixing(rec, n_sub)  # type: ignore[arg-type]
        raise DescriptionError(
            "the depth-mixing matrix cannot place the sources of 'alpha': with Full AttnRes writer j reads j + 1 "
            f"sources and the final readout {n_sub + 1}; Block AttnRes names them ('source_labels' with 'partial', "
            "or 'block_starts' in the mapping `mixing(None)` returns)"
        )


def _block_starts(rec: Readouts, n_layer: int) -> list[int] | None:
    """Block AttnRes's block starts (layers): `block_starts` of the final mapping, or read off the writers' source
    labels as natively written (the attention of a layer that starts a block reads the finished block last, not
    'partial'); None when neither is there."""
    if rec.has("block_starts", final=True):
        return [int(l) for l in rec.final("block_starts")]
    labels = [rec.get(readout_key("source_labels", j)) for j in range(2 * n_layer)]
    listed = [list(lab) for lab in labels if isinstance(lab, (list, tuple)) and lab]
    if len(listed) != len(labels) or not any("partial" in lab for lab in listed):
        return None
    return [l for l in range(n_layer) if listed[2 * l][-1] != "partial"]


def _derive_attnres(rec: Readouts, n_sub: int) -> None:
    """Fill what the AttnRes diagnostic reads and a writer's mapping left out, from alpha (B, T, S): the labels
    ["emb", attn_0, mlp_0, ...] (Full AttnRes), the weight on the last source as the self-weight where that source
    is the writer's own computation (a sublayer's output or Block AttnRes's 'partial'; NaN where it is the embedding
    or a finished block, as natively), the weight on the first source as the embedding weight."""
    for j in [*range(n_sub), None]:
        key = readout_key("alpha", j, final=j is None)
        if key not in rec:
            continue
        alpha = torch.as_tensor(rec[key])
        at = {"final": True} if j is None else {}
        labels = rec.setdefault(
            readout_key("source_labels", j, **at), ["emb"] + [sublayer_label(k) for k in range(alpha.shape[-1] - 1)]
        )
        own = j is None or re.fullmatch(r"partial|(attn|mlp)_\d+", str(labels[-1])) is not None
        rec.setdefault(
            readout_key("self_weight", j, **at),
            alpha[..., -1] if own else torch.full_like(alpha[..., -1], float("nan")),
        )
        rec.setdefault(readout_key("embedding_weight", j, **at), alpha[..., 0])


# --- checks ---------------------------------------------------------------------------------------------------


def _check_design_name(name: Any) -> None:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}", name):
        raise DescriptionError(f"design must be a short name (letters, digits, _ . -), got {name!r}")


def _check_blocks(module: nn.Module, blocks: Any) -> tuple[nn.Module, ...]:
    """The blocks as a tuple: modules inside `module`, at least one, no two sharing a module or a parameter."""
    if not isinstance(module, nn.Module):
        raise DescriptionError(f"wrap takes the model as an nn.Module, got {type(module).__name__}")
    try:
        out = tuple(blocks)
    except TypeError:
        raise DescriptionError(f"blocks must be a sequence of nn.Modules, got {type(blocks).__name__}") from None
    if not out or not all(isinstance(b, nn.Module) for b in out):
        raise DescriptionError("blocks must be a non-empty sequence of nn.Modules")
    inside = {id(m) for m in module.modules()}
    for i, b in enumerate(out):
        if id(b) not in inside:
            raise DescriptionError(f"block {i} is not a submodule of the wrapped module")
    owner: dict[int, int] = {}
    for i, b in enumerate(out):
        if id(b) in owner:
            raise DescriptionError(f"blocks {owner[id(b)]} and {i} are one module; each block owns its own")
        owner[id(b)] = i
    params: dict[int, int] = {}
    for i, b in enumerate(out):
        for name, p in b.named_parameters():
            j = params.setdefault(id(p), i)
            if j != i:
                raise DescriptionError(
                    f"blocks {j} and {i} share a module (parameter {name!r}); each block owns its own"
                )
    return out


def _writers(blocks: tuple[nn.Module, ...], sublayers: Any) -> list[tuple[nn.Module, ...]]:
    if sublayers is None:
        return [() for _ in blocks]
    out = []
    for i, b in enumerate(blocks):
        ws = tuple(sublayers(b))
        inside = {id(m) for m in b.modules()}
        if not ws or not all(isinstance(w, nn.Module) and id(w) in inside for w in ws):
            raise DescriptionError(f"sublayers(block {i}) must return the block's own writer modules (attention, MLP)")
        out.append(ws)
    return out


def _shape_of(x: Any) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _describe_shapes(state: State) -> str:
    return ", ".join(f"{k} {tuple(v.shape)}" for k, v in state.items())


def wrap(
    module: nn.Module,
    *,
    embed: Callable[[torch.Tensor], UserState],
    blocks: Sequence[nn.Module],
    head: Callable[[UserState], torch.Tensor],
    view: Callable[[UserState], torch.Tensor] | None = None,
    sublayers: Callable[[nn.Module], Sequence[nn.Module]] | None = None,
    mixing: Callable[[nn.Module | None], Any] | None = None,
    design: str = "custom",
    final: Callable[[UserState], torch.Tensor] | None = None,
    max_seq_len: int | None = None,
) -> DescribedModel:
    """Describe `module` to depthlens (see `Description`); every diagnostic then runs on the result.

    The description is run once on a probe batch (2 x 4 tokens) and refused with one line (`DescriptionError`)
    when a block changes the state's shape, the head does not return (B, T, V), the view is not (B, T, d), two
    blocks share a module or a parameter, or the model is not causal.
    """
    desc = Description(embed, blocks, head, view, sublayers, mixing, design, final, max_seq_len)
    cls = MixingDescribedModel if mixing is not None else DescribedModel
    return cls(module, desc)


# --- from the command line: FILE.py:FUNCTION[@WEIGHTS] ---------------------------------------------------------


def _user_function(ref: Ref) -> tuple[Callable[[], Any], str]:
    """Import the user's file by its path (the user named it on the command line) and return FUNCTION."""
    import importlib.util
    import sys

    from ..io.files import regular_file

    path = regular_file(ref.file, "a Python file with the model's description", error=DescriptionError).resolve()
    digest = sha256_file(path)
    name = f"_depthlens_user_{path.stem}_{digest[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DescriptionError(f"{ref.file}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # the user's own helpers next to their file
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise DescriptionError(f"{ref.file}: importing it raised {_one_line(e)}") from None
    finally:
        if sys.path and sys.path[0] == str(path.parent):
            del sys.path[0]
    fn = getattr(module, ref.function, None)
    if not callable(fn):
        raise DescriptionError(f"{ref.file}: no function {ref.function!r}")
    return fn, digest


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def weight_files(weights: Any) -> list[Any]:
    """The safetensors files of `weights`: one file, or a Hugging Face directory (model.safetensors or the shards
    of its index). A pickle file (torch.save) is refused with the one line that converts it; nothing is unpickled."""
    from pathlib import Path

    from ..errors import CheckpointError
    from ..io.weights import safetensors_files, safetensors_header

    w = Path(weights)
    if w.is_dir():
        files = safetensors_files(w)
        if not files:
            raise CheckpointError(
                f"{w}: no safetensors weights (model.safetensors or an index of shards); depthlens never unpickles "
                f"files. Save them with {PICKLE_HINT}"
            )
        return files
    if not w.exists():
        raise CheckpointError(f"{w}: no such weights file or directory")
    try:
        safetensors_header(w)
    except CheckpointError:
        raise CheckpointError(
            f"{w}: not a safetensors file (a torch.save pickle?); depthlens never unpickles files. Convert it once, "
            f"in an environment you trust, with {PICKLE_HINT}"
        ) from None
    return [w]


def load_weights(model: DescribedModel, weights: Any) -> str:
    """Load `weights` into the wrapped module with strict key checking (one line naming missing and unexpected
    keys; a tied weight saved once counts for every name it has); returns the weights' sha256."""
    import hashlib

    from safetensors.torch import load_file

    from ..errors import CheckpointError
    from ..io.weights import check_finite

    files = weight_files(weights)
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    own = model.module.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for k, v in own.items():
        groups.setdefault(id(v), []).append(k)
    missing = [k for k in own if k not in sd and not any(o in sd for o in groups[id(own[k])])]
    unexpected = sorted(set(sd) - set(own))
    if missing or unexpected:
        parts = [
            f"missing {_names(missing)}" if missing else "",
            f"unexpected {_names(unexpected)}" if unexpected else "",
        ]
        raise CheckpointError(f"{weights}: the weights do not match the model: " + "; ".join(p for p in parts if p))
    for k, v in sd.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise CheckpointError(
                f"{weights}: tensor {k!r} has shape {tuple(v.shape)}, the model's has {tuple(own[k].shape)}"
            )
    for k in own:  # a tied weight saved under one of its names fills the others too
        if k not in sd:
            sd[k] = next(sd[o] for o in groups[id(own[k])] if o in sd)
    model.module.load_state_dict(sd, strict=True)
    check_finite(model.module.named_parameters(), weights)
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()  # shards: the hash of the shard hashes, in file order
    for f in files:
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def _names(keys: Sequence[str]) -> str:
    return ", ".join(map(repr, keys[:4])) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def open_described(
    ref: Ref, *, device: str = "cpu", dtype: Any = None, device_map: Any = None
) -> tuple[DescribedModel, dict[str, Any]]:
    """Run the user's FUNCTION (it returns `wrap(...)`), load the weights strictly, move or place it; returns the
    model (eval mode) and its provenance (the file's path and sha256, the function, the weights' path and sha256)."""
    from pathlib import Path

    fn, file_sha = _user_function(ref)
    try:
        model = fn()
    except DepthlensError:
        raise
    except Exception as e:
        raise DescriptionError(f"{ref.file}: {ref.function}() raised {_one_line(e)}") from None
    if not isinstance(model, DescribedModel):
        raise DescriptionError(
            f"{ref.file}: {ref.function}() returned {type(model).__name__}; it must return depthlens.wrap(...)"
        )
    prov: dict[str, Any] = {
        "model_source": "described",
        "model_path": str(ref),
        "model_family": "described",
        "adapter_path": "described",
        "described_file": str(Path(ref.file).resolve()),
        "described_file_sha256": file_sha,
        "described_function": ref.function,
        "described_design": model.description.design,
    }
    if ref.weights is not None:
        prov["weights_path"] = str(Path(ref.weights).resolve())
        prov["weights_sha256"] = load_weights(model, ref.weights)
        prov["weights_format"] = "safetensors"
    else:
        prov["weights_path"] = "none (as the function returns it)"
    if dtype is not None:
        model.module.to(dtype)
    if device_map is not None:
        model.place(device_map)
    else:
        model.module.to(device)
    return model.eval(), prov


# --- the untrained twin: the description's own init ---------------------------------------------------------------

TWIN_SEED = 0  # the torch seed the untrained twin of a described model is built under (its training seed is unknown)


def untrained_init(seed: int = TWIN_SEED) -> str:
    """How the untrained twin of a described model is initialised, as provenance and the report record it."""
    return f"the description's own init, torch seed {seed}"
