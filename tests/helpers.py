"""Small shared test helpers (imported by test modules; pytest puts tests/ on sys.path)."""

from __future__ import annotations

from typing import Any

from depthlens.models.config import ModelConfig
from depthlens.models.model import build_model

# the smallest eval set a command accepts quickly: the CLI tests' one option set (tests that read intervals need
# more sequences and say so where they set their own)
FAST = ["--n-seq", "2", "--seq-len", "16"]
FAST_NO_BOOT = [*FAST, "--n-boot", "0"]  # commands that bootstrap by default: no resamples
# commands that draw intervals (report, compare, track) need more than two sequences: four, and few resamples
FAST_INTERVALS = ["--n-seq", "4", "--seq-len", "16"]
FAST_N_BOOT = 20
FAST_BOOT = [*FAST_INTERVALS, "--n-boot", str(FAST_N_BOOT)]


def debug_model(arch: str = "preln", n_layer: int = 4, seed: int = 0, **kw: Any):
    """A tiny CPU model of design `arch` in eval mode (torchtitan's "debugmodel")."""
    return build_model(ModelConfig.debug(arch, n_layer=n_layer, **kw), seed=seed).eval()


def count_calls(monkeypatch: Any, owner: Any, name: str) -> list[int]:
    """Wrap `owner.name` (for the test's duration) so it counts its calls: the returned one-element list."""
    calls = [0]
    real = getattr(owner, name)

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(owner, name, counted)
    return calls


def load_script(name: str) -> Any:
    """scripts/<name>.py as a module (scripts are not a package): what a test calls in place of the command."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_hf(model_type: str, **overrides: Any):
    """A tiny randomly initialised Hugging Face causal LM of `model_type` (transformers' own class, seed 0, eval
    mode, no download): 2 layers of width 16 unless `overrides` (any config field) say otherwise."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(
        vocab_size=61,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**fields, **overrides})).eval()


def cli_commands() -> dict[str, Any]:
    """Every `depthlens` command by name: the dedicated ones and those built from registry entries (rank, the lens
    family, mixing: `cli/diagnostic.py`), as `depthlens --help` lists them."""
    import click
    import typer

    from depthlens.cli import app

    group = typer.main.get_command(app)
    ctx = click.Context(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}  # type: ignore[attr-defined]
