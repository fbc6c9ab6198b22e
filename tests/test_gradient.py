"""The Felix loop end to end: gradient search against random search on the synthetic oracle, the
learned cost model against the roofline prior, and a short real tuning run."""
import numpy as np
import pytest

import felixjax as fj
from felixjax.model import CostModelScorer
from felixjax.testing import SyntheticOracle

# stats=False: no rounding / soft-vs-hard statistics (tests/test_gradient_levers.py checks them); the
# proposals are the same, without the extra model evaluations and their compilation
SMALL = {"gradient": {"starts": 128, "steps": 24, "stats": False}}
CONV = fj.ops.conv2d(1, 16, 14, 14, out_channels=32, kernel=3, padding=1)


def _reference_best(oracle, n=20000, seed=0):
    # n uniform samples (a uniform sketch, then uniform within it, as Space.sample) drawn and scored as
    # codec rows, vectorized: well under a second, where n Space.sample calls took about a minute
    rows = oracle.codec.sample(np.random.default_rng(seed), n)
    assert len(rows) == n
    return float(oracle.rows_latency(rows).min())


def _trials_to(recs, level):
    best = np.minimum.accumulate([r.latency_s for r in recs])
    hit = np.flatnonzero(best <= level)
    return int(hit[0]) + 1 if hit.size else len(recs) + 1  # censored at the budget


@pytest.mark.slow
def test_gradient_reaches_the_optimum_neighbourhood_sooner_than_random():
    """Over several seeds, gradient search needs fewer proposals than random search to come within
    1.2x of the best of 20000 uniform samples of the oracle (the optimum's neighbourhood)."""
    oracle = SyntheticOracle(CONV)
    level = 1.2 * _reference_best(oracle)
    seeds = [0, 1, 2]
    cmp = fj.compare([CONV], ["gradient", "random"], trials=64, seeds=seeds, db=None, replay=True, progress=False,
                     remeasure=0, strategy_options=SMALL, defaults=False)  # search logic alone
    grad = [_trials_to(cmp.histories[(CONV.name, "gradient", s)], level) for s in seeds]
    rand = [_trials_to(cmp.histories[(CONV.name, "random", s)], level) for s in seeds]
    assert np.median(grad) < np.median(rand), (grad, rand)
    assert sum(g <= 64 for g in grad) >= 2, grad  # reached in most seeds


def test_mlp_ranks_held_out_configs_better_than_the_prior():
    """Trained on oracle-labelled configs, the MLP's within-task pairwise accuracy on held-out
    configs beats the roofline prior's (both are printed)."""
    from costmodels import pairwise_accuracy

    from codegen.space import Space, sketches_for
    from felixjax.database import TuningRecord
    from codegen.measure import MeasureResult

    oracle = SyntheticOracle(CONV)
    target = oracle.target
    spaces = {s.name: Space(CONV, s, target) for s in sketches_for(CONV)}
    scorer = CostModelScorer(spaces, target, seed=0)
    rng = np.random.default_rng(1)
    train = [spaces[n].sample(rng) for n in sorted(spaces) for _ in range(120)]
    test = [spaces[n].sample(rng) for n in sorted(spaces) for _ in range(60)]
    recs = [TuningRecord(CONV, target.key, "t", i, c, MeasureResult("ok", (oracle(c),))) for i, c in enumerate(train)]
    scorer.update(recs)
    lat = oracle.latencies(test)
    f = scorer.features(test)
    prior = pairwise_accuracy(scorer.prior.predict(f), lat)
    mlp = pairwise_accuracy(scorer.mlp.predict(f), lat)
    print(f"held-out pairwise accuracy: MLP {mlp:.3f}, roofline prior {prior:.3f}")
    assert mlp > prior
    assert mlp > 0.75


@pytest.mark.cc
def test_short_real_gradient_run_checks_every_kernel(tmp_path, runner):
    t = fj.ops.matmul(48, 64, 32, bias=True, act="relu")
    res = fj.tune(t, strategy="gradient", trials=8, batch=8, db=str(tmp_path / "g.db"), runner=runner, threads=1,
                  progress=False, strategy_options=SMALL["gradient"])
    assert len(res.history) == 8
    assert all(r.status == "ok" for r in res.history), res.status_counts()
    arrays = t.random_inputs(seed=5)
    np.testing.assert_allclose(res.kernel(threads=1)(*arrays), t.reference(*arrays), rtol=1e-4, atol=1e-4)


