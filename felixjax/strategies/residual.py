"""What the cost model gets wrong on this run's measurements, as a Gaussian process in schedule space.

The shared cost model ranks near-good configs of a task poorly (issue 15: Kendall tau 0.1-0.3 among a
search's proposals), and it is fitted across tasks, so one task's measurements move it little. This
module corrects it locally, per run: the measured ``-log(latency)`` of the task's configs is modelled as

    y(x) = a · score(x) + b + f(x),     f ~ GP(0, s² · exp(-|x - x'|² / 2ℓ²))

with ``score`` the model's (hard-feature) prediction, ``a, b`` a calibration shrunk toward ``a = 1``
(least squares over every measured config of the task), and ``f`` a Gaussian process over the integer
points ``x`` of one sketch's relaxation (tile exponents and knobs, one length scale ``ℓ`` and a noise
share picked by marginal likelihood on a small grid). The GP's mean is smooth in ``x``, so the gradient
search can descend on ``a · score + f`` — on the model and on the measurements around the points it
has measured at once (the measured-neighbour descent of DGD, ICS'24, through a differentiable
interpolant instead of ±1 moves) — and rank its candidates by ``a · score + b + f + β · std(f)``.

Off by default (``GradientSearch(residual=True)`` turns it on): measured in three ablations and offline
(docs/BENCHMARKS.md, "Issue 15, session 30"), it did not make the gradient search beat the genetic search
on shapes it was not designed on, and it ranks a round's candidates worse than the fine-tuned model alone.

Example:
    >>> import numpy as np
    >>> xs = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0], [2.0, 2.0], [0.0, 2.0],
    ...                [1.0, 2.0]])
    >>> fit = fit_residual(xs, xs[:, 0] - xs[:, 1], rows=16)
    >>> mu, sd = fit.predict(xs)
    >>> bool(np.corrcoef(mu, xs[:, 0] - xs[:, 1])[0, 1] > 0.9)
    True
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

#: length scales (exponent units: 1 = a factor of 2 in a tile) and noise shares tried by marginal likelihood
LENGTHSCALES = (0.75, 1.0, 1.5, 2.5)
NOISES = (0.05, 0.25)
MIN_POINTS = 8  # measured configs of a sketch before its GP is fitted (fewer: only the calibration)


@dataclasses.dataclass(frozen=True)
class ResidualFit:
    """A fitted GP over one sketch's measured points, padded to a fixed number of rows (``mask``) so the
    descent that reads it compiles once per sketch shape.

    Attributes:
        xs: ``[R, D]`` measured integer points (padded rows are zero, ``mask`` 0).
        alpha: ``[R]`` the weights of the posterior mean, ``K⁻¹ (r − mean)`` with ``K`` the real rows' kernel
            matrix, noise included (0 on padded rows).
        mask: ``[R]`` 1 on real rows.
        mean: the residuals' mean (the GP's constant mean).
        signal: ``s²``, the kernel's variance.
        lengthscale: ``ℓ``.
        chol: the lower Cholesky factor of the real rows' kernel matrix (for the posterior std).
    """

    xs: np.ndarray
    alpha: np.ndarray
    mask: np.ndarray
    mean: float
    signal: float
    lengthscale: float
    chol: np.ndarray

    def _kernel(self, pts: np.ndarray) -> np.ndarray:
        n = int(self.mask.sum())
        d2 = np.sum((np.asarray(pts, np.float64)[:, None, :] - self.xs[None, :n, :]) ** 2, axis=-1)
        return self.signal * np.exp(-0.5 * d2 / self.lengthscale ** 2)

    def predict(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean (the constant mean included) and std of ``f`` at integer points ``[P, D]``."""
        pts = np.asarray(pts, np.float64)
        if not len(pts):
            return np.zeros(0), np.zeros(0)
        n = int(self.mask.sum())
        k = self._kernel(pts)  # [P, n]
        mu = self.mean + k @ self.alpha[:n]
        v = np.linalg.solve(self.chol, k.T)  # L⁻¹ kᵀ, [n, P] (n <= a few hundred)
        var = np.maximum(self.signal - np.sum(v * v, axis=0), 0.0)
        return mu, np.sqrt(var)

    def arrays(self) -> tuple:
        """``(xs, alpha, mask, lengthscale, mean)`` as float32 arrays for :func:`gp_mean`."""
        return (jnp.asarray(self.xs, jnp.float32), jnp.asarray(self.alpha * self.signal, jnp.float32),
                jnp.asarray(self.mask, jnp.float32), jnp.float32(self.lengthscale), jnp.float32(self.mean))


