"""CLI: every analysis command end to end, and the bad-input matrix (one stderr line, exit 1/2, no partial file)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from helpers import FAST


@pytest.fixture(scope="module")
def zoo(tiny_ckpt):
    return {arch: tiny_ckpt(arch) for arch in ("preln", "hc", "block_attnres")}


def run(args, cwd=None):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(r, code):
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("depthlens: error:"), r.stderr
    assert "Traceback" not in r.output


# --- happy paths ---------------------------------------------------------------------------------------


def test_causal_json_headline_and_dataset(zoo, tmp_path):
    out = tmp_path / "c.nc"
    r = run(["causal", zoo["preln"], "--threshold", "0.45", "--json", "--out", out, "--n-boot", "50", *FAST])
    assert r.exit_code == 0, r.output
    h = json.loads(r.stdout)
    for k in ("metric", "threshold", "share", "ci_low", "ci_high", "n_pairs"):
        assert k in h
    assert h["metric"] == "causal" and h["threshold"] == 0.45 and h["n_pairs"] == 3  # L=4: window {1,2,3}
    ds = xr.load_dataset(out)  # read whole and closed (tests/test_report_files_closed.py)
    # the share printed is the share of late pairs of the stored matrix above 0.45 (independent recount)
    m = ds["causal_score"].sel(aggregator="max", variant="current").values
    late = [(i, j) for i in range(1, 4) for j in range(i + 1, 4)]
    assert h["share_full"] == pytest.approx(sum(m[i, j] > 0.45 for i, j in late) / len(late))
    # the share with the interval: the size-fixed max share at m sequences, the mean over every m-subset
    import itertools

    seq_max = ds["seq_max"].sel(variant="current").values  # (layer, layer_other, sequence)
    N, k = seq_max.shape[-1], h["subsample_m"]
    subsets = list(itertools.combinations(range(N), k))
    want = np.mean([np.mean([seq_max[i, j, list(sub)].max() > 0.45 for i, j in late]) for sub in subsets])
    assert h["share"] == pytest.approx(want) and h["ci_low"] <= h["share"] <= h["ci_high"]
    assert "jackknife" in h["ci_method"] and h["ci_unit"] == "eval sequences"
    ds.close()
    # the printed line: the estimate inside its own interval, which names its method and unit
    r = run(["causal", zoo["preln"], "--out", tmp_path / "c2.nc", "--n-boot", "50", *FAST])
    first = r.stdout.splitlines()[0]  # one headline line: number, interval, method in a few words
    x, lo, hi = (float(v) for v in re.search(r"([0-9.]+)% \[([0-9.]+), ([0-9.]+)\]", first).groups())
    assert lo <= x <= hi and f"of 3 late pairs have C > 0.45 (95% CI, jackknife over {N} eval sequences" in first
    assert first.endswith(f"at m = {k})") and "share C >" not in r.stdout and "shards" not in r.stdout
    v = run(["causal", zoo["preln"], "--out", tmp_path / "c3.nc", "--n-boot", "50", "--verbose", *FAST])
    text = " ".join(v.stdout.split())
    line = text[text.index("share C > ") :]  # --verbose: the method in full, the share at all sequences
    x2, lo2, hi2 = (float(v) for v in re.search(r"([0-9.]+)% \[([0-9.]+)%, ([0-9.]+)%\]", line).groups())
    assert (x2, lo2, hi2) == (x, lo, hi) and "jackknife" in line and f"m = {k} of {N} sequences" in line


def test_causal_norm_resid_names_its_definition(zoo, tmp_path):
    out = tmp_path / "r.nc"
    r = run(
        [
            "causal",
            zoo["preln"],
            "--norm",
            "resid",
            "--aggregator",
            "pooled",
            "--json",
            "--out",
            out,
            "--n-boot",
            "0",
            *FAST,
        ]
    )
    assert r.exit_code == 0, r.output
    h = json.loads(r.stdout)
    assert (h["variant"], h["aggregator"], h["norm"]) == ("current", "pooled", "resid")
    assert h["definition"] == "causal C(s,t): variant=current, aggregator=pooled, norm=resid"
    ds = xr.load_dataset(out)
    assert ds.attrs["norm"] == "resid"
    m = ds["causal_score"].sel(aggregator="pooled", variant="current").values
    late = [(i, j) for i in range(1, 4) for j in range(i + 1, 4)]
    assert h["share"] == pytest.approx(sum(m[i, j] > 0.45 for i, j in late) / len(late))
    ds.close()
    text = run(["causal", zoo["preln"], "--out", tmp_path / "u.nc", "--n-boot", "0", "-v", *FAST])
    assert "variant=current, aggregator=max, norm=update" in text.stdout
    one_error_line(run(["causal", zoo["preln"], "--norm", "rms", *FAST]), 2)
    p = run(
        ["permute", zoo["preln"], "--metric", "perm_rel", "--json", "--out", tmp_path / "p.nc", "--n-boot", "0", *FAST]
    )
    assert json.loads(p.stdout)["definition"] == "permutation P_rel = P_abs / L(id), swap=body"


@pytest.mark.parametrize(
    "old, new, notes",
    [
        (["causal", "--agg", "mean"], ["causal", "--aggregator", "mean"], ["--agg is deprecated.*; use --aggregator"]),
        (
            ["permute", "--norm", "kl", "--pairs", "all"],
            ["permute", "--metric", "perm_kl", "--layers", "all"],
            ["--pairs is deprecated.*; use --layers", "--norm kl is deprecated.*; use --metric perm_kl"],
        ),
    ],
)
def test_an_old_spelling_reads_as_the_new_one_with_a_note(zoo, tmp_path, old, new, notes):
    """The old spellings a spec declares (`Renamed`) still work this version: the headline of the new spelling,
    one note each on stderr naming it (in the spec's order), and no line in --help."""
    heads = []
    for i, args in enumerate((old, new)):
        r = run([args[0], zoo["preln"], *args[1:], "--json", "--out", tmp_path / f"{i}.nc", "--n-boot", "0", *FAST])
        assert r.exit_code == 0, r.output
        heads.append({k: v for k, v in json.loads(r.stdout).items() if k != "out"})
        said = [line for line in r.stderr.splitlines() if line.startswith("depthlens: note:")]
        assert len(said) == (len(notes) if args is old else 0), r.stderr
        assert all(re.search(want, line) for want, line in zip(notes, said)), said
    assert heads[0] == heads[1]
    usage = run([old[0], "--help"]).stdout
    assert not any(re.search(rf"{flag}\b", usage) for flag in old[1::2]), usage


def test_causal_companions_only_with_outputs(zoo, tmp_path):
    """O[s] and ΔL_skip put the LM head on every arm: computed (and printed) only with --outputs; the printed
    maximum is the stored one."""
    plain = run(["causal", zoo["preln"], "--out", tmp_path / "a.nc", "--n-boot", "0", *FAST])
    assert plain.exit_code == 0 and "layer-skip loss" not in plain.stdout
    with xr.open_dataset(tmp_path / "a.nc") as ds:
        assert "skip_delta_loss" not in ds and "output_effect" not in ds
    r = run(["causal", zoo["preln"], "--outputs", "--out", tmp_path / "b.nc", "--n-boot", "0", *FAST])
    assert r.exit_code == 0, r.output
    with xr.open_dataset(tmp_path / "b.nc") as ds:
        dl = ds.skip_delta_loss.values
        s = int(dl.argmax())
        assert ds.attrs["outputs"] in (1, True) and ds.output_effect.shape == (1, 4)
    assert f"max {dl[s]:.3f} nats at layer {s}" in r.stdout


def test_causal_text_has_heatmap(zoo, tmp_path):
    r = run(["causal", zoo["hc"], "--out", tmp_path / "c.nc", *FAST])
    assert r.exit_code == 0, r.output
    assert "have C > 0.45" in r.stdout and "█" in r.stdout


@pytest.mark.parametrize(
    "cmd,arch,extra",
    [
        ("angular", "block_attnres", ["--positions", "all"]),
        ("permute", "preln", ["--threshold", "0.15", "--n-boot", "20"]),
        ("rank", "hc", []),
        ("attnres", "block_attnres", ["--eps", "0.05"]),
    ],
)
def test_other_commands_json(zoo, tmp_path, cmd, arch, extra):
    out = tmp_path / "x.nc"
    r = run([cmd, zoo[arch], "--json", "--out", out, *extra, *FAST])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["out"] == str(out) and out.stat().st_size > 0


def test_sweep_and_compare(zoo, tmp_path):
    out, png = tmp_path / "s.nc", tmp_path / "s.png"
    r = run(
        [
            "sweep",
            zoo["preln"],
            zoo["hc"],
            "--metric",
            "causal",
            "--thresholds",
            "0:1.5:0.05",
            "--out",
            out,
            "--plot",
            png,
            "--order",
            "preln_l4,hc_l4",
            "--json",
            *FAST,
        ]
    )
    assert r.exit_code == 0, r.output
    h = json.loads(r.stdout)
    assert 0 <= h["ranking_fraction"] <= 1 and png.stat().st_size > 5000
    ds = xr.open_dataset(out)
    assert ds.sizes["threshold"] == 31 and list(ds["checkpoint"].values) == ["preln_l4", "hc_l4"]
    ds.close()
    r = run(["compare", zoo["preln"], zoo["block_attnres"], "--json", "--n-boot", "20", *FAST])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["design"] for x in rows] == ["preln", "block_attnres"] and "perm_abs" in rows[0]


