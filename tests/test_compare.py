"""Comparisons: one call gives the CSV, table and plots; budgets, interleaving, re-measurement,
censoring; the replay runner and the synthetic oracle; the CLI; one tiny real run."""
import csv
import dataclasses
import math
import os

import numpy as np
import pytest

import felixjax as fj
from codegen.measure import MeasureResult
from codegen.space import Space, sketches_for
from felixjax.cli import main as cli
from felixjax.compare import REACH, Comparison
from felixjax.database import TuningRecord
from felixjax.strategies.genetic import GeneticSearch
from felixjax.testing import ReplayRunner, SyntheticOracle, TimingNoise, dense_table

TARGET = fj.Target.cpu()
TASKS = [fj.ops.matmul(64, 48, 32), fj.ops.conv2d(1, 16, 14, 14, out_channels=32, kernel=3, padding=1)]


def small_genetic():
    return GeneticSearch(population=256)


def test_one_call_writes_csv_table_and_plot(tmp_path):
    out = tmp_path / "out"
    cmp = fj.compare(TASKS, [small_genetic, "random"], trials=30, seeds=2, db=str(tmp_path / "cmp.db"), replay=True,
                     out=str(out), progress=False)
    assert sorted(os.listdir(out)) == ["cmp.csv", "curves.png", "table.md"]
    # the database holds every trial, runs named strategy:seed
    db = fj.Database(tmp_path / "cmp.db")
    assert db.runs() == ["genetic:0", "genetic:1", "random:0", "random:1"]
    # every trial, plus one re-timing row per run (run "retime:<run>": no budget, no history)
    assert len(db) == 2 * 2 * 2 * 30 + 2 * 2 * 2
    assert db.runs(retimes=True)[-4:] == ["retime:genetic:0", "retime:genetic:1", "retime:random:0", "retime:random:1"]
    # CSV: every measurement, best so far monotone per run
    rows = list(csv.DictReader(open(out / "cmp.csv")))
    assert set(rows[0]) == {"strategy", "seed", "task", "phase", "trial", "elapsed_s", "latency_s", "best_so_far_s",
                            "status", "opening", "stop_reason"}
    tune = [r for r in rows if r["phase"] == "tune"]
    for t in TASKS:  # the defaults every run measured first are marked, at the head of each run and nowhere else
        n = len(cmp.openings[t.name])
        assert n >= 1 and all([r["opening"] for r in tune if (r["task"], r["strategy"], r["seed"]) == (t.name, s, sd)]
                              == ["1"] * n + ["0"] * (30 - n) for s in ("genetic", "random") for sd in ("0", "1"))
    assert len(tune) == 240 and len([r for r in rows if r["phase"] == "remeasure"]) == 8 * 3
    for key in {(r["task"], r["strategy"], r["seed"]) for r in tune}:
        run = [r for r in tune if (r["task"], r["strategy"], r["seed"]) == key]
        assert [int(r["trial"]) for r in run] == list(range(30))
        best = [float(r["best_so_far_s"]) for r in run]
        assert best == sorted(best, reverse=True) and best[-1] == min(float(r["latency_s"]) for r in run)
        el = [float(r["elapsed_s"]) for r in run]
        assert el == sorted(el)
    # table: a row per task and strategy, and the geomean ratio line
    table = (out / "table.md").read_text()
    assert table.strip() == cmp.table().strip()
    for t in TASKS:
        for s in ("genetic", "random"):
            assert f"| {t.name} | {s} |" in table
    assert "| random / genetic |" in table
    png = (out / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_runs_are_interleaved_and_final_bests_remeasured_interleaved(tmp_path):
    replays = {}

    def factory(task, target):
        replays[task.name] = ReplayRunner(SyntheticOracle(task, target))
        return replays[task.name]

    cmp = fj.compare(TASKS[:1], [small_genetic, "random"], trials=128, seeds=2, db=str(tmp_path / "i.db"),
                     replay=factory, progress=False)
    # interleaving: at every moment, runs differ by at most one round (64 = the largest batch)
    counts = {}
    for rec in fj.Database(tmp_path / "i.db").records():
        counts[rec.run] = counts.get(rec.run, 0) + 1
        if len(counts) == 4:
            assert max(counts.values()) - min(counts.values()) <= 64
    assert set(counts.values()) == {128}
    # re-measurement: the distinct final bests, A B C A B C A B C, after all tuning
    calls = replays[TASKS[0].name].calls
    bests = list(dict.fromkeys(min(h, key=lambda r: r.latency_s).config for h in cmp.histories.values()))
    k = len(bests)
    assert calls[-3 * k:] == bests * 3
    assert len(calls) == 4 * 128 + 3 * k
    assert all(len(v) == 3 for v in cmp.remeasured.values())


def _fake(task, run, lats, dt=1.0):
    s, seed = run.split(":")
    recs = []
    for i, lat in enumerate(lats):
        res = MeasureResult("ok", (lat,)) if math.isfinite(lat) else MeasureResult("runtime_error", error="x")
        recs.append(TuningRecord(task, "k", run, i, None, res, dt * (i + 1)))
    return (task.name, s, int(seed)), recs


def test_reach_censoring_and_ratios():
    t = TASKS[0]
    hist = dict([
        _fake(t, "gradient:0", [4.0, 2.0, 1.0, 1.0]),  # best known 1.0: reached at trial 3
        _fake(t, "gradient:1", [4.0, 1.04, 1.0, 1.0]),  # 1.04 <= 1/0.95: reached at trial 2
        _fake(t, "genetic:0", [math.inf, 3.0, 2.0, 1.05]),  # 1.05 <= 1.0526: trial 4
        _fake(t, "genetic:1", [5.0, 3.0, 2.0, 1.2]),  # never: censored at 4 trials
    ])
    cmp = Comparison([t], ["gradient", "genetic"], [0, 1], 4, None, hist)
    assert cmp.best_known(t.name) == 1.0
    assert cmp.reach(t.name, "gradient", 1) == {"trials": 2, "seconds": 2.0, "reached": True}
    assert cmp.reach(t.name, "genetic", 0)["trials"] == 4 and cmp.reach(t.name, "genetic", 0)["reached"]
    assert cmp.reach(t.name, "genetic", 1) == {"trials": 4, "seconds": 4.0, "reached": False}
    rows = {r["strategy"]: r for r in cmp.rows()}
    assert rows["gradient"]["trials95"] == 2.5 and not rows["gradient"]["trials95_censored"]
    assert rows["genetic"]["trials95"] == 4 and rows["genetic"]["trials95_censored"]  # 1 of 2 seeds reached
    assert rows["genetic"]["reached"] == 1
    ratios = cmp.ratios()
    assert cmp.reference() == "gradient" and set(ratios) == {"genetic"}
    assert ratios["genetic"]["trials95"] == pytest.approx(4 / 2.5) and ratios["genetic"]["censored"] == 1
    assert ratios["genetic"]["final"] == pytest.approx(np.median([1.05, 1.2]) / 1.0)
    table = cmp.table()
    assert "| >4 |" in table and "| genetic / gradient |" in table and "1/2" in table
    assert REACH == 0.95
    # no task uncensored for both: the uncensored columns say so instead of printing nan
    line = next(ln for ln in table.splitlines() if ln.startswith("| genetic / gradient |"))
    assert ratios["genetic"]["uncensored"] == 0 and line.endswith("| 0 | — | — |") and "nan" not in table


def test_dense_replay_space_every_proposal_is_recorded():
    """On a densely recorded space (every valid config), no strategy ever proposes outside it."""
    t = fj.ops.matmul(4, 8, 8)
    table = dense_table(t, TARGET)
    valid = set(Space(t, "gemm_packed", TARGET).enumerate())
    assert set(table) == valid
    replay = ReplayRunner(table, trial_s=0.0)
    cmp = fj.compare([t], [small_genetic, "random"], trials=70, seeds=1, db=None, replay=lambda *_: replay,
                     progress=False)
    for recs in cmp.histories.values():
        assert len(recs) == 70 and all(r.ok for r in recs)
    assert min(r.latency_s for recs in cmp.histories.values() for r in recs) >= replay.optimum


def test_replay_from_database_and_unrecorded_configs(tmp_path):
    t = TASKS[0]
    oracle = SyntheticOracle(t)
    sp = Space(t, "gemm_packed", TARGET)
    cfgs = list(dict.fromkeys(sp.sample(np.random.default_rng(i)) for i in range(6)))
    db = fj.Database(tmp_path / "r.db")
    for i, c in enumerate(cfgs[:-1]):
        db.add(TuningRecord(t, TARGET.key, "x:0", i, c, MeasureResult("ok", (oracle(c), 2 * oracle(c), oracle(c))), 0))
    db.add(TuningRecord(t, TARGET.key, "x:0", 9, cfgs[0], MeasureResult("ok", (oracle(cfgs[0]),)), 0))
    replay = ReplayRunner.from_database(tmp_path / "r.db", t)
    got = []
    replay.measure(cfgs, lambda c, r: got.append(r) or True)
    assert [r.latency_s for r in got[:-1]] == pytest.approx([oracle(c) for c in cfgs[:-1]])
    assert got[-1].status == "runtime_error" and "not in the recorded table" in got[-1].error
    stop = []
    replay.measure(cfgs, lambda c, r: stop.append(c) or len(stop) < 2)
    assert len(stop) == 2


def test_synthetic_oracle_is_deterministic_and_has_a_nontrivial_optimum():
    t = fj.ops.matmul(8, 16, 16)
    a, b = SyntheticOracle(t), SyntheticOracle(t)
    cfgs = [Space(t, "gemm_packed", TARGET).sample(np.random.default_rng(i)) for i in range(50)]
    assert (a.latencies(cfgs) == b.latencies(cfgs)).all() and (a.latencies(cfgs) > 0).all()
    assert not (SyntheticOracle(t, seed=1).latencies(cfgs) == a.latencies(cfgs)).all()
    table = dense_table(t, TARGET)
    lat = np.array(list(table.values()))
    best = min(table, key=table.get)
    assert best.vec > 1 and lat.min() < np.median(lat) / 3  # the optimum is vectorized and well separated
    assert sum(lat <= lat.min() / REACH) < 0.01 * len(lat)  # reaching 95% of it takes search
    conv = TASKS[1]
    o = SyntheticOracle(conv)
    sk = {s.name: Space(conv, s, TARGET) for s in sketches_for(conv)}
    assert all(o(sp.default()) > 0 for sp in sk.values())


def test_timing_noise_only_slows_is_seeded_and_drawn_per_measurement():
    t = TASKS[0]
    oracle = SyntheticOracle(t)
    cfgs = [Space(t, "gemm_packed", TARGET).sample(np.random.default_rng(i)) for i in range(40)]
    true = oracle.latencies(cfgs)
    a, b = TimingNoise(oracle, 0.1, seed=3), TimingNoise(oracle, 0.1, seed=3)
    first = a.latencies(cfgs)
    assert (first >= true).all() and (first == b.latencies(cfgs)).all()  # never faster than it is; seeded
    again = a.latencies(cfgs)
    assert (again != first).any()  # a new draw per measurement, as a second timing of the same kernels
    one = np.array([a(cfgs[0]) for _ in range(400)]) / true[0]
    # exp(0.1 |z|): median exp(0.1 * 0.674) = 1.070, 95th percentile exp(0.196) = 1.217
    assert 1.05 < np.median(one) < 1.09 and 1.17 < np.quantile(one, 0.95) < 1.27
    # a plain callable (no vectorized latencies) works the same
    slow = TimingNoise(lambda c: 1e-3, 0.2, seed=0)
    assert slow(cfgs[0]) >= 1e-3
    with pytest.raises(ValueError, match="sigma"):
        TimingNoise(oracle, 0.0)


def test_noisy_replay_in_a_comparison_records_timings_above_the_truth():
    t = TASKS[0]
    oracle = SyntheticOracle(t)
    with pytest.raises(ValueError, match="dense"):
        ReplayRunner.from_oracle(t, TARGET, noise=0.1, dense=True)
    clean = fj.compare([t], [small_genetic], trials=24, seeds=1, db=None, replay=True, progress=False,
                       remeasure=0, defaults=False)
    noisy = fj.compare([t], [small_genetic], trials=24, seeds=1, db=None, progress=False, remeasure=0,
                       defaults=False, replay=lambda task, tg: ReplayRunner.from_oracle(task, tg, noise=0.1))
    recs = noisy.histories[(t.name, "genetic", 0)]
    measured = np.array([r.latency_s for r in recs])
    truth = oracle.latencies([r.config for r in recs])
    assert len(recs) == 24 and (measured >= truth).all() and (measured > truth * 1.001).mean() > 0.8
    exact = clean.histories[(t.name, "genetic", 0)]
    assert [r.latency_s for r in exact] == pytest.approx(list(oracle.latencies([r.config for r in exact])))


def test_cli_compare_replay(tmp_path, capsys):
    out = tmp_path / "res"
    assert cli(["compare", "--op", "matmul:m=32,n=32,k=32", "--strategies", "genetic,random", "--seeds", "1",
                "--trials", "8", "--out", str(out), "--replay", "--dask", "tcp://127.0.0.1:1", "--reference"]) == 0
    cap = capsys.readouterr()
    assert "| matmul_32x32x32 | genetic |" in cap.out
    # the ratio line; on an 8-lane host the replay oracle of its target has the opening reach 95% (set apart)
    if fj.Target.cpu().simd_lanes == 16:
        assert "random / genetic" in cap.out
    else:
        assert "random / genetic" in cap.out or "No ratios: every task is set apart; the opening reaches" in cap.out
    runs = {r.run for r in fj.Database(out / "cmp.db").records()}
    assert {"reference:genetic:0", "reference:random:0"} <= runs  # --reference: 2x-budget runs to judge against
    assert "--dask is not used with --replay" in cap.err  # session 74: it was silently ignored
    assert {"cmp.csv", "table.md", "curves.png", "cmp.db"} <= set(os.listdir(out))


@pytest.mark.parametrize("argv, msg", [
    (["compare", "--out", "x"], "nothing to compare"),
    (["compare", "--suite", "ops", "--op", "matmul:m=4,n=4,k=4", "--out", "x"], "not both"),
    (["compare", "--suite", "nope", "--out", "x"], "unknown suite"),
    (["compare", "--op", "matmul:m=4", "--out", "x"], "needs n="),
    (["compare", "--op", "matmul:m=4,n=4,k=4", "--strategies", "annealing", "--out", "x"], "unknown strategy"),
    (["compare", "--op", "matmul:m=4,n=4,k=4", "--trials", "0", "--out", "x"], "must be >= 1"),
    (["compare", "--op", "matmul:m=4,n=4,k=4", "--strategies", "genetic@0", "--out", "x"], "positive integer"),
    (["compare", "--op", "matmul:m=4,n=4,k=4", "--strategies", "annealing@8", "--out", "x"], "unknown strategy"),
])
def test_cli_compare_bad_input_is_one_line_exit_2(argv, msg, capsys):
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_a_strategy_at_another_batch_runs_beside_itself_under_its_own_name(tmp_path, capsys):
    # "genetic@8" is the genetic search at 8 candidates per round, compared next to "genetic" (16 here)
    cmp = fj.compare(TASKS[:1], ["genetic", "genetic@8", "random@4"], trials=16, seeds=1, db=str(tmp_path / "b.db"),
                     replay=True, progress=True, remeasure=0, defaults=False,
                     strategy_options={"genetic": {"population": 128, "batch_size": 16}})
    assert cmp.strategies == ["genetic", "genetic@8", "random@4"]
    assert {r.run for r in fj.Database(tmp_path / "b.db").records()} >= {"genetic:0", "genetic@8:0"}
    err = capsys.readouterr().err  # one progress line per round: 16 trials are 1 round of 16, or 2 of 8
    assert " genetic:0: round 1 16/16 " in err and " genetic:0: round 2 " not in err
    assert " genetic@8:0: round 1 8/16 " in err and " genetic@8:0: round 2 16/16 " in err
    assert " random@4:0: round 4 16/16 " in err  # random search has no batch option: the attribute is set
    # the table says each batch, and names the learned strategy whose ratio mixes in another batch (session 76)
    assert cmp.batches == {"genetic": 16, "genetic@8": 8, "random@4": 4} and not cmp.shared_cache
    head = cmp.table().splitlines()[0]
    assert "Candidates per round: genetic 16, genetic@8 8, random@4 4. The ratios of genetic@8 mix" in head
    assert "One build cache" not in head
    with pytest.raises(ValueError, match="positive integer"):
        fj.compare(TASKS[:1], ["genetic@x"], trials=4, seeds=1, db=None, replay=True, progress=False)


def test_the_default_comparison_pairs_genetic_at_the_gradient_searchs_batch():
    # session 76: the default compared gradient at 32 per round with genetic at Ansor's 64 only
    from felixjax.compare import default_strategies
    from felixjax.strategies.gradient import GradientSearch

    batch = GradientSearch().batch_size
    assert default_strategies() == ["gradient", f"genetic@{batch}", "genetic", "random"] and batch == 32


def test_suite_ops_is_the_op_suite():
    from felixjax.suites import suite

    names = [t.name for t in suite("ops")]
    assert names == ["matmul_512x512x512", "matmul_1024x1024x1024", "conv2d_1x64x56x56_k64_3x3_s1_p1",
                     "conv2d_1x128x28x28_k128_3x3_s1_p1", "conv2d_1x256x14x14_k256_1x1_s1_p0",
                     "dwconv2d_1x256x28x28_k256_3x3_s1_p1", "dense_1x4096_1000"]


@pytest.mark.cc
def test_tiny_real_compare(runner, tmp_path):
    t = fj.ops.matmul(16, 16, 16)
    cmp = fj.compare([t], [small_genetic, "random"], trials=4, seeds=1, db=str(tmp_path / "real.db"), threads=1,
                     runner=runner, progress=False, out=str(tmp_path / "o"))
    for recs in cmp.histories.values():
        assert len(recs) == 4 and all(r.ok for r in recs)
    assert all(len(v) == 3 and all(x > 0 for x in v) for v in cmp.remeasured.values())
    assert not cmp.replay and "measured" in cmp.table()
    assert fj.Database(tmp_path / "real.db").runs() == ["genetic:0", "random:0"]
    # a measured comparison warms the JAX compilations up first, by default, outside every run's clock
    assert cmp.warmup_s > 0 and "JIT warm-up before the runs" in cmp.table()
    assert cmp.shared_cache and "One build cache for every run" in cmp.table()  # its seconds' caveat (session 76)


def test_cli_compare_run_caches_gives_each_run_its_own_build_cache(tmp_path, capsys):
    out = tmp_path / "res"
    assert cli(["compare", "--op", "matmul:m=8,n=8,k=8", "--strategies", "random", "--seeds", "2", "--trials", "2",
                "--threads", "1", "--warmup", "0", "--out", str(out), "--run-caches", "--quiet"]) == 0
    assert "One build cache" not in capsys.readouterr().out
    assert len(os.listdir(out / "caches")) == 2  # one per run


def test_the_jit_warm_up_draws_nothing_from_the_runs(tmp_path):
    # session 73: the warm-up is a throwaway replayed run; the runs after it propose what they would
    # without it, and neither the database nor the histories hold a record of it
    kw = {"trials": 24, "seeds": [0, 1], "replay": True, "progress": False, "remeasure": 0}
    plain = fj.compare(TASKS[:1], [small_genetic, "random"], db=None, **kw)
    assert plain.warmup_s == 0  # replayed comparisons have no warm-up unless asked
    db = str(tmp_path / "w.db")
    warm = fj.compare(TASKS[:1], [small_genetic, "random"], db=db, warmup=16, **kw)
    assert warm.warmup_s > 0 and "JIT warm-up before the runs" in warm.table()
    assert {k: [r.config for r in v] for k, v in warm.histories.items()} == \
        {k: [r.config for r in v] for k, v in plain.histories.items()}
    database = fj.Database(db)
    assert database.runs() == ["genetic:0", "genetic:1", "random:0", "random:1"] and len(database) == 4 * 24
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        fj.compare(TASKS[:1], ["random"], db=None, warmup=-1, **kw)


def test_a_resumed_comparison_keeps_the_finished_tasks_retimings(tmp_path):
    # resuming a long comparison must neither measure its finished runs again nor re-time their finals (a
    # second, later sample would replace the one taken beside the other runs when they ended)
    replays = []

    def factory(task, target):
        replays.append(ReplayRunner(SyntheticOracle(task, target)))
        return replays[-1]

    db = str(tmp_path / "r.db")
    kw = {"trials": 12, "db": db, "replay": factory, "progress": False, "remeasure": 2}
    first = fj.compare(TASKS[:1], ["random"], seeds=2, **kw)

    def retimes():
        return [r.run for r in fj.Database(db).records(retimes=True) if r.run.startswith("retime:")]

    assert sorted(retimes()) == ["retime:random:0", "retime:random:1"]
    replays.clear()
    again = fj.compare(TASKS[:1], ["random"], seeds=2, **kw)
    assert sum(len(r.calls) for r in replays) == 0
    assert again.remeasured == first.remeasured and sorted(retimes()) == ["retime:random:0", "retime:random:1"]
    # resumed, and replayed: nothing was built, so no word on build caches (session 79, a reproducibility review)
    assert not first.resumed and again.resumed and "Some runs were resumed" not in again.table()
    # a new run of the task (a third seed): every run of it is re-timed again, together
    third = fj.compare(TASKS[:1], ["random"], seeds=3, **kw)
    assert sorted(retimes()) == ["retime:random:0", "retime:random:0", "retime:random:1", "retime:random:1",
                                 "retime:random:2"]
    assert set(third.remeasured) == {(TASKS[0].name, "random", s) for s in range(3)}
    # session 72: resumed with a smaller budget, the runs are longer than the comparison says: refused
    with pytest.raises(ValueError, match="more than this comparison's budget of 8"):
        fj.compare(TASKS[:1], ["random"], seeds=3, **{**kw, "trials": 8})


class _CacheSpy:
    """A replay measurer with a ``cache_dir`` attribute, recording the folder each batch was measured with."""

    def __init__(self, task, target, seen):
        self.inner, self.seen, self.cache_dir = ReplayRunner.from_oracle(task, target), seen, None

    def measure(self, configs, on_result):
        self.seen.append(self.cache_dir)
        return self.inner.measure(configs, on_result)


def test_run_caches_give_every_run_a_build_cache_of_its_own(tmp_path):
    # session 33: with one shared build cache, a run proposing a kernel another run had compiled got it free;
    # with run_caches every batch of a run is built in that run's own folder (reference runs too)
    seen = []
    cmp = fj.compare(TASKS[:1], ["genetic@8", "random"], trials=16, seeds=2, db=None, progress=False, remeasure=0,
                     replay=lambda t, tg: _CacheSpy(t, tg, seen), reference=True, run_caches=tmp_path / "runs")
    runs = {f"{s}_{seed}" for s in cmp.strategies for seed in (0, 1)}
    folders = {p.name for p in seen}
    assert {p.parent for p in seen} == {tmp_path / "runs"}
    assert folders == runs | {f"reference_{r}" for r in runs}
    # without it the measurer keeps its own (here: none) for every run
    seen.clear()
    fj.compare(TASKS[:1], ["random"], trials=8, seeds=1, db=None, progress=False, remeasure=0,
               replay=lambda t, tg: _CacheSpy(t, tg, seen))
    assert seen and set(seen) == {None}


@pytest.mark.cc
def test_the_measurer_builds_into_its_cache_dir(tmp_path):
    from felixjax.measurer import Measurer

    class NoRun:  # the build is what is checked: no kernel is run
        def run(self, request, build):
            return MeasureResult("ok", (1e-3,), build_s=build.seconds)

    task = fj.ops.matmul(16, 16, 16)
    m = Measurer(task, TARGET, NoRun(), cache_dir=tmp_path / "a")
    cfgs = [next(iter(Space(task, sk, TARGET).default() for sk in sketches_for(task)))]
    m.measure(cfgs, lambda c, r: True)
    m.cache_dir = tmp_path / "b"
    m.measure(cfgs, lambda c, r: True)
    for d in ("a", "b"):  # the same kernel compiled once into each folder
        assert len(list((tmp_path / d).glob("*.so"))) == 1


def test_bootstrap_intervals_hold_the_point_and_narrow_with_agreeing_seeds():
    """``bootstrap_ratios``: every resample's geomean lies between the ratios of the extreme seeds, the
    interval holds the point estimate, seeds that agree give a zero-width interval, and more seeds of the
    same spread give a narrower one; ``Comparison.intervals`` feeds it each seed's reach."""
    from felixjax.compare import bootstrap_ratios

    def runs(grad, gen):
        same = [1.0] * len(grad)
        return {("t", "gradient"): {"trials95": grad, "seconds95": grad, "final": same},
                ("t", "genetic"): {"trials95": gen, "seconds95": gen, "final": same}}

    span = bootstrap_ratios(runs([10, 20, 40], [30, 60, 120]), "gradient", n=500)["genetic"]
    lo, hi = span["trials95"]
    assert 30 / 40 <= lo <= 3.0 <= hi <= 120 / 10 and lo < hi and span["final"] == pytest.approx((1.0, 1.0))
    assert bootstrap_ratios(runs([10, 10, 10], [30, 30, 30]), "gradient", n=200)["genetic"]["trials95"] == \
        pytest.approx((3.0, 3.0))
    wide = np.subtract(*bootstrap_ratios(runs([10, 20, 40], [30, 60, 120]), "gradient", n=2000)["genetic"]["trials95"])
    narrow = np.subtract(*bootstrap_ratios(runs([10, 20, 40] * 8, [30, 60, 120] * 8), "gradient",
                                           n=2000)["genetic"]["trials95"])
    assert abs(narrow) < abs(wide)
    with pytest.raises(ValueError, match="level"):
        bootstrap_ratios(runs([1], [1]), "gradient", level=1.0)
    # seed-paired: each seed's pair keeps its 3x ratio, so every resample is exactly 3x (unpaired: wide)
    assert bootstrap_ratios(runs([10, 20, 40], [30, 60, 120]), "gradient", n=500,
                            paired=True)["genetic"]["trials95"] == pytest.approx((3.0, 3.0))
    with pytest.raises(ValueError, match="paired"):
        bootstrap_ratios(runs([10, 20, 40], [30, 60, 120, 1][:3]) | {("t", "genetic"): {
            "trials95": [1, 2], "seconds95": [1, 2], "final": [1, 1]}}, "gradient", paired=True)

    t = TASKS[0]
    hist = dict([_fake(t, "gradient:0", [4.0, 2.0, 1.0]), _fake(t, "gradient:1", [1.0, 2.0, 2.0]),
                 _fake(t, "genetic:0", [4.0, 4.0, 4.0]), _fake(t, "genetic:1", [4.0, 1.0, 1.0])])
    cmp = Comparison([t], ["gradient", "genetic"], [0, 1], 3, None, hist)
    assert cmp.runs()[(t.name, "genetic")]["trials95"] == [3, 2]  # seed 0 censored at the 3 trials it spent
    lo, hi = cmp.intervals(n=400)["genetic"]["trials95"]
    assert lo <= cmp.ratios()["genetic"]["trials95"] <= hi and lo >= 2 / 3 - 1e-9 and hi <= 3.0 + 1e-9


def test_arms_that_propose_alike_stay_alike_seed_by_seed():
    """Common random numbers: each (strategy, seed) has its own model, but the models of one seed draw the
    same random numbers, so two arms under different names with the same options (a lever that never
    acts) make the same trials on the replay oracle: in the rounds after the first fine-tuning, and on a
    second task whose first round is ranked by a model fine-tuned on the first's (before session 51
    the model's seed came from the arm's name and the arms parted after the first round)."""
    from felixjax.strategies.gradient import GradientSearch

    def arm(name):
        g = GradientSearch(starts=16, steps=8)
        g.name = name
        return g

    cmp = fj.compare(TASKS, [arm("a"), arm("b")], trials=64, seeds=[0], db=None, replay=True,
                     progress=False, remeasure=0, defaults=False)
    for t in TASKS:
        a, b = ([r.config for r in cmp.histories[(t.name, s, 0)]] for s in "ab")
        assert len(a) == 64 and a == b


def test_curves_never_rise_when_a_seed_stops_early(tmp_path, monkeypatch):
    # session 74 (a user's review): the median was taken over the seeds still running, so a best-so-far line rose
    # where a good seed stopped early (trials panel) or before a slow seed started (seconds panel)
    import matplotlib.figure

    figs = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figs.append(self) or real(self, *a, **k))
    cmp = fj.compare([fj.ops.matmul(64, 64, 64)], ["random"], trials=64, seeds=4, db=None, progress=False,
                     replay=True, defaults=False)
    # a seed stops (as an early stop would end it) at a trial where the median of the others is above the median
    # of all: a median over the seeds still running would rise there
    best = {k: np.minimum.accumulate([r.latency_s for r in h]) for k, h in cmp.histories.items()}
    key, t = next((k, t) for t in range(1, 63) for k in best
                  if np.median([best[j][t + 1] for j in best if j != k]) > np.median([best[j][t] for j in best]))
    cmp.histories[key] = cmp.histories[key][: t + 1]
    cmp.plot(tmp_path / "c.png")
    lines = [ln.get_ydata() for ax in figs[0].axes for ln in ax.get_lines() if len(ln.get_ydata()) > 2]
    assert lines
    for y in lines:
        y = np.asarray(y, float)
        y = y[np.isfinite(y)]
        assert (np.diff(y) <= 1e-12).all()


