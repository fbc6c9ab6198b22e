"""``benchmarks/compare.py --summarize --db ...``: the finished ops of several comparison databases (or
their JSONL exports) pooled into one table and one geomean, as issue 15's halves are judged over both
suites (replay oracle only); and ``benchmarks/timing_spread.py``, which reads such a database for how far
one kernel's timings spread."""
import argparse
import gzip
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import felixjax as fj
from felixjax.compare import from_database
from felixjax.strategies.genetic import GeneticSearch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import compare as script  # noqa: E402

A, B = fj.ops.matmul(64, 48, 32), fj.ops.matmul(32, 32, 24)
OPS = "matmul:m=64;n=48;k=32,matmul:m=32;n=32;k=24"
KW = dict(trials=12, seeds=2, replay=True, progress=False, remeasure=2, defaults=False, reference=True)
STRATS = ["genetic", "random"]


def small_genetic():
    return GeneticSearch(population=128, batch_size=8)


def _summarize(tmp_path, *dbs, margins=None, csv_out=None):
    argv = ["--summarize", "--replay", "--ops", OPS, "--strategies", ",".join(STRATS), "--seeds", "2",
            "--trials", "12", "--out", str(tmp_path / "out")] + (["--margins", margins] if margins else [])
    argv += ["--csv-out", str(csv_out)] if csv_out else []
    for db in dbs:
        argv += ["--db", str(db)]
    return script.main(argv)


