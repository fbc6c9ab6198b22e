"""benchmarks/sketch_waste.py: the share of a run's picks on a sketch its measurements left behind."""
import numpy as np

import felixjax as fj
from benchmarks.sketch_waste import main, waste
from codegen.measure import MeasureResult
from codegen.spaces import spaces_for
from felixjax.database import TuningRecord

TARGET = fj.Target.cpu()
TASK = fj.ops.conv2d(1, 8, 10, 10, out_channels=16, kernel=3, padding=1)


def _records():
    """Run ``s:0``: 4 trials on sketch A at 1 ms, then B at 2 ms x 2, then 4 more picks alternating A and B;
    with ``after=2, first=4``: B is left behind (2 measured, 2x the best) from trial 6 on."""
    spaces = spaces_for(TASK, TARGET)
    a, b = sorted(spaces)[:2]
    cfg = {name: spaces[name].sample(np.random.default_rng(0)) for name in (a, b)}
    plan = [a, a, a, a, b, b, a, b, a, b]
    lat = {a: 1e-3, b: 2e-3}
    recs = [TuningRecord(TASK, TARGET.key, "s:0", i, cfg[s], MeasureResult("ok", (lat[s],)), 0.0)
            for i, s in enumerate(plan)]
    recs.append(TuningRecord(TASK, TARGET.key, "reference:s:0", 0, cfg[b], MeasureResult("ok", (lat[b],)), 0.0))
    return recs, a, b


def test_waste_counts_picks_on_a_left_behind_sketch():
    recs, _, _ = _records()
    cells = waste(recs, ratio=1.5, after=2, first=4)
    assert cells == {(TASK.name, "s"): (6, 2)}  # trials 4-9 counted; B at 7 and 9 (measured twice by then)
    assert waste(recs, ratio=2.5, after=2, first=4) == {(TASK.name, "s"): (6, 0)}  # 2x is not 2.5x behind
    assert waste(recs, ratio=1.5, after=3, first=4) == {(TASK.name, "s"): (6, 1)}  # 3 measured only by trial 9


def test_cli_reads_a_database(tmp_path, capsys):
    recs, _, _ = _records()
    with fj.Database(tmp_path / "c.db") as db:
        for r in recs:
            db.add(r)
    assert main([str(tmp_path / "c.db"), "--after", "2"]) == 0
    out = capsys.readouterr().out
    assert "| **all tasks** |" in out and "0.0%" not in out
