"""The tuning loop for one task: propose -> build -> measure -> record -> learn, until the budget ends.

Budgets are in trials and/or seconds, whichever ends first; a trial is a candidate sent to the
builder (failures count). Every result is committed to the database as it arrives, so a killed run
resumes where it stopped: records of the same ``run`` are reloaded, counted against the budget,
shown to the strategy, and never measured again.

Example:
    >>> import felixjax as fj
    >>> res = fj.tune(fj.ops.matmul(32, 32, 32), strategy="random", trials=4, progress=False)
    >>> len(res.history), res.best.ok
    (4, True)
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from codegen.build import build_many
from codegen.lower import Plan, lower
from codegen.measure import LocalRunner, MeasureResult, RunRequest, TimingProtocol
from codegen.ops import Task
from codegen.render_c import render
from codegen.runtime import Kernel
from codegen.space import Config, Space, sketches_for
from codegen.target import Target

from .database import Database, TuningRecord
from .strategies import SearchContext, Strategy, get_strategy
from .strategies.base import opening_defaults


class Measurer:
    """Builds and measures configs of one task: build phase (parallel gcc), then measure phase (one
    kernel at a time in the runner's process), so compiles never share the cores being timed."""

    def __init__(self, task: Task, target: Target, runner: LocalRunner, *, threads: int | None = None,
                 protocol: TimingProtocol | None = None, build_workers: int = 2, input_seed: int = 0,
                 renderer: Callable[[Plan], str] = render):
        self.task, self.target, self.runner = task, target, runner
        self.renderer = renderer
        self.threads = int(threads or target.cores)
        self.protocol = protocol
        self.build_workers = build_workers
        self.spaces = {sk.name: Space(task, sk, target) for sk in sketches_for(task)}
        self.arrays = task.random_inputs(seed=input_seed)
        self.expected = task.reference(*self.arrays)
        self._packed: dict[tuple, np.ndarray] = {}

    def plan(self, cfg: Config) -> Plan:
        return lower(self.spaces[cfg.sketch], cfg)

    def _inputs(self, plan: Plan) -> list[np.ndarray]:
        wl = plan.buffers["weight"].layout
        if wl not in self._packed:
            if len(self._packed) > 8:
                self._packed.clear()
            self._packed[wl] = plan.pack_weight(self.arrays[1])
        ins = [np.ascontiguousarray(self.arrays[0]), self._packed[wl]]
        return ins + list(self.arrays[2:])

    def measure(self, configs: list[Config], on_result: Callable[[Config, MeasureResult], bool]) -> None:
        """Build all, then measure one by one; ``on_result`` returns False to stop early."""
        plans, sources = [], []
        for cfg in configs:
            plans.append(self.plan(cfg))
            sources.append(self.renderer(plans[-1]))
        builds = build_many(sources, workers=self.build_workers)
        for cfg, plan, b in zip(configs, plans, builds):
            req = RunRequest(None, self._inputs(plan), self.task.output_shape, plan.workspace, self.expected,
                             reduction_size=plan.con.reduction_size, threads=self.threads, protocol=self.protocol)
            if not on_result(cfg, self.runner.run(req, build=b)):
                return


@dataclass
class TuneResult:
    """Outcome of :func:`tune`: every record of the run, the best one, its source and a callable."""

    task: Task
    target: Target
    run: str
    history: list[TuningRecord]
    stats: dict = field(default_factory=dict)

    @property
    def best(self) -> TuningRecord | None:
        ok = [r for r in self.history if r.ok]
        return min(ok, key=lambda r: r.latency_s) if ok else None

    def _best_plan(self) -> Plan:
        if self.best is None:
            raise RuntimeError(f"{self.task.name}: no correct kernel was measured in run {self.run!r} "
                               f"(statuses: {self.status_counts()})")
        return lower(Space(self.task, self.best.config.sketch, self.target), self.best.config)

    @property
    def source(self) -> str:
        """C source of the best kernel."""
        return render(self._best_plan())

    def kernel(self, *, threads: int | None = None) -> Kernel:
        """The best kernel as a callable ``kernel(*arrays) -> ndarray`` (API layouts)."""
        from codegen.build import build

        plan = self._best_plan()
        b = build(render(plan))
        if b.status != "ok":
            raise RuntimeError(f"rebuilding the best kernel failed: {b.error}")
        return Kernel(plan, b.lib_path, threads=threads or self.target.cores)

    def status_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.history:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(trial index, best latency so far) of this run."""
        best, ys = math.inf, []
        for r in self.history:
            best = min(best, r.latency_s)
            ys.append(best)
        return np.arange(1, len(ys) + 1), np.array(ys)

    def __repr__(self) -> str:
        b = self.best
        s = f"{b.gflops:.1f} GFLOP/s, {b.latency_s * 1e3:.4f} ms" if b else "no correct kernel"
        return f"TuneResult({self.task.name}, run={self.run!r}, {len(self.history)} trials, best {s})"


def _progress_printer(task: Task, run: str, trials: int) -> Callable[[dict], None]:
    def show(p: dict) -> None:
        best = p["best"]
        b = f"best {best.gflops:7.1f} GFLOP/s ({best.latency_s * 1e3:.4f} ms)" if best else "best  -"
        print(f"[felixjax] {task.name} {run}: round {p['round']:3d}  {p['trials']:4d}/{trials} trials  {b}  "
              f"{p['rate']:.1f} meas/s  failures {p['failures']}", file=sys.stderr, flush=True)
    return show


def tune(task: Task, target: Target | None = None, strategy: str | Strategy = "gradient", *, trials: int = 256,
         seconds: float | None = None, db: str | Database | None = None, seed: int = 0, run: str | None = None,
         runner: LocalRunner | None = None, threads: int | None = None, protocol: TimingProtocol | None = None,
         batch: int | None = None, progress: bool | Callable[[dict], None] = True,
         strategy_options: dict | None = None, defaults: bool = True,
         renderer: Callable[[Plan], str] = render) -> TuneResult:
    """Tune one operator: rounds of propose -> build -> measure -> record -> update.

    Args:
        task: the operator (``fj.ops.*``).
        target: the machine (default ``Target.cpu()``).
        strategy: ``"gradient"``, ``"genetic"``, ``"random"`` or a user strategy object.
        trials: budget in candidates sent to the builder (resumed records of the run count).
        seconds: wall-clock budget (resumed elapsed time counts); whichever ends first.
        db: database path (or a :class:`Database`); ``None`` keeps records in memory.
        seed: seeds the strategy's RNG (a fixed seed reproduces the proposals).
        run: name of the run in the database (default ``"{strategy}:{seed}"``).
        runner: a shared :class:`LocalRunner` (default: one is started and stopped here).
        threads: threads per kernel (default: all cores of the target).
        protocol: timing protocol (default: the runner's).
        batch: candidates per round (default: the strategy's ``batch_size``).
        progress: print a line per round to stderr, or a callable receiving a progress dict.
        strategy_options: keyword arguments for a strategy given by name.
        defaults: measure every sketch's hand-written default schedule in the first round, before
            the strategy's proposals (see :func:`~felixjax.strategies.base.opening_defaults`).
        renderer: plan -> source (a testing hook: tests plant crashing kernels through it).

    Returns:
        A :class:`TuneResult` with ``.best``, ``.history``, ``.source`` and ``.kernel()``.

    Example:
        >>> import felixjax as fj
        >>> fj.tune(fj.ops.dense(1, 64, 32), strategy="random", trials=3, progress=False).best.ok
        True
    """
    target = target or Target.cpu()
    strat = get_strategy(strategy, **(strategy_options or {}))
    run = run or f"{strat.name}:{seed}"
    if trials < 1 and seconds is None:
        raise ValueError(f"trials must be >= 1 (got {trials})")
    own_db = not isinstance(db, Database)
    database = db if isinstance(db, Database) else Database(db if db is not None else ":memory:")
    own_runner = runner is None
    runner = runner or LocalRunner()
    show = progress if callable(progress) else (_progress_printer(task, run, trials) if progress else None)

    history = database.records(task, target, run=run)
    ctx = SearchContext(task, target, {sk.name: Space(task, sk, target) for sk in sketches_for(task)},
                        np.random.default_rng(seed), {r.config for r in history}, list(history))
    stats = {"propose_s": 0.0, "update_s": 0.0, "build_measure_s": 0.0, "rounds": 0, "resumed": len(history)}
    try:
        measurer = Measurer(task, target, runner, threads=threads, protocol=protocol, renderer=renderer)
        if history:
            t = time.perf_counter()
            strat.update(ctx, list(history))
            stats["update_s"] += time.perf_counter() - t
        start = time.perf_counter() - (history[-1].elapsed_s if history else 0.0)

        def out_of_budget() -> bool:
            return len(ctx.history) >= trials or (seconds is not None and time.perf_counter() - start >= seconds)

        while not out_of_budget():
            n = min(batch or getattr(strat, "batch_size", 16), trials - len(ctx.history))
            t = time.perf_counter()
            head = opening_defaults(ctx, n) if defaults else []
            cands = head + [c for c in strat.propose(ctx, n - len(head)) if c not in ctx.measured and c not in head]
            cands = cands[:n]
            stats["propose_s"] += time.perf_counter() - t
            if not cands:
                break  # the space is exhausted
            for c in cands:
                ctx.spaces[c.sketch].validate(c)
            new: list[TuningRecord] = []

            def record(cfg: Config, res: MeasureResult) -> bool:
                rec = database.add(TuningRecord(task, target.key, run, len(ctx.history), cfg, res,
                                                time.perf_counter() - start, target.to_json()))
                ctx.history.append(rec)
                ctx.measured.add(cfg)
                new.append(rec)
                return not out_of_budget()

            t = time.perf_counter()
            measurer.measure(cands, record)
            stats["build_measure_s"] += time.perf_counter() - t
            t = time.perf_counter()
            strat.update(ctx, new)
            stats["update_s"] += time.perf_counter() - t
            stats["rounds"] += 1
            if show:
                ok = [r for r in ctx.history if r.ok]
                el = max(time.perf_counter() - start, 1e-9)
                show({"task": task, "run": run, "round": stats["rounds"], "trials": len(ctx.history),
                      "best": min(ok, key=lambda r: r.latency_s) if ok else None,
                      "rate": len(ctx.history) / el, "failures": sum(1 for r in ctx.history if not r.ok),
                      "elapsed_s": el})
        stats["wall_s"] = time.perf_counter() - start
    finally:
        if own_runner:
            runner.close()
        if own_db and db is not None:
            database.close()
    return TuneResult(task, target, run, ctx.history, stats)
