"""Issue 15's judging rules in fj.compare: the strong reference under reserved run names, openings
reported apart, censored ratios as flagged bounds (replay oracle only)."""
import math

import pytest

import felixjax as fj
from codegen.measure import MeasureResult
from felixjax.compare import REFERENCE_PREFIX, Comparison, from_database
from felixjax.database import TuningRecord
from felixjax.strategies.genetic import GeneticSearch

TASK = fj.ops.matmul(64, 48, 32)


def small_genetic():
    return GeneticSearch(population=128, batch_size=8)


def _histories(cmp):
    return {k: [(r.config, r.latency_s) for r in v] for k, v in cmp.histories.items()}


def test_reference_runs_are_reserved_longer_and_retimed_with_the_finals(tmp_path):
    kw = dict(trials=16, seeds=1, replay=True, progress=False, remeasure=2, defaults=True)
    plain = fj.compare([TASK], [small_genetic, "random"], db=None, **kw)
    cmp = fj.compare([TASK], [small_genetic, "random"], db=str(tmp_path / "r.db"), reference=True, **kw)
    # the compared runs are exactly what they are without a reference: nothing of it leaks into them
    assert _histories(cmp) == _histories(plain)
    assert set(cmp.references) == {(TASK.name, REFERENCE_PREFIX + "genetic", 0),
                                   (TASK.name, REFERENCE_PREFIX + "random", 0)}
    assert all(len(v) == 32 for v in cmp.references.values())  # 2x the budget
    runs = fj.Database(tmp_path / "r.db").runs()
    assert "reference:genetic:0" in runs and "reference:random:0" in runs
    for (_, s, seed), recs in cmp.histories.items():
        assert {r.run for r in recs} == {f"{s}:{seed}"}
    # best known is the union with the reference; the reference's best was re-timed with the finals
    union = min(r.latency_s for v in list(cmp.histories.values()) + list(cmp.references.values()) for r in v)
    assert cmp.best_known(TASK.name) == union <= cmp.reference_best(TASK.name)
    assert math.isfinite(cmp.reference_retimed(TASK.name))
    assert all(len(cmp.remeasured[k]) == 2 for k in cmp.references)
    # the opening (the sketches' defaults) is known and its best is one of the compared runs' latencies
    assert cmp.openings[TASK.name] and math.isfinite(cmp.opening_best(TASK.name))
    assert "reference re-timed (ms)" in cmp.table()
    with pytest.raises(ValueError, match="reserved"):
        fj.compare([TASK], [lambda: _named(small_genetic(), "reference:x")], trials=8, seeds=1, db=None,
                   replay=True, progress=False)


def test_a_stopped_comparison_is_summarized_from_its_database(tmp_path):
    """``from_database`` rebuilds what ``compare`` returned from the records it left, for the tasks whose
    runs all finished (their final re-timings are stored); a task with a missing run waits."""
    db = str(tmp_path / "c.db")
    kw = dict(trials=12, seeds=2, replay=True, progress=False, remeasure=2, defaults=True, reference=True)
    cmp = fj.compare([TASK], [small_genetic, "random"], db=db, **kw)
    other = fj.ops.matmul(32, 32, 32)  # never run
    got, waiting = from_database(db, [TASK, other], ["genetic", "random"], [0, 1], 12, replay=True)
    assert waiting == [other.name] and [t.name for t in got.tasks] == [TASK.name]
    assert _histories(got) == _histories(cmp) and got.remeasured == cmp.remeasured
    assert {k: len(v) for k, v in got.references.items()} == {k: len(v) for k, v in cmp.references.items()}
    assert got.openings == cmp.openings and got.rows() == cmp.rows()
    assert got.batches == cmp.batches and "Candidates per round" in got.table()  # session 79: from the run settings
    # a seed that never ran, or no reference where one ran: nothing is finished / the runs still match
    assert from_database(db, [TASK], ["genetic", "random"], [0, 1, 2], 12, replay=True) == (None, [TASK.name])
    bare, _ = from_database(db, [TASK], ["genetic"], [0], 12, replay=True, reference=False)
    assert not bare.references
    assert _histories(bare) == {k: v for k, v in _histories(cmp).items() if k[1:] == ("genetic", 0)}


def _named(obj, name):
    obj.name = name
    return obj


def _run(task, s, seed, lats, opening=0):
    """Records named ``c0, c1, ...`` (the first ``opening`` are the shared opening ``o0, o1, ...``)."""
    recs = []
    for i, lat in enumerate(lats):
        cfg = f"o{i}" if i < opening else f"{s}{seed}c{i}"
        recs.append(TuningRecord(task, "k", f"{s}:{seed}", i, cfg, MeasureResult("ok", (lat,)), float(i + 1)))
    return (task.name, s, seed), recs


def test_opening_tasks_apart_and_censored_ratios_are_flagged_bounds():
    a, b, c = TASK, fj.ops.matmul(32, 32, 32), fj.ops.matmul(16, 16, 16)
    hist = dict([
        # a: both reach; gradient at trial 2, genetic at trial 4 -> ratio 2, uncensored
        _run(a, "gradient", 0, [9, 1.0, 1, 1]), _run(a, "genetic", 0, [9, 9, 9, 1.0]),
        # b: genetic never reaches (censored at 4 trials): a lower bound 4 / 1
        _run(b, "gradient", 0, [1.0, 2, 2, 2]), _run(b, "genetic", 0, [9, 9, 9, 9]),
        # c: the opening (trial 1, shared) already reaches 95%: reported apart
        _run(c, "gradient", 0, [1.0, 1, 1, 1], opening=1), _run(c, "genetic", 0, [1.0, 3, 3, 3], opening=1),
    ])
    refs = dict([_run(b, REFERENCE_PREFIX + "gradient", 0, [5, 0.5])])  # b's reference is better than any run
    cmp = Comparison([a, b, c], ["gradient", "genetic"], [0], 4, None, hist, references=refs,
                     openings={a.name: frozenset({"o0"}), b.name: frozenset({"o0"}), c.name: frozenset({"o0"})})
    assert cmp.best_known(b.name) == 0.5  # the reference sets the bar: now gradient never reaches on b either
    assert not cmp.reach(b.name, "gradient", 0)["reached"]
    assert cmp.opening_reaches(c.name) and not cmp.opening_reaches(a.name)
    r = cmp.ratios()["genetic"]
    assert r["apart"] == [c.name] and r["tasks"] == 2
    assert r["uncensored"] == 1 and r["uncensored_trials95"] == pytest.approx(2.0)
    assert r["censored"] == 1 and r["bound"] == "mixed"  # on b both are censored: no bound either way
    # without the reference, b's bar is gradient's 1.0: only genetic is censored -> a lower bound
    cmp2 = Comparison([a, b, c], ["gradient", "genetic"], [0], 4, None, hist,
                      openings={t.name: frozenset({"o0"}) for t in (a, b, c)})
    r2 = cmp2.ratios()["genetic"]
    assert r2["bound"] == "lower" and r2["trials95"] == pytest.approx(math.sqrt(2.0 * 4.0))
    assert "| genetic / gradient |" in cmp2.table() and "apart" in cmp2.table()
