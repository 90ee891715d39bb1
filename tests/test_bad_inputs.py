"""The bad-input matrix: every command, every kind of bad input (option ranges, path kinds, config fields,
resource caps, outputs that must not be replaced), each answered by one stderr line naming the offence,
the documented exit code (2 usage, 1 domain), no traceback, and nothing left behind. Plus signals during
writes: SIGTERM cleans up in place, SIGKILL's leftovers are cleaned by the next writer.

In-process (typer's CliRunner) except the few SIGKILL cases, and every case fails before any real work,
so the whole matrix runs in seconds.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from depthlens.models import ModelConfig, build_model
from helpers import FAST

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_ckpt) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    e = {"root": root}
    for arch in ("preln", "hc"):
        e[arch] = tiny_ckpt(arch)
    os.mkfifo(root / "fifo")
    e["fifo"] = root / "fifo"
    (root / "notes.txt").write_text("A small text. " * 200)
    e["txt"] = root / "notes.txt"
    (root / "foreign.nc").write_text("not ours")
    (root / "foreign.png").write_text("not ours")
    (root / "foreign_dir").mkdir()
    (root / "foreign_dir" / "keep.txt").write_text("keep")
    for name, edit in {
        "cfg_float_streams": {"hc_streams": 2.5},
        "cfg_huge_depth": {"n_layer": 200000},
        "cfg_string_width": {"d_model": "64"},
    }.items():
        d = root / name
        d.mkdir()
        cfg = json.loads((e["hc"] / "config.json").read_text())
        cfg["model"].update(edit)
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors").write_bytes((e["hc"] / "model.safetensors").read_bytes())
    for name, text in {"list_manifest": "[1, 2]", "keyless_manifest": '{"splits": {"train": {}}}'}.items():
        (root / name).mkdir()
        (root / name / "manifest.json").write_text(text)
    _hostile_checkpoints(root, e)
    return e


def _hostile_checkpoints(root: Path, e: dict[str, Path]) -> None:
    """Checkpoints whose files lie: a tied config over an untied weight file, a float64 weight that is +inf in
    fp32, config.json as a FIFO / /dev/zero / 100k-deep JSON, a mistyped train.json and tokenizer config, and an
    all-zero model. Plus a FIFO named like a device map."""
    from safetensors.torch import load_file, save_file

    def clone(name: str) -> Path:
        d = root / name
        d.mkdir()
        for f in e["preln"].iterdir():
            if f.is_file():
                (d / f.name).write_bytes(f.read_bytes())
        return d

    d = clone("ck_tied_own_head")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model"]["tie_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    d = clone("ck_f64_overflow")
    sd = load_file(str(d / "model.safetensors"))
    sd["blocks.0.attn.fn.o_proj.weight"] = sd["blocks.0.attn.fn.o_proj.weight"].double()
    sd["blocks.0.attn.fn.o_proj.weight"][0, 0] = 1e300  # finite in float64, +inf in the fp32 the model computes in
    save_file(sd, str(d / "model.safetensors"))
    d = clone("ck_config_fifo")
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    d = clone("ck_config_dev_zero")
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    d = clone("ck_config_deep")
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    d = clone("ck_train_json_bad")
    (d / "train.json").write_text(json.dumps({"steps": "many", "final_val_loss": 3.0}))
    d = clone("ck_tokenizer_kind_list")
    (d / "tokenizer_config.json").write_text(json.dumps({"kind": ["bytes"]}))
    zero = build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0)
    with torch.no_grad():
        for p in zero.parameters():
            p.zero_()
    depthlens.save(zero, root / "ck_all_zero")
    os.mkfifo(root / "map.json")
    for name, text in RAW_RECIPES.items():
        (root / f"raw_{name}.json").write_text(text)
    _strict_json_inputs(root, e)


def _strict_json_inputs(root: Path, e: dict[str, Path]) -> None:
    """JSON the standard library takes but depthlens must refuse (issue 35): a key twice or NaN in a JSONL line of
    --data / prepare / eval --jsonl, a tensor named twice in a safetensors header, a shard manifest's key twice."""
    import struct

    (root / "dup.jsonl").write_text('{"text": "one text"}\n{"text": "kept?", "text": "or this?"}\n')
    (root / "nan.jsonl").write_text('{"text": "one text", "weight": NaN}\n')
    (root / "dupqa.jsonl").write_text('{"q": "1 + 1 =", "a": "2", "a": "3"}\n')
    d = root / "ck_safetensors_dup"
    d.mkdir()
    for f in e["preln"].iterdir():
        if f.is_file() and f.name != "model.safetensors":
            (d / f.name).write_bytes(f.read_bytes())
    blob = (e["preln"] / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    pairs = list(json.loads(blob[8 : 8 + n]).items())
    name, info = next((k, v) for k, v in pairs if k != "__metadata__")
    header = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in [*pairs, (name, info)]) + "}"
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode() + blob[8 + n :])
    (root / "dup_manifest").mkdir()
    (root / "dup_manifest" / "manifest.json").write_text('{"splits": {}, "splits": {"train": {}}}')


