"""`--json` prints strict JSON on every command that has the option (issue 35): parsed with the project's strict
reader (no NaN or Infinity, no key twice), one document (JSON lines for `train`). The list of commands comes from
the CLI itself, so a new command with --json fails here until it is added. Tiny models, a few seconds each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from depthlens.cli import app
from depthlens.io.files import strict_json
from helpers import FAST, FAST_BOOT, cli_commands

REPO = Path(__file__).resolve().parents[1]
# commands whose --json is checked strictly in another test (it needs a trained run)
ELSEWHERE = {"track": "tests/test_bad_input_rest.py::test_json_output_is_strict_json_track_check_included"}


def _json_commands() -> set[str]:
    out = set()
    for name, c in cli_commands().items():  # the dedicated commands and those built from registry entries
        subs = getattr(c, "commands", None) or {}
        for full, cmd in [(f"{name} {s}", cc) for s, cc in subs.items()] or [(name, c)]:
            if any("--json" in getattr(p, "opts", ()) for p in cmd.params):
                out.add(full)
    return out


@pytest.fixture(scope="module")
def w(tmp_path_factory, tiny_ckpt) -> dict[str, str]:
    root = tmp_path_factory.mktemp("json")
    e = {"root": str(root)}
    for arch in ("preln", "hc", "full_attnres"):
        e[arch] = str(tiny_ckpt(arch))
    (root / "notes.txt").write_text("A small text about layers and depth. " * 400)
    e["txt"] = str(root / "notes.txt")
    return e


def _train_args(w: dict[str, str]) -> list[str]:
    root = Path(w["root"])
    assert CliRunner().invoke(app, ["prepare", w["txt"], "--out", str(root / "ds")]).exit_code == 0
    model = {"arch": "preln", "d_model": 32, "n_layer": 2, "n_head": 2, "vocab_size": 257, "max_seq_len": 32}
    recipe = {
        "model": model,
        "data": str(root / "ds"),
        "seq_len": 16,
        "global_batch": 4,
        "steps": 2,
        "warmup": 1,
        "eval_every": 0,
        "final_eval_batches": 1,
        "threads": 1,
        "out": str(root / "run"),
        "export": str(root / "trained"),
    }
    (root / "recipe.json").write_text(json.dumps(recipe))
    return ["train", str(root / "recipe.json")]


def _args(cmd: str, w: dict[str, str]) -> list[str]:
    root, pre = w["root"], w["preln"]
    return {
        "angular": ["angular", pre, *FAST, "-o", f"{root}/a.nc"],
        "attnres": ["attnres", w["full_attnres"], *FAST, "-o", f"{root}/ar.nc"],
        "causal": ["causal", pre, *FAST, "-o", f"{root}/c.nc"],
        "permute": ["permute", pre, *FAST, "-o", f"{root}/p.nc"],
        "rank": ["rank", w["hc"], *FAST, "-o", f"{root}/r.nc"],
        "logit_lens": ["logit_lens", pre, *FAST, "-o", f"{root}/ll.nc"],
        "tuned_lens": ["tuned_lens", pre, *FAST, "-o", f"{root}/tl.nc"],
        "mixing": ["mixing", w["hc"], *FAST, "-o", f"{root}/m.nc"],
        "sweep": ["sweep", pre, w["hc"], "--thresholds", "0:1:0.5", *FAST, "-o", f"{root}/s.nc"],
        "compare": ["compare", pre, w["hc"], "--metrics", "causal", *FAST_BOOT],
        "eval": ["eval", pre, "--data", w["txt"], "--no-humaneval", *FAST],
        "hooks": ["hooks", pre],
        "info": ["info", pre],
        "shapes": ["shapes", "--target", "1e6"],
        "prepare": ["prepare", w["txt"], "--out", f"{root}/ds2"],
        "prune": ["prune", pre, "--tolerance", "100", "-o", f"{root}/pruned", "--criterion", "skip_loss"]
        + ["--k-max", "1", "--n-seq", "8", "--seq-len", "16", "--data", w["txt"]],
        "report": ["report", pre, "--out", f"{root}/rep", *FAST_BOOT, "--metrics", "causal"],
        "plan": ["plan", str(REPO / "reports" / "zoo"), "--n-boot", "20", "--sequences", "32"],
        "cache list": ["cache", "list"],
        "train": _train_args(w) if cmd == "train" else [],
    }[cmd]


def test_every_json_command_is_covered():
    assert _json_commands() == {
        "angular",
        "attnres",
        "causal",
        "permute",
        "rank",
        "logit_lens",
        "tuned_lens",
        "mixing",
        "sweep",
        "compare",
        "eval",
        "hooks",
        "info",
        "shapes",
        "prepare",
        "prune",
        "report",
        "plan",
        "cache list",
        "train",
        *ELSEWHERE,
    }


@pytest.mark.parametrize("cmd", sorted(_json_commands() - set(ELSEWHERE)))
def test_json_output_is_strict_json(cmd, w, monkeypatch):
    if cmd == "plan" and not (REPO / "reports" / "zoo" / "summary.json").is_file():
        pytest.skip("reports/zoo not generated")
    monkeypatch.chdir(w["root"])
    r = CliRunner().invoke(app, [*_args(cmd, w), "--json"])
    assert r.exit_code == 0, (cmd, r.output)
    text = r.stdout.strip()
    docs = [strict_json(line) for line in text.splitlines()] if cmd == "train" else [strict_json(text)]
    assert docs and all(isinstance(d, (dict, list)) for d in docs), (cmd, text[:300])
