"""Cost-aware tuning (issue 19): cold-candidate filtering and early stop, off by default.

Autotuning cost is the trials measured. Trimmer cut it by not measuring candidates that cannot win and
by stopping when the expected improvement no longer pays; these are the two options here, both driven
by an uncertainty estimate of the cost model (an ensemble's mean and spread,
:class:`costmodels.EnsembleCostModel`):

* **cold-candidate filtering** (``filter_p``): before a round is measured, the probability that each
  candidate beats the run's current best is ``P = Φ((μ_c − μ_b) / σ)`` with ``μ`` the ensemble's mean
  predicted score (−log latency) of the candidate and of the best measured config, and
  ``σ = sqrt(σ_c² + σ_b² + σ_0²)`` their spreads plus a floor. Candidates with ``P < filter_p`` (the
  rest of the batch, once the promising ones are kept) are skipped: not measured, not counted as
  trials. The opening defaults are never skipped, and a round keeps at least its most promising
  candidate.
* **early stop** (``early_stop``): the expected gain per trial of the next round is the largest
  expected improvement ``EI = σ φ(z) + (μ_c − μ_b) Φ(z)`` among the candidates it would measure (a
  stand-in for the expected improvement of the round's best), divided by the trials the round costs;
  in −log latency, so ``0.001`` is 0.1 % of latency per trial. When it stays below ``early_stop`` for ``patience``
  rounds **and** the run's best improved by less than that per trial over the last ``window`` trials,
  the run ends with ``stop_reason = "early_stop"``; under ``fj.tune_model``'s task scheduler its
  budget goes to the other tasks.
* **the plateau rule** (``stop_rule="plateau"``, robust to late jumps; :func:`plateau_decision`): the
  observed gain over ``window`` is under ``early_stop`` *and* the best has not improved (by more than
  ``improve_eps``) for ``max(window, plateau * n_last) * (1 + jump_weight * J)`` trials, with ``n_last``
  the trial of the last improvement and ``J`` its size (−log ratio): a run that found its best late, or
  by a big jump, must stay flat for longer; never before ``min_share`` of the run's trial budget; and
  once it fires the run measures ``explore`` more trials (a final exploration block) and stops only if
  they did not improve the best (else the rule starts over). It needs no model: a replayed log gives the
  same decision (``benchmarks/cost_aware_stoprule.py`` evaluates it offline on recorded logs).
* ``min_keep``: filtering keeps at least this share of each round (the most promising candidates), so
  that rounds do not shrink to one trial each paying a whole proposal and an ensemble fit.

Neither acts before ``warmup`` correct measurements of the run (the ensemble needs data). The ensemble
is fitted on the run's correct measurements (features from the session's cost model) and fine-tuned
each round; any object with ``update(ctx, records)`` and ``predict(ctx, configs) -> (mean, std)`` can
stand in for it (``uncertainty=``; tests use the synthetic oracle).

Example:
    >>> ca = CostAware(filter_p=0.05, early_stop=0.002)
    >>> ca.enabled, CostAware().enabled
    (True, False)
"""
from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

STOP_RULES = ("both", "model", "observed", "plateau")


