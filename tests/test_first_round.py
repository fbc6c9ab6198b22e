"""benchmarks/first_round.py on a small replayed comparison: the shared opening, trials to 95% and the
first batch's hits it reports agree with the records counted directly."""
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

import felixjax as fj
from codegen.spaces import spaces_for
from codegen.target import Target
from felixjax.context import SearchContext
from felixjax.database import Database
from felixjax.strategies.genetic import GeneticSearch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import first_round  # noqa: E402

TASK = fj.ops.matmul(64, 48, 32)


def test_first_round_counts_match_the_records(tmp_path):
    db_path = str(tmp_path / "cmp.db")
    cmp = fj.compare([TASK], [lambda: GeneticSearch(population=256), "random"], trials=24, seeds=2, db=db_path,
                     replay=True, out=str(tmp_path / "out"), progress=False, defaults=True)
    opening = cmp.openings[TASK.name]
    assert opening, "the defaults make an opening"
    db = Database(db_path, readonly=True)
    rows = first_round.run_rows(db, batch=8)
    records = db.records(TASK)
    best = min(r.latency_s for r in records if r.ok and not r.run.startswith("retime:"))
    assert {(r["strategy"], r["seed"]) for r in rows} == {(s, str(k)) for s in ("genetic", "random") for k in (0, 1)}
    for row in rows:
        recs = [r for r in records if r.run == f"{row['strategy']}:{row['seed']}"]
        assert row["opening"] == len(opening)
        assert {r.config for r in recs[: row["opening"]]} == set(opening)
        lat = np.array([r.latency_s for r in recs])
        hit = np.flatnonzero(lat <= best / 0.95)
        assert row["first"] == (int(hit[0]) + 1 if len(hit) else None)
        assert row["hits"] == int((lat[len(opening): len(opening) + 8] <= best / 0.95).sum())
        assert (row["random"] is None) == (row["hits"] == 0)
        assert row["top1"] >= 1.0
        batch = [r for r in recs[len(opening): len(opening) + 8] if r.ok]
        target = Target.from_json(recs[0].target)
        scorer = SearchContext(TASK, target, spaces_for(TASK, target), np.random.default_rng(0)).get_scorer("packaged")
        speed = -np.array([r.latency_s for r in batch])
        expected = kendalltau(np.asarray(scorer.score([r.config for r in batch])), speed).statistic  # tau-b vs speed
        assert np.isclose(row["tau"], expected, equal_nan=True)
    table = first_round.summary(rows, base="random")
    assert any(line.startswith("| genetic | 2 |") for line in table)


def test_no_opening_without_a_shared_start():
    class R:
        def __init__(self, c):
            self.config = c

    runs = {"a:0": [R(1), R(2), R(3)], "b:0": [R(2), R(1), R(4)], "c:0": [R(5), R(1), R(2)]}
    assert first_round.opening_of(runs) == set()
    runs["c:0"] = [R(2), R(1), R(6)]
    assert first_round.opening_of(runs) == {1, 2}
