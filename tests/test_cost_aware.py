"""Cost-aware tuning (issue 19): cold-candidate filtering and early stop, with the replay oracle
(no compiling) and an oracle stand-in for the ensemble's uncertainty; one run with the real ensemble."""
import math
import os

import pytest

import felixjax as fj
from felixjax.cost_aware import CostAware
from felixjax.session import TuningSession
from felixjax.testing import (
    OracleScorer,
    OracleUncertainty,
    ReplayRunner,
    SyntheticOracle,
)

TASK = fj.ops.matmul(64, 64, 64)
# the synthetic oracle's latencies depend on the target's caches and lanes, and these tests' verdicts on one
# seed's path: every oracle and session here uses one fixed target (a Zen 4 core; nothing is compiled), not the
# host's (on a Zen 5 host, 48 KiB of L1d, seed 0 of the early-stop test ran to its budget)
TARGET = fj.Target.cpu(cores=2, simd_lanes=16, vector_registers=32, fma=True, avx512_fp16=False, avx512_vnni=True,
                       l1d_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=4 << 20)
ORACLE = SyntheticOracle(TASK, TARGET)


def _replay(task, target):
    return ReplayRunner(SyntheticOracle(task, TARGET))


def _run(trials, cost_aware=None, seed=0, strategy="genetic"):
    opts = {"scorer": OracleScorer(ORACLE, noise=0.3, seed=seed), "population": 256, "generations": 2,
            "batch_size": 16, "min_unmeasured": 16} if strategy == "genetic" else None
    with TuningSession(TARGET, measurer=_replay, progress=False, seed=seed) as s:
        tr = s.add(TASK, strategy, seed=seed, trials=trials, strategy_options=opts, cost_aware=cost_aware)
        while not tr.done:
            s.step(tr)
    return tr


def _oracle_uncertainty():
    return OracleUncertainty(ORACLE, noise=0.1, std=0.1)


def test_off_by_default():
    res = fj.tune(TASK, TARGET, strategy="random", trials=8, progress=False, retime=0, measurer=_replay)
    assert "filtered" not in res.stats and res.stop_reason == "trials"
    assert CostAware.of() is None and CostAware.of(filter_p=0.1).enabled


def test_cold_candidate_filtering_skips_candidates_unlikely_to_win():
    on = _run(96, CostAware(filter_p=0.2, warmup=16, uncertainty=_oracle_uncertainty))
    assert on.stats["filtered"] > 0  # candidates proposed but never measured
    assert len(on.history) == 96 and on.stop_reason == "trials"  # the budget goes to later rounds
    off = _run(96)
    assert "filtered" not in off.stats
    assert on.best().latency_s <= 1.05 * off.best().latency_s


def test_early_stop_saves_trials_and_says_why():
    ca = CostAware(filter_p=0.1, early_stop=0.002, warmup=16, patience=2, window=32,
                   uncertainty=lambda: OracleUncertainty(ORACLE, noise=0.02, std=0.02))
    on, off = _run(256, ca), _run(256)
    assert on.stop_reason == "early_stop" and off.stop_reason == "trials"
    assert len(on.history) < 0.8 * len(off.history)
    assert on.best().latency_s <= 1.10 * off.best().latency_s
    # the result of fj.tune reports it too
    res = fj.tune(TASK, TARGET, strategy="genetic", trials=256, progress=False, retime=0, measurer=_replay,
                  strategy_options={"scorer": OracleScorer(ORACLE, noise=0.3), "population": 256, "generations": 2,
                                    "batch_size": 16, "min_unmeasured": 16},
                  filter_p=None, early_stop=None)
    assert res.stop_reason == "trials"


def test_observed_rule_stops_on_the_convergence_curve_without_a_model():
    # stop_rule="observed" without filtering: best-so-far improved < early_stop per trial over the last
    # `window` trials ends the run; no ensemble is fitted (the screen costs nothing)
    ca = CostAware(early_stop=1e-4, stop_rule="observed", warmup=16, window=32)
    on, off = _run(320, ca), _run(320)
    assert on.stop_reason == "early_stop" and off.stop_reason == "trials"
    assert on.screen.estimator.model is None and "filtered" not in on.stats
    n = len(on.history)
    assert n < len(off.history) and [r.config for r in on.history] == [r.config for r in off.history[:n]]
    # when it stopped, the last `window` trials had not improved the best by more than the threshold
    best = lambda rs: min(r.latency_s for r in rs if r.ok)
    assert math.log(best(on.history[:n - 32]) / best(on.history)) < 32 * 1e-4


