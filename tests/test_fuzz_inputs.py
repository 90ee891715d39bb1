"""Property-based tests of the input boundary: every parser and option grammar, thousands of generated inputs.

Each property allows exactly two outcomes: a valid result, or a depthlens error (DepthlensError and its
subclasses: SchemaError, CheckpointError, DataError, UsageError; for the CLI's grid parser, a usage exit 2).
Any other exception (TypeError, AttributeError, KeyError, OverflowError, RecursionError, ...) fails the test.
Where a valid result comes back, it is checked too (it round-trips, or it has the shape the parser promises).

Examples per parser (N_*) are sized so the whole file runs in well under a minute on one core.
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthlens.errors import DepthlensError

torch.set_num_threads(1)

N_FAST = 2000  # the option grammars (key=value overrides, threshold grids)
N_CONFIG = 1000  # configs, recipes, records, device maps (each example builds and validates whole objects)
N_FILE = 600  # parsers that read a file per example (manifests, tokenizer configs, safetensors headers)
N_GGUF = 300  # GGUF headers (the gguf package parses each one)


QUICK_SHARE = 4  # the quick loop (`-m "not slow"`, tests/conftest.py) runs a quarter of each fuzzer's examples


def fuzz(n: int) -> settings:
    """n examples (n / QUICK_SHARE, at least 50, in the quick loop; the whole suite runs all n), no deadline (a
    loaded CI core), reproducible (derandomized: the same inputs every run)."""
    quick = os.environ.get("DEPTHLENS_TEST_LOOP") == "quick"
    return settings(
        max_examples=max(50, n // QUICK_SHARE) if quick else n,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )


# --- generic JSON ---------------------------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-3, 300)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(-2, 2)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "preln",
            "hc",
            "wsd",
            "cosine",
            "fp32",
            "bf16",
            "cpu",
            "cuda",
            "auto",
            "sum",
            "mask",
            "identity",
            "zero",
            "1e-8",
            "abc",
            "",
            "bytes",
            "bpe",
            "gpt2",
            "../x",
            "a/b",
        ]
    )
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def _fields(cls) -> list[str]:
    import dataclasses

    return [f.name for f in dataclasses.fields(cls)]


def field_dicts(cls, extra_keys: int = 1, values=JSON):
    """Dicts keyed mostly by `cls`'s field names (sometimes a typo), with arbitrary JSON values."""
    keys = st.sampled_from(_fields(cls)) | st.text(min_size=1, max_size=6)
    return st.dictionaries(keys, values, max_size=6 + extra_keys)


def depthlens_error_or(fn, *args, **kwargs):
    """fn(*args) or None when it raised a depthlens error; any other exception propagates (fails the test)."""
    try:
        return fn(*args, **kwargs)
    except DepthlensError:
        return None


# --- model configs ----------------------------------------------------------------------------------------------


def _model_dicts():
    from depthlens.models.config import ModelConfig

    near = (
        st.integers(-2, 70)
        | st.sampled_from(["preln", "hc", "mhc", "block_attnres", "moda", "keel"])
        | st.lists(st.integers(-1, 9), max_size=5)
        | JSON
    )
    return field_dicts(ModelConfig, values=near)


@pytest.mark.slow
@fuzz(N_CONFIG)
@given(_model_dicts())
def test_model_config_parser(d):
    from depthlens.models.config import ModelConfig

    cfg = depthlens_error_or(ModelConfig.from_dict, d, "config.json")
    if cfg is not None:  # a valid config round-trips and obeys the cross-field rules
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
        assert cfg.d_model % cfg.n_head == 0 and cfg.n_head % cfg.kv_heads == 0
        assert all(
            isinstance(getattr(cfg, k), int) and not isinstance(getattr(cfg, k), bool)
            for k in ("d_model", "n_layer", "n_head", "vocab_size")
        )


# --- recipes (single and grid), overrides -------------------------------------------------------------------

