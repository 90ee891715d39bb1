"""Which code trained a checkpoint, and the warning `depthlens info` gives when the training code changed since."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from depthlens._version import __version__
from depthlens.training import provenance
from depthlens.training.provenance import TRAINING_CODE, code_version, code_version_warning, training_code_changes

REPO = Path(__file__).resolve().parents[1]


def _git(*args):
    out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO)
    return out.stdout.strip() if out.returncode == 0 else None


def test_code_version_fields():
    v = code_version()
    assert v["depthlens_version"] == __version__ and v["git_sha"] == _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--", *TRAINING_CODE)
    assert v["git_training_code_dirty"] == (None if dirty is None else bool(dirty))


def test_training_code_changes_against_git():
    head = _git("rev-parse", "HEAD")
    if head is None:
        pytest.skip("not a git checkout")
    expected = sorted(filter(None, (_git("diff", "--name-only", head, "--", *TRAINING_CODE) or "").splitlines()))
    assert training_code_changes(head) == expected
    first = _git("rev-list", "--max-parents=0", "HEAD")
    if first:  # the first commit: every training file written since differs from it
        changed = training_code_changes(first.splitlines()[0])
        assert changed is not None and "depthlens/training/trainer.py" in changed
    assert training_code_changes("0" * 40) is None  # not in this history: unknown, not "unchanged"


def test_warning_lines(monkeypatch):
    assert "does not record" in code_version_warning({})
    assert "uncommitted" in code_version_warning({"git_sha": "a" * 40, "git_training_code_dirty": True})
    unknown = {"git_sha": "0" * 40}
    assert code_version_warning({**unknown, "depthlens_version": __version__}) is None
    assert f"running {__version__}" in code_version_warning({**unknown, "depthlens_version": "0.0.1"})
    monkeypatch.setattr(provenance, "training_code_changes", lambda sha: ["depthlens/models/model.py"])
    line = code_version_warning({"git_sha": "b" * 40})
    assert "bbbbbbbbbb" in line and "depthlens/models/model.py" in line and "\n" not in line
    monkeypatch.setattr(provenance, "training_code_changes", lambda sha: [])
    assert code_version_warning({"git_sha": "b" * 40}) is None


def test_a_listed_code_move_does_not_warn_and_anything_else_does(monkeypatch):
    """recipes/code_moves.json: every listed commit exists in this history (when it is there at all) and
    touched training code; a checkpoint trained just before a listed move does not warn, and it does as soon as
    the list is empty (the list, nothing else, is what stops the warning)."""
    moves = provenance.code_moves()
    assert moves, "recipes/code_moves.json lists no move"
    for sha in moves:
        if _git("cat-file", "-e", f"{sha}^{{commit}}") is None:
            pytest.skip("the listed commits are not in this checkout's history (a shallow clone)")
        assert _git("diff", "--name-only", f"{sha}^", sha, "--", *TRAINING_CODE), sha
    if _git("diff", "--name-only", "HEAD", "--", *TRAINING_CODE):
        pytest.skip("uncommitted training-code edits: every checkpoint warns")
    before = _git("rev-parse", f"{sorted(moves)[0]}^")
    later = _git("rev-list", f"{before}..HEAD", "--", *TRAINING_CODE).split()
    if not set(later) <= moves:
        pytest.skip("training code changed after the listed moves")
    assert training_code_changes(before) == [] and code_version_warning({"git_sha": before}) is None
    monkeypatch.setattr(provenance, "code_moves", set)
    changed = training_code_changes(before)
    assert changed and "depthlens/training/trainer.py" in changed
    assert "a retrain from its recipe may not reproduce" in code_version_warning({"git_sha": before})
