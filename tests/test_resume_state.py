"""The resume state: a checksummed manifest checked strictly at load, corrupt states refused with one line
naming the file, an interrupted swap repaired to the newest complete state, and a kill at a random
instant followed by a rerun ending bit-identical to a straight run."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from depthlens.training.state import STATE_JSON, STATE_TENSORS, StateError, write_state
from depthlens.training.trainer import train
from test_trainer import REPO, _weights, corpus, log_losses, tiny  # noqa: F401  (corpus is a fixture)

STEPS = 10


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:  # noqa: F811
    out = tmp_path_factory.mktemp("straight")
    train(tiny(corpus, out, steps=STEPS, micro_batch=4))
    return out, _weights(out / "checkpoint")


def _same(out: Path, ref: dict[str, torch.Tensor]) -> bool:
    got = _weights(out / "checkpoint")
    return got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.fixture()
def stopped(corpus, tmp_path) -> Path:  # noqa: F811
    """A run stopped at step 4 (its resume state on disk)."""
    out = tmp_path / "run"
    train(tiny(corpus, out, steps=STEPS, micro_batch=4, stop_after=4))
    return out


def _flip_bit(f: Path, offset_from_end: int = 100) -> None:
    data = bytearray(f.read_bytes())
    data[-offset_from_end] ^= 0x10
    f.write_bytes(bytes(data))


def _rewrite(state: Path, edit) -> None:
    """Re-save the state through write_state after `edit(tensors, meta)`: a consistent manifest, bad content."""
    tensors = load_file(str(state / STATE_TENSORS))
    meta = json.loads((state / STATE_JSON).read_text())
    meta.pop("manifest")
    edit(tensors, meta)
    write_state(state, tensors, meta)


CORRUPTIONS = {
    "flipped bit": (lambda s: _flip_bit(s / STATE_TENSORS), "checksum"),
    "truncated": (lambda s: (s / STATE_TENSORS).write_bytes((s / STATE_TENSORS).read_bytes()[:5000]), "unreadable"),
    "tensors file gone": (lambda s: (s / STATE_TENSORS).unlink(), "missing"),
    "json not JSON": (lambda s: (s / STATE_JSON).write_text('{"step": 4,'), "not valid JSON"),
    "json key twice": (
        lambda s: (s / STATE_JSON).write_text(
            (s / STATE_JSON).read_text().replace('"step": 4', '"step": 4, "step": 4', 1)
        ),
        "'step' twice",
    ),
    "wrong step in json": (
        lambda s: (s / STATE_JSON).write_text((s / STATE_JSON).read_text().replace('"step": 4', '"step": 7', 1)),
        "step",
    ),
    "tensor dropped from file": (
        lambda s: save_file(
            {k: v for k, v in load_file(str(s / STATE_TENSORS)).items() if k != "model/blocks.0.attn.norm.weight"},
            str(s / STATE_TENSORS),
            metadata={"format": "x"},
        ),
        "does not belong",
    ),
    "model tensor missing (consistent manifest)": (
        lambda s: _rewrite(s, lambda t, m: t.pop("model/blocks.1.mlp.fn.up_proj.weight")),
        "model tensors do not match",
    ),
    "optimizer entries missing (consistent manifest)": (
        lambda s: _rewrite(s, lambda t, m: [t.pop(k) for k in list(t) if k.startswith("optim/blocks.0.")]),
        "optimizer",
    ),
    "optimizer moment missing (consistent manifest)": (
        lambda s: _rewrite(s, lambda t, m: t.pop("optim/blocks.0.attn.norm.weight/exp_avg_sq")),
        "incomplete",
    ),
    "step disagrees with the optimizer (consistent manifest)": (
        lambda s: _rewrite(s, lambda t, m: m.update(step=6)),
        "optimizer has taken 4 steps",
    ),
    "no manifest (old format)": (
        lambda s: (s / STATE_JSON).write_text(
            json.dumps({k: v for k, v in json.loads((s / STATE_JSON).read_text()).items() if k != "manifest"})
        ),
        "manifest",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_state_is_refused_naming_the_file(corpus, stopped, case):  # noqa: F811
    corrupt, match = CORRUPTIONS[case]
    corrupt(stopped / "resume")
    with pytest.raises(StateError, match=match) as e:
        train(tiny(corpus, stopped, steps=STEPS, micro_batch=4))
    msg = str(e.value)
    assert "\n" not in msg and str(stopped / "resume") in msg, msg
    assert not (stopped / "checkpoint").exists()  # nothing trained on


def test_cli_refuses_a_corrupt_state_with_one_line(corpus, stopped, tmp_path):  # noqa: F811
    from typer.testing import CliRunner

    from depthlens.cli.app import app

    _flip_bit(stopped / "resume" / STATE_TENSORS)
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps(tiny(corpus, stopped, steps=STEPS, micro_batch=4).to_dict()))
    r = CliRunner().invoke(app, ["train", str(recipe)])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "checksum" in r.stderr and STATE_TENSORS in r.stderr


@pytest.mark.parametrize("phase", ["before first rename", "between the renames", "after second rename"])
def test_interrupted_swap_resumes_from_the_newest_complete_state(corpus, straight, tmp_path, phase):  # noqa: F811
    """Lay out on disk what a SIGKILL leaves at each point of the two-rename swap (state at step 4 being
    replaced by the state at step 6): the rerun must resume from step 6, never from step 1."""
    out = tmp_path / "run"
    train(tiny(corpus, out, steps=STEPS, micro_batch=4, stop_after=4))
    step4 = tmp_path / "step4"
    shutil.copytree(out / "resume", step4)
    train(tiny(corpus, out, steps=STEPS, micro_batch=4, stop_after=6))
    state, new, old = out / "resume", out / ".resume.new", out / ".resume.old"
    if phase == "before first rename":  # resume = step 4, .new = step 6
        os.replace(state, new)
        os.replace(step4, state)
    elif phase == "between the renames":  # only the hidden copies: .old = step 4, .new = step 6
        os.replace(state, new)
        os.replace(step4, old)
    else:  # resume = step 6, .old = step 4 not yet removed
        os.replace(step4, old)
    seen = []
    train(tiny(corpus, out, steps=STEPS, micro_batch=4), callback=lambda s, r: seen.append(s))
    assert seen[0] == 7, f"resumed at step {seen[0] - 1}, not 6"
    assert not new.exists() and not old.exists()
    assert _same(out, straight[1]) and log_losses(out) == log_losses(straight[0])


def test_killed_writer_temps_are_removed_on_the_next_save(corpus, stopped):  # noqa: F811
    """A SIGKILL in the middle of a save leaves .resume.tmp-HOST-PID-*; the next save removes it (its PID
    is dead) but leaves a foreign file alone."""
    from depthlens.io.atomic import temp_name

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = temp_name(stopped / "resume")
    stale = stale.with_name(stale.name.replace(f"-{os.getpid()}-", f"-{dead.stdout.strip()}-"))
    stale.mkdir()
    (stale / STATE_TENSORS).write_bytes(b"partial")
    foreign = stopped / ".resume.mine"
    foreign.write_text("not ours")
    train(tiny(corpus, stopped, steps=STEPS, micro_batch=4, stop_after=5))
    assert not stale.exists() and foreign.read_text() == "not ours"


@pytest.mark.slow
def test_random_kill_then_rerun_is_bit_identical(corpus, straight, tmp_path):  # noqa: F811
    """SIGKILL a real training process at a random instant (saving every step, so the kill often lands in a
    write), rerun the same command: the final weights equal the straight run's bit for bit."""
    seed = int(os.environ.get("DEPTHLENS_KILL_SEED", random.randrange(10**6)))
    rng = random.Random(seed)
    out = tmp_path / "run"
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({**tiny(corpus, out, steps=STEPS, micro_batch=4).to_dict(), "save_every": 1}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "depthlens.training.trainer", str(recipe)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # wait for the first state, then kill somewhere in the rest of the run
    t0 = time.monotonic()
    while not (out / "resume").exists() and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.6))
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    killed_at = json.loads((out / "resume" / STATE_JSON).read_text())["step"] if (out / "resume").exists() else None
    print(f"seed {seed}: killed with the state at step {killed_at}, leftovers {[p.name for p in out.iterdir()]}")
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, f"seed {seed}: {rerun.stderr[-2000:]}"
    assert _same(out, straight[1]), f"seed {seed} (killed with the state at step {killed_at}): weights differ"
    assert log_losses(out) == log_losses(straight[0])
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".depthlens-output"], f"seed {seed}: leftovers"


def test_sigterm_during_a_state_write_leaves_no_temp(tmp_path):
    """SIGTERM (timeout, kill, Slurm) in the middle of a write: the temp directory is removed by the
    handler, the previous state stays, and the process still dies of SIGTERM."""
    code = f"""
import os, signal, torch
from pathlib import Path
from depthlens.training import state as S
p = Path({str(tmp_path / "resume")!r})
S.write_state(p, {{"rng/cpu": torch.zeros(3)}}, {{"step": 0}})
real = S.save_file if hasattr(S, "save_file") else None
import safetensors.torch as st
orig = st.save_file
def slow(tensors, path, metadata=None):
    orig(tensors, path, metadata=metadata)
    os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError("SIGTERM did not stop the process")
st.save_file = slow
S.write_state(p, {{"rng/cpu": torch.ones(3)}}, {{"step": 1}})
"""
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == -signal.SIGTERM, r.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resume"]
    assert json.loads((tmp_path / "resume" / STATE_JSON).read_text())["step"] == 0
