"""Gradient search (DESIGN.md ⑦–⑧): optax Adam on relaxed schedules through a differentiable cost model.

One round, per sketch:

1. starts: random points of the relaxed polytope plus perturbations of the best measured configs;
2. descent: a jitted, vmapped ``lax.scan`` of Adam steps (lr 0.5, ×0.2 at 30% of the steps, a
   fresh optimizer state every round) on ``−score(features_soft(x))`` plus a squared-hinge penalty
   on the hardware constraints whose gradient is rescaled to 5× the objective's (Felix's balance);
3. harvest: iterates of every trajectory are rounded (projection, largest-remainder floor, repair),
   deduplicated against the run's measurements, and the ±1 neighbourhood of the best few is added;
4. rank: every candidate is scored by the model on exact (hard-mode) features, the best ``8k`` again
   as half their score and half their ±1 neighbourhood's mean score (``flat``: a broad region the model
   rates well over a sharp peak); the top ``k``, kept two moves apart (``spread``), are proposed, plus
   an ε share (5%) of random valid configs for exploration.

Issue 15's other levers, all off by default: a trust region around the measured best (``trust_weight``);
an acquisition over a small ensemble fitted on the run's measurements (``acquisition="ucb"`` or
``"thompson"``); measured-neighbour moves (``local_share``: a share of each batch spent on the
model's best ±1 neighbours of the best *measured* points, as Dynamic Gradient Descent descends in
tile space on measurements); pessimism (``pessimism``, ``pessimism_share``: descend on and rank by
the score minus a pretrained ensemble's disagreement); an evolutionary pool (``evolve``: the
model's best mutants of the measured configs, bred as the genetic search breeds them, ranked in one
pool with the descents' points); a sketch the measurements have left behind held to a trickle of
candidates (``prune``); a task's first round bred by the genetic search (``breed_share``); the batch
size. Every round records in ``last_round`` how the soft objective ranks the proposed points next to
the hard (exact) features (``soft_hard_tau``) and what rounding costs (``rounding_loss``, ``left_basin``).

Example:
    >>> from felixjax.strategies import get_strategy
    >>> get_strategy("gradient").name
    'gradient'
"""
from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import kendall_tau
from costmodels.ensemble import ACQUISITIONS, EnsembleCostModel, acquire

from ..context import (check_opening, check_pessimism, check_judge, check_ranker, first_appearance, in_threads,
                       judge_for, pessimistic, usable_cores)
from .descent import _descent_for, trust_penalty  # noqa: F401 (trust_penalty: read from here by tests)
from .base import SearchContext, count_option, fresh, interleave, register, spread_picks
from .genetic import GeneticSearch
from .residual import MIN_POINTS, calibrate, empty_arrays, fit_residual

_SOFT_BATCH: dict = {}
SOFT_CHUNK = 256  # soft scores of integer points are computed in chunks of this many rows (one compilation)


def _soft_scores(score_fn, params, inputs, pts: np.ndarray) -> np.ndarray:
    """``score_fn`` (soft features) at many points ``[B, N_X]``, in padded chunks (for statistics)."""
    if id(score_fn) not in _SOFT_BATCH:
        _SOFT_BATCH[id(score_fn)] = (score_fn, jax.jit(jax.vmap(score_fn, in_axes=(None, None, 0))))
    fn = _SOFT_BATCH[id(score_fn)][1]
    pts = np.asarray(pts, np.float32)
    out = []
    for lo in range(0, len(pts), SOFT_CHUNK):
        chunk = pts[lo: lo + SOFT_CHUNK]
        pad = np.concatenate([chunk, np.repeat(chunk[-1:], SOFT_CHUNK - len(chunk), axis=0)])
        out.append(np.asarray(fn(params, inputs, jnp.asarray(pad)))[: len(chunk)])
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


def _run_descent(run, args: tuple) -> np.ndarray:
    """One descent's iterates ``[steps, S, N_X]`` as numpy (a thread waits here while XLA runs it)."""
    return np.asarray(run(*args))


def _key(x: np.ndarray) -> bytes:
    """A hashable key of an integer point (exponents and scalar knobs are small integers)."""
    return np.rint(x).astype(np.int16).tobytes()


ANCHORS = 16  # measured points a trust region is built around (padded with masked rows: one compilation)
FLAT_TOP = 8  # with ``flat``, this many candidates per pick are re-scored over their neighbourhoods
RESIDUAL_ROWS = 256  # measured points per sketch the residual GP keeps, best first (padded: one compilation)


