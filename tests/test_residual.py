"""The residual GP lever of the gradient search (``GradientSearch(residual=True)``): the GP's numerics
(interpolation, its differentiable mean against finite differences), the calibration, and that the
strategy's descent and ranking read it (on the replay oracle)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import felixjax as fj
from costmodels import kendall_tau
from felixjax.session import TuningSession
from felixjax.strategies.gradient import RESIDUAL_ROWS, GradientSearch
from felixjax.strategies.residual import (
    ResidualFit,
    calibrate,
    empty_arrays,
    fit_residual,
    gp_mean,
)
from felixjax.testing import ReplayRunner


def _smooth(xs):
    return np.sin(0.8 * xs[:, 0]) + 0.3 * xs[:, 1] - 0.1 * xs[:, 2] ** 2


def test_the_gp_interpolates_and_knows_where_it_has_no_data():
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 6, size=(48, 3)).astype(np.float64)
    fit = fit_residual(xs, _smooth(xs), rows=64)
    assert fit.mask.sum() == 48 and fit.xs.shape == (64, 3)
    mu, sd = fit.predict(xs)
    assert np.max(np.abs(mu - _smooth(xs))) < 0.25 * np.std(_smooth(xs)) + 0.05
    test = rng.integers(0, 6, size=(200, 3)).astype(np.float64)
    assert np.corrcoef(fit.predict(test)[0], _smooth(test))[0, 1] > 0.85  # generalises between the points
    far_mu, far_sd = fit.predict(np.full((1, 3), 40.0))
    assert far_sd[0] > 3 * sd.max() and abs(far_mu[0] - fit.mean) < 1e-6  # far away: the prior mean and std
    # the jitted mean the descent reads equals the posterior mean, and its gradient finite differences
    args = fit.arrays()
    f = jax.jit(lambda x: gp_mean(x, *args))
    np.testing.assert_allclose([float(f(jnp.asarray(x, jnp.float32))) for x in xs[:6]], mu[:6], rtol=1e-4,
                               atol=1e-4)
    x0 = np.array([2.3, 1.7, 3.1])
    g = np.asarray(jax.grad(lambda x: gp_mean(x, *args))(jnp.asarray(x0, jnp.float32)))
    h = 1e-3
    fd = [(fit.predict((x0 + h * e)[None])[0][0] - fit.predict((x0 - h * e)[None])[0][0]) / (2 * h)
          for e in np.eye(3)]
    np.testing.assert_allclose(g, fd, rtol=2e-2, atol=2e-3)
    # an empty GP is zero everywhere, with zero gradient
    z = empty_arrays(3, 8)
    assert float(gp_mean(jnp.ones(3), *z)) == 0.0 and not np.any(np.asarray(jax.grad(gp_mean)(jnp.ones(3), *z)))


def test_calibrate_fits_the_slope_shrunk_toward_one_and_clipped():
    s = np.linspace(-1.0, 1.0, 20)
    a, b = calibrate(s, 0.5 * s + 3.0)
    assert a == pytest.approx(0.75) and b == pytest.approx(3.0)  # half-way between the fitted 0.5 and 1
    assert calibrate(s, -5.0 * s)[0] == 0.1  # an anti-correlated model keeps a small positive weight
    assert calibrate(s, 10.0 * s)[0] == 2.0
    assert calibrate(s[:1], s[:1] + 2.0) == (1.0, 2.0)


def test_the_residual_lever_reads_the_runs_measurements_in_descent_and_ranking():
    task = fj.ops.matmul(64, 48, 32)
    g = GradientSearch(batch_size=16, starts=8, residual=True)
    with TuningSession(fj.Target.cpu(), measurer=lambda t, tg: ReplayRunner.from_oracle(t), progress=False,
                       defaults=False) as s:
        run = s.add(task, g, seed=0, trials=48)
        s.step(run)
        s.step(run)
        picks = g.propose(run.ctx, 16)
        assert len(set(picks)) == 16 and not set(picks) & run.ctx.measured
        assert g.last_round["residual_fits"] >= 1 and 0.1 <= g.last_round["residual_slope"] <= 2.0
        scorer = g._ensure_scorer(run.ctx)
        a, b, fits = g._residuals
        name = next(iter(fits))
        rel = scorer.relaxations[name]
        recs = [r for r in run.history if r.ok and r.config.sketch == name]
        xs = np.stack([rel.to_x(r.config) for r in recs]).astype(np.float32)
        lat = np.array([r.latency_s for r in recs])
        raw = g._score(scorer, name, rel, xs)
        corrected = g._corrected(name, xs, raw)
        # on the measured points the corrected score is nearer the measured -log(latency) than the calibrated
        # model alone (the GP fits what the model gets wrong), and it still ranks them
        y = -np.log(lat)
        assert np.sqrt(np.mean((corrected - y) ** 2)) < 0.8 * np.sqrt(np.mean((a * raw + b - y) ** 2))
        assert kendall_tau(corrected, lat) > 0.5
        # the descent follows the GP: a bump at a valid point draws the descents there when the model's
        # weight is (nearly) zero
        target = rel.to_x(recs[0].config).astype(np.float64)
        rows = np.zeros((RESIDUAL_ROWS, len(target)))
        rows[0] = target
        alpha, mask = np.zeros(RESIDUAL_ROWS), np.zeros(RESIDUAL_ROWS)
        alpha[0], mask[0] = 50.0, 1.0
        bump = ResidualFit(rows, alpha, mask, 0.0, 1.0, 2.5, np.eye(1))
        g._residuals = (1e-4, 0.0, {name: bump})
        g.perturbed_share = 0.0  # random starts only
        iterates = g._descend(run.ctx, scorer, name, rel)
        x0, xt, _ = g._ends[name][0]
        before = np.linalg.norm(x0 - target, axis=1).mean()
        after = np.linalg.norm(xt - target, axis=1).mean()
        assert after < 0.5 * before and len(iterates) > len(x0)
