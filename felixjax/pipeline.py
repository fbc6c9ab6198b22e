"""The pipeline of DESIGN.md, one readable function per entry point, each stage one line.

    ONNX model ─① import─▶ op graph ─② fuse + dedupe─▶ Tasks
    Task + Target ─③ sketches─▶ spaces ─④ relax─▶ x ─⑤ features─▶ ─⑥ cost model─▶ score
    ─⑦ descend / evolve─▶ ─⑧ round + rank─▶ candidates ─⑨ codegen─▶ ─⑩ build + measure─▶
    ─⑪ database─▶ ─⑫ retrain─▶ next round (task scheduler picks the task) ─▶ ⑬ in-network choice ─▶ network build

Stages ③–⑫ of a round live in :class:`felixjax.session.TuningSession` (the one tuning loop);
these functions say in which order the stages run for each use.

Example:
    >>> import felixjax as fj
    >>> res = tune_task(fj.ops.matmul(32, 32, 32), strategy="random", trials=4, progress=False)
    >>> len(res.history), res.best.ok
    (4, True)
"""
from __future__ import annotations

import functools
import json
import math
import numbers
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from codegen import netbuild
from codegen.build import DEFAULT_FLAGS
from codegen.lower import Plan, lower
from codegen.measure import LocalRunner, TimingProtocol
from codegen.ops import Task, parse_spec
from codegen.render_c import render
from codegen.space import Config, Space
from codegen.target import Target
from codegen.winograd import VARIANTS as WINOGRAD_SKETCHES

from . import jaxcache
from .cost_aware import CostAware
from .database import Database, settings_key
from .errors import UnsupportedModelError
from .network_build import CompiledModel, _as_model, choose_schedules, default_config_for, graph_to_spec
from .network_select import select_in_network
from .network_tune import InRoundProgress, NetworkTuneResult, _default_strategy, _round_progress, scheduled_rounds
from .onnx_import import Model
from .results import TuneResult
from .session import TuningSession, whole_number
from .strategies import Strategy
from .strategies.base import COST_MODEL_STRATEGIES, get_strategy


def _as_task(task: Task | str) -> Task:
    if isinstance(task, str):
        return parse_spec(task)
    if not isinstance(task, Task):
        raise TypeError(f"{task!r} is not a task: pass fj.ops.matmul(...) or a spec such as "
                        f"'matmul:m=64,n=64,k=64'")
    return task


def _check_retime(retime: Any) -> None:
    if not whole_number(retime) or retime < 0:
        raise ValueError(f"retime must be a whole number >= 0 of configs to time again (got {retime!r})")


def _check_cost_model(strategy: str | Strategy, options: dict | None, cost_model: str | None) -> None:
    """A ValueError when a pretrained ``cost_model`` is given to a strategy that has no cost model (it
    would be ignored, as the command line refuses it)."""
    if cost_model is None:
        return
    strat = get_strategy(strategy, **(options or {})) if isinstance(strategy, str) else strategy
    if not hasattr(strat, "cost_model"):
        raise ValueError(f"cost_model={cost_model!r} needs a strategy with a cost model "
                         f"({', '.join(COST_MODEL_STRATEGIES)}), not {getattr(strat, 'name', strategy)!r}")