def test_options_are_checked():
    with pytest.raises(ValueError, match="filter_p"):
        CostAware(filter_p=1.5)
    with pytest.raises(ValueError, match="early_stop"):
        CostAware(early_stop=0)
    with pytest.raises(ValueError, match="stop_rule"):
        CostAware(early_stop=1e-3, stop_rule="sometimes")
    for bad in ({"window": 2.5}, {"warmup": 0}, {"patience": True}, {"explore": 8.0}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a whole number"):  # session 80: window=2.5
            CostAware(early_stop=1e-3, **bad)  # was accepted, then failed mid-run


def test_with_the_real_ensemble():
    # the default uncertainty: the run's own small ensemble over the session's features (jax)
    tr = _run(40, CostAware(filter_p=0.3, early_stop=1e-4, warmup=12), strategy="random")
    assert tr.screen.last["proposed"] > 0 and 0 <= tr.stats["filtered"]
    assert tr.stop_reason in ("trials", "early_stop") and tr.stats["expected_gain"] >= 0


def test_a_task_stopped_early_gives_its_budget_to_the_others():
    from felixjax.network_tune import scheduled_rounds

    tasks = [fj.ops.matmul(64, 64, 64), fj.ops.dense(1, 256, 128)]
    ca = CostAware(filter_p=0.1, early_stop=0.002, warmup=16, patience=2, window=16,
                   uncertainty=lambda: OracleUncertainty(noise=0.02, std=0.02))
    with TuningSession(TARGET, measurer=_replay, progress=False, trials=200) as s:
        # cost-aware on the first task only (a per-run option): it stops, the scheduler gives the rest
        # of the session's budget to the second
        runs = [s.add(tasks[0], "random", seed=0, cost_aware=ca), s.add(tasks[1], "random", seed=0)]
        info, _rounds = scheduled_rounds(s, runs, [1, 1], per_round=16)
    assert runs[0].stop_reason == "early_stop" and len(runs[0].history) < 48
    assert sum(len(r.history) for r in runs) == 200 and len(runs[1].history) > 150
    assert [len(r.history) for r in runs] == [t.trials for t in info]
    assert info[0].stop_reason == "early_stop" and info[1].stop_reason == ""  # the result says why


def test_compare_takes_the_options_for_every_run():
    ca = CostAware(filter_p=0.1, early_stop=0.002, warmup=16, window=16,
                   uncertainty=lambda: OracleUncertainty(noise=0.02, std=0.02))
    cmp = fj.compare([TASK], ["random"], trials=128, seeds=1, db=None, replay=True, progress=False, cost_aware=ca)
    [hist] = cmp.histories.values()
    assert 16 <= len(hist) < 128


# ---- the plateau rule (robust to late jumps): properties, a synthetic late jump, live == replayed ----------

from hypothesis import given, settings
from hypothesis import strategies as st

from felixjax.cost_aware import observed_gain, plateau_decision


def _decisions(lat, opt, budget, every):
    """Replay the rule on a log at round boundaries: the trials at which it stops (None: never)."""
    fired = None
    for n in range(every, len(lat) + 1, every):
        stop, fired = plateau_decision(lat[:n], budget, opt, fired)
        if stop:
            return n
    return None


def _late_jump_curve(budget=512):
    """Best-so-far improves fast for 64 trials, stays flat, then finds a region 2x faster at trial 300."""
    lat = []
    for i in range(budget):
        if i < 64:
            lat.append(2.0 + 8.0 / (1 + i))
        elif i == 300:
            lat.append(1.0)
        else:
            lat.append(2.5 + (i % 7) * 0.1)  # nothing better than the best so far
    return lat


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 10.0), min_size=1, max_size=400), st.floats(0.0, 1.0), st.integers(0, 64),
       st.sampled_from([8, 16, 32]))