_BASE = {
    "model": {"arch": "preln", "d_model": 32, "n_layer": 2, "n_head": 2, "vocab_size": 257, "max_seq_len": 32},
    "seq_len": 32,
    "global_batch": 8,
    "steps": 5,
    "warmup": 1,
}
# recipes that the old hand-written checks let through to a traceback (AttributeError, TypeError)
RAW_RECIPES = {
    "runs_int": json.dumps({"base": _BASE, "runs": 3}),
    "runs_list": json.dumps({"base": _BASE, "runs": [{"lr": 1e-3}]}),
    "base_list": json.dumps({"base": [1, 2], "runs": {"a": {}}}),
    "run_bad_lr": json.dumps({"base": _BASE, "runs": {"a": {"lr": "abc"}}}),
    "lr_text": json.dumps({**_BASE, "lr": "abc"}),
    "betas_scalar": json.dumps({**_BASE, "betas": 0.9}),
    "eps_text": json.dumps({**_BASE, "eps": "1e-8"}),
    "grad_clip_text": json.dumps({**_BASE, "grad_clip": "x"}),
    "min_lr_null": json.dumps({**_BASE, "min_lr_factor": None}),
    "out_int": json.dumps({**_BASE, "out": 123}),
    "threads_huge": json.dumps({**_BASE, "threads": 100000}),
    "name_list": json.dumps({**_BASE, "name": ["a"]}),
    "deep": "[" * 100_000 + "]" * 100_000,
}


def _recipe(env: dict[str, Path], name: str, **over) -> Path:
    base = dict(
        model=dict(arch="preln", d_model=32, n_layer=2, n_head=2, vocab_size=257, max_seq_len=32),
        data=str(env["root"] / "no_such_corpus"),
        seq_len=32,
        global_batch=8,
        steps=5,
        warmup=1,
        out=str(env["root"] / f"run_{name}"),
    )
    for k, v in over.items():
        if k == "model":
            base["model"].update(v)
        else:
            base[k] = v
    path = env["root"] / f"recipe_{name}.json"
    path.write_text(json.dumps(base))
    return path


# (case id, argv with {placeholders}, exit code, a substring of the one error line)
CASES: list[tuple[str, list[str], int, str]] = []
ANALYSES = ["angular", "causal", "permute", "rank", "attnres"]
for cmd in ANALYSES:
    ck = "{hc}" if cmd == "rank" else "{preln}"
    CASES += [
        (f"{cmd}-device-cuda", [cmd, ck, "--device", "cuda", *FAST], 1, "--device cuda"),
        (f"{cmd}-device-tpu9", [cmd, ck, "--device", "tpu9", *FAST], 2, "--device"),
        (f"{cmd}-seed-negative", [cmd, ck, "--seed", "-1", *FAST], 2, "--seed"),
        (f"{cmd}-seed-huge", [cmd, ck, "--seed", "99999999999999999999999", *FAST], 2, "--seed"),
        (f"{cmd}-data-dev-zero", [cmd, ck, "--data", "/dev/zero", *FAST], 1, "character device"),
        (f"{cmd}-data-fifo", [cmd, ck, "--data", "{fifo}", *FAST], 1, "FIFO"),
        (f"{cmd}-data-missing", [cmd, ck, "--data", "{root}/nope.txt", *FAST], 1, "nope.txt"),
        (f"{cmd}-n-seq-zero", [cmd, ck, "--n-seq", "0", "--seq-len", "16"], 2, "--n-seq"),
        (f"{cmd}-seq-len-too-long", [cmd, ck, "--n-seq", "2", "--seq-len", "4096"], 1, "--seq-len"),
        (
            f"{cmd}-out-foreign-overwrite",
            [cmd, ck, "--out", "{root}/foreign.nc", "--overwrite", *FAST],
            1,
            "not recognisably depthlens",
        ),
        (f"{cmd}-out-exists", [cmd, ck, "--out", "{root}/foreign.nc", *FAST], 1, "already exists"),
        (f"{cmd}-out-no-dir", [cmd, ck, "--out", "{root}/no/dir/x.nc", *FAST], 1, "does not exist"),
        (f"{cmd}-out-is-dir", [cmd, ck, "--out", "{root}/foreign_dir", *FAST], 1, "directory"),
        (f"{cmd}-threads-negative", [cmd, ck, "--threads", "-1", *FAST], 2, "--threads"),
        (f"{cmd}-ckpt-missing", [cmd, "{root}/no_ckpt", *FAST], 1, "no_ckpt"),
    ]
for cmd in ("causal", "permute"):
    CASES += [
        (f"{cmd}-n-boot-huge", [cmd, "{preln}", "--n-boot", "1000000000", *FAST], 2, "--n-boot"),
        (f"{cmd}-threshold-nan", [cmd, "{preln}", "--threshold", "nan", *FAST], 2, "--threshold"),
    ]
