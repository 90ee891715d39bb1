"""Owned outputs and locks: every directory depthlens writes carries a `.depthlens-output` marker, a directory
without one is never modified (with or without --overwrite), a rerun never replaces a file the user edited,
one writer at a time per output (the second refuses naming the first), temp names fit the filesystem, a
trailing slash means a directory, two outputs of one command never share a path, and every refusal is one
line before any work, leaving everything as it was.

The cases come from the hostile-input round of issue 23 (outputs half); the input cases live in
test_bad_inputs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from depthlens.errors import DepthlensError
from depthlens.io import atomic
from depthlens.models import ModelConfig, build_model
from helpers import FAST
from test_trainer import corpus, tiny  # noqa: F401  (corpus is a fixture)

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a directory): 'nothing changed' is equality."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def one_line(r, code: int = 1) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == code, (r.exit_code, r.stderr, r.stdout)
    assert len(lines) == 1 and lines[0].startswith("depthlens: error:"), r.stderr
    assert "Traceback" not in r.output and not (r.exception and not isinstance(r.exception, SystemExit)), r.output
    return lines[0]


@pytest.fixture(scope="module")
def ck(tiny_ckpt) -> Path:
    return tiny_ckpt("preln")


@pytest.fixture()
def user_dir(tmp_path) -> Path:
    d = tmp_path / "mine"
    (d / "parts").mkdir(parents=True)
    (d / "README.md").write_text("my own notes\n")
    (d / "log.jsonl").write_text('{"step": 1, "mine": true}\n')
    (d / "parts" / "keep.txt").write_text("keep")
    return d


def recipe(tmp_path: Path, corpus: Path, **over) -> Path:  # noqa: F811
    cfg = {**tiny(corpus, tmp_path / "run", steps=3, final_eval_batches=1).to_dict(), **over}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(cfg))
    return path


# --- the marker ----------------------------------------------------------------------------------------


def test_every_written_directory_is_marked(corpus, tmp_path, ck):  # noqa: F811
    """A trainer's run directory, its export, resume state and snapshots, a checkpoint and a dataset carry the
    marker with their kind; a trainer's export and snapshots name the run that owns them."""
    from depthlens.data.corpus import prepare_files
    from depthlens.data.tokenizers import ByteTokenizer
    from depthlens.training.trainer import train

    out = tmp_path / "run"
    train(tiny(corpus, out, steps=3, snapshots=[0, 3], final_eval_batches=1, stop_after=2))
    train(tiny(corpus, out, steps=3, snapshots=[0, 3], final_eval_batches=1))
    run = {"run": str(out.resolve())}
    kinds = {
        p: atomic.read_marker(p)
        for p in (
            out,
            out / "resume",
            out / "checkpoint",
            out / "snapshots/step_0000000",
            out / "snapshots/step_0000003",
            ck,
        )
    }
    assert {
        str(p.relative_to(tmp_path)) if p.is_relative_to(tmp_path) else "ck": m["kind"] for p, m in kinds.items()
    } == {
        "run": "run",
        "run/resume": "resume state",
        "run/checkpoint": "checkpoint",
        "run/snapshots/step_0000000": "checkpoint",
        "run/snapshots/step_0000003": "checkpoint",
        "ck": "checkpoint",
    }
    assert kinds[out / "checkpoint"]["owner"] == run and kinds[out / "snapshots/step_0000003"]["owner"] == run
    assert kinds[out]["made_by"].startswith("depthlens ")
    (tmp_path / "in.txt").write_text("hello world\n" * 50)
    prepare_files([tmp_path / "in.txt"], tmp_path / "shards", ByteTokenizer(), 0.0)
    assert atomic.read_marker(tmp_path / "shards")["kind"] == "dataset"
    # nothing else: no lock or temp left next to the outputs
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [atomic.MARKER]


def test_a_directory_without_the_marker_is_never_replaced(tmp_path):
    m = build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0)
    looks_ours = tmp_path / "old_ck"
    depthlens.save(m, looks_ours)
    (looks_ours / atomic.MARKER).unlink()  # a checkpoint of a depthlens from before markers
    before = snapshot(tmp_path)
    with pytest.raises(DepthlensError, match=r"no \.depthlens-output marker.*adopt"):
        depthlens.save(m, looks_ours, overwrite=True)
    assert snapshot(tmp_path) == before
    assert "marked as depthlens checkpoint" in atomic.adopt(looks_ours)
    depthlens.save(m, looks_ours, overwrite=True)  # adopted: now replaceable
    with pytest.raises(DepthlensError, match="not recognisably depthlens output"):
        atomic.adopt(tmp_path / "nothing") if (tmp_path / "nothing").mkdir() is None else None


# --- trainer: run directory and export --------------------------------------------------------------------


