"""Scripted comparisons of search strategies: strategies x seeds x tasks, same budget, interleaved.

Every run (one task, one strategy, one seed; named ``"{strategy}:{seed}"`` in the database) gets the
same budget in trials and seconds, whichever ends first. Runs advance one round at a time, always the
run that has used the smallest share of its budget next, so machine drift hits every strategy alike
(with equal batch sizes this is plain round-robin). Builds and measurements go through one shared
:class:`~codegen.measure.LocalRunner`; a run's clock counts only its own rounds (proposing,
building, measuring, learning). At the end the final best kernel of every run is re-measured,
interleaved (A B C A B C ...), so final latencies compare kernels timed in one window. Each
(strategy, seed) has its own cost model, and the models of one seed draw the same random numbers
(common random numbers): two strategies that propose alike, measured by a replay or a memoized
measurer, stay alike until their logic differs, which pairs an ablation's arms seed by seed.

``replay=True`` swaps the hardware for the synthetic oracle of :mod:`felixjax.testing` (no
building, no timing; each trial costs a simulated 0.3 s on the run's clock), so search logic alone is
compared, repeatably.

Example:
    >>> import felixjax as fj, tempfile, os
    >>> out = tempfile.mkdtemp()
    >>> cmp = fj.compare([fj.ops.matmul(64, 64, 64)], strategies=["genetic", "random"], trials=32, seeds=1,
    ...                  db=None, replay=True, out=out, progress=False)
    >>> sorted(os.listdir(out))
    ['cmp.csv', 'curves.png', 'table.md']
    >>> "genetic" in cmp.table()
    True
"""
from __future__ import annotations

import copy
import csv
import math
import numbers
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from codegen.measure import LocalRunner, TimingProtocol
from codegen.ops import Task, parse_spec
from codegen.run.gpusim import GpuSimMeasurer
from codegen.spaces import spaces_for
from codegen.target import Target

from .database import Database, TuningRecord
from .ratios import METRICS, bootstrap_ratios, geomean  # noqa: F401 (METRICS, bootstrap_ratios: re-exported)
from .session import RETIME_PREFIX, TaskRun, TuningSession, seeds_of
from .strategies import Strategy, get_strategy, registered
from .strategies.base import COST_MODEL_STRATEGIES
from .suites import SUITES, suite
from .testing import ReplayRunner

#: the default comparison: genetic at the gradient search's batch (``genetic@32``: the equal-batch pair the ratios
#: are judged on) and at Ansor's 64 (a reference row), random as the floor
DEFAULT_STRATEGIES = ("gradient", "genetic@32", "genetic", "random")
REACH = 0.95  # "reached" = latency <= best known / REACH
WARMUP_TRIALS = 64  # two rounds of a 32-candidate strategy: descent, features and the model's training all compile
WARMUP_LATER = 32  # the other tasks' warm-up: one round (their own shapes of the descent and features)
REFERENCE_PREFIX = "reference:"  # reserved run names of the strong reference (no strategy's history or budget)


# ----------------------------------------------------------------------------------------------
# The result
# ----------------------------------------------------------------------------------------------

def _median(values: list[float], censored: list[bool]) -> tuple[float, bool]:
    """Median over seeds; it is censored (a lower bound) unless a majority of seeds reached."""
    if not values:
        return math.nan, True
    return float(np.median(values)), sum(not c for c in censored) < len(values) // 2 + 1