def test_summarize_pools_the_finished_ops_of_several_databases(tmp_path, capsys):
    fj.compare([A], [small_genetic, "random"], db=str(tmp_path / "a.db"), **KW)
    fj.compare([B], [small_genetic, "random"], db=str(tmp_path / "b.db"), **KW)
    # the second as docs/data ships it: a gzipped JSONL export
    with fj.Database(tmp_path / "b.db", readonly=True) as db:
        db.export_jsonl(tmp_path / "b.jsonl")
    with open(tmp_path / "b.jsonl", "rb") as src, gzip.open(tmp_path / "b.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)

    assert _summarize(tmp_path, tmp_path / "a.db") == 0
    alone = capsys.readouterr().out
    assert "1 of 2 op(s) finished" in alone and f"not yet: {B.name}" in alone

    assert _summarize(tmp_path, tmp_path / "a.db", tmp_path / "b.jsonl.gz", margins="0.8",
                      csv_out=tmp_path / "pooled.csv") == 0
    pooled = capsys.readouterr().out
    # --csv-out: the pooled runs' per-trial CSV: both ops, two seeds of each strategy
    from benchmarks import ratio_intervals
    runs = ratio_intervals.runs_from_csv(tmp_path / "pooled.csv")
    assert {t for t, _ in runs} == {A.name, B.name} and all(len(c["trials95"]) == 2 for c in runs.values())
    assert pooled.startswith("Comparison pooled from") and "2 of 2 op(s) finished." in pooled
    assert "Geomean over 2 task(s)" in pooled and "not yet" not in pooled
    # each op's rows are those its own database gives
    for task, db in ((A, "a.db"), (B, "b.db")):
        own, _ = from_database(tmp_path / db, [task], STRATS, [0, 1], 12, replay=True, defaults=False)
        for row in own.rows():
            line = f"| {row['task']} | {row['strategy']} | {row['final_ms']:.4g} |"
            assert line in pooled
    assert (tmp_path / "out" / "curves_partial.png").exists()
    # --margins: no gradient run here, so no ratio to show (test_reach_frac_moves_the_bar has one)
    assert "(needs both gradient and genetic)" in pooled[pooled.index("Sensitivity"):]


def test_reach_frac_moves_the_bar():
    """``Comparison.reach_frac``: a run has reached when its latency is <= best known / reach_frac."""
    import dataclasses

    from codegen.measure import MeasureResult
    from felixjax.compare import Comparison
    from felixjax.database import TuningRecord

    recs = [TuningRecord(A, "k", "gradient:0", i, f"c{i}", MeasureResult("ok", (lat,)), float(i + 1))
            for i, lat in enumerate([2.0, 1.5, 1.0])]
    cmp = Comparison([A], ["gradient"], [0], 3, None, {(A.name, "gradient", 0): recs})
    at = {f: dataclasses.replace(cmp, reach_frac=f).reach(A.name, "gradient", 0)["trials"] for f in (0.95, 0.6, 0.5)}
    assert cmp.reach_frac == 0.95 and at == {0.95: 3, 0.6: 2, 0.5: 1}  # 1.5 <= 1/0.6; 2.0 <= 1/0.5
    # compare.py --margins: genetic needs 3 trials at 0.95 (gradient 2 here), 2 at 0.6 (gradient 2)
    def run(name, lats):
        return [TuningRecord(A, "k", f"{name}:0", i, f"{name}{i}", MeasureResult("ok", (lat,)), float(i + 1))
                for i, lat in enumerate(lats)]

    two = Comparison([A], ["gradient", "genetic"], [0], 3, None,
                     {(A.name, "gradient", 0): run("gradient", [2.0, 1.0, 1.0]),
                      (A.name, "genetic", 0): run("genetic", [2.0, 1.5, 1.0])})
    rows = "\n".join(script.margin_table(two, [0.6]))
    assert "| 0.95 | 0 | 1 of 1 | 1.50x | 1.50x | none |" in rows and "| 0.6 | 0 | 1 of 1 | 1.00x | 1.00x |" in rows
    # compare.py --intervals: one seed each, so every resample is the point itself
    spans = "\n".join(script.interval_table(two, 50))
    assert "| genetic | 1.50x [1.50, 1.50] | 1.50x [1.50, 1.50] | 1.00x [1.00, 1.00] |" in spans


def test_db_needs_summarize_and_one_half(tmp_path):
    with pytest.raises(SystemExit):
        script.parse_args(["--db", str(tmp_path / "x.db")])
    with pytest.raises(SystemExit):
        script.parse_args(["--summarize", "--defaults", "both", "--db", str(tmp_path / "x.db")])
    with pytest.raises(SystemExit):
        script.parse_args(["--intervals", "100"])
    with pytest.raises(SystemExit):
        script.parse_args(["--csv-out", str(tmp_path / "x.csv")])
    for bad in ("x", "0", "1.5"):
        with pytest.raises(SystemExit):
            script.parse_args(["--summarize", "--margins", bad])
    for bad in (["--truth"], ["--summarize", "--truth"], ["--replay", "--truth"], ["--replay-noise", "0.1"], ["--replay", "--replay-noise", "-1"],
                ["--replay", "--replay-noise", "0.1", "--write"]):
        with pytest.raises(SystemExit):
            script.parse_args(bad)
    assert _summarize(tmp_path, tmp_path / "missing.db") == 1


def test_replay_noise_reaches_the_comparison(tmp_path):
    """``--replay --replay-noise`` hands fj.compare the oracle timed with noise; without it, the oracle."""
    assert script._replay(script.parse_args(["--ops", OPS])) is None
    assert script._replay(script.parse_args(["--replay", "--ops", OPS])) is True
    factory = script._replay(script.parse_args(["--replay", "--replay-noise", "0.2", "--ops", OPS]))
    runner = factory(A, fj.Target.cpu())
    assert runner.latency.sigma == 0.2
    cfg = runner.latency.latency.spaces[0].default()
    assert runner.result(cfg).latency_s >= runner.latency.latency(cfg)


def test_truth_judges_the_same_picks_by_the_oracle(tmp_path):
    """``--truth``: every record at the oracle's latency of its config, each final at the true latency of the
    config its run ended on (its lowest timing's); noise-free, the comparison unchanged."""
    from felixjax.testing import ReplayRunner, SyntheticOracle

    target = fj.Target.cpu()
    kw = dict(KW, remeasure=1)
    clean = fj.compare([A], [small_genetic, "random"], db=None, **kw)
    same = script.judged_by_truth(clean, target)
    assert same.table() == clean.table() and same.ratios() == clean.ratios()
    kw["replay"] = lambda task, tg: ReplayRunner.from_oracle(task, tg, noise=0.3)
    noisy = fj.compare([A], [small_genetic, "random"], db=None, **kw)
    truth = script.judged_by_truth(noisy, target)
    oracle = SyntheticOracle(A, target)
    for key, recs in {**noisy.histories, **noisy.references}.items():
        seen = {**truth.histories, **truth.references}[key]
        assert [r.config for r in seen] == [r.config for r in recs]
        assert [r.latency_s for r in seen] == pytest.approx(list(oracle.latencies([r.config for r in recs])))
        assert all(a.latency_s <= b.latency_s for a, b in zip(seen, recs))  # the noise only slowed
        picked = min(recs, key=lambda r: r.latency_s).config
        assert truth.remeasured[key] == pytest.approx([oracle(picked)])
    assert truth.table() != noisy.table()


def test_ratio_intervals_reads_the_reference_runs_as_a_comparison_at_twice_the_budget(tmp_path):
    """``--references``: the 2x-budget reference runs as the arms (by their strategies' names), 95% of the same
    best, each final its own re-timing; the compared runs' tables unchanged beside them."""
    from benchmarks import ratio_intervals
    from felixjax.compare import REACH

    cmp = fj.compare([A, B], [small_genetic, "random"], db=None, **dict(KW, remeasure=1))
    path = Path(cmp.to_csv(tmp_path / "cmp.csv"))
    plain = ratio_intervals.runs_from_csv(path)
    assert {k: v["trials95"] for k, v in plain.items()} == {k: v["trials95"] for k, v in cmp.runs().items()}
    refs = ratio_intervals.runs_from_csv(path, references=True)
    assert set(refs) == set(cmp.runs())
    for (task, name), cell in refs.items():
        bar = cmp.best_known(task) / REACH
        want = []
        for seed in cmp.seeds:
            recs = cmp.references[(task, "reference:" + name, seed)]
            assert len(recs) == 2 * cmp.trials
            want.append(next((i for i, r in enumerate(recs) if r.ok and r.latency_s <= bar), len(recs) - 1) + 1)
        assert cell["trials95"] == want
        assert cell["final"] == pytest.approx([float(np.median(cmp.remeasured[(task, "reference:" + name, s)]))
                                               for s in cmp.seeds])
    assert ratio_intervals.main(["--csv", str(path), "--ref", "random", "--references", "--n", "50"]) == 0


def test_timing_spread_of_one_kernel_and_of_the_re_timed_finals():
    """``benchmarks/timing_spread.py``: one config's timings across runs (median / lowest, highest / lowest)
    and each run's re-timed final best over its best while tuning, on hand-made records."""
    from dataclasses import dataclass

    from benchmarks.timing_spread import spread, table
    from codegen.measure import MeasureResult
    from felixjax.database import TuningRecord

    @dataclass(frozen=True)
    class Cfg:
        sketch: str
        name: str

    c0, c1 = Cfg("s", "c0"), Cfg("s", "c1")

    def rec(run, cfg, *lats, status="ok"):
        return TuningRecord(A, "k", run, 0, cfg, MeasureResult(status, tuple(lats), error="" if lats else "x"))

    records = [rec("r0", c0, 1.0), rec("r0", c1, 0.8), rec("r1", c0, 1.2), rec("r2", c0, 1.5),
               rec("r2", c1, status="runtime_error"),  # a failure counts for nothing
               rec("retime:r0", c1, 0.9, 1.0, 1.1), rec("retime:r1", c0, 1.2)]
    got = spread(records, min_runs=3)[A.name]
    assert got["configs"] == 1  # c1 was timed in one run only
    assert got["median_over_low"] == pytest.approx(1.2) and got["high_over_low"] == pytest.approx(1.5)
    # r0: re-timed 1.0 over its best 0.8; r1: 1.2 over 1.2; r2 was never re-timed
    assert got["runs"] == 2 and got["retime_over_best"] == pytest.approx((1.25 + 1.0) / 2)
    assert f"| {A.name} | 1 | 1.200 | 1.500 | 1.125 (2 runs) |" in table({A.name: got}, 3)


def test_ratio_intervals_reads_a_comparison_csv_as_the_comparison_reads_itself(tmp_path, capsys):
    """``benchmarks/ratio_intervals.py``: from a comparison's per-trial CSV (gzipped or not), the same reach,
    medians and geomean ratios as :meth:`Comparison.ratios`, and an interval that holds them."""
    from benchmarks import ratio_intervals
    from codegen.measure import MeasureResult
    from felixjax.compare import Comparison
    from felixjax.database import TuningRecord

    def run(task, name, seed, lats):
        return [TuningRecord(task, "k", f"{name}:{seed}", i, f"{name}{i}", MeasureResult("ok", (lat,)), 0.5 * (i + 1))
                for i, lat in enumerate(lats)]

    hist = {(A.name, "gradient", 0): run(A, "gradient", 0, [3.0, 1.0, 1.0]),
            (A.name, "gradient", 1): run(A, "gradient", 1, [1.0, 2.0, 2.0]),
            (A.name, "genetic", 0): run(A, "genetic", 0, [3.0, 3.0, 1.02]),
            (A.name, "genetic", 1): run(A, "genetic", 1, [3.0, 3.0, 3.0]),  # censored at 3
            (B.name, "gradient", 0): run(B, "gradient", 0, [2.0, 2.0, 2.0]),
            (B.name, "gradient", 1): run(B, "gradient", 1, [4.0, 2.0, 2.0]),
            (B.name, "genetic", 0): run(B, "genetic", 0, [2.0, 2.0, 2.0]),
            (B.name, "genetic", 1): run(B, "genetic", 1, [2.0, 2.0, 2.0])}
    cmp = Comparison([A, B], ["gradient", "genetic"], [0, 1], 3, None, hist)
    path = Path(cmp.to_csv(tmp_path / "cmp.csv"))
    with open(path, "rb") as f, gzip.open(tmp_path / "cmp.csv.gz", "wb") as g:
        g.write(f.read())
    runs = ratio_intervals.runs_from_csv(tmp_path / "cmp.csv.gz")
    assert runs == {k: v for k, v in cmp.runs().items()}
    want, got = cmp.ratios()["genetic"], ratio_intervals.point_ratios(runs, "gradient")["genetic"]
    assert got["trials95"] == pytest.approx(want["trials95"]) and got["final"] == pytest.approx(want["final"])
    assert ratio_intervals.main(["--csv", str(path), "--ref", "gradient", "--n", "200"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| genetic |"))
    assert f"| 2 | 2 | {want['trials95']:.2f}x [" in line
    # --early: runs at 95% within the first trials (trials to 95%: gradient 2, 1 | 1, 2; genetic 3, 3 censored | 1, 1)
    table = ratio_intervals.early_table(runs, within=(1, 2)).splitlines()
    assert table[2:] == ["| genetic | 4 | 2 | 2 | 2 |", "| gradient | 4 | 2 | 4 | 1.5 |"]
    assert ratio_intervals.main(["--csv", str(path), "--ref", "gradient", "--n", "50", "--early"]) == 0
    assert "| gradient | 4 | 4 | 4 | 4 | 1.5 |" in capsys.readouterr().out
    # --per-op: genetic's runs on A reach 95% on their last trial or never (both count as not reached)
    rows = {r.split(" | ")[0][2:]: r for r in ratio_intervals.per_op_table(runs, "gradient").splitlines()[2:]}
    assert rows[A.name].startswith(f"| {A.name} | 1.5 (2/2) | >3 (0/2) | ")
    assert rows[B.name] == f"| {B.name} | 1.5 (2/2) | 1 (2/2) | 1.000 |"
    with pytest.raises(SystemExit):
        ratio_intervals.main(["--csv", str(path), "--ref", "nope"])
    # --ops: one op's prefix keeps that op alone; its ratio is that op's median ratio (A: genetic 3 / gradient 1.5)
    capsys.readouterr()
    assert ratio_intervals.main(["--csv", str(path), "--ref", "gradient", "--n", "50", "--ops", A.name]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| genetic |"))
    assert line.startswith("| genetic | 1 | 2 | 2.00x [") and not B.name.startswith(A.name)
    with pytest.raises(SystemExit):
        ratio_intervals.main(["--csv", str(path), "--ref", "gradient", "--ops", "nope"])


def test_ratio_intervals_arms_pools_files_whose_other_arms_differ(tmp_path, capsys):
    """``--arms``: files with different extra arms pool, paired, on the arms they share; each file's 95% is
    still taken against all of its arms (an extra arm's better best moves the shared arms' reach)."""
    from benchmarks import ratio_intervals
    from codegen.measure import MeasureResult
    from felixjax.compare import Comparison
    from felixjax.database import TuningRecord

    def run(name, seed, lats):
        return [TuningRecord(A, "k", f"{name}:{seed}", i, f"{name}{i}", MeasureResult("ok", (lat,)), 0.5 * (i + 1))
                for i, lat in enumerate(lats)]

    def csv(tmp, arms):
        hist = {(A.name, name, s): run(name, s, lats) for name, per_seed in arms.items()
                for s, lats in enumerate(per_seed)}
        return str(Comparison([A], list(arms), [0, 1], 3, None, hist).to_csv(tmp))

    base = {"gradient": [[2.0, 1.0, 1.0], [1.0, 1.0, 1.0]], "genetic": [[2.0, 2.0, 1.0], [2.0, 1.0, 1.0]]}
    plain = csv(tmp_path / "a.csv", base)
    faster = csv(tmp_path / "b.csv", {**base, "extra": [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]})
    for bad in ([], ["--arms", "genetic,nope"]):  # without --arms the extra arm's runs do not pair; unknown arms
        with pytest.raises(SystemExit):
            ratio_intervals.main(["--csv", plain, "--csv", faster, "--ref", "gradient", "--n", "50", "--paired", *bad])
    assert "--arms" in capsys.readouterr().err
    assert ratio_intervals.main(["--csv", plain, "--csv", faster, "--ref", "gradient", "--arms", "genetic",
                                 "--n", "50", "--paired", "--early"]) == 0
    out = capsys.readouterr().out
    assert "| extra |" not in out
    assert "| genetic | 1 | 4 | " in out  # one op, 4 runs per arm (2 seeds x 2 files)
    # a.csv: gradient reaches 95% at trials 2, 1, genetic at 3, 2; b.csv: none reaches 0.5 / 0.95 (censored at 3).
    # Against the shared arms alone b.csv would repeat a.csv (medians 1.5 and 2.5).
    assert "| genetic | 4 | 4 | 4 | 4 | 3 |" in out and "| gradient | 4 | 4 | 4 | 4 | 2.5 |" in out


def test_ratio_intervals_bound_rewrites_the_ref_runs_as_a_perfect_lever_would():
    """``--bound`` (session 68): each bound moves a run's first trial within 95% where a perfect lever would have
    put it, and leaves the other arms as measured."""
    from benchmarks.ratio_intervals import bounded

    miss, late, early, never = [False] * 6, [False, False, False, False, True, False], [False, True] + [False] * 4, []
    #         first round: trials 0-1 (batch 2); a hit at 4 is in the third round, a hit at 1 in the first
    assert [bounded(h, "later-rounds", 2) for h in (miss, late, early)] == [2, 2, 1]
    assert [bounded(h, "first-order", 2) for h in (miss, late, early)] == [None, 4, 0]
    assert [bounded(h, "every-order", 2) for h in (miss, late, early)] == [None, 4, 0]
    assert [bounded(h, "both", 2) for h in (miss, late, early)] == [2, 2, 0]
    assert bounded([False, False], "later-rounds", 2) is None and bounded(never, "both", 2) is None  # no second round
    # rest-order: only a first-round hit after the first chunk moves, to the chunk's end (rounds of 4, chunks of 2)
    assert [bounded(h, "rest-order", 4, 2) for h in ([False] * 3 + [True], [False, True, True], late)] == [2, 1, 4]
    assert [bounded(h, "oracle", 2) for h in (miss, late, early, never)] == [0, 0, 0, None]  # nothing measured: None
    with pytest.raises(ValueError, match="unknown bound"):
        bounded(late, "perfect", 2)


def _bound_csv(tmp_path) -> str:
    """One op, two seed-paired runs of 4 trials per arm: gradient reaches 95% at trial 4 and 2, genetic at 4 and 4."""
    from codegen.measure import MeasureResult
    from felixjax.compare import Comparison
    from felixjax.database import TuningRecord

    def run(name, seed, lats):
        return [TuningRecord(A, "k", f"{name}:{seed}", i, f"{name}{i}", MeasureResult("ok", (lat,)), 0.5 * (i + 1))
                for i, lat in enumerate(lats)]

    arms = {"gradient": [[2.0, 2.0, 2.0, 1.0], [2.0, 1.0, 2.0, 2.0]], "genetic": [[2.0, 2.0, 2.0, 1.0]] * 2}
    hist = {(A.name, name, s): run(name, s, lats) for name, per_seed in arms.items() for s, lats in enumerate(per_seed)}
    return str(Comparison([A], list(arms), [0, 1], 4, None, hist).to_csv(tmp_path / "cmp.csv"))


def test_ratio_intervals_bound_moves_only_the_ref_arm(tmp_path, capsys):
    from benchmarks import ratio_intervals

    path = _bound_csv(tmp_path)
    runs = ratio_intervals.runs_from_csv(Path(path), bound="both", of="gradient", batch=2)
    assert runs[(A.name, "gradient")]["trials95"] == [3, 1]  # a miss in round one: trial 3; a late hit in it: trial 1
    assert runs[(A.name, "gradient")]["seconds95"] == [1.5, 0.5]  # the run's own clock at the rewritten trial
    assert runs[(A.name, "genetic")]["trials95"] == [4, 4]  # as measured (bounded, both would be 3)
    assert ratio_intervals.main(["--csv", path, "--ref", "gradient", "--n", "50", "--bound", "first-order",
                                 "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "gradient bounded: first-order (rounds of 2)" in out
    assert "| genetic | 1 | 2 | 1.60x [" in out  # genetic 4 / gradient median(4: no hit in round one, 1) = 2.5
    with pytest.raises(SystemExit):
        ratio_intervals.main(["--csv", path, "--ref", "gradient", "--bound", "both", "--batch", "0"])
    # --settled: with rounds of 2, one of the 4 runs reaches 95% in its first round (settled later); rounds of 4: all
    assert ratio_intervals.settled_first(ratio_intervals.runs_from_csv(Path(path)), 2) == set()
    assert ratio_intervals.settled_first(ratio_intervals.runs_from_csv(Path(path)), 4) == {A.name}
    assert ratio_intervals.main(["--csv", path, "--ref", "gradient", "--n", "50", "--batch", "2", "--settled", "later",
                                 "--bound", "both"]) == 0
    assert "| genetic | 1 | 2 | 2.00x [" in capsys.readouterr().out  # genetic 4 / gradient median(3, 1)
    with pytest.raises(SystemExit):
        ratio_intervals.main(["--csv", path, "--ref", "gradient", "--batch", "2", "--settled", "first"])


def test_lever_bounds_tabulates_every_bound_split_by_the_round_that_settles_an_op(tmp_path, capsys):
    """``benchmarks/lever_bounds.py``: a row per bound (and per split of the ops) with ``ratio_intervals``' numbers
    for the same rewrite, and a plot."""
    from benchmarks import lever_bounds

    path = _bound_csv(tmp_path)
    rows = lever_bounds.bound_rows([Path(path)], "gradient", batch=2, chunk=1, n=50)
    got = {(r["bound"], r["ops"]): r["genetic"]["trials95"][0] for r in rows}
    # measured: genetic 4 / gradient median(4, 2); both: gradient 3, 1; first-order: 4, 1; later-rounds: 3, 2;
    # every-order: 3, 1; rest-order (chunks of 1): the first round's second trial is its rest, where seed 1 hit: 4, 2
    assert got == pytest.approx({("measured", "all"): 4 / 3, ("measured", "later"): 4 / 3,
                                 ("both", "all"): 2.0, ("both", "later"): 2.0,
                                 ("first-order", "all"): 1.6, ("first-order", "later"): 1.6,
                                 ("later-rounds", "all"): 1.6, ("later-rounds", "later"): 1.6,
                                 ("rest-order", "all"): 4 / 3, ("rest-order", "later"): 4 / 3,
                                 ("every-order", "all"): 2.0, ("every-order", "later"): 2.0,
                                 ("oracle", "all"): 4.0, ("oracle", "later"): 4.0})
    png = tmp_path / "b.png"
    assert lever_bounds.main(["--csv", path, "--ref", "gradient", "--batch", "2", "--chunk", "1", "--n", "50",
                              "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| both: first-order and later-rounds together | settled later (1) | 2.00x [" in out
    assert png.stat().st_size > 1000
    assert lever_bounds.first_result_seconds([Path(path)]) == {"genetic": 0.5, "gradient": 0.5}
    assert "first result at (median over runs): genetic 0.50 s, gradient 0.50 s" in out
    with pytest.raises(SystemExit):
        lever_bounds.main(["--csv", path, "--ref", "nope"])


def test_lever_bounds_others_rewrites_every_other_arm_in_every_row(tmp_path, capsys):
    """Session 72: ``--others first-order`` gives the other arms the same perfect first-round order in every row (a
    better ranking by the cost model every arm shares), while ``--ref`` is rewritten row by row as before."""
    from benchmarks import lever_bounds

    path = _bound_csv(tmp_path)
    # rounds of 4: genetic hits at trial 4 in both seeds, inside its first round; gradient at trials 4 and 2
    plain = {r["bound"]: r["genetic"]["trials95"][0]
             for r in lever_bounds.bound_rows([Path(path)], "gradient", batch=4, chunk=1, n=50) if r["ops"] == "all"}
    shared = {r["bound"]: r["genetic"]["trials95"][0]
              for r in lever_bounds.bound_rows([Path(path)], "gradient", batch=4, chunk=1, n=50, others="first-order")
              if r["ops"] == "all"}
    assert plain["measured"] == pytest.approx(4 / 3) and plain["first-order"] == pytest.approx(4.0)
    assert shared["measured"] == pytest.approx(1 / 3)  # genetic at its first trial against gradient's median 3
    assert shared["first-order"] == pytest.approx(1.0) and shared["oracle"] == pytest.approx(1.0)
    assert shared["later-rounds"] == pytest.approx(1 / 3)  # gradient's hits lie in its first round: nothing to move
    assert lever_bounds.main(["--csv", path, "--ref", "gradient", "--batch", "4", "--chunk", "1", "--n", "50",
                              "--others", "first-order"]) == 0
    out = capsys.readouterr().out
    assert "the other arms rewritten as first-order" in out
    assert "| first-order: the first round's picks in a perfect order | settled in round 1 (1) | 1.00x [" in out
    with pytest.raises(SystemExit):
        lever_bounds.main(["--csv", path, "--ref", "gradient", "--others", "nope"])


def test_bounds_hold_the_shared_opening_where_it_is():
    """Session 69: in runs that measured the defaults first (``opening`` trials at the head of the first round) a
    perfect lever reorders only the search's own picks, and a run the opening took within 95% stays as measured."""
    from benchmarks.ratio_intervals import BOUNDS, bounded

    in_round, opened = [False] * 3 + [True] + [False] * 4, [False, True] + [False] * 6  # rounds of 4, opening of 2
    assert [bounded(opened, b, 4, 1, opening=2) for b in BOUNDS] == [1] * len(BOUNDS)
    assert [bounded(in_round, b, 4, 1, opening=2) for b in ("first-order", "every-order", "both", "oracle")] == [2] * 4
    assert bounded(in_round, "later-rounds", 4, 1, opening=2) == 3
    assert bounded(in_round, "rest-order", 4, 1, opening=2) == 2  # the first chunk (1) lies inside the opening
    assert bounded(in_round, "rest-order", 4, 3, opening=2) == 3  # a hit inside the first chunk of 3 stays
    assert bounded([False] * 8, "oracle", 4, opening=2) == 2 and bounded([False, False], "oracle", 4, opening=2) is None
    late = [False] * 6 + [True, False]  # a hit in the second round: every-order takes it to that round's start
    assert bounded(late, "every-order", 4, opening=2) == 4 and bounded(late, "first-order", 4, opening=2) == 6


def test_csv_marks_the_opening_and_the_ops_it_settles_are_left_out(tmp_path, capsys):
    """``Comparison.to_csv`` writes an ``opening`` column (1: the config is one of the task's shared opening);
    ``ratio_intervals`` holds each run's opening where it is under a bound and leaves out the ops whose opening
    alone reaches 95% (as the headline does), unless ``--keep-apart``; ``lever_bounds`` does the same."""
    from benchmarks import lever_bounds, ratio_intervals
    from codegen.measure import MeasureResult
    from felixjax.compare import Comparison
    from felixjax.database import TuningRecord

    def run(task, name, seed, lats):
        cfgs = ["d0", "d1"] + [f"{name}{seed}:{i}" for i in range(2, len(lats))]  # the opening first, as a run does
        start = 0.0 if task is A else 10.0  # B's runs start later: the first-result clock must leave them out
        return [TuningRecord(task, "k", f"{name}:{seed}", i, c, MeasureResult("ok", (lat,)), start + 0.5 * (i + 1))
                for i, (c, lat) in enumerate(zip(cfgs, lats))]

    lats = {(A.name, "gradient", 0): [3.0, 3.0, 3.0, 1.0, 3.0, 3.0], (A.name, "gradient", 1): [3.0] * 5 + [1.0],
            (A.name, "genetic", 0): [3.0] * 4 + [1.0, 3.0], (A.name, "genetic", 1): [3.0] * 5 + [1.0],
            (B.name, "gradient", 0): [1.0] + [2.0] * 5, (B.name, "gradient", 1): [1.0] * 6,
            (B.name, "genetic", 0): [1.0] * 6, (B.name, "genetic", 1): [1.0] + [2.0] * 5}
    hist = {k: run(A if k[0] == A.name else B, k[1], k[2], v) for k, v in lats.items()}
    cmp = Comparison([A, B], ["gradient", "genetic"], [0, 1], 6, None, hist,
                     openings={A.name: frozenset({"d0", "d1"}), B.name: frozenset({"d0", "d1"})})
    assert cmp.opening_reaches(B.name) and not cmp.opening_reaches(A.name)
    path = Path(cmp.to_csv(tmp_path / "cmp.csv"))
    rows = ratio_intervals.read_rows(path)
    assert [r["opening"] for r in rows if r["strategy"] == "gradient" and r["seed"] == "0" and r["task"] == A.name] \
        == ["1", "1", "0", "0", "0", "0"]
    assert ratio_intervals.tune_records(path)[3] == {B.name}
    runs = ratio_intervals.runs_from_csv(path)
    assert {t for t, _ in runs} == {A.name}
    assert {t for t, _ in ratio_intervals.runs_from_csv(path, keep_apart=True)} == {A.name, B.name}
    # gradient reaches 95% at trial 4 and 6, genetic at 5 and 6; rounds of 4 with the opening (2) at their head
    assert runs[(A.name, "gradient")]["trials95"] == [4, 6]
    for bound, want in (("first-order", [3, 6]), ("later-rounds", [4, 5]), ("every-order", [3, 5]),
                        ("oracle", [3, 3]), ("rest-order", [3, 6])):
        got = ratio_intervals.runs_from_csv(path, bound=bound, of="gradient", batch=4, chunk=1)
        assert got[(A.name, "gradient")]["trials95"] == want, bound
        assert got[(A.name, "genetic")]["trials95"] == [5, 6]
    assert ratio_intervals.main(["--csv", str(path), "--ref", "gradient", "--n", "50"]) == 0
    out = capsys.readouterr().out
    assert f"left out, the opening alone reaches 95%: {B.name}" in out and "| genetic | 1 | 2 |" in out
    assert ratio_intervals.main(["--csv", str(path), "--ref", "gradient", "--n", "50", "--keep-apart"]) == 0
    out = capsys.readouterr().out
    assert f"kept, the opening alone reaches 95%: {B.name}" in out and "| genetic | 2 | 2 |" in out
    got = {(r["bound"], r["ops"]): r["genetic"]["trials95"][0]
           for r in lever_bounds.bound_rows([path], "gradient", batch=4, chunk=1, n=50)}
    assert got[("oracle", "all")] == pytest.approx(5.5 / 3) and got[("measured", "all")] == pytest.approx(1.1)
    assert lever_bounds.first_result_seconds([path]) == {"genetic": 0.5, "gradient": 0.5}
    assert lever_bounds.first_result_seconds([path], keep_apart=True) == {"genetic": 5.5, "gradient": 5.5}
    assert lever_bounds.main(["--csv", str(path), "--ref", "gradient", "--batch", "4", "--n", "50"]) == 0
    assert f"left out, the opening alone reaches 95%: {B.name}" in capsys.readouterr().out


def test_sooner_divides_the_trials_after_the_first_round(tmp_path, capsys):
    """``sooner:K`` (session 69): a better later search, not a perfect one: the trials after the first round until
    95% K times fewer; a run that never got there counts as getting there on its last trial; K = 1 is as measured."""
    from benchmarks import lever_bounds, ratio_intervals
    from benchmarks.ratio_intervals import bound_name, bounded

    late, never, early = [False] * 9 + [True], [False] * 10, [False, True] + [False] * 8  # rounds of 2
    assert [bounded(h, "sooner:1", 2) for h in (late, never, early)] == [9, 9, 1]
    assert [bounded(h, "sooner:2", 2) for h in (late, never, early)] == [5, 5, 1]  # 2 + 7 // 2
    assert [bounded(h, "sooner:4", 2) for h in (late, never, early)] == [3, 3, 1]
    assert bounded([False], "sooner:2", 2) is None  # no later round to speed up
    assert bounded([False, True] + [False] * 6 + [True], "sooner:3", 4, opening=2) == 1  # the opening stays
    for bad in ("sooner:0.5", "sooner:x", "sooner:inf", "faster"):
        with pytest.raises(argparse.ArgumentTypeError):
            bound_name(bad)
        with pytest.raises(ValueError):
            bounded(late, bad, 2)
    path = _bound_csv(tmp_path)  # gradient at 95% on trial 4 and 2, genetic on 4 and 4; rounds of 2
    got = ratio_intervals.runs_from_csv(Path(path), bound="sooner:2", of="gradient", batch=2)
    assert got[(A.name, "gradient")]["trials95"] == [3, 2] and got[(A.name, "genetic")]["trials95"] == [4, 4]
    assert lever_bounds.main(["--csv", path, "--ref", "gradient", "--batch", "2", "--n", "50", "--sooner", "2"]) == 0
    out = capsys.readouterr().out  # genetic 4 / gradient median(3, 2) = 1.6
    assert "| sooner:2: the trials after the first round 2x fewer | all (1) | 1.60x [" in out
    for bad in ("0.5", "two"):
        with pytest.raises(SystemExit):
            lever_bounds.main(["--csv", path, "--ref", "gradient", "--sooner", bad])
    with pytest.raises(SystemExit):
        ratio_intervals.main(["--csv", path, "--ref", "gradient", "--bound", "sooner:0"])


def test_ledger_split_reads_the_committed_ablations_and_splits_their_ops(capsys):
    """``benchmarks/ledger_split.py`` (session 69): every lever's CSVs exist; the two splits partition the ops; the
    all-ops figure is ``ratio_intervals``' paired geomean for the same files and arms."""
    from benchmarks import ledger_split, ratio_intervals

    for lever, (_, _, names) in ledger_split.LEVERS.items():
        assert all((ledger_split.ROOT / "docs" / "data" / f"{n}.csv.gz").exists() for n in names), lever
    rows = {r["split"]: r for r in ledger_split.lever_rows("b8_now", n=50)}
    assert rows["first"]["ops"] + rows["later"]["ops"] == rows["all"]["ops"] == 10 and rows["later"]["ops"] > 0
    paths = [ledger_split.ROOT / "docs" / "data" / f"{n}.csv.gz" for n in ledger_split.LEVERS["b8_now"][2]]
    runs = ratio_intervals.pooled(paths, keep={"gradient_pre_b8_now", ledger_split.REF})
    want = ratio_intervals.point_ratios(runs, ledger_split.REF)["gradient_pre_b8_now"]["trials95"]
    point, low, high = rows["all"]["trials"]
    assert point == pytest.approx(want) and low <= want <= high
    assert ledger_split.main(["--levers", "b8_now", "--n", "50"]) == 0
    assert "| 8 per round (`b8_now`) | 52 | 3 | " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ledger_split.main(["--levers", "nope"])