VALID_MODEL = {"arch": "preln", "d_model": 32, "n_layer": 2, "n_head": 2, "vocab_size": 257, "max_seq_len": 32}


def _run_dicts():
    from depthlens.training.config import RunConfig

    near = (
        st.integers(-2, 40)
        | st.floats(-1, 2)
        | st.lists(st.floats(-0.5, 1.5), max_size=3)
        | st.just(VALID_MODEL)
        | _model_dicts()
        | JSON
    )
    return field_dicts(RunConfig, values=near)


@pytest.mark.slow
@fuzz(N_CONFIG)
@given(
    st.one_of(
        _run_dicts(),
        st.fixed_dictionaries(
            {"base": _run_dicts() | JSON, "runs": JSON | st.dictionaries(st.text(max_size=5), _run_dicts(), max_size=3)}
        ),
        st.dictionaries(st.sampled_from(["description", "corpus", "base", "runs", "name"]), JSON),
    )
)
def test_recipe_parser(recipe):
    from depthlens.training.config import RunConfig, recipe_runs

    runs = depthlens_error_or(recipe_runs, recipe, "r.json")
    if runs is None:
        return
    assert all(isinstance(k, str) and isinstance(v, dict) for k, v in runs.items())
    for name, fields in runs.items():
        cfg = depthlens_error_or(RunConfig.from_dict, fields, f"r.json (run {name})")
        if cfg is not None:
            assert RunConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
            assert 0 <= cfg.min_lr_factor <= 1 and cfg.lr > 0 and len(cfg.betas) == 2 and cfg.warmup <= cfg.steps


OVERRIDE_KEYS = st.sampled_from(
    [
        "lr",
        "steps",
        "betas",
        "model.n_layer",
        "model.arch",
        "model",
        "model.x.y",
        "eps",
        "out",
        "",
        ".",
        "lr.x",
        "seed",
        "threads",
        "snapshots",
        "meta.note",
        "a..b",
    ]
)
OVERRIDE_VALUES = st.sampled_from(
    [
        "1e-3",
        "abc",
        "[0.9,0.95]",
        "0.9",
        "true",
        "null",
        "-1",
        "1e400",
        "NaN",
        "100000",
        "[" * 5000,
        "{}",
        '"x"',
        "",
        "=",
        "3",
    ]
) | st.text(max_size=10)
OVERRIDES = st.lists(
    st.one_of(st.builds(lambda k, v: f"{k}={v}", OVERRIDE_KEYS, OVERRIDE_VALUES), st.text(max_size=12)), max_size=4
)


@pytest.mark.slow
@fuzz(N_FAST)
@given(OVERRIDES)
def test_override_grammar(items):
    from depthlens.errors import SchemaError
    from depthlens.training.config import RunConfig, deep_merge, parse_overrides

    try:
        over = parse_overrides(items)
    except SchemaError as e:
        assert e.usage  # a malformed override is a usage error (exit 2)
        return
    base = {"model": dict(VALID_MODEL), "seq_len": 16, "global_batch": 4, "steps": 5, "warmup": 1, "out": "runs/x"}
    try:
        cfg = RunConfig.from_dict(deep_merge(base, over), "r.json", usage_fields=over)
    except SchemaError as e:
        top = (e.field or "").split(".")[0].split("[")[0]
        assert e.usage == (top in over), (e, over)  # exit 2 exactly when the bad field came from an override
        return
    assert isinstance(cfg, RunConfig)


# --- threshold grids (sweep --thresholds) -------------------------------------------------------------------

GRID_ATOMS = st.sampled_from(
    [
        "0",
        "1",
        "-1",
        "0.05",
        "1e-320",
        "1e308",
        "1e-10",
        "inf",
        "nan",
        "1e12",
        "",
        "x",
        "5e-324",
        "-0",
        "1.5",
        "1e-300",
        "0.0000001",
        "1e400",
    ]
)
GRIDS = (
    st.builds(lambda a, b, c: f"{a}:{b}:{c}", GRID_ATOMS, GRID_ATOMS, GRID_ATOMS)
    | st.lists(GRID_ATOMS, max_size=5).map(",".join)
    | st.text(alphabet="0123456789.:,e-+ inf", max_size=16)
)


