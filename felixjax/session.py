"""THE tuning loop (DESIGN.md ⑦–⑫): one session serves ``fj.tune``, ``fj.tune_model`` and ``fj.compare``.

A :class:`TuningSession` owns what every tuning run shares: the database, the measurer of each task
(one runner process per device), the budget, the RNG streams, and **one online cost model per
model group** — every task of ``fj.tune``/``fj.tune_model`` shares one; ``fj.compare`` gives each
(strategy, seed) its own, so one strategy's measurements never train another's model. Each
(task, run) is a :class:`TaskRun` whose strategy instance and search context are created once and
kept for the whole run.

A round (:meth:`TuningSession.step`) is: pick up records other processes added to the run; propose
(the strategy, after the opening defaults); claim the candidates in the database so a second tuner
on the same run measures none of them; build and measure, committing each record as it arrives
(progress inside the round); update the strategy and, through it, the shared model. The caller
decides which run steps next (one run; interleaved runs; Ansor's task scheduler): see
:mod:`felixjax.pipeline` and :mod:`felixjax.compare`.

Example:
    >>> import felixjax as fj
    >>> from felixjax.testing import ReplayRunner
    >>> t = fj.ops.matmul(32, 32, 32)
    >>> with TuningSession(fj.Target.cpu(), measurer=lambda task, tg: ReplayRunner.from_oracle(task),
    ...                    progress=False) as s:
    ...     run = s.add(t, "random", seed=0, trials=8)
    ...     while not run.done:
    ...         _ = s.step(run)
    >>> len(run.history), run.best().ok
    (8, True)
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import re
import socket
import sys
import time
import warnings
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable

import numpy as np

from codegen.factors import whole as whole_number
from codegen.lower import Plan
from codegen.measure import LocalRunner, MeasureResult, TimingProtocol
from codegen.ops import Task
from codegen.render_c import render
from codegen.run.gpusim import GpuSimMeasurer
from codegen.space import Config
from codegen.spaces import sketch_names, spaces_for
from codegen.target import Target
from costmodels import kendall_tau

from .context import SearchContext
from .cost_aware import CostAware, Screen
from .database import CLAIM_TTL_S, Database, TuningRecord, settings_key
from .measurer import Measurer
from .model import OnlineCostModel, make_ranker
from .provenance import effective_options, keep_settings, run_settings
from .results import noisy_contender
from .strategies import Strategy, get_strategy
from .strategies.base import opening_defaults

RETIME_PREFIX = "retime:"  # re-timings of a run's best configs live in run "retime:<run>": no budget, no history
#: A round whose every proposal another live tuner of the same run has claimed waits this long, picks up that
#: tuner's records and proposes again, at most :data:`CLAIM_WAITS` times in a row before the run ends "claimed".
CLAIM_WAIT_S = 1.0
CLAIM_WAITS = 300


def stream(*parts: Any) -> np.random.Generator:
    """An independent, reproducible RNG stream for ``parts`` (seed, task key, round, ...)."""
    words = []
    for p in parts:
        if isinstance(p, (int, np.integer)):
            words.append(int(p) & 0xFFFFFFFF)
        else:
            words.append(int.from_bytes(hashlib.sha256(str(p).encode()).digest()[:4], "little"))
    return np.random.default_rng(np.random.SeedSequence(words))


def _finite_result(res: MeasureResult) -> MeasureResult:
    """A timer that returned NaN, inf or a non-positive time is a failed measurement, not a result."""
    if res.status == "ok" and not res.ok:  # (MeasureResult.ok: every time finite and positive)
        return MeasureResult("runtime_error", error=f"the timer returned {list(res.latencies)}",
                             build_s=res.build_s, run_s=res.run_s, timestamp=res.timestamp)
    return res


def _proposals(strategy: Any, proposed: Any) -> list:
    """A strategy's proposals as a list of Configs, or a TypeError that names the strategy."""
    name = getattr(strategy, "name", type(strategy).__name__)
    try:
        out = list(proposed)
    except TypeError:
        raise TypeError(f"strategy {name!r}: propose() returned {type(proposed).__name__}, not a list of "
                        f"codegen.space.Config") from None
    bad = next((c for c in out if not isinstance(c, Config)), None)
    if bad is not None:
        raise TypeError(f"strategy {name!r}: propose() returned a {type(bad).__name__} ({bad!r:.80}) among its "
                        f"proposals; it returns codegen.space.Config objects")
    return out


def _reported_once(measurer: Any, cfg: Any, res: Any, asked: set, done: set) -> bool:
    """Whether a measurer's report is one to keep: a :class:`MeasureResult` for a config of the batch it was
    given, not reported before. A duplicate or a config it was not asked for is dropped with a warning (such a
    measurer filled half a run's budget with copies); anything but a MeasureResult is a TypeError that names it."""
    name = type(measurer).__name__
    if not isinstance(res, MeasureResult):
        raise TypeError(f"measurer {name} reported {type(res).__name__} {res!r:.80} for a config; on_result takes "
                        f"a codegen.measure.MeasureResult")
    if cfg in asked and cfg not in done:
        return True
    why = "again" if cfg in done else "without being asked for it"
    warnings.warn(f"measurer {name} reported config {cfg} {why}; the report is dropped", RuntimeWarning,
                  stacklevel=3)
    return False