CASES += [
    ("sweep-grid-huge", ["sweep", "{preln}", "--thresholds", "0:1e12:1", *FAST], 2, "points"),
    ("sweep-grid-10M", ["sweep", "{preln}", "--thresholds", "0:1:0.0000001", *FAST], 2, "points"),
    ("sweep-grid-bad", ["sweep", "{preln}", "--thresholds", "1:0:0.1", *FAST], 2, "--thresholds"),
    ("sweep-grid-empty", ["sweep", "{preln}", "--thresholds", ",", *FAST], 2, "--thresholds"),
    ("sweep-order-unknown", ["sweep", "{preln}", "{hc}", "--order", "x,y", *FAST], 2, "--order"),
    (
        "sweep-plot-no-dir",
        ["sweep", "{preln}", "--out", "{root}/s.nc", "--plot", "{root}/nodir/p.png", *FAST],
        1,
        "does not exist",
    ),
    ("sweep-plot-suffix", ["sweep", "{preln}", "--out", "{root}/s.nc", "--plot", "{root}/p.txt", *FAST], 2, "--plot"),
    (
        "sweep-plot-foreign",
        ["sweep", "{preln}", "--out", "{root}/s.nc", "--plot", "{root}/foreign.png", "--overwrite", *FAST],
        1,
        "not recognisably",
    ),
    ("sweep-metric-bogus", ["sweep", "{preln}", "--metric", "bogus", *FAST], 2, "--metric"),
    ("sweep-device-cuda", ["sweep", "{preln}", "--device", "cuda", *FAST], 1, "--device"),
    ("compare-metrics-empty", ["compare", "{preln}", "--metrics", ",", *FAST], 2, "--metrics"),
    ("compare-metrics-bogus", ["compare", "{preln}", "--metrics", "causal,bogus", *FAST], 2, "--metrics"),
    ("compare-n-boot-huge", ["compare", "{preln}", "--n-boot", "1000000000", *FAST], 2, "--n-boot"),
    ("compare-device-cuda", ["compare", "{preln}", "--device", "cuda", *FAST], 1, "--device"),
    ("info-missing", ["info", "{root}/no_ckpt"], 1, "no_ckpt"),
    ("info-float-streams", ["info", "{root}/cfg_float_streams"], 1, "hc_streams"),
    ("info-huge-depth", ["info", "{root}/cfg_huge_depth"], 1, "n_layer"),
    ("info-string-width", ["info", "{root}/cfg_string_width"], 1, "d_model"),
    ("hooks-missing", ["hooks", "{root}/no_ckpt"], 1, "no_ckpt"),
    ("eval-device-cuda", ["eval", "{preln}", "--device", "cuda"], 1, "--device cuda"),
    ("eval-device-bad", ["eval", "{preln}", "--device", "gpu"], 2, "--device"),
    ("eval-tokenizer-unknown", ["eval", "{preln}", "--tokenizer", "nonesuch"], 2, "--tokenizer"),
    ("eval-data-fifo", ["eval", "{preln}", "--data", "{fifo}"], 1, "FIFO"),
    ("eval-data-dev-zero", ["eval", "{preln}", "--data", "/dev/zero"], 1, "character device"),
    ("eval-jsonl-no-file", ["eval", "{preln}", "--jsonl", "gsm8k"], 2, "--jsonl"),
    ("eval-jsonl-missing", ["eval", "{preln}", "--jsonl", "gsm8k={root}/nope.jsonl"], 1, "nope.jsonl"),
    ("eval-jsonl-fields", ["eval", "{preln}", "--jsonl", "mine={txt}"], 2, "--jsonl"),
    ("eval-seed-negative", ["eval", "{preln}", "--seed", "-1"], 2, "--seed"),
    ("shapes-target-zero", ["shapes", "--target", "0"], 2, "--target"),
    ("shapes-target-negative", ["shapes", "--target", "-5M"], 2, "--target"),
    ("shapes-target-text", ["shapes", "--target", "lots"], 2, "parameter count"),
    ("shapes-target-huge", ["shapes", "--target", "1e30"], 2, "--target"),
    ("shapes-depths-nonpositive", ["shapes", "--depths", "0,-3"], 2, "--depths"),
    ("shapes-depths-text", ["shapes", "--depths", "a,b"], 2, "--depths"),
    ("shapes-aspect-zero", ["shapes", "--aspect-ratios", "0"], 2, "--aspect-ratios"),
    ("shapes-design-unknown", ["shapes", "--design", "nonesuch"], 2, "--design"),
    ("report-device-cuda", ["report", "{preln}", "--out", "{root}/rep", "--device", "cuda"], 1, "--device"),
    (
        "report-out-foreign",
        ["report", "{preln}", "--out", "{root}/foreign_dir", "--overwrite"],
        1,
        "not a depthlens report",
    ),
    ("report-n-boot-huge", ["report", "{preln}", "--out", "{root}/rep", "--n-boot", "1000000000"], 2, "--n-boot"),
    ("report-data-fifo", ["report", "{preln}", "--out", "{root}/rep", "--data", "{fifo}"], 1, "FIFO"),
    (
        "report-seed-huge",
        ["report", "{preln}", "--out", "{root}/rep", "--seed", "99999999999999999999999"],
        2,
        "--seed",
    ),
    ("track-device-cuda", ["track", "{root}", "--device", "cuda"], 1, "--device"),
    ("track-n-boot-huge", ["track", "{root}", "--n-boot", "1000000000"], 2, "--n-boot"),
    ("prepare-missing-input", ["prepare", "{root}/nope.txt", "--out", "{root}/shards"], 1, "nope.txt"),
    ("prepare-out-foreign", ["prepare", "{txt}", "--out", "{root}/foreign_dir", "--overwrite"], 1, "not recognisably"),
    ("prepare-out-exists", ["prepare", "{txt}", "--out", "{root}/foreign_dir"], 1, "already exists"),
    (
        "prepare-tokenizer-unknown",
        ["prepare", "{txt}", "--out", "{root}/shards", "--tokenizer", "nonesuch"],
        2,
        "--tokenizer",
    ),
    ("prepare-seed-negative", ["prepare", "{txt}", "--out", "{root}/shards", "--seed", "-1"], 2, "--seed"),
    ("train-recipe-missing", ["train", "{root}/no_recipe.json"], 1, "no_recipe.json"),
    ("train-recipe-not-json", ["train", "{txt}"], 1, "JSON"),
    ("train-unknown-field", ["train", "@recipe:typo", "lrr=1"], 2, "lrr"),
    ("train-float-streams", ["train", "@recipe:streams", "model.arch=hc", "model.hc_streams=2.5"], 2, "hc_streams"),
    ("train-huge-depth", ["train", "@recipe:depth", "model.n_layer=200000"], 1, "GiB"),
    ("train-seq-len-memory", ["train", "@recipe:seq", "seq_len=1000000", "model.max_seq_len=1000000"], 1, "GiB"),
    ("train-global-batch-memory", ["train", "@recipe:batch", "global_batch=1000000"], 1, "GiB"),
    ("train-export-own-out", ["train", "@recipe:export", "export={root}/run_export"], 2, "export"),
    ("train-micro-batch", ["train", "@recipe:micro", "micro_batch=3"], 2, "micro_batch"),
    ("train-lr-negative", ["train", "@recipe:lr", "lr=-1"], 2, "lr"),
    ("train-data-missing", ["train", "@recipe:data"], 1, "no_such_corpus"),
    ("train-data-list-manifest", ["train", "@recipe:manifest", "data={root}/list_manifest"], 1, "manifest"),
    ("train-data-keyless-manifest", ["train", "@recipe:keyless", "data={root}/keyless_manifest"], 1, "shards"),
    ("train-data-dev-zero", ["train", "@recipe:zero", "data=/dev/zero"], 1, "/dev/zero"),
    # --- issue 23: the schema layer, the file opener, the numerics of inputs -----------------------------------
    *[
        (f"train-recipe-{n.replace('_', '-')}", ["train", f"{{root}}/raw_{n}.json"], 1, needle)
        for n, needle in [
            ("runs_int", "'runs'"),
            ("runs_list", "'runs'"),
            ("base_list", "'base'"),
            ("lr_text", "'lr'"),
            ("betas_scalar", "'betas'"),
            ("eps_text", "'eps'"),
            ("grad_clip_text", "'grad_clip'"),
            ("min_lr_null", "'min_lr_factor'"),
            ("out_int", "'out'"),
            ("threads_huge", "'threads'"),
            ("name_list", "'name'"),
            ("deep", "nested too deeply"),
        ]
    ],
    ("train-grid-bad-run", ["train", "{root}/raw_run_bad_lr.json", "--run", "a"], 1, "'lr'"),
    ("train-list-runs-int", ["train", "{root}/raw_runs_int.json", "--list"], 1, "'runs'"),
    ("train-list-bad-run", ["train", "{root}/raw_run_bad_lr.json", "--list"], 1, "'lr'"),
    ("train-list-base-list", ["train", "{root}/raw_base_list.json", "--list"], 1, "'base'"),
    ("train-recipe-fifo", ["train", "{fifo}"], 1, "FIFO"),
    ("train-recipe-dir", ["train", "{root}/foreign_dir"], 1, "directory"),
    ("train-recipe-dev-zero", ["train", "/dev/zero"], 1, "character device"),
    ("train-override-threads-huge", ["train", "@recipe:threads", "threads=100000"], 2, "'threads'"),
    ("train-override-text-lr", ["train", "@recipe:lrtext", "lr=abc"], 2, "'lr'"),
    ("train-override-conflict", ["train", "@recipe:conflict", "lr=1", "lr.x=2"], 2, "lr"),
    ("train-override-empty-key", ["train", "@recipe:emptykey", "=3"], 2, "key=value"),
    ("train-override-null-byte", ["train", "@recipe:nul", "export=a\x00b"], 2, "'export'"),
    ("info-tied-own-head", ["info", "{root}/ck_tied_own_head"], 1, "tie_embeddings"),
    ("info-f64-overflow", ["info", "{root}/ck_f64_overflow"], 1, "NaN or Inf"),
    ("causal-f64-overflow", ["causal", "{root}/ck_f64_overflow", *FAST], 1, "NaN or Inf"),
    ("info-config-fifo", ["info", "{root}/ck_config_fifo"], 1, "FIFO"),
    ("info-config-dev-zero", ["info", "{root}/ck_config_dev_zero"], 1, "character device"),
    ("info-config-deep", ["info", "{root}/ck_config_deep"], 1, "nested too deeply"),
    ("info-train-json-bad", ["info", "{root}/ck_train_json_bad"], 1, "'steps'"),
    ("info-tokenizer-kind-list", ["info", "{root}/ck_tokenizer_kind_list"], 1, "'kind'"),
    ("causal-all-zero", ["causal", "{root}/ck_all_zero", *FAST], 1, "every weight is zero"),
    ("angular-all-zero", ["angular", "{root}/ck_all_zero", *FAST], 1, "every weight is zero"),
    ("sweep-grid-subnormal-step", ["sweep", "{preln}", "--thresholds", "0:1:1e-320", *FAST], 2, "points"),
    ("sweep-grid-huge-stop", ["sweep", "{preln}", "--thresholds", "0:1e308:1e-10", *FAST], 2, "points"),
    ("angular-batch-size-huge", ["angular", "{preln}", "--batch-size", "1" + "0" * 30, *FAST], 2, "--batch-size"),
    ("causal-n-seq-huge", ["causal", "{preln}", "--n-seq", "1" + "0" * 30, "--seq-len", "16"], 2, "--n-seq"),
    ("shapes-aspect-tiny", ["shapes", "--aspect-ratios", "1e-300"], 2, "--aspect-ratios"),
    ("shapes-aspect-huge-ok-range", ["shapes", "--target", "1e5", "--aspect-ratios", "9000"], 2, "--aspect-ratios"),
    ("causal-device-map-cuda7", ["causal", "{preln}", "--device-map", "cuda:7", *FAST], 1, "cuda:7"),
    ("causal-device-map-fifo", ["causal", "{preln}", "--device-map", "{root}/map.json", *FAST], 1, "FIFO"),
    ("causal-device-map-missing", ["causal", "{preln}", "--device-map", "{root}/nomap.json", *FAST], 1, "nomap.json"),
    (
        "causal-device-map-bad-field",
        ["causal", "{preln}", "--device-map", '{{"embed": true, "layers": "cpu", "head": "cpu"}}', *FAST],
        2,
        "'embed'",
    ),
    ("causal-device-map-name", ["causal", "{preln}", "--device-map", "gpu0", *FAST], 2, "--device-map"),
    ("prepare-dev-zero", ["prepare", "/dev/zero", "--out", "{root}/shards"], 1, "character device"),
    ("prepare-fifo", ["prepare", "{fifo}", "--out", "{root}/shards"], 1, "FIFO"),
    ("prepare-dir", ["prepare", "{root}/foreign_dir", "--out", "{root}/shards"], 1, "directory"),
    ("prepare-max-bytes-1", ["prepare", "--max-bytes", "1", "--out", "{root}/shards"], 1, "--max-bytes"),
    ("eval-jsonl-deep", ["eval", "{preln}", "--jsonl", "x={root}/raw_deep.json:q,a"], 1, "nested too deeply"),
    ("train-bad-override", ["train", "@recipe:override", "novalue"], 2, "key=value"),
]