@dataclass(frozen=True)
class CostAware:
    """Options of cost-aware tuning (``None``: that option is off).

    Attributes:
        filter_p: skip candidates whose probability of beating the current best is below this.
        early_stop: end the run when the expected gain per trial (−log latency units) is below this.
        warmup: correct measurements of the run before either option acts.
        patience: consecutive rounds under ``early_stop`` before stopping.
        window: trials over which the run's observed improvement per trial must also be under it.
        sigma_floor: ``σ_0``, the floor of the uncertainty (model error the ensemble does not see).
        members, hidden: the ensemble's size and width.
        uncertainty: ``() -> estimator`` replacing the ensemble (tests: an oracle with noise).
        stop_rule: what early stop needs below ``early_stop``: ``"both"`` the ensemble's expected gain
            (``patience`` rounds) and the observed gain over ``window`` trials; ``"model"`` the first;
            ``"observed"`` the second (without ``filter_p`` no ensemble is fitted at all). Calibrated on
            the replay oracle's ``calibration`` suite: ``early_stop=0.001, stop_rule="observed",
            window=128, warmup=64`` without filtering (docs/BENCHMARKS.md; it lost 14% on the op suite).
            ``"plateau"``: :func:`plateau_decision` (the options below; no model needed). The default
            stays ``"both"``; :meth:`CostAware.calibrated` gives the plateau rule that held-out
            calibration on replayed logs picked (docs/BENCHMARKS.md, "Cost-aware tuning").
        min_share: ``"plateau"`` never stops before this share of the run's trial budget (a network's task,
            which has none of its own: of its even share of the session's budget).
        plateau, jump_weight, improve_eps: ``"plateau"``'s patience in trials,
            ``max(window, plateau * n_last) * (1 + jump_weight * J)`` (see :func:`plateau_decision`).
        explore: trials of the final exploration block measured after ``"plateau"`` fires.
        min_keep: filtering keeps at least this share of a round's proposals (``None``: one candidate).
    """

    filter_p: float | None = None
    early_stop: float | None = None
    warmup: int = 24
    patience: int = 2
    window: int = 32
    sigma_floor: float = 0.03
    members: int = 3
    hidden: int = 64
    uncertainty: Callable[[], Any] | None = None
    stop_rule: str = "both"
    min_share: float = 0.5
    plateau: float = 0.0
    jump_weight: float = 0.0
    improve_eps: float = 1e-3
    explore: int = 64
    min_keep: float | None = None

    def __post_init__(self) -> None:
        if self.stop_rule not in STOP_RULES:
            raise ValueError(f"stop_rule must be one of {', '.join(map(repr, STOP_RULES))} (got {self.stop_rule!r})")
        if not 0 <= self.min_share <= 1:
            raise ValueError(f"min_share must be in [0, 1] (got {self.min_share})")
        if self.plateau < 0 or self.jump_weight < 0 or self.improve_eps < 0 or self.explore < 0:
            raise ValueError("plateau, jump_weight, improve_eps and explore must be >= 0")
        if self.min_keep is not None and not 0 < self.min_keep <= 1:
            raise ValueError(f"min_keep must be in (0, 1] (got {self.min_keep})")
        for name in ("filter_p", "early_stop"):  # numbers, not "0.05" or True (a TypeError deep inside)
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number or None (got {v!r})")
        if self.filter_p is not None and not 0 < self.filter_p < 1:
            raise ValueError(f"filter_p must be in (0, 1) (got {self.filter_p})")
        if self.early_stop is not None and not self.early_stop > 0:
            raise ValueError(f"early_stop must be > 0 (got {self.early_stop})")
        for name, low in (("warmup", 1), ("patience", 1), ("window", 1), ("explore", 0), ("members", 1),
                          ("hidden", 1)):  # counts (session 80: a float window failed mid-run)
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
                raise ValueError(f"{name} must be a whole number >= {low} (got {v!r})")
            object.__setattr__(self, name, int(v))  # (a numpy int's repr would not match a stored early-stop mark)

    @property
    def enabled(self) -> bool:
        return self.filter_p is not None or self.early_stop is not None

    @classmethod
    def calibrated(cls, **overrides: Any) -> CostAware:
        """The early-stop rule that held-out calibration on replayed logs picked (session 17: genetic and
        gradient runs of 18 tasks x 2 seeds x 512 trials, thresholds picked on half the tasks, both halves
        picking this): ``stop_rule="plateau"``, ``early_stop=1e-4``, ``window=64``, ``warmup=64``,
        ``min_share=0.5``, no final exploration block, no filtering. It never stops before half the
        budget, then stops at the first round whose last 64 trials did not improve the best. What it saved
        and lost there and on real measurements: docs/BENCHMARKS.md, "Cost-aware tuning"."""
        kw = {"early_stop": 1e-4, "stop_rule": "plateau", "window": 64, "warmup": 64, "min_share": 0.5,
              "plateau": 0.0, "jump_weight": 0.0, "explore": 0}
        return cls(**{**kw, **overrides})

    @classmethod
    def of(cls, filter_p: float | None = None, early_stop: float | str | None = None,
           cost_aware: CostAware | None = None) -> CostAware | None:
        """The options of ``fj.tune(filter_p=..., early_stop=..., cost_aware=...)``, or None when all are
        off. ``early_stop="calibrated"`` is :meth:`calibrated` (as ``--early-stop calibrated``, with
        ``filter_p``); ``cost_aware`` is all the options at once, so it goes alone."""
        if cost_aware is not None:
            if filter_p is not None or early_stop is not None:
                raise ValueError("give cost_aware= alone, or filter_p= / early_stop= without it (both were given)")
            if not isinstance(cost_aware, CostAware):
                raise ValueError(f"cost_aware must be a CostAware (say CostAware.calibrated()), got {cost_aware!r}")
            return cost_aware if cost_aware.enabled else None
        if early_stop == "calibrated":
            ca = cls.calibrated(filter_p=filter_p)
        else:
            ca = cls(filter_p=filter_p, early_stop=early_stop)
        return ca if ca.enabled else None