def test_each_seed_is_drawn_where_the_median_is_not_yet_defined(tmp_path, monkeypatch):
    # session 79 (a review of the outputs): with 2 seeds the median is inf until both have a kernel, so a seed that
    # reached 95% early was invisible in the seconds panel; each seed is now a thin line beside the median
    import dataclasses

    import matplotlib.figure

    from codegen.measure import MeasureResult

    figs = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **k: figs.append(self) or real(self, *a, **k))
    cmp = fj.compare([fj.ops.matmul(64, 64, 64)], ["random"], trials=32, seeds=2, db=None, progress=False,
                     replay=True, defaults=False)
    key = next(iter(cmp.histories))
    cmp.histories[key] = [dataclasses.replace(r, result=MeasureResult("runtime_error", error="x")) if i < 20 else r
                          for i, r in enumerate(cmp.histories[key])]  # one seed without a kernel for 20 trials
    cmp.plot(tmp_path / "c.png")
    for ax in figs[0].axes:
        ys = [np.asarray(ln.get_ydata(), float) for ln in ax.get_lines() if len(ln.get_ydata()) > 2]
        assert len(ys) == 3  # two seeds and their median
        median, seeds = ys[-1], ys[:-1]
        early = ~np.isfinite(median)
        assert early.any() and any(np.isfinite(s[early]).any() for s in seeds)
        assert len({ln.get_linestyle() for ln in ax.get_lines() if len(ln.get_ydata()) > 2}) == 1  # one strategy