def test_trust_penalty_is_zero_inside_and_pulls_back_outside():
    import jax
    import jax.numpy as jnp

    from felixjax.strategies.gradient import trust_penalty

    anchors = jnp.asarray([[0.0, 0.0], [10.0, 0.0], [99.0, 99.0]])
    mask = jnp.asarray([1.0, 1.0, 0.0])  # the third anchor is padding
    assert float(trust_penalty(jnp.asarray([1.0, 0.5]), anchors, mask, 2.0)) == 0.0
    far = jnp.asarray([5.0, 6.0])
    assert float(trust_penalty(far, anchors, mask, 2.0)) > 20.0
    g = jax.grad(trust_penalty)(far, anchors, mask, 2.0)
    assert float(g[1]) > 0  # descending moves back towards the anchors
    assert float(trust_penalty(jnp.asarray([98.0, 99.0]), anchors, mask, 2.0)) > 1000  # padding is no anchor


def test_the_soft_score_of_one_point_equals_the_model_on_a_batch_of_one():
    """The descent scores one point's features without a batch axis (XLA's CPU backward pass of the MLP
    is ~3.4x faster that way than through a batch of one); value and gradient are the model's on the
    batch of one, for the pretrained MLP and the roofline prior alike, and the hard scores too."""
    import jax
    import jax.numpy as jnp

    from codegen.space import Space, sketches_for
    from costmodels import Features
    from felixjax.features import features
    from felixjax.smooth import Smooth

    target = fj.Target.cpu()
    spaces = {s.name: Space(CONV, s, target) for s in sketches_for(CONV)}
    scorer = CostModelScorer(spaces, target, seed=0)  # the packaged model: the MLP is active
    name = min(spaces)
    rel, inputs = scorer.relaxations[name], scorer.inputs[name]
    blend = scorer.differentiable
    xs = np.asarray(rel.sample_x(jax.random.PRNGKey(0), 4))
    for weight in (1.0, 0.0):  # the MLP, then the prior, through the same blend
        params = dict(blend.params, w=np.float32(weight))
        soft = scorer.soft_score(1.0)

        def batch_of_one(p, x):
            f = features(inputs, x, Smooth.soft(1.0))
            return blend.apply(p, Features(f.access[None], f.mask[None], f.glob[None]))[0]

        ours = jax.jit(jax.vmap(jax.value_and_grad(soft, argnums=2), in_axes=(None, None, 0)))
        ref = jax.jit(jax.vmap(jax.value_and_grad(batch_of_one, argnums=1), in_axes=(None, 0)))
        (v, g), (v_ref, g_ref) = ours(params, inputs, jnp.asarray(xs)), ref(params, jnp.asarray(xs))
        assert np.isfinite(g).all() and np.abs(g).max() > 0
        np.testing.assert_allclose(v, v_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)
    pts = rel.round_points(xs)[0]
    hard = jax.jit(jax.vmap(lambda x: blend.apply(blend.params, Features(
        *(a[None] for a in features(inputs, x, Smooth.hard_mode()))))[0]))(jnp.asarray(pts))
    np.testing.assert_allclose(scorer.score_x(name, pts), hard, rtol=1e-5, atol=1e-5)


def test_scorer_features_of_interleaved_sketches_keep_the_configs_order():
    """The shared scorer groups configs by sketch to compute their features, then puts them back in order."""
    from codegen.space import Space, sketches_for

    task = fj.ops.conv2d(1, 16, 10, 10, out_channels=16, kernel=3, padding=1)
    spaces = {s.name: Space(task, s, fj.Target.cpu()) for s in sketches_for(task, fj.Target.cpu())}
    scorer = CostModelScorer(spaces, fj.Target.cpu(), seed=0)
    rng = np.random.default_rng(0)
    names = sorted(spaces)
    configs = [spaces[names[i % len(names)]].sample(rng) for i in range(24)]  # the sketches interleaved
    f = scorer.features(configs)
    for i, c in enumerate(configs):
        one = scorer.features_x(c.sketch, scorer.relaxations[c.sketch].to_x(c)[None])
        for k in ("access", "mask", "glob"):
            np.testing.assert_array_equal(getattr(f, k)[i], getattr(one, k)[0])