@dataclass
class Comparison:
    """Outcome of :func:`compare`: every run's records and the final re-measurements.

    Attributes:
        tasks, strategies, seeds: what was compared (strategies by name).
        trials, seconds: the budget of every run.
        histories: ``{(task name, strategy, seed): [TuningRecord, ...]}`` in trial order.
        remeasured: ``{(task name, strategy, seed): [latency, ...]}`` of each run's final best,
            timed interleaved with the other runs' bests of the task.
        replay: True when latencies came from the synthetic oracle / a replay (no timing).
        warmup_s: wall seconds of the JIT warm-up before the runs (``compare(warmup=...)``), in no run's clock.
        references: ``{(task name, "reference:<strategy>", seed): [TuningRecord, ...]}``: the strong
            reference, runs of ``reference_factor`` x the budget under reserved run names
            (``"reference:<strategy>:<seed>"``) that no compared run's history, budget or cost model
            sees; their bests are re-timed interleaved with the final bests (``remeasured``, same keys).
        openings: ``{task name: set of configs}`` measured first by every run (the hand-written
            defaults, ``defaults=True``); empty when runs start from scratch.
        stats: ``{(task name, strategy, seed): run statistics}`` of the compared runs (the session's
            ``TaskRun.stats``: seconds per phase, per-round ranking quality, the strategy's ``search``
            statistics).
        reach_frac: a run has "reached" when its latency is <= best known / ``reach_frac`` (issue 15's
            rule: 0.95; other values only to see how the verdict depends on the margin).
        batches: ``{strategy: candidates per round}`` (empty when not known, e.g. from a database).
        shared_cache: this call's runs compiled into one shared build cache (``run_caches=None``, measured).
        resumed: some runs were resumed from the database (what they measured before, they compiled as
            that earlier call chose).
    """

    tasks: list[Task]
    strategies: list[str]
    seeds: list[int]
    trials: int
    seconds: float | None
    histories: dict[tuple[str, str, int], list[TuningRecord]]
    remeasured: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)
    replay: bool = False
    references: dict[tuple[str, str, int], list[TuningRecord]] = field(default_factory=dict)
    openings: dict[str, frozenset] = field(default_factory=dict)
    stats: dict[tuple[str, str, int], dict] = field(default_factory=dict)
    reach_frac: float = REACH
    warmup_s: float = 0.0
    batches: dict[str, int] = field(default_factory=dict)
    shared_cache: bool = False
    resumed: bool = False

    # ---- per run -------------------------------------------------------------------------------
    def best_known(self, task: str) -> float:
        """What "95% of best" is taken against: the best latency any compared run or reference run
        found for ``task`` while tuning (with no reference: the compared runs' union alone)."""
        found = min((r.latency_s for (t, _, _), recs in self.histories.items() if t == task for r in recs),
                    default=math.inf)
        return min(found, self.reference_best(task))

    def reference_best(self, task: str) -> float:
        """Best latency the reference runs found for ``task`` while tuning (inf: no reference)."""
        return min((r.latency_s for (t, _, _), recs in self.references.items() if t == task for r in recs),
                   default=math.inf)

    def reference_retimed(self, task: str) -> float:
        """The reference's best, re-timed interleaved with the final bests (median of its re-timings;
        the best reference run's; nan when not re-timed)."""
        meds = [float(np.median(v)) for (t, s, _), v in self.remeasured.items()
                if t == task and s.startswith(REFERENCE_PREFIX) and v and all(map(math.isfinite, v))]
        return min(meds) if meds else math.nan

    def opening_best(self, task: str) -> float:
        """Median over the compared runs of the best latency among their shared opening (the
        configs every run measured first); nan when runs started from scratch."""
        cfgs = self.openings.get(task)
        if not cfgs:
            return math.nan
        bests = [min((r.latency_s for r in recs if r.config in cfgs), default=math.inf)
                 for (t, _, _), recs in self.histories.items() if t == task]
        bests = [b for b in bests if math.isfinite(b)]
        return float(np.median(bests)) if bests else math.nan

    def opening_reaches(self, task: str) -> bool:
        """True when the shared opening alone already reaches 95% of the best known: trials to 95%
        then measure the opening, not the search, and the task is reported apart."""
        best = self.opening_best(task)
        return math.isfinite(best) and best <= self.best_known(task) / self.reach_frac

    def reach(self, task: str, strategy: str, seed: int) -> dict:
        """Trials and seconds until the run's latency was <= best known / 0.95 (censored at the budget
        the run spent when it never got there)."""
        recs = self.histories.get((task, strategy, seed), [])
        target = self.best_known(task) / self.reach_frac
        for i, r in enumerate(recs):
            if r.ok and r.latency_s <= target:  # a task without a correct kernel: inf <= inf reached nothing
                return {"trials": i + 1, "seconds": r.elapsed_s, "reached": True}
        return {"trials": len(recs), "seconds": recs[-1].elapsed_s if recs else 0.0, "reached": False}

    def final(self, task: str, strategy: str, seed: int) -> float:
        """The run's final best: median of its re-measurements (tuning-time best if none)."""
        lat = [x for x in self.remeasured.get((task, strategy, seed), []) if math.isfinite(x)]
        if lat:
            return float(np.median(lat))
        recs = self.histories.get((task, strategy, seed), [])
        return min((r.latency_s for r in recs), default=math.inf)

    # ---- summaries -----------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """One row per (task, strategy): medians over seeds, with censoring flags."""
        out = []
        for task in self.tasks:
            for s in self.strategies:
                reach = [self.reach(task.name, s, seed) for seed in self.seeds]
                cens = [not r["reached"] for r in reach]
                tr, tr_c = _median([r["trials"] for r in reach], cens)
                sec, sec_c = _median([r["seconds"] for r in reach], cens)
                finals = [self.final(task.name, s, seed) for seed in self.seeds]
                found = [min((r.latency_s for r in self.histories.get((task.name, s, seed), [])), default=math.inf)
                         for seed in self.seeds]
                out.append({"task": task.name, "strategy": s, "final_ms": float(np.median(finals)) * 1e3,
                            "found_ms": float(np.median(found)) * 1e3, "trials95": tr, "trials95_censored": tr_c,
                            "seconds95": sec, "seconds95_censored": sec_c,
                            "reached": sum(not c for c in cens), "seeds": len(self.seeds),
                            "trials": float(np.median([len(self.histories.get((task.name, s, seed), []))
                                                       for seed in self.seeds])),
                            "failed": float(np.median([sum(not r.ok for r in self.histories.get((task.name, s, seed), []))
                                                       for seed in self.seeds]))})
        return out

    def reference(self) -> str:
        """The strategy ratios are taken against: ``gradient`` when compared, else the first."""
        return "gradient" if "gradient" in self.strategies else self.strategies[0]

    def ratios(self) -> dict[str, dict]:
        """Geomean over tasks of ``strategy / reference`` for trials and seconds to 95% and final latency.

        Tasks whose shared opening already reaches 95% (:meth:`opening_reaches`) are left out (listed
        in ``apart``), and so are tasks no run measured a correct kernel of (``failed``). ``nokernel``: tasks
        where the strategy found no correct kernel and the reference did (its final ratio is infinite: not in
        the geomean, which is over finite ratios; counted here and said under the table). A censored median (no
        majority of the seeds reached) enters as the budget it spent: a bound, flagged. Returns ``{strategy: {...}}``
        with ``trials95``, ``seconds95``, ``final`` (over
        the tasks kept), ``censored`` (tasks whose ratio involves a censored median), ``bound``
        (``"lower"`` when only the strategy's medians are censored, so its ratios are at least the
        value; ``"upper"`` when only the reference strategy's are; ``"mixed"``; ``None``: no bound),
        ``uncensored`` (tasks where neither is censored), ``uncensored_trials95`` and
        ``uncensored_seconds95`` (geomeans over those tasks only), ``tasks`` (kept) and ``apart``.
        """
        ref = self.reference()
        rows = {(r["task"], r["strategy"]): r for r in self.rows()}
        apart = [t.name for t in self.tasks if self.opening_reaches(t.name)]
        failed = self.failed()
        kept = [t for t in self.tasks if t.name not in apart and t.name not in failed]
        out = {}
        if not kept:
            return out
        for s in self.strategies:
            if s == ref:
                continue
            tr, sec, fin, cens, sides = [], [], [], 0, set()
            clean_tr, clean_sec = [], []
            for task in kept:
                a, b = rows[(task.name, s)], rows[(task.name, ref)]
                r_tr = a["trials95"] / max(b["trials95"], 1e-12)
                r_sec = a["seconds95"] / max(b["seconds95"], 1e-12)
                tr.append(r_tr)
                sec.append(r_sec)
                fin.append(a["final_ms"] / b["final_ms"])
                ca, cb = a["trials95_censored"], b["trials95_censored"]
                if ca or cb:
                    cens += 1
                    sides.add("mixed" if ca and cb else ("lower" if ca else "upper"))
                else:
                    clean_tr.append(r_tr)
                    clean_sec.append(r_sec)
            bound = None if not sides else (sides.pop() if len(sides) == 1 else "mixed")
            out[s] = {"trials95": geomean(tr), "seconds95": geomean(sec), "final": geomean(fin), "censored": cens,
                      "bound": bound, "uncensored": len(clean_tr), "uncensored_trials95": geomean(clean_tr),
                      "uncensored_seconds95": geomean(clean_sec), "tasks": len(kept), "apart": apart,
                      "failed": failed, "nokernel": sum(1 for t in kept if not math.isfinite(rows[(t.name, s)]["final_ms"])
                                                        and math.isfinite(rows[(t.name, ref)]["final_ms"]))}
        return out

    def failed(self) -> list[str]:
        """Tasks no run (reference runs included) measured a correct kernel of: no "95% of best" to reach,
        left out of the ratios."""
        return [t.name for t in self.tasks if not math.isfinite(self.best_known(t.name))]

    def runs(self) -> dict[tuple[str, str], dict[str, list[float]]]:
        """Per (task, strategy) of the tasks :meth:`ratios` keeps: each seed's trials and seconds to 95%
        (censored runs at the budget they spent) and final latency, as :func:`bootstrap_ratios` takes them."""
        out = {}
        failed = self.failed()
        for task in self.tasks:
            if self.opening_reaches(task.name) or task.name in failed:
                continue
            for s in self.strategies:
                reach = [self.reach(task.name, s, seed) for seed in self.seeds]
                out[(task.name, s)] = {"trials95": [r["trials"] for r in reach],
                                       "seconds95": [r["seconds"] for r in reach],
                                       "final": [self.final(task.name, s, seed) for seed in self.seeds]}
        return out

    def intervals(self, n: int = 2000, level: float = 0.9, seed: int = 0,
                  paired: bool = False) -> dict[str, dict[str, tuple]]:
        """Bootstrap intervals (over each op's seeds) of :meth:`ratios`' geomeans; see :func:`bootstrap_ratios`
        (``paired``: resample seeds jointly, for arms that share their random numbers seed by seed)."""
        return bootstrap_ratios(self.runs(), self.reference(), n=n, level=level, seed=seed, paired=paired)

    def _early_stops(self) -> str:
        """A sentence naming the runs a cost-aware rule stopped early (their trials and seconds to 95% are
        bounded by where they stopped, not by the budget), or ""."""
        stopped = sorted(k for k, s in self.stats.items() if s.get("stop_reason") == "early_stop")
        if not stopped:
            return ""
        shown = ", ".join(f"{t} {s}:{seed} at {len(self.histories.get((t, s, seed), []))}" for t, s, seed in stopped)
        return f" Stopped early (cost-aware), at the trial shown: {shown}."

    def table(self) -> str:
        """Markdown: per task and strategy, final best (re-measured) and best while tuning (medians
        over seeds), trials and seconds to reach 95% of the best any strategy found (median over
        seeds; ``>`` marks a censored median: no majority of the seeds got there within the budget), failed
        trials (median over seeds: builds, wrong results, crashes, disturbed timings), then geomean
        ratios against the reference strategy."""
        budget = f"{self.trials} trials" + (f" / {self.seconds:g} s" if self.seconds else "")
        mode = ("replay (synthetic oracle; seconds: each trial's simulated cost plus the search's own real time"
                + (")" if self.warmup_s else ", one-off JAX compilations included: the first run of each learned "
                   "strategy pays them; warmup=64 keeps them out)") if self.replay else "measured")
        lines = [f"Budget per run: {budget}; seeds: {', '.join(map(str, self.seeds))}; latencies: {mode}. "
                 f"Medians over seeds; `>`: censored (no majority of the seeds reached 95% of the best found)."
                 + (f" JIT warm-up before the runs (every task): {self.warmup_s:.0f} s, in no run's clock."
                    if self.warmup_s else "")
                 + self._early_stops() + self._equipment(),
                 "",
                 "| task | strategy | final best, re-timed (ms) | best while tuning (ms) | trials to 95% "
                 "| seconds to 95% | reached | failed trials |",
                 "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in self.rows():
            tr = (">" if r["trials95_censored"] else "") + f"{r['trials95']:g}"  # a median of 2 seeds: 20.5
            sec = (">" if r["seconds95_censored"] else "") + f"{r['seconds95']:.1f}"
            lines.append(f"| {r['task']} | {r['strategy']} | {r['final_ms']:.4g} | {r['found_ms']:.4g} | {tr} | {sec} "
                         f"| {r['reached']}/{r['seeds']} | {r['failed']:g} |")
        if self.references or self.openings:
            lines += ["", "95% of best is taken against the best known: the union of every compared run and the "
                      "reference runs (" + (f"{len({k[1] for k in self.references})} strategy x "
                                            f"{len({k[2] for k in self.references})} seed run(s) of "
                                            f"{max((len(v) for v in self.references.values()), default=0)} "
                                            "trials per task, under reserved run names" if self.references else
                                            "none") + "). Opening: the configs every run measured first; a task "
                      "whose opening already reaches 95% is reported apart (left out of the geomeans).", "",
                      "| task | best known (ms) | reference while tuning (ms) | reference re-timed (ms) "
                      "| opening best (ms) | opening reaches 95% |",
                      "| --- | ---: | ---: | ---: | ---: | --- |"]
            for t in self.tasks:
                cells = [self.best_known(t.name), self.reference_best(t.name), self.reference_retimed(t.name),
                         self.opening_best(t.name)]
                txt = [f"{c * 1e3:.4g}" if math.isfinite(c) else "—" for c in cells]
                lines.append(f"| {t.name} | {' | '.join(txt)} | {'yes (apart)' if self.opening_reaches(t.name) else 'no'} |")
        ratios = self.ratios()
        if ratios:
            ref = self.reference()
            first = next(iter(ratios.values()))
            apart = f"; apart (opening reaches 95%): {', '.join(first['apart'])}" if first["apart"] else ""
            apart += f"; left out (no correct kernel): {', '.join(first['failed'])}" if first["failed"] else ""
            lines += ["", f"Geomean over {first['tasks']} task(s) of strategy / {ref} (> 1: {ref} is better){apart}. "
                      "Bounds: `lower` = only the strategy's medians are censored (the true ratio is at least this), "
                      f"`upper` = only {ref}'s are, `mixed` = both; the uncensored columns use only tasks where "
                      "neither is censored.", "",
                      "| ratio | trials to 95% | seconds to 95% | final latency | tasks with censored runs | bound "
                      "| uncensored tasks | trials, uncensored | seconds, uncensored |",
                      "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
            for s, r in ratios.items():
                lines.append(f"| {s} / {ref} | {r['trials95']:.2f} | {r['seconds95']:.2f} | {r['final']:.3f} "
                             f"| {r['censored']} | {r['bound'] or '—'} | {r['uncensored']} "
                             + (f"| {r['uncensored_trials95']:.2f} | {r['uncensored_seconds95']:.2f} |" if r["uncensored"]
                                else "| — | — |"))  # no task uncensored for both: no geomean to show
            for s, r in ratios.items():
                if r["nokernel"]:
                    lines.append(f"\n{s}: no correct kernel on {r['nokernel']} task(s) where {ref} had one: left out "
                                 "of its final-latency geomean, which flatters it there.")
        elif len(self.strategies) > 1:
            apart, failed = [t.name for t in self.tasks if self.opening_reaches(t.name)], self.failed()
            lines += ["", "No ratios: every task is set apart" + (f"; the opening reaches 95%: {', '.join(apart)}"
                                                                  if apart else "")
                      + (f"; no run measured a correct kernel: {', '.join(failed)}" if failed else "") + "."]
        return "\n".join(lines)

    def _equipment(self) -> str:
        """Table header notes on what the ratios mix with the search: unequal batches, a shared build cache."""
        ref, out = self.reference(), ""
        if self.batches:
            out += " Candidates per round: " + ", ".join(f"{s} {b}" for s, b in self.batches.items()) + "."
            other = [s for s, b in self.batches.items() if ref in self.batches and b != self.batches[ref]
                     and split_name(s)[0] in COST_MODEL_STRATEGIES]  # random's batch only paces the interleaving
            if other:
                out += (f" The ratios of {', '.join(other)} mix the search with a different batch than {ref}'s (a "
                        "batch decides how often the model learns): compare at equal batches with NAME@N.")
        if self.shared_cache:
            out += (" One build cache for every run: a run proposing a kernel another run compiled gets it free, "
                    "which shortens its seconds (`run_caches=` / `--run-caches` gives each run its own).")
        if self.resumed and not self.replay:  # a replay builds nothing
            out += (" Some runs were resumed from the database: their earlier records were built as that call chose "
                    "(shared or own build caches).")
        return out

    def to_csv(self, path: str | os.PathLike) -> str:
        """Every measurement: strategy, seed, task, phase (``tune`` / ``reference`` / ``remeasure``), trial index,
        elapsed seconds of its run, latency, best so far, status, ``opening``: 1 where the config is one of
        the task's shared opening (the defaults every run measured first), else 0, and ``stop_reason``: why
        the run ended (``trials``, ``seconds``, ``early_stop`` (cost-aware), ...; empty where not known)."""
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["strategy", "seed", "task", "phase", "trial", "elapsed_s", "latency_s", "best_so_far_s",
                        "status", "opening", "stop_reason"])
            tagged = [(k, "tune", v) for k, v in self.histories.items()]
            tagged += [(k, "reference", v) for k, v in self.references.items()]
            for (task, s, seed), phase, recs in tagged:
                best, opening = math.inf, self.openings.get(task, frozenset())
                why = self.stats.get((task, s, seed), {}).get("stop_reason") or ""
                for r in recs:
                    best = min(best, r.latency_s)
                    w.writerow([s, seed, task, phase, r.trial, f"{r.elapsed_s:.4f}", repr(r.latency_s), repr(best),
                                r.status, int(r.config in opening), why])
            for (task, s, seed), lats in self.remeasured.items():
                for i, lat in enumerate(lats):
                    w.writerow([s, seed, task, "remeasure", i, "", repr(lat), "", "ok" if math.isfinite(lat) else
                                "failed", 0, ""])
        return os.fspath(path)

    def plot(self, path: str | os.PathLike) -> str:
        """PNG: per task, best-so-far latency against trials and against seconds; one line per strategy
        (median over seeds) with a band (best to worst seed) (:func:`felixjax.compare_plot.plot_comparison`)."""
        from .compare_plot import plot_comparison

        return plot_comparison(self, path)

    def save(self, out: str | os.PathLike) -> dict[str, str]:
        """Write ``cmp.csv``, ``table.md`` and ``curves.png`` into the folder ``out``."""
        os.makedirs(out, exist_ok=True)
        table = os.path.join(out, "table.md")
        with open(table, "w") as f:
            f.write(self.table() + "\n")
        return {"csv": self.to_csv(os.path.join(out, "cmp.csv")), "table": table,
                "plot": self.plot(os.path.join(out, "curves.png"))}


# ----------------------------------------------------------------------------------------------
# compare()
# ----------------------------------------------------------------------------------------------

def _as_tasks(tasks) -> list[Task]:
    if isinstance(tasks, (Task, str)):
        tasks = [tasks]
    out: list[Task] = []
    for t in tasks:
        if isinstance(t, Task):
            out.append(t)
        elif isinstance(t, str) and t in SUITES:
            out.extend(suite(t))
        elif isinstance(t, str):
            out.append(parse_spec(t))
        else:
            raise TypeError(f"{t!r} is not a task, an op spec or a suite name")
    if not out:
        raise ValueError("no tasks to compare")
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ValueError(f"a task is listed twice: {sorted({n for n in names if names.count(n) > 1})}")
    return out


def split_name(name: str) -> tuple[str, int | None]:
    """``"genetic@32"`` -> ``("genetic", 32)`` (the registered strategy at 32 candidates per round);
    ``"genetic"`` -> ``("genetic", None)``. Raises ``ValueError`` on a batch that is not a positive integer."""
    base, at, batch = name.partition("@")
    if at and not (batch.isdigit() and int(batch) >= 1):
        raise ValueError(f"strategy {name!r}: the batch after '@' must be a positive integer")
    return base, int(batch) if at else None


def default_strategies() -> list[str]:
    """:data:`DEFAULT_STRATEGIES` that are registered, ``genetic@N`` at the gradient search's default batch."""
    names = registered()
    batch = get_strategy("gradient").batch_size if "gradient" in names else 32
    return [s.replace("@32", f"@{batch}") for s in DEFAULT_STRATEGIES if s.partition("@")[0] in names]


def _strategy_factory(s, options: dict) -> tuple[str, Callable[[], Strategy]]:
    """(name, fresh-instance factory): runs never share a strategy's state."""
    if isinstance(s, str):
        base, batch = split_name(s)
        kw = {**options.get(base, {}), **options.get(s, {})}
        get_strategy(base, **kw)  # fail early on an unknown name or option

        def make():
            st = get_strategy(base, **kw)
            if batch:  # the tuner asks every strategy for batch_size candidates per round
                st.name, st.batch_size = s, batch
            return st
        return s, make
    if not isinstance(s, type) and isinstance(s, Strategy):
        return s.name, lambda: copy.deepcopy(s)
    if callable(s):
        return s().name, s
    raise TypeError(f"{s!r} is not a strategy name, a strategy object or a factory")


def _replay_measurer(replay, task: Task, target: Target):
    if replay is True or replay == "synthetic":
        return ReplayRunner.from_oracle(task, target)
    if isinstance(replay, (str, os.PathLike)):
        replay = os.path.expanduser(replay)
        if not os.path.exists(replay):
            raise FileNotFoundError(f"{replay}: no such database to replay")
        return ReplayRunner.from_database(replay, task)
    if hasattr(replay, "measure"):
        return replay
    if callable(replay):
        return replay(task, target)
    raise TypeError(f"replay={replay!r}: expected True, a database path, a measurer or a factory (task, target)")


#: records at or past a resumed run's seconds budget that still mean "run with this budget": the trial that spent
#: it, of each of two tuners sharing the run (the README's "Two tuners on the same database")
SECONDS_PAST_OK = 2


def compare(tasks, strategies: Iterable | str | None = None, trials: int = 512, seconds: float | None = None,
            seeds: int | Iterable[int] = 3, target: Target | None = None, db: str | Database | None = "cmp.db",
            threads: int | None = None, out: str | os.PathLike | None = None, replay=None, *,
            progress: bool = True, protocol: TimingProtocol | None = None, runner: LocalRunner | None = None,
            remeasure: int = 3, strategy_options: dict | None = None, defaults: bool = True,
            cost_aware=None, reference: bool | Iterable = False, reference_factor: float = 2.0,
            run_caches: str | os.PathLike | None = None, warmup: int | None = None) -> Comparison:
    """Compare search strategies on tasks with equal budgets, interleaved, and summarize.

    Args:
        tasks: tasks, op specs (``"matmul:m=512,n=512,k=512"``) or suite names (``"ops"``).
        strategies: names, strategy objects (deep-copied per run) or zero-argument factories;
            default: :data:`DEFAULT_STRATEGIES` (``gradient``, ``genetic`` at the gradient search's batch,
            ``genetic`` at Ansor's 64, ``random``), those registered. A name may end in
            ``@N``: that strategy at ``N`` candidates per round, under that name (``"genetic@32"``
            next to ``"genetic"``: the genetic search at the gradient search's batch and at Ansor's 64).
        trials: budget of every run in trials (a trial is a candidate sent to the builder).
        seconds: budget of every run in its own seconds (whichever ends first).
        seeds: number of seeds (0, 1, ...) or the seeds themselves.
        target: the machine (default ``Target.cpu()``).
        db: database of every measurement (runs ``"{strategy}:{seed}"``; an interrupted comparison
            resumes from it); ``None`` keeps records in memory.
        threads: threads per kernel (default: all cores of the target).
        out: folder to write ``cmp.csv``, ``table.md`` and ``curves.png`` into.
        replay: ``None`` measures on this machine; ``True`` replays the synthetic oracle of each task;
            a database path replays its recorded latencies; a measurer object or a factory
            ``(task, target) -> measurer`` is used as given (:mod:`felixjax.testing`).
        progress: print a line per round to stderr.
        protocol, runner: timing protocol and a shared runner (default: one started here).
        remeasure: interleaved re-measurements of each run's final best.
        strategy_options: ``{name: {keyword: value}}`` for strategies given by name.
        defaults: every run measures each sketch's hand-written default schedule first (as
            :func:`felixjax.tune` does), so strategies start from the same point.
        cost_aware: a :class:`~felixjax.cost_aware.CostAware` for every run (``None``: off, so
            strategies are compared on full budgets).
        reference: the strong reference "95% of best" is judged against: ``True`` adds, per task,
            one run of every compared strategy x seed with ``reference_factor`` x the budget (trials
            and seconds) under the reserved run name ``"reference:<strategy>:<seed>"``, with its own
            cost model, so no compared run's history, budget or model sees it; an iterable names the
            strategies (names, objects or factories) of the reference instead. Its best is re-timed
            interleaved with the final bests. ``False``: 95% of the compared runs' union.
        reference_factor: the reference runs' budget as a multiple of the compared runs'.
        run_caches: a folder: every run (reference runs too) compiles into a build cache of its own under
            it, so each run's clock pays every compile of its own proposals; ``None`` (the default): one
            shared cache, where a run proposing a kernel another run already compiled gets it free (the runs
            later in each round's order gain most: session 33 found 14-67% of the genetic runs' trials
            compiled free against 3-21% of the gradient's, on ``fresh``). Measured runs only.
        warmup: trials per strategy of a throwaway run on the replay oracle of the first task (and
            ``min(warmup, WARMUP_LATER)`` on each other task: their shapes compile too; session 76) before the
            runs, so that no run's clock pays the one-off JAX compilations (descent, features, cost-model
            training) that every later run reuses (the first learned run's seconds otherwise read several
            seconds high: 8.6 s on a 2-core machine with no compilation cache, benchmarks/compare_warmup.py). ``None`` (the default):
            ``WARMUP_TRIALS`` for a measured comparison on a CPU, 0 for a replayed one or a simulated GPU
            (whose warm-up runs the GPU simulator without nvcc: ~45 s for 64 trials of two strategies on a
            2-core machine); 0: off. Nothing of it is stored; its wall seconds are ``Comparison.warmup_s``.

    Returns:
        A :class:`Comparison` (``.table()``, ``.to_csv(path)``, ``.plot(path)``).

    Example:
        >>> import felixjax as fj
        >>> c = fj.compare("matmul:m=64,n=64,k=64", strategies="genetic,random", trials=16, seeds=1, db=None,
        ...                replay=True, progress=False)
        >>> sorted(c.strategies), len(c.histories[("matmul_64x64x64", "genetic", 0)])
        (['genetic', 'random'], 16)
    """
    task_list = _as_tasks(tasks)
    if strategies is None:
        strategies = default_strategies()
    elif isinstance(strategies, str):
        strategies = [s.strip() for s in strategies.split(",") if s.strip()]
    factories = [_strategy_factory(s, strategy_options or {}) for s in strategies]
    labels = [name for name, _ in factories]
    if not labels:
        raise ValueError("no strategies to compare")
    if len(set(labels)) != len(labels):
        raise ValueError(f"strategy names must be distinct, got {labels}")
    reserved = [n for n in labels if n.startswith((REFERENCE_PREFIX, "retime:"))]
    if reserved:
        raise ValueError(f"strategy names {reserved} use a reserved prefix ({REFERENCE_PREFIX!r}, 'retime:')")
    if reference is True:
        ref_factories = factories
    elif reference is False or reference is None:
        ref_factories = []
    else:
        ref_factories = [_strategy_factory(s, strategy_options or {}) for s in reference]
    if ref_factories and not reference_factor > 0:
        raise ValueError(f"reference_factor must be > 0 (got {reference_factor})")
    seed_list = seeds_of(seeds)
    if not seed_list:
        raise ValueError("seeds must be >= 1")
    if len(set(seed_list)) < len(seed_list):  # one run counted twice ("reached 2/2")
        raise ValueError(f"seeds are listed twice: {seed_list}")
    if not isinstance(trials, numbers.Integral) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be an integer >= 1 (got {trials!r})")
    if seconds is not None and not seconds > 0:
        raise ValueError(f"seconds must be > 0 (got {seconds})")
    if not isinstance(remeasure, numbers.Integral) or isinstance(remeasure, bool) or remeasure < 0:
        raise ValueError(f"remeasure must be an integer >= 0 (got {remeasure!r})")
    if threads is not None and not (isinstance(threads, numbers.Integral) and not isinstance(threads, bool)
                                    and threads >= 1):
        raise ValueError(f"threads must be an integer >= 1 (got {threads!r})")
    if out is not None and os.path.exists(out) and not os.path.isdir(out):  # found now, not after hours of tuning
        raise ValueError(f"out={os.fspath(out)!r}: is a file, not a folder (compare writes several files into it)")
    target = Target.parse(target)
    warmup = (WARMUP_TRIALS if replay is None and not target.is_gpu else 0) if warmup is None else int(warmup)
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 (got {warmup})")
    target_key = "replay:" + target.key if replay is not None else target.at_threads(threads).key
    measurer = None if replay is None else (lambda t, tg: _replay_measurer(replay, t, tg))
    with TuningSession(target, db=db, runner=runner, measurer=measurer, target_key=target_key, threads=threads,
                       protocol=protocol, progress=False, defaults=defaults, cost_aware=cost_aware,
                       run_caches=run_caches) as session:
        # one cost model per (strategy, seed), shared by that run's tasks only; the models of one seed draw
        # the same random numbers (common random numbers: arms that propose alike stay alike)
        runs = [session.add(t, make(), seed=seed, label=name, trials=trials, seconds=seconds, group=(name, seed),
                            model_seed=seed)
                for t in task_list for seed in seed_list for name, make in factories]
        # the strong reference: longer runs under reserved names, with cost models of their own
        ref_trials = max(1, int(round(reference_factor * trials)))
        ref_seconds = None if seconds is None else reference_factor * seconds
        ref_runs = [session.add(t, make(), seed=seed, label=REFERENCE_PREFIX + name, trials=ref_trials,
                                seconds=ref_seconds, group=(REFERENCE_PREFIX, name, seed))
                    for t in task_list for seed in seed_list for name, make in ref_factories]
        over = [r for r in runs + ref_runs if r.trials is not None and len(r.history) > r.trials]
        if over:  # a resumed comparison with a smaller budget would judge runs longer than it says
            r = over[0]
            raise ValueError(f"the database holds {len(r.history)} trials of run {r.run!r} on {r.task.name}, more than "
                             f"this comparison's budget of {r.trials} ({len(over)} run(s) like it): compare into a new "
                             f"database / --out, or with the budget it was run with")
        # a run stops with the trial that spends its seconds, one such trial per tuner sharing the run (two
        # processes comparing into one database: each keeps its own clock): more past them were a longer budget's
        longer = [r for r in runs + ref_runs if r.seconds is not None
                  and sum(rec.elapsed_s >= r.seconds for rec in r.history) > SECONDS_PAST_OK]
        if longer:
            r = longer[0]
            raise ValueError(f"the database holds run {r.run!r} on {r.task.name} measured for "
                             f"{r.history[-1].elapsed_s:.3g} s, past this comparison's budget of {r.seconds:g} s "
                             f"({len(longer)} run(s) like it): compare into a new database / --out, or with the "
                             f"budget it was run with")
        openings = _openings(task_list, target) if defaults else {}
        runs_all = runs + ref_runs
        settled = {(r.task.key, r.run) for r in runs_all if r.done}  # finished in an earlier, resumed call
        warmup_s = 0.0
        if warmup and len(settled) < len(runs_all):
            t0 = time.perf_counter()
            try:
                # the synthetic oracle models CPU sketches; a simulated GPU warms up on its own simulator
                # every task: a conv's first gradient round compiled 1.4 s of its own after a matmul's warm-up
                for part, n in ((task_list[:1], warmup), (task_list[1:], min(warmup, WARMUP_LATER))):
                    if part:
                        compare(part, strategies, trials=n, seeds=[0], target=target, db=None,
                                replay=(lambda t, tg: GpuSimMeasurer(t, tg, nvcc=False)) if target.is_gpu else True,
                                progress=False, remeasure=0, strategy_options=strategy_options, defaults=defaults,
                                warmup=0)
                warmup_s = time.perf_counter() - t0
            except Exception as e:  # a fairness aid only: the comparison goes on, saying its clocks may read high
                print(f"[compare] JIT warm-up failed ({type(e).__name__}: {e}); the first run of each learned "
                      "strategy pays its compilations in its clock", file=sys.stderr, flush=True)
            if progress and warmup_s:
                more = f" and {min(warmup, WARMUP_LATER)} on each other task" if len(task_list) > 1 else ""
                print(f"[compare] JIT warm-up: {warmup} replayed trials per strategy on {task_list[0].name}{more}, "
                      f"{warmup_s:.1f} s (in no run's clock)", file=sys.stderr, flush=True)
        # interleave: always advance the run that used the smallest share of its budget (ties: in order)
        while True:
            active = [r for r in runs_all if not r.done]
            if not active:
                break
            run = min(active, key=lambda r: r.progress())
            session.step(run)
            if progress:
                b = run.best()
                best = f"{b.latency_s * 1e3:.4f} ms" if b else "-"
                print(f"[compare] {run.task.name} {run.run}: round {run.rounds} {len(run.history)}/{run.trials} trials "
                      f"{run.clock:.1f} s  best {best}", file=sys.stderr, flush=True)
        remeasured = _remeasure(session, runs_all, remeasure, progress, settled)
        result = Comparison(task_list, labels, seed_list, trials, seconds,
                            {(r.task.name, r.label, r.seed): list(r.history) for r in runs}, remeasured,
                            replay is not None, {(r.task.name, r.label, r.seed): list(r.history) for r in ref_runs},
                            openings, {(r.task.name, r.label, r.seed): dict(r.stats, stop_reason=r.stop_reason)
                                       for r in runs},
                            warmup_s=warmup_s, batches={r.label: int(getattr(r.strategy, "batch_size", 16))
                                                        for r in runs},
                            shared_cache=run_caches is None and replay is None,
                            resumed=any(r.resumed for r in runs_all))
    if out is not None:
        result.save(out)
    return result


def from_database(db: str | os.PathLike | Database, tasks, strategies: Iterable[str], seeds: Iterable[int],
                  trials: int, *, target: Target | None = None, threads: int | None = None,
                  defaults: bool = True, reference: bool = True,
                  replay: bool = False) -> tuple[Comparison | None, list[str]]:
    """The :class:`Comparison` a :func:`compare` run left in ``db``, measuring nothing: for a long
    comparison stopped part-way (it resumes from ``db``), what the finished tasks say so far. A task
    counts when every run of it (each strategy x seed, and with ``reference`` each reference run) has its
    final re-timing (``retime:<run>`` rows, written only after every run of the task ended); the others
    are returned by name. ``strategies`` by name; ``target`` / ``threads`` / ``defaults`` as given to
    :func:`compare`, ``replay`` true for a replayed one. Returns ``(comparison, or None when no task is
    finished; the unfinished tasks' names)``."""
    task_list = _as_tasks(tasks)
    strategies, seeds = list(strategies), list(seeds)
    target = Target.parse(target)
    key = "replay:" + target.key if replay else target.at_threads(threads).key  # as compare() stores them
    own = not isinstance(db, Database)
    database = Database(db, readonly=True) if own else db
    done, waiting = [], []
    histories, references, remeasured = {}, {}, {}
    try:
        for t in task_list:
            runs = {}
            for name in strategies:
                for seed in seeds:
                    for label in (name, REFERENCE_PREFIX + name) if reference else (name,):
                        rows = database.records(t, key, run=f"{label}:{seed}")
                        again = database.records(t, key, run=f"retime:{label}:{seed}")
                        if not rows or not again:
                            break
                        res = again[-1].result
                        runs[(t.name, label, seed)] = (rows, list(res.latencies) if res.ok else [math.inf])
            if len(runs) != len(strategies) * len(seeds) * (2 if reference else 1):
                waiting.append(t.name)
                continue
            done.append(t)
            for k, (rows, lat) in runs.items():
                (references if k[1].startswith(REFERENCE_PREFIX) else histories)[k] = rows
                remeasured[k] = lat
        batches = {}  # candidates per round, where every run of a strategy kept the same (runs since session 79)
        for name in strategies:
            got = {(database.run_settings(t, key, f"{name}:{seed}") or {}).get("batch") for t in done for seed in seeds}
            if len(got) == 1 and isinstance(next(iter(got)), int):
                batches[name] = got.pop()
    finally:
        if own:
            database.close()
    if not done:
        return None, waiting
    return Comparison(done, strategies, seeds, trials, None, histories, remeasured, replay, references,
                      _openings(done, target) if defaults else {}, batches=batches), waiting


def _openings(tasks: list[Task], target: Target) -> dict[str, frozenset]:
    """Per task, the hand-written default of every sketch (what ``defaults=True`` measures first)."""
    out = {}
    for t in tasks:
        cfgs = []
        for space in spaces_for(t, target).values():
            try:
                cfgs.append(space.default())
            except ValueError:  # as opening_defaults: no default for this sketch
                continue
        out[t.name] = frozenset(cfgs)
    return out


def _remeasure(session: TuningSession, runs: list[TaskRun], repeats: int, progress: bool,
               settled: set[tuple[str, str]] = frozenset()) -> dict:
    """Time the final best of every run of a task again, interleaved (A B C A B C ...), ``repeats``
    times; the re-timings are stored as ``retime:<run>`` rows (no budget, no history). A task whose runs
    were all ``settled`` (finished before a resumed call) and re-timed then keeps those re-timings: timing
    them again would only add a second, later sample of the same finals."""
    out: dict[tuple[str, str, int], list[float]] = {}
    if repeats < 1:
        return out
    by_task: dict[str, list[TaskRun]] = {}
    for r in runs:
        by_task.setdefault(r.task.key, []).append(r)
    for task_runs in by_task.values():
        earlier = {}
        if all((r.task.key, r.run) in settled for r in task_runs):
            earlier = {r.run: session.db.records(r.task, session.target_key, run=RETIME_PREFIX + r.run)[-1:]
                       for r in task_runs}
        kept = bool(earlier) and all(earlier.values())
        rows = earlier if kept else session.retime(task_runs, top=1, repeats=repeats)
        for r in task_runs:
            if rows.get(r.run):
                res = rows[r.run][0].result
                out[(r.task.name, r.label, r.seed)] = list(res.latencies) if res.ok else [math.inf]
        if progress:
            what = "kept the earlier re-timing of" if kept else f"re-measured x {repeats}, interleaved,"
            print(f"[compare] {task_runs[0].task.name}: {what} the final best of {len(task_runs)} run(s)",
                  file=sys.stderr, flush=True)
    return out
