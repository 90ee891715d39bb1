"""The trainer: schedules, recipes, data order, loss goes down, DDP == 1 process, bit-exact kill-and-resume."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from depthlens.data.shards import TokenDataset, batch_indices, write_shard
from depthlens.data.tokenizers import ByteTokenizer, load_tokenizer
from depthlens.designs import SLUGS
from depthlens.io.checkpoint import load
from depthlens.training import recipes
from depthlens.training.config import RunConfig, load_recipe, parse_overrides, read_recipe, recipe_runs
from depthlens.training.schedule import lr_factor
from depthlens.training.trainer import evaluate, micro_batch_ids, train

REPO = Path(__file__).resolve().parents[1]
TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles.\n"
    "def add(a, b):\n    return a + b\n\n"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A tiny bytes corpus: BOS + repeated text, ~40K train and ~4K val tokens."""
    d = tmp_path_factory.mktemp("corpus")
    tok = ByteTokenizer()
    doc = [tok.bos_id] + tok.encode(TEXT * 4)
    write_shard(d / "train_000.bin", np.array(doc * 60))
    write_shard(d / "val_000.bin", np.array(doc * 6))
    return d


def tiny(corpus: Path, out: Path, **kw) -> RunConfig:
    base = dict(
        model=dict(arch="preln", d_model=32, n_layer=2, n_head=2, vocab_size=257, max_seq_len=32),
        data=str(corpus),
        seq_len=32,
        global_batch=8,
        steps=10,
        lr=3e-3,
        warmup=2,
        out=str(out),
        eval_every=0,
        final_eval_batches=2,
        log_every=1,
    )
    base.update(kw)
    return RunConfig.from_dict(base)


def log_losses(out: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]


# --- schedules ------------------------------------------------------------------------------------


def test_wsd_values_by_hand():
    f = lambda s: lr_factor(s, 100, warmup=10, schedule="wsd", decay_frac=0.2, min_lr_factor=0.1)  # noqa: E731
    assert f(0) == pytest.approx(0.1) and f(4) == pytest.approx(0.5) and f(9) == pytest.approx(1.0)
    assert f(10) == 1.0 and f(79) == 1.0  # stable until the last 20 steps (80..99)
    assert f(80) == pytest.approx(1 - 0.9 * 1 / 20)  # 0.955
    assert f(89) == pytest.approx(1 - 0.9 * 10 / 20)  # 0.55
    assert f(99) == pytest.approx(0.1)  # min reached on the last step


def test_cosine_values_by_hand():
    f = lambda s: lr_factor(s, 110, warmup=10, schedule="cosine", min_lr_factor=0.1)  # noqa: E731
    assert f(9) == pytest.approx(1.0)
    assert f(59) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.55
    assert f(34) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))  # a quarter: ~0.868
    assert f(109) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        lr_factor(110, 110)


# --- config and recipes ---------------------------------------------------------------------------


def test_overrides_and_validation(tmp_path):
    assert parse_overrides(["lr=1e-3", "model.n_layer=8", "betas=[0.9,0.99]", "out=runs/x", "fsdp=true"]) == {
        "lr": 1e-3,
        "model": {"n_layer": 8},
        "betas": [0.9, 0.99],
        "out": "runs/x",
        "fsdp": True,
    }
    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(
            {
                "base": {"model": {"arch": "preln", "d_model": 32, "n_head": 2}, "steps": 5, "warmup": 1},
                "runs": {"a": {"model": {"n_layer": 2}}, "b": {"lr": 1e-3}},
            }
        )
    )
    cfg = load_recipe(path, ["model.d_model=64", "lr=2e-3"], run="a")
    assert (cfg.model, cfg.lr, cfg.name, cfg.steps) == (
        {"arch": "preln", "d_model": 64, "n_head": 2, "n_layer": 2},
        2e-3,
        "a",
        5,
    )
    with pytest.raises(ValueError, match="pick one with run=NAME"):
        load_recipe(path)
    with pytest.raises(ValueError, match="micro_batch"):
        RunConfig(global_batch=8, micro_batch=3)
    with pytest.raises(ValueError, match="schedule"):
        RunConfig(schedule="linear")
    with pytest.raises(ValueError, match="unknown field"):
        RunConfig.from_dict({"lrr": 1})
    with pytest.raises(ValueError, match="n_head"):
        RunConfig(model={"d_model": 30, "n_head": 4})