def test_train_into_a_user_directory_refuses_and_changes_nothing(corpus, tmp_path, user_dir):  # noqa: F811
    """`train out=<a user's directory>` rewrote its log.jsonl; now: one line, before any work."""
    before = snapshot(tmp_path)
    line = one_line(CliRunner().invoke(app, ["train", str(recipe(tmp_path, corpus)), "--out", str(user_dir)]))
    assert str(user_dir) in line and "refusing" in line
    after = snapshot(tmp_path)
    after.pop("r.json"), before.pop("r.json", None)
    assert after == before


@pytest.mark.parametrize("target", ["foreign checkpoint", "user dir"])
def test_train_export_onto_something_else_refuses_before_training(corpus, tmp_path, user_dir, target):  # noqa: F811
    """`train export=<a checkpoint made elsewhere>` replaced it silently, `export=<a user dir>` refused only
    after training (naming the API argument overwrite=True). Both now refuse before the first step."""
    from depthlens.training import trainer as T

    if target == "foreign checkpoint":
        export = tmp_path / "theirs"
        depthlens.save(build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=1), export)
    else:
        export = user_dir
    path = recipe(tmp_path, corpus)
    before = snapshot(tmp_path)
    called = []
    real = T.Trainer.__init__

    def spy(self, *a, **k):
        called.append(1)
        real(self, *a, **k)

    T.Trainer.__init__ = spy
    try:
        line = one_line(CliRunner().invoke(app, ["train", str(path), f"export={export}"]))
    finally:
        T.Trainer.__init__ = real
    assert called == [], "the trainer was built before the export was checked"
    assert str(export) in line and "overwrite" not in line.lower(), line
    assert snapshot(tmp_path) == before and not (tmp_path / "run").exists()


def test_rerun_replaces_its_own_export_only(corpus, tmp_path):  # noqa: F811
    """A finished run rerun (resume=false) replaces the export it made; another run with the same export refuses."""
    from depthlens.training.trainer import train

    export = tmp_path / "exp"
    train(tiny(corpus, tmp_path / "a", steps=2, final_eval_batches=1, export=str(export)))
    train(tiny(corpus, tmp_path / "a", steps=2, final_eval_batches=1, export=str(export), resume=False))
    with pytest.raises(DepthlensError, match=r"made by the run in .*a, not by this run"):
        train(tiny(corpus, tmp_path / "b", steps=2, final_eval_batches=1, export=str(export)))
    assert not (tmp_path / "b").exists()


def test_a_cloned_checkpoint_of_the_same_recipe_run_is_retrained(corpus, tmp_path):  # noqa: F811
    """A clone carries no markers (git-ignores them): the shipped checkpoint a recipe run names is replaced by
    that run (its train.json names the run and the export path), any other marker-less checkpoint is not."""
    from depthlens.io.atomic import MARKER
    from depthlens.training.trainer import train

    export = tmp_path / "ckpt"
    train(tiny(corpus, tmp_path / "a", steps=2, final_eval_batches=1, export=str(export), name="toy"))
    (export / MARKER).unlink()  # as a fresh clone has it
    out = train(tiny(corpus, tmp_path / "b", steps=2, final_eval_batches=1, export=str(export), name="toy"))
    assert out["final_val_loss"] > 0 and (export / MARKER).is_file()
    (export / MARKER).unlink()
    with pytest.raises(DepthlensError, match="not recognisably depthlens output"):  # another run's checkpoint
        train(tiny(corpus, tmp_path / "c", steps=2, final_eval_batches=1, export=str(export), name="other"))
    assert not (export / MARKER).exists()