@pytest.mark.slow
@fuzz(N_FAST)
@given(GRIDS)
def test_threshold_grid_grammar(text):
    import typer

    from depthlens.cli.analyze import GRID_MAX, parse_grid

    try:
        vals = parse_grid(text)
    except typer.Exit as e:
        assert e.exit_code == 2
        return
    except DepthlensError:
        return
    assert 0 < len(vals) <= GRID_MAX and all(math.isfinite(v) for v in vals)


# --- records, device maps ---------------------------------------------------------------------------------


@pytest.mark.slow
@fuzz(N_CONFIG)
@given(
    st.dictionaries(
        st.sampled_from(["name", "steps", "tokens", "final_val_loss", "recipe", "step", "val_loss", "run", "x"]),
        JSON,
        max_size=6,
    )
)
def test_train_and_snapshot_records(d):
    from depthlens.io.records import check_snapshot_record, check_train_record

    for check in (check_train_record, check_snapshot_record):
        if depthlens_error_or(check, d, "x.json") is not None:
            assert d is not None


DEVICE_ATOMS = st.sampled_from(["cpu", "cuda", "cuda:0", "cuda:7", "mps", "gpu", "", "cpu:0", "auto", "meta"])


@fuzz(N_CONFIG)
@given(
    st.one_of(
        DEVICE_ATOMS,
        st.text(max_size=12),
        st.dictionaries(
            st.sampled_from(["embed", "layers", "head", "x"]),
            DEVICE_ATOMS | st.lists(DEVICE_ATOMS, max_size=3) | JSON,
            max_size=4,
        ).map(json.dumps),
        st.just("[" * 100000),
        st.just("{" * 100000),
    )
)
def test_device_map_grammar(text):
    from depthlens.adapters.placement import parse_device_map

    out = depthlens_error_or(parse_device_map, text)
    if isinstance(out, dict):
        assert set(out) == {"embed", "layers", "head"} and out["embed"] in ("cpu", "meta")


# --- files: JSON bytes, manifests, tokenizer configs ---------------------------------------------------------

JSON_BYTES = st.one_of(
    JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.sampled_from([b"[" * 100000, b'{"a":' * 50000, b"\xff\xfe", b"NaN", b""]),
)


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@fuzz(N_FILE)
@given(JSON_BYTES)
def test_json_file_reader(scratch, data):
    from depthlens.io.files import read_json
    from depthlens.training.config import load_recipe

    f = scratch / "in.json"
    f.write_bytes(data)
    obj = depthlens_error_or(read_json, f, "a config")
    if obj is not None:
        assert isinstance(obj, dict)
    depthlens_error_or(load_recipe, f)


SHARD_ENTRY = st.dictionaries(
    st.sampled_from(["file", "n_tokens", "sha256"]),
    st.sampled_from(["val_000.bin", "../x.bin", "/etc/passwd", "", "a\\b"]) | JSON,
    max_size=3,
)
MANIFESTS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {
            "splits": st.dictionaries(
                st.sampled_from(["train", "val", ""]),
                st.dictionaries(
                    st.sampled_from(["shards", "n_tokens"]), st.lists(SHARD_ENTRY, max_size=3) | JSON, max_size=2
                ),
                max_size=2,
            ),
            "tokenizer": JSON | st.dictionaries(st.sampled_from(["name", "vocab_size", "bos_id"]), JSON),
        }
    ),
)


@fuzz(N_FILE)
@given(MANIFESTS)
def test_shard_manifest_parser(scratch, manifest):
    from depthlens.data.shards import TokenDataset, read_manifest

    d = scratch / "shards"
    d.mkdir(exist_ok=True)
    (d / "manifest.json").write_text(json.dumps(manifest))
    m = depthlens_error_or(read_manifest, d)
    if m is not None:
        for split in m.get("splits", {}).values():
            assert all("/" not in s["file"] for s in split["shards"])
        depthlens_error_or(TokenDataset.from_dir, d, "val")


