"""Every fenced ```python and ```bash block of README.md and docs/*.md runs as pasted.

* Where they run: in a copy of the checkout (the files git tracks or would track, the venv linked), so nothing a
  block writes reaches the repository. A page's blocks run in order, as a reader follows it: bash blocks with
  `depthlens`, `python` and `torchrun` of this venv on PATH (what `source .venv/bin/activate` gives), under
  `set -eo pipefail`; python blocks in one namespace, as pasted into one Python session. `depthlens-out/` is
  emptied before each page; `.cache/` (token corpora, training runs) is kept, as in a user's clone.
* A block that is not meant to run says why, visibly, on the line before it: `<!-- not-run: reason -->`. That set
  is small (NOT_RUN_MAX) and each such block must still parse (bash -n / compile).
* Blocks that start processes or load checkpoints or the SmolLM2 GGUF are marked slow.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(\S.*?)\s*-->\s*$")
NOT_RUN_MAX = 8  # README's set-up + whole-suite commands, the main job, GPU-cluster and download blocks
BLOCK_TIMEOUT = 1500  # s; the README's command block trains hc_l4 (about 2 min) and runs a report


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def slow(self) -> bool:
        return self.lang == "bash" or "checkpoints/" in self.code or "gguf" in self.code.lower()


def doc_blocks(path: Path) -> list[Block]:
    """The fenced python/bash blocks of one Markdown file, with their not-run reason (the line before the fence)."""
    lines, out, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        prev = lines[i - 1] if i > 0 else ""
        reason = NOT_RUN.match(prev)
        if m.group(1) in ("python", "bash"):
            out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1 : end]) + "\n", reason and reason.group(1)))
        i = end + 1
    return out


BLOCKS = [b for d in DOCS for b in doc_blocks(d)]
PAGES = sorted({b.doc for b in BLOCKS if not b.not_run})


def test_blocks_found_and_not_run_set_is_small():
    assert {b.doc.name for b in BLOCKS} >= {"README.md", "quickstart.md", "foreign-models.md", "training.md"}
    skipped = [b for b in BLOCKS if b.not_run]
    assert len(skipped) <= NOT_RUN_MAX, [b.id for b in skipped]
    for b in skipped:
        assert len(b.not_run) > 15, f"{b.id}: say why the block does not run"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.not_run], ids=lambda b: b.id)
def test_not_run_blocks_still_parse(block):
    if block.lang == "python":
        compile(block.code, block.id, "exec")
    else:
        r = subprocess.run(["bash", "-n"], input=block.code, text=True, capture_output=True)
        assert r.returncode == 0, r.stderr


# --- the copy of the checkout the blocks run in ------------------------------------------------------------


def _checkout_files() -> list[str]:
    """Tracked files plus untracked ones git would not ignore: what a clone of this state holds."""
    r = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if r.returncode != 0:  # not a git checkout (an unpacked archive): everything but the usual local state
        skip = {".git", ".venv", ".cache", "depthlens-out", "__pycache__", ".pytest_cache"}
        return [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]
    return [f for f in r.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="session")
def clone(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clone")
    for f in _checkout_files():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, root / f)
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return root


def _env(clone: Path) -> dict[str, str]:
    """What `source .venv/bin/activate` gives, with this copy's code imported first (PYTHONPATH beats the
    editable install's finder)."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": sys.prefix,
        "PYTHONPATH": str(clone),
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "COLUMNS": "100",
    }


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(
            p, id=str(p.relative_to(ROOT)), marks=[pytest.mark.slow] * any(b.slow for b in BLOCKS if b.doc == p)
        )
        for p in PAGES
    ],
)
def test_page_blocks_run(page, clone, monkeypatch):
    """The page's blocks in order, as a reader follows it: bash blocks in a shell each, python blocks in one session."""
    import matplotlib.pyplot as plt
    import torch

    torch.set_num_threads(1)
    shutil.rmtree(clone / "depthlens-out", ignore_errors=True)
    monkeypatch.chdir(clone)
    env = _env(clone)
    for k in ("MPLBACKEND", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, env[k])
    namespace: dict = {"__name__": "__main__"}
    for b in [b for b in BLOCKS if b.doc == page and not b.not_run]:
        if b.lang == "bash":
            r = subprocess.run(
                ["bash", "-c", "set -eo pipefail\n" + b.code],
                cwd=clone,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
            assert r.returncode == 0 and "Traceback" not in r.stderr, (
                f"{b.id} failed ({r.returncode}):\n{b.code}\n--- stderr:\n{r.stderr[-4000:]}"
            )
            continue
        # from a file, as pasted into a script: tools that read their caller's source back (nnsight's trace) need it
        src = clone / ".doc-blocks" / f"{b.doc.stem}_{b.line}.py"
        src.parent.mkdir(exist_ok=True)
        src.write_text(b.code)
        try:
            exec(compile(b.code, str(src), "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{b.id} failed: {type(e).__name__}: {e}\n{b.code}") from e
    plt.close("all")
