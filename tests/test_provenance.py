"""Which code trained a checkpoint, and the warning `depthlens info` gives when the training code changed since."""

from __future__ import annotations

import json
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


def test_the_listed_code_moves_touched_training_code():
    """recipes/code_moves.json lists at least one move, and each listed commit, where this checkout has it (not in
    a shallow clone), changed files of the training code: a listed commit that did not would be a typo."""
    moves = provenance.code_moves()
    assert moves, "recipes/code_moves.json lists no move"
    present = [sha for sha in sorted(moves) if _git("cat-file", "-e", f"{sha}^{{commit}}") is not None]
    if not present:
        pytest.skip("the listed commits are not in this checkout's history (a shallow clone)")
    for sha in present:
        assert _git("diff", "--name-only", f"{sha}^", sha, "--", *TRAINING_CODE), sha


def _history(root: Path, commits: list[tuple[str, dict[str, str]]]) -> list[str]:
    """One commit per (message, {path: text}), in order, in the git repository at `root` (made when new); their
    full hashes."""

    def git(*args: str) -> str:
        who = [
            "-c",
            "user.name=depthlens tests",
            "-c",
            "user.email=tests@depthlens.invalid",
            "-c",
            "commit.gpgsign=false",
        ]
        out = subprocess.run(["git", *who, *args], capture_output=True, text=True, cwd=root, check=True)
        return out.stdout.strip()

    if not (root / ".git").exists():
        root.mkdir(parents=True)
        git("init", "-q")
    shas = []
    for message, files in commits:
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        git("add", "--", *files)
        git("commit", "-q", "-m", message)
        shas.append(git("rev-parse", "HEAD"))
    return shas


def test_a_listed_code_move_does_not_warn_and_anything_else_does(tmp_path, monkeypatch):
    """On a history built here: a checkpoint trained just before a commit that only moved training code does not
    warn while code_moves.json lists that commit, and does as soon as the list is empty (the list, nothing else,
    stops the warning); commits outside the training code (a README, provenance.py itself) change nothing; a later
    unlisted change to the training code, or an uncommitted edit there, warns again."""
    repo = tmp_path / "checkout"
    trainer, state = "depthlens/training/trainer.py", "depthlens/training/state.py"
    trained, moved, *_ = _history(
        repo,
        [
            (
                "the code a checkpoint was trained from",
                {trainer: "def step(): ...\ndef save(): ...\n", "README.md": "a\n"},
            ),
            ("move save() into state.py", {trainer: "def step(): ...\n", state: "def save(): ...\n"}),
            ("docs only", {"README.md": "b\n"}),
            ("provenance.py is not training code", {"depthlens/training/provenance.py": "X = 1\n"}),
        ],
    )
    moves_file = tmp_path / "code_moves.json"  # outside the history, as recipes/ is outside the training code
    moves_file.write_text(json.dumps({"moves": [{"commit": moved, "what": "save() into state.py"}]}))
    monkeypatch.setattr(provenance, "_REPO", repo)
    monkeypatch.setattr(provenance, "CODE_MOVES", moves_file)
    assert provenance.code_moves() == {moved}
    assert training_code_changes(trained) == [] and code_version_warning({"git_sha": trained}) is None
    assert training_code_changes(moved) == []  # trained after the move: nothing differs at all

    moves_file.write_text(json.dumps({"moves": []}))  # the same history, the move no longer listed
    assert training_code_changes(trained) == [state, trainer]
    line = code_version_warning({"git_sha": trained})
    assert trained[:10] in line and trainer in line and "may not reproduce it bit for bit" in line

    moves_file.write_text(json.dumps({"moves": [{"commit": moved}]}))
    (repo / trainer).write_text("def step(): return 1\n")  # an uncommitted edit after the listed move
    assert training_code_changes(trained) == [state, trainer] and training_code_changes(moved) == [trainer]
    (real,) = _history(repo, [("a real change", {trainer: "def step(): return 1\n"})])
    assert training_code_changes(trained) == [state, trainer]  # committed, unlisted: the move no longer covers it
    assert training_code_changes(moved) == [trainer] and training_code_changes(real) == []
    assert training_code_changes("0" * 40) is None  # not in this history: unknown, not "unchanged"
