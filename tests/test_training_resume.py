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
                argv = [re.sub(r"\$(\w+)", lambda m: SHELL_VARS[m.group(1)], a) for a in shlex.split(line, comments=True)]
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
    assert command_line([str(REPO / "depthlens/training/trainer.py"), "R.json", "run=x"]) == \
        "python -m depthlens.training.trainer R.json run=x"
    assert command_line(["/usr/bin/depthlens", "causal", "c"]) == "depthlens causal c"
    assert command_line(["/elsewhere/__main__.py", "x"]) == "__main__.py x"