@fuzz(N_FILE)
@given(
    st.one_of(
        JSON,
        st.dictionaries(
            st.sampled_from(["kind", "name", "file"]), st.sampled_from(["bytes", "gpt2", "bpe"]) | JSON, max_size=3
        ),
    )
)
def test_tokenizer_config_parser(scratch, config):
    from depthlens.data.tokenizers import load_tokenizer

    d = scratch / "tok"
    d.mkdir(exist_ok=True)
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    tok = depthlens_error_or(load_tokenizer, d)
    if tok is not None:
        assert tok.vocab_size > 0


# --- safetensors headers ---------------------------------------------------------------------------------

ST_ENTRY = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "F16", "I64", "BF16", "F8_E4M3"]) | JSON,
        "shape": st.lists(st.integers(-1, 5), max_size=3) | JSON,
        "data_offsets": st.lists(st.integers(-4, 64), min_size=0, max_size=3) | JSON,
    }
)
ST_HEADERS = st.one_of(
    st.dictionaries(st.text(max_size=6), ST_ENTRY | JSON, max_size=3).map(lambda h: json.dumps(h).encode()),
    st.binary(max_size=40),
)


@fuzz(N_FILE)
@given(ST_HEADERS, st.integers(-8, 64) | st.integers(0, 2**64 - 1), st.binary(max_size=64))
def test_safetensors_header_parser(scratch, header, claimed_delta, payload):
    from depthlens.io.weights import check_float_dtypes, safetensors_header

    f = scratch / "w.safetensors"
    n = max(0, min(2**64 - 1, len(header) + claimed_delta)) if claimed_delta < 2**10 else claimed_delta
    f.write_bytes(struct.pack("<Q", n) + header + payload)
    out = depthlens_error_or(safetensors_header, f)
    if out is not None:
        assert all(isinstance(k, str) and isinstance(s, tuple) for k, (_, s) in out.items())
        depthlens_error_or(check_float_dtypes, out, f)


# --- GGUF headers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gguf_bytes(tmp_path_factory) -> bytes:
    from gguf_tiny import tiny_llama, write_tiny_gguf

    path = write_tiny_gguf(tiny_llama(n_layer=1), tmp_path_factory.mktemp("gguf") / "t.gguf", tokenizer=False)
    return path.read_bytes()


@fuzz(N_GGUF)
@given(st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=6), st.integers(0, 1 << 20) | st.none())
def test_gguf_header_parser(tiny_gguf_bytes, scratch, flips, cut):
    from depthlens.adapters.load import declared_context, gguf_header

    data = bytearray(tiny_gguf_bytes if cut is None else tiny_gguf_bytes[:cut])
    for pos, byte in flips:  # corrupt the header and metadata region
        if pos < len(data):
            data[pos] = byte
    f = scratch / "fuzz.gguf"
    f.write_bytes(bytes(data))
    head = depthlens_error_or(gguf_header, f)
    if head is not None:
        assert isinstance(head["n_layer"], int) and head["n_layer"] > 0
        ctx = depthlens_error_or(declared_context, f)
        assert ctx is None or (isinstance(ctx, int) and ctx > 0)


@pytest.mark.parametrize("key,value", [("block_count", 0), ("context_length", 0), ("embedding_length", 0)])
def test_gguf_header_values_are_checked(tmp_path, key, value):
    """A header field out of range is refused in one line naming the field (before any load)."""
    import gguf

    from depthlens.adapters.load import gguf_header
    from depthlens.errors import CheckpointError

    w = gguf.GGUFWriter(str(tmp_path / "h.gguf"), "llama")
    getattr(w, f"add_{key}")(value)
    w.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=f"llama.{key}"):
        gguf_header(tmp_path / "h.gguf")
