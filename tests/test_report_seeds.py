"""Report on tiny trained runs with two training seeds: the untrained baseline is the trainer's step-0 model bit
for bit, records carry seeds and untrained values, and a claim pools the seeds by a t interval."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from depthlens.data.shards import write_shard
from depthlens.data.tokenizers import ByteTokenizer
from depthlens.stats.crossed import CROSSED
from depthlens.stats.orderings import Claim, check
from depthlens.studies import report as B
from depthlens.training.config import RunConfig

TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune.\ndef add(a, b):\n    return a + b\n\n"
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from depthlens.training.trainer import train

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("corpus")
    tok = ByteTokenizer()
    doc = [tok.bos_id] + tok.encode(TEXT * 4)
    write_shard(d / "train_000.bin", np.array(doc * 30))
    write_shard(d / "val_000.bin", np.array(doc * 4))
    (d / "eval.txt").write_text(TEXT * 6)
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for arch in ("preln", "hc"):
        for seed in (0, 1):
            out = root / f"{arch}_l4_s{seed}"
            cfg = RunConfig.from_dict(
                dict(
                    model=dict(arch=arch, d_model=32, n_layer=4, n_head=2, vocab_size=257, max_seq_len=32),
                    data=str(d),
                    seq_len=32,
                    global_batch=4,
                    steps=6,
                    lr=3e-3,
                    warmup=2,
                    out=str(out),
                    export=str(out / "checkpoint"),
                    final_eval_batches=1,
                    snapshot_eval_batches=1,
                    name=out.name,
                    threads=1,
                    seed=seed,
                    snapshots=[0],
                )
            )
            train(cfg)
            runs[(arch, seed)] = out
    return d, runs


@pytest.mark.slow
def test_untrained_baseline_is_the_trainers_step0_model(trained):
    _, runs = trained
    for (arch, seed), out in runs.items():
        (e,) = B.load_entries([out / "checkpoint"])
        assert e.seed == seed
        got = B.untrained_model(e).state_dict()
        step0 = load_file(str(out / "snapshots" / "step_0000000" / "model.safetensors"))
        assert set(step0) <= set(got)
        for k, v in step0.items():
            assert torch.equal(got[k], v), (arch, seed, k)


@pytest.mark.slow
def test_report_pools_seeds_and_checks_claims_at_init(trained, tmp_path):
    data, runs = trained
    opts = B.ReportOptions(
        data=data / "eval.txt",
        n_seq=6,
        seq_len=32,
        n_boot=50,
        metrics=("causal", "permutation"),
        untrained_perm_n_seq=3,
    )
    rep = B.build_report([p / "checkpoint" for p in runs.values()], tmp_path / "rep", opts)
    recs = rep.records
    assert sorted((r["design"], r["seed"]) for r in recs) == sorted(runs)
    for r in recs:
        for key in ("causal", "perm"):
            assert r[f"{key}_ci_low"] <= r[f"{key}_share"] <= r[f"{key}_ci_high"]
            assert r[f"{key}_share_untrained"] is not None
            lo, d, hi = (r[f"{key}_untrained_diff{s}"] for s in ("_low", "", "_high"))
            assert lo <= d <= hi
        assert r["causal_untrained_n_seq"] == 6 and r["perm_untrained_n_seq"] == 3  # the permutation: a prefix
        assert r["causal_untrained_diff"] == pytest.approx(r["causal_share"] - r["causal_share_untrained"])
        assert r["eval_loss_untrained"] > r["eval_loss"]  # 6 steps of training already lower the loss
    claim = Claim("order", "causal", "hc", "preln", 4, "test")
    rows = B.comparisons(rep.entries, opts, [claim])
    per_seed = [r for r in rows if not r.get("crossed")]
    assert [r["seed"] for r in per_seed] == [0, 1] and all("untrained_diff" in r for r in per_seed)
    (crossed,) = [r for r in rows if r.get("crossed")]  # the seeds crossed with the shared eval sequences
    assert crossed["difference"]["n_seq"] == 6 and crossed["untrained_difference"]["n_units"] == 2
    res = check(claim, recs, rows)
    assert res["seeds"] == [0, 1] and res["interval"]["unit"] == "training seeds"
    assert res["interval"]["method"] == CROSSED and res["interval"]["n_units"] == 2
    assert res["verdict_untrained"] in ("holds", "reversed", "absent", "unresolved")
    # the same seeds on both sides: the difference of the seed means is the mean of the per-seed differences
    assert res["interval"]["estimate"] == pytest.approx(np.mean([r["diff"] for r in per_seed]))
    text = (tmp_path / "rep" / "README.md").read_text()
    assert "Share against eval-set size" in text and "DepthBench's claims" in text


@pytest.mark.slow
def test_untrained_permutation_only_where_a_claim_needs_it(trained, tmp_path, monkeypatch):
    from depthlens.stats import orderings

    data, runs = trained
    monkeypatch.setattr(orderings, "CLAIMS", (Claim("order", "perm", "hc", "full_attnres", 4, "test"),))
    assert orderings.claim_cells("perm") == {("hc", 4), ("full_attnres", 4)}
    opts = B.ReportOptions(
        data=data / "eval.txt", n_seq=4, seq_len=32, n_boot=20, metrics=("permutation",), untrained_perm_for="claims"
    )
    rep = B.build_report([runs[("hc", 0)] / "checkpoint", runs[("preln", 0)] / "checkpoint"], tmp_path / "r", opts)
    by = {r["design"]: r for r in rep.records}
    assert by["hc"]["perm_share_untrained"] is not None and by["hc"]["perm_untrained_diff"] is not None
    assert by["preln"]["perm_share_untrained"] is None and by["preln"]["perm_share"] is not None
    (pre,) = [e for e in rep.entries if e.slug == "preln"]
    assert any("--untrained-perm-for claims" in n for n in pre.notes) and "permutation" not in pre.untrained
    assert rep.options.as_dict()["untrained_perm_for"] == "claims"
    with pytest.raises(Exception, match="untrained_perm_for"):
        B.ReportOptions(untrained_perm_for="some")