def test_plateau_rule_never_stops_before_its_minimum_and_is_deterministic(lat, min_share, explore, every):
    budget = 400
    opt = CostAware(early_stop=1e-2, stop_rule="plateau", warmup=8, window=16, min_share=min_share,
                    plateau=0.5, explore=explore)
    n = _decisions(lat, opt, budget, every)
    if n is not None:
        assert n >= max(opt.warmup, min_share * budget)
        assert observed_gain(lat[:n], opt.window) < opt.early_stop or explore  # fired, then explored
    assert _decisions(list(lat), opt, budget, every) == n  # the same log, the same decision


def test_old_rule_stops_on_a_late_jump_curve_and_the_plateau_rule_does_not():
    lat, every = _late_jump_curve(), 64
    old = CostAware(early_stop=0.001, stop_rule="observed", window=128, warmup=64)  # the previous calibration
    stopped_old = None
    for n in range(every, len(lat) + 1, every):  # the observed rule: best-so-far gain over the window
        if n >= old.warmup and observed_gain(lat[:n], old.window) < old.early_stop:
            stopped_old = n
            break
    assert stopped_old is not None and stopped_old < 300 and min(lat[:stopped_old]) == pytest.approx(2.0 + 8.0 / 64)
    new = CostAware(early_stop=0.001, stop_rule="plateau", window=64, warmup=64, min_share=0.5, explore=64)
    n = _decisions(lat, new, len(lat), every)
    # it fires at 256 (half the budget), explores to 320, sees the jump at trial 300, goes on
    assert n is None or (n > 300 and min(lat[:n]) == 1.0)


def test_plateau_rule_live_is_the_replayed_rule_and_keeps_the_run_a_prefix():
    ca = CostAware(early_stop=1e-3, stop_rule="plateau", warmup=16, window=32, min_share=0.5, explore=16)
    on, off = _run(320, ca), _run(320)
    assert on.screen.estimator.model is None  # no filtering: no ensemble fitted
    n = len(on.history)
    assert [r.config for r in on.history] == [r.config for r in off.history[:n]]
    assert on.stop_reason in ("early_stop", "trials") and n >= 160
    # replaying the rule on the off run's log at the on run's round boundaries gives the same stop
    lat = [r.latency_s if r.ok else math.inf for r in off.history]
    fired, stop_at = None, None
    for e in on.screen.trace:
        stop, fired = plateau_decision(lat[:e["trials"]], 320, ca, fired)
        if stop:
            stop_at = e["trials"]
            break
    assert stop_at == (n if on.stop_reason == "early_stop" else None)


def test_min_keep_bounds_how_far_filtering_shrinks_a_round():
    on = _run(96, CostAware(filter_p=0.9, warmup=16, min_keep=0.5, uncertainty=_oracle_uncertainty))
    rounds = [e for e in on.screen.trace]
    # filter_p=0.9 would skip nearly everything; min_keep keeps half of every round (the hottest first)
    assert rounds and all(e["kept"] >= math.ceil(e["proposed"] / 2) for e in rounds)
    assert on.stats["filtered"] > 0 and len(on.history) == 96
    with pytest.raises(ValueError, match="min_keep"):
        CostAware(filter_p=0.1, min_keep=0)
    with pytest.raises(ValueError, match="min_share"):
        CostAware(early_stop=1e-3, stop_rule="plateau", min_share=1.5)


def test_plateau_min_share_of_a_network_task_counts_against_its_share_of_the_session():
    from felixjax.network_tune import scheduled_rounds

    tasks = [fj.ops.matmul(64, 64, 64), fj.ops.dense(1, 256, 128)]
    # fires as soon as it may: any 16 trials without a gain; min_share 0.5 of an even share (512 / 2)
    ca = CostAware(early_stop=1.0, stop_rule="plateau", warmup=16, window=16, min_share=0.5, plateau=0.0,
                   jump_weight=0.0, explore=0)
    with TuningSession(TARGET, measurer=_replay, progress=False, trials=512) as s:
        runs = [s.add(t, "random", seed=0, cost_aware=ca) for t in tasks]
        scheduled_rounds(s, runs, [1, 1], per_round=16)
    assert [r.share for r in runs] == [256, 256]
    stopped = [r for r in runs if r.stop_reason == "early_stop"]
    assert stopped and all(len(r.history) >= 128 for r in stopped)


