"""Training robustness: every one of the ten designs resumes bit-exactly (parameters that get no gradient
included), a NaN/inf loss stops the run with one line naming the step and keeps the last good resume state,
and the documented torchrun launch lines parse under torchrun's own argument parser."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from depthlens.designs import SLUGS
from depthlens.training.trainer import train
from test_trainer import REPO, _weights, corpus, log_losses, tiny  # noqa: F401  (corpus is a fixture)

torch.set_num_threads(1)


def _design(corpus: Path, out: Path, arch: str, **kw):  # noqa: F811
    model = {**tiny(corpus, out).model, "arch": arch, "n_layer": 3}
    return tiny(corpus, out, steps=6, warmup=1, model=model, **kw)


@pytest.mark.parametrize("arch", SLUGS)
def test_every_design_resumes_bit_exactly(corpus, tmp_path, arch):  # noqa: F811
    """stop_after=3 then a rerun of the same command ends with the weights of an uninterrupted run, bit for
    bit; MoDA's last-layer depth K/V projections get no gradient (so no optimizer state) and must resume too."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(_design(corpus, straight, arch))
    assert train(_design(corpus, resumed, arch, stop_after=3)) == {"step": 3, "stopped": True}
    train(_design(corpus, resumed, arch))
    ref, got = _weights(straight / "checkpoint"), _weights(resumed / "checkpoint")
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref), [k for k in ref if not torch.equal(got[k], ref[k])][:3]
    assert log_losses(resumed) == log_losses(straight)


# --- the documented torchrun launches ---------------------------------------------------------------

SHELL_VARS = {"NODE_RANK": "0", "MASTER": "node0", "R": "depthlens/recipes/paper_gpu.json", "run": "hc_l16_lr0.003"}


def _documented_torchrun_lines() -> list[tuple[str, list[str]]]:
    """Every `torchrun ...` command in README.md and docs/*.md code blocks (backslash continuations joined,
    comments dropped); lines abbreviated with `...` are prose, not commands."""
    import shlex

    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", doc.read_text(encoding="utf-8"))
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("torchrun ") and " ... " not in line:
                # the shell variables the docs use, as a shell would expand them
                argv = [
                    re.sub(r"\$(\w+)", lambda m: SHELL_VARS[m.group(1)], a) for a in shlex.split(line, comments=True)
                ]
                found.append((f"{doc.name}: {line}", argv[1:]))
    return found


def test_documented_torchrun_lines_parse_under_torchrun_and_depthlens():
    """torchrun's own parser (torch.distributed.run) accepts each documented line as written, hands the module
    everything after it, and the module's parser reads those arguments. `--run NAME` after the module was refused
    by torchrun ("ambiguous option: --run could match --run-path, --run_path"); the docs now write run=NAME."""
    from torch.distributed.run import get_args_parser

    from depthlens.cli.app import app
    from depthlens.training.trainer import split_run_name

    lines = _documented_torchrun_lines()
    assert len(lines) >= 6, lines  # training.md's launches, README's and foreign-models.md's report lines
    modules = set()
    for where, argv in lines:
        try:
            args = get_args_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"torchrun refuses the documented line {where}")
        assert args.module, where
        modules.add(args.training_script)
        rest = args.training_script_args
        if args.training_script == "depthlens.training.trainer":
            overrides, run = split_run_name(rest[1:])
            assert run and all("=" in o for o in overrides), where
        else:
            assert args.training_script == "depthlens.cli", where
            cmd = app.registered_commands  # the subcommand must exist
            assert rest[0] in {c.name or c.callback.__name__ for c in cmd}, where
    assert modules == {"depthlens.training.trainer", "depthlens.cli"}
    with pytest.raises(SystemExit):  # the old form really is refused by torchrun: the test can fail
        get_args_parser().parse_args(["--standalone", "-m", "depthlens.training.trainer", "R.json", "--run", "x"])


def test_run_name_form():
    from depthlens.training.trainer import split_run_name

    assert split_run_name(["run=a", "lr=1e-3"]) == (["lr=1e-3"], "a")
    assert split_run_name(["lr=1e-3"], "b") == (["lr=1e-3"], "b")
    assert split_run_name(["run=b"], "b") == ([], "b")
    with pytest.raises(ValueError, match="two run names"):
        split_run_name(["run=a"], "b")


def test_recorded_command_names_depthlens_not_main_py():
    from depthlens.io.provenance import command_line

    cli_main = str(REPO / "depthlens" / "cli" / "__main__.py")
    assert command_line([cli_main, "report", "a", "--out", "r"]) == "depthlens report a --out r"
    assert (
        command_line([str(REPO / "depthlens/training/trainer.py"), "R.json", "run=x"])
        == "python -m depthlens.training.trainer R.json run=x"
    )
    assert command_line(["/usr/bin/depthlens", "causal", "c"]) == "depthlens causal c"
    assert command_line(["/elsewhere/__main__.py", "x"]) == "__main__.py x"


# --- a diverging run ----------------------------------------------------------------------------------


