"""What a search strategy sees: :class:`SearchContext` (the interface between the tuning session and
the strategies, so strategies import nothing else from felixjax).

The session builds one context per (task, run): the task's schedule spaces, a seeded RNG (re-seeded
each round from the run's seed, the task and the round, so a resumed run proposes what the
uninterrupted one would have), the run's measured records, and the cost model's view of the task
(:attr:`SearchContext.scorer`), which every task of the session shares.

Example:
    >>> import numpy as np, felixjax as fj
    >>> from codegen.space import Space, sketches_for
    >>> t = fj.ops.matmul(32, 32, 32)
    >>> ctx = SearchContext(t, fj.Target.cpu(), {s.name: Space(t, s, fj.Target.cpu()) for s in sketches_for(t)},
    ...                     np.random.default_rng(0))
    >>> sorted(ctx.spaces), ctx.history
    (['gemm_packed'], [])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from codegen.ops import Task
from codegen.space import Config, Space
from codegen.target import Target

from . import model as _model
from .ranker import check_ranker  # noqa: F401  (re-exported: strategies import only the context)


@dataclass
class SearchContext:
    """What a strategy may look at while proposing.

    Attributes:
        task, target: the workload and the machine.
        spaces: one schedule space per sketch, by sketch name.
        rng: the seeded generator of this round (the only source of randomness, so a seed reproduces
            a run).
        measured: every config already measured in this run (never propose these again).
        history: this run's records in order (``TuningRecord``), resumed ones included.
        scorer_factory: ``ctx -> Scorer``; the session passes its shared cost model's view of the
            task. Without one, :meth:`get_scorer` makes a scorer with a model of its own.
        round: rounds of this run so far (resumed runs count their records' rounds).
    """

    task: Task
    target: Target
    spaces: dict[str, Space]
    rng: np.random.Generator
    measured: set[Config] = field(default_factory=set)
    history: list = field(default_factory=list)
    scorer_factory: Callable[["SearchContext"], Any] | None = None
    round: int = 0
    _scorer: Any = field(default=None, repr=False)

    def space_of(self, cfg: Config) -> Space:
        return self.spaces[cfg.sketch]

    @property
    def scorer(self):
        """The cost model's view of this task (built on first use)."""
        return self.get_scorer()

    def get_scorer(self, cost_model: str | None = "auto", *, ranker: str | None = None, ranker_data: str | None = None):
        """The scorer of this task: the session's shared one when the context has a factory, else a
        scorer of its own (``cost_model``: a pretrained checkpoint to start that one from, ``"auto"`` the
        packaged one on CPU targets, ``None`` none; ``ranker``,
        ``ranker_data``: a tree ranker for it, :func:`felixjax.model.make_ranker`)."""
        if self._scorer is None:
            if self.scorer_factory is not None:
                self._scorer = self.scorer_factory(self)
            elif ranker is not None or ranker_data is not None:
                self._scorer = _model.make_scorer(self, cost_model, ranker, ranker_data)
            else:
                args = (self,) if cost_model == "auto" else (self, cost_model)  # make_scorer(ctx) stays valid
                self._scorer = _model.make_scorer(*args)
        return self._scorer


def check_pessimism(pessimism: float, share: float = 1.0) -> tuple[float, float]:
    """The learned strategies' ``pessimism`` (>= 0) and ``pessimism_share`` (in (0, 1]), checked."""
    if pessimism < 0:
        raise ValueError(f"pessimism must be >= 0 (got {pessimism})")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"pessimism_share must be in (0, 1] (got {share})")
    return float(pessimism), float(share)


def pessimistic(scorer, ensemble: str = "packaged", beta: float = 1.0):
    """The scorer's differentiable model minus ``beta`` times the disagreement of a pretrained
    ensemble (:class:`felixjax.model.Pessimistic`; ``ensemble``: ``"packaged"`` or a checkpoint of
    ``felixjax.pretrain.pretrain(..., members=K)``). CPU features only."""
    return _model.Pessimistic(scorer.differentiable, _ensemble_for(scorer, ensemble), beta)


def _ensemble_for(scorer, ensemble: str):
    if getattr(scorer, "gpu", False):
        raise ValueError("pessimism needs an ensemble over CPU features; GPU targets have none")
    return _model.load_ensemble(ensemble)


class PessimisticScorer:
    """A scorer whose :meth:`score` is the wrapped scorer's model minus ``beta`` times a pretrained
    ensemble's disagreement (the genetic strategy's ``pessimism``: the same penalty the gradient
    strategy descends on, applied where the genetic search ranks). Everything else is the wrapped
    scorer's (``update`` feeds the shared model as before)."""

    def __init__(self, scorer, ensemble: str = "packaged", beta: float = 1.0):
        self._scorer, self._ens, self.beta = scorer, _ensemble_for(scorer, ensemble), float(beta)

    def score(self, configs: list) -> np.ndarray:
        if not configs:
            return np.zeros(0)
        feats = self._scorer.features(configs)
        _, std = self._ens.predict_with_std(feats)
        return np.asarray(self._scorer.model.predict(feats), np.float64) - self.beta * np.asarray(std, np.float64)

    def __getattr__(self, name: str):
        return getattr(self._scorer, name)
