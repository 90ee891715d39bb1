"""GenericBlocksModel: the LayeredLM protocol over any decoder-only HF causal LM whose blocks form one
`nn.ModuleList` (GPT-NeoX/Pythia, Phi, Gemma, OLMo, ...), at block granularity, the way Csordás et al.'s
code intervenes: a skipped block passes its input through as its output; a permutation reorders blocks.

Nothing of the family is mapped by hand. The HF model's own forward does the family-specific work:

* `context(T)`: one forward on (1, T) dummy ids with every block swapped for a probe that records the
  arguments the model passes it (masks, rotary tables, position ids: whatever that family uses) and
  returns its input. The recorded (1, ...) tensors broadcast over the batch.
* `embed(tokens)`: the model's forward up to the first block (embedding, position embedding, scaling),
  stopped there by a pre-hook: h0 (B, T, d) = the first block's input.
* `run_layers`: block `order[p]` called directly with the arguments recorded for position p (what the HF
  loop passes when its ModuleList is permuted, as in Csordás' code: a per-position mask type, e.g. Gemma-2's
  alternating sliding window, stays with the position); keep[p] (B, T) = 0 replaces the block's output by
  its input at those tokens.
* `head(h_L)`: the model's forward again, with every block swapped for a pass-through that injects h_L, so
  the family's own final norm, LM head and logit soft-capping apply.

Only whole blocks can be skipped (`unit="block"`); the residual view is the hidden state between blocks.
`place(device_map)` puts each block on its device and everything else (embedding, final norm, LM head: their
names are not mapped) on the embedding's device; the recorded block arguments are copied once per device.
Provenance records `adapter_path = "generic-blocks"`. A model without exactly one ModuleList of
`num_hidden_layers` blocks, or an encoder(-decoder), is refused with one line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from ..errors import CheckpointError
from ..models.hook_contract import fire
from ..models.protocol import LayerLoop, LayerStep, Unembedding, head_hooked, same_logits
from ..models.residual.base import Design, RunContext, State, keep_input
from .base import AdapterSpec, ForeignConfig, _lens_config, setup_own_hooks

if TYPE_CHECKING:
    from .placement import Placement

COPIED_ATTRS = ("attention_type", "layer_idx", "is_sliding", "sliding_window", "layer_type")


class ForeignBlocks(Design):
    """One residual stream h (B, T, d) between HF blocks, whatever the block does inside."""

    slug = "generic"
    view_name = "hidden state between HF decoder blocks (generic-blocks path)"

    def __init__(self, family: str):
        super().__init__(cfg=None)  # type: ignore[arg-type]
        self.family = family


class _Stop(Exception):
    """Raised by a pre-hook to end a forward once the first block's input is known."""


class _Probe(nn.Module):
    """Stands in for block i during a forward: records its arguments, returns its input (or injects h)."""

    def __init__(
        self, block: nn.Module, sink: list, index: int, inject: torch.Tensor | None = None, as_tuple: bool = False
    ):
        super().__init__()
        for a in COPIED_ATTRS:  # the model's loop may read these off the layer (mask type per layer)
            if a in vars(block) or hasattr(type(block), a):
                try:
                    object.__setattr__(self, a, getattr(block, a))
                except AttributeError:
                    pass
        self._sink, self._index, self._inject, self._tuple = sink, index, inject, as_tuple

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        h = kwargs.pop("hidden_states") if "hidden_states" in kwargs else args[0]
        rest = args[1:] if "hidden_states" not in kwargs and args else args
        self._sink.append((self._index, rest, kwargs))
        out = self._inject if self._inject is not None else h
        return (out,) if self._tuple else out


class _BlockHooks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.hook_resid_post = HookPoint()


def find_blocks(hf: Any, n_layer: int) -> str:  # hf: a transformers PreTrainedModel
    """Dotted path of the one ModuleList holding the model's `n_layer` decoder blocks; CheckpointError if
    there is none or more than one (not counting lists nested inside a block)."""
    lists = [name for name, m in hf.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n_layer and name]
    top = [n for n in lists if not any(n != o and n.startswith(o + ".") for o in lists)]
    if len(top) != 1:
        raise CheckpointError(
            f"model_type {hf.config.model_type!r} has no depthlens adapter, and its decoder blocks "
            f"do not form one ModuleList of {n_layer} (found {len(top)}); the generic-blocks "
            "path cannot analyse it"
        )
    return top[0]