def test_committed_recipes_are_valid_and_in_sync():
    zoo = read_recipe(REPO / "depthlens/recipes/zoo_cpu.json")
    assert zoo == json.loads(json.dumps(recipes.zoo_recipe())), "rerun `python -m depthlens.training.recipes`"
    runs = recipe_runs(zoo)
    assert {(r["model"]["arch"], r["model"]["n_layer"]) for r in runs.values()} == {
        (s, L) for s in SLUGS for L in (4, 8, 16, 32)
    }
    sweep = read_recipe(REPO / "depthlens/recipes/zoo_cpu_lr.json")
    assert sweep == json.loads(json.dumps(recipes.zoo_lr_recipe())), "rerun `python -m depthlens.training.recipes`"
    for name, r in runs.items():
        cfg = RunConfig.from_dict(r)
        assert cfg.export == f"checkpoints/{name}" and cfg.model_config().head_dim == 8
        assert cfg.model["d_model"] % 8 == 0 and abs(cfg.meta["planned_rel_error"]) < 0.05  # iso-parameter
        cell = (cfg.model["arch"], cfg.model["n_layer"])  # the 400-step check's winner once adopted, else the sweep's
        assert cfg.lr == (recipes.lr400_adopted().get(cell) or recipes.zoo_lr(*cell))[0]
        assert not cfg.decay_mixing  # one recipe for every design: no decay on residual-mixing parameters
        tracked = cfg.model["arch"] in recipes.ZOO_SNAPSHOT_DESIGNS and cfg.model["n_layer"] in (16, 32)
        assert cfg.snapshot_every_log2 == (tracked and cfg.seed == 0)
        assert cfg.data_seed == cfg.seed and name.endswith(f"_s{cfg.seed}") == (cfg.seed > 0)
    seeded = {(r["model"]["arch"], r["model"]["n_layer"], r.get("seed", 0)) for r in runs.values()}
    assert {(d, L, s) for d in recipes.ZOO_SEED_DESIGNS for L in (16, 32) for s in (0, 1, 2)} <= seeded
    paper = read_recipe(REPO / "depthlens/recipes/paper_gpu.json")
    cfgs = [RunConfig.from_dict(r) for r in recipe_runs(paper).values()]
    assert len(cfgs) == 10 * 7 * 4 and {c.model["n_layer"] for c in cfgs} == {16, 20, 24, 32, 40, 56, 70}
    pre16 = next(c for c in cfgs if c.model["arch"] == "preln" and c.model["n_layer"] == 16)
    pre70 = next(c for c in cfgs if c.model["arch"] == "preln" and c.model["n_layer"] == 70)
    assert (pre16.model["d_model"], pre70.model["d_model"]) == (1216, 640)  # the paper's endpoints


# --- data order -----------------------------------------------------------------------------------


def test_data_order_independent_of_accumulation_and_world(corpus):
    ds = TokenDataset.from_dir(corpus)
    n = ds.n_sequences(32)

    def ids(world: int, rank: int, micro: int) -> np.ndarray:
        parts = micro_batch_ids(3, 8, 7, n, rank=rank, world=world, micro=micro)
        assert all(len(p) == micro for p in parts)
        return np.concatenate(parts)

    whole = ids(1, 0, 8)
    assert np.array_equal(whole, batch_indices(3, 8, 7, n)) and len(set(whole)) == 8
    assert np.array_equal(whole, ids(1, 0, 2))  # 4 micro-steps of 2: the same 8 sequences, same order
    assert np.array_equal(whole, np.concatenate([ids(2, 0, 2), ids(2, 1, 4)]))  # rank r: a contiguous slice
    assert np.array_equal(whole, np.concatenate([ids(4, r, 1) for r in range(4)]))
    # and the tokens the micro-batches hold are those of the whole batch
    split = np.concatenate([ds.batch(i, 32) for i in micro_batch_ids(3, 8, 7, n, micro=2)])
    assert np.array_equal(split, ds.batch(whole, 32))
    assert not np.array_equal(whole, batch_indices(4, 8, 7, n))  # another step, other sequences


# --- training -------------------------------------------------------------------------------------


