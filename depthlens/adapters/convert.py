"""depthlens <-> Hugging Face LLaMA: export a Pre-LN/LNS checkpoint, import a LLaMA directory back.

    export_llama(ckpt_or_model, out_dir)   -> out_dir with config.json + model.safetensors (+ depthlens_export.json)
    import_llama(hf_dir, out_dir, arch=...) -> a depthlens checkpoint directory (depthlens.io.checkpoint format)

Both go through the explicit key map in `llama.py`; no other renaming happens anywhere.

LNS (docs/designs.md#single-stream) is exactly Pre-LN with the two norm gains of layer l (1-based) divided by
sqrt(l): `N(h) * (1/sqrt(l)) == (gamma / sqrt(l)) * h / rms(h)`. Export folds the factor into
`input_layernorm` and `post_attention_layernorm` of that layer; `import_llama(..., arch="lns")` unfolds it.
The final norm is not scaled. Note the folded model moves the factor *with* the layer under a layer swap,
so HF-side swaps of an exported LNS model equal native `swap="all"`, not `swap="body"`.

Only safetensors are written and read (never pickle). Export writes the tensors directly, so no HF model
is instantiated and memory stays at one copy of the weights.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, DepthlensError
from ..io.atomic import atomic_dir
from .base import invert, rename
from .llama import LLAMA_KEYS

EXPORTABLE = ("preln", "lns")
SIDE_CAR = "depthlens_export.json"


def lns_scale(layer: int) -> float:
    """1/sqrt(l) for 0-based layer index `layer` (l = layer + 1, the 1-based LAYER index)."""
    return 1.0 / math.sqrt(layer + 1)


def _fold_lns(state: dict[str, torch.Tensor], n_layer: int, power: int) -> dict[str, torch.Tensor]:
    """Multiply the two norm gains of every layer by lns_scale**power (+1 folds, -1 unfolds). Keys: depthlens."""
    out = dict(state)
    for l in range(n_layer):
        for site in ("attn", "mlp"):
            k = f"blocks.{l}.{site}.norm.weight"
            out[k] = state[k] * (lns_scale(l) ** power)
    return out


def hf_llama_config(cfg: Any, *, bos_id: int | None = None) -> Any:
    """A `transformers.LlamaConfig` for a depthlens ModelConfig (preln/lns)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len,
        # transformers 5 still takes the legacy keyword at run time (into rope_parameters) but no longer types it
        rope_theta=float(cfg.rope_theta),  # type: ignore[call-arg]
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=bos_id,
        eos_token_id=None,
        pad_token_id=None,
        architectures=["LlamaForCausalLM"],
    )


