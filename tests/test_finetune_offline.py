"""``benchmarks/finetune_offline.py``: a comparison database replayed through the shared online cost model under
fine-tuning variants, each round's next candidates ranked (issue 15, item 1). Replay oracle only."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import felixjax as fj
from codegen.spaces import spaces_for
from felixjax.database import Database
from felixjax.model import OnlineCostModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import finetune_offline as ft


def test_rank_metrics_of_a_perfect_and_a_reversed_ranking():
    lat = np.array([4.0, 1.0, 3.0, 2.0, 8.0, 5.0, 7.0, 6.0, 9.0, 10.0, 12.0, 11.0])
    perfect = ft.rank_metrics(-np.log(lat), lat)  # scores: higher is faster
    assert perfect == {"tau": pytest.approx(1.0), "recall": 1.0, "top8": 1.0}
    worst = ft.rank_metrics(np.log(lat), lat)
    assert worst["tau"] == pytest.approx(-1.0) and worst["recall"] == 0.0
    assert worst["top8"] == pytest.approx(lat[np.argsort(-lat)[:8]].min() / lat.min())  # 5.0: the best is not in


def _rows(variant, taus, db="d"):
    return [{"db": db, "run": f"gradient:{i // 2}", "task": "t", "t": 32 * (i % 2 + 1), "variant": variant,
             "mlp_tau": tau} for i, tau in enumerate(taus)]


def test_paired_difference_pairs_rounds_and_bootstraps_whole_runs():
    ref = _rows("default", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    same = _rows("lr_x4", [0.15, 0.25, 0.35, 0.45, 0.55, 0.65])  # +0.05 everywhere: a zero-width interval
    d, lo, hi = ft.paired_difference(ref + same, "lr_x4", n_boot=200)
    assert d == pytest.approx(0.05) and lo == pytest.approx(0.05) and hi == pytest.approx(0.05)
    mixed = _rows("rank_x10", [0.3, 0.4, 0.3, 0.4, 0.3, 0.2])  # +0.2, +0.2, 0, 0, -0.2, -0.4 by run pairs
    d, lo, hi = ft.paired_difference(ref + mixed, "rank_x10", n_boot=500)
    assert d == pytest.approx(-0.2 / 6) and lo < d < hi and lo >= -0.3 - 1e-9 and hi <= 0.2 + 1e-9
    # rows of another database (a different comparison) never pair with these
    assert np.isnan(ft.paired_difference(ref + _rows("lr_x4", [0.9] * 6, db="other"), "lr_x4")[0])


def test_replay_run_feeds_the_shared_model_round_by_round(tmp_path, capsys):
    """Frozen ranks with the packaged model as shipped; a fine-tuned variant has seen every earlier round of
    every task (one shared model) when it ranks the next; the script's CLI writes rows and summarizes them."""
    a, b = fj.ops.matmul(64, 48, 32), fj.ops.matmul(32, 32, 24)
    fj.compare([a, b], ["random"], db=str(tmp_path / "c.db"), trials=48, seeds=1, replay=True, progress=False,
               remeasure=0, defaults=False, reference=False)
    db = Database(str(tmp_path / "c.db"), readonly=True)
    tasks = [t for t, _ in db.tasks()]
    frozen = ft.replay_run(db, tasks, "random:0", "frozen", batch=16, rounds=2, seed=0)
    tuned = ft.replay_run(db, tasks, "random:0", "default", batch=16, rounds=2, seed=0)
    assert [(r["task"], r["t"]) for r in frozen] == [(t.name, t16) for t16 in (16, 32) for t in tasks]
    assert [r["n_model"] for r in frozen] == [0] * 4
    assert [r["n_model"] for r in tuned] == [32, 32, 64, 64]  # both tasks' rounds so far, then the next's
    own = ft.replay_run(db, tasks, "random:0", "per_task", batch=16, rounds=2, seed=0)
    assert [r["n_model"] for r in own] == [16, 16, 32, 32]  # a model per task: its own rounds only

    # frozen: exactly the shipped model's ranking of the next 16 configs
    recs = sorted(db.records(tasks[0], run="random:0"), key=lambda r: r.trial)[16:32]
    target = fj.Target.from_json(recs[0].target)
    scorer = OnlineCostModel(target, pretrained="packaged").scorer(spaces_for(tasks[0], target))
    lat = np.array([r.latency_s for r in recs])
    want = ft.rank_metrics(np.asarray(scorer.model.predict(scorer.features([r.config for r in recs]))), lat)
    assert frozen[0]["mlp_tau"] == pytest.approx(want["tau"]) and frozen[0]["mlp_top8"] == pytest.approx(want["top8"])
    assert all(-1 <= r["mlp_tau"] <= 1 and r["mlp_top8"] >= 1 for r in frozen + tuned)

    rows = tmp_path / "rows.jsonl"
    assert ft.main(["--db", str(tmp_path / "c.db"), "--runs", "random:0", "--variants", "frozen,default",
                    "--batch", "16", "--rounds", "1", "--rows", str(rows)]) == 0
    assert len([json.loads(x) for x in rows.read_text().splitlines()]) == 2 * 2
    capsys.readouterr()
    assert ft.main(["--summarize", str(rows)]) == 0
    out = capsys.readouterr().out
    assert "| frozen | 2 |" in out and "| default | 2 |" in out
    # the runs' own reach beside the pool metric: each task's first 16 + 16 trials against its pool's best
    want = []
    for t in tasks:
        recs = sorted(db.records(t, run="random:0"), key=lambda r: r.trial)
        first, every = [r.latency_s for r in recs[:32] if r.ok], [r.latency_s for r in recs if r.ok]
        want.append(float(min(first) <= min(every) / 0.95))
    assert ft.run_reach(db, tasks, ["random:0"], batch=16, rounds=1) == {("random", 16): pytest.approx(np.mean(want))}
    assert ft.main(["--db", str(tmp_path / "c.db"), "--runs", "random:0", "--batch", "16", "--rounds", "1",
                    "--reach"]) == 0
    assert "| random |" in capsys.readouterr().out
    # another checkpoint (here the packaged one under a name of its own) replays as the packaged one does
    from felixjax.model import PACKAGED_MODEL
    assert ft.main(["--db", str(tmp_path / "c.db"), "--runs", "random:0", "--variants", "pk_frozen", "--batch", "16",
                    "--rounds", "1", "--rows", str(rows), "--checkpoint", f"pk={PACKAGED_MODEL}"]) == 0
    got = {(r["task"], r["variant"]): r["mlp_tau"] for r in map(json.loads, rows.read_text().splitlines())}
    assert all(got[(t.name, "pk_frozen")] == pytest.approx(got[(t.name, "frozen")]) for t in tasks)
    with pytest.raises(SystemExit):
        ft.main(["--db", str(tmp_path / "c.db"), "--checkpoint", "pk=/no/such.npz"])
    with pytest.raises(SystemExit):
        ft.main(["--db", str(tmp_path / "c.db"), "--variants", "nope"])


