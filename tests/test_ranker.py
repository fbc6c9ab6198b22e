"""The tree ranker (felixjax.ranker): its features and targets, that it learns a ranking, and that a
session's strategies rank with it once it is fitted (replay oracle; no timing)."""
import numpy as np
import pytest

import felixjax as fj
from costmodels import kendall_tau
from felixjax.features import N_ACCESS_FEATURES, N_GLOBAL_FEATURES, SLOTS
from felixjax.model import CostModelScorer, make_ranker, ranker_rows
from felixjax.ranker import TreeRanker, centred_targets, flat_features
from felixjax.session import TuningSession
from felixjax.strategies.genetic import GeneticSearch
from felixjax.strategies.gradient import GradientSearch
from felixjax.testing import ReplayRunner, SyntheticOracle

pytest.importorskip("sklearn")


def _replay(task, target):
    return ReplayRunner.from_oracle(task, target)


def _sample(task, n, seed=0):
    from codegen.spaces import spaces_for

    spaces = spaces_for(task, fj.Target.cpu())
    rng = np.random.default_rng(seed)
    names = sorted(spaces)
    configs = list(dict.fromkeys(spaces[names[int(rng.integers(len(names)))]].sample(rng) for _ in range(n)))
    return spaces, configs


def test_flat_features_and_centred_targets():
    spaces, configs = _sample(fj.ops.matmul(64, 64, 64), 12)
    f = CostModelScorer(spaces, fj.Target.cpu()).features(configs)
    X = flat_features(f)
    assert X.shape == (len(configs), N_GLOBAL_FEATURES + len(SLOTS) * N_ACCESS_FEATURES)
    assert np.isfinite(X).all()
    # a masked-out slot contributes zeros, whatever its raw features hold
    acc = np.asarray(f.access).copy()
    acc[np.asarray(f.mask) == 0] = 123.0
    X2 = flat_features(type(f)(acc, f.mask, f.glob))
    assert np.array_equal(X, X2)
    y = centred_targets(np.array([1.0, 2.0, 4.0, 10.0, 20.0]), np.array([0, 0, 0, 1, 1]))
    assert abs(y[:3].sum()) < 1e-12 and abs(y[3:].sum()) < 1e-12
    assert y[0] > y[1] > y[2] and y[3] > y[4]  # faster = higher


def test_tree_ranker_ranks_held_out_configs_of_the_oracle():
    task = fj.ops.conv2d(1, 32, 14, 14, out_channels=32, kernel=3, padding=1)
    spaces, configs = _sample(task, 240, seed=1)
    oracle = SyntheticOracle(task)
    lat = np.array([oracle(c) for c in configs])
    X = flat_features(CostModelScorer(spaces, fj.Target.cpu()).features(configs))
    r = TreeRanker(seed=0)
    assert not r.fitted
    with pytest.raises(RuntimeError):
        r.predict(X[:2])
    assert r.fit(X[:180], lat[:180], np.zeros(180, int)) and r.fitted
    tau = kendall_tau(r.predict(X[180:]), lat[180:])  # scores (higher = faster) against latencies
    assert tau > 0.3, tau
    assert not TreeRanker(min_rows=50).fit(X[:10], lat[:10], np.zeros(10, int))  # too few rows: no model


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown ranker"):
        GradientSearch(ranker="xgboost")
    with pytest.raises(ValueError, match="ranker_data without a ranker"):
        GeneticSearch(ranker_data="x.db")
    with pytest.raises(ValueError, match="unknown ranker"):
        make_ranker("forest")
    assert make_ranker(None) is None
    with pytest.raises(FileNotFoundError, match="no database"):
        ranker_rows("/nonexistent/ranker.db")


def test_strategies_rank_with_the_trees_once_fitted(tmp_path):
    task = fj.ops.matmul(64, 48, 32)
    with TuningSession(fj.Target.cpu(), measurer=_replay, progress=False, defaults=False) as s:
        g = GradientSearch(batch_size=16, ranker="gbdt")
        run = s.add(task, g, seed=0, trials=32)
        scorer = g._ensure_scorer(run.ctx)
        assert not scorer.shared.ranking(scorer.group)  # no rows yet: the model ranks the first round
        s.step(run, 8)
        assert not scorer.shared.ranker.fitted and not scorer.shared.ranking(scorer.group)  # 8 rows < min_rows
        s.step(run, 8)
        assert scorer.shared.RANKER_MIN_OWN == 16 and scorer.shared.ranking(scorer.group)
        s.step(run)
        assert scorer.shared.ranker.fits >= 2
        cfgs = [r.config for r in run.history[:5]]
        expect = scorer.shared.ranker.predict(flat_features(scorer.features(cfgs)))
        assert np.allclose(scorer.score(cfgs), expect)
        rel = scorer.relaxations[cfgs[0].sketch]
        same = [c for c in cfgs if c.sketch == cfgs[0].sketch]
        xs = np.stack([rel.to_x(c) for c in same])
        assert np.allclose(scorer.score_x(cfgs[0].sketch, xs), scorer.shared.ranker.predict(
            flat_features(scorer.features(same))))
        # one group, one ranker setting
        with pytest.raises(ValueError, match="another group"):
            s.model("", ranker=None)
        data = str(tmp_path / "other.db")
    # measurements of another task as the ranker's extra rows: fitted before any measurement of this task,
    # it ranks the task only once the task has RANKER_MIN_OWN rows of its own
    fj.tune(fj.ops.matmul(96, 32, 64), strategy="random", trials=48, db=data, progress=False, retime=0,
            measurer=_replay, defaults=False)
    X, y = ranker_rows(data)
    assert len(X) == len(y) > 0 and abs(y.mean()) < 1e-9
    with TuningSession(fj.Target.cpu(), measurer=_replay, progress=False, defaults=False) as s:
        gen = GeneticSearch(batch_size=16, population=256, generations=1, ranker="gbdt", ranker_data=data)
        run = s.add(task, gen, seed=0, trials=32)
        scorer = gen.scorer(run.ctx)
        assert scorer.shared.ranker.fitted and scorer.shared.ranking() and not scorer.shared.ranking(scorer.group)
        new = s.step(run)
        assert len(new) == 16 and all(r.ok for r in new)
        assert scorer.shared.ranking(scorer.group)