def test_loss_falls_and_checkpoint_exports(corpus, tmp_path):
    out = tmp_path / "run"
    rec = train(tiny(corpus, out, steps=60, lr=1e-2, warmup=5, eval_every=30, eval_batches=1, name="t"))
    losses = log_losses(out)
    assert losses[0] > 5.0 and losses[-1] < losses[0] - 2.0
    assert rec["final_val_loss"] < 3.5 and rec["steps"] == 60 and rec["tokens"] == 60 * 8 * 32
    ck = load(out / "checkpoint")
    assert ck.train["final_val_loss"] == rec["final_val_loss"] and ck.train["params"]["total"] == sum(
        p.numel() for p in ck.model.parameters()
    )
    assert isinstance(load_tokenizer(out / "checkpoint"), ByteTokenizer)
    # the exported weights reproduce the recorded validation loss
    assert evaluate(ck.model, corpus, 32, batch_size=8, max_sequences=16) == pytest.approx(
        rec["final_val_loss"], abs=1e-5
    )


def test_snapshot_steps():
    base = dict(model=dict(arch="preln"), steps=100)
    assert RunConfig.from_dict({**base, "snapshot_every_log2": True}).snapshot_steps == [0, 16, 32, 64, 100]
    assert RunConfig.from_dict({**base, "snapshots": [50, 3]}).snapshot_steps == [3, 50]
    assert RunConfig.from_dict({**base, "steps": 16, "snapshot_every_log2": True}).snapshot_steps == [0, 16]
    with pytest.raises(ValueError, match="snapshots"):
        RunConfig.from_dict({**base, "snapshots": [101]})


def test_snapshots_at_the_requested_steps_survive_a_kill_and_do_not_perturb_training(corpus, tmp_path):
    """Snapshots only at the requested steps (0 = init), each a loadable checkpoint whose recorded val_loss
    is its own; a kill + resume writes the same set; the final weights equal a run without snapshots."""
    straight = tmp_path / "plain"
    train(tiny(corpus, straight, steps=10))
    snap = tmp_path / "snap"
    kw = dict(steps=10, snapshots=[0, 3, 7], snapshot_eval_batches=1, save_every=2)
    assert train(tiny(corpus, snap, stop_after=5, **kw)) == {"step": 5, "stopped": True}
    train(tiny(corpus, snap, **kw))
    dirs = sorted(p.name for p in (snap / "snapshots").iterdir())
    assert dirs == ["step_0000000", "step_0000003", "step_0000007"]
    for name in dirs:
        info = json.loads((snap / "snapshots" / name / "snapshot.json").read_text())
        step = int(name.split("_")[1])
        assert info["step"] == step and info["tokens"] == step * 8 * 32
        ck = load(snap / "snapshots" / name)
        assert evaluate(ck.model, corpus, 32, batch_size=8, max_sequences=8) == pytest.approx(
            info["val_loss"], abs=1e-5
        )
    init = _weights(snap / "snapshots/step_0000000")
    fresh = tiny(corpus, tmp_path / "x")
    from depthlens.models.model import build_model

    ref0 = build_model(fresh.model_config(), seed=fresh.seed).state_dict()
    assert all(torch.equal(init[k], ref0[k]) for k in init)  # step 0 is the init itself
    got, ref = _weights(snap / "checkpoint"), _weights(straight / "checkpoint")
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load(path).model.state_dict()


def test_kill_and_resume_is_bit_exact(corpus, tmp_path):
    straight = tmp_path / "straight"
    train(tiny(corpus, straight, steps=10, micro_batch=4))
    ref = _weights(straight / "checkpoint")

    # (a) stop after step 4 as if killed (the state is saved there), rerun the same command
    a = tmp_path / "a"
    assert train(tiny(corpus, a, steps=10, micro_batch=4, stop_after=4)) == {"step": 4, "stopped": True}
    train(tiny(corpus, a, steps=10, micro_batch=4))
    # (b) crash at step 7, after a save at step 6: step 7 is redone on resume
    b = tmp_path / "b"

    def crash(step: int, rec: dict) -> None:
        if step == 7:
            raise KeyboardInterrupt("simulated kill")

    with pytest.raises(KeyboardInterrupt):
        train(tiny(corpus, b, steps=10, micro_batch=4, save_every=3), callback=crash)
    assert json.loads((b / "resume/state.json").read_text())["step"] == 6
    train(tiny(corpus, b, steps=10, micro_batch=4, save_every=3))
    for run in (a, b):
        got = _weights(run / "checkpoint")
        assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
        assert log_losses(run) == log_losses(straight)  # the log has no duplicated or missing steps

    with pytest.raises(ValueError, match="different run"):
        train(tiny(corpus, b, steps=10, lr=1e-3))