def test_first_round_run_opens_each_task_on_the_model_the_earlier_tasks_left(tmp_path):
    """``--first-round``: task k's first batch is ranked by the shared model after the first rounds of tasks 0..k-1
    (frozen: the packaged model as shipped); task 0, alike in every variant, gets no row."""
    ops = [fj.ops.matmul(64, 48, 32), fj.ops.matmul(32, 32, 24), fj.ops.matmul(48, 16, 40)]
    fj.compare(ops, ["random"], db=str(tmp_path / "c.db"), trials=32, seeds=1, replay=True, progress=False,
               remeasure=0, defaults=False, reference=False)
    db = Database(str(tmp_path / "c.db"), readonly=True)
    tasks = [t for t, _ in db.tasks()]
    frozen = ft.first_round_run(db, tasks, "random:0", "frozen", batch=16, seed=0)
    tuned = ft.first_round_run(db, tasks, "random:0", "default", batch=16, seed=0)
    assert [(r["task"], r["k"], r["t"]) for r in tuned] == [(tasks[1].name, 1, 0), (tasks[2].name, 2, 0)]
    assert [r["n_model"] for r in frozen] == [0, 0] and [r["n_model"] for r in tuned] == [16, 32]
    # frozen: exactly the shipped model's ranking of the batch task 1 opened with
    recs = sorted(db.records(tasks[1], run="random:0"), key=lambda r: r.trial)[:16]
    target = fj.Target.from_json(recs[0].target)
    scorer = OnlineCostModel(target, pretrained="packaged").scorer(spaces_for(tasks[1], target))
    want = ft.rank_metrics(np.asarray(scorer.model.predict(scorer.features([r.config for r in recs]))),
                           np.array([r.latency_s for r in recs]))
    assert frozen[0]["gated_tau"] == pytest.approx(want["tau"])
    # below OnlineCostModel.MIN_TRAIN (24) rows nothing is fitted: task 1 opens on the shipped model either way;
    # task 2, after 32 rows, on the fine-tuned one
    assert tuned[0]["mlp_tau"] == pytest.approx(frozen[0]["mlp_tau"])
    assert tuned[1]["mlp_tau"] != pytest.approx(frozen[1]["mlp_tau"])
    assert all(0 <= r["mlp_pool_hit"] <= 1 and r["mlp_pool_top"] >= 1 for r in frozen + tuned)
    with pytest.raises(ValueError, match="one shared model"):
        ft.first_round_run(db, tasks, "random:0", "per_task", batch=16, seed=0)