# --- issue 23, owned outputs: a directory without depthlens's marker is never modified, a trainer's export only by
# the run that made it, -o DIR/ names a directory, two outputs never share a path, names fit the filesystem, an
# unwritable directory is refused before the computation (more, with reruns and locks: test_owned_outputs.py)
CASES += [
    ("train-out-user-dir", ["train", "@recipe:userdir", "--out", "{root}/foreign_dir"], 1, "refusing to write into it"),
    (
        "train-export-user-dir",
        ["train", "@recipe:userexport", "export={root}/foreign_dir"],
        1,
        "not recognisably depthlens output",
    ),
    ("train-export-foreign-checkpoint", ["train", "@recipe:theirs", "export={preln}"], 1, "not by this run"),
    (
        "track-out-user-dir",
        ["track", "{preln}", "--out", "{root}/foreign_dir", *FAST],
        1,
        "not a track output directory",
    ),
    (
        "sweep-out-plot-same",
        ["sweep", "{preln}", "-o", "{root}/same.png", "--plot", "{root}/same.png", *FAST],
        1,
        "name the same file",
    ),
    ("angular-out-slash-on-file", ["angular", "{preln}", "-o", "{root}/notes.txt/", *FAST], 1, "not a directory"),
    ("angular-out-name-too-long", ["angular", "{preln}", "-o", "{root}/" + "z" * 256, *FAST], 1, "256 bytes"),
    ("angular-out-read-only-dir", ["angular", "{preln}", "-o", "/sys/a.nc", *FAST], 1, "not writable"),
    ("train-two-run-names", ["train", "@recipe:tworun", "run=a", "--run", "b"], 2, "two run names"),
    ("plan-ckpt-missing", ["plan", "{root}/no_ckpt"], 1, "no_ckpt"),
    ("plan-one-seed", ["plan", "{preln}", "{hc}"], 2, ">= 2 seeds per design"),
    ("plan-power-out-of-range", ["plan", "{preln}", "--power", "1.5"], 2, "--power"),
    ("prune-ckpt-missing", ["prune", "{root}/no_ckpt", "--tolerance", "0.1", "-o", "{root}/pruned"], 1, "no_ckpt"),
    ("prune-tolerance-negative", ["prune", "{preln}", "--tolerance", "-1", "-o", "{root}/pruned"], 2, "--tolerance"),
    ("prune-tolerance-nan", ["prune", "{preln}", "--tolerance", "nan", "-o", "{root}/pruned"], 2, "--tolerance"),
    ("prune-out-is-input", ["prune", "{preln}", "--tolerance", "0.1", "-o", "{preln}"], 2, "input model's own"),
    ("prune-out-user-dir", ["prune", "{preln}", "--tolerance", "0.1", "-o", "{root}/foreign_dir"], 2, "exists"),
    ("cache-unknown-subcommand", ["cache", "frob"], 2, "No such command"),
]
# --- issue 35: every JSON a user hands depthlens is read strictly (a key twice, NaN), naming file and line ------
CASES += [
    ("causal-data-jsonl-key-twice", ["causal", "{preln}", "--data", "{root}/dup.jsonl", *FAST], 1, "'text' twice"),
    ("angular-data-jsonl-nan", ["angular", "{preln}", "--data", "{root}/nan.jsonl", *FAST], 1, "nan.jsonl:1: line"),
    (
        "prune-data-jsonl-key-twice",
        ["prune", "{preln}", "--tolerance", "0.1", "-o", "{root}/pruned", "--data", "{root}/dup.jsonl", *FAST],
        1,
        "dup.jsonl:2: line has the key 'text' twice",
    ),
    ("prepare-jsonl-key-twice", ["prepare", "{root}/dup.jsonl", "--out", "{root}/shards"], 1, "'text' twice"),
    ("prepare-jsonl-nan", ["prepare", "{root}/nan.jsonl", "--out", "{root}/shards"], 1, "holds NaN"),
    ("eval-jsonl-key-twice", ["eval", "{preln}", "--jsonl", "x={root}/dupqa.jsonl:q,a"], 1, "'a' twice"),
    ("info-safetensors-name-twice", ["info", "{root}/ck_safetensors_dup"], 1, "safetensors header has the key"),
    ("causal-safetensors-name-twice", ["causal", "{root}/ck_safetensors_dup", *FAST], 1, "twice"),
    ("train-data-manifest-key-twice", ["train", "@recipe:dupman", "data={root}/dup_manifest"], 1, "'splits' twice"),
]
# --- issue 35: a checkpoint is never an output, and nothing is written inside one (each writer, --overwrite or not)
INSIDE = "inside the model checkpoint"
CASES += [
    ("sweep-out-inside-checkpoint", ["sweep", "{preln}", "-o", "{preln}/s.nc", *FAST], 1, INSIDE),
    ("sweep-plot-inside-checkpoint", ["sweep", "{preln}", "--plot", "{preln}/p.png", *FAST], 1, INSIDE),
    ("causal-out-dir-checkpoint", ["causal", "{preln}", "-o", "{preln}/", "--overwrite", *FAST], 1, INSIDE),
    (
        "prepare-out-checkpoint",
        ["prepare", "{txt}", "--out", "{preln}", "--overwrite"],
        1,
        "model checkpoint directory",
    ),
    ("prepare-out-inside-checkpoint", ["prepare", "{txt}", "--out", "{preln}/ds"], 1, INSIDE),
    ("report-out-inside-checkpoint", ["report", "{preln}", "--out", "{preln}/rep"], 1, INSIDE),
    ("track-out-checkpoint", ["track", "{preln}", "--out", "{preln}"], 1, "not a track output directory"),
]


