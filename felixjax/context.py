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
from .points import first_appearance  # noqa: F401  (re-exported: strategies import only the context)
from .ranker import check_ranker  # noqa: F401  (re-exported: strategies import only the context)
from .threads import in_threads, usable_cores  # noqa: F401  (re-exported: strategies import only the context)


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

    def release_scorer(self) -> None:
        """Drop this task's view of the model (its relaxations and feature tables: ~2 MB of JAX arrays a
        task); a finished run's context keeps nothing heavy, and :meth:`get_scorer` makes it again if asked."""
        self._scorer = None

    def get_scorer(self, cost_model: str | None = "auto", *, ranker: str | None = None, ranker_data: str | None = None,
                   opening: str = "shared"):
        """The scorer of this task: the session's shared one when the context has a factory, else a
        scorer of its own (``cost_model``: a pretrained checkpoint to start that one from, ``"auto"`` the
        packaged one on CPU targets, ``None`` none; ``ranker``,
        ``ranker_data``: a tree ranker for it, :func:`felixjax.model.make_ranker`; ``opening``: what ranks the
        task's first rounds, :class:`felixjax.model.OnlineCostModel`)."""
        if self._scorer is None:
            if self.scorer_factory is not None:
                self._scorer = self.scorer_factory(self)
            elif ranker is not None or ranker_data is not None or opening != "shared":
                self._scorer = _model.make_scorer(self, cost_model, ranker, ranker_data, opening=opening)
            else:
                args = (self,) if cost_model == "auto" else (self, cost_model)  # make_scorer(ctx) stays valid
                self._scorer = _model.make_scorer(*args)
        return self._scorer


def check_opening(opening: str) -> str:
    """The learned strategies' ``opening`` (one of :attr:`felixjax.model.OnlineCostModel.OPENINGS`), checked."""
    if opening not in _model.OnlineCostModel.OPENINGS:
        raise ValueError(f"opening must be one of {_model.OnlineCostModel.OPENINGS} (got {opening!r})")
    return opening


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
        shared = getattr(self._scorer, "shared", None)  # the model that ranks this task (its opening included)
        mean = shared.predict(feats, self._scorer.group) if shared is not None else self._scorer.model.predict(feats)
        return np.asarray(mean, np.float64) - self.beta * np.asarray(std, np.float64)

    def __getattr__(self, name: str):
        return getattr(self._scorer, name)


class Judge:
    """A second cost model that re-scores what the first one chose (the ``judge`` option of both learned
    strategies). A search measures the configs its model scores highest, and among those the model's
    errors are biased upwards (the optimizer's curse: a descent or an evolution ends where the model
    over-rates); a model with errors of its own (another checkpoint, e.g. pretrained on another
    machine's measurements) is not biased on them. Candidates are generated on the first model and
    ranked by ``(1 − weight) · first + weight · judge``; the judge is a model of its own for the task
    (:func:`felixjax.model.make_scorer`), fine-tuned on the run's measurements as the first is.

    ``cost_model``: the judge's pretrained checkpoint (``"judge"``: the second one shipped with
    felixjax, :data:`felixjax.model.PACKAGED_JUDGE`)."""

    def __init__(self, ctx: SearchContext, cost_model: str, weight: float):
        _, self.weight = check_judge(cost_model, weight)
        self.scorer = _model.make_scorer(ctx, _model.resolve_judge(cost_model))
        self.update(ctx.history)  # a resumed run's measurements

    def update(self, records: list) -> None:
        self.scorer.update([r for r in records if r.ok])

    def blend_x(self, sketch: str, xs: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """The blended scores of integer points ``xs`` of one sketch, ``scores`` being the first model's."""
        if not len(xs):
            return scores
        return (1.0 - self.weight) * np.asarray(scores, np.float64) + self.weight * self.scorer.score_x(sketch, xs)

    def blend(self, configs: list, scores: np.ndarray) -> np.ndarray:
        """The blended scores of ``configs`` (any sketches), ``scores`` being the first model's."""
        if not configs:
            return np.asarray(scores, np.float64)
        return (1.0 - self.weight) * np.asarray(scores, np.float64) + self.weight * self.scorer.score(configs)


def check_judge(judge: str | None, weight: float) -> tuple[str | None, float]:
    """The learned strategies' ``judge`` and ``judge_weight`` (in (0, 1] when there is a judge), checked."""
    if judge is not None and not 0.0 < weight <= 1.0:
        raise ValueError(f"judge_weight must be in (0, 1] (got {weight})")
    return judge, float(weight)


def judge_for(judges: dict, ctx: SearchContext, cost_model: str | None, weight: float) -> Judge | None:
    """The :class:`Judge` of a run (one per context, kept in ``judges``), or ``None`` without ``cost_model``."""
    if cost_model is None:
        return None
    if id(ctx) not in judges or judges[id(ctx)][0] is not ctx:
        judges[id(ctx)] = (ctx, Judge(ctx, cost_model, weight))
    return judges[id(ctx)][1]
