"""The pipeline of DESIGN.md, one readable function per entry point, each stage one line.

    ONNX model ─① import─▶ op graph ─② fuse + dedupe─▶ Tasks
    Task + Target ─③ sketches─▶ spaces ─④ relax─▶ x ─⑤ features─▶ ─⑥ cost model─▶ score
    ─⑦ descend / evolve─▶ ─⑧ round + rank─▶ candidates ─⑨ codegen─▶ ─⑩ build + measure─▶
    ─⑪ database─▶ ─⑫ retrain─▶ next round (task scheduler picks the task) ─▶ network build

Stages ③–⑫ of a round live in :class:`felixjax.session.TuningSession` (the one tuning loop);
these functions say in which order the stages run for each use.

Example:
    >>> import felixjax as fj
    >>> res = tune_task(fj.ops.matmul(32, 32, 32), strategy="random", trials=4, progress=False)
    >>> len(res.history), res.best.ok
    (4, True)
"""
from __future__ import annotations

from typing import Any, Callable

from codegen.lower import Plan
from codegen.measure import LocalRunner, TimingProtocol
from codegen.ops import Task, parse_spec
from codegen.render_c import render
from codegen.target import Target

from .database import Database
from .results import TuneResult
from .session import TuningSession
from .strategies import Strategy


def _as_task(task: Task | str) -> Task:
    if isinstance(task, str):
        return parse_spec(task)
    if not isinstance(task, Task):
        raise TypeError(f"{task!r} is not a task: pass fj.ops.matmul(...) or a spec such as "
                        f"'matmul:m=64,n=64,k=64'")
    return task


def tune_task(task: Task | str, target: Target | None = None, strategy: str | Strategy = "gradient", *,
              trials: int = 256, seconds: float | None = None, db: str | Database | None = None, seed: int = 0,
              run: str | None = None, runner: LocalRunner | None = None, threads: int | None = None,
              protocol: TimingProtocol | None = None, batch: int | None = None,
              progress: bool | Callable[[dict], None] = True, strategy_options: dict | None = None,
              defaults: bool = True, renderer: Callable[[Plan], str] = render, cost_model: str | None = None,
              retime: int = 3, measurer: Callable[[Task, Target], Any] | None = None) -> TuneResult:
    """Tune one operator: rounds of propose -> build -> measure -> record -> update (``fj.tune``).

    Args:
        task: the operator (``fj.ops.*``) or a CLI spec string (``"matmul:m=64,n=64,k=64"``).
        target: the machine (default ``Target.cpu()``).
        strategy: ``"gradient"``, ``"genetic"``, ``"random"`` or a user strategy object.
        trials: budget in candidates sent to the builder (resumed records of the run count).
        seconds: wall-clock budget (resumed elapsed time counts); whichever ends first.
        db: database path (or a :class:`Database`); ``None`` keeps records in memory.
        seed: seeds the strategy's RNG streams (a fixed seed reproduces the proposals).
        run: name of the run in the database (default ``"{strategy}:{seed}"``).
        runner: a shared :class:`LocalRunner` (default: one is started and stopped here).
        threads: threads per kernel (default: all cores of the target).
        protocol: timing protocol (default: the runner's).
        batch: candidates per round (default: the strategy's ``batch_size``).
        progress: progress lines on stderr (inside rounds too), or a callable receiving progress dicts.
        strategy_options: keyword arguments for a strategy given by name.
        defaults: measure every sketch's hand-written default schedule in the first round, before
            the strategy's proposals (see :func:`~felixjax.strategies.base.opening_defaults`).
        renderer: plan -> source (a testing hook: tests plant crashing kernels through it).
        cost_model: a pretrained cost-model checkpoint (``felixjax pretrain``) to start from.
        retime: re-time this many of the best configs at the end, interleaved (``res.best`` is the
            re-timed figure; 0: no re-timing).
        measurer: ``(task, target) -> measurer`` instead of building and timing here (a replay).

    Returns:
        A :class:`TuneResult` with ``.best``, ``.history``, ``.source`` and ``.kernel()``.

    Example:
        >>> import felixjax as fj
        >>> fj.tune(fj.ops.dense(1, 64, 32), strategy="random", trials=3, progress=False).best.ok
        True
    """
    task = _as_task(task)                                                      # the operator, as a Task
    with TuningSession(target, db=db, runner=runner, measurer=measurer, threads=threads, protocol=protocol,
                       renderer=renderer, cost_model=cost_model, seed=seed, progress=progress,
                       defaults=defaults) as session:                          # ⑥ model, ⑩ measurer, ⑪ database
        tr = session.add(task, strategy, seed=seed, trials=trials, seconds=seconds, run=run,
                         strategy_options=strategy_options)                    # ③ sketches -> spaces (+ resume)
        while not tr.done:
            session.step(tr, batch)                                            # ④–⑫ one round
        retimed = session.retime([tr], top=retime).get(tr.run, []) if retime else []  # the best, timed again
        stats = dict(tr.stats, resumed=tr.resumed, wall_s=tr.clock)
    return TuneResult(task, session.target, tr.run, tr.history, stats, retimed, tr.stop_reason)