def test_a_task_without_a_correct_kernel_reaches_nothing_and_leaves_the_ratios():
    # session 76: inf <= inf / 0.95 made an all-failed op "reached 2/2 in 1 trial", and the geomean was its alone
    import math

    from felixjax.testing import ReplayRunner, SyntheticOracle

    conv = fj.ops.conv2d(1, 8, 8, 8, out_channels=8, kernel=3, padding=1)

    def measurer(task, target):
        return ReplayRunner(lambda c: math.inf) if task == conv else ReplayRunner(SyntheticOracle(task, target))

    cmp = fj.compare([TASKS[0], conv], [small_genetic, "random"], trials=16, seeds=2, db=None, replay=measurer,
                     progress=False, remeasure=0, defaults=False)
    row = next(r for r in cmp.rows() if r["task"] == conv.name and r["strategy"] == "random")
    assert row["reached"] == 0 and row["trials95_censored"] and row["failed"] == 16
    assert f"| {conv.name} | random | inf | inf | >16 |" in cmp.table() and "| 0/2 | 16 |" in cmp.table()
    assert cmp.failed() == [conv.name]
    r = cmp.ratios()["random"]
    assert r["tasks"] == 1 and r["failed"] == [conv.name]
    assert f"left out (no correct kernel): {conv.name}" in cmp.table()
    assert all(t != conv.name for t, _ in cmp.runs())
    only = fj.compare([conv], [small_genetic, "random"], trials=8, seeds=1, db=None, replay=measurer,
                      progress=False, remeasure=0, defaults=False)
    assert only.ratios() == {} and "No ratios: every task is set apart" in only.table()


