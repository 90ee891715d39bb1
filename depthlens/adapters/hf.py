"""HFLayeredModel: the LayeredLM protocol over a Hugging Face `*ForCausalLM`, so every diagnostic applies.

The wrapper runs the decoder itself, one Pre-LN sublayer at a time, calling the HF model's own modules
(norms, attention, MLP, rotary embedding, causal-mask builder); no HF forward code is copied.

    tokens (B, T) --embed (+ wpe for GPT-2)--> h0 (B, T, d)
    for l:  h = h + keep * attn(attn_norm(h), RoPE(cos, sin), mask)     # hook_resid_mid
            h = h + keep * mlp(mlp_norm(h))                              # hook_resid_post
    h_L (B, T, d) --final norm--> --lm_head--> logits (B, T, V)

It is also a TransformerLens `HookedRootModule` with the same hook names as a native `DepthModel`
(`blocks.{i}.hook_resid_pre|mid|post`, `hook_attn_in|out`, `hook_mlp_in|out`, `hook_embed`,
`hook_resid_final`), so `run_with_cache`, `transformer_lens.patching` and nnsight recipes written for
depthlens models run unchanged. The weights stay inside `self.hf` (HF names); `blocks[i]` holds only
the hook points of layer position i.

Semantics of the interventions (all families here are Pre-LN, one residual stream):
* keep[l] (B, T): 0 drops layer l's writes at that token, so the token keeps its input (Csordas' merge_io);
* order[p]: which decoder layer runs at position p; `swap="body"` and `"all"` coincide (no routers);
* on_layer(pos, state_after, update) with update = h_{l+1} - h_l (B, T, d).

Placement over several devices (`place`, `depthlens.adapters.placement`): the embedding, each decoder layer
and the head may live on different devices; the state moves to the device of the layer that runs and comes
back on its position's home device, and the RunContext keeps one copy of the rotary tables, position ids
and masks per device.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from ..errors import CheckpointError
from ..models.hook_contract import fire
from ..models.protocol import LayerLoop, LayerStep, Unembedding, head_hooked
from ..models.residual.base import Design, RunContext, State, apply_keep

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from .placement import Placement
from .base import AdapterSpec, ForeignConfig, _lens_config, resolve, setup_own_hooks
from .families import spec_for

SITES = ("resid_pre", "resid_mid", "resid_post", "attn_in", "attn_out", "mlp_in", "mlp_out")


class ForeignPreLN(Design):
    """The residual design of every adapted family: Pre-LN, one stream h (B, T, d), editable views."""

    slug = "preln"
    view_name = "residual stream h (the HF hidden_states passed between decoder layers)"

    def __init__(self, family: str):
        super().__init__(cfg=cast("ModelConfig", None))  # a foreign model has no depthlens ModelConfig
        self.family = family


class LayerHooks(nn.Module):
    """The hook points of one layer position (TransformerLens names). Holds no weights."""

    def __init__(self) -> None:
        super().__init__()
        for site in SITES:
            setattr(self, f"hook_{site}", HookPoint())


class HFLayeredModel(LayerLoop, HookedRootModule):
    """A LayeredLM over an HF causal LM whose layout an `AdapterSpec` describes.

    Arguments:
        hf_model: a `LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM` or
            `GPT2LMHeadModel` (or any model a registered spec describes). Kept as the submodule `hf`.
        spec: the family's spec; default: looked up from `hf_model.config.model_type`.
        tokenizer: optional `depthlens.adapters.tokenizer.HFTokenizer` (gives `to_tokens`).
    """

    def __init__(self, hf_model: nn.Module, spec: AdapterSpec | None = None, *, tokenizer: Any = None):
        super().__init__()
        self.spec = spec or spec_for(getattr(hf_model.config, "model_type", None))
        self.hf = hf_model
        self.tokenizer = tokenizer
        self.design = ForeignPreLN(self.spec.family)
        self.hook_embed = HookPoint()  # token embedding (B, T, d)
        if self.spec.pos_embed:
            self.hook_pos_embed = HookPoint()  # learned position embedding (1, T, d)
        self.blocks = nn.ModuleList([LayerHooks() for _ in range(len(self.layers))])
        self.hook_resid_final = HookPoint()  # h_L before the final norm (B, T, d)
        c = self.hf_config
        self.cfg = _lens_config(
            n_layers=self.n_layer,
            d_model=c.hidden_size,
            n_heads=c.num_attention_heads,
            n_ctx=self.max_seq_len,
            d_vocab=c.vocab_size,
        )
        self._kinds = _layer_kinds(c, self.n_layer)
        self.placement: Placement | None = None  # set by `place`; None: the model's own single device
        self.setup()

    def setup(self) -> None:
        """HookedRootModule.setup over this wrapper's own hook points only: the HF subtree keeps its module
        names untouched (a TransformerBridge-converted model names its own components)."""
        setup_own_hooks(self)

    # --- the HF modules, by spec path ------------------------------------------------------------------
    @property
    def hf_config(self) -> Any:
        return self.hf.config

    @property
    def config(self) -> ForeignConfig:
        """depthlens-style summary of the HF config (`.hf_config` is the HF object itself)."""
        c = self.hf_config
        return ForeignConfig(
            family=self.spec.family,
            model_type=c.model_type,
            n_layer=self.n_layer,
            d_model=self.d_model,
            vocab_size=self.vocab_size,
            max_seq_len=self.max_seq_len,
            hf_config=json.loads(c.to_json_string(use_diff=False)),
        )

    @property
    def layers(self) -> nn.ModuleList:
        return cast(nn.ModuleList, resolve(self.hf, self.spec.blocks))

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def max_seq_len(self) -> int:
        return int(getattr(self.hf_config, "max_position_embeddings", 0) or 1 << 20)

    @property
    def d_model(self) -> int:
        return int(self.hf_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)

    def _param(self) -> torch.Tensor:
        return cast(torch.Tensor, resolve(self.hf, self.spec.embed).weight)

    # --- placement over several devices -----------------------------------------------------------------
    def part_sizes(self) -> Any:
        """Parameter counts of embedding, each layer and head (the input of device_map="auto")."""
        from .placement import PartSizes

        count = lambda *paths: sum(p.numel() for q in paths if q for p in resolve(self.hf, q).parameters())  # noqa: E731
        tied = resolve(self.hf, self.spec.lm_head).weight is self._param()
        return PartSizes(
            embed=count(self.spec.embed, self.spec.pos_embed),
            layers=tuple(sum(p.numel() for p in layer.parameters()) for layer in self.layers),
            head=count(self.spec.final_norm) + (0 if tied else count(self.spec.lm_head)),
            tied=tied,
        )

    def place(self, device_map: Any, devices: list[str] | None = None) -> HFLayeredModel:
        """Move the embedding, each decoder layer and the head to the devices of `device_map` ("auto", a device
        name, a dict {"embed", "layers", "head"} or a Placement; see `depthlens.adapters.placement`)."""
        from .placement import resolve_device_map

        p = resolve_device_map(device_map, self.part_sizes(), devices)
        sp = self.spec
        for path in (sp.embed, sp.pos_embed, sp.rotary):
            if path:
                resolve(self.hf, path).to(p.embed)
        for layer, dev in zip(self.layers, p.layers):
            layer.to(dev)
        for path in (sp.final_norm, sp.lm_head):
            resolve(self.hf, path).to(p.head)
        self.placement = p
        return self

    @property
    def input_device(self) -> torch.device:
        """Where token ids go: the embedding's device."""
        return self._param().device

    def _home(self, layer: int, like: torch.Tensor) -> torch.device:
        """Device of decoder layer `layer` (the tensor's own device when the model is not placed)."""
        return like.device if self.placement is None else self.placement.layers[layer]

    def _on(self, ctx: RunContext, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cos, sin, position_ids) on `dev`, copied once per device and kept in the context."""
        key = ("rope", dev)
        if key not in ctx.extras:
            ctx.extras[key] = (ctx.cos.to(dev), ctx.sin.to(dev), ctx.extras["position_ids"].to(dev))
        return ctx.extras[key]

    # --- LayeredLM ------------------------------------------------------------------------------------------
    def context(self, seq_len: int, *, record: bool = False, device: torch.device | None = None) -> RunContext:
        """RoPE tables (1, T, dh) from the model's own rotary module, position ids (1, T); masks are built
        lazily per batch size in `ctx.extras`."""
        if seq_len > self.max_seq_len:
            raise ValueError(
                f"sequence length {seq_len} exceeds the model's max_position_embeddings {self.max_seq_len}"
            )
        w = self._param()
        device = w.device if self.placement is not None else (device or w.device)  # the tables start at the embedding
        pos = torch.arange(seq_len, device=device).unsqueeze(0)
        if self.spec.rotary:
            cos, sin = resolve(self.hf, self.spec.rotary)(torch.zeros((), dtype=w.dtype, device=device), pos)
        else:
            cos = sin = torch.empty(0, device=device)
        ctx = RunContext(cos=cos, sin=sin, record={} if record else None)
        ctx.extras["position_ids"] = pos
        return ctx

    def embed(self, tokens: torch.Tensor, ctx: RunContext) -> State:
        """tokens (B, T) -> {"h": h0 (B, T, d)} on the embedding's device."""
        h = fire(self.hook_embed, resolve(self.hf, self.spec.embed)(tokens.to(self.input_device)))
        if self.spec.pos_embed:
            h = h + fire(self.hook_pos_embed, resolve(self.hf, self.spec.pos_embed)(ctx.extras["position_ids"]))
        ctx.put("h0", h)
        return {"h": h}

    def run_position(self, state: State, ctx: RunContext, step: LayerStep) -> tuple[State, torch.Tensor | None]:
        """Decoder layer `src` at position `pos` (swap "body" == "all" here: a layer has no separate router)."""
        h = state["h"]
        # runs on layer src's device; comes back on position pos's home device, so rows that ran different
        # layers at pos (a batch of swap pairs) can be concatenated again
        home = self._home(step.pos, h)
        h_out = self._layer(h, ctx, step.pos, step.src, step.keep_attn, step.keep_mlp).to(home)
        return {**state, "h": h_out}, (h_out - h.to(home) if step.want_update else None)

    def _layer(
        self,
        h: torch.Tensor,
        ctx: RunContext,
        pos: int,
        src: int,
        keep_attn: torch.Tensor | None,
        keep_mlp: torch.Tensor | None,
    ) -> torch.Tensor:
        """One decoder layer (weights of layer `src`, hooks of position `pos`): (B, T, d) -> (B, T, d)."""
        layer, hk, sp = self.layers[src], self.blocks[pos], self.spec
        dev = self._home(src, h)  # layer src's device: its input, masks and tables go there
        h = fire(hk.hook_resid_pre, h.to(dev))
        keep_attn, keep_mlp = (None if k is None else k.to(dev) for k in (keep_attn, keep_mlp))
        cos, sin, _ = self._on(ctx, dev)
        x = getattr(layer, sp.attn_norm)(fire(hk.hook_attn_in, h, copy=True))
        mask = self._mask(ctx, h, src)
        if sp.rotary:
            a = getattr(layer, sp.attn)(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)
        else:
            a = getattr(layer, sp.attn)(x, attention_mask=mask)
        a = apply_keep(fire(hk.hook_attn_out, a[0] if isinstance(a, tuple) else a), keep_attn)
        h = fire(hk.hook_resid_mid, h + a)
        m = getattr(layer, sp.mlp)(getattr(layer, sp.mlp_norm)(fire(hk.hook_mlp_in, h, copy=True)))
        m = apply_keep(fire(hk.hook_mlp_out, m), keep_mlp)
        return fire(hk.hook_resid_post, h + m)

    def _mask(self, ctx: RunContext, h: torch.Tensor, src: int) -> Any:
        """The causal (or sliding-window) mask HF would build for this batch; None under SDPA (is_causal)."""
        from transformers import masking_utils

        kind = self._kinds[src]
        key = ("mask", kind, h.shape[0], h.dtype, h.device)
        if key not in ctx.extras:
            base = ("mask", kind, h.shape[0], h.dtype, None)  # built once, where the position ids are
            if base not in ctx.extras:
                build = (
                    masking_utils.create_sliding_window_causal_mask
                    if kind == "sliding_attention"
                    else masking_utils.create_causal_mask
                )
                pos = ctx.extras["position_ids"]
                like = torch.empty((), dtype=h.dtype, device=pos.device).expand(h.shape)  # shape/dtype only, no memory
                ctx.extras[base] = build(
                    config=self.hf_config, inputs_embeds=like, attention_mask=None, cache=None, position_ids=pos
                )
            m = ctx.extras[base]
            ctx.extras[key] = m.to(h.device) if isinstance(m, torch.Tensor) else m  # one copy per device
        return ctx.extras[key]

    def final_hidden(self, state: State, ctx: RunContext) -> torch.Tensor:
        """h_L (B, T, d) before the final norm (HF `hidden_states[-1]` is after it)."""
        return fire(self.hook_resid_final, state["h"])

    def head(self, state: State, ctx: RunContext) -> torch.Tensor:
        """state after the last layer -> logits (B, T, V)."""
        return resolve(self.hf, self.spec.lm_head)(self._normed_final(state, ctx))

    def _normed_final(self, state: State, ctx: RunContext) -> torch.Tensor:
        """Final norm of h_L (B, T, d), on the head's device."""
        h = self.final_hidden(state, ctx)
        if self.placement is not None:
            h = h.to(self.placement.head)
        return resolve(self.hf, self.spec.final_norm)(h)

    def unembedding(self) -> Unembedding | None:
        """final norm, then the `lm_head` Linear (the spec'd families apply nothing after it); None when the
        head module is not a plain nn.Linear."""
        lm_head = resolve(self.hf, self.spec.lm_head)
        if type(lm_head) is not nn.Linear or head_hooked(lm_head):
            return None
        return Unembedding(hidden=self._normed_final, weight=lm_head.weight, bias=lm_head.bias)

    def forward(self, tokens: torch.Tensor, **run_kw: Any) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V). Extra keywords go to `run_layers` (keep, order, unit...)."""
        ctx = self.context(tokens.shape[1], device=self.input_device)
        return self.head(self.run_layers(self.embed(tokens, ctx), ctx, **run_kw), ctx)

    # --- conveniences -----------------------------------------------------------------------------------
    def to_tokens(self, text: str | list[str], prepend_bos: bool | None = None) -> torch.Tensor:
        """TransformerLens-style tokenisation with the model's own tokenizer -> (B, T) long."""
        if self.tokenizer is None:
            raise ValueError("this model was loaded without tokenizer files; pass token ids instead")
        return self.tokenizer.to_tokens(text, prepend_bos=prepend_bos, device=self._param().device)

    def hook_names(self) -> list[str]:
        return list(self.hook_dict)

    def extra_repr(self) -> str:
        return f"family={self.spec.family}, n_layer={self.n_layer}, d_model={self.d_model}"