def test_nan_loss_stops_with_one_line_and_keeps_the_last_good_state(corpus, tmp_path, monkeypatch):  # noqa: F811
    """A NaN loss at step 5 (injected: the weights stay good, so the kept state can be checked by resuming it):
    one line naming the step and the kept state (step 4), nothing saved or exported after it; the rerun resumes
    from step 4 and ends bit-identical to a straight run."""
    from depthlens.training import trainer as T

    straight, out = tmp_path / "straight", tmp_path / "run"
    train(tiny(corpus, straight, steps=8, save_every=2))
    real = T.Trainer.train_step

    def poisoned(self, step):
        rec = real(self, step)
        return {**rec, "loss": math.nan} if step == 4 else rec  # the 5th step (steps count from 1 in the log)

    monkeypatch.setattr(T.Trainer, "train_step", poisoned)
    with pytest.raises(T.TrainingDiverged) as err:
        train(tiny(corpus, out, steps=8, save_every=2))
    msg = str(err.value)
    assert "\n" not in msg and "loss is nan at step 5" in msg and "(step 4)" in msg and str(out / "resume") in msg
    assert "rerun the same command" in msg
    assert json.loads((out / "resume" / "state.json").read_text())["step"] == 4
    assert not (out / "checkpoint").exists()
    monkeypatch.setattr(T.Trainer, "train_step", real)
    train(tiny(corpus, out, steps=8, save_every=2))
    ref, got = _weights(straight / "checkpoint"), _weights(out / "checkpoint")
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert log_losses(out) == log_losses(straight)


def test_infinite_gradient_norm_stops_before_the_poisoned_update_is_saved(corpus, tmp_path, monkeypatch):  # noqa: F811
    from depthlens.training import trainer as T

    real = T.Trainer.train_step
    monkeypatch.setattr(
        T.Trainer,
        "train_step",
        lambda self, step: {**real(self, step), "grad_norm": math.inf} if step == 2 else real(self, step),
    )
    with pytest.raises(T.TrainingDiverged, match=r"gradient norm is inf at step 3; no resume state was saved"):
        train(tiny(corpus, tmp_path / "run", steps=8))
    assert not (tmp_path / "run" / "resume").exists()


@pytest.mark.slow
def test_a_diverging_run_through_the_cli_says_one_line(corpus, tmp_path):  # noqa: F811
    """lr=1e30 really diverges: `depthlens train` and `python -m depthlens.training.trainer` exit 1 with one
    line naming the step (was a FloatingPointError traceback)."""
    import os
    import subprocess
    import sys

    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({**tiny(corpus, tmp_path / "run", steps=6, lr=1e30).to_dict(), "save_every": 1}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for cmd in (["-m", "depthlens.cli", "train", str(recipe)], ["-m", "depthlens.training.trainer", str(recipe)]):
        r = subprocess.run([sys.executable, *cmd], env=env, capture_output=True, text=True, timeout=300, check=False)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("depthlens: error:")]
        assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert re.search(r"training stopped: (loss|the gradient norm) is (nan|inf) at step \d", lines[0]), lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_training_and_the_rerun_resumes_bit_exactly(corpus, tmp_path, sig):  # noqa: F811
    """SIGINT (Ctrl-C) and SIGTERM (timeout, Slurm) during `depthlens train`: the process stops (SIGINT: exit 130,
    SIGTERM: killed by it), no temp is left, and rerunning the command ends bit-identical to a straight run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    straight, out = tmp_path / "straight", tmp_path / "run"
    train(tiny(corpus, straight, steps=40, micro_batch=4))
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({**tiny(corpus, out, steps=40, micro_batch=4).to_dict(), "save_every": 1}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "depthlens.cli", "train", str(recipe)]
    # SIGINT as a terminal delivers it: a suite started in the background (`cmd &` in a script) runs with SIGINT
    # ignored, an exec'd child inherits that, and Python then installs no KeyboardInterrupt handler, so the run
    # finished with exit 0; which test ran earlier in the same worker (one that set a handler) decided the outcome
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    t0 = time.monotonic()
    while not (out / "resume").exists() and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the signal could be sent"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (130 if sig == "SIGINT" else -signal.SIGTERM), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    stopped_at = json.loads((out / "resume" / "state.json").read_text())["step"]
    assert 1 <= stopped_at < 40 and not (out / "checkpoint").exists()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".depthlens-output"]
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    ref, got = _weights(straight / "checkpoint"), _weights(out / "checkpoint")
    assert all(torch.equal(got[k], ref[k]) for k in ref), f"{sig} at step {stopped_at}: weights differ"


@pytest.mark.slow
def test_two_process_ddp_is_bit_identical_to_one_process_with_the_same_micro_batch(corpus, tmp_path):  # noqa: F811
    """The claim docs/training.md makes: 2-process DDP (each rank 4 sequences, one micro-step) ends with the same
    weights, bit for bit, as 1 process accumulating two micro-batches of 4 (each micro-gradient is scaled by
    exactly 1/2 either way, and a sum of two terms rounds the same in any order)."""
    import os
    import subprocess
    import sys

    one = tmp_path / "one"
    train(tiny(corpus, one, steps=8, micro_batch=4))
    recipe = tmp_path / "two.json"
    recipe.write_text(json.dumps(tiny(corpus, tmp_path / "two", steps=8).to_dict()))
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node=2", str(REPO / "tests/dist_worker.py"), str(recipe)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _weights(one / "checkpoint"), _weights(tmp_path / "two" / "checkpoint")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