def _argv(args: list[str], env: dict[str, Path]) -> list[str]:
    out = []
    for a in args:
        if a.startswith("@recipe:"):
            a = str(_recipe(env, a.split(":", 1)[1]))
        out.append(a.format(**{k: str(v) for k, v in env.items()}))
    return out


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "recipe_" not in p.name}


def test_matrix_is_large_and_covers_every_command():
    import typer

    assert len(CASES) >= 80 and len({c[0] for c in CASES}) == len(CASES)
    from depthlens.diagnostics import registry

    covered = {c[1][0] for c in CASES}
    dedicated = set(typer.main.get_command(app).commands)
    assert dedicated <= covered, dedicated - covered
    # beyond them, the matrix runs commands built from registry entries (rank), through the same option parsing
    assert covered - dedicated and covered - dedicated <= set(registry.names()), covered - dedicated


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(env, case, monkeypatch):
    _, args, code, needle = case
    monkeypatch.chdir(env["root"])
    argv = _argv(args, env)
    before = _listing(env["root"])
    r = CliRunner().invoke(app, argv)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == code, (r.exit_code, r.stderr, r.stdout)
    assert len(lines) == 1 and lines[0].startswith("depthlens: error:"), r.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in r.output and not (r.exception and not isinstance(r.exception, SystemExit))
    assert _listing(env["root"]) == before, "the failed command left or removed files"
    assert (env["root"] / "foreign.nc").read_text() == "not ours"
    assert (env["root"] / "foreign_dir" / "keep.txt").read_text() == "keep"