def observed_gain(lat: list[float], window: int) -> float:
    """Improvement of −log(best latency) per trial over the last ``window`` entries of ``lat``
    (latencies in trial order, ``inf`` for failures); ``inf`` while there are too few."""
    if len(lat) <= window:
        return math.inf
    then, now = min(lat[:-window], default=math.inf), min(lat, default=math.inf)
    return math.log(then / now) / window if math.isfinite(then) else math.inf


def last_improvement(lat: list[float], eps: float) -> tuple[int, float]:
    """``(n_last, J)``: the trial count at which the best last improved by more than ``eps`` (relative)
    and the size of that improvement in −log latency (the first correct trial counts with ``J = 0``)."""
    best, n_last, jump = math.inf, 0, 0.0
    for i, x in enumerate(lat):
        if x < best * (1 - eps):
            jump = math.log(best / x) if math.isfinite(best) else 0.0
            best, n_last = x, i + 1
    return n_last, jump


def plateau_decision(lat: list[float], budget: int | None, opt: CostAware,
                     fired: tuple[int, float] | None) -> tuple[bool, tuple[int, float] | None]:
    """One decision of ``stop_rule="plateau"`` before a round: ``(stop, fired)``.

    ``lat`` is the run so far (latencies in trial order, ``inf`` for failures), ``budget`` its trial
    budget (``None``: unknown, then ``min_share`` does not apply), ``fired`` the state carried between
    rounds (``(trials, best)`` when the rule fired and the final exploration block is under way).
    Pure and deterministic: the same log gives the same decisions, live or replayed.

    It fires when, with ``n = len(lat)`` trials measured:

    * ``n >= warmup`` and ``n >= min_share * budget``;
    * the best improved by less than ``early_stop`` per trial over the last ``window`` trials;
    * the best has not improved by more than ``improve_eps`` for at least
      ``max(window, plateau * n_last) * (1 + jump_weight * J)`` trials.

    Having fired it stops at once when ``explore == 0``; otherwise it stops at the first round after at
    least ``explore`` more trials if they did not improve the best by more than ``improve_eps``; if they
    did (a late jump), it forgets that it fired.
    """
    n = len(lat)
    best = min(lat, default=math.inf)
    if fired is not None:
        if best < fired[1] * (1 - opt.improve_eps):
            fired = None  # the exploration block found a better region: go on
        elif n - fired[0] >= opt.explore:
            return True, fired
        else:
            return False, fired
    ok = sum(1 for x in lat if math.isfinite(x))
    if ok < opt.warmup or budget is not None and n < opt.min_share * budget or not math.isfinite(best):
        return False, None
    if opt.early_stop is None or not observed_gain(lat, opt.window) < opt.early_stop:
        return False, None
    n_last, jump = last_improvement(lat, opt.improve_eps)
    if n - n_last < max(opt.window, opt.plateau * n_last) * (1 + opt.jump_weight * jump):
        return False, None
    fired = (n, best)
    return opt.explore == 0, fired