@register("gradient")
class GradientSearch:
    """Multi-start Adam on the relaxed space through the cost model; see module docstring.

    Args:
        starts: descent starts per sketch per round (random + perturbed from the best measured).
        steps: Adam steps per round.
        lr: initial learning rate (decayed ×0.2 at 30% of the steps). 0.5 (the default): 0.15 needed 1.25x its
            trials to 95% and ended 2% slower; 1.5 needed 0.84x [0.57, 1.13] over nine seeds, 0.71x on one suite and
            1.07x with 2% slower kernels on the other (docs/BENCHMARKS.md, issue 15 session 58).
        temperature: softness of the features during descent. 1.0 (the default): 0.25 ranks the picks more
            like the hard features but needed 0.89x [0.60, 1.32] its trials to 95% over six seeds on both
            suites, within the noise (docs/BENCHMARKS.md, issue 15 sessions 37 and 57).
        harvest_every: keep every k-th iterate of each trajectory (plus the start and the last). 2 (the default):
            every iterate (1) needed 1.13x [0.78, 1.58] its trials to 95% over six seeds on both suites, every fourth
            0.96x [0.71, 1.28] over nine, final kernels level (docs/BENCHMARKS.md, issue 15 session 59).
        neighbours_of: the ±1 integer neighbourhood of this many best rounded points per sketch is scored
            too (the repair after rounding). 8 (the default): none (0) and 32 needed 0.93x [0.67, 1.18] and
            1.06x [0.87, 1.28] its trials to 95% over six seeds on both suites, each split across seed sets
            (docs/BENCHMARKS.md, issue 15 session 57).
        eps_greedy: share of random picks among the proposals.
        batch_size: candidates per round (32; Ansor and Felix's paper runs measure 64: at 32 the model is
            refitted twice as often, and the final kernels came out faster on three held-out suites,
            docs/BENCHMARKS.md, issue 15 sessions 30-32).
        perturbed_share: share of the starts drawn around the best measured configs of the sketch (the
            rest start at random; a sketch's first round, with nothing measured, starts at random). 0.5 (the
            default): all-random starts (0) needed 1.21x its trials to 95%, 90% around the measured bests
            1.16x, seed-paired on both suites (docs/BENCHMARKS.md, issue 15 session 55).
        warmup_passes: descent passes on a sketch's first round (Felix descends longer on its
            warm-up round); later rounds run one pass of ``starts``. 2 (the default): over six seeds 1 pass
            and 4 passes each needed 1.22x its trials to 95%, and 4 passes 1.21x its seconds
            (docs/BENCHMARKS.md, issue 15 sessions 55-56).
        scorer: a :class:`~felixjax.model.CostModelScorer`-like object (``relaxations``, ``inputs``,
            ``differentiable``, ``soft_score``, ``score_x``/``score``, ``update``) used for every
            task; default: the context's scorer (the session's shared model, seen from the task).
        cost_model: a pretrained MLP checkpoint (``felixjax pretrain``) for the default scorer to
            start from; ``"auto"`` (default): the model shipped with felixjax (``"packaged"``, pretrained
            on the packaged dataset of CIFAR-size layers) on CPU targets; ``None``: none (the roofline
            prior ranks until the online MLP beats it on held-out measurements).
        trust_weight, trust_radius: a trust region around the best measured points of the sketch
            (issue 15's exploration lever): the descent pays ``trust_weight · max(0, d² − radius²)``
            for a squared distance ``d²`` (in exponent units) to the nearest of them, so it does not
            chase the model where it extrapolates. 0 (the default) turns it off.
        acquisition: how the model's candidates are picked: ``"mean"`` (the default: the top
            scores), ``"ucb"`` (score + ``ucb_beta`` · ensemble std) or ``"thompson"`` (each pick
            ranks by score + ``ucb_beta`` · one random member's deviation); the ensemble
            (``ensemble_members`` MLPs of width ``ensemble_hidden`` on bootstrap resamples) is fitted on this run's
            measurements and used once it has ``MIN_ENSEMBLE`` of them, over the ``8 · k`` best
            candidates by score.
        local_share: share of each batch spent on measured-neighbour moves (DGD, ICS'24): the
            model's best unmeasured ±1 neighbours of the ``local_of`` best measured configs,
            round-robin over those configs, best first. 0 (the default) turns it off.
        ranker, ranker_data: rank candidates with a tree ranker (``"gbdt"``,
            :class:`felixjax.ranker.TreeRanker`) once it is fitted, also trained on the measurements in
            the ``ranker_data`` databases (comma-separated paths) when given; the descent stays on the
            differentiable model. ``None`` (the default): the model ranks too.
        opening: ``"packaged"``: a task's first rounds (until it has 16 measurements of its own) are
            descended on and ranked by the pretrained checkpoint as loaded, not by the shared model as
            the session's other tasks fine-tuned it; ``"shared"`` (the default) the latter
            (:class:`felixjax.model.OnlineCostModel`'s ``opening``).
        stats: record ``soft_hard_tau`` and the rounding statistics in ``last_round`` (issue 15's
            diagnostics: a few extra model evaluations per round, on the run's clock; the picks are the
            same either way). Off by default since session 33; ``benchmarks/ablation.py`` turns it on.
        pessimism: descend on, and rank by, ``score − pessimism · std`` with ``std`` the disagreement
            of a pretrained ensemble (``pessimism_model``; ``"packaged"``: 4 MLPs trained on the
            packaged dataset, CPU targets): the descent stays where the pretraining data reach
            instead of ending where the model extrapolates. 0 (the default) turns it off.
        pessimism_share: with ``pessimism``, the share of the starts that descend on the pessimistic
            objective and of the picks ranked by it; the rest descend on, and are ranked by, the plain
            score (a hedge between the two; 1, the default: all pessimistic).
        evolve: population of an evolutionary pool bred every round (the genetic search's operators:
            the best measured configs seed it, 4 generations of mutation under the same model); its
            best ``batch_size`` unmeasured configs join the descents' rounded points and are ranked
            with them by the same objective, so the batch takes whichever the model prefers
            (``last_round["evolved"]`` counts the picks that only evolution found). 0 (the default)
            turns it off.
        residual: correct the model with a Gaussian process over this run's measurements
            (:mod:`felixjax.strategies.residual`): the measured ``-log(latency)`` is fitted as a
            calibrated score plus a GP in the relaxed integer space (per sketch, once it has
            ``MIN_POINTS`` measurements); the descent follows score and GP mean together, and the
            candidates are ranked by both plus ``residual_beta`` · the GP's std. Off by default.
        residual_beta: the GP std's weight in the ranking (an upper confidence bound; 0: its mean).
        residual_rank: with ``residual``, rank by the corrected score (the default); ``False``: the GP
            steers the descent only and the model alone ranks the candidates.
        spread: the picks of a round keep this L1 distance apart in the relaxed integer space (per
            sketch; 2 is one move of :meth:`~felixjax.relax.Relaxation.neighbours_x`): in score order, a
            candidate within ``spread`` of one already picked waits until the distinct ones run out, so
            one region the model over-rates does not take the whole batch. 4 (the default, two moves); 0
            turns it off (the picks are the top scores, as before session 32). 2 and 8 needed 1.05x and
            0.96x its trials to 95% over six seeds, 8 better on one suite and worse on the other
            (docs/BENCHMARKS.md, issue 15 session 56).
        spread_from: the first round (0-based, counted in the run's rounds) whose picks are kept
            ``spread`` apart; earlier rounds take the top scores. 0 (the default): every round (1 needed
            1.96x the trials to 95% on 4 ops of the op suite: docs/BENCHMARKS.md, issue 15 session 34).
        flat: rank by a score smoothed over the ±1 neighbourhood: the ``FLAT_TOP · k`` best candidates
            by score are re-scored as ``(1 − flat) · score + flat · mean(score of their valid
            neighbours)`` before the picks (the rest rank below them), so a broad region the model rates
            well wins over a sharp peak it may over-rate (an evolutionary population's selection favours
            such regions). 0.5 (the default since session 35: in two measured ablations, 4 op-suite ops and
            the 6 ``fresh`` ops, 0.88x and 0.50x the trials to 95% of ``flat=0``, final latency 0.978x and
            1.018x; docs/BENCHMARKS.md, issue 15 session 35); 0 turns it off. 1 (the neighbourhood alone)
            needed 1.09x the default's trials, final 1.02x slower (session 54, seed-paired).
        judge, judge_weight: rank the candidates by ``(1 − judge_weight) · score + judge_weight · judge's
            score``, the judge a second model (a pretrained checkpoint; ``"judge"``: the one shipped with
            felixjax, pretrained on another machine's measurements) fine-tuned on the run's measurements
            too, that the descent never optimized against (:class:`felixjax.context.Judge`: the model is
            over-rating exactly where descents end). The descent stays on the first model. ``None`` (the
            default) turns it off.
        climb: greedy ascent on the model after the rounding: the ±1 neighbourhoods of the pool's
            ``neighbours_of`` best points are scored (always), then, up to ``climb`` more times, those of
            the points that have risen into that top since (it stops once the top's neighbourhoods are all
            scored: its best point then beats each of its unmeasured neighbours). Descents on soft
            features end below what an evolution under the same model finds; 4 steps close that gap for
            about 0.1 s per round (``benchmarks/model_optimum.py``), but reaching higher under the model
            did not reach fast kernels sooner: 0.85x the trials to 95% on 4 op-suite ops, 1.63x on the
            held-out ``fresh`` suite (docs/BENCHMARKS.md, issue 15 session 37). 0 (the default) turns it off.
        prune, prune_after, prune_keep: a sketch measured at least ``prune_after`` times whose best measured
            latency is ``prune`` times the task's best measured or slower puts only its ``prune_keep`` best
            candidates into the round's pool (a trickle, so a sketch left behind too early can come back).
            The model ranks across sketches worst: in the headline runs of sessions 41-45 the gradient
            search spent 34% and 30% of its picks after the first round on the two depthwise ops on
            sketches measured 16 times whose best was already 1.5x the run's best (genetic@32: 0.3%, 1.5%;
            its population is bred from the measured best; ``benchmarks/sketch_waste.py``). Measured
            seed-paired it needed 1.01x the default's trials to 95% (docs/BENCHMARKS.md, issue 15 session
            51). 0 (the default) turns it off; 1.5 / 16 / 1 is the setting measured.
        breed_share, breed_rounds: in a task's first ``breed_rounds`` rounds, this share of the model's picks
            are the genetic search's (Ansor's evolution under the same model: a population of 2048, 4
            generations, its best unmeasured configs in its order), alternated with the descents' best, bred
            first (``last_round["bred"]`` counts them); 1: the whole first round bred, descents after. 0 (the
            default) turns it off: 0.5 needed 1.07x [0.81, 1.67] its trials to 95% over 10 ops x 6 seeds with 1%
            slower final kernels, 1 0.96x [0.58, 1.46] over 3 seeds, better on ``fresh`` and worse on the op suite
            (docs/BENCHMARKS.md, issue 15 session 61).
        workers: threads a round's descents, and then its sketches' rounding, scoring and neighbourhoods, run
            on (``None``, the default: the cores this process may use; nothing is being timed while a search
            proposes). The starts are drawn before, in sketch order, so the picks are the same for any
            number; 1 runs everything one after another in this thread, as before session 66.
    """

    MIN_ENSEMBLE = 24

    name = "gradient"

    def __init__(self, *, starts: int = 64, steps: int = 32, lr: float = 0.5, temperature: float = 1.0,
                 harvest_every: int = 2, neighbours_of: int = 8, eps_greedy: float = 0.05, batch_size: int = 32,
                 perturbed_share: float = 0.5, warmup_passes: int = 2, scorer=None, cost_model: str | None = "auto",
                 trust_weight: float = 0.0, trust_radius: float = 2.0, acquisition: str = "mean",
                 ucb_beta: float = 1.0, ensemble_members: int = 4, ensemble_hidden: int = 64,
                 local_share: float = 0.0, local_of: int = 4, ranker: str | None = None,
                 ranker_data: str | None = None, stats: bool = False, pessimism: float = 0.0,
                 pessimism_model: str = "packaged", pessimism_share: float = 1.0, evolve: int = 0,
                 residual: bool = False, residual_beta: float = 0.0, residual_rank: bool = True,
                 spread: float = 4.0, spread_from: int = 0, flat: float = 0.5, judge: str | None = None,
                 judge_weight: float = 0.5, climb: int = 0, prune: float = 0.0, prune_after: int = 16,
                 prune_keep: int = 1, opening: str = "shared", breed_share: float = 0.0, breed_rounds: int = 1,
                 workers: int | None = None):
        if acquisition not in ACQUISITIONS:
            raise ValueError(f"unknown acquisition {acquisition!r}; valid: {', '.join(ACQUISITIONS)}")
        if not 0.0 <= local_share <= 1.0:
            raise ValueError(f"local_share must be in [0, 1] (got {local_share})")
        # (4.0, as JSON may give it: an int, or range() fails later)
        starts, steps, harvest_every, batch_size, warmup_passes, ensemble_members, ensemble_hidden = (
            count_option(name, value) for name, value in (
                ("starts", starts), ("steps", steps), ("harvest_every", harvest_every), ("batch_size", batch_size),
                ("warmup_passes", warmup_passes), ("ensemble_members", ensemble_members),
                ("ensemble_hidden", ensemble_hidden)))
        for name, value in (("eps_greedy", eps_greedy), ("perturbed_share", perturbed_share)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1] (got {value!r})")
        for name, value in (("lr", lr), ("temperature", temperature)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 (got {value!r})")
        if not trust_weight >= 0 or neighbours_of < 0:
            raise ValueError(f"trust_weight and neighbours_of must be >= 0 (got {trust_weight!r}, {neighbours_of!r})")
        if not trust_radius > 0 or local_of < 0:
            raise ValueError(f"trust_radius must be > 0 and local_of >= 0 (got {trust_radius!r}, {local_of!r})")
        self.starts, self.steps, self.lr, self.temperature = starts, steps, lr, temperature
        self.harvest_every, self.neighbours_of, self.eps_greedy = harvest_every, neighbours_of, eps_greedy
        self.batch_size, self.perturbed_share, self.warmup_passes = batch_size, perturbed_share, warmup_passes
        self.scorer, self.cost_model = scorer, cost_model
        self.ranker, self.ranker_data = check_ranker(ranker, ranker_data)
        self.opening = check_opening(opening)
        self.trust_weight, self.trust_radius = float(trust_weight), float(trust_radius)
        self.acquisition, self.ucb_beta, self.ensemble_members = acquisition, float(ucb_beta), int(ensemble_members)
        self.ensemble_hidden = int(ensemble_hidden)
        self.local_share, self.local_of, self.stats = float(local_share), int(local_of), bool(stats)
        self.pessimism, self.pessimism_share = check_pessimism(pessimism, pessimism_share)
        self.pessimism_model = pessimism_model
        if evolve < 0:
            raise ValueError(f"evolve must be >= 0 (got {evolve})")
        self.evolve = int(evolve)
        self.residual, self.residual_beta, self.residual_rank = bool(residual), float(residual_beta), bool(residual_rank)
        if spread < 0:
            raise ValueError(f"spread must be >= 0 (got {spread})")
        self.spread = float(spread)
        if spread_from < 0:
            raise ValueError(f"spread_from must be >= 0 (got {spread_from})")
        self.spread_from = int(spread_from)
        if not 0.0 <= flat <= 1.0:
            raise ValueError(f"flat must be in [0, 1] (got {flat})")
        self.flat = float(flat)
        if climb < 0:
            raise ValueError(f"climb must be >= 0 (got {climb})")
        self.climb = int(climb)
        if prune and prune <= 1.0:
            raise ValueError(f"prune must be 0 (off) or above 1 (got {prune})")
        if prune_after < 1 or prune_keep < 0:
            raise ValueError(f"prune_after must be >= 1 and prune_keep >= 0 (got {prune_after}, {prune_keep})")
        self.prune, self.prune_after, self.prune_keep = float(prune), int(prune_after), int(prune_keep)
        if not 0.0 <= breed_share <= 1.0 or breed_rounds < 0:
            raise ValueError(f"breed_share must be in [0, 1] and breed_rounds >= 0 (got {breed_share}, {breed_rounds})")
        self.breed_share, self.breed_rounds = float(breed_share), int(breed_rounds)
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be None or >= 1 (got {workers})")
        self.workers = usable_cores() if workers is None else int(workers)
        self.judge, self.judge_weight = check_judge(judge, judge_weight)
        self._judges: dict = {}  # id(context) -> (context, Judge)
        self._judge = None  # this round's
        self._residuals: tuple = (1.0, 0.0, {})  # (slope a, offset b, {sketch: ResidualFit}) of this round
        self._breeder: tuple = (None, None)  # (scorer, the GeneticSearch breeding under it)
        self._ensemble = None
        self._ensemble_rows = 0
        self.last_round: dict = {}
        self._keys: dict[str, set] = {}
        self._keyed = (None, 0)  # (context, history records already keyed)
        self._ends: dict = {}  # sketch -> (starts, final iterates, objective) of this round's descents

    def _ensure_scorer(self, ctx: SearchContext):
        """The ``scorer`` option when given, else the context's (the session's shared model, seen
        from ``ctx.task``): never a scorer kept from another task."""
        return self.scorer if self.scorer is not None else ctx.get_scorer(self.cost_model, ranker=self.ranker,
                                                                          ranker_data=self.ranker_data,
                                                                          opening=self.opening)

    def _objective(self, scorer):
        """The pure model the descent and the ranking use: the scorer's, or with ``pessimism`` the
        :class:`~felixjax.model.Pessimistic` wrapper around it (``None`` means the scorer's own)."""
        if not self.pessimism:
            return None
        return pessimistic(scorer, self.pessimism_model, self.pessimism)

    def _split(self, scorer) -> list[tuple]:
        """``(objective, starts)`` of each descent of a pass: all ``starts`` on one objective, or with
        ``0 < pessimism_share < 1`` that share of them on the pessimistic one and the rest on the plain."""
        obj = self._objective(scorer)
        if obj is None or self.pessimism_share >= 1.0:
            return [(obj, self.starts)]
        n_pess = min(self.starts - 1, max(1, int(round(self.pessimism_share * self.starts))))
        return [(obj, n_pess), (None, self.starts - n_pess)]

    def _pick(self, ctx: SearchContext, scorer, xs: np.ndarray, scores: np.ndarray, plain: np.ndarray | None,
              sketch: list, k: int) -> np.ndarray:
        """``k`` pool rows: :meth:`_acquire`'s, or with a ``pessimism_share`` below 1 that share of them
        in the pessimistic score's order and the rest in the plain score's, interleaved, no repeats."""
        if plain is None:
            return self._acquire(ctx, scorer, xs, scores, sketch, k)
        return np.asarray(interleave(np.argsort(-scores, kind="stable").tolist(),
                                     np.argsort(-plain, kind="stable").tolist(), self.pessimism_share, k), np.int64)

    def _pruned(self, ctx: SearchContext, rels: dict) -> set[str]:
        """Sketches measured at least ``prune_after`` times whose best measured latency is ``prune`` times
        the task's best measured or slower (``prune``; empty when off)."""
        if not self.prune:
            return set()
        best: dict[str, float] = {}
        count: dict[str, int] = {}
        for r in ctx.history:
            if r.ok and r.latency_s > 0 and r.config.sketch in rels:
                name = r.config.sketch
                count[name] = count.get(name, 0) + 1
                best[name] = min(best.get(name, np.inf), r.latency_s)
        if not best:
            return set()
        top = min(best.values())
        return {name for name, lat in best.items() if count[name] >= self.prune_after and lat >= self.prune * top}

    def _measured_keys(self, ctx: SearchContext, rels: dict) -> dict[str, set]:
        """Byte keys of the integer points of every measured config, per sketch (kept incrementally)."""
        if self._keyed[0] is not ctx:
            self._keys, self._keyed = {name: set() for name in rels}, (ctx, 0)
        for r in ctx.history[self._keyed[1]:]:
            if r.config.sketch in rels:
                self._keys[r.config.sketch].add(_key(rels[r.config.sketch].to_x(r.config)))
        self._keyed = (ctx, len(ctx.history))
        return self._keys

    def _starts(self, ctx: SearchContext, rel, n: int) -> np.ndarray:
        key = jax.random.PRNGKey(int(ctx.rng.integers(2**31)))
        best = sorted((r for r in ctx.history if r.ok and r.config.sketch == rel.space.sketch.name),
                      key=lambda r: r.latency_s)[:8]
        n_pert = int(self.perturbed_share * n) if best else 0
        x_rand = np.asarray(rel.sample_x(key, n - n_pert))
        if not n_pert:
            return x_rand
        base = np.stack([rel.to_x(r.config) for r in best])
        pick = base[ctx.rng.integers(len(base), size=n_pert)]
        noise = ctx.rng.normal(scale=0.7, size=pick.shape) * (pick != 0) + ctx.rng.normal(scale=0.3, size=pick.shape)
        x_pert = np.asarray(rel.project(jnp.asarray(pick + noise, jnp.float32)))
        return np.concatenate([x_rand, x_pert]).astype(np.float32)

    def _descents(self, ctx: SearchContext, scorer, name: str, rel) -> list[tuple]:
        """This round's descents on one sketch, ready to run: ``(run, x0, objective)`` each, ``run()``
        returning the iterates ``[steps, S, N_X]`` (a sketch with no measurement yet gets
        ``warmup_passes`` passes; each pass is the same compiled shape). The starts are drawn here, from
        ``ctx.rng`` in sketch order, so running the descents in threads leaves the picks as they were."""
        measured = any(r.config.sketch == name for r in ctx.history)
        out = []
        passes = [(obj, n) for _ in range(1 if measured else max(1, self.warmup_passes))
                  for obj, n in self._split(scorer)]
        for obj, n_starts in passes:
            model = obj if obj is not None else scorer.differentiable
            run = _descent_for(scorer.soft_score(self.temperature, obj), rel, self.steps)
            x0 = self._starts(ctx, rel, n_starts)
            anchors, mask = self._anchors(ctx, rel, name, x0.shape[-1])
            trust = jnp.asarray([self.trust_weight if mask.any() else 0.0, self.trust_radius], jnp.float32)
            arrays = getattr(rel, "descent_arrays", rel.arrays)  # a GPU relaxation's penalty reads its limits too
            slope, fits = self._residuals[0], self._residuals[2]
            # no GP: zero rows with the lever off (no kernel sum per step), padded rows with it on (one compilation)
            gp = fits[name].arrays() if name in fits else empty_arrays(x0.shape[-1], RESIDUAL_ROWS * self.residual)
            args = (model.params, scorer.inputs[name], arrays, jnp.asarray(x0), self.lr, anchors, mask, trust,
                    jnp.float32(slope), gp)
            out.append((functools.partial(_run_descent, run, args), x0, obj))
        return out

    def _descend(self, ctx: SearchContext, scorer, name: str, rel) -> np.ndarray:
        """Every harvested iterate ``[H, N_X]`` of this round's descents on one sketch, run here (their ends
        recorded in ``_ends[name]``)."""
        descents = self._descents(ctx, scorer, name, rel)
        trajs = in_threads([run for run, _, _ in descents], self.workers)
        self._ends[name] = [(x0, t[-1], obj) for (_, x0, obj), t in zip(descents, trajs)]
        return self._harvest(descents, trajs)

    def _harvest(self, descents: list[tuple], trajs: list[np.ndarray]) -> np.ndarray:
        """Every harvested iterate ``[H, N_X]`` of one sketch's descents (their starts, then every
        ``harvest_every``-th step and the last)."""
        keep = list(range(self.harvest_every - 1, self.steps, self.harvest_every))
        if not keep or keep[-1] != self.steps - 1:  # (none: harvest_every > steps keeps the last alone)
            keep.append(self.steps - 1)
        return np.concatenate([np.concatenate([x0[None], traj[keep]]).reshape(-1, traj.shape[-1])
                               for (_, x0, _), traj in zip(descents, trajs)])

    @staticmethod
    def _anchors(ctx: SearchContext, rel, name: str, n_x: int) -> tuple[jax.Array, jax.Array]:
        """The best measured points of a sketch, padded to :data:`ANCHORS` rows with a mask."""
        best = sorted((r for r in ctx.history if r.ok and r.config.sketch == name), key=lambda r: r.latency_s)
        xs = [rel.to_x(r.config) for r in best[:ANCHORS]]
        anchors = np.zeros((ANCHORS, n_x), np.float32)
        mask = np.zeros(ANCHORS, np.float32)
        if xs:
            anchors[: len(xs)] = np.stack(xs)
            mask[: len(xs)] = 1.0
        return jnp.asarray(anchors), jnp.asarray(mask)

    def _score(self, scorer, name: str, rel, pts: np.ndarray, plain: bool = False) -> np.ndarray:
        """Hard-feature scores of integer points: the objective's (pessimistic with ``pessimism``),
        or the scorer's own with ``plain``."""
        if hasattr(scorer, "score_x"):
            obj = None if plain else self._objective(scorer)
            s = scorer.score_x(name, pts) if obj is None else scorer.score_x(name, pts, model=obj)
        else:
            s = np.asarray(scorer.score(rel.configs_from_x(pts)), np.float64)
        return s if plain or self._judge is None else self._judge.blend_x(name, pts, s)

    def _fit_residuals(self, ctx: SearchContext, scorer) -> None:
        """This round's calibration ``(a, b)`` of the objective's scores against the measured
        ``-log(latency)`` of every correct measurement of the task, and a residual GP per sketch with
        ``MIN_POINTS`` of them (the best :data:`RESIDUAL_ROWS` kept); nothing with ``residual`` off."""
        self._residuals = (1.0, 0.0, {})
        if not self.residual:
            return
        by_sketch: dict[str, list] = {}
        for r in ctx.history:
            if r.ok and r.config.sketch in scorer.relaxations and r.latency_s > 0:
                by_sketch.setdefault(r.config.sketch, []).append(r)
        xs, ss, ys = {}, {}, {}
        for name, recs in by_sketch.items():
            recs = sorted(recs, key=lambda r: r.latency_s)
            rel = scorer.relaxations[name]
            xs[name] = np.stack([rel.to_x(r.config) for r in recs]).astype(np.float32)
            ss[name] = self._score(scorer, name, rel, xs[name])
            ys[name] = -np.log([r.latency_s for r in recs])
        if sum(len(v) for v in ys.values()) < MIN_POINTS:
            return
        a, b = calibrate(np.concatenate(list(ss.values())), np.concatenate(list(ys.values())))
        fits = {name: fit_residual(xs[name], ys[name] - a * ss[name] - b, rows=RESIDUAL_ROWS)
                for name in xs if len(xs[name]) >= MIN_POINTS}
        self._residuals = (a, b, fits)

    def _corrected(self, name: str, pts: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Scores of integer points corrected by this round's residual GP (unchanged with ``residual`` or
        ``residual_rank`` off):
        ``a · score + b + mean + residual_beta · std`` (``-log(latency)`` units)."""
        if not self.residual or not self.residual_rank or not len(pts):
            return scores
        a, b, fits = self._residuals
        if name not in fits:
            return a * scores + b
        mu, sd = fits[name].predict(pts)
        return a * scores + b + mu + self.residual_beta * sd

    def _round_stats(self, scorer, name: str, rel, ends: list[tuple], stats: dict) -> None:
        """What rounding does to this round's trajectories of one sketch (in model-score units):
        ``rounding_loss`` sums ``soft(x_T) − soft(round(x_T))`` over trajectories (the predicted
        score the end point loses to rounding, one model, soft features), ``left_basin`` counts
        trajectories whose rounded end point scores (hard) below their rounded start (rounding
        undid the descent)."""
        inputs = scorer.inputs[name]
        for x0, xt, obj in ends:  # (starts, final iterates, objective) of each descent
            fn = scorer.soft_score(self.temperature, obj)
            params = (obj if obj is not None else scorer.differentiable).params
            u_t, i_t = rel.round_points(xt)
            u_0, i_0 = rel.round_points(x0)
            soft_end = _soft_scores(fn, params, inputs, xt)
            soft_round = _soft_scores(fn, params, inputs, u_t)[i_t]
            hard_end = self._score(scorer, name, rel, u_t, plain=obj is None)[i_t]
            hard_start = self._score(scorer, name, rel, u_0, plain=obj is None)[i_0]
            ok = np.isfinite(soft_end) & np.isfinite(soft_round)
            stats["rounding_loss"] += float(np.sum((soft_end - soft_round)[ok]))
            stats["left_basin"] += int(np.sum(hard_end < hard_start - 1e-9))
            stats["trajectories"] += len(xt)

    def _local_moves(self, ctx: SearchContext, scorer, keys: dict, k: int) -> list:
        """DGD-style moves: the model's best unmeasured ±1 neighbours of the ``local_of`` best
        measured configs (all sketches), round-robin over those configs, at most ``k``."""
        if k <= 0:
            return []
        best = sorted((r for r in ctx.history if r.ok and r.config.sketch in scorer.relaxations),
                      key=lambda r: r.latency_s)
        anchors = list(dict.fromkeys(r.config for r in best))[: self.local_of]
        queues = []
        for cfg in anchors:
            rel = scorer.relaxations[cfg.sketch]
            nb = rel.neighbours_x(rel.to_x(cfg)[None])
            nb = nb[[_key(x) not in keys[cfg.sketch] for x in nb]] if len(nb) else nb
            if not len(nb):
                continue
            order = np.argsort(-self._score(scorer, cfg.sketch, rel, nb), kind="stable")[:k]
            queues.append(rel.configs_from_x(nb[order]))
        out, seen = [], set()
        for depth in range(k):
            for q in queues:
                if depth < len(q) and q[depth] not in seen and len(out) < k:
                    seen.add(q[depth])
                    out.append(q[depth])
        return out

    def _breeder_for(self, scorer, population: int) -> GeneticSearch:
        """The :class:`GeneticSearch` (no random share) breeding under ``scorer``: one per scorer and
        population (its codec is cached per task)."""
        if self._breeder[0] is not scorer or self._breeder[1].population != population:
            self._breeder = (scorer, GeneticSearch(population=population, eps_greedy=0.0, scorer=scorer))
        return self._breeder[1]

    def _bred_picks(self, ctx: SearchContext, scorer, k: int) -> list:
        """``breed_share``: the genetic search's first ``k`` picks of this round under the same model
        (Ansor's population of 2048, 4 generations, its order: the model's best of the evolved
        population, crowded where the model rates best), or none after the task's first ``breed_rounds``."""
        if k <= 0 or ctx.round >= self.breed_rounds:
            return []
        return self._breeder_for(scorer, 2048).propose(ctx, k)

    def _evolved(self, ctx: SearchContext, scorer, n: int) -> dict[str, np.ndarray]:
        """The ``evolve`` pool: the best ``n`` unmeasured configs a :class:`GeneticSearch` of population
        ``evolve`` breeds from the measured configs under the same model (it proposes none of those), as
        integer points per sketch."""
        if not self.evolve:
            return {}
        rows: dict[str, list] = {}
        for cfg in self._breeder_for(scorer, self.evolve).propose(ctx, n):
            rel = scorer.relaxations.get(cfg.sketch)
            if rel is None:
                continue
            try:
                x = rel.to_x(cfg)
            except ValueError:  # a config the relaxation cannot express
                continue
            rows.setdefault(cfg.sketch, []).append(x)
        return {name: np.stack(xs).astype(np.float32) for name, xs in rows.items()}

    def _flattened(self, scorer, xs: np.ndarray, scores: np.ndarray, sketch: list, k: int) -> np.ndarray:
        """``scores`` with the ``FLAT_TOP · k`` best re-scored over their ±1 neighbourhoods (``flat``; the
        other rows are put below them, in their order)."""
        top = np.argsort(-scores, kind="stable")[: max(FLAT_TOP * k, 64)]
        out = scores.copy()
        names = sorted({sketch[i] for i in top})
        rows = {name: [i for i in top if sketch[i] == name] for name in names}
        means = in_threads([functools.partial(self._neighbourhood_means, scorer, name, xs[rows[name]], scores[rows[name]])
                            for name in names], self.workers)
        for name, m in zip(names, means):
            if m is not None:  # None: no valid neighbour anywhere, these rows keep their scores
                out[rows[name]] = (1.0 - self.flat) * scores[rows[name]] + self.flat * m
        rest = np.ones(len(scores), bool)
        rest[top] = False
        if rest.any():  # every unsmoothed row below every smoothed one, in its order
            out[rest] = scores[rest] - scores[rest].max() + out[top].min() - 1.0
        return out

    def _neighbourhood_means(self, scorer, name: str, xs: np.ndarray, scores: np.ndarray) -> np.ndarray | None:
        """Each point's mean score over its valid ±1 neighbours (its own score where it has none; ``None``
        where no point has one)."""
        rel = scorer.relaxations[name]
        nb, owner = rel.neighbours_by_row(xs)
        if not len(nb):
            return None
        uniq, back = first_appearance(nb)  # a point next to several rows is scored once
        nb_scores = self._corrected(name, uniq, self._score(scorer, name, rel, uniq))[back]
        count = np.bincount(owner, minlength=len(xs))
        total = np.bincount(owner, weights=nb_scores, minlength=len(xs))
        return np.where(count > 0, total / np.maximum(count, 1), scores)

    def _acquire(self, ctx: SearchContext, scorer, xs: np.ndarray, scores: np.ndarray, sketch: list,
                 k: int) -> np.ndarray:
        """Indices of ``k`` pool rows: the top scores, or the acquisition's order over the ensemble (its
        whole shortlist ordered, so the spread can skip near repeats as it does for the scores)."""
        order = np.argsort(-scores, kind="stable")
        radius = self.spread if ctx.round >= self.spread_from else 0.0
        if self.acquisition == "mean" or self._ensemble is None or k <= 0:
            return spread_picks(order, xs, sketch, k, radius)
        short = order[: max(8 * k, 64)]
        members = np.zeros((self.ensemble_members, len(short)))
        for name in set(sketch[i] for i in short):
            rows = [j for j, i in enumerate(short) if sketch[i] == name]
            members[:, rows] = self._ensemble.predict_members(scorer.features_x(name, xs[short[rows]]))
        dev = members - members.mean(axis=0, keepdims=True)
        ranked = acquire(scores[short], dev, len(short) if radius > 0 else k, kind=self.acquisition,
                         beta=self.ucb_beta, rng=ctx.rng)
        return spread_picks(short[ranked], xs, sketch, k, radius)

    def _sketch_pool(self, scorer, name: str, rel, pts: np.ndarray, measured: set, bred: np.ndarray | None,
                     pruned: bool, hedge: bool) -> tuple:
        """One sketch's candidates from its harvested iterates: rounded, measured points dropped, the
        evolutionary pool's points added (``bred``), scored, the ±1 neighbourhoods of the best added (and
        climbed with ``climb``), a pruned sketch cut to its best few. Returns ``(points, scores, plain
        scores or None, counts, keys of the bred points kept)``; reads the search's state and writes none,
        so the sketches run in threads."""
        counts = {"harvested": len(pts), "rounded": 0, "neighbours": 0}
        uniq, _ = rel.round_points(pts)
        uniq = uniq[[_key(x) not in measured for x in uniq]] if measured else uniq
        counts["rounded"] = len(uniq)
        extra_keys: set = set()
        if bred is not None:  # the evolutionary pool's points the descents did not reach
            have = {_key(x) for x in uniq}
            extra = bred[[_key(x) not in have for x in bred]]
            extra_keys = {_key(x) for x in extra}
            uniq = np.concatenate([uniq, extra]) if len(uniq) else extra
        if not len(uniq):
            return uniq, np.zeros(0), None, counts, extra_keys
        scores = self._corrected(name, uniq, self._score(scorer, name, rel, uniq))
        plain = self._score(scorer, name, rel, uniq, plain=True) if hedge else None
        expanded = np.zeros(len(uniq), bool)
        have = measured | {_key(x) for x in uniq}
        for step in range(1 + self.climb):  # the best points' ±1 neighbourhoods; with ``climb``, again
            best = np.argsort(-scores, kind="stable")[: self.neighbours_of]
            best = best[~expanded[best]]  # the top's points not expanded yet (all of them at first)
            if hedge and step == 0:  # the neighbourhoods of both orders' best
                best = np.unique(np.concatenate([best, np.argsort(-plain, kind="stable")[: self.neighbours_of]]))
            if not len(best):
                break  # the climb has reached a top whose neighbourhoods are all scored
            expanded[best] = True
            nb = rel.neighbours_x(uniq[best])
            nb = nb[[_key(x) not in have for x in nb]] if len(nb) else nb
            if not len(nb):
                continue
            have |= {_key(x) for x in nb}
            counts["neighbours"] += len(nb)
            nb_scores = self._corrected(name, nb, self._score(scorer, name, rel, nb))
            uniq, scores = np.concatenate([uniq, nb]), np.concatenate([scores, nb_scores])
            expanded = np.concatenate([expanded, np.zeros(len(nb), bool)])
            if hedge:
                plain = np.concatenate([plain, self._score(scorer, name, rel, nb, plain=True)])
        if pruned:  # a sketch the measurements have left behind: only its best few compete
            keep = np.argsort(-scores, kind="stable")[: self.prune_keep]
            uniq, scores = uniq[keep], scores[keep]
            plain = plain[keep] if hedge else None
        return uniq, scores, plain, counts, extra_keys

    def propose(self, ctx: SearchContext, n: int) -> list:
        """Descend, harvest, round, drop measured points, add the ±1 neighbourhood of the best
        ``neighbours_of`` per sketch, rank everything by the model; all on integer-point arrays, so
        :class:`Config` objects are built only for what is proposed."""
        scorer = self._ensure_scorer(ctx)
        self._judge = judge_for(self._judges, ctx, self.judge, self.judge_weight)
        keys = self._measured_keys(ctx, scorer.relaxations)
        pruned = self._pruned(ctx, scorer.relaxations)
        pool_x, pool_s, pool_p, pool_sketch = [], [], [], []
        hedge = bool(self.pessimism) and self.pessimism_share < 1.0
        stats = {"model": getattr(scorer, "active", "?"), "harvested": 0, "rounded": 0, "neighbours": 0,
                 "rounding_loss": 0.0, "left_basin": 0, "trajectories": 0, "pruned": len(pruned)}
        bred = self._evolved(ctx, scorer, n)
        bred_keys = set()
        self._fit_residuals(ctx, scorer)
        if self.residual:
            stats.update(residual_slope=self._residuals[0], residual_fits=len(self._residuals[2]))
        rels = scorer.relaxations
        descents = {name: self._descents(ctx, scorer, name, rel) for name, rel in rels.items()}  # draws: in order
        trajs = iter(in_threads([run for name in rels for run, _, _ in descents[name]], self.workers))
        trajs = {name: [next(trajs) for _ in descents[name]] for name in rels}
        self._ends = {name: [(x0, t[-1], obj) for (_, x0, obj), t in zip(descents[name], trajs[name])] for name in rels}
        pools = in_threads([functools.partial(self._sketch_pool, scorer, name, rel, self._harvest(descents[name], trajs[name]),
                                              keys[name], bred.get(name), name in pruned, hedge)
                            for name, rel in rels.items()], self.workers)
        for name, (uniq, scores, plain, counts, extra_keys) in zip(rels, pools):
            if self.stats:
                self._round_stats(scorer, name, rels[name], self._ends[name], stats)
            for key, v in counts.items():
                stats[key] += v
            bred_keys |= {(name, k) for k in extra_keys}
            if not len(uniq):
                continue
            pool_x.append(uniq)
            pool_s.append(scores)
            pool_p.append(plain)
            pool_sketch += [name] * len(uniq)
        if stats["trajectories"]:
            stats["rounding_loss"] /= stats["trajectories"]
            stats["left_basin"] /= stats["trajectories"]
        n_rand = int(self.eps_greedy * n)
        local = self._local_moves(ctx, scorer, keys, int(round(self.local_share * n)))
        k = n - n_rand - len(local)  # the descents' picks (with ``breed_share`` their tail is cut)
        picks: list = []
        if pool_x:
            xs, scores = np.concatenate(pool_x), np.concatenate(pool_s)
            if self.flat:
                plain_top = set(np.argsort(-scores, kind="stable")[:k].tolist())
                scores = self._flattened(scorer, xs, scores, pool_sketch, k)
                stats["flat_changed"] = len(set(np.argsort(-scores, kind="stable")[:k].tolist()) - plain_top)
            top = self._pick(ctx, scorer, xs, scores, np.concatenate(pool_p) if hedge else None, pool_sketch, k)
            config_of = {}
            for name in set(pool_sketch[i] for i in top):
                rows = [i for i in top if pool_sketch[i] == name]
                config_of.update(zip(rows, scorer.relaxations[name].configs_from_x(xs[rows])))
                if self.stats and len(rows) >= 4:
                    obj = self._objective(scorer)
                    soft = _soft_scores(scorer.soft_score(self.temperature, obj),
                                        (obj if obj is not None else scorer.differentiable).params,
                                        scorer.inputs[name], xs[rows])
                    stats.setdefault("soft_hard_tau", []).append(
                        (len(rows), kendall_tau(soft, np.exp(-scores[rows]))))
            picks = [config_of[i] for i in top]
            if self.evolve:
                stats["evolved"] = sum((pool_sketch[i], _key(xs[i])) in bred_keys for i in top)
        if "soft_hard_tau" in stats:  # weighted over sketches by their picks
            parts = [(w, t) for w, t in stats["soft_hard_tau"] if np.isfinite(t)]
            stats["soft_hard_tau"] = (sum(w * t for w, t in parts) / sum(w for w, _ in parts)) if parts else np.nan
        stats["local"] = len(local)
        bred = self._bred_picks(ctx, scorer, round(self.breed_share * k))  # after the descents: same draws
        if bred:  # alternated, bred first, with the descents' best ``k - len(bred)`` that evolution did not pick too
            have = set(bred)
            rest = [c for c in picks if c not in have][: k - len(bred)]
            picks = [c for pair in itertools.zip_longest(bred, rest) for c in pair if c is not None]
        picks = fresh(ctx, local + picks, n - n_rand)
        if bred:
            stats["bred"] = len(set(bred) & set(picks))
        taken = set(picks)
        names = sorted(ctx.spaces)
        tries = 0
        while len(picks) < n and tries < 50 * n:
            tries += 1
            c = ctx.spaces[names[int(ctx.rng.integers(len(names)))]].sample(ctx.rng)
            if c not in taken and c not in ctx.measured:
                taken.add(c)
                picks.append(c)
        stats.update(candidates=sum(len(p) for p in pool_x), proposed=len(picks),
                     random=len(picks) - min(len(picks), n - n_rand))
        self.last_round = stats
        return picks

    def update(self, ctx: SearchContext, records: list) -> None:
        scorer = self._ensure_scorer(ctx)
        scorer.update(records)
        if self.judge is not None:
            judge_for(self._judges, ctx, self.judge, self.judge_weight).update(records)
        if self.acquisition != "mean":
            self._fit_ensemble(ctx, scorer)

    def _fit_ensemble(self, ctx: SearchContext, scorer) -> None:
        """Fine-tune the acquisition's ensemble on this run's correct measurements (hard features)."""
        ok = [r for r in ctx.history if r.ok and r.config.sketch in scorer.relaxations]
        if len(ok) < self.MIN_ENSEMBLE or len(ok) == self._ensemble_rows:
            return
        if self._ensemble is None:
            from costmodels.mlp import TrainConfig

            mlp = scorer.mlp
            self._ensemble = EnsembleCostModel(mlp.n_access_features, mlp.n_glob_features,
                                               num_members=self.ensemble_members, hidden=self.ensemble_hidden,
                                               seed=int(ctx.rng.integers(2**31)),
                                               config=TrainConfig(sample_budget=2048, max_epochs=40))
        feats = scorer.features([r.config for r in ok])
        self._ensemble.update(feats, np.array([r.latency_s for r in ok]), None)
        self._ensemble_rows = len(ok)