# --- outputs: default names, recognition, strict JSON, announced caps -------------------------------


def test_default_folder_output_is_replaced_on_a_rerun_a_users_file_is_not(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["angular", str(env["preln"]), *FAST]
    assert CliRunner().invoke(app, args).exit_code == 0
    default = tmp_path / "depthlens-out" / "preln_l4.angular.nc"
    first = default.stat().st_ino
    r = CliRunner().invoke(app, args)  # depthlens-out/ is depthlens's: its own output there is simply replaced
    assert r.exit_code == 0, r.stderr
    assert default.stat().st_ino != first  # a new file renamed into place (atomic), not the old one kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["depthlens-out"]
    assert sorted(p.name for p in default.parent.iterdir()) == ["preln_l4.angular.nc"]
    mine = tmp_path / "mine.nc"  # the user's own path: a re-run asks for --overwrite
    assert CliRunner().invoke(app, [*args, "--out", str(mine)]).exit_code == 0
    stamp = mine.stat().st_mtime_ns
    r = CliRunner().invoke(app, [*args, "--out", str(mine)])
    assert r.exit_code == 1 and "already exists" in r.stderr and mine.stat().st_mtime_ns == stamp
    assert CliRunner().invoke(app, [*args, "--out", str(mine), "--overwrite"]).exit_code == 0
    foreign = default.parent / "notes.nc"  # a file of the user's inside depthlens-out/: never replaced
    foreign.write_text("mine")
    r = CliRunner().invoke(app, [*args, "--out", str(foreign), "--overwrite"])
    assert r.exit_code == 1 and "not recognisably depthlens output" in r.stderr and foreign.read_text() == "mine"


def test_json_is_strict_without_bootstrap(env, tmp_path):
    r = CliRunner().invoke(
        app, ["causal", str(env["preln"]), "--n-boot", "0", "--json", "--out", str(tmp_path / "c.nc"), *FAST]
    )
    assert r.exit_code == 0, r.stderr

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    h = json.loads(r.stdout, parse_constant=refuse)
    assert h["ci_low"] is None and h["ci_high"] is None and 0 <= h["share"] <= 1


def test_n_seq_cap_is_announced(env, tmp_path):
    r = CliRunner().invoke(
        app,
        [
            "angular",
            str(env["preln"]),
            "--data",
            str(env["txt"]),
            "--n-seq",
            "100000",
            "--seq-len",
            "16",
            "--json",
            "--out",
            str(tmp_path / "a.nc"),
        ],
    )
    assert r.exit_code == 0, r.stderr
    assert "--n-seq 100000 capped to" in r.stderr


def test_files_follow_the_umask(env, tmp_path):
    old = os.umask(0o022)
    try:
        ck = depthlens.save(
            build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0), tmp_path / "ck"
        )
        r = CliRunner().invoke(app, ["angular", str(ck), "--out", str(tmp_path / "a.nc"), *FAST])
        assert r.exit_code == 0, r.stderr
    finally:
        os.umask(old)
    assert ck.stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in ck.iterdir()} == {0o644}
    assert (tmp_path / "a.nc").stat().st_mode & 0o777 == 0o644


