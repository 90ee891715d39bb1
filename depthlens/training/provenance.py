"""Which code trained a checkpoint, and whether the code running now could retrain it bit for bit.

The trainer records the git commit of the checkout it ran from (`git_sha` in train.json). Retraining from the
recipe reproduces the weights bit for bit when the code that trains (models, trainer, data) is the same:
`tests/test_retrain.py` checks that on a shipped checkpoint. Between two commits, `training_code_changes`
lists the training-code files that differ; `depthlens info` warns when that list is not empty.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from .._version import __version__

# The code that decides what training computes: a change here may change the weights a recipe produces. Left out
# (git pathspecs): this file, which only records and compares code versions, and the LR check's planner
# (lr400.py), which only writes recipes and reads finished runs back; a run's recipe is in its own train.json.
TRAINING_CODE = (
    "depthlens/models",
    "depthlens/training",
    "depthlens/data",
    ":(exclude)depthlens/training/provenance.py",
    ":(exclude)depthlens/training/lr400.py",
)
_REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=_REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_sha() -> str | None:
    """The commit of the checkout depthlens runs from (None when it is not a git checkout)."""
    out = _git("rev-parse", "HEAD")
    return out.strip() or None if out else None


def code_version() -> dict[str, Any]:
    """What train.json records about the code: package version, commit, and whether training code was edited."""
    dirty = _git("status", "--porcelain", "--", *TRAINING_CODE)
    return {
        "depthlens_version": __version__,
        "git_sha": git_sha(),
        "git_training_code_dirty": None if dirty is None else bool(dirty.strip()),
    }


# Commits that only moved training code between files (nothing it computes changed), each verified by a bit-exact
# retrain: lives outside TRAINING_CODE, so that listing a commit is not itself a change to the training code.
CODE_MOVES = _REPO / "depthlens" / "recipes" / "code_moves.json"


def cpu_identity() -> dict[str, str | None]:
    """Which CPU kernels computed a run: the processor's model name (/proc/cpuinfo; platform's on other systems) and
    the SIMD level torch dispatches to (`torch.backends.cpu.get_cpu_capability()`: "AVX2", "AVX512", ...). Float
    results of the same code and data differ in their last bits between CPUs whose kernels differ (an L = 4 zoo
    run retrained on another CPU ends 1e-6 nats apart, its weights 0.2 % apart), so a bit-for-bit retrain is
    promised only where both match (tests/test_retrain.py)."""
    import platform

    import torch

    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return {"model": model or platform.processor() or None, "capability": torch.backends.cpu.get_cpu_capability()}


def same_cpu(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two `cpu_identity` records name the same processor and SIMD level (False when either is unknown)."""
    return bool(
        a and b and a.get("model") and a.get("model") == b.get("model") and a.get("capability") == b.get("capability")
    )


def code_moves() -> set[str]:
    """The full commit hashes listed in recipes/code_moves.json (empty when it is missing or unreadable)."""
    import json

    try:
        return {str(m["commit"]) for m in json.loads(CODE_MOVES.read_text())["moves"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def training_code_changes(sha: str) -> list[str] | None:
    """Training-code files that differ between commit `sha` and the working tree (None: unknown - no git, or
    `sha` is not in this checkout's history). [] also when every commit since `sha` that touched the training
    code is a verified move (`code_moves`) and the working tree has no edits there: the code computes the same."""
    if not sha or _git("cat-file", "-e", f"{sha}^{{commit}}") is None:
        return None
    out = _git("diff", "--name-only", sha, "--", *TRAINING_CODE)
    if out is None:
        return None
    changed = sorted(line for line in out.splitlines() if line.strip())
    if changed:
        commits = _git("rev-list", f"{sha}..HEAD", "--", *TRAINING_CODE)
        edits = _git("diff", "--name-only", "HEAD", "--", *TRAINING_CODE)
        if commits and edits is not None and not edits.strip() and set(commits.split()) <= code_moves():
            return []
    return changed


def code_version_warning(train: dict[str, Any]) -> str | None:
    """One line when the code running now differs from the code that trained a checkpoint (its train.json),
    so a retrain from its recipe may not reproduce it bit for bit; None when it does not, or nothing is known."""
    sha = train.get("git_sha")
    if not sha:
        return "this checkpoint does not record the code that trained it; a retrain may differ"
    if train.get("git_training_code_dirty"):
        return f"trained from commit {sha[:10]} with uncommitted training-code edits; a retrain may differ"
    changed = training_code_changes(sha)
    if changed is None:
        version = train.get("depthlens_version")
        if version and version != __version__:
            return f"trained with depthlens {version}, running {__version__}; a retrain may differ"
        return None
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return (
            f"training code changed since commit {sha[:10]} that trained this checkpoint "
            f"({', '.join(changed[:3])}{more}); a retrain from its recipe may not reproduce it bit for bit"
        )
    return None
