"""A tree ranker beside the differentiable cost model (issue 15, cause 1: cost-model quality where it matters).

The gradient strategy descends on a differentiable model (the analytic prior, then the MLP); what a
search then *measures* is decided by ranking candidates. `benchmarks/model_pool.py` replayed model-guided
selection on configs measured once on real hardware: among the near-good configs a search proposes, the
roofline prior ranked at tau 0.13 (worse than picking at random by the best-at-budget measure), the MLP at
0.28, gradient-boosted trees on the same hard-mode features at 0.38, and the same trees also trained on
other tasks' measurements at **0.54** (docs/BENCHMARKS.md, "Issue 15, session 23").
:class:`TreeRanker` is that model, as a ranker only: strategies keep descending on the differentiable
model, and the session's :class:`~felixjax.model.OnlineCostModel` ranks a task's candidates with the trees
once they are fitted and the task has ``OnlineCostModel.RANKER_MIN_OWN`` (16) measurements of its own
(``GradientSearch(ranker="gbdt")``, ``GeneticSearch(ranker="gbdt")``; off by default). Trained on other
tasks alone, the trees ranked first rounds worse than the roofline prior on 2 of 4 ops (measured
ablation, docs/BENCHMARKS.md): other tasks' rows help only beside the task's own. In the searches it did not
pay off (same section): final kernels 3-4% faster for the genetic search on 4 ops of the op suite, none
for the gradient search, and 7.5% / 9% slower for both on the held-out ``fresh`` suite; hence off.

Targets are ``-log(latency)`` centred per task (a task's mean removed), so rows of tasks of different
sizes share one ranking problem; the session's own rows are weighted up against ``data`` rows (other
tasks' measurements from databases, :func:`felixjax.model.ranker_rows`: a warm start, as a pretrained model is). Needs scikit-learn
(``pip install felixjax[trees]``).
"""
from __future__ import annotations

import numpy as np

from costmodels import Features, pad_accesses

from .features import SLOTS

#: Ranker kinds a strategy's ``ranker`` option accepts.
RANKERS = ("gbdt",)


def check_ranker(ranker: str | None, ranker_data: str | None) -> tuple[str | None, str | None]:
    """A strategy's ``ranker`` / ``ranker_data`` options, checked when the strategy is made (a clear
    error then, not at its first round)."""
    if ranker is not None and ranker not in RANKERS:
        raise ValueError(f"unknown ranker {ranker!r}; available: {', '.join(RANKERS)}")
    if ranker is None and ranker_data is not None:
        raise ValueError("ranker_data without a ranker: pass ranker='gbdt' too")
    return ranker, ranker_data


def flat_features(features: Features) -> np.ndarray:
    """One row per config for a tree model: the global features, then every access slot's features
    (masked slots zeroed), padded to the feature set's full slot count."""
    f = pad_accesses(Features(*(np.asarray(a) for a in features)), len(SLOTS))
    acc = f.access * f.mask[..., None]
    return np.concatenate([f.glob, acc.reshape(len(acc), -1)], axis=1).astype(np.float32)


def centred_targets(latencies: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``-log(latency)`` minus its mean within each group (task)."""
    y = -np.log(np.asarray(latencies, np.float64))
    out = np.empty_like(y)
    for g in np.unique(groups):
        m = groups == g
        out[m] = y[m] - y[m].mean()
    return out


class TreeRanker:
    """Gradient-boosted regression trees on flattened hard-mode features (scikit-learn's
    ``HistGradientBoostingRegressor``), refit from scratch on every update (hundreds to a few thousand
    rows: well under a second). Higher score = predicted faster; scores compare configs of one task.

    Args:
        data: ``(X, y)`` rows of other tasks (:func:`felixjax.model.ranker_rows`), trained on with every fit.
        own_weight: how much a session row counts against a ``data`` row, at least; it grows so the
            session's rows weigh at least a quarter of the data's in total.
        min_rows: fit only with at least this many session rows plus data rows.
        seed: the trees' random state.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> r = TreeRanker(min_rows=8)
        >>> X = rng.normal(size=(40, 3)); lat = np.exp(X[:, 0])   # slower with feature 0
        >>> r.fit(X, lat, np.zeros(40, int))
        True
        >>> bool(r.predict(np.array([[-2.0, 0, 0]]))[0] > r.predict(np.array([[2.0, 0, 0]]))[0])
        True
    """

    def __init__(self, data: tuple[np.ndarray, np.ndarray] | None = None, *, own_weight: float = 1.0,
                 min_rows: int = 16, seed: int = 0, max_iter: int = 200):
        try:
            import sklearn  # noqa: F401
        except ImportError as e:  # pragma: no cover - the dev extra installs it
            raise ImportError("the tree ranker needs scikit-learn: pip install 'felixjax[trees]'") from e
        self.data = data
        self.own_weight, self.min_rows, self.seed, self.max_iter = float(own_weight), int(min_rows), int(seed), int(max_iter)
        self.model = None
        self.fits = 0

    @property
    def fitted(self) -> bool:
        return self.model is not None

    def fit(self, X: np.ndarray, latencies: np.ndarray, groups: np.ndarray) -> bool:
        """Refit on the session's rows (``X``: :func:`flat_features`) and the data rows; False (and
        no model) while there are fewer than ``min_rows`` rows in all."""
        from sklearn.ensemble import HistGradientBoostingRegressor

        X = np.asarray(X, np.float32)
        y = centred_targets(latencies, np.asarray(groups)) if len(X) else np.zeros(0)
        w = np.ones(len(y))
        if self.data is not None and len(self.data[1]):
            dX, dy = self.data
            w *= max(self.own_weight, len(dy) / (4.0 * max(1, len(y))))
            X, y, w = np.concatenate([X, dX]) if len(X) else dX, np.concatenate([y, dy]), np.concatenate([w, np.ones(len(dy))])
        if len(y) < self.min_rows:
            return False
        model = HistGradientBoostingRegressor(max_iter=self.max_iter, learning_rate=0.1, max_leaf_nodes=15,
                                              min_samples_leaf=3, random_state=self.seed)
        model.fit(X, y, sample_weight=w)
        self.model, self.fits = model, self.fits + 1
        return True

    def predict(self, X: np.ndarray) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("TreeRanker.predict before a successful fit")
        return np.asarray(self.model.predict(np.asarray(X, np.float32)), np.float64)
