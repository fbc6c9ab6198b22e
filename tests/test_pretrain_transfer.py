"""benchmarks/pretrain_transfer.py on a small replayed pool: each model's hits, tau and top pick agree with
the pool's records scored directly, and a missing checkpoint is a clear error."""
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

import felixjax as fj
from felixjax.model import PACKAGED_JUDGE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import pretrain_transfer  # noqa: E402
from benchmarks.flat_offline import pool_scorer  # noqa: E402

TASK = fj.ops.matmul(64, 48, 32)


def test_transfer_rows_match_the_pool(tmp_path):
    db_path = str(tmp_path / "pool.db")
    fj.compare([TASK], ["random"], trials=40, seeds=1, db=db_path, replay=True, progress=False, defaults=False,
               remeasure=0)
    models = pretrain_transfer.parse_models(["packaged", f"judge={PACKAGED_JUDGE}"])
    rows = pretrain_transfer.pool_rows(db_path, models, k=8)
    assert [r["model"] for r in rows] == ["packaged", "judge"]
    recs = [r for r in fj.Database(db_path, readonly=True).records(TASK) if r.ok]
    lat = {}
    for r in recs:
        lat.setdefault(r.config, []).append(r.latency_s)
    configs = list(lat)
    latency = np.array([np.median(v) for v in lat.values()])
    for row, path in zip(rows, models.values()):
        score = np.asarray(pool_scorer(TASK, fj.Target.from_json(recs[0].target), path).score(configs))
        order = np.argsort(-score, kind="stable")
        assert row["pool"] == len(configs) and row["hits_pool"] == int((latency <= latency.min() / 0.95).sum())
        assert row["hits_top"] == int((latency[order[:8]] <= latency.min() / 0.95).sum())
        assert row["tau"] == pytest.approx(kendalltau(score, -latency).statistic, abs=1e-9)
        assert row["top1"] == pytest.approx(latency[order[0]] / latency.min())
    assert "packaged" in pretrain_transfer.report(rows, list(models), 8)
    with pytest.raises(SystemExit, match="no checkpoint"):
        pretrain_transfer.parse_models(["x=/nonexistent.npz"])