def check_generic(hf: Any) -> None:  # hf: a transformers PreTrainedModel
    """Refuse what the generic path cannot honestly analyse: encoder-decoders, and any model whose logits at
    position 0 depend on a later token (not causal: BERT-style encoders behind a causal-LM head). The two rows
    are compared up to the dtype's rounding (`same_logits`): threaded kernels may differ in the last bits
    between rows, and a valid model must not be refused at 2 threads."""
    mt = getattr(hf.config, "model_type", "?")
    refuse = CheckpointError(
        f"model_type {mt!r} has no depthlens adapter and is not a decoder-only causal LM "
        "(the generic-blocks path needs one)"
    )
    if getattr(hf.config, "is_encoder_decoder", False):
        raise refuse
    dev = hf.get_input_embeddings().weight.device
    ids = torch.tensor([[1, 2, 3], [1, 2, 4]], device=dev) % int(hf.config.vocab_size)
    with torch.no_grad():
        logits = hf(input_ids=ids, use_cache=False).logits
    if not same_logits(logits[0, :2], logits[1, :2]):
        raise refuse


class GenericBlocksModel(LayerLoop, HookedRootModule):
    """LayeredLM over an HF decoder-only `*ForCausalLM` at block level (see module docstring)."""

    adapter_path = "generic-blocks"

    def __init__(self, hf_model: Any, *, tokenizer: Any = None):  # a transformers PreTrainedModel
        super().__init__()
        c = hf_model.config
        n = _n_layer(c)
        check_generic(hf_model)
        self.hf: Any = hf_model
        self.tokenizer = tokenizer
        self.blocks_path = find_blocks(hf_model, n)
        names = {id(m): k for k, m in hf_model.named_modules()}
        emb, out = hf_model.get_input_embeddings(), hf_model.get_output_embeddings()
        self.spec = AdapterSpec(
            family=str(c.model_type),
            model_types=(str(c.model_type),),
            blocks=self.blocks_path,
            embed=names.get(id(emb), ""),
            final_norm="",
            lm_head=names.get(id(out), ""),
            attn_norm="",
            attn="",
            mlp_norm="",
            mlp="",
        )
        self.design = ForeignBlocks(str(c.model_type))
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([_BlockHooks() for _ in range(n)])
        self.hook_resid_final = HookPoint()
        self.placement: Placement | None = None  # set by `place`
        heads = int(getattr(c, "num_attention_heads", 0) or getattr(c, "n_head", 0) or 1)
        self.cfg = _lens_config(
            n_layers=n, d_model=self.d_model, n_heads=heads, n_ctx=self.max_seq_len, d_vocab=self.vocab_size
        )
        self.setup()

    def setup(self) -> None:
        """HookedRootModule.setup over this wrapper's own hook points only (the HF subtree keeps its names)."""
        setup_own_hooks(self)

    # --- shape --------------------------------------------------------------------------------------------
    @property
    def hf_config(self) -> Any:
        return self.hf.config

    @property
    def layers(self) -> nn.ModuleList:
        return cast(nn.ModuleList, self.hf.get_submodule(self.blocks_path))

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        c = self.hf_config
        return int(getattr(c, "hidden_size", None) or getattr(c, "n_embd", None) or c.d_model)

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)

    @property
    def max_seq_len(self) -> int:
        c = self.hf_config
        return int(getattr(c, "max_position_embeddings", 0) or getattr(c, "n_positions", 0) or 1 << 20)

    @property
    def config(self) -> Any:
        c = self.hf_config
        return ForeignConfig(
            family=str(c.model_type),
            model_type=str(c.model_type),
            n_layer=self.n_layer,
            d_model=self.d_model,
            vocab_size=self.vocab_size,
            max_seq_len=self.max_seq_len,
            hf_config=json.loads(c.to_json_string(use_diff=False)),
            arch=self.design.slug,
        )

    def _device(self) -> torch.device:
        return self.hf.get_input_embeddings().weight.device

    input_device = property(_device)  # where token ids go

    # --- placement over several devices -----------------------------------------------------------------
    def part_sizes(self) -> Any:
        """Blocks by parameter count; everything outside the blocks counts as the embedding (the head stays there)."""
        from .placement import PartSizes

        layers = tuple(sum(p.numel() for p in b.parameters()) for b in self.layers)
        return PartSizes(embed=sum(p.numel() for p in self.hf.parameters()) - sum(layers), layers=layers, head=0)

    def place(self, device_map: Any, devices: list[str] | None = None) -> GenericBlocksModel:
        """Each block on its device of `device_map`, the rest of the model (embedding, final norm, head) on the
        embedding's; a map that puts the head elsewhere is refused (the final norm is not known by name)."""
        from ..errors import DepthlensError
        from .placement import resolve_device_map

        p = resolve_device_map(device_map, self.part_sizes(), devices)
        if p.head != p.embed:
            raise DepthlensError(
                "device_map: the generic-blocks path keeps the head on the embedding's device "
                f"(embed {p.embed}, head {p.head})"
            )
        blocks = self.layers
        with _Swap(blocks, [nn.Identity() for _ in blocks]):  # move everything but the blocks
            self.hf.to(p.embed)
        for block, dev in zip(blocks, p.layers):
            block.to(dev)
        self.placement = p
        return self

    def _home(self, layer: int, like: torch.Tensor) -> torch.device:
        return like.device if self.placement is None else self.placement.layers[layer]

    def _calls_on(self, ctx: RunContext, pos: int, dev: torch.device) -> tuple[tuple, dict]:
        """The arguments recorded for position `pos`, on `dev` (copied once per device, kept in the context)."""
        key = ("block_calls", pos, dev)
        if key not in ctx.extras:
            from .placement import move

            ctx.extras[key] = move(ctx.extras["block_calls"][pos], dev)
        return ctx.extras[key]

    # --- forward pieces ---------------------------------------------------------------------------------
    def _swapped(self, probes: Sequence[nn.Module]) -> _Swap:
        return _Swap(self.layers, probes)

    def context(self, seq_len: int, *, record: bool = False, device: torch.device | None = None) -> RunContext:
        """Record, once per length, the arguments the model passes each block (probe forward on (1, T))."""
        if seq_len > self.max_seq_len:
            raise ValueError(
                f"sequence length {seq_len} exceeds the model's max_position_embeddings {self.max_seq_len}"
            )
        device = self._device() if self.placement is not None else (device or self._device())
        sink: list = []
        ids = torch.zeros(1, seq_len, dtype=torch.long, device=device)
        with torch.no_grad(), self._swapped([_Probe(b, sink, i) for i, b in enumerate(self.layers)]):
            self.hf(input_ids=ids, use_cache=False)
        calls = {i: (rest, kw) for i, rest, kw in sink}
        if sorted(calls) != list(range(self.n_layer)):
            raise CheckpointError(
                f"{self.hf_config.model_type}: the model's forward did not call each of its "
                f"{self.n_layer} blocks once; the generic-blocks path cannot analyse it"
            )
        empty = torch.empty(0, device=device)
        ctx = RunContext(cos=empty, sin=empty, record={} if record else None)
        ctx.extras["block_calls"] = calls
        dev0 = self._home(0, empty)
        h = torch.zeros(1, seq_len, self.d_model, device=dev0, dtype=self.hf.get_input_embeddings().weight.dtype)
        with torch.no_grad():
            rest, kw = self._calls_on(ctx, 0, dev0)
            ctx.extras["as_tuple"] = isinstance(self.layers[0](h, *rest, **kw), tuple)
        return ctx

    def embed(self, tokens: torch.Tensor, ctx: RunContext) -> State:
        """tokens (B, T) -> {"h": the first block's input (B, T, d)}."""
        got: list[torch.Tensor] = []

        def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
            got.append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])
            raise _Stop

        handle = self.layers[0].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            self.hf(input_ids=tokens.to(self._device()), use_cache=False)
        except _Stop:
            pass
        finally:
            handle.remove()
        h = fire(self.hook_embed, got[0])
        ctx.put("h0", h)
        return {"h": h}

    unit_refusal = (
        "the generic-blocks path skips whole blocks only (unit='block'); attn/mlp sublayers need a hand-mapped adapter"
    )

    @property
    def units(self) -> tuple[str, ...]:
        return ("block",)

    def run_position(self, state: State, ctx: RunContext, step: LayerStep) -> tuple[State, torch.Tensor | None]:
        """Block `src` at position `pos`; keep (B, T): 0 = the block's input passes through."""
        pos, src, h, hk = step.pos, step.src, state["h"], self.blocks[step.pos]
        home, dev = self._home(pos, h), self._home(src, h)  # block src runs on its device; the state comes home
        h = fire(hk.hook_resid_pre, h.to(dev))
        # the arguments the model's loop passes at this position (Csordás: the list is permuted)
        rest, kw = self._calls_on(ctx, pos, dev)
        out = self.layers[src](h, *rest, **kw)
        out = out[0] if isinstance(out, tuple) else out
        if step.keep is not None:  # block input passed through where keep == 0
            out = keep_input(out, h, step.keep)
        out = fire(hk.hook_resid_post, out).to(home)
        return {**state, "h": out}, (out - h.to(home) if step.want_update else None)

    def final_hidden(self, state: State, ctx: RunContext) -> torch.Tensor:
        return fire(self.hook_resid_final, state["h"])

    def head(self, state: State, ctx: RunContext) -> torch.Tensor:
        """h_L -> logits (B, T, V) through the model's own final norm, LM head and soft-capping."""
        h = self.final_hidden(state, ctx).to(self._device())  # the final norm and head live with the embedding
        B, T = h.shape[:2]
        sink: list = []
        as_tuple = bool(ctx.extras.get("as_tuple", False))
        probes = [
            _Probe(b, sink, i, inject=h if i == 0 else None, as_tuple=as_tuple) for i, b in enumerate(self.layers)
        ]
        ids = torch.zeros(B, T, dtype=torch.long, device=h.device)
        with self._swapped(probes):
            out = self.hf(input_ids=ids, use_cache=False)
        return out.logits

    def _head_input(self, state: State, ctx: RunContext) -> torch.Tensor:
        """(B, T, d): what the model's LM head module receives for `state` (its final norm applied), read by
        running the model's own tail with the head swapped for a pass-through (no (B, T, V) logits formed)."""
        lm_head = self.hf.get_output_embeddings()
        got: list[torch.Tensor] = []
        self.hf.set_output_embeddings(_Capture(got))
        try:
            self.head(state, ctx)
        finally:
            self.hf.set_output_embeddings(lm_head)
        return got[-1]

    def unembedding(self) -> Unembedding | None:
        """The head split at its one matmul, when the model applies nothing after its `nn.Linear` LM head
        (checked once numerically on a probe state: Gemma 2's logit soft-capping, say, fails it -> None), so
        large vocabularies (Gemma 3: 262,144 ids) are walked in chunks by the analysis."""
        if head_hooked(self.hf.get_output_embeddings()):
            return None  # a hook added since the check (F.linear would bypass it): asked on every call
        if not hasattr(self, "_unembedding"):
            self._unembedding = self._check_unembedding()
        return self._unembedding

    def _check_unembedding(self) -> Unembedding | None:
        """The split head, when two checks on a probe state hold; else None (the analysis then forms whole
        logits through `head`, which is always right).

        1. Nothing transforms the LM head's output: its `forward` is made to emit known values (integers in
           [-128, 128], exact in fp16, bf16 and fp32) and the model's logits must be those values exactly (a
           cast or a pass-through is exact on them; Gemma 2's soft-capping, a logit scale or a forward hook on
           the head is not), whatever the dtype.
        2. F.linear on the head's captured input gives the head's logits up to the rounding of a length-d dot
           product in the weights' dtype (`_head_agrees`): two kernels, or one at another thread count, may
           sum in another order, and bf16 / fp16 round far more coarsely than fp32.
        """
        lm_head = self.hf.get_output_embeddings()
        if type(lm_head) is not nn.Linear:
            return None
        with torch.no_grad():
            ctx = self.context(4, device=self._device())
            g = torch.Generator().manual_seed(0)
            h = 3 * torch.randn(2, 4, self.d_model, generator=g, device="cpu")  # seeded on the host, then moved
            state = {"h": h.to(self._device(), lm_head.weight.dtype)}
            if not self._head_passes_through(lm_head, state, ctx):
                return None  # something transforms the logits after the projection
            x = self._head_input(state, ctx)
            logits = self.head(state, ctx)
            direct = F.linear(x, lm_head.weight, lm_head.bias)
            if not _head_agrees(logits, direct, x, lm_head.weight, lm_head.bias):
                return None
        return Unembedding(
            hidden=lambda state, ctx: self._head_input(state, ctx), weight=lm_head.weight, bias=lm_head.bias
        )

    def _head_passes_through(self, lm_head: nn.Linear, state: State, ctx: RunContext) -> bool:
        """Whether the model returns what its LM head emits, unchanged (check 1 of `_check_unembedding`): the
        head's `forward` (not its hooks: they run) is swapped for one emitting `_known_logits`."""
        emitted: list[torch.Tensor] = []

        def emit(x: torch.Tensor) -> torch.Tensor:
            z = _known_logits((*x.shape[:-1], lm_head.out_features), lm_head.weight.dtype, x.device)
            emitted.append(z)
            return z

        own = lm_head.__dict__.get("forward")  # accelerate's offload hook, say, lives there
        lm_head.forward = emit  # type: ignore[method-assign,assignment]
        try:
            out = self.head(state, ctx)
        finally:
            if own is None:
                del lm_head.forward
            else:
                lm_head.forward = own  # type: ignore[method-assign]
        return (
            len(emitted) == 1
            and out.shape == emitted[0].shape
            and torch.equal(out.detach().cpu().double(), emitted[0].cpu().double())  # exact values, see above
        )

    def forward(self, tokens: torch.Tensor, **run_kw: Any) -> torch.Tensor:
        ctx = self.context(tokens.shape[1], device=self._device())
        return self.head(self.run_layers(self.embed(tokens, ctx), ctx, **run_kw), ctx)

    def to_tokens(self, text: str | list[str], prepend_bos: bool | None = None) -> torch.Tensor:
        if self.tokenizer is None:
            raise ValueError("this model was loaded without tokenizer files; pass token ids instead")
        return self.tokenizer.to_tokens(text, prepend_bos=prepend_bos, device=self._device())

    def hook_names(self) -> list[str]:
        return list(self.hook_dict)

    def extra_repr(self) -> str:
        return f"family={self.spec.family}, path=generic-blocks, n_layer={self.n_layer}, d_model={self.d_model}"