def test_save_overwrite_replaces_only_a_checkpoint(tmp_path):
    from depthlens.errors import CheckpointError

    m = build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(CheckpointError, match="not recognisably depthlens output"):
        depthlens.save(m, tmp_path / "photos", overwrite=True)
    assert (tmp_path / "photos" / "cat.jpg").read_bytes() == b"meow"
    depthlens.save(m, tmp_path / "ck")
    depthlens.save(m, tmp_path / "ck", overwrite=True)  # a checkpoint: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "photos"]


def test_crashed_swap_is_recovered_on_the_next_write(tmp_path):
    """A kill between the two renames of an --overwrite swap left only .ck.old and .ck.new: the next save
    (or load through recover) puts the newest complete copy back at the final path."""
    from depthlens.io.atomic import recover

    m = build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0)
    depthlens.save(m, tmp_path / "ck")
    os.replace(tmp_path / "ck", tmp_path / ".ck.old")
    note = recover(tmp_path / "ck")
    assert "restored" in note and (tmp_path / "ck" / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


# --- signals during writes ----------------------------------------------------------------------------


class Stop(Exception):
    pass


def _writers(tmp: Path):
    """(name, target, write(): one depthlens writer writing `target`) for the signal tests."""
    import xarray as xr

    from depthlens.io.dataset import write_netcdf
    from depthlens.training.state import write_state

    m = build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0)
    ds = xr.Dataset({"x": ("i", [1.0, 2.0])}, attrs={"source": "depthlens test"})
    return [
        ("checkpoint", tmp / "ck", lambda: depthlens.save(m, tmp / "ck", overwrite=True)),
        ("netcdf", tmp / "x.nc", lambda: write_netcdf(ds, tmp / "x.nc", overwrite=True)),
        ("resume state", tmp / "resume", lambda: write_state(tmp / "resume", {"rng/cpu": torch.zeros(2)}, {"step": 1})),
        ("dataset", tmp / "shards", lambda: _dataset(tmp)),
    ]


def _dataset(tmp: Path):
    from depthlens.data.corpus import prepare_files
    from depthlens.data.tokenizers import ByteTokenizer

    (tmp / "in.txt").write_text("hello world\n" * 50 + "\n" + "second document\n" * 50) if not (
        tmp / "in.txt"
    ).exists() else None
    return prepare_files([tmp / "in.txt"], tmp / "shards", ByteTokenizer(), 0.0)