def _layer_kinds(config: Any, n_layer: int) -> list[str]:
    """Per-layer attention kind: config.layer_types (Qwen2/3) or a model-wide sliding window (Mistral)."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)[:n_layer]
    sliding = getattr(config, "sliding_window", None)
    return ["sliding_attention" if sliding else "full_attention"] * n_layer


# --- tiny offline configs (torchtitan's "debugmodel") ---------------------------------------------------


def debug_config(model_type: str, **overrides: Any) -> Any:
    """A tiny HF config for `model_type` (llama, mistral, qwen2, qwen3, gpt2), built offline: 4 layers,
    d = 32, GQA 4/2, vocab 101. Build the model with `AutoModelForCausalLM.from_config(cfg)`."""
    from transformers import AutoConfig

    spec_for(model_type)  # refuse families without an adapter
    if model_type == "gpt2":
        kw: dict[str, Any] = dict(
            vocab_size=101, n_embd=32, n_layer=4, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
        )
    else:
        kw = dict(
            vocab_size=101,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
            bos_token_id=1,
            eos_token_id=2,
        )
    kw.update(overrides)
    return AutoConfig.for_model(model_type, **kw)


# --- loading ------------------------------------------------------------------------------------------


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of an HF model directory as a dict; CheckpointError (one line) if absent or invalid."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such model directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: an HF model is a directory (config.json + *.safetensors)")
    from depthlens.io.checkpoint import read_json_object

    return read_json_object(path / "config.json", "model config")


def wrap(hf_model: nn.Module, tokenizer: Any = None) -> Any:
    """A loaded HF causal LM as a LayeredLM: its family's hand-mapped adapter when there is one
    (`adapter_path = "hand-mapped"`), else the block-level generic path (`GenericBlocksModel`,
    `adapter_path = "generic-blocks"`), which refuses with one line what it cannot handle."""
    mt = getattr(hf_model.config, "model_type", None)
    try:
        spec = spec_for(mt)
    except CheckpointError:
        from .generic import GenericBlocksModel

        return GenericBlocksModel(hf_model, tokenizer=tokenizer)
    return HFLayeredModel(hf_model, spec, tokenizer=tokenizer)


def check_model_type(raw: dict[str, Any], where: Any) -> None:
    """Before loading (config.json only): a family with an adapter, or a decoder-only causal LM transformers
    itself implements (generic path; repository code never runs). CheckpointError (one line) otherwise."""
    model_type = raw.get("model_type")
    if raw.get("is_encoder_decoder"):
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is an encoder-decoder; depthlens analyses decoder-only causal LMs"
        )
    try:
        spec_for(model_type)
        return
    except CheckpointError as e:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise CheckpointError(
                f"{where}: {e}; and transformers has no built-in causal LM for it (repository code is never run)"
            ) from None


def load_hf(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    tokenizer: bool = True,
    config: dict[str, Any] | None = None,
    device_map: Any = None,
) -> Any:
    """Load a local HF causal-LM directory (safetensors only) and wrap it (`wrap`: HFLayeredModel for the
    hand-mapped families, GenericBlocksModel otherwise). Never touches the Hub and never
    runs repository code (`trust_remote_code=False`, `use_safetensors=True`). Use `depthlens.adapters.load.
    open_model` to get the loader's header, dtype and NaN checks as well.

    dtype: float32 by default (diagnostics want fp32); "auto" keeps the checkpoint's dtype. config: the
    already-parsed config.json (read here when not given). device_map: place the model over several devices
    instead of moving it to `device` (`place_model`): the weights are read into host memory first.
    Raises CheckpointError with one line for a missing, incomplete, unsupported or corrupt model.
    """
    from transformers import AutoModelForCausalLM

    from ..io.weights import refuse_pickle, safetensors_files

    raw = config if config is not None else read_hf_config(path)
    check_model_type(raw, path)
    refuse_pickle(Path(path))
    if not safetensors_files(Path(path)):
        raise CheckpointError(f"{path}: no weights (expected model.safetensors or model.safetensors.index.json)")
    kw: dict[str, Any] = {
        "dtype": dtype,
        "output_loading_info": True,
        "local_files_only": True,
        "trust_remote_code": False,
        "use_safetensors": True,
    }
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    try:
        with _quiet_hf():
            hf, info = cast(tuple[Any, dict[str, Any]], AutoModelForCausalLM.from_pretrained(str(path), **kw))
    except CheckpointError:
        raise
    except Exception as e:  # transformers/safetensors raise many types for a corrupt dir; report one line
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
        raise CheckpointError(f"{path}: cannot load HF model ({e.__class__.__name__}: {first})") from None
    missing = sorted(info.get("missing_keys") or [])
    bad = sorted(info.get("mismatched_keys") or [])
    if missing or bad:
        what = missing[0] if missing else bad[0]
        raise CheckpointError(
            f"{path}: weights do not match config.json ({len(missing)} missing, {len(bad)} "
            f"mismatched tensor(s), e.g. {what})"
        )
    if device_map is None:
        hf.to(device)
    hf.eval()
    tok = None
    if tokenizer:
        from .tokenizer import load_hf_tokenizer

        tok = load_hf_tokenizer(path)
    return place_model(wrap(hf, tok), device_map)


def place_model(model: Any, device_map: Any) -> Any:
    """`model.place(device_map)` (hand-mapped adapter or generic-blocks path); None leaves it where it is."""
    if device_map is None:
        return model
    return model.place(device_map)


class _quiet_hf:
    """Silence transformers' progress bars and info logs while loading (restored afterwards), including the
    plain tqdm bar of its GGUF dequantiser, whose count goes to `progress(done, total)` instead when given."""

    def __init__(self, progress: Any = None):
        self.progress = progress

    def __enter__(self) -> None:
        import sys

        from transformers.utils import logging as hf_logging

        self._bar = hf_logging.is_progress_bar_enabled()
        self._level = hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        self._gguf: Any = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
        if self._gguf is None:
            import importlib

            try:
                self._gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
            except ImportError:
                self._gguf = None
        if self._gguf is not None and hasattr(self._gguf, "tqdm"):
            self._tqdm = self._gguf.tqdm
            self._gguf.tqdm = (lambda it, *a, **k: it) if self.progress is None else self._counted

    def _counted(self, it: Any, *a: Any, **k: Any) -> Any:
        items = list(it)
        self.progress(0, len(items))  # the count starts here (after the imports and the header read)
        for i, x in enumerate(items):
            yield x
            self.progress(i + 1, len(items))

    def __exit__(self, *exc: Any) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(self._level)
        if self._bar:
            hf_logging.enable_progress_bar()
        if self._gguf is not None and hasattr(self, "_tqdm"):
            self._gguf.tqdm = self._tqdm