def _known_logits(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Integers in [-128, 128] varying over every position and id: exactly representable in fp16, bf16 and
    fp32, so any dtype cast leaves them as they are, and large enough that a soft-cap or scale moves them."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n, device=device) * 37) % 257 - 128).reshape(shape).to(dtype)


def _head_agrees(
    logits: torch.Tensor, direct: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> bool:
    """Whether `logits` and `direct` = F.linear(x, weight, bias) are the same dot products up to rounding:
    elementwise |logits - direct| <= sqrt(d) * eps * (||x_i|| * ||w_j|| + |b_j|), eps of the coarser of the two
    dtypes (the typical error bound of a length-d dot product summed in any order, Higham; ||x|| ||w|| bounds
    sum |x_k w_k|). Scale-aware by row and vocabulary id, dtype-aware by eps: fp32 allows ~1e-7 * sqrt(d) of
    the dot product's magnitude, bf16 ~8e-3 * sqrt(d). NaN or infinity never agrees."""
    if logits.shape != direct.shape or not (bool(logits.isfinite().all()) and bool(direct.isfinite().all())):
        return False
    eps = max(torch.finfo(t.dtype).eps for t in (logits, direct, weight))
    d = x.shape[-1]

    def host(t: torch.Tensor) -> torch.Tensor:  # float64 on the host (an MPS device has none); a few rows
        return t.detach().cpu().double()

    xn = torch.linalg.vector_norm(host(x), dim=-1, keepdim=True)  # (B, T, 1)
    # (V,) row norms in float32 chunks on the weight's device: no float64 copy of a 262,144-row weight
    wn = torch.cat([host(torch.linalg.vector_norm(w.detach().float(), dim=-1)) for w in weight.split(1 << 14)])
    bound = xn * wn + (0 if bias is None else host(bias).abs())
    return bool(((host(logits) - host(direct)).abs() <= d**0.5 * eps * bound).all())


class _Capture(nn.Module):
    """Stands in for the LM head: records its input and passes it on (so the model forms no logits)."""

    def __init__(self, sink: list):
        super().__init__()
        self.sink = sink

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sink.append(x)
        return x


class _Swap:
    """Temporarily replace every entry of a ModuleList (restored on exit, even on error)."""

    def __init__(self, layers: nn.ModuleList, replacement: Sequence[nn.Module]):
        self.layers, self.replacement = layers, replacement

    def __enter__(self) -> None:
        self.saved = list(self.layers)
        for i, m in enumerate(self.replacement):
            self.layers[i] = m

    def __exit__(self, *exc: Any) -> None:
        for i, m in enumerate(self.saved):
            self.layers[i] = m


def _n_layer(c: Any) -> int:
    for k in ("num_hidden_layers", "n_layer", "num_layers"):
        v = getattr(c, k, None)
        if isinstance(v, int) and v > 0:
            return v
    raise CheckpointError(f"model_type {c.model_type!r}: config states no layer count (num_hidden_layers)")


__all__ = ["GenericBlocksModel", "find_blocks", "check_generic"]