def _same_kind(history: list, replayed: bool, task: Task, run: str) -> None:
    """A ValueError when ``run``'s stored records are replayed (synthetic) and this session measures,
    or the reverse: one run's history, budget and curves would mix oracle latencies with timings (a
    measured ``compare`` into a replayed one's database reported the oracle's records as measured)."""
    other = sum(bool(r.info.get("replayed")) != replayed for r in history)
    if other:
        kinds = ("measured", "replayed (synthetic)") if replayed else ("replayed (synthetic)", "measured")
        raise ValueError(f"run {run!r} of {task.name} holds {other} {kinds[0]} record(s) in this database; a "
                         f"{kinds[1]} run cannot continue it: use another database or run name")


def _warn_claimed(db: Any, tr: TaskRun, target_key: str) -> None:
    """Say why ``tr`` ends "claimed": each owner of its run's claims, since when, when they expire, and
    the call that releases them (a tuner that died on another host keeps its claims ``CLAIM_TTL_S``)."""
    held: dict[str, list] = {}
    for _, who, made in db.claims(tr.task, target_key, run=tr.run, created=True):
        held.setdefault(who, []).append(made)

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    owners = "; ".join(f"{who} holds {len(ts)} (claimed since {stamp(min(ts))}, expiring "
                       f"{stamp(max(ts) + CLAIM_TTL_S)})" for who, ts in held.items()) or "none left"
    path = str(getattr(db, "path", "PATH"))
    path = path if path.startswith((":memory:", "file:")) else os.path.abspath(path)
    clear = " ".join(f"fj.Database({path!r}).release(owner={who!r})." for who in held)
    warnings.warn(f"{tr.task.name} run {tr.run!r} ends 'claimed' at {len(tr.ctx.history)} trials: every proposal "
                  f"was held by another tuner for {CLAIM_WAITS} waits of {CLAIM_WAIT_S:g} s. Claims: {owners}. A "
                  f"claim lasts until its record is stored, its process on the same host is gone, or "
                  f"{CLAIM_TTL_S:g} s have passed (another host's dead tuner keeps its claims that long). If that "
                  f"tuner is gone, release its claims and rerun: {clear}", RuntimeWarning, stacklevel=3)


def seeds_of(seeds: Any) -> list[int]:
    """``fj.compare``'s ``seeds``: a count (3: seeds 0, 1, 2) or a list of whole numbers; anything else (1.5
    or True, once truncated into seed 1; a float count) is a ValueError.

    Example:
        >>> seeds_of(3), seeds_of([5, 7])
        ([0, 1, 2], [5, 7])
    """
    given = list(seeds) if isinstance(seeds, Iterable) and not isinstance(seeds, (str, bytes)) else None
    if whole_number(seeds):
        return list(range(int(seeds)))
    if given is not None and all(whole_number(s) for s in given):
        return [int(s) for s in given]
    raise ValueError(f"seeds must be a count (seeds=3: 0, 1, 2) or a list of whole numbers, got {seeds!r}")


@dataclass
class TaskRun:
    """One (task, run) of a session: its strategy instance and context, kept for the whole run.

    Attributes:
        task, run, label, seed: what is tuned, the run's name in the database (``"{label}:{seed}"``
            by default), the strategy's label and the seed of its RNG streams.
        strategy: the strategy instance of this run (created once per task and run).
        ctx: the strategy's :class:`~felixjax.context.SearchContext`; ``ctx.history`` is the run.
        trials, seconds: this run's own budget (``None``: only the session's budget applies).
        clock: seconds this run has spent (resumed runs continue from their last record).
        rounds, done, resumed: rounds stepped here, whether the run is over, records found at start.
        stop_reason: why it is over (``"trials"``, ``"seconds"``, ``"exhausted"``: a round's proposals held no
            config the run had not measured (a small space, or a strategy out of new ideas), ``"session"``,
            ``"early_stop"``: cost-aware tuning judged further trials not worth it; ``"claimed"``: another
            tuner on the same run held every proposal for :data:`CLAIM_WAITS` rounds of waiting).
        screen: the run's cost-aware state (:class:`~felixjax.cost_aware.Screen`; None when off).
        share: the trials this run may expect when it has no budget of its own (a network's task: the
            session's budget over its tasks); cost-aware ``min_share`` counts against it.
    """

    task: Task
    run: str
    label: str
    seed: int
    strategy: Strategy
    ctx: SearchContext
    trials: int | None
    seconds: float | None
    group: Hashable
    clock: float = 0.0
    rounds: int = 0
    done: bool = False
    resumed: int = 0
    stop_reason: str = ""
    last_id: int = 0
    stats: dict = field(default_factory=lambda: {"propose_s": 0.0, "update_s": 0.0, "build_measure_s": 0.0,
                                                 "rounds": 0})
    screen: Any = None
    share: int | None = None
    waits: int = 0  # rounds in a row whose every proposal another tuner of this run had claimed
    _tally: tuple = field(default=(None, 0, None, 0), init=False, repr=False, compare=False)  # (the history
    # counted, records of it counted, best so far, failures): progress per record

    def counted(self) -> tuple[TuningRecord | None, int]:
        """(best record, failures) of the history, counted incrementally: the history only grows at its end,
        and a progress event per measured record must not rescan it (a resumed run of 30k records spent ~90 ms
        a record on that before session 77)."""
        seen, n, best, failures = self._tally
        hist = self.ctx.history
        if hist is not seen or n > len(hist):  # replaced, not grown: count again
            n, best, failures = 0, None, 0
        m = len(hist)  # what is appended while counting is counted next time
        for r in hist[n:m]:
            if r.ok:
                best = r if best is None or r.latency_s < best.latency_s else best
            else:
                failures += 1
        self._tally = (hist, m, best, failures)
        return best, failures

    @property
    def history(self) -> list[TuningRecord]:
        return self.ctx.history

    def best(self) -> TuningRecord | None:
        return self.counted()[0]

    def out_of_budget(self, clock: float | None = None) -> str:
        """Why this run's own budget is spent ("" while it is not)."""
        if self.trials is not None and len(self.ctx.history) >= self.trials:
            return "trials"
        if self.seconds is not None and (self.clock if clock is None else clock) >= self.seconds:
            return "seconds"
        return ""

    def progress(self) -> float:
        """Share of its own budget used (interleaving advances the least advanced run first)."""
        p = len(self.ctx.history) / self.trials if self.trials else 0.0
        return max(p, self.clock / self.seconds) if self.seconds else p


