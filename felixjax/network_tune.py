"""Tuning a whole model: every distinct task under one trial budget, rounds given out by the
gradient task scheduler (:func:`tune_model`, :class:`NetworkTuneResult`)."""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


from codegen.measure import LocalRunner, TimingProtocol
from codegen.ops import Task
from codegen.space import Config
from codegen.target import Target

from .database import Database, TuningRecord
from .onnx_import import Model
from .network_build import CompiledModel, _as_model, build_model
from .scheduler import TaskScheduler


@dataclass
class TaskTuning:
    """One distinct task of a tuned model: its weight, the trials this run gave it, its best record."""

    task: Task
    weight: int
    trials: int = 0
    rounds: int = 0
    best: TuningRecord | None = None

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
            rows.append((t.task.name, str(t.weight), str(t.trials), f"{t.best.latency_s * 1e3:.4f}",
                         f"{t.best.gflops:.1f}", f"{wl * 1e3:.4f}", f"{100 * wl / total:.1f}%"))
        rows.append(("total (anchors)", str(sum(t.weight for t in self.tasks)), str(self.trials), "", "",
                     f"{self.estimated_latency_s * 1e3:.4f}", ""))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def build(self, **kwargs: Any) -> "CompiledModel":
        """:func:`build_model` with this run's best configs."""
        return build_model(self.model, self.target, configs=self.configs(), **kwargs)

    def __repr__(self) -> str:
        return (f"NetworkTuneResult({self.model.name}, {len(self.tasks)} tasks, {self.trials} trials, "
                f"estimated {self.estimated_latency_s * 1e3:.3f} ms, {self.wall_s:.0f} s)")


def _default_strategy() -> str:
    from .strategies import registered

    return "gradient" if "gradient" in registered() else "random"


def _round_progress(p: dict) -> None:
    best = p["best"]
    b = f"best {best.latency_s * 1e3:.4f} ms ({best.gflops:.1f} GFLOP/s)" if best else "no correct kernel yet"
    print(f"[felixjax] round {p['round']:3d}  task {p['index'] + 1}/{p['tasks']} {p['task'].name} (x{p['weight']}): "
          f"+{p['new']} -> {p['task_trials']} trials, {b} | network est. {p['estimate_s'] * 1e3:.3f} ms | "
          f"{p['trials']}/{p['budget']} trials, {p['elapsed_s']:.0f} s", file=sys.stderr, flush=True)