def gp_mean(x, xs, alpha, mask, lengthscale, mean):
    """The GP's posterior mean at one relaxed point ``x`` (differentiable; ``alpha`` is 0 on padded rows).
    The kernel's variance is folded into ``alpha``."""
    d2 = jnp.sum((xs - x) ** 2, axis=-1)
    return mean + jnp.sum(mask * alpha * jnp.exp(-0.5 * d2 / lengthscale ** 2))


def empty_arrays(n_x: int, rows: int) -> tuple:
    """:func:`gp_mean`'s arguments of a GP that is zero everywhere (a sketch without one yet)."""
    z = jnp.zeros((rows,), jnp.float32)
    return jnp.zeros((rows, n_x), jnp.float32), z, z, jnp.float32(1.0), jnp.float32(0.0)


def _log_marginal(chol: np.ndarray, r: np.ndarray) -> tuple[float, np.ndarray]:
    a = np.linalg.solve(chol.T, np.linalg.solve(chol, r))
    return float(-0.5 * r @ a - np.sum(np.log(np.diag(chol)))), a


def fit_residual(xs: np.ndarray, resid: np.ndarray, *, rows: int, lengthscales=LENGTHSCALES,
                 noises=NOISES) -> ResidualFit:
    """Fit the GP to residuals ``resid`` at integer points ``xs`` (at most ``rows`` of them are kept by
    the caller's order: give the best measured first). Length scale and noise share: the best log
    marginal likelihood over the grid ``lengthscales`` x ``noises``."""
    xs = np.asarray(xs, np.float64)[:rows]
    r = np.asarray(resid, np.float64)[:rows]
    n, d = xs.shape
    mean = float(r.mean())
    rc = r - mean
    signal = max(float(rc.var()), 1e-4)
    d2 = np.sum((xs[:, None, :] - xs[None, :, :]) ** 2, axis=-1)
    best = None
    for ell in lengthscales:
        base = signal * np.exp(-0.5 * d2 / ell ** 2)
        for noise in noises:
            chol = np.linalg.cholesky(base + (noise * signal + 1e-8) * np.eye(n))
            lml, alpha = _log_marginal(chol, rc)
            if best is None or lml > best[0]:
                best = (lml, ell, chol, alpha)
    _, ell, chol, alpha = best
    pad_x = np.zeros((rows, d))
    pad_x[:n] = xs
    pad_a = np.zeros(rows)
    pad_a[:n] = alpha
    mask = np.zeros(rows)
    mask[:n] = 1.0
    return ResidualFit(pad_x, pad_a, mask, mean, signal, ell, chol)


def calibrate(scores: np.ndarray, y: np.ndarray, shrink: float = 1.0) -> tuple[float, float]:
    """``(a, b)`` of ``y ≈ a · score + b`` by least squares, the slope shrunk toward 1 (a ridge of weight
    ``shrink`` times the scores' variance) and clipped to ``[0.1, 2]``: the model's scores are already in
    ``-log(latency)`` units when it is good, and a handful of measurements should not flip it."""
    s, y = np.asarray(scores, np.float64), np.asarray(y, np.float64)
    if len(s) < 2:
        return 1.0, float(np.mean(y - s)) if len(s) else 0.0
    vs = float(np.var(s))
    cov = float(np.mean((s - s.mean()) * (y - y.mean())))
    a = float(np.clip((cov + shrink * vs) / max(vs * (1.0 + shrink), 1e-12), 0.1, 2.0))
    return a, float(y.mean() - a * s.mean())
