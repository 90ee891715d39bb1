"""One vocabulary (docs/cli.md#vocabulary), checked over every command's options by introspecting the typer app:
one meaning per option name, one way to choose layers and pairs, metric names that are Dataset variable names, the
same names in the CLI and the API, `--out` on every command that writes, one default output folder, old spellings
hidden and still working with one deprecation line, errors in depthlens's own words."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from depthlens.cli import app
from depthlens.diagnostics import registry
from helpers import cli_commands

COMMANDS = cli_commands()  # the dedicated commands and those built from registry entries
DOC = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
# commands that write a file or a directory: each names it with --out
WRITERS = {"angular", "causal", "permute", "rank", "attnres", "sweep", "report", "track", "prepare", "train"}
# old spellings kept one version: hidden, and pointing to the new name
DEPRECATED = {
    ("permute", "--pairs"): "--layers",
    ("permute", "--norm"): "--metric",
    ("causal", "--agg"): "--aggregator",
}


def _options(cmd):
    return [p for p in cmd.params if p.param_type_name == "option"]


def _choices(p) -> tuple[str, ...] | str:
    ann = p.type_descriptor.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)] if typing.get_origin(ann) is not None else []
    lits = [v for a in [ann, *args] if typing.get_origin(a) is typing.Literal for v in typing.get_args(a)]
    return tuple(sorted(lits)) if lits else "free"


def test_one_meaning_per_option_name():
    meanings: dict[str, dict[str, tuple[str, ...] | str]] = {}
    for name, cmd in COMMANDS.items():
        for p in _options(cmd):
            if not p.hidden:
                meanings.setdefault(max(p.opts, key=len), {})[name] = _choices(p)
    # two fixed sets of values under one name are two meanings (--norm once meant update|resid on causal and
    # abs|rel|kl on permute); a free value (validated in the command, e.g. sweep's --metric: any score, registered
    # ones too) must take every fixed value another command offers under that name
    mixed = {opt: by for opt, by in meanings.items() if len({v for v in by.values() if v != "free"}) > 1}
    assert not mixed, mixed
    fixed = [v for v in meanings["--metric"].values() if v != "free"]
    assert all(set(v) <= set(registry.sweepable()) for v in fixed), fixed


def test_one_way_to_choose_layers_and_pairs():
    for name in ("causal", "permute"):
        opts = {max(p.opts, key=len): p for p in _options(COMMANDS[name]) if not p.hidden}
        assert "--layers" in opts and set(_choices(opts["--layers"])) == {"all", "late"}, name
        assert "--pairs" not in opts, name


def test_metric_names_are_dataset_variable_names():
    permute = {max(p.opts, key=len): p for p in _options(COMMANDS["permute"])}
    scores = set(_choices(permute["--metric"]))
    assert scores == {"perm_abs", "perm_rel", "perm_kl"}
    for key in scores:
        assert registry.score(key).var == key  # the option's value is the Dataset variable it reads
    from depthlens.studies.api import check_scores

    assert check_scores("causal_score") == ("causal",)  # the variable name names the score too


def test_the_api_takes_the_clis_names():
    from depthlens.studies import api

    for cmd, fn in (("causal", api.causal), ("permute", api.permute), ("angular", api.angular)):
        api_names = set(inspect.signature(fn).parameters)
        for p in _options(COMMANDS[cmd]):
            if p.hidden or p.name in ("out", "overwrite", "as_json", "quiet", "verbose"):
                continue  # output and printing options: the API returns the Dataset
            if p.name in ("threshold", "window", "aggregator", "metric", "plot"):
                continue  # the printed headline's choices and its figure: the API's Dataset holds every aggregator
            if p.name == "precision":
                continue  # the CLI's precision comparison (cli/precision.py) runs the engine per dtype: API dtype=
            if p.name == "opt":
                continue  # a generated command's untyped engine options: the API takes them as keywords
            if p.name in ("n_boot", "device_map", "threads"):
                continue  # the headline's interval (sweep.headline), placement and threads: not engine options
            assert p.name in api_names, (cmd, p.name)


def test_every_writer_takes_out_and_defaults_into_depthlens_out():
    for name in WRITERS:
        outs = [p for p in _options(COMMANDS[name]) if "--out" in p.opts]
        assert outs, f"{name} has no --out"
        default = outs[0].default
        assert default is None or str(default).startswith("depthlens-out/"), (name, default)


@pytest.mark.parametrize(("cmd", "old"), sorted(DEPRECATED))
def test_old_spellings_are_hidden_documented_and_named_in_the_vocabulary(cmd, old):
    p = next(p for p in _options(COMMANDS[cmd]) if old in p.opts)
    assert p.hidden and "Deprecated" in (p.help or "")
    assert f"`{old}`" in DOC.split("## Vocabulary", 1)[1].split("\n## ", 1)[0] and DEPRECATED[(cmd, old)] in DOC


def test_an_old_spelling_still_works_with_one_deprecation_line(tmp_path):
    r = CliRunner().invoke(app, ["permute", "/nonexistent/ckpt", "--pairs", "all", "--out", str(tmp_path / "p.nc")])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0] == "depthlens: note: --pairs is deprecated and will be removed in the next version; use --layers"
    assert r.exit_code == 1 and len(lines) == 2 and lines[1].startswith("depthlens: error:")  # then the real error


def test_errors_are_in_depthlens_words():
    r = CliRunner().invoke(app, ["track", "/nonexistent/run", "--metrics", "lates"])
    line = r.stderr.strip()
    assert r.exit_code == 2 and line.startswith("depthlens: error:") and "lates" in line
    assert not re.search(r"Value error|validation error|pydantic|Input should be", line), line


def test_prepare_takes_the_text_files_data_takes(tmp_path):
    """`--data notes.md` was read as text while `prepare notes.md` was refused: both read it as one document."""
    from depthlens.data.corpus import prepare_files
    from depthlens.data.tokenizers import ByteTokenizer

    md = tmp_path / "notes.md"
    md.write_text("# Depth\n\nLayers compute on what earlier layers computed. " * 40)
    manifest = prepare_files([md], tmp_path / "shards", ByteTokenizer(), 0.1)
    assert [s["n_documents"] for s in manifest["sources"]] == [1]
    assert sum(v["n_tokens"] for v in manifest["splits"].values()) >= len(md.read_bytes())