def tune_model(model: Model | str | os.PathLike | bytes, target: Target | None = None, *, trials: int = 2000,
               db: str | os.PathLike | Database | None = None, strategy: str | Any | None = None, seed: int = 0,
               seconds: float | None = None, progress: bool | Callable[[dict], None] = True,
               trials_per_round: int | None = None, threads: int | None = None, run: str | None = None,
               runner: LocalRunner | None = None, protocol: TimingProtocol | None = None,
               strategy_options: dict | None = None, include_defaults: bool = True, alpha: float = 0.2,
               beta: float = 2.0, window: int = 3) -> NetworkTuneResult:
    """Tune every distinct task of a model under one trial budget (Ansor's gradient task scheduler).

    Args:
        model: a :class:`~felixjax.onnx_import.Model` or anything :func:`~felixjax.load_onnx` reads.
        target: the machine (default ``Target.cpu()``).
        trials: total budget over all tasks (records of this ``run`` already in ``db`` count: a killed
            run resumes where it stopped).
        db: database path or :class:`Database` (``None``: in memory).
        strategy: the search strategy per task (default ``"gradient"`` when registered, else ``"random"``).
        seed: seeds the strategies and the scheduler's tie-breaks.
        seconds: wall-clock budget; no new round starts after it (the round in flight completes).
        progress: print one line per round and the summary table to stderr, or a callable per round.
        trials_per_round: trials of one round (default ``trials // (4 * tasks)``, clamped to 1..64,
            so about a quarter of the budget is the warm-up and the rest is scheduled).
        threads: threads per measured kernel (default: all cores of the target).
        run: the run name in the database (default ``"{strategy}:{seed}"``, shared with ``fj.tune``).
        runner, protocol, strategy_options: passed to :func:`felixjax.tune`.
        include_defaults: measure every sketch's default schedule first (``fj.tune(defaults=True)``), so the
            tuned build never loses to the default build.
        alpha, beta, window: the scheduler's constants (Ansor's defaults).

    Returns:
        A :class:`NetworkTuneResult`; ``.table()`` summarizes it, ``.build()`` compiles the model.

    Example:
        >>> import felixjax as fj
        >>> from felixjax.network import tune_model
        >>> m = fj.load_onnx(fj.zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
        >>> res = tune_model(m, trials=8, strategy="random", progress=False)
        >>> res.trials, len(res.tasks)
        (8, 4)
    """
    from .strategies import get_strategy
    from .tuner import tune

    model = _as_model(model)
    target = target or Target.cpu()
    strategy = strategy if strategy is not None else _default_strategy()
    sname = strategy if isinstance(strategy, str) else getattr(strategy, "name", type(strategy).__name__)
    run = run or f"{sname}:{seed}"
    if trials < 1:
        raise ValueError(f"trials must be >= 1 (got {trials})")
    pairs = model.tasks
    if not pairs:
        return NetworkTuneResult(model, target, run, sname, [], [], 0.0)
    tasks = [t for t, _ in pairs]
    per_round = trials_per_round or min(64, max(1, trials // (4 * len(tasks))))
    if per_round < 1:
        raise ValueError(f"trials_per_round must be >= 1 (got {per_round})")
    own_db = not isinstance(db, Database)
    database = db if isinstance(db, Database) else Database(db if db is not None else ":memory:")
    own_runner = runner is None
    if runner is None:
        runner = LocalRunner(protocol=protocol) if protocol is not None else LocalRunner()
    show = progress if callable(progress) else (_round_progress if progress else None)
    sched = TaskScheduler(tasks, [w for _, w in pairs], alpha=alpha, beta=beta, window=window, seed=seed)
    info = [TaskTuning(t, w) for t, w in pairs]
    start = time.perf_counter()
    rounds: list[dict] = []
    try:
        # resume: replay this run's records as rounds of `per_round`
        for i, tt in enumerate(info):
            recs = database.records(tt.task, target, run=run)
            tt.trials = len(recs)
            best = math.inf
            for k, r in enumerate(recs):
                if r.ok:
                    best = min(best, r.latency_s)
                if (k + 1) % per_round == 0 or k == len(recs) - 1:
                    sched.record(i, best if math.isfinite(best) else None, 1)
                    tt.rounds += 1
            tt.best = database.best(tt.task, target)
            if tt.best is not None:
                sched.best[i] = min(sched.best[i], tt.best.latency_s)
        used = sum(tt.trials for tt in info)
        while used < trials and (seconds is None or time.perf_counter() - start < seconds):
            i = sched.next_task()
            if i is None:
                break
            tt = info[i]
            n = min(per_round, trials - used)
            strat = get_strategy(strategy, **(strategy_options or {})) if isinstance(strategy, str) else strategy
            res = tune(tt.task, target, strat, trials=tt.trials + n, db=database, seed=seed, run=run, runner=runner,
                       threads=threads, protocol=protocol, progress=False, defaults=include_defaults)
            new = len(res.history) - tt.trials
            tt.trials, tt.rounds = len(res.history), tt.rounds + 1
            used += new
            tt.best = database.best(tt.task, target)
            sched.record(i, tt.best.latency_s if tt.best is not None else None, new)
            entry = {"round": len(rounds) + 1, "index": i, "task": tt.task, "weight": tt.weight, "new": new,
                     "task_trials": tt.trials, "best": tt.best, "trials": used, "budget": trials,
                     "estimate_s": sum(t.weight * t.latency_s for t in info if t.latency_s is not None),
                     "elapsed_s": time.perf_counter() - start, "tasks": len(info)}
            rounds.append(entry)
            if show:
                show(entry)
    finally:
        if own_runner:
            runner.close()
        if own_db:
            database.close()
    result = NetworkTuneResult(model, target, run, sname, info, rounds, time.perf_counter() - start)
    if progress is True:
        print(result.table(), file=sys.stderr, flush=True)
    return result