_SESSION_IDS = itertools.count(1)

#: whether a Ctrl-C inside a session prints what the call kept (the CLI, which says it in its own words, sets
#: this off while it runs)
SAY_KEPT = [True]


class TuningSession:
    """Budget, measurers, database, RNG streams and the shared online cost model of a tuning session.

    Args:
        target: the machine (``cuda-sim`` targets later; today ``Target.cpu()``).
        db: database path or :class:`~felixjax.database.Database` (``None``: in memory).
        runner: a shared :class:`~codegen.measure.LocalRunner` (default: started here on first use).
        measurer: ``(task, target) -> measurer`` (anything with ``measure(configs, on_result)``,
            e.g. a replay runner); default: a :class:`~felixjax.measurer.Measurer` on ``runner``.
        target_key: the key records are stored under (default ``target.at_threads(threads).key``: one
            per thread count; replays use their own).
        threads, protocol, renderer: how kernels are run, timed and rendered.
        cost_model: a pretrained MLP checkpoint every model group starts from (``None``: each group
            starts from its first strategy's ``cost_model`` option, ``"auto"`` by default).
        seed: seeds the cost models (runs seed their own streams).
        trials, seconds: the session's budget over all runs (``None``: runs' own budgets only).
        progress: print progress lines to stderr, or a callable receiving progress dicts.
        defaults: measure every sketch's hand-written default schedule in a run's first round.
        cost_aware: cold-candidate filtering and early stop for every run
            (:class:`~felixjax.cost_aware.CostAware`; ``None``: off); ``add(cost_aware=...)`` overrides it.
        run_caches: a folder: every run compiles into a build cache of its own under it (``<folder>/<run>``),
            so no run is handed, free, a kernel another run of the session compiled (comparisons that
            charge each run its seconds); ``None`` (the default): the measurers' cache, shared.
    """

    def __init__(self, target: Target | None = None, *, db: str | Database | None = None,
                 runner: LocalRunner | None = None, measurer: Callable[[Task, Target], Any] | None = None,
                 target_key: str | None = None, threads: int | None = None, protocol: TimingProtocol | None = None,
                 renderer: Callable[[Plan], str] = render, cost_model: str | None = None, seed: int = 0,
                 trials: int | None = None, seconds: float | None = None,
                 progress: bool | Callable[[dict], None] = True, defaults: bool = True,
                 cost_aware: CostAware | None = None, run_caches: str | os.PathLike | None = None):
        self.target = Target.parse(target)  # a Target, None (this CPU), or "cpu" / "cuda-sim:GPU"
        if self.target.is_gpu and runner is not None and measurer is None:
            warnings.warn(f"{self.target.kind} targets build, check and simulate in this process: the runner "
                          f"{type(runner).__name__} is not used", stacklevel=2)
        pinned = len(getattr(runner, "measure_cpus", None) or ())  # fj.DaskRunner(measure_cpus=...) caps threads
        if pinned and pinned < (threads or self.target.cores):
            threads = pinned  # its kernels run at that many threads: their records belong under that count's key
        # records at another thread count than the target's cores go under that count's key
        self.target_key = target_key or self.target.at_threads(threads).key
        self._target_json = self.target.to_json()
        self._own_db = not isinstance(db, Database)
        self.db = db if isinstance(db, Database) else Database(db if db is not None else ":memory:")
        self._own_runner = runner is None and measurer is None
        self.runner = runner
        self._measurer_factory = measurer
        self.threads, self.protocol, self.renderer = threads, protocol, renderer
        self.cost_model, self.seed = cost_model, seed
        self.trials, self.seconds = trials, seconds
        self.defaults = defaults
        self.cost_aware = cost_aware
        self.run_caches = None if run_caches is None else Path(run_caches)
        self.show = progress if callable(progress) else (_ProgressPrinter() if progress else None)
        self.models: dict[Hashable, OnlineCostModel] = {}
        self._model_options: dict[Hashable, tuple] = {}  # group -> (ranker, ranker_data, opening) it was made with
        self.measurers: dict[str, Any] = {}
        self.runs: list[TaskRun] = []
        self.start = time.perf_counter()
        self.used = 0  # trials measured by this session (resumed records are not counted here)
        # its claims' owner: one per session, so two sessions of one process (two threads tuning one run) share
        # the run's budget as two processes do (with "host:pid" each took the other's claims for its own)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{next(_SESSION_IDS)}"

    # ---- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        try:
            release = getattr(self.db, "release", None)
            if release is not None and self.runs:  # none should be left (every round releases what it did not measure)
                with contextlib.suppress(Exception):  # best effort: a read-only, closed or locked file
                    release(owner=self.owner)
        finally:
            if self._own_runner and self.runner is not None:
                self.runner.close()
                self.runner = None
            if self._own_db:
                self.db.close()

    def __enter__(self) -> "TuningSession":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and self.runs and SAY_KEPT[0]:
                self._say_kept()
        finally:
            self.close()

    def _say_kept(self) -> None:
        """One line on stderr after a Ctrl-C (a notebook cell stopped): what the session's runs kept, and where."""
        made = sum(len(tr.history) - tr.resumed for tr in self.runs)
        runs = sorted({tr.run for tr in self.runs})
        path = getattr(self.db, "path", ":memory:")
        if path == ":memory:" or path.startswith("file::memory:"):
            if self.measurers and all(getattr(m, "replayed", False) for m in self.measurers.values()):
                return  # replayed, kept nowhere: a throwaway run (compare's JIT warm-up), nothing measured is lost
            where = "in memory only (no db=): they are lost with this call; db='runs.db' keeps them"
        else:
            where = f"in {path}; the same call again continues from them"
        print(f"[felixjax] interrupted: {made} measurement(s) of this call (run {', '.join(runs)}) are {where}",
              file=sys.stderr, flush=True)

    # ---- shared parts --------------------------------------------------------------------------
    def model(self, group: Hashable = "", *, cost_model: str | None = None, ranker: str | None = None,
              ranker_data: str | None = None, seed_key: Hashable | None = None,
              opening: str = "shared") -> OnlineCostModel:
        """The online cost model of a model group (created on first use, then shared by its tasks;
        ``ranker``, ``ranker_data``: its tree ranker, :func:`felixjax.model.make_ranker`, and ``opening``:
        what ranks a task's first rounds, :class:`felixjax.model.OnlineCostModel`; every run of the group
        must ask for these alike). Its seed (initialization, shuffling, hold-out splits) comes
        from the session's seed and ``seed_key`` (default: the group itself): groups given the same
        ``seed_key`` are separate models drawing the same random numbers, so two runs that propose alike
        and measure alike learn alike (common random numbers, as :func:`felixjax.compare` pairs its arms)."""
        if group not in self.models:
            key = group if seed_key is None else ("seed_key", seed_key)
            seed = int(stream(self.seed, "model", repr(key)).integers(2**31))
            self.models[group] = OnlineCostModel(self.target, seed=seed, pretrained=self.cost_model or cost_model,
                                                 ranker=make_ranker(ranker, ranker_data, seed=seed), opening=opening)
            self._model_options[group] = (ranker, ranker_data, opening)
        elif self._model_options.get(group) != (ranker, ranker_data, opening):
            raise ValueError(f"model group {group!r} was made with (ranker, ranker_data, opening) "
                             f"{self._model_options.get(group)!r}; a run asks for {(ranker, ranker_data, opening)!r}: "
                             "give it another group")
        return self.models[group]

    def measurer(self, task: Task):
        """The measurer of a task (one per task, shared by its runs)."""
        if task.key not in self.measurers:
            if self._measurer_factory is not None:
                self.measurers[task.key] = self._measurer_factory(task, self.target)
            elif self.target.is_gpu:  # cuda-sim: nvcc + CPU emulation check + the GPU simulator
                self.measurers[task.key] = GpuSimMeasurer(task, self.target)
            else:
                if self.runner is None:
                    self.runner = LocalRunner() if self.protocol is None else LocalRunner(protocol=self.protocol)
                self.measurers[task.key] = Measurer(task, self.target, self.runner, threads=self.threads,
                                                    protocol=self.protocol, renderer=self.renderer)
        return self.measurers[task.key]

    def out_of_budget(self) -> str:
        if self.trials is not None and self.used >= self.trials:
            return "session trials"
        if self.seconds is not None and time.perf_counter() - self.start >= self.seconds:
            return "session seconds"
        return ""

    # ---- runs ----------------------------------------------------------------------------------
    def add(self, task: Task, strategy: str | Strategy = "gradient", *, seed: int = 0, trials: int | None = None,
            seconds: float | None = None, run: str | None = None, label: str | None = None,
            group: Hashable = "", strategy_options: dict | None = None,
            cost_aware: CostAware | None = None, model_seed: Hashable | None = None,
            batch: int | None = None, exclude_sketches: Collection[str] = ()) -> TaskRun:
        """Start (or resume) a run of ``task``: records of the same ``run`` in the database are
        reloaded, count against its budget, are shown to the strategy, and are never measured again.

        ``strategy`` is a registered name (a fresh instance per run) or an object (used as given);
        ``group`` names the cost model the run's scorer views and ``model_seed`` the random numbers that
        model draws (see :meth:`model`); ``cost_aware`` replaces the session's cost-aware options for this
        run (``CostAware()``: off); ``batch``: the candidates per round the caller's :meth:`step` calls will ask
        for (kept with the run's settings, :mod:`felixjax.provenance`; default: the strategy's ``batch_size``);
        ``exclude_sketches``: exact sketches (names such as ``"conv_winograd"``) whose configs, padded variants
        included, the run never proposes.
        """
        if isinstance(task, str):
            from codegen.ops import parse_spec

            task = parse_spec(task)
        if not isinstance(task, Task):
            raise TypeError(f"{task!r} is not a task: pass fj.ops.matmul(...) or a spec like 'matmul:m=64,n=64,k=64'")
        if trials is not None and (not whole_number(trials) or trials < 1):
            raise ValueError(f"trials must be a whole number >= 1 (got {trials!r})")
        if seconds is not None and not seconds > 0:
            raise ValueError(f"seconds must be > 0 (got {seconds})")
        if not whole_number(seed) or seed < 0:
            raise ValueError(f"seed must be a whole number >= 0 (got {seed!r}): it names the run and its random "
                             f"streams")
        if isinstance(exclude_sketches, str) or set(exclude_sketches) - set(sketch_names()):
            raise ValueError(f"exclude_sketches takes names of exact sketches (their padded variants go with them: "
                             f"{', '.join(sketch_names())}), got {exclude_sketches!r}")
        strat = get_strategy(strategy, **(strategy_options or {}))
        label = label or strat.name
        run = run or f"{label}:{seed}"
        history = self.db.records(task, self.target_key, run=run)
        _same_kind(history, bool(getattr(self.measurer(task), "replayed", False)), task, run)
        key = f"strategy:{self.target_key}:{task.key}:{run}"  # one strategy per run (its history feeds the search)
        before = self.db.get_meta(key)
        if history and before is not None and before != strat.name:
            raise ValueError(f"run {run!r} of {task.name} was tuned by the {before!r} strategy; {strat.name!r} cannot "
                             f"continue it: give another run name (run=...) or database")
        if before is None:
            self.db.set_meta(key, strat.name)
        options = effective_options(strat, strategy_options, by_name=isinstance(strategy, str))
        ca = cost_aware if cost_aware is not None else self.cost_aware
        keep_settings(self.db, settings_key(self.target_key, task.key, run), run_settings(
            strat.name, seed, options, session_cost_model=self.cost_model, defaults=self.defaults,
            model_seed=model_seed, batch=batch or getattr(strat, "batch_size", None), excluded=exclude_sketches,
            cost_aware=ca),
            resumed=bool(history), what=f"run {run!r} of {task.name}")
        spaces = {k: sp for k, sp in spaces_for(task, self.target).items() if sp.sketch.base not in exclude_sketches}
        if not spaces:
            raise ValueError(f"{task.name}: every sketch is excluded ({', '.join(sorted(exclude_sketches))})")
        model_group = group

        def scorer_factory(ctx: SearchContext):
            return self.model(model_group, cost_model=getattr(strat, "cost_model", None),
                              ranker=getattr(strat, "ranker", None),
                              ranker_data=getattr(strat, "ranker_data", None),
                              opening=getattr(strat, "opening", "shared"),
                              seed_key=model_seed).scorer(ctx.spaces)

        ctx = SearchContext(task, self.target, spaces, stream(seed, task.key, len(history)),
                            {r.config for r in history}, list(history), scorer_factory=scorer_factory)
        tr = TaskRun(task, run, label, seed, strat, ctx, trials, seconds, group,
                     clock=history[-1].elapsed_s if history else 0.0, resumed=len(history),
                     last_id=max((r.id or 0 for r in history), default=0))
        tr.screen = Screen(ca, seed) if ca is not None and ca.enabled else None
        if history:
            t = time.perf_counter()
            strat.update(ctx, list(history))
            tr.stats["update_s"] += time.perf_counter() - t
            self._event(tr, "resumed", spent=tr.out_of_budget())
        tr.stop_reason = tr.out_of_budget() or self._stopped_early(tr, ca)
        tr.done = bool(tr.stop_reason)
        self.runs.append(tr)
        return tr

    def _early_stop_key(self, tr: TaskRun) -> str:
        return f"early_stop:{self.target_key}:{tr.task.key}:{tr.run}"

    def _stopped_early(self, tr: TaskRun, ca: CostAware | None) -> str:
        """``"early_stop"`` when this run was stopped early with the same options and trials budget (a bigger one
        goes on) and nothing was added since (the rule's state is not in the records); else ``""``."""
        if tr.screen is None or not tr.resumed:
            return ""
        stored = self.db.get_meta(self._early_stop_key(tr))
        if not stored:
            return ""
        mark = json.loads(stored)
        mark.setdefault("trials", tr.trials)  # (marks written before session 80 hold no budget)
        return "early_stop" if mark == {"at": tr.resumed, "options": repr(ca), "trials": tr.trials} else ""

    def _pick_up_others(self, tr: TaskRun) -> None:
        """Records another process added to this run since we last looked count here too (two
        tuners on one database and run share its budget and never measure a config twice)."""
        for r in self.db.records(tr.task, self.target_key, run=tr.run, since=tr.last_id):
            tr.last_id = max(tr.last_id, r.id or 0)
            if r.config not in tr.ctx.measured:  # this tuner's own records are measured already
                tr.ctx.history.append(r)
                tr.ctx.measured.add(r.config)

    def step(self, tr: TaskRun, n: int | None = None) -> list[TuningRecord]:
        """One round of ``tr``: propose up to ``n`` (default: the strategy's batch size), claim,
        build + measure (each record committed as it arrives), update. Returns the new records."""
        if tr.done:
            return []
        ctx, t0 = tr.ctx, time.perf_counter()
        self._pick_up_others(tr)
        simulated = 0.0
        trial_s = float(getattr(self.measurer(tr.task), "trial_s", 0.0))  # a replay's simulated trial cost
        replayed = bool(getattr(self.measurer(tr.task), "replayed", False))  # marked in each record's info
        n = int(n or getattr(tr.strategy, "batch_size", 16))
        if tr.trials is not None:
            n = min(n, tr.trials - len(ctx.history))
        if self.trials is not None:
            n = min(n, self.trials - self.used)
        if n <= 0:
            return self._finish(tr, tr.out_of_budget() or self.out_of_budget() or "trials", t0)
        ctx.rng = stream(tr.seed, tr.task.key, len(ctx.history))
        ctx.round = tr.rounds
        head = opening_defaults(ctx, n) if self.defaults else []
        proposed = _proposals(tr.strategy, tr.strategy.propose(ctx, n - len(head)))
        cands = head + [c for c in proposed if c not in ctx.measured and c not in head]
        cands = list(dict.fromkeys(cands))[:n]
        if isinstance(getattr(tr.strategy, "last_round", None), dict):  # the strategy's own per-round statistics
            tr.stats.setdefault("search", []).append(dict(tr.strategy.last_round, round=tr.rounds))
        if tr.screen is not None:  # cost-aware: skip cold candidates, or end the run (felixjax.cost_aware)
            cands, why = tr.screen.screen(tr, cands, len(head))
            if why:
                if why == "early_stop":  # remembered: the same call again stays stopped (_stopped_early)
                    self.db.set_meta(self._early_stop_key(tr),
                                     json.dumps({"at": len(ctx.history), "options": repr(tr.screen.options),
                                                 "trials": tr.trials}))
                return self._finish(tr, why, t0)
        tr.stats["propose_s"] += time.perf_counter() - t0
        for c in cands:
            if c.sketch not in ctx.spaces:
                raise ValueError(f"strategy {tr.strategy.name!r} proposed a config of sketch {c.sketch!r}, which "
                                 f"{tr.task.name} does not have (its sketches: {', '.join(ctx.spaces)})")
            try:
                ctx.spaces[c.sketch].validate(c)
            except ValueError as e:
                raise ValueError(f"strategy {tr.strategy.name!r} proposed an invalid config for {tr.task.name}: "
                                 f"{e}") from None
        claim = getattr(self.db, "claim", None)
        if claim is not None and cands:
            cands = claim(tr.task, self.target_key, tr.run, cands, budget=tr.trials, owner=self.owner)
            if not cands:  # another live tuner on this run holds every proposal: wait for its records, propose again
                tr.waits += 1
                if tr.waits > CLAIM_WAITS:
                    _warn_claimed(self.db, tr, self.target_key)  # who holds them, since when, how to clear them
                    return self._finish(tr, "claimed", t0)
                time.sleep(CLAIM_WAIT_S)
                self._pick_up_others(tr)
                tr.clock += time.perf_counter() - t0
                return []
            tr.waits = 0
        if not cands:
            return self._finish(tr, "exhausted", t0)
        try:
            predicted = self._predict(tr, cands)
        except BaseException:  # a Ctrl-C in the model's ranking: its claims go back (measuring releases its own)
            with contextlib.suppress(Exception):
                self.db.release(tr.task, self.target_key, tr.run, cands, owner=self.owner)
            raise
        new: list[TuningRecord] = []
        t_meas = time.perf_counter()

        asked = set(cands)

        def record(cfg: Config, res: MeasureResult) -> bool:
            nonlocal simulated
            if not _reported_once(self.measurer(tr.task), cfg, res, asked, ctx.measured):
                return not (tr.out_of_budget() or self.out_of_budget())
            simulated += trial_s
            clock = tr.clock + time.perf_counter() - t0 + simulated
            info = getattr(self.measurer(tr.task), "info", None)  # e.g. GpuSimMeasurer: ptxas and simulator report
            info = dict(info.get(cfg, {})) if isinstance(info, dict) else {}
            if replayed:
                info["replayed"] = True
            rec = self.db.add(TuningRecord(tr.task, self.target_key, tr.run, len(ctx.history), cfg,
                                           _finite_result(res), clock, self._target_json, info=info), number=True)
            ctx.history.append(rec)
            ctx.measured.add(cfg)
            new.append(rec)
            # another tuner's records of this run since we last looked (before ours: never skipped by last_id)
            # count against the shared budget as they arrive, not only from the next round on
            if self.db.count(tr.task, self.target_key, run=tr.run, since=tr.last_id) > 1:
                self._pick_up_others(tr)
            else:  # ours alone
                tr.last_id = max(tr.last_id, rec.id or 0)
            self.used += 1
            self._event(tr, "measured", in_round=len(new), round_size=len(cands), clock=clock)
            return not (tr.out_of_budget(clock) or self.out_of_budget())

        measurer = self.measurer(tr.task)
        if self.run_caches is not None and hasattr(measurer, "cache_dir"):
            measurer.cache_dir = self.run_caches / re.sub(r"[^A-Za-z0-9_.@=-]", "_", tr.run)
        try:
            measurer.measure(cands, record)
        finally:
            release = getattr(self.db, "release", None)
            if release is not None:
                rest = [c for c in cands if c not in ctx.measured]
                if rest:
                    release(tr.task, self.target_key, tr.run, rest, owner=self.owner)
        tr.stats["build_measure_s"] += time.perf_counter() - t_meas
        if predicted is not None:
            self._rank_quality(tr, cands, predicted, new)
        t = time.perf_counter()
        tr.strategy.update(ctx, new)
        tr.stats["update_s"] += time.perf_counter() - t
        tr.rounds += 1
        tr.stats["rounds"] += 1
        tr.clock += time.perf_counter() - t0 + simulated
        tr.stop_reason = tr.out_of_budget() or ("session" if self.out_of_budget() else "")
        tr.done = bool(tr.stop_reason)
        if tr.done:  # a session of many tasks keeps no finished task's model view (a review: ~2 MB a task)
            tr.ctx.release_scorer()
        self._event(tr, "round", new=len(new))
        return new

    # ---- how well the model ranked this round (issue 15's first lever, measured every round) -----
    @staticmethod
    def _predict(tr: TaskRun, cands: list[Config]) -> np.ndarray | None:
        """The run's cost-model scores of this round's candidates, before they are measured (only for
        runs whose strategy ranks with the context's model)."""
        scorer = tr.ctx._scorer
        if scorer is None or not hasattr(scorer, "score"):
            return None
        return np.asarray(scorer.score(cands), np.float64)

    @staticmethod
    def _rank_quality(tr: TaskRun, cands: list[Config], predicted: np.ndarray, new: list[TuningRecord]) -> None:
        """Kendall tau and top-k recall of the model's scores against this round's measurements
        (``tr.stats["ranking"]``, one entry per round): how well the model ranked what it was about
        to be tested on, not how well it fits what it has seen."""
        lat = {r.config: r.latency_s for r in new if r.ok}
        idx = [i for i, c in enumerate(cands) if c in lat]
        if len(idx) < 4:
            return
        score = predicted[idx]
        y = np.array([lat[cands[i]] for i in idx])
        k = max(1, len(idx) // 4)
        best_true = set(np.argsort(y, kind="stable")[:k].tolist())
        best_pred = set(np.argsort(-score, kind="stable")[:k].tolist())
        tr.stats.setdefault("ranking", []).append({
            "round": tr.rounds, "n": len(idx), "kendall_tau": kendall_tau(score, y),
            "top_k": k, "top_k_recall": len(best_true & best_pred) / k,
            "model": getattr(tr.ctx._scorer, "active", "?")})

    def _finish(self, tr: TaskRun, reason: str, t0: float) -> list[TuningRecord]:
        tr.clock += time.perf_counter() - t0
        tr.done, tr.stop_reason = True, reason
        tr.ctx.release_scorer()
        return []

    # ---- re-timing -----------------------------------------------------------------------------
    def retime(self, runs: list[TaskRun], *, top: int = 3, repeats: int = 3,
               extra: Sequence[Config] = ()) -> dict[str, list[TuningRecord]]:
        """Time the ``top`` best configs of each run of one task again, interleaved (A B C A B C ...),
        ``repeats`` times, with the ``extra`` configs (say the task's default schedule) beside them, and
        store one row per config in run ``"retime:<run>"`` (no budget, no history). Returns ``{run:
        [re-timed records, best first]}``. A row's latency is the median of its ``repeats`` timings: with
        three, one timing disturbed past what the measuring process can see (a multi-threaded kernel's
        thread preempted while the others spin) does not become the result, as it did with two (their mean).
        A row is ``ok`` only where most of its timings were (else it keeps the failure, say ``noisy``)."""
        out: dict[str, list[TuningRecord]] = {}
        if top < 1 or repeats < 1 or not runs:
            return out
        task = runs[0].task
        if any(r.task.key != task.key for r in runs):
            raise ValueError("retime() takes runs of one task")
        picks: dict[str, list[Config]] = {}
        for tr in runs:
            ok = sorted((r for r in tr.history if r.ok and r.config.sketch in tr.ctx.spaces), key=lambda r: r.latency_s)
            best = list(dict.fromkeys(r.config for r in ok))[:top]  # (excluded sketches of an earlier call left out)
            low = noisy_contender(tr.history, ok[0].latency_s if ok else math.inf, tr.ctx.spaces)  # timed only
            best += [low] if low is not None and low not in best else []  # disturbed, below the best (session 80)
            picks[tr.run] = best + [c for c in dict.fromkeys(extra) if c not in best]
        configs = list(dict.fromkeys(c for cs in picks.values() for c in cs))
        if not configs:
            return out
        lat: dict[Config, list[float]] = {c: [] for c in configs}
        failed: dict[Config, MeasureResult] = {}

        asked, seen = set(configs), set()  # seen: in this repeat

        def keep(cfg: Config, res: MeasureResult) -> bool:
            if not _reported_once(self.measurer(task), cfg, res, asked, seen):
                return True
            seen.add(cfg)
            res = _finite_result(res)
            if res.ok:
                lat[cfg].append(res.latency_s)
            else:
                failed[cfg] = res
            return True

        self._event(runs[0], "retime", configs=len(configs), repeats=repeats)  # seconds of silence otherwise
        for _ in range(repeats):
            seen.clear()
            self.measurer(task).measure(configs, keep)
        info = {"replayed": True} if getattr(self.measurer(task), "replayed", False) else {}
        for tr in runs:
            rows, meta = [], dict(info, of=len(picks[tr.run]))  # "of": a batch cut short is told apart (kept_retime)
            for i, cfg in enumerate(picks[tr.run]):
                # ok from most of its timings only: one undisturbed timing among noisy ones (15.7 ms where tuning
                # had measured 18.7 us, session 78's concurrency review) is no median; the failure says why
                res = (MeasureResult("ok", tuple(lat[cfg])) if 2 * len(lat[cfg]) > repeats else
                       failed.get(cfg, MeasureResult("runtime_error", error=f"re-timing: {len(lat[cfg])} of {repeats} "
                                                                            f"timings ok")))
                rows.append(self.db.add(TuningRecord(task, self.target_key, RETIME_PREFIX + tr.run, i, cfg, res,
                                                     tr.clock, self._target_json, info=dict(meta))))
            out[tr.run] = sorted(rows, key=lambda r: r.latency_s)
        return out

    def kept_retime(self, tr: TaskRun) -> list[TuningRecord]:
        """The run's last end-of-run re-timing (best first) when this call measured nothing new for it, else []. A
        finished command run again keeps it: re-timing each time drifted the best down (a minimum over more samples)."""
        if len(tr.history) != tr.resumed:
            return []
        rows = self.db.records(tr.task, self.target_key, run=RETIME_PREFIX + tr.run)
        starts = [i for i, r in enumerate(rows) if r.trial == 0]
        if not starts:
            return []
        # only a re-timing of the run as it stands: one interrupted (or skipped, retime=0) after later
        # records leaves an older one behind, whose best may not be the run's (session 78: a 2x faster
        # config of trials 17-32 was never re-timed and the 16-trial run's re-timing came back as the best)
        newest = max((r.id or 0 for r in tr.history), default=0)
        last = rows[starts[-1]:]
        whole = len(last) >= int((last[0].info or {}).get("of", 0))  # a batch cut short (kill -9) is redone
        return sorted(last, key=lambda r: r.latency_s) if (last[0].id or 0) > newest and whole else []

    # ---- progress ------------------------------------------------------------------------------
    def _event(self, tr: TaskRun, kind: str, **info) -> None:
        if self.show is None:
            return
        best, failures = tr.counted()
        left = (tr.trials - len(tr.history)) if tr.trials is not None else (
            (self.trials - self.used) if self.trials is not None else None)
        clock = info.get("clock", tr.clock)
        measured_here = max(1, len(tr.history) - tr.resumed)
        rate = measured_here / max(clock - (tr.history[tr.resumed - 1].elapsed_s if tr.resumed else 0.0), 1e-9)
        self.show({"event": kind, "task": tr.task, "run": tr.run, "round": tr.rounds + (kind == "measured"),
                   "trials": len(tr.history), "budget": tr.trials, "best": best, "rate": rate,
                   "eta_s": (left / rate) if (left is not None and rate > 0) else None,
                   "failures": failures, "elapsed_s": clock,
                   "resumed": tr.resumed, **info})


class _ProgressPrinter:
    """One line per round, and inside a round at most one line every few seconds, on stderr."""

    def __init__(self, every_s: float = 5.0):
        self.every_s = every_s
        self._last = 0.0

    def __call__(self, p: dict) -> None:
        now = time.monotonic()
        if p["event"] == "measured" and now - self._last < self.every_s:
            return
        self._last = now
        name, run = p["task"].name, p["run"]
        best = p["best"]
        b = f"best {best.gflops:7.1f} GFLOP/s ({best.latency_s * 1e3:.4g} ms)" if best else "best  -"
        budget = f"/{p['budget']}" if p.get("budget") else ""
        if p["event"] == "resumed":
            full = {"trials": " (the budget: nothing left to measure)", "seconds": " (its seconds budget is spent: it "
                    "counts the run's earlier calls)"}.get(p.get("spent", ""), "")
            msg = f"resumed: {p['resumed']} records found in the database{full}, {b}"
        elif p["event"] == "retime":
            msg = (f"timing the best {p['configs']} configs again, {p['repeats']} times interleaved "
                   f"(the result's best), {b} while tuning")
        elif p["event"] == "measured":
            eta = f"  ETA {p['eta_s']:.0f} s" if p.get("eta_s") is not None else ""
            msg = (f"round {p['round']:3d}: {p['in_round']}/{p['round_size']} measured  {p['trials']}{budget} trials  "
                   f"{b}  {p['rate']:.1f} meas/s{eta}")
        else:
            msg = (f"round {p['round']:3d} done: {p['trials']}{budget} trials  {b}  {p['rate']:.1f} meas/s  "
                   f"failures {p['failures']}")
        print(f"[felixjax] {name} {run}: {msg}", file=sys.stderr, flush=True)