def _budget(tr: Any) -> int | None:
    """The trials ``min_share`` counts against: the run's own budget, else its expected share."""
    return tr.trials if tr.trials is not None else getattr(tr, "share", None)


class EnsembleUncertainty:
    """The run's own small :class:`costmodels.EnsembleCostModel` over the session's features."""

    def __init__(self, members: int = 3, hidden: int = 64, seed: int = 0):
        self.members, self.hidden, self.seed = members, hidden, seed
        self.model = None
        self._configs: list = []
        self._lat: list[float] = []
        self._seen: set = set()

    def update(self, ctx: Any, records: list) -> None:
        new = [r for r in records if r.ok and r.config not in self._seen]
        if not new:
            return
        from costmodels import EnsembleCostModel, TrainConfig

        from .features import N_ACCESS_FEATURES, N_GLOBAL_FEATURES

        for r in new:
            self._seen.add(r.config)
            self._configs.append(r.config)
            self._lat.append(r.latency_s)
        if self.model is None:
            self.model = EnsembleCostModel(N_ACCESS_FEATURES, N_GLOBAL_FEATURES, num_members=self.members,
                                           hidden=self.hidden, seed=self.seed,
                                           config=TrainConfig(sample_budget=2048, max_epochs=40, min_epochs=3))
        self.model.update(ctx.scorer.features(self._configs), np.asarray(self._lat), None)

    def predict(self, ctx: Any, configs: list) -> tuple[np.ndarray, np.ndarray]:
        return self.model.predict_with_std(ctx.scorer.features(list(configs)))


