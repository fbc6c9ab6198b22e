"""Tuning a whole model: every distinct task under one trial budget, rounds given out by the
gradient task scheduler (:func:`scheduled_rounds`, :class:`NetworkTuneResult`); the entry point is
:func:`felixjax.pipeline.tune_model`."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codegen.ops import Task
from codegen.space import Config
from codegen.target import Target

from .database import UPPER_BOUND, TuningRecord
from .network_build import CompiledModel
from .onnx_import import Model
from .scheduler import TaskScheduler
from .session import TaskRun, TuningSession
from .strategies import registered


@dataclass
class TaskTuning:
    """One distinct task of a tuned model: its weight, the trials this run gave it, its best record, and
    why the scheduler stopped giving it rounds (``stop_reason``: ``"early_stop"`` when cost-aware
    tuning ended it and its budget went to the other tasks, ``"exhausted"``, ``"no_correct_kernel"``; ``""`` while it still
    had rounds when the session's budget ran out)."""

    task: Task
    weight: int
    trials: int = 0
    rounds: int = 0
    best: TuningRecord | None = None
    stop_reason: str = ""

    @property
    def latency_s(self) -> float | None:
        return self.best.latency_s if self.best is not None else None


@dataclass
class NetworkTuneResult:
    """Outcome of :func:`tune_model`.

    Attributes:
        model, target, run, strategy: what was tuned, where, and how.
        tasks: one :class:`TaskTuning` per distinct task (the model's order).
        rounds: one dict per scheduled round (task index, trials added, estimated latency after it).
        wall_s: seconds the tuning took.
    """

    model: Model
    target: Target
    run: str
    strategy: str
    tasks: list[TaskTuning]
    rounds: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    builder: Callable[..., Any] | None = field(default=None, repr=False, compare=False)  # pipeline.build_model
    #: what the in-network choice measured (a ``felixjax.network_select.NetworkSelection``; ``None``: not run)
    selection: Any = field(default=None, repr=False, compare=False)

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def estimated_latency_s(self) -> float:
        """``sum_i weight_i * best_i`` over tasks with a correct kernel (anchors only; cheap ops excluded)."""
        return sum(t.weight * t.latency_s for t in self.tasks if t.latency_s is not None)

    def configs(self) -> dict[Task, Config]:
        """The best config of every task that has one."""
        return {t.task: t.best.config for t in self.tasks if t.best is not None}

    def table(self) -> str:
        """The summary table: per task its weight, trials, best latency, GFLOP/s and share of the total."""
        total = self.estimated_latency_s or 1.0
        rows = [("task", "weight", "trials", "best ms", "GFLOP/s", "weighted ms", "share")]
        for t in self.tasks:
            if t.best is None:
                rows.append((t.task.name, str(t.weight), str(t.trials), "-", "-", "-", "-"))
                continue
            wl = t.weight * t.best.latency_s
            le = "<= " if t.best.result.error == UPPER_BOUND else ""  # timed only disturbed: an upper bound
            rows.append((t.task.name, str(t.weight), str(t.trials), f"{le}{t.best.latency_s * 1e3:.4g}",
                         f"{'>= ' if le else ''}{t.best.gflops:.1f}", f"{le}{wl * 1e3:.4g}", f"{100 * wl / total:.1f}%"))
        missing = sum(t.best is None for t in self.tasks)
        rows.append((f"total (anchors{f', {missing} task(s) without a timing left out' if missing else ''})",
                     str(sum(t.weight for t in self.tasks)), str(self.trials), "", "",
                     f"{self.estimated_latency_s * 1e3:.4g}", ""))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def build(self, **kwargs: Any) -> "CompiledModel":
        """:func:`felixjax.build_model` with this run's best configs."""
        if self.builder is None:
            raise RuntimeError("this result was not made by felixjax.tune_model: call fj.build_model(model, "
                               "configs=res.configs())")
        return self.builder(self.model, self.target, configs=self.configs(), **kwargs)

    def __repr__(self) -> str:
        return (f"NetworkTuneResult({self.model.name}, {len(self.tasks)} tasks, {self.trials} trials, "
                f"estimated {self.estimated_latency_s * 1e3:.4g} ms, {self.wall_s:.0f} s)")


def _default_strategy() -> str:
    return "gradient" if "gradient" in registered() else "random"


def _round_progress(p: dict) -> None:
    best = p["best"]
    bound = p.get("noisy_bound_s")
    b = (f"best {best.latency_s * 1e3:.4g} ms ({best.gflops:.1f} GFLOP/s)" if best else
         f"correct kernels timed only on a busy machine (noisy): best <= {bound * 1e3:.4g} ms" if bound else
         "no correct kernel yet")
    print(f"[felixjax] round {p['round']:3d}  task {p['index'] + 1}/{p['tasks']} {p['task'].name} (x{p['weight']}): "
          f"+{p['new']} -> {_n(p['task_trials'], 'trial')}, {b} | " + _estimate(p) + " | "
          f"{p['trials']}/{p['budget']} trials, {p['elapsed_s']:.0f} s", file=sys.stderr, flush=True)


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def _estimate(p: dict) -> str:
    """The round line's network estimate (none before a task has a clean timing; session 80: "est. 0 ms")."""
    measured = p.get("measured_tasks", p["tasks"])
    if not measured:
        return "network est. none yet (no task timed cleanly)"
    part = f" ({measured} of {p['tasks']} tasks)" if measured < p["tasks"] else ""
    return f"network est. {p['estimate_s'] * 1e3:.4g} ms{part}"


_clock = time.monotonic  # InRoundProgress's clock (a test replaces it)


class InRoundProgress:
    """``tune_model``'s default lines *inside* a long round (the session's events; :func:`_round_progress`
    prints one line per round): at most one line every ``every_s`` seconds, none in a round shorter than that,
    and one when the bests are timed again at the end. A callable ``progress=`` gets round dicts only."""

    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        self._start = self._last = _clock()

    def __call__(self, p: dict) -> None:
        now, kind = _clock(), p["event"]
        if kind == "round":  # the next round starts now (its proposals, then its measurements)
            self._start = now
            return
        if kind == "retime":
            msg = f"timing its best {_n(p['configs'], 'config')} again, {p['repeats']} times interleaved"
        elif kind == "measured" and now - self._start >= self.every_s and now - self._last >= self.every_s:
            best = p["best"]
            msg = (f"{p['in_round']}/{p['round_size']} measured in this round, "
                   + (f"best {best.latency_s * 1e3:.4g} ms" if best else "no correct kernel yet")
                   + f", {p['rate']:.2g} meas/s, round {now - self._start:.0f} s so far")
        else:
            return
        self._last = now
        print(f"[felixjax]   task {p['task'].name}: {msg}", file=sys.stderr, flush=True)


def round_best(records) -> float | None:
    """What the task scheduler is told a task's best is: its fastest correct record, else the fastest
    timing of a correct kernel timed only on a busy machine (a ``noisy`` record: an upper bound on its
    latency), else ``None`` (no correct kernel: after a few such rounds the task drops out). Session 73:
    a task whose records were all ``noisy`` was dropped as having no correct kernel, also after resuming.

    Example:
        >>> from codegen.measure import MeasureResult
        >>> from types import SimpleNamespace as R
        >>> round_best([R(result=MeasureResult("noisy", (3e-3, 2e-3, 4e-3)))])
        0.002
    """
    ok = [r.result.latency_s for r in records if r.result.ok]
    if ok:
        return min(ok)
    # every timing of a disturbed kernel is an upper bound: the lowest is the tightest (the median read up to
    # 3400x a kernel's re-timed best on a busy machine, and the scheduler gave that task half the budget)
    bounds = [min(r.result.latencies) for r in records if r.result.status == "noisy" and r.result.latencies]
    return min(bounds) if bounds else None


def _priced(tr: TaskRun, info: list[TaskTuning]) -> float | None:
    """The scheduler's price of a task without a correct timing (:func:`round_best`), at most what the
    slowest measured task's throughput gives its FLOPs (a disturbed timing is only a bound, and a high one
    drew the budget to its task; the median throughput under-priced a memory-bound layer 63x). Provisional:
    the task's first correct timing replaces it."""
    bound = round_best(tr.history)
    rates = [t.task.flops / t.latency_s for t in info if t.latency_s]
    return bound if bound is None or not rates else min(bound, tr.task.flops / min(rates))


#: under a seconds budget, the trials of the first task's first round, before any time per trial is known
WARMUP_PROBE = 8


def warmup_round(session: TuningSession, info: list[TaskTuning], per_round: int) -> int:
    """The size of a task's first round. Under a trial budget, ``per_round``. Under a seconds budget,
    small enough that every task not yet measured gets its first round within a quarter of the time (as
    ``per_round`` gives the warm-up a quarter of a trial budget): the seconds per trial so far times the
    tasks left, at least one trial each (a task's default schedule), at most ``per_round``; the first
    round of all is :data:`WARMUP_PROBE` trials. Without this a 64-trial first round of a slow task
    could spend the whole time, and the other tasks kept their default schedules unmeasured."""
    if session.seconds is None:
        return per_round
    if session.used == 0:
        return min(per_round, WARMUP_PROBE)
    elapsed = time.perf_counter() - session.start
    left = sum(1 for t in info if t.rounds == 0)
    fits = (session.seconds / 4 - elapsed) / (elapsed / session.used * max(left, 1))
    return int(min(per_round, max(1, fits)))


def scheduled_rounds(session: TuningSession, runs: list[TaskRun], weights: list[int], *, per_round: int,
                     alpha: float = 0.2, beta: float = 2.0, window: int = 3, seed: int = 0,
                     show: Callable[[dict], None] | None = None) -> tuple[list[TaskTuning], list[dict]]:
    """Spend the session's budget over ``runs`` (one per distinct task), one round at a time, the
    task of each round picked by Ansor's gradient task scheduler (:class:`~felixjax.scheduler.TaskScheduler`).

    Resumed records are replayed into the scheduler as rounds of ``per_round``. Returns the per-task
    summaries and one dict per round.
    """
    tasks = [r.task for r in runs]
    sched = TaskScheduler(tasks, weights, alpha=alpha, beta=beta, window=window, seed=seed)
    info = [TaskTuning(r.task, w) for r, w in zip(runs, weights)]
    for i, (tr, tt) in enumerate(zip(runs, info)):  # resume: this run's records as rounds of `per_round`
        tt.trials, start = len(tr.history), 0
        for k in range(len(tr.history)):
            if (k + 1) % per_round == 0 or k == len(tr.history) - 1:  # a round of the trials since the last
                sched.record(i, round_best(tr.history[:k + 1]), k + 1 - start,
                             provisional=not any(r.result.ok for r in tr.history[:k + 1]))
                tt.rounds, start = tt.rounds + 1, k + 1
        if (tr.history and not any(r.result.ok or r.result.status == "noisy" for r in tr.history)
                and len(tr.history) >= sched.min_failed_trials):  # resumed without a kernel: dead, as live rounds
            sched.dead.add(i)  # would have left it, whatever this call's round size (it changes with --trials)
            tt.stop_reason = "no_correct_kernel"
        tt.best = session.db.best(tr.task, session.target_key, run=tr.run)  # this run's, not another's
        if tt.best is not None:
            was = sched.provisional[i]
            sched.best[i] = tt.best.latency_s if was else min(sched.best[i], tt.best.latency_s)
            sched.provisional[i] = False
    for i, (tr, tt) in enumerate(zip(runs, info)):  # a resumed noisy-only task: priced as a live round prices it
        if sched.provisional[i] and tt.best is None and sched.history[i]:
            price = _priced(tr, info)
            if price is not None:
                sched.best[i] = sched.history[i][-1] = price
    rounds: list[dict] = []
    budget = session.trials
    for tr in runs:  # cost-aware min_share counts against a task's even share of the session's budget
        tr.share = budget // len(runs) if budget else None
    while not session.out_of_budget():
        i = sched.next_task()
        if i is None:
            break
        tr, tt = runs[i], info[i]
        tr.done = False  # a task run has no budget of its own here: the session's applies
        new = session.step(tr, warmup_round(session, info, per_round) if tt.rounds == 0 else per_round)
        if not new and tr.waits and not tr.stop_reason:  # another tuner holds its candidates: no round, not exhausted
            continue
        tt.trials, tt.rounds = len(tr.history), tt.rounds + 1
        tt.best = session.db.best(tr.task, session.target_key, run=tr.run)
        sched.record(i, tt.best.latency_s if tt.best is not None else _priced(tr, info), len(new),
                     provisional=tt.best is None)
        if i in sched.dead:  # the scheduler gives this task no more rounds: say why
            tt.stop_reason = (tr.stop_reason or "exhausted") if not new else "no_correct_kernel"
        entry = {"event": "network_round", "round": len(rounds) + 1, "index": i, "task": tr.task, "weight": tt.weight, "new": len(new),
                 "task_trials": tt.trials, "best": tt.best,
                 "noisy_bound_s": None if tt.best else round_best(tr.history), "trials": sum(t.trials for t in info),
                 "budget": (budget or 0) + sum(r.resumed for r in runs),
                 "estimate_s": sum(t.weight * t.latency_s for t in info if t.latency_s is not None),
                 "measured_tasks": sum(t.latency_s is not None for t in info),
                 "elapsed_s": time.perf_counter() - session.start, "tasks": len(info)}
        rounds.append(entry)
        if show:
            show(entry)
    return info, rounds