@pytest.mark.parametrize("which", ["checkpoint", "netcdf", "resume state", "dataset"])
def test_sigterm_during_a_write_removes_the_temp(tmp_path, which, monkeypatch):
    """A SIGTERM arriving inside the write: the atomic helper's handler removes the temp, then hands the
    signal on (here to a Python handler that raises, standing in for the default 'terminate')."""
    import depthlens.io.atomic as atomic

    name, target, write = next(w for w in _writers(tmp_path) if w[0] == which)
    write()  # a previous complete copy
    before = sorted(p.name for p in tmp_path.iterdir())
    real_guard = atomic._guard

    def guard_then_signal(tmp):
        cm = real_guard(tmp)

        class Wrapped:
            def __enter__(self):
                cm.__enter__()
                try:
                    tmp.write_bytes(b"partial") if which == "netcdf" else tmp.mkdir()
                    os.kill(os.getpid(), signal.SIGTERM)  # delivered here, inside the write
                except BaseException:
                    cm.__exit__(*sys.exc_info())
                    raise

            def __exit__(self, *exc):
                return cm.__exit__(*exc)

        return Wrapped()

    def stop(signum, frame):
        raise Stop

    old = signal.signal(signal.SIGTERM, stop)
    try:
        monkeypatch.setattr(atomic, "_guard", guard_then_signal)
        with pytest.raises(Stop):
            write()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temp; the old copy intact
    assert signal.getsignal(signal.SIGTERM) is old


KILL_CODE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import depthlens.io.atomic as atomic
import test_bad_inputs as t
tmp = Path({tmp!r})
name, target, write = next(w for w in t._writers(tmp) if w[0] == {which!r})
real = atomic.swap_in if {which!r} in ("checkpoint", "dataset") else atomic.os.replace
def killed(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if {which!r} in ("checkpoint", "dataset"):
    atomic.swap_in = killed
else:
    atomic.os.replace = killed
write()
"""


@pytest.mark.slow
@pytest.mark.parametrize("which", ["checkpoint", "netcdf"])
def test_sigkill_leftovers_are_cleaned_by_the_next_write(tmp_path, which):
    """SIGKILL cannot be caught: the temp stays. The next write of the same target removes it (its process
    is dead) and succeeds; nothing else is touched."""
    (tmp_path / "mine.txt").write_text("mine")
    code = KILL_CODE.format(tests=str(REPO / "tests"), tmp=str(tmp_path), which=which)
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert any(".tmp-" in p.name for p in tmp_path.iterdir()), "the kill left no temp: the test did not bite"
    name, target, write = next(w for w in _writers(tmp_path) if w[0] == which)
    write()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["mine.txt", target.name])


# --- issue 23: inputs checked before the work they would waste -----------------------------------------------


def test_gguf_seq_len_is_refused_before_the_load(tmp_path, monkeypatch):
    """--seq-len beyond the context a GGUF header declares: refused from the header, the weights never read."""
    import transformers

    from gguf_tiny import tiny_llama, write_tiny_gguf

    path = write_tiny_gguf(tiny_llama(n_layer=1), tmp_path / "t.gguf", tokenizer=False)  # context 128

    def loaded(*a, **k):
        raise AssertionError("the model was loaded before --seq-len was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    r = CliRunner().invoke(app, ["causal", str(path), "--seq-len", "100000", "--n-seq", "2"])
    assert r.exit_code == 1 and "--seq-len 100000 exceeds the 128 tokens" in r.stderr, r.stderr
    assert "Traceback" not in r.output and not list(tmp_path.glob("*.nc"))


def test_eval_loss_beyond_exp_range_is_reported(env, tmp_path):
    """A loss above ~709.78 nats has a perplexity beyond float range: said, not an OverflowError."""
    m = build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0)
    with torch.no_grad():
        m.lm_head.weight.mul_(1e5)  # confidently wrong logits: a loss of thousands of nats, still finite in fp32
    ck = depthlens.save(m, tmp_path / "loud")
    r = CliRunner().invoke(app, ["eval", str(ck), "--data", str(env["txt"])])
    assert r.exit_code == 0, r.stderr
    loss = float(r.stdout.split("val loss ")[1].split()[0])
    assert loss > 709.79 and "exp(loss) overflows" in r.stdout
    from depthlens.diagnostics.nll import perplexity

    assert perplexity(709.0) == pytest.approx(math.exp(709.0)) and perplexity(710.0) == math.inf


def test_track_recipe_fifo_is_refused_by_name(env):
    from depthlens.errors import DepthlensError
    from depthlens.studies.track import recipes_in

    with pytest.raises(DepthlensError, match="FIFO"):
        recipes_in(env["fifo"])


def test_bad_thread_env_is_dropped_before_openmp_starts(env):
    r = subprocess.run(
        [sys.executable, "-m", "depthlens.cli", "info", str(env["preln"]), "--json"],
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "abc"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["depthlens: note: OMP_NUM_THREADS='abc' is not a positive integer; ignored"]
    assert json.loads(r.stdout)["n_layer"] == 4
