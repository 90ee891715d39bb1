"""The `prune` command: remove the layers a criterion picks on calibration data, as many as a held-out bound
allows, and write the pruned model (in the input's format) with its certificate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from .app import QuietOpt, app, domain_errors, fail
from .common import EVAL_DEFAULTS, CkptArg, Common, JsonOpt, busy, eval_data, open_model, some_eval_options

CERTIFICATE = "prune_certificate.json"


@app.command()
@domain_errors
@some_eval_options("data", "n_seq", "seq_len", "batch_size", "seed", "threads", n_seq=16)  # on cpu, in fp32
def prune(
    ckpt: CkptArg,
    tolerance: Annotated[
        float, typer.Option("--tolerance", help="Largest held-out Δloss (nats/token, one-sided 95 % bound) allowed.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the pruned model and its certificate.")],
    criterion: Annotated[
        str | None,
        typer.Option(
            "--criterion",
            help="How layers are picked on the calibration windows: angular_block, block_influence, skip_loss, "
            "causal, permutation, greedy, predicted (default: greedy; docs/concepts.md#layer-pruning says why).",
        ),
    ] = None,
    k_max: Annotated[int | None, typer.Option("--k-max", min=1, help="Largest k tried (default: L - 2).")] = None,
    c: Common = EVAL_DEFAULTS,  # --data .. --threads (common.some_eval_options)
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Prune a model as far as a held-out bound allows, and certify it.

    The eval windows are split in two folds, stratified by domain (prose, code); the criterion ranks layers on
    fold 0, and k grows while the paired one-sided 95 % upper bound on the mean Δloss of fold 1 stays within
    --tolerance in every domain. The pruned model is written in the input's own format (a GGUF file: a Hugging
    Face directory) with prune_certificate.json (criterion, layers removed, Δloss and bound per domain, eval
    data hashes, method). Every cut it measures is kept in the cache (prune-journal/): a rerun on the same model
    and eval data, after a stop or with another tolerance, criterion or k-max, replays them."""
    from ..diagnostics.pruning_heldout import CRITERIA, DEFAULT_CRITERION

    criterion = criterion or DEFAULT_CRITERION
    if not (tolerance > 0 and math.isfinite(tolerance)):
        fail(f"--tolerance must be a finite number > 0 (nats/token), got {tolerance}", 2)
    if criterion not in CRITERIA:
        fail(f"--criterion must be one of {', '.join(CRITERIA)}; got {criterion!r}", 2)
    from ..adapters.userref import parse_ref

    ref = parse_ref(ckpt)
    if ref is not None:  # prune writes the pruned model in its input's format: a described model is the user's code
        fail(
            f"{ref.name}: prune writes the pruned model in its input's format, and a described model is your own "
            "code, which depthlens does not rewrite; remove the layers there (causal, permute and report rank them)",
            1,
        )
    src, dst = Path(ckpt).resolve(), Path(out).resolve()
    home = src if src.is_dir() else src.parent
    if dst in (src, home) or (src.is_dir() and src in dst.parents):
        fail(f"--out {out} is the input model's own directory (or inside it); give a new directory", 2)
    if dst.exists():
        fail(f"--out {out} exists; give a new directory", 2)
    if not src.exists():
        fail(f"{ckpt}: no such checkpoint directory or GGUF file", 1)
    model, ck = open_model(ckpt, c)
    ev = eval_data(model, ck, c)
    from ..diagnostics.pruning_heldout import certify

    journal = _journal_dir(src, ev, c.batch_size)
    kept = sum(max(0, len(f.read_text().splitlines()) - 1) for f in journal.glob("*.jsonl")) if journal.is_dir() else 0
    if kept:
        typer.echo(
            f"replaying up to {kept} cuts an earlier run computed on this model and eval data, if its journal "
            f"matches this run (threads, versions, clean losses; else it is set aside): {journal}",
            err=True,
        )
    with busy(f"prune {Path(ckpt).name}") as p:
        cert = certify(
            model, ev, criterion=criterion, tolerance=tolerance, k_max=k_max, progress=p.engine(), journal=journal
        )
    cert["criterion_default"] = criterion == DEFAULT_CRITERION and DEFAULT_CRITERION
    cert["model"] = {"input": str(src), "output": str(dst)}
    if cert["k"] == 0:
        first = cert["steps"][0]["scopes"] if cert["steps"] else {}
        bounds = ", ".join(f"{s} {v['upper_bound']:.4f}" for s, v in first.items())
        fail(f"no layer can go within --tolerance {tolerance}: at k = 1 the bounds are {bounds}; nothing written", 1)
    _write(model, ck, cert, dst)
    if as_json:
        typer.echo(json.dumps(cert, indent=1))
        return
    typer.echo(f"{ckpt}: removed {cert['k']} of {cert['n_layer_before']} layers {cert['layers_removed']} ({criterion})")
    for s, r in cert["result"].items():
        typer.echo(
            f"  {s}: Δloss {r['delta']:+.4f} nats/token, 95 % upper bound {r['upper_bound']:.4f} <= {tolerance} "
            f"({r['n_sequences']} held-out sequences; largest k within tolerance {cert['k_within_tolerance'][s]})"
        )
    typer.echo(f"wrote {dst} and {dst / CERTIFICATE}")


def _journal_dir(src: Path, ev: Any, batch_size: int | None) -> Path:
    """Where this model's cuts on this eval data are kept (`<cache>/prune-journal/<key>/`): a stopped prune
    rerun, or one with another --tolerance, --criterion or --k-max, replays them. The journal checks its own
    identity (the clean losses bit for bit, threads, versions), so a changed file at the same path starts afresh."""
    import hashlib

    from ..runtime.evaldata import cache_dir

    key = hashlib.sha256(f"{src}\0{ev.sha256}\0{batch_size}".encode()).hexdigest()[:16]
    return cache_dir() / "prune-journal" / key


def _write(model: Any, ck: Path, cert: dict[str, Any], dst: Path) -> None:
    """The pruned model in the input's format and its certificate, written in a temporary sibling directory and
    renamed into place (no partial output)."""
    import shutil
    import tempfile

    from ..adapters import prune as pr

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    removed = cert["layers_removed"]
    try:
        hf = getattr(model, "hf", None)
        if hf is not None:
            pr.prune_hf(hf, model.layers, removed)
            note = pr.write_hf(hf, tmp, Path(ck))
            note["input_format"] = "gguf" if Path(ck).is_file() else "hf"
        else:
            inner = tmp / "checkpoint"
            note = pr.write_native(pr.prune_native(model, removed), inner, Path(ck))
            for f in list(inner.iterdir()):
                shutil.move(str(f), str(tmp / f.name))
            inner.rmdir()
            note["input_format"] = "depthlens"
        cert["model"].update(note)
        (tmp / CERTIFICATE).write_text(json.dumps(cert, indent=1) + "\n", encoding="utf-8")
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