def test_the_warm_up_covers_every_task(monkeypatch):
    # session 76: the warm-up ran on the first task only, and a conv's first gradient round after a matmul's
    # warm-up still compiled 1.4 s of its own in its clock
    import sys

    cmp_mod = sys.modules["felixjax.compare"]  # the module (fj.compare is the function)
    calls = []
    inner = cmp_mod.compare

    def spy(tasks, *a, **kw):
        calls.append(([t.name for t in cmp_mod._as_tasks(tasks)], kw.get("trials")))
        return inner(tasks, *a, **kw)

    monkeypatch.setattr(cmp_mod, "compare", spy)
    c = fj.compare(TASKS, ["random"], trials=4, seeds=1, db=None, replay=True, progress=False, remeasure=0,
                   warmup=40)
    assert calls[-2:] == [([TASKS[0].name], 40), ([t.name for t in TASKS[1:]], cmp_mod.WARMUP_LATER)]
    assert c.warmup_s > 0 and "JIT warm-up before the runs (every task)" in c.table()


def test_a_strategy_without_a_kernel_where_the_reference_had_one_is_said_under_the_table():
    # session 76 (a code review): its infinite final ratio fell out of the geomean silently, flattering it
    from codegen.measure import MeasureResult
    from felixjax.compare import Comparison
    from felixjax.database import TuningRecord

    a, b = TASKS

    def run(task, name, lats):
        return [TuningRecord(task, "k", f"{name}:0", i, f"{name}{i}",
                             MeasureResult("ok", (lat,)) if lat else MeasureResult("wrong_result"), float(i + 1))
                for i, lat in enumerate(lats)]

    hist = {(a.name, "gradient", 0): run(a, "gradient", [2.0, 1.0]), (a.name, "genetic", 0): run(a, "genetic", [2.0, 1.5]),
            (b.name, "gradient", 0): run(b, "gradient", [3.0, 3.0]), (b.name, "genetic", 0): run(b, "genetic", [0, 0])}
    cmp = Comparison([a, b], ["gradient", "genetic"], [0], 2, None, hist)
    r = cmp.ratios()["genetic"]
    assert r["nokernel"] == 1 and r["final"] == pytest.approx(1.5)  # the geomean over the one finite ratio
    assert "genetic: no correct kernel on 1 task(s) where gradient had one" in cmp.table()
    # neither had one there (a third strategy did): nothing to say about genetic against gradient
    hist[(b.name, "gradient", 0)] = run(b, "gradient", [0, 0])
    hist[(b.name, "random", 0)] = run(b, "random", [3.0, 3.0])
    hist[(a.name, "random", 0)] = run(a, "random", [2.0, 2.0])
    both = Comparison([a, b], ["gradient", "genetic", "random"], [0], 2, None, hist)
    assert both.ratios()["genetic"]["nokernel"] == 0 and "genetic: no correct kernel" not in both.table()


