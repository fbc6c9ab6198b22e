"""Whole networks: tune every task of a model with Ansor's gradient task scheduler, then build the
model into one C library from the best schedules (``codegen.netbuild``).

``tune_model`` spends a trial budget over a model's distinct tasks. After a warm-up round per task it
gives each round to the task whose next round is expected to cut the end-to-end latency the most
(Ansor's "gradient" task scheduler, PRIOR_ART §3): with ``g_i`` task ``i``'s best latency, ``w_i`` its
occurrence count and ``t_i`` its rounds so far, the estimated network latency is ``f = sum_i w_i g_i`` and
the task chosen is ``argmin_i  df/dg_i * (alpha * backward_i + (1 - alpha) * forward_i)`` where

* ``backward_i = (g_i(t_i) - g_i(t_i - window)) / window`` (recent progress; 0 until there are enough
  rounds),
* ``forward_i = min(g_i - g_i / t_i, beta * flops_i / best_flops_of_similar_tasks) - g_i`` (optimistic
  next-round gain, and what a similar task already reaches),

with ``alpha = 0.2``, ``beta = 2``, ``window = 3``. Similar tasks share an op kind and a FLOP bucket
``int(log_1.618(flops + 1))``; a task that stays ``beta`` times slower than its group's best after many
more rounds leaves the group. A task whose round measured nothing new (its space is exhausted) drops out.

``build_model`` lowers each anchor task with its best record in the database (``Space.default()`` of
``codegen.space.default_sketch`` where there is none), turns the fused graph into a
``codegen.netbuild.NetSpec``, compiles one library and returns a :class:`CompiledModel`: ``exe(x)`` runs
the compiled C (never a Python fallback), ``exe.export(dir)`` writes a standalone folder that builds with
``make``.

Example:
    >>> import numpy as np
    >>> import felixjax as fj
    >>> from felixjax.network import build_model
    >>> model = fj.load_onnx(fj.zoo.make_model("transformer_block", seq=16, dim=32, heads=2))
    >>> exe = build_model(model)
    >>> x = np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32)
    >>> bool(np.allclose(exe(x), model.run_numpy(x), rtol=1e-4, atol=1e-4))
    True
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from codegen import netbuild
from codegen.build import DEFAULT_FLAGS
from codegen.lower import Plan, lower
from codegen.measure import LocalRunner, TimingProtocol
from codegen.ops import Task
from codegen.space import Config, Space, default_sketch
from codegen.target import Target

from .database import Database, TuningRecord
from .errors import UnsupportedModelError
from .graph_passes import Graph
from .onnx_import import Model, load_onnx

__all__ = ["CompiledModel", "NetworkTuneResult", "Schedule", "TaskScheduler", "build_model", "compare_onnxruntime",
           "graph_to_spec", "tune_model", "tune_model_cli"]

NO_LATENCY = 1e10  # Ansor's cost of a task without a correct kernel yet


# ----------------------------------------------------------------------------------------------
# Task scheduler (pure logic: no hardware, testable with made-up latencies)
# ----------------------------------------------------------------------------------------------

def similarity_tag(task: Task, log_base: float = 1.618) -> str:
    """Ansor's similarity tag: the op kind and a logarithmic FLOP bucket.

    Example:
        >>> from codegen.ops import matmul
        >>> similarity_tag(matmul(64, 64, 64)) == similarity_tag(matmul(64, 64, 60))
        True
    """
    kind = task.op
    if task.op == "conv2d":
        p = task.p
        kind = "dwconv2d" if p["groups"] == p["c"] and p["groups"] > 1 else "conv2d"
    return f"{kind}_{int(math.log(task.flops + 1, log_base))}"


class TaskScheduler:
    """Ansor's gradient task scheduler over tasks with weights (occurrence counts).

    ``next_task()`` names the task of the next round (round robin through the warm-up, then the largest
    expected reduction of ``sum_i w_i g_i``); ``record(i, best_latency_s, new_trials)`` reports a round.
    A task drops out when a round adds no trial (its space is exhausted) or after ``max_failed_rounds``
    rounds without any correct kernel (Ansor would give such a task, "infinitely slow", every round).

    Example:
        >>> from codegen.ops import matmul
        >>> s = TaskScheduler([matmul(64, 64, 64), matmul(256, 256, 256)], [1, 1])
        >>> [s.next_task() for _ in range(1)], s.record(0, 1e-5, 16)
        ([0], None)
        >>> s.next_task(); s.record(1, 1e-3, 16)
        1
        >>> s.next_task()  # the big, slow task promises the larger reduction
        1
    """

    def __init__(self, tasks: Sequence[Task], weights: Sequence[float], *, alpha: float = 0.2, beta: float = 2.0,
                 window: int = 3, seed: int = 0, max_failed_rounds: int = 3):
        if len(tasks) != len(weights) or not tasks:
            raise ValueError("give one weight per task, and at least one task")
        self.tasks, self.weights = list(tasks), [float(w) for w in weights]
        self.alpha, self.beta, self.window = float(alpha), float(beta), int(window)
        self.max_failed_rounds = int(max_failed_rounds)
        self.rng = np.random.default_rng(seed)
        n = len(tasks)
        self.best = [NO_LATENCY] * n
        self.rounds = [0] * n
        self.history: list[list[float]] = [[] for _ in range(n)]
        self.dead: set[int] = set()
        self.flops = [float(t.flops) for t in tasks]
        self.tags: list[str | None] = [similarity_tag(t) for t in tasks]
        self.groups: dict[str, list[int]] = {}
        for i, tag in enumerate(self.tags):
            self.groups.setdefault(tag, []).append(i)

    def objective(self, costs: Sequence[float] | None = None) -> float:
        """Estimated network latency ``sum_i w_i g_i``."""
        return float(sum(w * c for w, c in zip(self.weights, costs if costs is not None else self.best)))

    def gradients(self) -> list[float]:
        """The expected change of the objective per task (more negative = more promising)."""
        out = []
        for i in range(len(self.tasks)):
            if i in self.dead or self.rounds[i] == 0:
                out.append(0.0)
                continue
            g, t = self.best[i], self.rounds[i]
            chain = self.weights[i]  # d(sum_j w_j g_j) / d g_i
            h = self.history[i]
            backward = (h[t - 1] - h[t - 1 - self.window]) / self.window if t - 1 - self.window >= 0 else 0.0
            g_next_1 = g - g / t
            g_next_2 = self.beta * 1e30
            group = self.groups.get(self.tags[i]) if self.tags[i] is not None else None
            if group is not None and len(group) > 1:
                best_flops = max(self.flops[j] / self.best[j] for j in group)
                g_next_2 = self.beta * self.flops[i] / best_flops
            forward = min(g_next_1, g_next_2) - g
            out.append(chain * (self.alpha * backward + (1 - self.alpha) * forward))
        return out

    def next_task(self) -> int | None:
        """The task of the next round, or None when every task is dead."""
        alive = [i for i in range(len(self.tasks)) if i not in self.dead]
        if not alive:
            return None
        warm = [i for i in alive if self.rounds[i] == 0]
        if warm:
            return warm[0]
        grads = self.gradients()
        vals = [grads[i] for i in alive]
        if max(vals) == min(vals):
            return alive[int(self.rng.integers(len(alive)))]
        return alive[int(np.argmin(vals))]

    def record(self, i: int, best_latency_s: float | None, new_trials: int) -> None:
        """Report one round of task ``i``: its best latency so far and how many trials the round added."""
        if best_latency_s is not None and math.isfinite(best_latency_s):
            self.best[i] = min(self.best[i], float(best_latency_s))
        self.rounds[i] += 1
        self.history[i].append(self.best[i])
        if new_trials <= 0 or (self.best[i] >= NO_LATENCY and self.rounds[i] >= self.max_failed_rounds):
            self.dead.add(i)  # exhausted, or no correct kernel at all: spend the budget elsewhere
        self._adjust_group(i)

    def _adjust_group(self, i: int) -> None:
        tag = self.tags[i]
        group = self.groups.get(tag) if tag is not None else None
        if group is None or len(group) <= 1:
            return
        best_flops = max(self.flops[j] / self.best[j] for j in group)
        mine = self.flops[i] / self.best[i]
        # many more rounds than its peers and still far slower: it is not similar to them after all
        if mine < best_flops / self.beta and self.rounds[i] > 5 + max(self.rounds[j] for j in group if j != i):
            self.tags[i] = None
            group.remove(i)


# ----------------------------------------------------------------------------------------------
# Tuning a whole model
# ----------------------------------------------------------------------------------------------

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


def _as_model(model: Model | str | os.PathLike | bytes | Any) -> Model:
    return model if isinstance(model, Model) else load_onnx(model)


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


# ----------------------------------------------------------------------------------------------
# Building a whole model
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Schedule:
    """The schedule one task is built with: ``source`` is ``"tuned"`` (best database record),
    ``"given"`` (passed in ``configs``) or ``"default"`` (``Space.default()`` of ``default_sketch``)."""

    task: Task
    weight: int
    config: Config
    source: str
    latency_s: float | None = None
    note: str = ""


def graph_to_spec(graph: Graph, plans: Mapping[Task, Plan]) -> netbuild.NetSpec:
    """The neutral ``codegen.netbuild`` description of a fused graph: value ids for inputs, constants and
    node outputs; one step per node (anchors become kernel steps with their plans).

    Raises:
        UnsupportedModelError: a node the C build cannot run (names the node and its op).
    """
    ids: dict[str, int] = {}
    values: list[netbuild.Value] = []

    def add(name: str, kind: str, data: np.ndarray | None = None) -> int:
        ids[name] = len(values)
        values.append(netbuild.Value(tuple(graph.shapes[name]) if name in graph.shapes else tuple(np.shape(data)),
                                     kind, data))
        return ids[name]

    for name in graph.inputs:
        add(name, "input")

    def value(name: str, node_label: str) -> int | None:
        if not name:
            return None
        if name not in ids:
            if name not in graph.constants:
                raise UnsupportedModelError(f"node {node_label!r} reads {name!r}, which nothing produces")
            data = np.asarray(graph.constants[name])
            if data.dtype != np.float32:
                data = data.astype(np.float32)
            add(name, "const", data)
        return ids[name]

    steps = []
    for node in graph.nodes:
        ins = tuple(value(i, node.name) for i in node.inputs)
        outs = []
        for o in node.outputs:
            if not o:
                outs.append(None)
                continue
            if o in ids:
                raise UnsupportedModelError(f"node {node.name!r} ({node.op}) writes {o!r}, which already exists")
            outs.append(add(o, "temp"))
        if node.is_anchor:
            steps.append(netbuild.Step("kernel", ins, tuple(outs), plan=plans[node.task], label=node.name))
        elif node.op in netbuild.CHEAP_OPS:
            steps.append(netbuild.Step(node.op, ins, tuple(outs), dict(node.attrs), label=node.name))
        else:
            raise UnsupportedModelError(f"node {node.name!r} (op {node.op}): the C build has no kernel for it; "
                                        f"supported: {', '.join(netbuild.CHEAP_OPS)} and the anchors")
    outputs = tuple(value(o, "graph output") for o in graph.outputs)
    return netbuild.NetSpec(tuple(values), tuple(ids[i] for i in graph.inputs), outputs, tuple(steps))


def _open_db(db: str | os.PathLike | Database | None) -> tuple[Database | None, bool]:
    if db is None or isinstance(db, Database):
        return db, False
    if str(db) != ":memory:" and not os.path.exists(db):
        raise FileNotFoundError(f"{db}: no such database")
    return Database(db), True


def choose_schedules(model: Model, target: Target, *, db: str | os.PathLike | Database | None = None,
                     configs: Mapping[Task, Config] | None = None) -> list[Schedule]:
    """The schedule of every distinct task: ``configs`` first, then the database's best record, then the
    default schedule of :func:`~codegen.space.default_sketch` (also where a stored config no longer lowers)."""
    database, own = _open_db(db)
    out = []
    try:
        for task, weight in model.tasks:
            default = Space(task, default_sketch(task, target), target).default()
            cfg, source, lat, note = default, "default", None, ""
            rec = database.best(task, target) if database is not None else None
            if configs and task in configs:
                cfg, source = configs[task], "given"
            elif rec is not None:
                cfg, source, lat = rec.config, "tuned", rec.latency_s
            if source != "default":
                try:
                    lower(Space(task, cfg.sketch, target), cfg)
                except (ValueError, KeyError) as e:
                    cfg, source, lat, note = default, "default", None, f"stored config rejected: {e}"
            out.append(Schedule(task, weight, cfg, source, lat, note))
    finally:
        if own:
            database.close()
    return out


class CompiledModel:
    """A model compiled into one C library: ``exe(x) -> numpy``, ``exe.export(dir)``.

    ``x`` is one array (single-input models), a sequence in input order or a dict by input name; the
    result is the output array, or a list in output order when the model has several outputs.
    """

    def __init__(self, model: Model, target: Target, schedules: list[Schedule], net: netbuild.NetSource,
                 library: netbuild.NetLibrary):
        self.model, self.target, self.schedules = model, target, schedules
        self.net, self.library = net, library

    @property
    def source(self) -> str:
        """The generated C source (``model.c``)."""
        return self.net.source

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.model.input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.model.output_names

    def _inputs(self, x: Any) -> list[np.ndarray]:
        names = self.model.input_names
        if isinstance(x, np.ndarray):
            x = [x]
        if isinstance(x, Mapping):
            unknown = set(x) - set(names)
            if unknown:
                raise ValueError(f"unknown inputs {sorted(unknown)}; the model takes {list(names)}")
            missing = [n for n in names if n not in x]
            if missing:
                raise ValueError(f"missing inputs {missing}; the model takes {list(names)}")
            x = [x[n] for n in names]
        x = list(x)
        if len(x) != len(names):
            raise ValueError(f"the model takes {len(names)} inputs {list(names)}, got {len(x)}")
        out = []
        for name, a, shape in zip(names, x, self.net.input_shapes):
            a = np.require(np.asarray(a, dtype=np.float32), requirements="C")  # keeps 0-d arrays 0-d
            if a.shape != tuple(shape):
                raise ValueError(f"input {name!r} has shape {a.shape}, the model expects {tuple(shape)}")
            out.append(a)
        return out

    def run(self, x: Any) -> list[np.ndarray]:
        """All outputs, as a list in output order."""
        return self.library(self._inputs(x))

    def __call__(self, x: Any) -> np.ndarray | list[np.ndarray]:
        outs = self.run(x)
        return outs[0] if len(outs) == 1 else outs

    def timeit(self, x: Any = None, *, number: int = 10) -> float:
        """Seconds per run, averaged over ``number`` runs timed in C (random inputs when ``x`` is None)."""
        if x is None:
            rng = np.random.default_rng(0)
            x = [rng.standard_normal(s).astype(np.float32) for s in self.net.input_shapes]
        ins = self._inputs(x)
        outs = self.library.new_outputs()
        return self.library.timeit(ins, outs, number) / number

    def set_threads(self, n: int) -> None:
        """OpenMP threads of later runs (from this Python thread)."""
        self.library.set_threads(n)

    def profile(self, x: Any = None, *, number: int = 10) -> list[dict]:
        """Where the time goes: one row per graph node (``name``, ``op``: the task name for anchors,
        ``ms`` averaged over ``number`` runs with every step timed in C), in execution order."""
        if x is None:
            rng = np.random.default_rng(0)
            x = [rng.standard_normal(s).astype(np.float32) for s in self.net.input_shapes]
        secs = self.library.profile(self._inputs(x), number=number)
        return [{"name": n.name, "op": n.task.name if n.is_anchor else n.op, "ms": 1e3 * float(t)}
                for n, t in zip(self.model.graph.nodes, secs)]

    def export(self, directory: str | os.PathLike) -> Path:
        """Write a standalone folder (model.c, model.h, main.c, Makefile, weights.bin, README.txt) that
        builds with ``make`` and only a C compiler."""
        lines = [f"Model: {self.model.name}; inputs {list(self.model.input_names)}, outputs "
                 f"{list(self.model.output_names)} (in this order in inputs.bin / outputs.bin).", "Schedules:"]
        lines += [f"  {s.task.name} x{s.weight}: {s.source} ({s.config.sketch})" for s in self.schedules]
        return netbuild.export(self.net, directory, readme="\n".join(lines))

    def summary(self) -> str:
        """Schedules, memory and code size of the build, one line each."""
        tuned = sum(s.source != "default" for s in self.schedules)
        lines = [f"{self.model.name}: {self.net.steps} steps, {len(self.schedules)} tasks ({tuned} tuned, "
                 f"{len(self.schedules) - tuned} default), arena {self.net.arena_bytes / 2**20:.2f} MiB, "
                 f"weights {self.net.weight_bytes / 2**20:.2f} MiB, {self.net.source.count(chr(10))} lines of C"]
        for s in self.schedules:
            lat = f", {s.latency_s * 1e3:.4f} ms measured" if s.latency_s is not None else ""
            lines.append(f"  {s.task.name} x{s.weight}: {s.source} {s.config.sketch}{lat}"
                         + (f" ({s.note})" if s.note else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        tuned = sum(s.source != "default" for s in self.schedules)
        return f"CompiledModel({self.model.name}, {len(self.schedules)} tasks, {tuned} tuned)"


def build_model(model: Model | str | os.PathLike | bytes, target: Target | None = None, *,
                db: str | os.PathLike | Database | None = None, configs: Mapping[Task, Config] | None = None,
                threads: int | None = None, flags: Sequence[str] = DEFAULT_FLAGS) -> CompiledModel:
    """Compile a whole model into one C library from the best schedule of each task.

    Args:
        model: a :class:`~felixjax.onnx_import.Model` or anything :func:`~felixjax.load_onnx` reads.
        target: the machine the schedules are for (default ``Target.cpu()``).
        db: a tuning database (path or :class:`Database`): each task's best record on ``target``.
        configs: explicit configs per task (override the database).
        threads: OpenMP threads of the compiled model (default: the target's cores).
        flags: compiler flags (a shared library).

    Raises:
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
    model = _as_model(model)
    target = target or Target.cpu()
    schedules = choose_schedules(model, target, db=db, configs=configs)
    plans = {s.task: lower(Space(s.task, s.config.sketch, target), s.config) for s in schedules}
    spec = graph_to_spec(model.graph, plans)
    try:
        net = netbuild.emit(spec)
    except netbuild.NetBuildError as e:
        raise UnsupportedModelError(str(e)) from None
    library = netbuild.load(net, flags=flags, threads=threads or target.cores)
    return CompiledModel(model, target, schedules, net, library)


# ----------------------------------------------------------------------------------------------
# Against onnxruntime
# ----------------------------------------------------------------------------------------------

def _ort_session(onnx_model: Any, threads: int, *, spinning: bool = False):
    import onnx
    import onnxruntime as ort

    if isinstance(onnx_model, onnx.ModelProto):
        data = onnx_model.SerializeToString()
    elif isinstance(onnx_model, (bytes, bytearray)):
        data = bytes(onnx_model)
    else:
        data = Path(onnx_model).read_bytes()
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "1" if spinning else "0")
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def compare_onnxruntime(compiled: CompiledModel, onnx_model: Any, *, threads: int | None = None, rounds: int = 5,
                        min_time_s: float = 0.1, seed: int = 0, rtol: float = 1e-3) -> dict:
    """Check the compiled model against onnxruntime on random inputs, then time both interleaved
    (A B A B ..., same threads, onnxruntime with spinning off; ours timed in C, onnxruntime through IO
    binding to preallocated buffers).

    Returns:
        ``felixjax_ms`` / ``onnxruntime_ms`` (medians), ``*_min_ms``, ``speedup`` (onnxruntime median /
        ours), ``max_rel_err`` (max |ours - ort| / max |ort|), ``threads``, ``rounds``.

    Raises:
        AssertionError: the outputs differ beyond ``rtol`` (relative to each output's largest magnitude).
    """
    threads = int(threads or compiled.target.cores)
    compiled.set_threads(threads)
    sess = _ort_session(onnx_model, threads)
    rng = np.random.default_rng(seed)
    ins = [rng.standard_normal(s).astype(np.float32) for s in compiled.net.input_shapes]
    ours = compiled.run(ins)
    names = [i.name for i in sess.get_inputs()]
    ref = sess.run(None, dict(zip(names, ins)))
    err = 0.0
    for k, (y, r) in enumerate(zip(ours, ref)):
        scale = max(float(np.abs(r).max()), 1e-30)
        e = float(np.abs(y - r).max()) / scale
        err = max(err, e)
        if not e <= rtol:
            raise AssertionError(f"output {k} differs from onnxruntime: max |diff| / max |ref| = {e:.3g}")
    binding = sess.io_binding()
    for name, x in zip(names, ins):
        binding.bind_input(name, "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    ort_outs = [np.empty(r.shape, np.float32) for r in ref]
    for o, y in zip(sess.get_outputs(), ort_outs):
        binding.bind_output(o.name, "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    lib_ins = compiled._inputs(ins)
    lib_outs = compiled.library.new_outputs()

    def ort_block(number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            sess.run_with_iobinding(binding)
        return time.perf_counter() - t0

    def fj_block(number: int) -> float:
        return compiled.library.timeit(lib_ins, lib_outs, number)

    times = time_interleaved({"felixjax": fj_block, "onnxruntime": ort_block}, rounds=rounds, min_time_s=min_time_s)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"felixjax_ms": med["felixjax"] * 1e3, "onnxruntime_ms": med["onnxruntime"] * 1e3,
            "felixjax_min_ms": min(times["felixjax"]) * 1e3, "onnxruntime_min_ms": min(times["onnxruntime"]) * 1e3,
            "speedup": med["onnxruntime"] / med["felixjax"], "max_rel_err": err, "threads": threads,
            "rounds": rounds}


def time_interleaved(blocks: Mapping[str, Callable[[int], float]], *, rounds: int = 5,
                     min_time_s: float = 0.1) -> dict[str, list[float]]:
    """``blocks[name](number)`` returns seconds for ``number`` runs. Each is warmed up and calibrated to
    at least ``min_time_s`` per block, then timed in turn ``rounds`` times; returns seconds per run."""
    numbers = {}
    for name, block in blocks.items():
        block(1)
        number, t = 1, block(1)
        while t < min_time_s and number < 1_000_000:
            number = max(number + 1, math.ceil(number * min(100.0, 1.2 * min_time_s / max(t, 1e-9))))
            t = block(number)
        numbers[name] = number
    out: dict[str, list[float]] = {name: [] for name in blocks}
    for _ in range(rounds):
        for name, block in blocks.items():
            out[name].append(block(numbers[name]) / numbers[name])
    return out


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

def tune_model_cli(args: Any, target: Target) -> int:
    """``felixjax tune model.onnx --trials N --db runs.db``: tune, print the summary table, build the
    model and (unless ``--no-compare``) check and time it against onnxruntime."""
    from .strategies.base import cost_model_options

    model = load_onnx(args.model)
    if not model.tasks:
        print(f"{model.name}: no tunable tasks (no Conv / Gemm / MatMul with constant weights)")
        return 0
    print(f"{model.name}: {len(model.tasks)} tasks, {sum(w for _, w in model.tasks)} anchor ops; budget "
          f"{args.trials} trials ({args.strategy})", file=sys.stderr, flush=True)
    res = tune_model(model, target, trials=args.trials, db=args.db, strategy=args.strategy, seed=args.seed,
                     seconds=args.seconds, threads=args.threads, progress=_round_progress,
                     strategy_options=cost_model_options(args.strategy, getattr(args, "cost_model", None)))
    print(res.table())
    print(f"\n{res.trials} trials in {res.wall_s:.0f} s; records in {args.db}")
    exe = res.build(threads=args.threads)
    if getattr(args, "show_source", False):
        print(exe.source)
    if not getattr(args, "no_compare", False):
        cmp = compare_onnxruntime(exe, args.model, threads=args.threads or target.cores)
        print(f"end to end ({cmp['threads']} threads): felixjax {cmp['felixjax_ms']:.3f} ms, onnxruntime "
              f"{cmp['onnxruntime_ms']:.3f} ms (x{cmp['speedup']:.2f}); outputs agree to "
              f"{cmp['max_rel_err']:.1e}")
    return 0


def build_model_cli(args: Any, target: Target) -> int:
    """``felixjax build model.onnx --db runs.db -o out/``: build from the database's best records, check
    the library against the numpy reference on a random input, export the standalone folder."""
    model = load_onnx(args.model)
    exe = build_model(model, target, db=args.db, threads=args.threads)
    rng = np.random.default_rng(0)
    x = [rng.standard_normal(s).astype(np.float32) for s in exe.net.input_shapes]
    if not args.no_check:
        ref = model.run_numpy(x)
        ref = ref if isinstance(ref, list) else [ref]
        for k, (y, r) in enumerate(zip(exe.run(x), ref)):
            e = float(np.abs(y - r).max()) / max(float(np.abs(r).max()), 1e-30)
            if not e <= 1e-3:
                raise RuntimeError(f"output {k} of the build differs from the numpy reference ({e:.2g})")
    out = exe.export(args.output)
    print(exe.summary())
    print(f"wrote {out}/ (model.c, model.h, main.c, Makefile, weights.bin, README.txt); build it with `make -C {out}`")
    return 0