def tune_task(task: Task | str, target: Target | None = None, strategy: str | Strategy = "gradient", *,
              trials: int = 256, seconds: float | None = None, db: str | Database | None = None, seed: int = 0,
              run: str | None = None, runner: LocalRunner | None = None, threads: int | None = None,
              protocol: TimingProtocol | None = None, batch: int | None = None,
              progress: bool | Callable[[dict], None] = True, strategy_options: dict | None = None,
              defaults: bool = True, renderer: Callable[[Plan], str] = render, cost_model: str | None = None,
              retime: int = 3, measurer: Callable[[Task, Target], Any] | None = None,
              filter_p: float | None = None, early_stop: float | str | None = None,
              cost_aware: CostAware | None = None) -> TuneResult:
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
        cost_model: a pretrained cost-model checkpoint (``felixjax pretrain``) to start from (``None``:
            the strategy's own option, by default ``"auto"``: the model shipped with felixjax on CPUs).
        retime: re-time this many of the best configs at the end, interleaved (``res.best`` is the
            re-timed figure; 0: no re-timing).
        measurer: ``(task, target) -> measurer`` instead of building and timing here (a replay).
        filter_p, early_stop: cost-aware tuning, off by default (:mod:`felixjax.cost_aware`): skip
            candidates less likely than ``filter_p`` to beat the best; end the run (``stop_reason``
            ``"early_stop"``) when the expected gain per trial is below ``early_stop`` (``"calibrated"``:
            :meth:`CostAware.calibrated <felixjax.cost_aware.CostAware.calibrated>`, as ``--early-stop calibrated``).
        cost_aware: all the cost-aware options instead (say ``CostAware.calibrated()``; not with the two above).

    Returns:
        A :class:`TuneResult` with ``.best``, ``.history``, ``.source`` and ``.kernel()``.

    Example:
        >>> import felixjax as fj
        >>> fj.tune(fj.ops.dense(1, 64, 32), strategy="random", trials=3, progress=False).best.ok
        True
    """
    t_call = time.perf_counter()
    compiled = jaxcache.compile_seconds()  # counted once a cost model turned JAX on (jaxcache.enable)
    task = _as_task(task)                                                      # the operator, as a Task
    if batch is not None and not batch >= 1:
        raise ValueError(f"batch must be >= 1 candidates per round (got {batch})")
    _check_retime(retime)
    if trials is None and seconds is None:
        raise ValueError("trials=None needs a seconds= budget (without either the run would never end)")
    _check_cost_model(strategy, strategy_options, cost_model)
    with TuningSession(target, db=db, runner=runner, measurer=measurer, threads=threads, protocol=protocol,
                       renderer=renderer, cost_model=cost_model, seed=seed, progress=progress,
                       defaults=defaults,
                       cost_aware=CostAware.of(filter_p, early_stop, cost_aware)) as session:  # ⑥ model, ⑩ measurer, ⑪ database
        tr = session.add(task, strategy, seed=seed, trials=trials, seconds=seconds, run=run,
                         strategy_options=strategy_options, batch=batch)       # ③ sketches -> spaces (+ resume)
        while not tr.done:
            session.step(tr, batch)                                            # ④–⑫ one round
        t = time.perf_counter()
        retimed = (session.kept_retime(tr) or session.retime([tr], top=retime).get(tr.run, [])) if retime else []
        stats = dict(tr.stats, resumed=tr.resumed, wall_s=tr.clock, retime_s=(time.perf_counter() - t) if retime else 0.0)
    stats.update(call_s=time.perf_counter() - t_call, jax_compile_s=jaxcache.compile_seconds() - compiled)
    # the machine as its kernels were timed (threads=1: one core): res.kernel() runs so, res.target keys the records
    res = TuneResult(task, session.target.at_threads(threads), tr.run, tr.history, stats, retimed, tr.stop_reason)
    if res.best is None and res.history:  # res.best is None: say why rather than leave a None to trip on
        counts = res.status_counts()
        why = (f"; {counts['noisy']} noisy: another process used the CPU while they were timed (their figures are "
               f"upper bounds, never a result): tune on a quieter machine or give more trials"
               if counts.get("noisy") else "")
        warnings.warn(f"{task.name}: no correct kernel timed cleanly among {len(res.history)} trials of run "
                      f"{tr.run!r} ({counts}){why}; res.best is None", RuntimeWarning, stacklevel=2)
    return res


def tune_model(model: Model | str | os.PathLike | bytes, target: Target | None = None, *, trials: int = 2000,
               db: str | os.PathLike | Database | None = None, strategy: str | Any | None = None, seed: int = 0,
               seconds: float | None = None, progress: bool | Callable[[dict], None] = True,
               trials_per_round: int | None = None, threads: int | None = None, run: str | None = None,
               runner: LocalRunner | None = None, protocol: TimingProtocol | None = None,
               strategy_options: dict | None = None, include_defaults: bool = True, alpha: float = 0.2,
               beta: float = 2.0, window: int = 3, cost_model: str | None = None,
               measurer: Callable[[Task, Target], Any] | None = None, filter_p: float | None = None,
               early_stop: float | str | None = None, cost_aware: CostAware | None = None,
               retime: int = 3, in_network: int = 3, winograd: bool = True) -> NetworkTuneResult:
    """Tune every distinct task of a model under one trial budget (``fj.tune_model``).

    One tuning session serves every task: one strategy instance and context per task for the whole
    run, and **one cost model shared by all tasks**, fine-tuned online after every round (task ids as
    groups). Rounds go to the task whose next round is expected to cut the end-to-end latency the
    most (Ansor's gradient task scheduler, :mod:`felixjax.scheduler`; its warm-up, one round per task,
    goes largest weight x FLOPs first, and a trial budget short of the tasks' first rounds warns that the
    smallest keep their default schedules).

    Args:
        model: a :class:`~felixjax.onnx_import.Model` or anything :func:`~felixjax.load_onnx` reads.
        target: the machine (default ``Target.cpu()``).
        trials: total budget over all tasks (records of this ``run`` already in ``db`` count: a killed
            run resumes where it stopped). 0: no search, only the end-of-run re-timing (``retime``) of
            the database's best configs beside this version's default schedules (after an upgrade
            changed defaults: ``build_model`` warns of such ``stale`` tasks).
        db: database path or :class:`Database` (``None``: in memory).
        strategy: the search strategy per task (default ``"gradient"`` when registered, else ``"random"``).
        seed: seeds the strategies' RNG streams, the cost model and the scheduler's tie-breaks.
        seconds: wall-clock budget; measuring stops when it is spent. Each task's first round is then
            sized so that every task is measured within about a quarter of it
            (:func:`~felixjax.network_tune.warmup_round`).
        progress: print one line per round and the summary table to stderr, or a callable per round (a dict,
            ``"event": "network_round"``).
        trials_per_round: trials of one round (default ``trials // (4 * tasks)``, clamped to 1..64,
            so about a quarter of the budget is the warm-up and the rest is scheduled).
        threads: threads per measured kernel (default: all cores of the target).
        run: the run name in the database (default ``"{strategy}:{seed}"``, shared with ``fj.tune``).
        runner, protocol, strategy_options: as for :func:`tune_task`.
        include_defaults: measure every sketch's default schedule first, so the tuned build never
            loses to the default build.
        alpha, beta, window: the scheduler's constants (Ansor's defaults).
        cost_model: a pretrained cost-model checkpoint to start the shared model from (``None``: the
            strategy's own option, by default the model shipped with felixjax on CPUs).
        measurer: ``(task, target) -> measurer`` instead of building and timing here (a replay).
        filter_p, early_stop: cost-aware tuning as for :func:`tune_task`; a task stopped early
            gives its share of the budget to the other tasks (``res.tasks[i].stop_reason`` says so).
        cost_aware: all the cost-aware options (:class:`~felixjax.cost_aware.CostAware`) instead of
            ``filter_p``/``early_stop``.
        retime: at the end, time each task's ``retime`` best configs and its default schedule again,
            interleaved (twice each, outside the budget); the fastest re-timing in the database (this
            run's or an earlier one's) is the task's best (``res.tasks[i].best``, a ``retime:<run>``
            record) and what ``build_model`` then picks.
            0: no re-timing (each task's best is its fastest measurement while tuning).
        in_network: at the very end, build the network with each task's best config of its first
            ``in_network`` sketch families, profile the builds layer by layer and give each task the
            schedule its layers ran fastest with *inside the network*, where the kernels' caches are cold
            (:func:`~felixjax.network_select.select_in_network`; ``res.selection`` holds what it
            measured; kept only where the whole build gets faster, and then what ``build_model`` picks).
            0 or 1: off; also off with a ``measurer`` (a replay has no network to time), with a runner
            that measures elsewhere (a Dask cluster's devices: the network would be timed on this machine
            instead) and on GPU targets.
        winograd: ``False`` tunes no Winograd convolution (its sketches are left out of every task's search, the
            opening measures the direct default instead) and ``res.build()`` builds none, as
            ``build_model(winograd=False)``.

    Returns:
        A :class:`~felixjax.network_tune.NetworkTuneResult`; ``.table()`` summarizes it, ``.build()``
        compiles the model.

    Example:
        >>> import felixjax as fj
        >>> m = fj.load_onnx(fj.zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
        >>> res = fj.tune_model(m, trials=8, strategy="random", progress=False)
        >>> res.trials, len(res.tasks)
        (8, 4)
    """
    _check_retime(retime)
    if trials < 0 or (trials == 0 and retime < 1):
        raise ValueError(f"trials must be >= 1, or 0 with retime >= 1 to re-time only (got {trials}, retime {retime})")
    _check_network_args(in_network, seconds, trials_per_round)
    strategy = strategy if strategy is not None else _default_strategy()
    _check_cost_model(strategy, strategy_options, cost_model)
    model = _as_model(model)                                                  # ① import, ② fuse + dedupe
    if not model.tasks:
        raise ValueError(f"{model.name}: no op maps to a tunable task (Conv, and Gemm / MatMul with constant weights "
                         f"in the forms the importer fuses): nothing to tune; build_model builds it as it is")
    sname = strategy if isinstance(strategy, str) else getattr(strategy, "name", type(strategy).__name__)
    run = run or f"{sname}:{seed}"
    pairs = model.tasks
    per_round = trials_per_round or min(64, max(1, trials // (4 * max(1, len(pairs)))))
    if per_round < 1:
        raise ValueError(f"trials_per_round must be >= 1 (got {per_round})")
    show = progress if callable(progress) else (_round_progress if progress else None)
    start = time.perf_counter()
    with TuningSession(target, db=db, runner=runner, measurer=measurer, threads=threads, protocol=protocol,
                       cost_model=cost_model, seed=seed, seconds=seconds,
                       progress=InRoundProgress() if show is _round_progress else False, defaults=include_defaults,
                       cost_aware=CostAware.of(filter_p, early_stop, cost_aware)) as session:  # ⑥ one model
        if trials_per_round is None:  # a resumed run keeps the round size its first call derived from its trials
            per_round = _stored_round(session, [t for t, _ in pairs], run) or per_round
        skip = () if winograd else tuple(WINOGRAD_SKETCHES)
        builder = build_model if winograd else functools.partial(build_model, winograd=False)
        runs = [session.add(t, strategy, seed=seed, run=run, strategy_options=strategy_options, exclude_sketches=skip,
                            batch=per_round) for t, _ in pairs]                 # ③ spaces per task (+ resume)
        session.trials = max(0, trials - sum(r.resumed for r in runs))      # resumed records count
        new_tasks = sum(1 for r in runs if not r.history)
        covered = -(-session.trials // per_round)  # first rounds of per_round trials the budget pays for
        if 0 < session.trials and covered < new_tasks:  # Ansor refuses such a budget; here the cheapest go without
            warnings.warn(f"{session.trials} trials for {new_tasks} tasks not measured yet at {per_round} a first "
                          f"round: {new_tasks - covered} of them (the smallest weight x FLOPs) keep their default "
                          "schedules unmeasured", stacklevel=2)
        elif new_tasks and not session.trials:  # a session-81 review: another model's shared layers spent it
            warnings.warn(f"the budget of {trials} trials is spent by the {sum(r.resumed for r in runs)} records "
                          f"run {run!r} holds (another model's records of a shared layer count too), so {new_tasks} "
                          f"of this model's tasks, never measured, keep their default schedules: give a larger "
                          f"budget, or run=... to tune this model in a run of its own", stacklevel=2)
        if show is _round_progress and any(r.resumed for r in runs):  # say so: only the trial counter showed it
            held = sum(r.resumed for r in runs)
            print(f"[felixjax] resuming run {runs[0].run}: {held} records of {len(runs)} tasks in the database; "
                  + (f"{session.trials} of the {trials} trials left" if session.trials else
                     f"the budget of {trials} trials is spent (nothing to measure; a larger --trials goes on)"),
                  file=sys.stderr, flush=True)
        info, rounds = scheduled_rounds(session, runs, [w for _, w in pairs], per_round=per_round, alpha=alpha,
                                        beta=beta, window=window, seed=seed, show=show)  # ④–⑫ scheduled rounds
        if retime > 0:                                                        # the bests and defaults, again
            for tr, tt in zip(runs, info):
                default = default_config_for(tr.task, session.target, winograd=winograd)
                if not session.kept_retime(tr):  # nothing new measured since the last: keep that one
                    session.retime([tr], top=retime, extra=[default])
                # what build_model picks: the fastest re-timing of the task, this one's or an earlier run's
                tt.best = session.db.best(tr.task, session.target_key, retimed=True, exclude_sketches=skip) or tt.best
        selection = None
        here = runner is None or isinstance(runner, LocalRunner)  # kernels were timed on this machine
        if in_network > 1 and measurer is None and here and not session.target.is_gpu:  # ⑬ chosen in-network
            try:
                selection = select_in_network(model, session.target, session.db, builder, run=run,
                                              key=session.target_key, threads=threads, families=in_network,
                                              exclude_sketches=skip,
                                              log=(lambda s: print(s, file=sys.stderr, flush=True))
                                              if progress is True else None)
            except (RuntimeError, UnsupportedModelError) as e:  # a variant that does not build or agree
                warnings.warn(f"in-network choice skipped, each task keeps its fastest kernel: {e}", stacklevel=2)
            picks = {c.task: c.pick.record for c in selection.changed} if selection and selection.kept else {}
            for tt in info:
                tt.best = picks.get(tt.task, tt.best)
        target = session.target
    result = NetworkTuneResult(model, target, run, sname, info, rounds, time.perf_counter() - start,
                               builder=builder, selection=selection)
    if progress is True:
        print(result.table(), file=sys.stderr, flush=True)
    return result


def _check_network_args(in_network: Any, seconds: Any, trials_per_round: Any) -> None:
    """What ``felixjax tune model.onnx`` refuses, refused alike (a session-81 review: -1 or 1.5 turned the
    in-network choice off, ``seconds=0`` ran nothing, ``trials_per_round=0`` became the default, silently)."""
    if not whole_number(in_network) or in_network < 0:
        raise ValueError(f"in_network must be a whole number >= 0 (got {in_network!r}; 0 or 1: off)")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
                                or not (seconds > 0 and math.isfinite(seconds))):
        raise ValueError(f"seconds must be a positive number of seconds (got {seconds!r})")
    if trials_per_round is not None and (not whole_number(trials_per_round) or trials_per_round < 1):
        raise ValueError(f"trials_per_round must be a whole number >= 1 (got {trials_per_round!r})")


def _stored_round(session: TuningSession, tasks: Sequence[Task], run: str) -> int | None:
    """The round size (``batch``) the run's settings hold for the first of ``tasks`` it measured, if any. The run
    resumed for every task only if all of them have records (another model's run of a shared layer, or a call
    that measured nothing, sets no round size here)."""
    if not tasks or not all(session.db.count(t, session.target_key, run=run) for t in tasks):
        return None
    for task in tasks:
        raw = session.db.get_meta(settings_key(session.target_key, task.key, run))
        try:
            batch = json.loads(raw).get("batch") if raw else None
        except (ValueError, AttributeError):
            continue
        if whole_number(batch) and batch >= 1:
            return int(batch)
    return None


def build_model(model: Model | str | os.PathLike | bytes, target: Target | None = None, *,
                db: str | os.PathLike | Database | None = None, configs: Mapping[Task, Config] | None = None,
                threads: int | None = None, flags: Sequence[str] = DEFAULT_FLAGS, winograd: bool = True) -> CompiledModel:
    """Compile a whole model into one C library from the best schedule of each task.

    Args:
        model: a :class:`~felixjax.onnx_import.Model` or anything :func:`~felixjax.load_onnx` reads.
        target: the machine the schedules are for (default ``Target.cpu()``).
        db: a tuning database (path or :class:`Database`): each task's best record on ``target``.
        configs: explicit configs per task (override the database).
        threads: OpenMP threads of the compiled model (default: the target's cores).
        flags: compiler flags (a shared library).
        winograd: ``False`` builds no convolution with a Winograd algorithm (each such task takes its best
            record of another sketch, else the direct default): Winograd's error follows the largest input
            of its tile, so inputs with outliers far above the rest lose accuracy (README, "The schedule
            space"); ``configs`` are taken as given.

    Raises:
        ValueError: ``target`` is a GPU (``cuda-sim``/``cuda``): there is no GPU network build.
        UnsupportedModelError: a node the C build cannot run.
        FileNotFoundError: ``db`` names a file that does not exist.
        RuntimeError: the compiler failed.

    Example:
        >>> import numpy as np, felixjax as fj
        >>> from felixjax.network import build_model
        >>> exe = build_model(fj.zoo.make_model("resnet18", dataset="cifar10"))
        >>> exe(np.zeros((1, 3, 32, 32), np.float32)).shape
        (1, 10)
    """
    if target is not None and target.is_gpu:
        raise ValueError(f"build_model builds a C library for this CPU; {target.kind}:{target.name} is a GPU target "
                         "(a simulated GPU has nothing to run the network on): tune on it, build with Target.cpu()")
    model = _as_model(model)                                                  # ① import, ② fuse + dedupe
    target = Target.parse(target)
    schedules = choose_schedules(model, target, db=db, configs=configs, threads=threads,  # best record (or default)
                                 winograd=winograd)
    if stale := [s.task.name for s in schedules if s.stale]:
        warnings.warn(f"{len(stale)} of {len(schedules)} tasks are built from tuned records that were never "
                      f"measured against this version's default schedule (e.g. {stale[0]}); the default may be "
                      "faster: fj.tune_model(model, db=..., trials=0) (`felixjax tune --trials 0`) re-times both",
                      stacklevel=2)
    plans = {s.task: lower(Space(s.task, s.config.sketch, target), s.config) for s in schedules}  # ⑨ lower
    spec = graph_to_spec(model.graph, plans)                                  # the network as kernels + buffers
    try:
        net = netbuild.emit(spec)                                             # memory plan + C emission
    except netbuild.NetBuildError as e:
        raise UnsupportedModelError(str(e)) from None
    library = netbuild.load(net, flags=flags, threads=threads or target.cores)  # ⑩ compile + load
    return CompiledModel(model, target, schedules, net, library)


def choose_layout(model: str | os.PathLike | bytes | Any, target: Target | None = None, *, threads: int | None = None,
                  rounds: int = 5, number: int = 5, db: str | os.PathLike | Database | None = None,
                  mixed: bool = True, winograd: bool = True,
                  **load_options: Any) -> tuple[str | dict[str, str], dict[str, float]]:
    """The convolution layout to tune and build ``model`` in, chosen by measuring it: the model is
    imported in each layout of :data:`felixjax.layout.LAYOUTS` (``nchw``; ``nchwc``, whose convolutions
    run channel-blocked), each built with its tasks' default schedules (or ``db``'s best records); with
    ``mixed``, also in two per-conv layouts from both builds' per-layer profiles, where they differ from
    both and from each other: ``mixed`` (:func:`mixed_layout`: a conv goes NCHW where that pays for a
    conversion on each side) and ``mixed-fastest`` (:func:`fastest_plan`: each conv in the layout it ran
    faster in; the first plan over-charges runs of NCHW convs, which convert only at their ends). The
    builds are checked against the model's numpy reference (:meth:`CompiledModel.check`; a wrong one is left
    out with a ``RuntimeWarning``, none left is a ``RuntimeError``), timed in C, interleaved over ``rounds``
    rounds of ``number`` runs; the smallest median wins and is checked again. ``winograd=False`` builds every
    contender as :func:`build_model` does with it (no Winograd convolution). Returns ``(layout, {"nchw" | "nchwc" | "mixed" | "mixed-fastest": median seconds per run})``,
    ``layout`` a name or, where a mixed build won, its ``{conv node name: layout}`` mapping
    (:func:`~felixjax.load_onnx` takes either); a model with no convolution that can be blocked returns
    ``("nchw", {})`` without building anything.

    ``model`` is anything :func:`~felixjax.load_onnx` reads (not an imported :class:`Model`: the layout is
    chosen at import); ``load_options`` go to it (``input_shapes=``, ``input_values=``).

    Example:
        >>> from felixjax import zoo
        >>> layout, times = choose_layout(zoo.make_model("mobilenet_v2", dataset="cifar10"), rounds=1, number=1)
        >>> (layout in ("nchw", "nchwc") or isinstance(layout, dict)) and {"nchw", "nchwc"} <= set(times)
        True
    """
    import statistics

    from .layout import LAYOUTS
    from .onnx_import import load_onnx

    target = Target.parse(target)
    models = {lay: load_onnx(model, layout=lay, **load_options) for lay in LAYOUTS}
    if not any(n.is_anchor and n.task.op == "conv2d_nchwc" for n in models["nchwc"].graph.nodes):
        return "nchw", {}
    builds = {lay: build_model(m, target, db=db, threads=threads, winograd=winograd) for lay, m in models.items()}
    plans: dict[str, dict[str, str]] = {}
    if mixed:
        plan, rows = mixed_layout(models, builds, rounds=rounds, number=number)
        fastest = fastest_plan(rows)
        for name, p in (("mixed", plan), ("mixed-fastest", fastest)):
            if p and p not in plans.values():
                plans[name] = p
    for name, p in plans.items():
        builds[name] = build_model(load_onnx(model, layout=p, **load_options), target, db=db, threads=threads,
                                   winograd=winograd)
    for lay in list(builds):  # a build that computes something else is not a contender (the others still are)
        why = _wrong_build(builds[lay])
        if why:
            warnings.warn(f"choosing the layout: the {lay} build is wrong ({why}); left out", RuntimeWarning,
                          stacklevel=2)
            del builds[lay]
    if not builds:
        raise RuntimeError("choosing the layout: every layout's build differs from the numpy reference")
    times: dict[str, list[float]] = {lay: [] for lay in builds}
    for _ in range(max(1, rounds)):
        for lay, exe in builds.items():
            exe.timeit(number=1)  # warm: the other build ran last
            times[lay].append(exe.timeit(number=max(1, number)))
    med = {lay: statistics.median(v) for lay, v in times.items()}
    best = min(med, key=med.get)
    why = _wrong_build(builds[best])  # and the one kept, again after its timings
    if why:
        raise RuntimeError(f"choosing the layout: the {best} build is wrong after its timings: {why}")
    return plans.get(best, best), med


def _wrong_build(exe: CompiledModel) -> str:
    """Why ``exe`` differs from its model's numpy reference (:meth:`CompiledModel.check`), "" where it does not."""
    try:
        exe.check()
    except RuntimeError as e:
        return str(e)
    return ""


def fastest_plan(rows: list[dict]) -> dict[str, str] | None:
    """The per-conv layout that puts every blocked conv of :func:`mixed_layout`'s ``rows`` in the layout
    it ran faster in, conversions not counted: where NCHW neighbours are NCHW too, :func:`mixed_layout`'s
    charge for a ``Reblock`` on each side is never paid. ``None`` when that is all-blocked or all-NCHW."""
    plan = {r["name"]: "nchw" for r in rows if r["nchw_ms"] < r["nchwc_ms"]}
    return plan if 0 < len(plan) < len(rows) else None


def mixed_layout(models: Mapping[str, Model], builds: Mapping[str, CompiledModel], *, rounds: int = 5,
                 number: int = 5) -> tuple[dict[str, str] | None, list[dict]]:
    """A per-conv layout from measurements: ``models`` / ``builds`` hold one model in ``"nchw"`` and in
    ``"nchwc"`` (:func:`~felixjax.load_onnx` ``layout=``) and their builds; both are profiled step by
    step (:meth:`CompiledModel.profile`, interleaved over ``rounds`` rounds of ``number`` runs) and each
    blocked conv stays NCHW where its median NCHW time plus the conversions it may add (a ``Reblock``
    of its input and of its output, at the per-element rate of the blocked build's own ``Reblock`` steps)
    is below its blocked time. Returns ``(plan, rows)``: ``plan`` the ``{conv name: "nchw"}`` mapping for
    ``load_onnx`` (``None`` when it would be all-blocked or all-NCHW: no new layout), ``rows`` one dict per
    blocked conv (``name``, ``task``, ``nchw_ms``, ``nchwc_ms``, ``switch_ms``, ``layout``)."""
    import statistics

    graphs = {lay: models[lay].graph for lay in ("nchw", "nchwc")}
    runs: dict[str, list[list[dict]]] = {lay: [] for lay in graphs}
    for _ in range(max(1, rounds)):
        for lay in graphs:
            runs[lay].append(builds[lay].profile(number=max(1, number)))
    ms = {lay: {row["name"]: statistics.median(r[k]["ms"] for r in runs[lay]) for k, row in enumerate(runs[lay][0])}
          for lay in graphs}
    nchwc = graphs["nchwc"]

    def size(g, v: str) -> int:
        return math.prod(g.shapes[v]) if v in g.shapes else 0

    reblocks = [n for n in nchwc.nodes if n.op == "Reblock"]
    elems = sum(size(nchwc, n.outputs[0]) for n in reblocks)
    rate = sum(ms["nchwc"][n.name] for n in reblocks) / elems if elems else 0.0
    plain = {n.name: n for n in graphs["nchw"].nodes}
    rows = []
    for node in nchwc.nodes:
        if not (node.is_anchor and node.task.op == "conv2d_nchwc") or node.name not in plain:
            continue
        src = plain[node.name]
        switch = rate * (size(graphs["nchw"], src.inputs[0]) + size(graphs["nchw"], src.outputs[0]))
        keep = ms["nchw"][node.name] + switch < ms["nchwc"][node.name]
        rows.append({"name": node.name, "task": node.task.name, "nchw_ms": ms["nchw"][node.name],
                     "nchwc_ms": ms["nchwc"][node.name], "switch_ms": switch, "layout": "nchw" if keep else "nchwc"})
    plan = {r["name"]: "nchw" for r in rows if r["layout"] == "nchw"}
    return (plan if 0 < len(plan) < len(rows) else None), rows