def test_a_second_trainer_on_one_run_directory_refuses_naming_the_first(corpus, tmp_path):  # noqa: F811
    from depthlens.training.trainer import train

    out = tmp_path / "run"
    code = (
        f"import time\nfrom depthlens.io.atomic import output_lock\n"
        f"with output_lock({str(out)!r}, 'run directory'):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            DepthlensError, match=rf"another depthlens is writing this run directory \(pid {holder.pid} "
        ):
            train(tiny(corpus, out, steps=2))
        assert not out.exists()
    finally:
        holder.kill()
        holder.communicate()
    train(tiny(corpus, out, steps=2, final_eval_batches=1))  # the holder died: its lock went with it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_lock_refusal_from_the_cli_is_one_line(ck, tmp_path):
    out = tmp_path / "rep"
    with atomic.output_lock(out, "report"):
        line = one_line(CliRunner().invoke(app, ["report", str(ck), "--out", str(out), *FAST, "--metrics", "angular"]))
    assert f"pid {os.getpid()}" in line and "another depthlens is writing this report" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_lock_files_are_removed_and_a_stale_lock_is_taken(tmp_path):
    out = tmp_path / "x"
    lock, side = atomic._lock_paths(out)
    lock.write_text("")  # left by a SIGKILLed holder: the flock died with it
    side.write_text('{"pid": 1}')
    with atomic.output_lock(out):
        assert json.loads(side.read_text())["pid"] == os.getpid()
        with pytest.raises(DepthlensError, match="another depthlens"), atomic.output_lock(out):
            pass
    assert list(tmp_path.iterdir()) == []


# --- track ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_with_snapshots(corpus, tmp_path_factory) -> Path:  # noqa: F811
    from depthlens.training.trainer import train

    out = tmp_path_factory.mktemp("trk") / "preln_l4"
    train(tiny(corpus, out, steps=4, snapshots=[0, 2, 4], final_eval_batches=1, name="preln_l4"))
    return out


def test_track_into_a_user_directory_refuses(run_with_snapshots, user_dir):
    before = snapshot(user_dir)
    line = one_line(
        CliRunner().invoke(
            app, ["track", str(run_with_snapshots), "--metric", "angular", "--out", str(user_dir), *FAST]
        )
    )
    assert "not a track output directory" in line
    assert snapshot(user_dir) == before


def test_track_rerun_keeps_an_edited_readme_and_recomputes_a_damaged_part(run_with_snapshots, tmp_path, result_cache):
    out = tmp_path / "t"
    args = ["track", str(run_with_snapshots), "--metric", "angular", "--out", str(out), *FAST, "--n-boot", "0"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert atomic.read_marker(out)["kind"] == "track"
    # truncated result cache entries: recomputed on the rerun, never an error
    parts = sorted(result_cache.rglob("*.nc"))
    for part in parts:
        part.write_bytes(part.read_bytes()[:100])
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    import xarray as xr

    from depthlens.studies.cache import KEY_ATTR

    assert all(xr.load_dataset(part, engine="netcdf4").attrs[KEY_ATTR] == part.stem for part in parts)
    # an edited README: refused, before any work, and kept
    (out / "README.md").write_text((out / "README.md").read_text() + "\nmy notes\n")
    before = snapshot(out)
    line = one_line(CliRunner().invoke(app, args))
    assert "README.md: was edited since depthlens wrote it" in line
    assert snapshot(out) == before


# --- analysis commands: -o ------------------------------------------------------------------------------


def test_trailing_slash_means_a_directory(ck, tmp_path):
    r = CliRunner().invoke(app, ["angular", str(ck), "-o", f"{tmp_path / 'newdir'}/", *FAST])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "newdir").is_dir() and [p.name for p in (tmp_path / "newdir").iterdir()] == [
        "preln_l4.angular.nc"
    ]
    (tmp_path / "afile").write_text("x")
    line = one_line(CliRunner().invoke(app, ["angular", str(ck), "-o", f"{tmp_path / 'afile'}/", *FAST]))
    assert "is not a directory" in line and (tmp_path / "afile").read_text() == "x"


def test_two_outputs_of_one_command_never_share_a_path(ck, tmp_path):
    x = tmp_path / "x.png"
    line = one_line(CliRunner().invoke(app, ["sweep", str(ck), "-o", str(x), "--plot", str(x), *FAST]))
    assert "--out and --plot name the same file" in line and list(tmp_path.iterdir()) == []


def test_long_names_work_or_refuse_cleanly(ck, tmp_path, monkeypatch):
    """A 243-byte -o name (the hidden temp name passed 255 bytes) and a checkpoint directory of 250 bytes (the
    default output name <ckpt>.<metric>.nc passed 255) both work; a 256-byte name is refused in one line."""
    name = "o" * 239 + ".nc"
    r = CliRunner().invoke(app, ["angular", str(ck), "-o", str(tmp_path / name), *FAST])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    long_ck = tmp_path / ("c" * 250)
    m = build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0)
    depthlens.save(m, long_ck)
    depthlens.save(m, long_ck, overwrite=True)  # the swap's hidden .NAME.new / .NAME.old names fit too
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["angular", str(long_ck), *FAST])
    assert r.exit_code == 0, r.output
    made = [p.name for p in (tmp_path / "depthlens-out").iterdir() if p.name.endswith(".angular.nc")]  # default dir
    assert len(made) == 1 and made[0].startswith("c" * 200) and len(made[0].encode()) <= 255
    line = one_line(CliRunner().invoke(app, ["angular", str(ck), "-o", str(tmp_path / ("z" * 256)), *FAST]))
    assert "256 bytes" in line