def test_calibrated_rule_through_fj_tune_never_stops_before_half_the_budget():
    ca = CostAware.calibrated()
    assert (ca.stop_rule, ca.early_stop, ca.window, ca.min_share, ca.explore, ca.filter_p) == (
        "plateau", 1e-4, 64, 0.5, 0, None)
    assert CostAware.calibrated(window=32).window == 32
    res = fj.tune(TASK, TARGET, strategy="random", trials=320, progress=False, retime=0, measurer=_replay, batch=32,
                  cost_aware=ca)
    assert len(res.history) >= 160 and res.stop_reason in ("early_stop", "trials")
    if res.stop_reason == "early_stop":  # stopped: its last 64 trials did not improve the best
        lat = [r.latency_s for r in res.history if r.ok]
        assert min(lat[:-64]) <= min(lat) * (1 + 1e-3)


@pytest.mark.parametrize("argv, msg", [(["--early-stop", "soon"], "--early-stop takes 'calibrated' or a number"),
                                       (["--early-stop", "-1"], "--early-stop must be > 0"),
                                       (["--filter-p", "1.5"], "--filter-p must be in (0, 1)")])
def test_cli_cost_aware_flags_reject_bad_values(argv, msg, tmp_path, capsys):
    from felixjax.cli import main as cli

    db = tmp_path / "t.db"
    assert cli(["tune", "--op", "matmul:m=8,n=8,k=8", "--strategy", "random", "--no-compare", "--db", str(db),
                *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "Traceback" not in err, err
    assert not db.exists()  # nothing ran


def test_python_cost_aware_arguments_are_checked_and_calibrated_by_name():
    """Session 74 (a user's review): cost_aware= with early_stop= silently dropped early_stop; "0.05" or
    "calibrated" strings were TypeErrors deep inside; early_stop=True and inf were accepted."""
    from felixjax.cost_aware import CostAware

    assert CostAware.of(early_stop="calibrated") == CostAware.calibrated()
    assert CostAware.of(early_stop="calibrated", filter_p=0.05) == CostAware.calibrated(filter_p=0.05)
    assert CostAware.of() is None and CostAware.of(cost_aware=CostAware.calibrated()) == CostAware.calibrated()
    for kw, msg in (({"filter_p": "0.05"}, "filter_p must be a finite number"),
                    ({"early_stop": True}, "early_stop must be a finite number"),
                    ({"early_stop": math.inf}, "early_stop must be a finite number"),
                    ({"cost_aware": CostAware(filter_p=0.5), "early_stop": 0.5}, "alone"),
                    ({"cost_aware": "calibrated"}, "must be a CostAware")):
        with pytest.raises(ValueError, match=msg):
            fj.tune(fj.ops.matmul(8, 8, 8), TARGET, strategy="random", trials=4, progress=False, retime=0,
                    measurer=_replay, **kw)


def test_compare_refuses_a_seed_twice_and_plot_names_the_file_it_writes(tmp_path):
    with pytest.raises(ValueError, match="seeds are listed twice"):
        fj.compare([fj.ops.matmul(8, 8, 8)], ["random"], trials=4, seeds=[0, 0], db=None, progress=False, replay=True)
    for bad in ([1.5], [True], True, 2.5, "2"):  # were truncated (1.5 -> 1, True -> 1) or a TypeError
        with pytest.raises(ValueError, match="seeds must be a count"):
            fj.compare([fj.ops.matmul(8, 8, 8)], ["random"], trials=4, seeds=bad, db=None, progress=False, replay=True)
    cmp = fj.compare([fj.ops.matmul(8, 8, 8)], ["random"], trials=4, seeds=1, db=None, progress=False, replay=True)
    path = cmp.plot(tmp_path / "noext")
    assert path.endswith("noext.png") and os.path.getsize(path) > 0


def test_a_run_stopped_early_stays_stopped_when_the_same_call_runs_again(tmp_path):
    # session 74 (a user's review): the rule's count of cold rounds is not in the records, so each rerun of the same
    # call measured one more round (48, 64, 80 trials); now the stop is remembered in the database
    db = str(tmp_path / "es.db")
    runs = [fj.tune(fj.ops.matmul(64, 64, 64), TARGET, strategy="random", trials=256, batch=16, early_stop=0.5, db=db,
                    progress=False, retime=0, measurer=_replay) for _ in range(3)]
    assert runs[0].stop_reason == "early_stop" and len(runs[0].history) < 256
    assert [len(r.history) for r in runs[1:]] == [len(runs[0].history)] * 2
    assert all(r.stop_reason == "early_stop" for r in runs)
    bigger = fj.tune(fj.ops.matmul(64, 64, 64), TARGET, strategy="random", trials=512, batch=16, early_stop=0.5, db=db,
                     progress=False, retime=0, measurer=_replay)  # session 80: a bigger budget stayed stopped
    assert len(bigger.history) > len(runs[0].history)
    more = fj.tune(fj.ops.matmul(64, 64, 64), TARGET, strategy="random", trials=len(runs[0].history) + 16, batch=16, db=db,
                   progress=False, retime=0, measurer=_replay)  # without early stop: it goes on
    assert len(more.history) == len(runs[0].history) + 16


def test_a_comparison_names_the_runs_a_cost_aware_rule_stopped_early():
    # session 74 (a user's review): the table said "Budget per run: 256 trials" and showed `>128` for runs that had
    # stopped at 128, with nothing saying why
    cmp = fj.compare([fj.ops.matmul(64, 64, 64)], ["random"], trials=256, seeds=2, db=None, progress=False,
                     replay=True, cost_aware=CostAware(early_stop=0.5))
    assert all(s["stop_reason"] == "early_stop" for s in cmp.stats.values())
    assert "Stopped early (cost-aware), at the trial shown: matmul_64x64x64 random:0 at 48" in cmp.table()
    import csv
    import tempfile

    with tempfile.TemporaryDirectory() as d, open(cmp.to_csv(os.path.join(d, "c.csv"))) as f:
        rows = list(csv.DictReader(f))
    assert {r["stop_reason"] for r in rows if r["phase"] == "tune"} == {"early_stop"}


def test_cli_says_an_early_stop_cannot_fire_within_its_warmup(tmp_path, capsys):
    # session 74 (a user's review): `--early-stop calibrated --trials 48` silently did nothing (64-trial warm-up)
    from felixjax.cli import main as cli

    assert cli(["tune", "--op", "matmul:m=8,n=8,k=8", "--strategy", "random", "--no-compare", "--trials", "2",
                "--early-stop", "calibrated", "--db", str(tmp_path / "w.db")]) == 0
    assert "waits for 64 correct trials: with --trials 2" in capsys.readouterr().err


def test_the_cost_aware_benchmarks_run_their_paired_arms(tmp_path):
    # session 75 (a user's review): benchmarks/cost_aware.py --replay (its own dry run) and cost_aware_calibrate.py
    # stopped at once ("model group ('on', 0) was made with (ranker, ranker_data, opening) None"): they seeded the
    # second arm's model behind the session's back; both arms now draw the same numbers through model_seed
    import types

    from benchmarks import cost_aware, cost_aware_calibrate

    args = types.SimpleNamespace(replay=True, threads=1, strategy="genetic", trials=16, filter_p=0.05, early_stop=1e-3,
                                 retime_repeats=1, warmup=None, window=None, patience=None, stop_rule=None,
                                 min_share=None, plateau=None, jump_weight=None, explore=None, min_keep=None)
    row = cost_aware.tune_pair(fj.ops.matmul(32, 32, 32), args, 0, fj.Target.cpu(), str(tmp_path / "ca.db"))
    assert row["off"]["trials"] == 16 and row["on"]["trials"] >= 1
    out = cost_aware_calibrate.run_task(fj.ops.matmul(32, 32, 32), "genetic", 0, 16, [None, 0.05], warmup=8)
    assert {"off", "on:None", "on:0.05"} <= set(out)
