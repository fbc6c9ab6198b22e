"""Choosing each task's schedule inside its network (``tune_model(..., in_network=3)``).

The tuner times a kernel alone, its weights and inputs warm in cache. Inside a network the layers before
it have evicted them, and a kernel that streams more bytes pays for it there: a Winograd F(4x4) 3x3 conv
on a 512-channel 4x4 image reads transformed weights four times the size of the raw ones (38 MB, more than
the L3), so on ResNet-18 CIFAR (2 threads) it ran 0.28 ms alone and 1.1 ms in the network, where a
spatial-pack kernel of the same layer ran 0.34 ms alone and 0.47 ms in the network.

So after tuning, :func:`select_in_network` builds the network a few times, variant ``i`` giving every task
the best config of its ``i``-th fastest sketch family (variant 0: each task's best kernel, what
``build_model`` would build), profiles the variants step by step in interleaved rounds
(:meth:`CompiledModel.profile`: every step timed in C inside whole runs), and gives each task the candidate
whose layers took the least time in the network (switching from the best kernel only when at least
``margin`` faster there). The whole build with those choices is then timed against variant 0, interleaved;
it is kept only where it is faster as a whole (layers interact through the cache), and each task's choice
is stored as a ``retime:network:<run>`` row (:meth:`Database.network_choice`) that ``build_model`` prefers
over kernel records.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from codegen.measure_records import MeasureResult
from codegen.ops import Task
from codegen.space import Config
from codegen.target import Target

from .database import NETWORK_PREFIX, Database, TuningRecord
from .network_build import CompiledModel
from .onnx_import import Model

#: a task leaves its best kernel only for a candidate at least this much faster inside the network
MARGIN = 0.05
#: candidates more than this many times slower alone than the task's best kernel are not built
MAX_RATIO = 3.0


@dataclass(frozen=True)
class Candidate:
    """One schedule a task may be built with: the best record of one sketch family (``kernel_s``: its
    kernel timed alone) and its layers' median time inside the network, per layer (``network_s``)."""

    record: TuningRecord
    network_s: float

    @property
    def config(self) -> Config:
        return self.record.config

    @property
    def kernel_s(self) -> float:
        return self.record.latency_s


@dataclass(frozen=True)
class TaskChoice:
    """A task's candidates (variant order: 0 is its best kernel) and the one chosen."""

    task: Task
    nodes: int
    candidates: tuple[Candidate, ...]
    chosen: int

    @property
    def pick(self) -> Candidate:
        return self.candidates[self.chosen]


@dataclass(frozen=True)
class NetworkSelection:
    """What :func:`select_in_network` measured and decided.

    Attributes:
        choices: one :class:`TaskChoice` per task with a tuned record.
        variants_s: whole-network seconds of each variant build (median of the profiled runs' sums).
        picked_s, baseline_s: the build with the per-task choices and variant 0, timed as whole runs in
            the same interleaved rounds (``None`` when no task changed its schedule).
        kept: ``True`` when the choices were kept (faster as a whole); else every task keeps its best kernel.
    """

    choices: tuple[TaskChoice, ...]
    variants_s: tuple[float, ...]
    picked_s: float | None = None
    baseline_s: float | None = None
    kept: bool = False

    @property
    def changed(self) -> list[TaskChoice]:
        return [c for c in self.choices if c.chosen != 0]

    def configs(self) -> dict[Task, Config]:
        """The config each task is built with after the selection."""
        return {c.task: (c.pick if self.kept else c.candidates[0]).config for c in self.choices}

    def table(self) -> str:
        """Per task: each candidate's sketch, kernel time alone and layer time in the network (ms), the
        chosen one starred; then the whole builds."""
        lines = [f"{'task':<52} candidates: sketch kernel-alone / in-network ms (* chosen)"]
        for c in self.choices:
            built = c.chosen if self.kept else 0
            cells = [f"{'*' if i == built else ' '}{k.record.sketch} {k.kernel_s * 1e3:.3f} / "
                     f"{k.network_s * 1e3:.3f}" for i, k in enumerate(c.candidates)]
            lines.append(f"{c.task.name[:52]:<52} " + "  ".join(cells))
        lines.append("variants (whole network, ms): " + ", ".join(f"{v * 1e3:.3f}" for v in self.variants_s))
        if self.picked_s is not None:
            lines.append(f"per-task choices {self.picked_s * 1e3:.3f} ms vs best kernels {self.baseline_s * 1e3:.3f} "
                         f"ms as whole builds: {'kept' if self.kept else 'not kept (not faster as a whole)'}")
        else:
            lines.append("no task runs faster in the network with another sketch: the best kernels stay")
        return "\n".join(lines)