def test_out_into_a_read_only_directory_is_refused_before_the_computation(ck, tmp_path, monkeypatch):
    from depthlens.diagnostics import registry

    if os.geteuid() == 0:
        ro = Path("/sys")  # root ignores permission bits; sysfs refuses new files even to root
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
    ran = []
    monkeypatch.setattr(registry, "run", lambda *a, **k: ran.append(1))
    line = one_line(CliRunner().invoke(app, ["angular", str(ck), "-o", str(ro / "a.nc"), *FAST]))
    assert "not writable" in line and ran == []


def test_closed_stdout_is_an_error_not_a_lost_result(ck):
    r = subprocess.run(
        f"{sys.executable} -m depthlens.cli angular {ck} --json -o /dev/null --overwrite {' '.join(FAST)} >&-",
        shell=True,
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
        check=False,
    )
    assert r.returncode == 1 and r.stderr.count("depthlens: error:") == 1 and "stdout is closed" in r.stderr, r.stderr


# --- atomic helpers --------------------------------------------------------------------------------------


def test_temp_and_hidden_names_fit_the_name_limit(tmp_path):
    limit = atomic.name_max(tmp_path)
    for n in (1, 200, 243, 250, limit):
        p = tmp_path / ("n" * n)
        names = [
            atomic.temp_name(p).name,
            atomic._hidden(p, "new").name,
            atomic._hidden(p, "old").name,
            *(q.name for q in atomic._lock_paths(p)),
        ]
        assert all(len(x.encode()) <= limit for x in names), (n, [len(x) for x in names])
    a, b = tmp_path / ("n" * 250 + "a"), tmp_path / ("n" * 250 + "b")  # a shared prefix: still distinct
    assert atomic._hidden(a, "new") != atomic._hidden(b, "new")
    assert atomic._temp_prefix(a) != atomic._temp_prefix(b)


def test_distinct_outputs_compares_resolved_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    atomic.distinct_outputs({"--out": "a.nc", "--plot": "a.png", "--other": None})
    with pytest.raises(DepthlensError, match="--out and --plot"):
        atomic.distinct_outputs({"--out": "a.nc", "--plot": str(tmp_path / "sub" / ".." / "a.nc")})


def test_a_forked_child_ended_by_sigterm_leaves_its_parents_temp(tmp_path):
    """The report's figure workers are forked while the report's temp directory is live: a worker that is ended by
    SIGTERM (a pool's terminate) must not remove it (io.temps forgets its parent's temps after a fork)."""
    import multiprocessing as mp
    import os
    import signal
    import time

    from depthlens.io.atomic import atomic_dir

    with atomic_dir(tmp_path / "rep", kind="report") as tmp:
        child = mp.get_context("fork").Process(target=time.sleep, args=(30,))
        child.start()
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGTERM)
        child.join(10)
        assert child.exitcode == -signal.SIGTERM and tmp.is_dir()
        (tmp / "x").write_text("written after the child ended")
    assert (tmp_path / "rep" / "x").is_file()


def _fake_draw_in_workers(monkeypatch, kill_entry: int | None):
    """`write._draw_one` replaced by a stand-in that names its process; entry `kill_entry` SIGTERMs its worker."""
    import os
    import signal

    from depthlens.studies import write

    parent = os.getpid()

    def draw(e, fig_dir):
        if e == kill_entry and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"entry": str(e)}, [f"drawn in {'a worker' if os.getpid() != parent else 'the parent'}"]

    monkeypatch.setattr(write, "_draw_one", draw)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # two cores on any runner
    return write


def test_figure_workers_draw_in_order_and_exit(tmp_path, monkeypatch):
    """The forked workers return each entry's figures in entry order, and are gone when the block ends (they exit
    on a sentinel: nothing waits on a signal, which is how a pool's terminate once hung the suite)."""
    import multiprocessing as mp

    write = _fake_draw_in_workers(monkeypatch, kill_entry=None)
    with write._figure_workers(list(range(5)), tmp_path) as pending:
        got = list(pending)
    assert [f["entry"] for f, _ in got] == ["0", "1", "2", "3", "4"]
    assert {n for _, notes in got for n in notes} == {"drawn in a worker"}
    assert mp.active_children() == []


def test_a_figure_worker_ended_by_sigterm_is_an_error_not_a_hang(tmp_path, monkeypatch):
    """A worker SIGTERMed while the report's temp directory is live dies of it (its initializer restores the default
    disposition instead of the parent's cleanup handler); the parent gets one DepthlensError and leaves nothing."""
    from depthlens.io.atomic import atomic_dir

    write = _fake_draw_in_workers(monkeypatch, kill_entry=2)
    with (
        pytest.raises(DepthlensError, match="a figure worker died"),
        atomic_dir(tmp_path / "rep", kind="report") as tmp,
        write._figure_workers(list(range(5)), tmp) as pending,
    ):
        list(pending)
    assert not (tmp_path / "rep").exists() and list(tmp_path.iterdir()) == []