@pytest.mark.slow
def test_torchrun_two_processes_match_one(corpus, tmp_path):
    """gloo on 2 CPU processes gives the 1-process run: DDP with MoDA (whose last-layer depth K/V get no
    gradient), and FSDP2 with accumulation on HC and mHC (whose 0-D gate scales FSDP2 cannot shard, so
    they are all-reduced by hand, in name order). 50 steps and a final-weights comparison: with the
    old id()-ordered all-reduce the ranks averaged different gates' gradients: HC's weights ended 3.6e-2
    away (now 8e-7; mHC 4e-5, its Sinkhorn amplifies round-off: lr is kept low so 1e-4 is a fair bar)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    runs = {
        "ddp": ("moda", 6, {}),
        "fsdp_hc": ("hc", 50, {"fsdp": True, "micro_batch": 2}),
        "fsdp_mhc": ("mhc", 50, {"fsdp": True, "micro_batch": 2}),
    }
    recipes, ones = [], {}
    for name, (arch, steps, extra) in runs.items():
        model = {**tiny(corpus, tmp_path).model, "arch": arch, "n_layer": 3}
        cfg = tiny(corpus, tmp_path / f"{name}_one", steps=steps, model=model, lr=1e-3, log_every=5)
        ones[name] = train(cfg)
        recipe = tmp_path / f"{name}.json"
        recipe.write_text(json.dumps({**cfg.to_dict(), **extra, "out": str(tmp_path / name)}))
        recipes.append(str(recipe))
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node=2", str(REPO / "tests/dist_worker.py"), *recipes],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in runs:
        assert log_losses(tmp_path / name) == pytest.approx(log_losses(tmp_path / f"{name}_one"), abs=1e-4), name
        one, two = _weights(tmp_path / f"{name}_one" / "checkpoint"), _weights(tmp_path / name / "checkpoint")
        assert one.keys() == two.keys()
        worst = max((one[k] - two[k]).abs().max().item() for k in one)
        assert worst < 1e-4, f"{name}: 2-process weights differ from 1-process by {worst:.2e}"
        assert load(tmp_path / name / "checkpoint").train["final_val_loss"] == pytest.approx(
            ones[name]["final_val_loss"], abs=1e-4
        )


def test_bf16_autocast_trains_close_to_fp32_with_fp32_losses(corpus, tmp_path, monkeypatch):
    """dtype=bf16 on CPU: the matmuls run under bf16 autocast (the LM head emits bf16 logits), the loss is
    taken on fp32 logits (cross_entropy sees float32), logged losses stay finite and near the fp32 run's."""
    import torch.nn.functional as F

    from depthlens.training import trainer as T

    seen: dict[str, set] = {"head": set(), "ce": set()}
    real_ce = F.cross_entropy

    def spy_ce(logits, *a, **k):
        seen["ce"].add(logits.dtype)
        return real_ce(logits, *a, **k)

    real_init = T.Trainer.__init__

    def hooked_init(self, *a, **k):
        real_init(self, *a, **k)
        self.model.lm_head.register_forward_hook(lambda m, i, o: seen["head"].add(o.dtype))

    monkeypatch.setattr(T.F, "cross_entropy", spy_ce)
    monkeypatch.setattr(T.Trainer, "__init__", hooked_init)
    runs = {}
    for dt in ("fp32", "bf16"):
        seen["head"].clear(), seen["ce"].clear()
        out = tmp_path / dt
        rec = train(tiny(corpus, out, steps=12, lr=1e-2, warmup=2, dtype=dt, name=dt))
        runs[dt] = (log_losses(out), rec["final_val_loss"])
        assert seen["head"] == {torch.bfloat16 if dt == "bf16" else torch.float32}
        assert seen["ce"] == {torch.float32}
    (l32, v32), (l16, v16) = runs["fp32"], runs["bf16"]
    assert all(math.isfinite(x) for x in l16) and math.isfinite(v16)
    assert l16[0] == pytest.approx(l32[0], rel=1e-2)  # same init, same batch: only bf16 rounding differs
    assert l16 != l32 and abs(v16 - v32) < 0.1 and l16[-1] < l16[0] - 1.0  # and it learns as fp32 does