def test_rank_on_single_stream_is_a_domain_error(zoo, tmp_path):
    one_error_line(run(["rank", zoo["preln"], "--out", tmp_path / "r.nc", *FAST]), 1)
    assert not (tmp_path / "r.nc").exists()


# --- the bad-input matrix ------------------------------------------------------------------------------

COMMANDS = {
    "info": [],
    "hooks": [],
    "angular": FAST,
    "causal": FAST,
    "permute": FAST,
    "attnres": FAST,
    "eval": [*FAST, "--no-humaneval"],
    "sweep": FAST,
    "compare": FAST,
}


def _broken(tmp_path, zoo, how):
    import shutil

    from safetensors.torch import load_file, save_file

    src = zoo["block_attnres"]
    p = tmp_path / "broken"
    shutil.copytree(src, p)
    w = p / "model.safetensors"
    if how == "missing":
        shutil.rmtree(p)
    elif how == "empty":
        for f in p.iterdir():
            f.unlink()
    elif how == "corrupt":
        w.write_bytes(b"\x00garbage" * 10)
    elif how == "truncated":
        w.write_bytes(w.read_bytes()[:100])
    elif how == "mismatch":
        meta = json.loads((p / "config.json").read_text())
        meta["model"]["n_layer"] = 5
        (p / "config.json").write_text(json.dumps(meta))
    elif how == "unknown_design":
        meta = json.loads((p / "config.json").read_text())
        meta["model"]["arch"] = "mystery"
        (p / "config.json").write_text(json.dumps(meta))
    elif how == "nan":
        t = load_file(str(w))
        t["embed_tokens.weight"][3, 3] = float("nan")
        save_file(t, str(w))
    return p