def family_candidates(db: Database, task: Task, target: Target | str, families: int, *,
                      max_ratio: float = MAX_RATIO, exclude_sketches: Collection[str] = ()) -> list[TuningRecord]:
    """The best record of each of a task's ``families`` fastest sketch families on ``target`` (a target
    or its key, thread count included), first the record ``build_model`` would pick (the fastest end-of-run
    re-timing, else the fastest record); families whose best is over ``max_ratio`` times slower alone are
    left out (a network build of a hopeless config only costs time); none of ``exclude_sketches`` (names of
    exact sketches: their padded variants too)."""
    first = (db.best(task, target, retimed=True, exclude_sketches=exclude_sketches)
             or db.best(task, target, exclude_sketches=exclude_sketches))
    if first is None:
        return []
    out, seen = [first], {first.sketch}
    for rec in sorted((r for r in db.records(task, target, retimes=True)
                       if r.ok and not r.run.startswith(NETWORK_PREFIX)
                       and r.config.sketch.split(".")[0] not in exclude_sketches), key=lambda r: r.latency_s):
        if len(out) >= families:
            break
        if rec.latency_s > max_ratio * first.latency_s:
            break
        if rec.sketch not in seen and math.isfinite(rec.latency_s):
            seen.add(rec.sketch)
            out.append(rec)
    return out


def _block_number(build: CompiledModel, x: list[np.ndarray], seconds: float) -> int:
    one = build.timeit(x, number=1)
    return max(2, min(200, math.ceil(seconds / max(one, 1e-6))))


def _settle(build: CompiledModel, x: list[np.ndarray]) -> None:
    """A short pause (threads spinning after the previous block let go), then two untimed runs."""
    time.sleep(0.02)
    build.timeit(x, number=2)


def select_in_network(model: Model, target: Target, db: Database, builder: Callable[..., CompiledModel], *,
                      run: str, key: str | None = None, threads: int | None = None, families: int = 3,
                      rounds: int = 7, margin: float = MARGIN, log: Callable[[str], None] | None = None,
                      exclude_sketches: Collection[str] = ()) -> NetworkSelection | None:
    """Choose each task's schedule by its layers' time inside the network (module docstring).

    ``builder`` is :func:`felixjax.build_model`; ``exclude_sketches`` as for :func:`family_candidates` (a
    ``tune_model(winograd=False)``: no Winograd candidate); ``key`` the target key the records were timed under
    (default ``target.at_threads(threads).key``); rows are written to ``db`` under ``retime:network:<run>`` only when the choices are kept.
    Returns ``None`` when no task has more than one sketch family to choose from.
    """
    threads = threads or target.cores
    key = key or target.at_threads(threads).key
    cands = {t: family_candidates(db, t, key, families, exclude_sketches=exclude_sketches) for t, _ in model.tasks}
    cands = {t: c for t, c in cands.items() if c}
    depth = max((len(c) for c in cands.values()), default=0)
    if depth < 2:
        return None
    variants = [{t: c[min(i, len(c) - 1)].config for t, c in cands.items()} for i in range(depth)]
    builds = [builder(model, target, configs=v, threads=threads) for v in variants]
    rng = np.random.default_rng(0)
    x = [rng.standard_normal(s).astype(np.float32) for s in builds[0].net.input_shapes]
    ref = np.asarray(builds[0].run(x)[0])
    for i, b in enumerate(builds[1:], 1):  # every kernel was checked against numpy when measured; the builds too
        got = np.asarray(b.run(x)[0])
        if not np.allclose(got, ref, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(ref).max()))):
            raise RuntimeError(f"in-network selection: variant {i}'s output differs from the best kernels' build "
                               f"(max |diff| {float(np.abs(got - ref).max()):.3g})")
    number = _block_number(builds[0], x, 0.03)
    prof: list[list[list[float]]] = [[] for _ in builds]
    for _ in range(max(1, rounds)):
        for i, b in enumerate(builds):
            _settle(b, x)
            prof[i].append([r["ms"] * 1e-3 for r in b.profile(x, number=number)])
    nodes = model.graph.nodes
    med = [[statistics.median(p[k] for p in runs) for k in range(len(nodes))] for runs in prof]
    choices = []
    for t, c in cands.items():
        idx = [k for k, n in enumerate(nodes) if n.is_anchor and n.task == t]
        if not idx:
            continue
        per = [sum(med[min(i, len(c) - 1)][k] for k in idx) / len(idx) for i in range(len(c))]
        best = min(range(len(c)), key=per.__getitem__)
        chosen = best if per[best] < (1.0 - margin) * per[0] else 0
        choices.append(TaskChoice(t, len(idx), tuple(Candidate(r, s) for r, s in zip(c, per)), chosen))
    sel = NetworkSelection(tuple(choices), tuple(sum(m) for m in med))
    if not sel.changed:
        _say(log, sel)
        return sel
    picked = builder(model, target, configs={c.task: c.pick.config for c in choices}, threads=threads)
    times: dict[str, list[float]] = {"picked": [], "baseline": []}
    pair = {"picked": picked, "baseline": builds[0]}
    for _ in range(max(3, rounds)):
        for name, b in pair.items():
            _settle(b, x)
            times[name].append(b.timeit(x, number=number))
    p, b0 = statistics.median(times["picked"]), statistics.median(times["baseline"])
    sel = NetworkSelection(sel.choices, sel.variants_s, p, b0, kept=p < b0)
    if sel.kept:
        for c in sel.changed + [c for c in sel.choices if c.chosen == 0]:
            db.add(TuningRecord(c.task, c.pick.record.target_key, NETWORK_PREFIX + run, c.chosen, c.pick.config,
                                MeasureResult("ok", (c.pick.network_s,)), 0.0, c.pick.record.target))
    _say(log, sel)
    return sel


def _say(log: Callable[[str], None] | None, sel: NetworkSelection) -> None:
    if log is not None:
        log(sel.table())

