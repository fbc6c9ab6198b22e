"""The spread lever of the gradient search (``GradientSearch(spread=r)``): a round's picks keep an L1
distance apart in the relaxed integer space, best first, and fall back on the skipped candidates only
when the distinct ones run out."""
import itertools

import numpy as np
import pytest

import felixjax as fj
from felixjax.session import TuningSession
from felixjax.strategies.gradient import GradientSearch, spread_picks
from felixjax.testing import ReplayRunner


def test_spread_picks_skips_near_points_and_refills_from_them():
    xs = np.array([[0, 0], [0, 1], [5, 5], [1, 1], [9, 0], [5, 6]], np.float32)
    order = np.arange(6)
    sketch = ["a"] * 6
    assert spread_picks(order, xs, sketch, 3, 0).tolist() == [0, 1, 2]  # off: the top k
    assert spread_picks(order, xs, sketch, 3, 2).tolist() == [0, 2, 4]  # 1, 3 within 2 of 0; 5 of 2
    # too few distinct points: the skipped ones follow, in score order
    assert spread_picks(order, xs, sketch, 5, 2).tolist() == [0, 2, 4, 1, 3]
    # distance counts within a sketch only
    assert spread_picks(order, xs, ["a", "b"] * 3, 3, 2).tolist() == [0, 1, 2]


def test_the_spread_lever_keeps_a_rounds_picks_apart():
    task = fj.ops.matmul(64, 48, 32)
    g = GradientSearch(batch_size=16, starts=8, spread=2.0)
    with TuningSession(fj.Target.cpu(), measurer=lambda t, tg: ReplayRunner.from_oracle(t), progress=False,
                       defaults=False) as s:
        run = s.add(task, g, seed=0, trials=32)
        s.step(run)
        picks = g.propose(run.ctx, 16)
        assert len(set(picks)) == 16 and not set(picks) & run.ctx.measured
        rels = g._ensure_scorer(run.ctx).relaxations
        model = [c for c in picks if c.sketch in rels][: 16 - g.last_round["random"]]
        assert len(model) >= 12
        # the model's picks: pairwise more than one move apart (the pool is far larger than the batch)
        assert g.last_round["candidates"] > 4 * len(model)
        for a, b in itertools.combinations(model, 2):
            if a.sketch == b.sketch:
                d = np.abs(rels[a.sketch].to_x(a) - rels[b.sketch].to_x(b)).sum()
                assert d > 2.0, (a, b)


def test_spread_must_be_non_negative():
    with pytest.raises(ValueError, match="spread"):
        GradientSearch(spread=-1)