def _phi(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _Phi(z: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * (1.0 + np.vectorize(erf)(z / math.sqrt(2.0)))


class Screen:
    """The per-run state of cost-aware tuning: the uncertainty estimator, rounds under the threshold."""

    def __init__(self, options: CostAware, seed: int = 0):
        self.options = options
        self.estimator = options.uncertainty() if options.uncertainty is not None else EnsembleUncertainty(
            options.members, options.hidden, seed)
        self.fed = 0  # records of the run fed to the estimator
        self.cold_rounds = 0
        self.fired: tuple[int, float] | None = None  # the plateau rule's state (its exploration block)
        self.last: dict = {}
        self.trace: list[dict] = []  # one entry per screened round (offline calibration of the thresholds)

    def _feed(self, ctx: Any) -> int:
        new = ctx.history[self.fed:]
        self.fed = len(ctx.history)
        if new:
            self.estimator.update(ctx, new)
        return sum(1 for r in ctx.history if r.ok)

    def observed_gain(self, history: list) -> float:
        """The run's improvement of −log(best latency) per trial over the last ``window`` trials."""
        w = self.options.window
        if len(history) <= w:
            return math.inf
        best_then = min((r.latency_s for r in history[:-w] if r.ok), default=math.inf)
        best_now = min((r.latency_s for r in history if r.ok), default=math.inf)
        if not math.isfinite(best_then):
            return math.inf
        return math.log(best_then / best_now) / w

    def screen(self, tr: Any, cands: list, n_head: int) -> tuple[list, str]:
        """``(candidates to measure, stop reason or "")`` for one round of run ``tr``."""
        t0 = time.perf_counter()
        try:
            return self._screen(tr, cands, n_head)
        finally:
            tr.stats["screen_s"] = tr.stats.get("screen_s", 0.0) + time.perf_counter() - t0

    def _screen(self, tr: Any, cands: list, n_head: int) -> tuple[list, str]:
        ctx, opt = tr.ctx, self.options
        if opt.filter_p is None and opt.stop_rule == "plateau":  # no model needed: no ensemble to fit
            lat = [r.latency_s if r.ok else math.inf for r in ctx.history]
            stop, self.fired = plateau_decision(lat, _budget(tr), opt, self.fired)
            self.trace.append({"trials": len(ctx.history), "clock": tr.clock, "fired": self.fired is not None})
            return ([], "early_stop") if stop else (cands, "")
        if opt.filter_p is None and opt.stop_rule == "observed":  # no model needed: no ensemble to fit
            if sum(1 for r in ctx.history if r.ok) < opt.warmup or len(cands) <= n_head:
                return cands, ""
            observed = self.observed_gain(ctx.history)
            tr.stats["observed_gain"] = observed
            self.trace.append({"trials": len(ctx.history), "clock": tr.clock, "observed": observed})
            return ([], "early_stop") if observed < opt.early_stop else (cands, "")
        if self._feed(ctx) < opt.warmup or len(cands) <= n_head:
            return cands, ""
        best = min((r for r in ctx.history if r.ok), key=lambda r: r.latency_s)
        rest = cands[n_head:]
        mu, sd = self.estimator.predict(ctx, [best.config] + rest)
        mu, sd = np.asarray(mu, np.float64), np.asarray(sd, np.float64)
        sigma = np.sqrt(sd[1:] ** 2 + sd[0] ** 2 + opt.sigma_floor ** 2)
        delta = mu[1:] - mu[0]
        z = delta / sigma
        p = _Phi(z)
        ei = np.maximum(sigma * _phi(z) + delta * _Phi(z), 0.0)
        keep = np.ones(len(rest), bool)
        if opt.filter_p is not None:
            keep = p >= opt.filter_p
            if not keep.any() and not n_head:
                keep[int(np.argmax(p))] = True  # a round measures at least its most promising candidate
            if opt.min_keep is not None:  # and at least min_keep of the round, the most promising first
                k = min(len(rest), math.ceil(opt.min_keep * len(cands)) - n_head)
                if k > int(keep.sum()):
                    keep[np.argsort(-p, kind="stable")[:k]] = True
        kept = cands[:n_head] + [c for c, k in zip(rest, keep) if k]
        gain = float(ei[keep].max()) / int(keep.sum()) if keep.any() else 0.0
        tr.stats["filtered"] = tr.stats.get("filtered", 0) + int((~keep).sum())
        tr.stats["expected_gain"] = gain
        self.last = {"p": p, "ei": ei, "gain": gain, "kept": int(keep.sum()), "proposed": len(rest)}
        self.trace.append({"trials": len(ctx.history), "clock": tr.clock, "best_s": best.latency_s, "gain": gain,
                           "ei_max": float(ei.max()), "ei_top": float(np.sort(ei)[::-1][:len(cands)].sum()),
                           "observed": self.observed_gain(ctx.history), "kept": int(keep.sum()),
                           "proposed": len(rest)})
        if opt.early_stop is not None and opt.stop_rule == "plateau":
            lat = [r.latency_s if r.ok else math.inf for r in ctx.history]
            stop, self.fired = plateau_decision(lat, _budget(tr), opt, self.fired)
            if stop:
                return [], "early_stop"
        elif opt.early_stop is not None:
            self.cold_rounds = self.cold_rounds + 1 if gain < opt.early_stop else 0
            model_cold = self.cold_rounds >= opt.patience
            observed_cold = self.observed_gain(ctx.history) < opt.early_stop
            if {"model": model_cold, "observed": observed_cold, "both": model_cold and observed_cold}[opt.stop_rule]:
                return [], "early_stop"
        return kept, ""