def test_lr_sweep_extends_until_interior(tmp_path, monkeypatch):
    """The sweep grid grows by one x2 step past an edge optimum and stops once every optimum is interior;
    the deep check starts around the shallow optimum."""
    assert recipes._next_lrs({}, (1.0, 2.0)) == [1.0, 2.0]
    assert recipes._next_lrs({1.0: 3.0, 2.0: 2.0}, (1.0, 2.0)) == [4.0]  # best at the top edge
    assert recipes._next_lrs({1.0: 1.0, 2.0: 2.0}, (1.0, 2.0)) == [0.5]  # best at the bottom edge
    assert recipes._next_lrs({1.0: 3.0, 2.0: 1.0, 4.0: 2.0}, (1.0, 2.0)) == []  # interior: done
    sweep = recipes.zoo_lr_recipe()
    for run in sweep["runs"].values():  # finished runs live under tmp_path
        run["export"] = str(tmp_path / Path(run["export"]).relative_to(".cache/depthlens/runs/zoo_lr"))

    def finish(name: str, loss: float) -> None:
        (Path(sweep["runs"][name]["export"])).mkdir(parents=True)
        (Path(sweep["runs"][name]["export"]) / "train.json").write_text(json.dumps({"final_val_loss": loss}))

    assert len(recipes.lr_sweep_pending(sweep)) == 10 * len(recipes.ZOO_LRS)
    for design in SLUGS:  # a parabola in log2(lr) with its minimum at 6e-3 (interior of the start grid)
        for lr in recipes.ZOO_LRS:
            finish(recipes.lr_sweep_name(design, 8, lr), (math.log2(lr / 6e-3)) ** 2)
    deep = recipes.lr_sweep_pending(sweep)
    assert sorted(deep) == sorted(
        recipes.lr_sweep_name(d, 32, lr) for d in recipes.ZOO_CONFIRM_DESIGNS for lr in (3e-3, 6e-3, 1.2e-2)
    )
    for name in deep:  # at L=32 the optimum moves to the top edge: one more step up
        finish(name, -sweep["runs"][name]["lr"])
    assert sorted(recipes.lr_sweep_pending(sweep)) == sorted(
        recipes.lr_sweep_name(d, 32, 2.4e-2) for d in recipes.ZOO_CONFIRM_DESIGNS
    )
    res = recipes.collect_lr_sweep(sweep, tmp_path / "res.json")
    assert res["chosen"]["hc"] == {"8": 6e-3, "32": 1.2e-2} and res["interior"]["hc"] == {"8": True, "32": False}
    assert recipes.zoo_lr("hc", 32, res) == (1.2e-2, "zoo_cpu_lr_sweep.json (L=32)")
    assert recipes.zoo_lr("hc", 16, res) == (6e-3, "zoo_cpu_lr_sweep.json (L=8)")


def test_residual_design_parameters_are_not_decayed_by_default():
    """`decay_mixing` off (the default): no parameter of a Router is in the decayed group, so an identity-initialised
    2-D map (HC's static alpha) and a 1-D one (mHC's bias) are treated alike; backbone matrices still decay."""
    from depthlens.models import ModelConfig, build_model
    from depthlens.training.trainer import param_groups

    model = build_model(ModelConfig.debug("hc", n_layer=2), seed=0)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in param_groups(model, 0.1)[0]["params"]}
    assert not any("router" in n for n in decayed) and any(n.endswith("q_proj.weight") for n in decayed)
    old = {names[id(p)] for p in param_groups(model, 0.1, decay_mixing=True)[0]["params"]}
    assert {n for n in old - decayed} == {n for n, p in model.named_parameters() if "router" in n and p.dim() >= 2}
    assert any(n.endswith("static_alpha") for n in old - decayed)


def test_stale_runs_follow_the_recipe(tmp_path):
    """A zoo checkpoint is kept only when its train.json was written by the recipe as it is now."""
    recipe = {
        "base": {"model": {"arch": "preln", "n_layer": 2, "d_model": 16, "n_head": 2}, "lr": 1e-3},
        "runs": {
            name: {"export": str(tmp_path / name), "out": str(tmp_path / "runs" / name)} for name in ("a", "b", "c")
        },
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(recipe))
    for name, lr in (("a", 1e-3), ("b", 2e-3)):  # a: trained from this recipe; b: from an older one (another LR)
        cfg = load_recipe(path, run=name).to_dict()
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.json").write_text(json.dumps({"recipe": {**cfg, "lr": lr, "resume": False}}))
    assert recipes.stale_runs(path, ["a", "b", "c"]) == ["b", "c"]  # c: never trained
