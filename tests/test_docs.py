"""Every fenced ```python and ```bash block of README.md and docs/*.md runs as pasted.

* Where they run: in a fresh copy of the checkout (the files git tracks or would track, the venv linked), so
  nothing a block writes reaches the repository: the pages in the order README links them, nothing cleaned in
  between (`depthlens-out/`, `.cache/` kept), as a new user follows them. Two readers, each in a copy of their own,
  so that the two halves run on two cores: one reads README.md, the CLI reference and the page that repeats README's
  training run (FIRST_READER); the other reads every other page, from the training page on. A page's blocks
  run in order: bash blocks with `depthlens`, `python` and `torchrun` of this venv on PATH (what
  `source .venv/bin/activate` gives), under `set -eo pipefail`; python blocks in one namespace, as pasted into one
  Python session (a fresh one per page).
* A block that is not meant to run says why, visibly, on the line before it: `<!-- not-run: reason -->`. That set
  is small (NOT_RUN_MAX) and each such block must still parse (bash -n / compile).
* The run is marked slow (it trains, reports and loads the SmolLM2 GGUF as the pages say); the checks of the
  blocks themselves (found, not-run reasons, parsing) are quick.
* Every `depthlens` line runs in a fork of one warm process per reader (tests/warm_cli.py): the same command, argv,
  directory, environment and stdio, without paying about 2.5 s of imports about 90 times.
* Each reader has a result cache of its own (`studies.cache`; the rest of the suite runs without one), empty at
  the start, as a new user's first session has: a page that repeats an earlier page's study (the CLI reference
  repeats README's L = 4 report and its track) reads that page's results instead of computing them again.
* `DEPTHLENS_DOCS_TIMINGS=<file>` appends each block's wall time and CPU seconds to that file as a JSON line:
  where the docs run, the suite's longest test, spends its time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from warm_cli import cpu_seconds, served_cpu_seconds, warm_depthlens

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


def make_clone(root: Path) -> Path:
    """A fresh copy of the checkout at `root`, its `.venv` a link to this venv."""
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


def readme_order(pages: list[Path]) -> list[Path]:
    """README.md first, then the docs pages in the order README first links them, then any page it does not link
    (by name): the path a new reader follows from the front page."""
    text = (ROOT / "README.md").read_text()
    linked = [m.group(1) for m in re.finditer(r"\(?(docs/[\w.-]+\.md)", text)]
    rank = {name: i for i, name in enumerate(dict.fromkeys(linked))}
    key = {p: (-1 if p.name == "README.md" else rank.get(str(p.relative_to(ROOT)), len(rank)), str(p)) for p in pages}
    return sorted(pages, key=key.__getitem__)


def run_page(page: Path, clone: Path, env: dict[str, str]) -> None:
    """The page's blocks in order, as a reader follows it: bash blocks in a shell each, python blocks in one session."""
    import matplotlib.pyplot as plt

    namespace: dict = {"__name__": "__main__"}
    for b in [b for b in BLOCKS if b.doc == page and not b.not_run]:
        t0, cpu0 = time.perf_counter(), _cpu_seconds(env)
        _run_block(b, clone, env, namespace)
        if os.environ.get("DEPTHLENS_DOCS_TIMINGS"):  # where the docs run spends its time: one JSON line per block
            seconds, cpu = round(time.perf_counter() - t0, 2), round(_cpu_seconds(env) - cpu0, 2)
            with open(os.environ["DEPTHLENS_DOCS_TIMINGS"], "a") as f:
                f.write(json.dumps({"block": b.id, "seconds": seconds, "cpu_seconds": cpu}) + "\n")
    plt.close("all")


def _cpu_seconds(env: dict[str, str]) -> float:
    """CPU seconds spent so far by this process, the processes it waited for (bash blocks) and the commands the warm
    server of `env` ran (its forks, which no parent waits for): on a shared machine, wall time says little."""
    return cpu_seconds() + served_cpu_seconds(env)


def _run_block(b: Block, clone: Path, env: dict[str, str], namespace: dict) -> None:
    """One block: bash in a shell of its own; python in the page's namespace, from a file as pasted into a script."""
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
        return
    # from a file, as pasted into a script: tools that read their caller's source back (nnsight's trace) need it
    src = clone / ".doc-blocks" / f"{b.doc.stem}_{b.line}.py"
    src.parent.mkdir(exist_ok=True)
    src.write_text(b.code)
    try:
        exec(compile(b.code, str(src), "exec"), namespace)
    except Exception as e:
        raise AssertionError(f"{b.id} failed: {type(e).__name__}: {e}\n{b.code}") from e


def test_readme_order_starts_with_the_front_page_and_follows_its_links():
    order = readme_order(PAGES)
    assert order[0].name == "README.md" and sorted(order) == sorted(PAGES)
    text = (ROOT / "README.md").read_text()
    linked = [p for p in order[1:] if str(p.relative_to(ROOT)) in text]
    assert linked == sorted(linked, key=lambda p: text.index(str(p.relative_to(ROOT))))


# The first reader's pages: README, the CLI reference, and the page that repeats README's training run and its
# track (depth over training: the same `depthlens train ... hc_l4 steps=100` command, then `track` on its
# snapshots), so that its run is a rerun of a finished one and its track reads the reader's result cache, as they
# are for a user who read README first. The second reader reads every other page, in README order, from a fresh
# copy: training, the quickstart's reports and the rest (about half of the docs' work on each side); none of its
# pages reads what a page of the first reader wrote.
FIRST_READER = ("README.md", "docs/cli.md", "docs/depth-over-training.md")


def readers(pages: list[Path]) -> list[list[Path]]:
    """The pages in README order, split in two: FIRST_READER's, then the rest."""
    order = readme_order(pages)
    first = [p for p in order if str(p.relative_to(ROOT)) in FIRST_READER]
    return [first, [p for p in order if p not in first]]


def test_the_two_readers_read_every_page_once_in_readme_order():
    first, second = readers(PAGES)
    order = readme_order(PAGES)
    assert first[0].name == "README.md" and sorted(first + second) == sorted(order)
    assert {str(p.relative_to(ROOT)) for p in first} == set(FIRST_READER)  # every page it names exists and runs
    for reader in (first, second):
        assert reader == sorted(reader, key=order.index)


@pytest.mark.slow
@pytest.mark.timeout(2 * BLOCK_TIMEOUT)
@pytest.mark.parametrize("reader", [0, 1], ids=["readme-and-cli", "training-onward"])
def test_every_page_in_readme_order_in_a_fresh_copy(reader, tmp_path, monkeypatch):
    """What a new user does: the pages in the order README links them, in a fresh copy of the checkout, nothing
    cleaned in between; so a page's command must also work when an earlier page already wrote its output
    (`depthlens-out/` is depthlens's own: re-runs replace it), and a page may not rely on a state that only a fresh
    copy has. This is the docs' only run (each page on its own would repeat the work)."""
    import torch

    torch.set_num_threads(1)
    clone = make_clone(tmp_path / "clone")
    monkeypatch.chdir(clone)
    monkeypatch.setenv("DEPTHLENS_RESULTS_CACHE", str(tmp_path / "result-cache"))  # the reader's own, empty
    env = _env(clone)
    for k in ("MPLBACKEND", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, env[k])
    with warm_depthlens(env, clone, tmp_path / "warm") as warm_env:  # one warm import for every `depthlens` line
        for page in readers(PAGES)[reader]:
            run_page(page, clone, warm_env)