def test_a_resume_with_a_smaller_seconds_budget_is_refused_and_the_same_budget_resumes(tmp_path):
    """Session 82, a review: the trials check had no seconds twin; a comparison resumed with ``seconds=3`` over
    runs of 12 s returned them, its table saying '3 s'. A run stops with the trial that spends its seconds, so
    the same budget resumes with nothing new."""
    kw = {"strategies": ["random"], "seeds": 1, "db": str(tmp_path / "cmp.db"), "replay": True, "progress": False,
          "warmup": 0, "trials": 64, "remeasure": 0}
    first = fj.compare(TASKS[:1], seconds=4, **kw)
    hist = first.histories[(TASKS[0].name, "random", 0)]
    assert 1 < len(hist) < 64 and hist[-1].elapsed_s >= 4 > hist[-2].elapsed_s  # stopped by the seconds
    again = fj.compare(TASKS[:1], seconds=4, **kw)
    assert len(again.histories[(TASKS[0].name, "random", 0)]) == len(hist)
    # a second tuner sharing the run stops with its own trial past the seconds (a code review: refused)
    last = hist[-1]
    other = next(c for c in (Space(TASKS[0], sk, TARGET).sample(np.random.default_rng(9)) for sk in
                             sketches_for(TASKS[0])) if c not in {r.config for r in hist})
    with fj.Database(kw["db"]) as db:
        db.add(dataclasses.replace(last, id=None, config=other, elapsed_s=last.elapsed_s + 0.01), number=True)
    assert len(fj.compare(TASKS[:1], seconds=4, **kw).histories[(TASKS[0].name, "random", 0)]) == len(hist) + 1
    with pytest.raises(ValueError, match="past this comparison's budget of 1 s"):
        fj.compare(TASKS[:1], seconds=1, **kw)


@pytest.mark.parametrize("bad, match", [({"trials": "8"}, "trials must be an integer"),
                                        ({"remeasure": -1}, "remeasure must be an integer >= 0"),
                                        ({"threads": 0}, "threads must be an integer >= 1"),
                                        ({"threads": True}, "threads must be an integer >= 1"),
                                        ({"remeasure": True}, "remeasure must be an integer >= 0"),
                                        ({"out": "FILE"}, "is a file, not a folder")])
def test_bad_arguments_are_refused_before_any_tuning(bad, match, tmp_path):
    """Session 82, a review: ``out=`` naming a file failed after the whole comparison (its result lost with
    db=None); ``trials="8"`` was a TypeError; ``remeasure=-1`` and ``threads=0`` passed."""
    if bad.get("out") == "FILE":
        (tmp_path / "f").write_text("")
        bad = {"out": str(tmp_path / "f")}
    with pytest.raises(ValueError, match=match):
        fj.compare(TASKS[:1], ["random"], **{"trials": 8, "seeds": 1, "db": None, "replay": True, "progress": False,
                                             "warmup": 0, **bad})