@pytest.mark.slow
@pytest.mark.parametrize("how", ["missing", "empty", "corrupt", "truncated", "mismatch", "unknown_design", "nan"])
@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_bad_checkpoint(zoo, tmp_path, monkeypatch, cmd, how):
    monkeypatch.chdir(tmp_path)
    p = _broken(tmp_path, zoo, how)
    before = set(tmp_path.iterdir())
    one_error_line(run([cmd, p, *COMMANDS[cmd]]), 1)
    assert set(tmp_path.iterdir()) <= before  # no output file left behind


@pytest.mark.parametrize("cmd,opt", [("causal", "--threshold"), ("permute", "--threshold"), ("attnres", "--eps")])
@pytest.mark.parametrize("value", ["-0.1", "nan", "inf"])
def test_bad_threshold_is_a_usage_error(zoo, tmp_path, cmd, opt, value):
    arch = "block_attnres" if cmd == "attnres" else "preln"
    one_error_line(run([cmd, zoo[arch], opt, value, "--out", tmp_path / "x.nc", *FAST]), 2)
    assert not (tmp_path / "x.nc").exists()


def test_bad_threshold_grid_and_choice(zoo):
    one_error_line(run(["sweep", zoo["preln"], "--thresholds", "1:0:0.1", *FAST]), 2)
    one_error_line(run(["sweep", zoo["preln"], "--thresholds", "-1,0.5", *FAST]), 2)
    one_error_line(run(["causal", zoo["preln"], "--aggregator", "median", *FAST]), 2)
    one_error_line(run(["causal", zoo["preln"], "--bogus"]), 2)


@pytest.mark.parametrize("cmd", ["angular", "causal", "eval"])
def test_bad_data_files(zoo, tmp_path, cmd):
    empty, latin = tmp_path / "empty.txt", tmp_path / "latin.txt"
    empty.write_text("")
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 100)
    extra = ["--no-humaneval"] if cmd == "eval" else ["--out", tmp_path / "o.nc"]
    for f in (empty, latin, tmp_path / "missing.txt"):
        one_error_line(run([cmd, zoo["preln"], "--data", f, *FAST, *extra]), 1)
    assert not (tmp_path / "o.nc").exists()


