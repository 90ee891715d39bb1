"""The untrained twin of a loaded model: the same config and tokenizer through the same adapter path, with
freshly initialised weights.

A diagnostic read on a trained model says something about training only beside the same reading on its
twin: much of a share (the causal max, Pre-LN's residual growth) is already set by the architecture at
initialisation. depthlens checkpoints get the trainer's exact step-0 weights for their training seed
(`build_model(config, seed)`); a foreign model gets its family's initialisation as transformers implements it
(`type(hf)(config)`: `_init_weights`, normal with the config's `initializer_range`). That is a fresh init of the
same architecture, not the weights its makers started from: their init scheme and seed are not published, two of
the atlas's models are instruct fine-tunes and Qwen2.5-Coder was continued from Qwen2.5, so it is a control for
what the architecture does at initialisation, not the model's own step 0.

A fresh init also changes the scale of everything (norm gains of 1, embeddings of std `initializer_range`), so its
loss sits at chance. `shuffled_twin` is the second control: the trained weights with the entries of every matrix
permuted at random (each matrix keeps its trained distribution of values, norm gains and biases are kept as
trained), so it keeps the trained model's norms and embedding scale and loses only what the arrangement of the
weights learnt.
"""

from __future__ import annotations

from typing import Any

from ..errors import DepthlensError


def untrained_twin(model: Any, seed: int = 0) -> Any:
    """The model of `model`'s config at initialisation (seed `seed`), in eval mode, on its device and dtype.

    depthlens models: `build_model(config, seed)`; HF and GGUF models (`model.hf`): the HF class built from
    the same config under `torch.manual_seed(seed)` and wrapped like the original (hand-mapped or generic);
    described models (FILE.py:FUNCTION with weights): FUNCTION's own init under `torch.manual_seed(seed)`, no
    weights loaded (`described_twin`)."""
    import torch

    from ..models.config import ModelConfig

    if getattr(model, "adapter_path", None) == "described":  # FUNCTION() again, under the seed, no weights loaded
        return described_twin(model, seed=seed)
    p = next(model.parameters())
    cfg = getattr(model, "config", None)
    if isinstance(cfg, ModelConfig):
        from ..models.model import build_model

        return build_model(cfg, seed=seed).to(device=p.device, dtype=p.dtype).eval()
    hf = getattr(model, "hf", None)
    if hf is None:
        raise DepthlensError(f"no untrained twin for a {type(model).__name__}: neither a depthlens nor an HF model")
    from .hf import wrap

    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        torch.manual_seed(seed)
        twin = type(hf)(hf.config)
    return wrap(twin.to(device=p.device, dtype=p.dtype).eval(), getattr(model, "tokenizer", None))


def described_twin(model: Any, seed: int | None = None) -> Any:
    """The untrained model of a described model opened from FILE.py:FUNCTION with weights: FUNCTION() run again
    (its file imported afresh) under `torch.manual_seed(seed)`, with no weights loaded, on the model's device,
    dtype and placement; its provenance records `untrained_init`. The caller's random stream is left as it was.

    Refused with one line (DescriptionError) when depthlens cannot rebuild it: a model built in Python (it has no
    FILE.py:FUNCTION), a model analysed without weights (it is FUNCTION's own init already), or a FUNCTION that
    returns a module it did not build (the twin would share the analysed model's parameters)."""
    import torch

    from .described import TWIN_SEED, DescriptionError, untrained_init

    seed = TWIN_SEED if seed is None else seed
    from .load import open_model, opened_of
    from .userref import Ref, parse_ref

    op = opened_of(model)
    ref = parse_ref(op.meta.path) if op is not None and op.meta.kind == "described" else None
    if ref is None:
        raise DescriptionError(
            "no untrained twin for a model described in Python: depthlens rebuilds one only from FILE.py:FUNCTION"
        )
    if ref.weights is None:
        raise DescriptionError(
            f"no untrained twin: {ref.name} is analysed without --weights, as FUNCTION builds it (its own init)"
        )
    p = next(model.module.parameters())
    where: dict[str, Any] = {"device": str(p.device)} if model.placement is None else {"device_map": model.placement}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        twin_op = open_model(str(Ref(ref.file, ref.function)), **where)
    twin = twin_op.model
    if next(twin.module.parameters()).dtype != p.dtype:  # the model was opened in another dtype: the same cast
        twin.module.to(p.dtype)
    mine = {id(t) for t in model.module.parameters()}
    if any(id(t) in mine for t in twin.module.parameters()):
        raise DescriptionError(
            f"no untrained twin: {ref.name} returns a module it did not build (its parameters are the analysed "
            "model's); build the model inside FUNCTION"
        )
    twin_op.provenance["untrained_init"] = untrained_init(seed)
    twin_op.provenance["untrained_twin_of"] = str(ref)
    twin.eval()
    return twin


def shuffled_twin(model: Any, seed: int = 0) -> Any:
    """A copy of `model` whose every weight matrix (≥ 2 dimensions: projections, embeddings, the LM head) has its
    entries permuted at random (seed `seed`), each matrix by its own permutation; vectors (norm gains, biases)
    are kept as trained. Tied matrices stay tied (one permutation per tensor object). In eval mode, on the
    model's device and dtype; the caller's random stream is left as it was."""
    import copy

    import torch

    twin = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    done: set[int] = set()
    with torch.no_grad():
        for _, p in sorted(twin.named_parameters(remove_duplicate=True), key=lambda kv: kv[0]):
            if p.dim() < 2 or id(p) in done:
                continue
            done.add(id(p))
            perm = torch.randperm(p.numel(), generator=g).to(p.device)
            p.copy_(p.reshape(-1)[perm].reshape(p.shape))
    op = getattr(model, "_depthlens_opened", None)
    if op is not None:  # the twin is not the opened model: drop the inherited record
        try:
            object.__delattr__(twin, "_depthlens_opened")
        except AttributeError:
            pass
    return twin.eval()
