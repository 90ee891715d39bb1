"""`depthlens report` on tiny checkpoints: rendered page, figures, tables, datasets, atomic and refusing output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from depthlens.models import ModelConfig, build_model

DESIGNS = ("preln", "hc", "block_attnres")
# not helpers.FAST: the report draws intervals (n-boot) and figures over enough tokens to be non-trivial
FAST = ["--n-seq", "4", "--seq-len", "32", "--n-boot", "20"]
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness; def f(x):\n    return x * 2 + 1\n"
) * 40


def _ckpt(root: Path, slug: str, L: int = 4, train: dict | None = None) -> Path:
    train = None if train is None else {"seed": 0, **train}
    m = build_model(ModelConfig.debug(slug, n_layer=L, vocab_size=257, max_seq_len=64), seed=0)
    return depthlens.save(m, root / f"{slug}_l{L}", train=train)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    # hc has no train.json: its validation loss must show as — / null
    return [_ckpt(root, s, train=None if s == "hc" else {"final_val_loss": 5.0 + k}) for k, s in enumerate(DESIGNS)]


@pytest.fixture(scope="module")
def report(ckpts, text, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "report"
    r = CliRunner().invoke(app, ["report", *map(str, ckpts), "--out", str(out), "--data", str(text), *FAST, "--json"])
    assert r.exit_code == 0, r.output
    return out, r


def _one_error_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("depthlens: error:"), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


@pytest.mark.slow
def test_report_renders_nontrivial_pngs(report):
    import matplotlib.image as mpimg

    out, _ = report
    for name in ("index.html", "README.md", "summary.json", "manifest.json"):
        assert (out / name).is_file(), name
    pngs = sorted((out / "figures").glob("*.png"))
    expected = {
        f"{s}_l4_{m}"
        for s in DESIGNS
        for m in ("causal", "permutation", "angular", "mixing", "logit_lens", "tuned_lens")
    }
    expected |= {
        "hc_l4_rank",
        "block_attnres_l4_attnres",
        "sweep_causal",
        "sweep_permutation",
        "summary",
        "overview_causal",
        "overview_permutation",
    }
    stems = {p.stem for p in pngs}
    assert expected <= stems, expected - stems
    # anything more is a diagnostic added to the registry after these were written, one figure per checkpoint
    from depthlens.diagnostics import registry

    added = {f"{s}_l4_{n}" for s in DESIGNS for n in registry.names()}
    assert stems - expected <= added, stems - expected - added
    for p in pngs:
        assert p.stat().st_size > 5_000, p.name
        img = mpimg.imread(p)
        assert float(np.asarray(img, dtype=float).std()) > 0, f"{p.name} is blank"
    assert [p.name for p in out.rglob("*") if p.name.startswith(".")] == [".depthlens-output"]  # no temp files left


@pytest.mark.slow
def test_html_and_markdown_reference_only_existing_local_files(report):
    out, _ = report
    page = (out / "index.html").read_text()
    assert "<script" not in page.lower() and "<link" not in page.lower()
    refs = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert any(r.endswith(".png") for r in refs) and any(r.endswith(".nc") for r in refs)
    for ref in refs:
        assert not re.match(r"^[a-z]+:|^//|^/", ref), f"non-local reference {ref}"
        if ref.startswith("#"):
            assert f'id="{ref[1:]}"' in page, ref
            continue
        assert (out / ref).is_file(), ref
    md = (out / "README.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", md)
    assert any(l.endswith(".png") for l in links)
    for link in links:
        assert (out / link).is_file(), link
    head = next(l for l in md.splitlines() if l.startswith("| design | L |"))  # the table, with hc's unknown val loss
    hc = next(l for l in md.splitlines() if l.startswith("| HC |"))
    col = [c.strip() for c in head.strip("|").split("|")].index("val loss (train.json)")
    assert [c.strip() for c in hc.strip("|").split("|")][col] == "—" and "NaN" not in hc  # not recorded, not NaN


@pytest.mark.slow
def test_summary_records(report):
    out, r = report
    recs = json.loads((out / "summary.json").read_text())
    assert json.loads(r.stdout) == recs
    from depthlens.studies.report import RECORD_KEYS

    assert [x["design"] for x in recs] == list(DESIGNS)  # registry order
    for x in recs:
        assert set(x) == set(RECORD_KEYS)
        assert x["n_layer"] == 4 and x["params_total"] > 0
        for key in ("causal", "perm"):
            s, lo, hi = x[f"{key}_share"], x[f"{key}_ci_low"], x[f"{key}_ci_high"]
            assert 0 <= lo <= s <= hi <= 1, x  # every interval contains the estimate it qualifies
            assert x[f"{key}_ci_method"] and x[f"{key}_ci_unit"] == "eval sequences"
            assert x[f"{key}_n_pairs"] == 3  # late window 1..3 at L = 4
            assert x[f"{key}_eval_sizes"] == [1, 2, 4] and len(x[f"{key}_eval_size_shares"]) == 3
            assert x[f"{key}_eval_size_shares"][-1] == x[f"{key}_share_full"]
            if x["seed"] is None:  # hc has no train.json: no seed, no untrained baseline (a note says so)
                assert x[f"{key}_share_untrained"] is None
                continue
            # the untrained model of the same config and seed: these checkpoints ARE untrained (seed 0)
            assert x[f"{key}_share_untrained"] == pytest.approx(x[f"{key}_share"])
            assert x[f"{key}_untrained_diff"] == pytest.approx(0, abs=1e-12)
    by = {x["design"]: x for x in recs}
    assert by["hc"]["val_loss"] is None and by["preln"]["val_loss"] == 5.0
    assert 1 <= by["hc"]["erank_full"] <= 4 and by["preln"]["erank_full"] is None
    assert isinstance(by["block_attnres"]["dead_prefix"], int) and by["hc"]["dead_prefix"] is None
    # the ranking-robustness rows use exactly the table's headline shares (θ = 0.45 / 0.15 on the sweep grid)
    rob = json.loads((out / "manifest.json").read_text())["robustness"]
    assert {(r["metric"], r["n_layer"]) for r in rob} == {("causal", 4), ("permutation", 4)}
    for r in rob:
        key = "causal" if r["metric"] == "causal" else "perm"
        for design, share in zip(r["order"], r["shares_at_headline"]):
            assert share == pytest.approx(by[design][f"{key}_share_full"])


def test_trained_with_groups_checkpoints_by_training_code_and_decay_rule():
    """The report's "Trained with" table: one row per (git sha, decay_mixing), largest group first; a checkpoint
    that recorded neither (trained before the option) is its own group, never merged into a recorded one."""
    from depthlens.render.pages import TRAINED_WITH_HEAD, trained_with_rows

    recs = [
        {"checkpoint": "a_l4", "train_git_sha": "79267f7998d4", "decay_mixing": False},
        {"checkpoint": "b_l4", "train_git_sha": "79267f7998d4", "decay_mixing": False},
        {"checkpoint": "c_l4", "train_git_sha": "530027e00000", "decay_mixing": None},
        {"checkpoint": "d_l4", "train_git_sha": None, "decay_mixing": None},
    ]
    rows = trained_with_rows(recs)
    assert len(TRAINED_WITH_HEAD) == 3 and [len(r) for r in rows] == [3, 3, 3]
    assert rows[0] == ["79267f7998d4", "false", "2: a_l4, b_l4"]
    assert sorted(r[2] for r in rows[1:]) == ["1: c_l4", "1: d_l4"]
    assert {r[1] for r in rows[1:]} == {"not recorded"}


@pytest.mark.slow
def test_netcdf_datasets_read_back(report):
    from depthlens.io.dataset import read_netcdf

    out, _ = report
    manifest = json.loads((out / "manifest.json").read_text())
    files = manifest["datasets"]
    assert {"causal.nc", "permutation.nc", "angular.nc", "rank.nc", "attnres.nc", "mixing.nc"} <= set(files)
    for name, members in files.items():
        ds = read_netcdf(out / name)
        assert [str(c) for c in ds["checkpoint"].values] == members
    causal = read_netcdf(out / "causal.nc")
    assert causal.sizes["checkpoint"] == 3 and "causal_score" in causal and causal.attrs["Conventions"] == "CF-1.11"
    assert "jackknife" in causal.attrs["headline_interval_method"]  # every interval names its method and unit
    assert causal.attrs["headline_interval_unit"] == "eval sequences" and causal.attrs["headline_subsample_m"] == 2
    assert files["rank.nc"] == ["hc_l4"] and files["attnres.nc"] == ["block_attnres_l4"]
    assert manifest["eval_data"]["n_seq"] == 4 and manifest["eval_data"]["seq_len"] == 32


@pytest.mark.slow
def test_refuses_existing_out_then_overwrites(report, ckpts, text, tmp_path):
    out, _ = report
    before = (out / "summary.json").read_bytes()
    r = CliRunner().invoke(app, ["report", str(ckpts[0]), "--out", str(out), "--data", str(text), *FAST])
    assert r.exit_code == 1
    assert "already exists" in _one_error_line(r)
    assert (out / "summary.json").read_bytes() == before
    # --overwrite on a copy, with a metric subset and two depths: per-depth netCDF files
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    l8 = _ckpt(tmp_path, "preln", L=8)
    r = CliRunner().invoke(
        app,
        [
            "report",
            str(ckpts[0]),
            str(l8),
            "--out",
            str(copy),
            "--data",
            str(text),
            *FAST,
            "--metrics",
            "angular,mixing",
            "--overwrite",
        ],
    )
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in copy.glob("*.nc")) == [
        "angular_l4.nc",
        "angular_l8.nc",
        "mixing_l4.nc",
        "mixing_l8.nc",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "preln_l8"]  # no temp or old dirs left
    # a directory that is not a report is never replaced, even with --overwrite
    r = CliRunner().invoke(
        app,
        [
            "report",
            str(ckpts[0]),
            "--out",
            str(tmp_path),
            "--data",
            str(text),
            *FAST,
            "--metrics",
            "angular",
            "--overwrite",
        ],
    )
    assert r.exit_code == 1
    assert "not a depthlens report" in _one_error_line(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "preln_l8"]


def test_bad_checkpoint_one_line_and_no_output(ckpts, text, tmp_path):
    bad = tmp_path / "bad_l4"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    out = tmp_path / "reports" / "x"
    r = CliRunner().invoke(app, ["report", str(ckpts[0]), str(bad), "--out", str(out), "--data", str(text), *FAST])
    assert r.exit_code == 1
    assert "bad_l4" in _one_error_line(r)
    assert not out.exists() and not (tmp_path / "reports").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad_l4"]


def test_usage_and_unwritable_errors(ckpts, tmp_path):
    r = CliRunner().invoke(app, ["report", str(ckpts[0]), "--out", str(tmp_path / "o"), "--metrics", "causal,bogus"])
    assert r.exit_code == 2
    assert "bogus" in _one_error_line(r)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = CliRunner().invoke(app, ["report", str(ckpts[0]), "--out", str(blocker / "sub")])
    assert r.exit_code == 1
    assert "cannot write" in _one_error_line(r)


# ---------------------------------------------------------------------------------------------------------------
# docs/cli.md: generated from `depthlens <cmd> --help` (regenerate: `.venv/bin/python tests/test_report.py`)

CLI_ORDER = (
    "info",
    "hooks",
    "angular",
    "causal",
    "permute",
    "rank",
    "attnres",
    "logit_lens",
    "tuned_lens",
    "mixing",
    "sweep",
    "report",
    "track",
    "compare",
    "plan",
    "shapes",
    "prepare",
    "train",
    "eval",
    "prune",
    "cache",
)
CLI_INTRO = "Every command prints one line on stderr and exits 1 on a domain error (bad checkpoint, bad data, an existing output of yours without `--overwrite`; depthlens's own output in `depthlens-out/` is simply replaced on a re-run), 2 on a usage error; never a traceback. `causal` and `permute` print one headline line (the share, its interval and the interval's method in a few words; `--verbose` adds the definition, the share at all sequences, the shard spread and the full method); `--json` prints everything machine-readable on stdout. Outputs are written atomically (temp file, then rename). Work that runs longer than 2 s shows progress on stderr: a bar with a count and an ETA on a terminal, one line per step otherwise (`[12/57] report: hc_l16: causal 7.7 s, eta 5m10s`); `--quiet` silences it. Datasets go to `depthlens-out/` (git-ignored) unless `--out` says otherwise, and record the command line as given (`command` attribute). `-h` is `--help`; `depthlens --version` prints the version; `depthlens --install-completion` installs shell completion (bash, zsh, fish, PowerShell)."
CLI_VOCABULARY = "## Vocabulary\n\nOne name, one meaning, in every command and in the Python API (`import depthlens as dl`; `tests/test_vocabulary.py`\nchecks it over every command's options):\n\n| name | means | where |\n|---|---|---|\n| `--layers` | which layers: `all` or `late` (the late window); for `permute`, the swapped pairs within them | causal, permute |\n| `--metric` / `--metrics` | one score / a comma list; a score's name is its Dataset variable (`perm_abs`, ...; `causal_score` is `causal`) | permute, sweep / compare, report, track |\n| `--norm` | the causal score's denominator: `update` or `resid` | causal |\n| `--aggregator`, `--variant` | the causal score's `aggregator` and `variant` dimensions | causal (API: `variant=`) |\n| `--out` | where the output goes; without it, `depthlens-out/` (the one default folder, git-ignored, replaced on a re-run) | every command that writes, `train` too |\n| `--n-seq`, `--seq-len`, `--tokens`, `--seed`, `--data` | the eval data | every analysis (API: `n_seq=`, ...) |\n\nOld spellings work for one more version, hidden from `--help`, with one `depthlens: note: ... is deprecated` line on\nstderr: `--pairs` of permute (now `--layers`), `--norm` of permute, abs|rel|kl (now `--metric perm_abs|perm_rel|perm_kl`),\n`--agg` of causal (now `--aggregator`), `out=DIR` of train (now `--out DIR`); in the API, `causal(variants=...)` (now\n`variant=`) and `permutation(pairs=...)` (now `layers=`), and the module `depthlens.analysis.api` (now\n`import depthlens as dl`), with a DeprecationWarning."  # written by hand: the option names every command shares (tests/test_vocabulary.py)
CLI_NOTES = {  # what a command's --help cannot show: sub-commands, environment variables (written by hand)
    "cache": "```text\ndepthlens cache list [--json]\ndepthlens cache clear [KEY...]\n```\n\n| command | does |\n|---|---|\n| `list` | every entry (least recently used first): key, GGUF file, dtype, size, last use; the folder, its total and the limit. `--json`: machine-readable |\n| `clear` | removes the entries whose key starts with one of KEYs (as `list` shows them), or every entry; exit 1 when no key matches |",
}
CLI_EXAMPLES = {  # each runs as pasted from the repository root (tests/test_docs.py runs docs/cli.md)
    "info": "depthlens info checkpoints/hc_l16 --json",
    "hooks": "depthlens hooks checkpoints/preln_l4",
    "angular": "depthlens angular checkpoints/preln_l16 --positions all",
    "causal": "depthlens causal checkpoints/hc_l16 --layers late --n-boot 200",
    "permute": "depthlens permute checkpoints/keel_l8 --layers late --swap body",
    "rank": "depthlens rank checkpoints/mhc_l16 --json",
    "attnres": "depthlens attnres checkpoints/block_attnres_l16 --eps 0.05",
    "logit_lens": "depthlens logit_lens checkpoints/preln_l16 --n-seq 16",
    "tuned_lens": "depthlens tuned_lens checkpoints/preln_l16 --n-seq 16 --opt steps=100",
    "sweep": "depthlens sweep checkpoints/preln_l8 checkpoints/hc_l8 checkpoints/mhc_l8 --metric causal \\\n"
    "    --order preln_l8,mhc_l8,hc_l8 --plot depthlens-out/sweep.png",
    "report": "depthlens report checkpoints/*_l4/ --out depthlens-out/report_l4",
    "track": "depthlens train depthlens/recipes/zoo_cpu.json --run hc_l4 --out .cache/depthlens/runs/docs/hc_l4 steps=100 \\\n"
    "    export=depthlens-out/hc_l4 'snapshots=[25,50,100]'     # 100 steps of hc_l4's recipe, with snapshots (30 s)\n"
    "depthlens track .cache/depthlens/runs/docs/hc_l4 --n-seq 8 --out depthlens-out/track",
    "compare": "depthlens compare checkpoints/preln_l8 checkpoints/hc_l8 --metrics causal,perm_abs",
    "plan": "depthlens plan reports/zoo       # or checkpoints: >= 2 training seeds per design a claim compares",
    "shapes": "depthlens shapes --target 407M --design hc",
    "prepare": "depthlens prepare --out data/offline --max-bytes 1000000           # the packaged offline corpus, capped\n"
    "python -c 'import this' > data/zen.txt                               # or your .txt/.jsonl/.parquet files\n"
    "depthlens prepare data/zen.txt --out data/zen --tokenizer bytes",
    "train": "depthlens train depthlens/recipes/zoo_cpu.json --run hc_l4 --out .cache/depthlens/runs/docs/hc_l4 steps=100 \\\n"
    "    export=depthlens-out/hc_l4 'snapshots=[25,50,100]'     # its first 100 of 400 steps",
    "eval": "depthlens eval checkpoints/hc_l16 --no-humaneval",
}


def _cli_help(cmd: str) -> str:
    r = CliRunner().invoke(app, [cmd, "--help"], terminal_width=110, env={"COLUMNS": "110", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    return r.output


def _parse_help(text: str) -> tuple[str, str, list[tuple[str, list[list[str]]]]]:
    """(usage, description, [(panel title, [[names, type, description, default]]])]) from rich help output."""
    lines = [l.rstrip() for l in text.splitlines()]
    usage = next(l.strip() for l in lines if l.strip().startswith("Usage:")).removeprefix("Usage:").strip()
    start = next(i for i, l in enumerate(lines) if l.strip().startswith("Usage:")) + 1
    desc, panels, rows = [], [], None
    entry = re.compile(r"^│ (\*?)\s*(\S.*?)\s{2,}(<[^>]*>(?: \[[^\]]*\])?)\s+(.*?)\s*│$")
    for l in lines[start:]:
        if l.startswith("╭─"):
            rows = []
            panels.append((l.strip("╭─╮ ").strip("─ ").strip(), rows))
        elif l.startswith("│") and rows is not None:
            m = entry.match(l)
            if m:
                names = ", ".join(f"`{n}`" for n in m.group(2).split())
                rows.append([names, m.group(3), m.group(4), "required" if m.group(1) else ""])
            elif rows:
                rows[-1][2] += " " + l.strip("│ ").strip()
        elif rows is None and not l.startswith("╰"):
            desc.append(l.strip())
    for _, rs in panels:
        for r in rs:
            d = re.search(r"\s*\[default: ([^\]]*)\]", r[2])
            if d:
                r[3] = d.group(1)
                r[2] = r[2].replace(d.group(0), "")
            r[2] = r[2].replace("[required]", "").strip()
            r[1] = "flag" if r[1] == "<bool>" else f"`{r[1]}`"  # bare <type> would be read as an HTML tag
            r[2] = r[2].replace("<", "&lt;")
    description = " ".join(" ".join(desc).split())
    return usage, description, panels


def cli_reference() -> str:
    import typer.main

    from depthlens.cli.app import app as _app

    group = typer.main.get_command(_app)
    names = list(group.list_commands(None))  # the app's commands and the registry's generic ones (cli/diagnostic.py)
    order = [c for c in CLI_ORDER if c in names] + sorted(set(names) - set(CLI_ORDER))
    out = [
        "# CLI reference",
        "",
        CLI_INTRO,
        "",
        "<!-- generated from `depthlens <command> --help` by `.venv/bin/python tests/test_report.py`; "
        "do not edit by hand -->",
        "",
        " · ".join(f"[{c}](#depthlens-{c})" for c in order),
        "",
        CLI_VOCABULARY,
        "",
    ]
    for cmd in order:
        usage, desc, panels = _parse_help(_cli_help(cmd))
        out += [f"## depthlens {cmd}", "", desc, ""]
        out += [CLI_NOTES[cmd], ""] if cmd in CLI_NOTES else ["```text", usage, "```", ""]
        for title, rows in panels:
            rows = [r for r in rows if not r[0].startswith("`--help`")]  # `--help`, `-h`
            if not rows:
                continue
            out += [f"**{title}**", "", "| name | type | description | default |", "|---|---|---|---|"]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
            out.append("")
        if cmd in CLI_EXAMPLES:
            out += ["```bash", CLI_EXAMPLES[cmd], "```", ""]
    return "\n".join(out).rstrip() + "\n"


def test_cli_reference_covers_every_command_and_option():
    import typer.main

    doc = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    for name, cmd in typer.main.get_command(app).commands.items():
        assert f"## depthlens {name}\n" in doc, f"docs/cli.md lacks `{name}`: run .venv/bin/python tests/test_report.py"
        section = doc.split(f"## depthlens {name}\n", 1)[1].split("\n## ", 1)[0]
        for p in cmd.params:
            if getattr(p, "hidden", False):  # an old spelling kept one version (docs/cli.md#vocabulary)
                continue
            for opt in p.opts:
                if opt.startswith("--") and opt != "--help":
                    assert f"`{opt}" in section, (
                        f"docs/cli.md: {name} {opt} missing; run .venv/bin/python tests/test_report.py"
                    )


def test_cli_reference_is_the_generated_page():
    """docs/cli.md is cli_reference() exactly, so every default and range in its tables is the CLI's own (the
    number ledger, tests/doc_numbers_ledger.toml, relies on it for the page's option defaults)."""
    doc = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    assert doc == cli_reference(), "docs/cli.md is stale: run .venv/bin/python tests/test_report.py"


if __name__ == "__main__":
    target = Path(__file__).parents[1] / "docs" / "cli.md"
    target.write_text(cli_reference())
    print(f"wrote {target}")