@pytest.mark.parametrize("cmd", ["angular", "causal", "permute", "eval"])
def test_sequence_longer_than_model_max(zoo, tmp_path, cmd):
    extra = ["--no-humaneval"] if cmd == "eval" else ["--out", tmp_path / "o.nc"]
    one_error_line(run([cmd, zoo["preln"], "--n-seq", "2", "--seq-len", "999", *extra]), 1)
    assert not (tmp_path / "o.nc").exists()


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["angular", "causal", "permute"])
def test_existing_and_unwritable_outputs(zoo, tmp_path, cmd):
    existing = tmp_path / "exists.nc"
    existing.write_text("keep me")
    one_error_line(run([cmd, zoo["preln"], "--out", existing, *FAST]), 1)
    assert existing.read_text() == "keep me"
    one_error_line(run([cmd, zoo["preln"], "--out", tmp_path / "no" / "such" / "dir.nc", *FAST]), 1)
    # --overwrite replaces only a depthlens dataset: never a foreign file of the same name
    one_error_line(run([cmd, zoo["preln"], "--out", existing, "--overwrite", *FAST]), 1)
    assert existing.read_text() == "keep me"
    ours = tmp_path / "ours.nc"
    assert run([cmd, zoo["preln"], "--out", ours, *FAST]).exit_code == 0
    one_error_line(run([cmd, zoo["preln"], "--out", ours, *FAST]), 1)  # no silent replacement
    assert run([cmd, zoo["preln"], "--out", ours, "--overwrite", *FAST]).exit_code == 0
    with xr.open_dataset(ours) as ds:
        assert ds.attrs["metric"]


def test_unwritable_directory(zoo, tmp_path):
    """/proc refuses new files even for root, so this holds wherever CI runs."""
    one_error_line(run(["causal", zoo["preln"], "--out", "/proc/depthlens-test.nc", *FAST]), 1)
    one_error_line(run(["eval", "/proc/self/no-such-ckpt"]), 1)


def test_shapes_and_prepare(tmp_path):
    r = run(["shapes", "--target", "407M", "--depths", "16,70", "--json"])
    assert r.exit_code == 0
    rows = json.loads(r.stdout)
    assert [x["d_model"] for x in rows] == [1216, 640]
    assert math.isclose(rows[0]["prefill_flops"] / 1e12, 2.98, abs_tol=0.01)
    one_error_line(run(["shapes", "--target", "lots"]), 2)
    (tmp_path / "a.txt").write_text("hello world\n" * 50)
    r = run(["prepare", tmp_path / "a.txt", "--out", tmp_path / "shards", "--json"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "shards" / "manifest.json").exists()
    (tmp_path / "e.txt").write_text("")
    one_error_line(run(["prepare", tmp_path / "e.txt", "--out", tmp_path / "s2"]), 1)


def test_eval_command(zoo):
    r = run(["eval", zoo["preln"], *FAST, "--limit", "3", "--json"])
    assert r.exit_code == 0, r.output
    h = json.loads(r.stdout)
    assert math.isclose(h["val_loss"], math.log(257), rel_tol=0.05)  # an untrained model is near uniform
    assert h["domain"]["humaneval"]["n_items"] == 3


def test_help_is_fast_and_lists_commands():
    import subprocess
    import sys
    import time

    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", "from depthlens.cli import app; app()", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    for cmd in (
        "info",
        "hooks",
        "angular",
        "causal",
        "permute",
        "rank",
        "attnres",
        "sweep",
        "compare",
        "shapes",
        "prepare",
        "eval",
    ):
        assert cmd in out.stdout
    mods = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from depthlens.cli import app; "
            "print(int(any(m in sys.modules for m in ('torch', 'xarray', 'nnsight'))))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert mods.stdout.strip() == "0"  # heavy imports stay inside commands
    assert time.perf_counter() - t < 30


def test_eval_jsonl_presets_and_bad_mapping(zoo, tmp_path):
    """GSM8K-style JSONL through the preset field mapping; NLL equals a direct teacher-forced computation."""
    import torch

    f = tmp_path / "gsm8k.jsonl"
    rows = [{"question": "What is 2+2?", "answer": "4"}, {"question": "Name a colour.", "answer": "blue"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    r = run(["eval", zoo["preln"], "--no-humaneval", "--jsonl", f"gsm8k={f}", *FAST, "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["domain"]["gsm8k"]
    model = depthlens.load(zoo["preln"]).model
    total, n = 0.0, 0
    for row in rows:  # bytes tokenizer: BOS 256, then UTF-8 bytes
        p, a = list(row["question"].encode()), list(row["answer"].encode())
        seq = torch.tensor([[256, *p, *a]])
        logp = torch.log_softmax(model(seq)[0].detach().double(), -1)
        start = 1 + len(p)
        total += float(-sum(logp[t - 1, seq[0, t]] for t in range(start, seq.shape[1])))
        n += len(a)
    assert got["nll"] == pytest.approx(total / n, rel=1e-4) and got["n_items"] == 2
    one_error_line(run(["eval", zoo["preln"], "--no-humaneval", "--jsonl", f"mine={f}"]), 2)  # no preset, no fields
    one_error_line(
        run(
            [
                "eval",
                zoo["preln"],
                "--no-humaneval",
                "--jsonl",
                f"x={f}:prompt,answer",
                "--n-seq",
                "2",
                "--seq-len",
                "16",
            ]
        ),
        1,
    )  # fields absent in the file