def export_llama(model_or_path: Any, out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write a depthlens `preln`/`lns` model (or checkpoint directory) as an HF `LlamaForCausalLM` directory."""
    from safetensors.torch import save_file

    from .._version import __version__
    from ..io import checkpoint

    src = None
    if isinstance(model_or_path, (str, os.PathLike)):
        src = str(model_or_path)
        model_or_path = checkpoint.load(model_or_path).model
    model, cfg = model_or_path, model_or_path.config
    if cfg.arch not in EXPORTABLE:
        raise CheckpointError(f"export to LLaMA supports {', '.join(EXPORTABLE)}; {cfg.arch!r} has no LLaMA equivalent")
    out = Path(out_dir)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    if cfg.arch == "lns":
        state = _fold_lns(state, cfg.n_layer, +1)
    hf_state = rename(state, invert(LLAMA_KEYS), what="depthlens->llama")
    side = {
        "depthlens_version": __version__,
        "source_arch": cfg.arch,
        "lns_folded": int(cfg.arch == "lns"),
        "source": src,
        "model": cfg.to_dict(),
    }
    try:  # built whole, swapped in; replaces only an earlier export (depthlens.io.atomic)
        with atomic_dir(out, overwrite=overwrite, kinds=("converted checkpoint",), flag="overwrite=True") as tmp:
            save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            hf_llama_config(cfg).save_pretrained(str(tmp))
            (tmp / SIDE_CAR).write_text(json.dumps(side, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except CheckpointError:
        raise
    except DepthlensError as e:
        raise CheckpointError(str(e)) from None
    return out


def depthlens_config_from_hf(hf_cfg: Any, *, arch: str = "preln") -> Any:
    """ModelConfig for an HF LLaMA/Mistral config; CheckpointError if the model is not a plain Pre-LN LLaMA."""
    from ..models.config import ModelConfig

    where = f"{hf_cfg.model_type} config"

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise CheckpointError(f"{where}: {msg}; cannot import as a depthlens model (analyse it with load_hf)")

    need(hf_cfg.model_type in ("llama", "mistral"), "only llama/mistral import losslessly")
    need(getattr(hf_cfg, "hidden_act", "silu") == "silu", f"hidden_act {hf_cfg.hidden_act!r} is not silu")
    need(not getattr(hf_cfg, "attention_bias", False) and not getattr(hf_cfg, "mlp_bias", False), "has biases")
    need(getattr(hf_cfg, "pretraining_tp", 1) == 1, "pretraining_tp != 1")
    rp = dict(getattr(hf_cfg, "rope_parameters", None) or getattr(hf_cfg, "rope_scaling", None) or {})
    need(rp.get("rope_type", rp.get("type", "default")) == "default", f"rope scaling {rp.get('rope_type')!r}")
    theta = rp.get("rope_theta", getattr(hf_cfg, "rope_theta", 10000.0))
    d, H = hf_cfg.hidden_size, hf_cfg.num_attention_heads
    need((getattr(hf_cfg, "head_dim", None) or d // H) * H == d, "head_dim * heads != hidden_size")
    window = getattr(hf_cfg, "sliding_window", None)
    need(window is None or window >= hf_cfg.max_position_embeddings, f"sliding_window {window} is active")
    try:
        return ModelConfig(
            arch=arch,
            d_model=d,
            n_layer=hf_cfg.num_hidden_layers,
            n_head=H,
            n_kv_head=hf_cfg.num_key_value_heads or H,
            vocab_size=hf_cfg.vocab_size,
            d_ff=hf_cfg.intermediate_size,
            max_seq_len=hf_cfg.max_position_embeddings,
            rope_theta=float(theta),
            norm_eps=float(hf_cfg.rms_norm_eps),
            tie_embeddings=bool(hf_cfg.tie_word_embeddings),
        )
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) safetensors HF directory."""
    from safetensors.torch import load_file

    files = [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.exists():
        from ..io.weights import safetensors_files

        files = safetensors_files(path)  # the index read through io.files, its shards confined to the directory
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.exists():
            raise CheckpointError(f"{path}: missing {f.name} (import reads safetensors only)")
        try:
            state.update(load_file(str(f), device="cpu"))
        except Exception as e:
            raise CheckpointError(f"{f}: unreadable safetensors file ({str(e).splitlines()[0]})") from None
    return state


def import_llama(
    hf_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    arch: str = "preln",
    overwrite: bool = False,
) -> Any:
    """Read an HF LLaMA/Mistral directory as a depthlens model (`preln`, or `lns` to unfold exported gains).

    Returns the DepthModel; also writes a depthlens checkpoint to `out_dir` when given.
    """
    from transformers import AutoConfig

    from ..io import checkpoint
    from ..models.model import DepthModel
    from .hf import read_hf_config

    if arch not in EXPORTABLE:
        raise ValueError(f"arch must be one of {EXPORTABLE}, got {arch!r}")
    path = Path(hf_dir)
    read_hf_config(path)  # one-line errors for a missing/invalid directory
    hf_cfg = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    cfg = depthlens_config_from_hf(hf_cfg, arch=arch)
    hf_state = _read_safetensors(path)
    if cfg.tie_embeddings:
        hf_state.pop("lm_head.weight", None)
    state = rename(hf_state, LLAMA_KEYS, what=f"{hf_cfg.model_type}->depthlens")
    if arch == "lns":
        state = _fold_lns(state, cfg.n_layer, -1)
    model = DepthModel(cfg)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if cfg.tie_embeddings else set())
    missing = sorted(expected - set(state))
    if missing:
        example = invert(LLAMA_KEYS).get(missing[0], missing[0])
        raise CheckpointError(f"{path}: missing {len(missing)} tensor(s), e.g. {example}")
    model.load_state_dict(state, strict=not cfg.tie_embeddings)
    model.eval()
    if out_dir is not None:
        checkpoint.save(
            model, out_dir, overwrite=overwrite, train={"imported_from": str(path), "hf_model_type": hf_cfg.model_type}
        )
    return model
