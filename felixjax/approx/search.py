"""``fj.approximate``: per-layer approximation knobs chosen in one objective with the schedules, under a
quality budget, with every reported figure measured on the built C network.

One round: descend the joint objective (:mod:`felixjax.approx.objective`) at a quality weight
``lam`` -> round the channel counts to multiples of the SIMD width -> prune (:mod:`felixjax.approx.knobs`)
-> tune the tasks the pruning created with the tuning session -> build -> measure real latency and
real quality (one *quality evaluation*) -> write the measured kernel latencies back into the latency
tables and move ``lam`` (bisection: larger when the measured loss broke the budget, smaller when it
held). The result keeps every measured point (``pareto``) and returns the fastest one within budget.

Formats: with ``precisions=("float32", "int8")`` (``"float16"`` too where the build takes it) and / or
``sparsities=(0.5, 0.9)`` each layer may run in another *format* (:mod:`felixjax.approx.formats`: int8,
float16, or float32 with that fraction of its weights zeroed by magnitude as a sparse kernel;
:mod:`felixjax.approx.precision`: latency from the same tables times each format's measured ratio,
quality by the format's arithmetic in JAX, every chosen point built and measured): the all-int8 /
all-sparse-at-``s`` networks are built and profiled first (the ratios), the descent relaxes each layer's
format to shares beside its channels (:class:`~felixjax.approx.objective.RelaxedFormats`) and rounds
both; the front search adds a greedy format pass over the float32 points it measured. The measured
ratios decide: on an AVX2 CPU sparse kernels at 50% zeros are slower than dense ones, so that level
is usually rejected. What is not a knob, and why, is in ``result.excluded`` (:func:`probe_knobs`).
"""
from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from codegen import ops
from codegen.ops import Task
from codegen.target import Target

from ..database import Database
from ..network_build import CompiledModel, _as_model
from ..onnx_import import Model
from ..quantize import act_qparams, int8_task, precision_of
from . import executor
from . import formats as fm
from .formats import INT8, REFERENCE, Format
from .knobs import Groups, analyze, prune
from .objective import (
    FRACTIONS,
    LatencyTable,
    RelaxedFormats,
    descend,
    finetune,
    round_channels,
    round_formats,
)
from .precision import FormatLatency, assign, calibrate_ranges, with_formats
from .quality import check_data, metric_value, within
from .result import ApproxResult, LayerDecision, ParetoPoint, pareto_front  # noqa: F401  (pareto_front: re-exported)

#: keep ratios of the default seeds of the front search (the uniform baseline's points)
UNIFORM = (0.75, 0.5, 0.375, 0.25)


def uniform_keep(groups: Groups, fraction: float, multiple: int) -> dict[int, int]:
    """One keep ratio for every prunable group, rounded to a multiple of ``multiple`` (the uniform,
    application-agnostic baseline's configuration)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a uniform keep ratio must be in (0, 1], got {fraction!r}")
    return {g: min(groups.size(g), max(1, round(groups.size(g) * fraction / multiple)) * multiple)
            for g in groups.prunable()}


class MaskedQuality:
    """The metric of a channel configuration on the given data, computed in JAX on the *original*
    graph with hard 0/1 channel masks (pruning equals masking: ``tests/test_approx.py``): one compiled
    function for every configuration, no C build. With ``formats`` (``{layer: its formats, the
    reference first}``) a call's ``chosen`` layers run in their format's arithmetic
    (:func:`~felixjax.approx.formats.transform`; ``qparams``: each int8 layer's input ``(scale, zero
    point)``, ``masks``: the sparse levels' weight masks, on the full layer's weights); ``qparams``
    alone means int8 / float32 layers. Used by the front search to rank candidates; every point it
    returns is then built and scored on the C build (``Approximator.point``)."""

    def __init__(self, ax: Approximator, *, chunk: int = 512, qparams: Mapping[str, tuple[float, int]] | None = None,
                 formats: Mapping[str, Sequence[Format]] | None = None, masks: Mapping | None = None):
        import jax
        import jax.numpy as jnp

        from .knobs import mask_vector

        g, groups = ax.model.graph, ax.groups
        self.ax, self.chunk, self.qparams = ax, chunk, dict(qparams or {})
        self.formats = {n: tuple(f) for n, f in (formats or {n: (REFERENCE, INT8) for n in self.qparams}).items()}
        self.roots = tuple(groups.prunable())
        name, out, qp, fmts, wm = g.inputs[0], ax.output, self.qparams, self.formats, dict(masks or {})

        def one(xi: Any, masks: Any, flags: Any) -> Any:
            def hook(v: str, val: Any) -> Any:
                lay = groups.layouts.get(v)
                if lay is None:
                    return val
                return val * mask_vector(groups, lay, masks, jnp).reshape((1, -1) + (1,) * (val.ndim - 2))

            def fake(node: Any, args: list) -> list:
                res = list(args)
                for k, f in enumerate(fmts.get(node.name, ())[1:], start=1):  # a select: exact at 0 / 1
                    t = fm.transform(node.task, args, f, qparams=qp.get(node.name), mask=wm.get((node.name, f[1])),
                                     straight=False)
                    res = [a if b is a else jnp.where(flags[node.name][k] > 0, b, a) for a, b in zip(res, t)]
                return res
            return executor.run(g, {name: xi}, value_hook=hook, anchor_inputs=fake)[out]

        self.f = jax.jit(jax.vmap(one, in_axes=(0, None, None)))
        self.cache: dict[tuple, float] = {}

    @property
    def evals(self) -> int:
        return len(self.cache)

    def __call__(self, keep: Mapping[int, int], chosen: Mapping[str, Format] | Iterable[str] = frozenset()) -> float:
        """The metric at channels ``keep`` with ``chosen`` (``{layer: format}``, or the int8 layers)."""
        chosen = dict(chosen) if isinstance(chosen, Mapping) else {n: INT8 for n in chosen}
        key = (tuple(sorted((g, int(keep[g])) for g in self.roots)), fm.key(chosen))
        if key not in self.cache:
            groups, x = self.ax.groups, self.ax.x
            masks = {g: (np.arange(groups.size(g)) < n).astype(np.float32) for g, n in key[0]}
            flags = {n: np.asarray([f == chosen.get(n, REFERENCE) for f in fs], np.float32)
                     for n, fs in self.formats.items()}
            outs = np.concatenate([np.asarray(self.f(x[i: i + self.chunk], masks, flags))
                                   for i in range(0, len(x), self.chunk)])
            self.cache[key] = metric_value(outs, self.ax.metric, labels=self.ax.y, reference=self.ax.reference)
        return self.cache[key]


def ladder(size: int, multiple: int) -> list[int]:
    """The channel counts a group of ``size`` may take: the multiples of ``multiple`` below it, and ``size``."""
    return sorted({round_channels(k * multiple, size, multiple) for k in range(1, size // multiple + 2)} | {size})


def local_search(start: Mapping[int, int], floor: float, *, latency: Callable[[Mapping[int, int]], float],
                 quality: Callable[[Mapping[int, int]], float], ladders: Mapping[int, list[int]],
                 max_steps: int = 24, max_evals: int = 64) -> dict[int, int]:
    """Greedy per-layer descent from ``start``: each step takes the move with the lowest ``latency``
    (the tables) among those whose ``quality`` (given data) stays ``>= floor``; moves are one group one
    rung down its ladder, or one group down and another up (a trade between layers). Stops when no
    move lowers the latency and holds the floor."""
    cur = {g: int(n) for g, n in start.items()}
    cur_lat, evals = latency(cur), 0
    for _ in range(max_steps):
        moves = []
        for g, lad in ladders.items():
            i = lad.index(cur[g])
            if i > 0:
                moves.append({**cur, g: lad[i - 1]})
                for h, lh in ladders.items():
                    j = lh.index(cur[h])
                    if h != g and j + 1 < len(lh):
                        moves.append({**cur, g: lad[i - 1], h: lh[j + 1]})
        scored = sorted(((latency(k), k) for k in moves), key=lambda t: t[0])
        moved = False
        for lat, k in scored:
            if lat >= cur_lat * (1 - 1e-6) or evals >= max_evals:
                break
            evals += 1
            if quality(k) >= floor:
                cur, cur_lat, moved = k, lat, True
                break
        if not moved:
            break
    return cur


def probe_knobs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(precisions the network build takes, reasons for what is not a knob)``. Sparsity is a knob
    (``sparsities=``) where ``codegen.ops`` has sparse kernels; the reasons say which layers a sparse or
    low-precision format cannot reach.

    Example:
        >>> precisions, reasons = probe_knobs()
        >>> precisions[:1], "int8" in precisions
        (('float32',), True)
    """
    ok, why = ["float32"], []
    try:
        int8_task(ops.conv2d(1, 8, 8, 8, out_channels=8, kernel=3, padding=1))
        ok.append("int8")
    except (TypeError, ValueError) as e:
        why.append(f"precision int8: codegen.ops rejects it ({str(e).splitlines()[0][:120]})")
    if "float16" in fm.available_precisions():
        ok.append("float16")
    else:
        why.append("precision float16: the network build does not take it yet (felixjax.quantize.BUILD_PRECISIONS)")
    if fm.sparsity_supported():
        why.append("sparsity with int8 / float16 in one layer: sparse kernels are float32 only (a layer takes one "
                   "format); grouped / depthwise convs and batched matmuls have no sparse kernel and stay dense")
    else:
        why.append("sparsity: codegen.ops builds no sparse task here")
    return tuple(ok), tuple(why)


class Approximator:
    """The measured side of approximation: tune, build, time and score networks (the benchmark's
    baselines use it too, so every method is measured the same way)."""

    def __init__(self, model: Model | str | os.PathLike | bytes, target: Target | None = None, *,
                 data: tuple, metric: str = "accuracy", output: str | None = None,
                 db: str | os.PathLike | Database | None = None, seed: int = 0, strategy: Any = None,
                 trials_per_task: int = 16, progress: bool | Callable[[str], None] = False,
                 multiple: int | None = None, finetune_steps: int = 0):
        self.model = _as_model(model)
        if len(self.model.input_names) != 1:
            raise ValueError(f"approximate takes single-input models; this one takes {list(self.model.input_names)}")
        g = self.model.graph
        executor.check_supported(g)
        self.output = output or g.outputs[0]
        if self.output not in g.outputs:
            raise ValueError(f"output {self.output!r} is not an output of the model; outputs: {list(g.outputs)}")
        self.out_index = list(g.outputs).index(self.output)
        if not isinstance(data, (tuple, list)) or len(data) not in (1, 2):
            raise ValueError("data must be (x, y) or (x,): inputs and, for metric='accuracy', labels")
        x, y = data[0], data[1] if len(data) == 2 else None
        self.metric = metric
        self.x, self.y = check_data(x, y, g.shapes[g.inputs[0]], g.shapes[self.output], metric)
        self.target = target or Target.cpu()
        self.db = db if isinstance(db, Database) else Database(db if db is not None else ":memory:")
        self.seed, self.strategy, self.trials_per_task = seed, strategy, trials_per_task
        self.multiple = multiple or max(1, int(self.target.simd_lanes))
        self.finetune_steps = finetune_steps
        self._say = progress if callable(progress) else ((lambda s: print(s, file=sys.stderr, flush=True))
                                                         if progress else (lambda s: None))
        self.groups: Groups = analyze(g)
        self.quality_evals = 0
        self.search_evals = 0
        self.tuned: set[Task] = set()
        self.reference: np.ndarray | None = None

    # ---- measuring -------------------------------------------------------------------------
    def tune(self, model: Model, trials_per_task: int | None = None) -> None:
        """Tune the tasks of ``model`` not tuned yet in this run (the tuning session, scheduled rounds)."""
        from ..network_tune import _default_strategy, scheduled_rounds
        from ..session import TuningSession

        pairs = [(t, w) for t, w in model.tasks if t not in self.tuned]
        n = self.trials_per_task if trials_per_task is None else trials_per_task
        if not pairs or n <= 0:
            return
        strategy = self.strategy or _default_strategy()
        with TuningSession(self.target, db=self.db, seed=self.seed, progress=False, defaults=True) as session:
            runs = [session.add(t, strategy, seed=self.seed, run=f"approx:{self.seed}") for t, _ in pairs]
            session.trials = max(0, n * len(pairs) - sum(r.resumed for r in runs))
            scheduled_rounds(session, runs, [w for _, w in pairs], per_round=max(1, min(8, n)), seed=self.seed)
        self.tuned.update(t for t, _ in pairs)

    def build(self, model: Model) -> CompiledModel:
        from ..pipeline import build_model

        return build_model(model, self.target, db=self.db)

    def outputs(self, exe: CompiledModel) -> np.ndarray:
        return np.stack([exe.run(xi)[self.out_index] for xi in self.x])

    def quality_of(self, exe: CompiledModel) -> float:
        """The metric of a built network on the data (one quality evaluation)."""
        self.quality_evals += 1
        out = self.outputs(exe)
        if self.metric == "fidelity" and self.reference is None:
            self.reference = out  # the float32 baseline is the reference
        return metric_value(out, self.metric, labels=self.y, reference=self.reference)

    def check_holdout(self, holdout: tuple) -> tuple[np.ndarray, np.ndarray | None]:
        """``holdout`` checked as ``data`` is: ``(x, y)`` or ``(x,)``."""
        if not isinstance(holdout, (tuple, list)) or len(holdout) not in (1, 2):
            raise ValueError("holdout must be (x, y) or (x,), as data")
        g = self.model.graph
        try:
            return check_data(holdout[0], holdout[1] if len(holdout) == 2 else None, g.shapes[g.inputs[0]],
                              g.shapes[self.output], self.metric)
        except ValueError as e:  # check_data words it for data=
            raise ValueError(f"holdout: {e}") from None

    def heldout(self, base: CompiledModel, exe: CompiledModel, x: np.ndarray,
                y: np.ndarray | None) -> tuple[float, float]:
        """The metric of ``base`` and of ``exe`` on data the search never saw (fidelity: against ``base`` there)."""
        ref = np.stack([base.run(xi)[self.out_index] for xi in x])
        out = ref if exe is base else np.stack([exe.run(xi)[self.out_index] for xi in x])
        return (metric_value(ref, self.metric, labels=y, reference=ref),
                metric_value(out, self.metric, labels=y, reference=ref))

    def latency(self, exe: CompiledModel, *, repeats: int = 21) -> float:
        """Seconds per call of the C build: the best of ``repeats`` short timings (about 5 ms each), the protocol
        of :meth:`latency_pair` (five 0.1 s timings: a loaded machine preempted them all, the baseline read 800x)."""
        x0 = self.x[0]
        number = max(1, int(0.005 / max(exe.timeit(x0, number=1), 1e-6)))
        return min(exe.timeit(x0, number=number) for _ in range(repeats))

    def latency_pair(self, exe: CompiledModel, base: CompiledModel, *, repeats: int = 21) -> tuple[float, float]:
        """``(seconds of exe, seconds of base)``: best of ``repeats`` timings each, interleaved, so both
        see the same machine load; each timing is short (about 5 ms of the baseline), so on a loaded
        machine some of them fit between preemptions."""
        x0 = self.x[0]
        number = max(1, int(0.005 / max(base.timeit(x0, number=1), 1e-6)))
        a, b = [], []
        for _ in range(repeats):
            a.append(exe.timeit(x0, number=number))
            b.append(base.timeit(x0, number=number))
        return min(a), min(b)

    def layer_latencies(self, exe: CompiledModel, *, number: int = 10) -> dict[Task, float]:
        """Seconds of every conv / dense kernel inside the built network: the fastest of ``number`` profiled runs."""
        runs = [exe.profile(self.x[0], number=1) for _ in range(max(1, number))]
        return {n.task: min(r[i]["ms"] for r in runs) / 1e3 for i, n in enumerate(exe.model.graph.nodes)
                if n.is_anchor}

    def measured(self) -> dict[Task, float]:
        """The best measured latency of every task tuned so far."""
        out = {}
        for t in self.tuned:
            rec = self.db.best(t, self.target)
            if rec is not None:
                out[t] = rec.latency_s
        return out

    # ---- points ----------------------------------------------------------------------------
    def pruned_model(self, keep: Mapping[int, int]) -> Model:
        graph = prune(self.model.graph, self.groups, keep)
        return Model(name=f"{self.model.name}_approx", graph=graph, source=graph, opset=self.model.opset)

    def final_model(self, keep: Mapping[int, int], int8: Iterable[str] = (),
                    formats: Mapping[str, Format] | None = None) -> Model:
        """The pruned model, fine-tuned when ``finetune_steps`` (deterministic: same seed, same weights),
        with the layers ``int8`` at int8 and those of ``formats`` (``{layer: (precision, sparsity)}``) in
        theirs (:func:`~felixjax.approx.precision.with_formats`: sparse weights masked on the pruned,
        fine-tuned network; int8 inputs calibrated on the data on it)."""
        model = self.pruned_model(keep)
        if self.finetune_steps:
            graph = finetune(model.graph, self.x, metric=self.metric, labels=self.y, reference=self.reference,
                             steps=self.finetune_steps, seed=self.seed, output=self.output)
            model = Model(name=model.name, graph=graph, source=graph, opset=model.opset)
        return with_formats(model, {**{n: INT8 for n in int8}, **dict(formats or {})}, self.x)

    def point(self, keep: Mapping[int, int], method: str, *, baseline: "ParetoPoint | None" = None,
              base_exe: CompiledModel | None = None, note: str = "", int8: Iterable[str] = (),
              formats: Mapping[str, Format] | None = None) -> tuple[ParetoPoint, CompiledModel, Model]:
        """Prune to ``keep`` (``int8``: these layers at int8; ``formats``: these in their format), tune
        the new tasks, build, measure latency and quality."""
        chosen = {**{n: INT8 for n in int8}, **dict(formats or {})}
        model = self.final_model(keep, formats=chosen)
        self.tune(model)
        exe = self.build(model)
        if base_exe is not None:
            lat, base_s = self.latency_pair(exe, base_exe)
        else:
            lat, base_s = self.latency(exe), float("nan")
        q = self.quality_of(exe)
        loss = (baseline.quality - q) if baseline else 0.0
        keys = tuple(sorted((g, int(n)) for g, n in keep.items()))
        i8 = tuple(sorted(n for n, f in chosen.items() if f == INT8))
        return ParetoPoint(method, lat, q, loss, keys, note, base_s, i8, fm.key(chosen)), exe, model


def approximate(model: Model | str | os.PathLike | bytes, target: Target | None = None, *, data: tuple,
                quality_budget: float = 0.01, metric: str = "accuracy", output: str | None = None,
                trials: int = 200, db: str | os.PathLike | Database | None = None, seed: int = 0,
                rounds: int = 4, latency: str = "cost_model", strategy: Any = None, steps: int = 40,
                lam: float = 1.0, finetune_steps: int = 0, multiple: int | None = None, batch: int = 64,
                progress: bool | Callable[[str], None] = True, search: str = "front",
                seeds: Sequence[float | Mapping[int, int]] | None = None, measure: int = 6,
                precisions: Sequence[str] = ("float32",), sparsities: Sequence[float] = (),
                holdout: tuple | None = None) -> ApproxResult:
    """Choose per-layer channel counts (and, where kernels exist, precisions and unstructured sparsity)
    in one objective with the schedules, under an absolute quality budget, and return the measured result.

    Args:
        model: an ONNX path / bytes / ``ModelProto`` or a loaded :class:`~felixjax.onnx_import.Model`
            (one input).
        target: the machine (default ``Target.cpu()``).
        data: ``(x, y)`` (``x``: samples of the input shape, with or without the batch axis of 1;
            ``y``: integer labels) or ``(x,)`` for ``metric="fidelity"``.
        quality_budget: allowed absolute drop of the metric (0.01 = one accuracy point), >= 0; 0 keeps the
            exact float32 network (no search: not "any point of zero measured loss"); 1 or more allows any
            drop of accuracy or top-1 agreement (a warning says so).
        metric: ``"accuracy"`` or ``"fidelity"`` (top-1 agreement with float32 for classifiers, else
            1 - relative L2 error), on ``output`` (default: the first output).
        trials: tuning budget in measured candidates over the whole call (half for the baseline).
        db: tuning database (path or :class:`~felixjax.database.Database`; default in memory).
        seed: seeds tuning, descent and fine-tuning.
        rounds: measured rounds of the loop (each is one quality evaluation).
        latency: ``"cost_model"`` (the learned, schedule-aware tables) or ``"flops"`` (the FLOPs proxy).
        strategy: the tuning strategy (default as ``fj.tune_model``).
        steps, lam, batch: Adam steps per round, the starting quality weight, images per step.
        finetune_steps: fine-tune the pruned weights in JAX for this many steps before building (0: off).
        multiple: channel counts are rounded to multiples of this (default: the SIMD width).
        progress: one line per round on stderr (or a callable receiving the lines).
        search: ``"front"`` (default): after the descent rounds, a Pareto-front search: every seed (a
            uniform keep ratio, an explicit ``{group: channels}``, and each descent point) is built and
            measured, then a greedy per-layer local search from each seed (latency from the tables,
            quality on the given data in JAX with hard masks) looks for a faster configuration of
            greater-or-equal quality, and from the fastest configuration within budget for a faster one
            still within it; those are built and measured too (at most ``measure`` of them), the
            measured kernels of every build going back into the tables. ``"descent"``: the descent
            rounds only (the loop of earlier versions).
        seeds: the front search's starting points (default: the uniform ratios ``UNIFORM``).
        measure: how many local-search points the front search builds and measures, beyond the seeds
            (the last one: a local search within budget from the fastest measured point within budget).
        precisions: the precisions a layer may take: ``("float32",)`` (default: channels only, the
            results of earlier versions) or ``("float32", "int8")`` (:mod:`felixjax.approx.precision`):
            the all-int8 network is tuned, built and measured first (its kernels measured into the
            tables), then each descent round descends the layers' int8 shares with their channels and
            builds the rounded precisions; the front search (``search="front"``) also puts layers of its
            measured float32 configurations at int8 greedily where the tables say it pays and the
            fake-quantized quality holds the budget (at most ``measure`` more points, built with int8
            kernels and measured). Off by default: it tunes the int8 twin of every layer too.
            ``"float16"`` where the network build takes it (:func:`probe_knobs`), the same way.
        holdout: data of the same form as ``data`` that the search never sees: the baseline and the chosen
            network are scored on it at the end (``result.heldout_loss``). Without it every quality figure
            is in-sample (measured on the data that chose the network: optimistic where many points were
            compared, and a budget of a few samples is noise; ``result.table()`` says so).
        sparsities: levels of unstructured sparsity a layer may take (default none): at level ``s`` the
            fraction ``s`` of the layer's weights with the smallest magnitudes is zero and the layer runs
            as a sparse float32 kernel (conv2d groups 1, dense, matmul without batch; a layer is int8,
            float16 or sparse, not two of them). Like a precision, each level is a format of the
            relaxed objective (:class:`~felixjax.approx.objective.RelaxedFormats`) priced by a measured
            ratio (the all-sparse network at that level is tuned, built and profiled first) and proposed
            by the greedy pass; ``result.layers[i].sparsity`` reports the chosen levels.

    Raises:
        ValueError: a negative budget, data of the wrong shape, labels that do not match the outputs, an
            unknown metric or output, an unknown precision, a sparsity outside (0, 1).

    Example:
        >>> import numpy as np, felixjax as fj
        >>> from felixjax.approx import digits
        >>> x, y = digits.load(size=8)
        >>> p = digits.train_cnn(x[:256], y[:256], width=4, epochs=1)
        >>> res = fj.approximate(digits.to_onnx(p, 8), data=(x[:64], y[:64]), quality_budget=0.5, trials=4,
        ...                      rounds=1, steps=2, strategy="random", progress=False)
        >>> res.speedup > 0, len(res.pareto) >= 1
        (True, True)
    """
    if (isinstance(quality_budget, bool) or not isinstance(quality_budget, numbers.Real)
            or not math.isfinite(quality_budget) or quality_budget < 0):
        raise ValueError(f"quality_budget must be a number >= 0 (an absolute drop of the metric), got {quality_budget!r}")
    # np.float32(0.01) is 0.00999999977 as a float: a loss of one point in a hundred would break it
    quality_budget = float(str(quality_budget)) if isinstance(quality_budget, np.floating) else float(quality_budget)
    if quality_budget >= 1:
        warnings.warn(f"quality_budget {quality_budget:g} allows any drop of accuracy or top-1 agreement (they lie in "
                      f"[0, 1]: 0.01 is one point)", UserWarning, stacklevel=2)
    if trials < 0 or rounds < 0 or measure < 0:
        raise ValueError(f"trials, rounds and measure must be >= 0 (got trials={trials}, rounds={rounds}, "
                         f"measure={measure})")
    if search not in ("front", "descent"):
        raise ValueError(f"search must be 'front' or 'descent', got {search!r}")
    allowed, _ = probe_knobs()
    if isinstance(precisions, str) or "float32" not in precisions or set(precisions) - set(allowed):
        raise ValueError(f"precisions must include 'float32' and be among {allowed}, got {precisions!r}")
    levels = fm.check_sparsities(sparsities)
    if levels and not fm.sparsity_supported():
        raise ValueError("sparsities: codegen.ops builds no sparse task here")
    formats = fm.formats_of(precisions, levels)
    ax = Approximator(model, target, data=data, metric=metric, output=output, db=db, seed=seed, strategy=strategy,
                      progress=progress, multiple=multiple, finetune_steps=finetune_steps)
    say = ax._say
    hold = ax.check_holdout(holdout) if holdout is not None else None
    excluded = tuple(e for e in probe_knobs()[1] if (bool(levels) if e.startswith("sparsity") else
                                                     any(e.startswith(f"precision {p}:") for p in precisions)))
    for e in excluded:
        say(f"approx: {e}")
    tasks = len(ax.model.tasks)
    ax.trials_per_task = max(0, trials // 2 // max(1, tasks))
    say(f"approx: {trials} trials: {ax.trials_per_task or 'none (default schedules)'} per task for the float32 "
        f"network's {tasks} task(s) (half the budget), the rest for pruned / low-precision layers later")
    base_model = ax.model
    ax.tune(base_model)                                                       # tune the float32 network
    base_exe = ax.build(base_model)                                           # build it
    base = ParetoPoint("float32", ax.latency(base_exe), ax.quality_of(base_exe), 0.0,
                       tuple((g, ax.groups.size(g)) for g in ax.groups.prunable()))
    say(f"approx: baseline {base.latency_s * 1e3:.4g} ms, {metric} {base.quality:.4f}")
    if quality_budget == 0 or (not ax.groups.prunable() and len(formats) == 1):
        say("approx: " + ("quality_budget 0: the exact float32 network" if quality_budget == 0 else
                          "no layer can be pruned and no other format was asked for: the float32 network"))
        return _result(ax, base, base_exe, (base, base_exe, base_model), [], [], excluded, quality_budget, hold)
    profiled = ax.layer_latencies(base_exe) if latency == "cost_model" else {}
    fractions = FRACTIONS if search == "descent" else tuple(sorted(set(FRACTIONS) | {k / 8 for k in range(1, 8)}))
    table = LatencyTable(base_model.graph, ax.groups, ax.target, measured={**profiled, **ax.measured()},
                         kind=latency, multiple=ax.multiple, fractions=fractions)  # per-layer latency over channels
    ax.trials_per_task = max(0, (trials - trials // 2) // max(1, rounds * tasks))
    points, best = [], (base, base_exe, base_model)
    lo = hi = None
    seen: dict = {}  # rounded point (channels, formats) -> within budget
    trace = []
    full = {g: float(ax.groups.size(g)) for g in ax.groups.prunable()}
    start = full  # descent starts at the smallest network measured within budget so far (else the full one)
    start_fmt: dict[str, Format] = {}
    method = latency if latency != "cost_model" else "ours"
    # with formats: (latency of configurations, int8 inputs' (scale, zero point), sparse weight masks,
    # the network measured with every eligible layer in each format)
    fmts = (_formats_setup(ax, table, base, base_exe, points, seen, formats, method=method, base_profile=profiled,
                           quality_budget=quality_budget) if len(formats) > 1 else None)
    for pt, exe, pm in (fmts[3] if fmts is not None else ()):
        if seen[(pt.keep, pt.formats)] and pt.speedup > best[0].speedup:
            best, start_fmt = (pt, exe, pm), pt.chosen                        # an all-format network within budget
    for r in range(rounds):
        relax = (RelaxedFormats(fmts[0].formats, fmts[0].relaxed, fmts[1], fmts[2], start_fmt)
                 if fmts is not None else None)
        kappa, info = descend(base_model.graph, ax.groups, table, ax.x, metric=metric, labels=ax.y,
                              reference=ax.reference, lam=lam, start=start, steps=steps, seed=seed + r,
                              multiple=ax.multiple, batch=batch, precision=relax,
                              output=ax.output)                                     # the joint objective, relaxed
        keep = {g: round_channels(k, ax.groups.size(g), ax.multiple) for g, k in kappa.items()}  # round
        chosen = round_formats(relax.formats, info["format_share"]) if relax is not None else {}
        key = (tuple(sorted(keep.items())), fm.key(chosen))
        trace.append({"round": r, "lam": lam, "kappa": kappa, "keep": dict(keep), "grad": info["grad"],
                      "int8_share": info["int8_share"], "int8": sorted(n for n, f in chosen.items() if f == INT8),
                      "format_share": info["format_share"], "formats": {n: fm.label(f) for n, f in chosen.items()},
                      "objective": info["trace"][-1] if info["trace"] else None})
        if all(keep[g] == ax.groups.size(g) for g in keep) and not chosen:
            say(f"approx: round {r}: lam {lam:.3g} keeps the full network; lowering it")
            lam = lam / 4
            continue
        if key in seen:
            say(f"approx: round {r}: lam {lam:.3g} gives a point already measured")
            lam = lam / 2 if seen[key] else lam * 2
            continue
        pt, exe, pm = ax.point(keep, method, baseline=base, base_exe=base_exe, note=f"lam={lam:.3g}",
                               formats=chosen)                                # prune, re-tune, build, measure
        points.append(pt)
        table.observe(ax.measured())                                          # measured kernels feed back
        ok = seen[key] = within(pt.quality_loss, quality_budget)
        say(f"approx: round {r}: lam {lam:.3g} -> {pt.latency_s * 1e3:.4g} ms ({pt.speedup:.2f}x), "
            f"{metric} {pt.quality:.4f} (loss {pt.quality_loss:+.4f}, {'within' if ok else 'over'} budget)"
            + (f", {fm.describe(chosen)}" if chosen else ""))
        if ok and pt.speedup > best[0].speedup:
            best = (pt, exe, pm)
            start, start_fmt = {g: float(n) for g, n in keep.items()}, chosen
        if ok:
            hi = lam if hi is None else min(hi, lam)
            lam = lam / 4 if lo is None else math.sqrt(lo * lam)
        else:
            lo = lam if lo is None else max(lo, lam)
            lam = lam * 4 if hi is None else math.sqrt(hi * lam)
    if search == "front":
        best = _front_search(ax, table, base, base_exe, points, best, seen, seeds=seeds, measure=measure,
                             quality_budget=quality_budget, method=method,
                             observe=latency == "cost_model", trace=trace, formats=fmts)
    return _result(ax, base, base_exe, best, points, trace, excluded, quality_budget, hold)


def _result(ax: Approximator, base: ParetoPoint, base_exe: CompiledModel, best: tuple, points: list, trace: list,
            excluded: tuple, quality_budget: float, hold: tuple | None) -> ApproxResult:
    """:func:`approximate`'s result: the chosen point timed again beside the baseline (its own timing won
    among several noisy ones), both scored on the held-out data where there is some."""
    chosen, exe, chosen_model = best
    retimed = None
    if chosen is not base:
        retimed = ax.latency_pair(exe, base_exe)
        ax._say(f"approx: the chosen network timed again beside the baseline: {retimed[0] * 1e3:.4g} ms against "
                f"{retimed[1] * 1e3:.4g} ms ({retimed[1] / retimed[0]:.2f}x; {chosen.speedup:.2f}x when chosen)")
        if retimed[0] >= retimed[1]:  # not faster after all (its own timing was a lucky one): keep the exact one
            ax._say("approx: not faster than the baseline timed beside it: the exact float32 network is kept")
            trace = [*trace, {"kept_baseline": {"chosen": chosen.note, "retimed_s": retimed}}]
            chosen, exe, chosen_model, retimed = base, base_exe, ax.model, None
    hb = hq = float("nan")
    if hold is not None:
        hb, hq = ax.heldout(base_exe, exe, *hold)
        ax._say(f"approx: held out ({_scored(*hold)} samples): {ax.metric} {hb:.4f} -> {hq:.4f} (loss {hb - hq:+.4f})")
    return ApproxResult(base_exe, exe, ax.metric, base.latency_s, retimed[0] if retimed else chosen.latency_s,
                        base.quality, chosen.quality, quality_budget, _decisions(ax.model, chosen_model),
                        tuple([base] + points), ax.quality_evals, excluded, tuple(trace),
                        chosen if chosen is not base else None, ax.search_evals, retimed, _scored(ax.x, ax.y), hb, hq,
                        _scored(*hold) if hold is not None else 0)


def _scored(x: np.ndarray, y: np.ndarray | None) -> int:
    """What a metric averages over: the labels (a graph pinned to batch B has B per sample), else the samples."""
    return int(np.asarray(y).size) if y is not None else len(x)


def _front_search(ax: Approximator, table: LatencyTable, base: ParetoPoint, base_exe: CompiledModel,
                  points: list, best: tuple, seen: dict, *, seeds: Sequence | None, measure: int,
                  quality_budget: float, method: str, observe: bool, trace: list,
                  formats: tuple | None = None) -> tuple:
    """The front search of :func:`approximate` (see its ``search``, ``precisions`` and ``sparsities``); appends to
    ``points``, returns the fastest measured point within budget (``best`` if none is faster)."""
    say, groups, m = ax._say, ax.groups, ax.multiple
    roots = list(groups.prunable())
    full = {g: groups.size(g) for g in roots}
    ladders = {g: ladder(groups.size(g), m) for g in roots}
    qual = MaskedQuality(ax)
    lat_cache: dict[tuple, float] = {}

    def key(k: Mapping[int, int]) -> tuple:
        return tuple(sorted((g, int(k[g])) for g in roots))

    def lat(k: Mapping[int, int]) -> float:
        kk = key(k)
        if kk not in lat_cache:
            lat_cache[kk] = float(table.total({g: float(n) for g, n in kk}))
        return lat_cache[kk]

    measured = {(p.keep, p.formats): p for p in points}

    def build(k: Mapping[int, int], note: str, chosen: Mapping[str, Format] | None = None) -> ParetoPoint | None:
        nonlocal best
        kk, mk = key(k), (key(k), fm.key(chosen or {}))
        if mk in measured or mk == (key(full), ()):
            return measured.get(mk)
        pt, exe, pm = ax.point(dict(k), method, baseline=base, base_exe=base_exe, note=note, formats=chosen)
        points.append(pt)
        measured[mk] = pt
        ok = within(pt.quality_loss, quality_budget)
        seen[mk] = ok
        if observe:
            table.observe({**ax.layer_latencies(exe), **ax.measured()})  # measured kernels feed back
            lat_cache.clear()
        say(f"approx: {note}: {pt.latency_s * 1e3:.4g} ms ({pt.speedup:.2f}x), {ax.metric} {pt.quality:.4f} "
            f"(loss {pt.quality_loss:+.4f}, {'within' if ok else 'over'} budget) channels {[n for _, n in kk]}"
            + (f", {fm.describe(chosen)}" if chosen else ""))
        if ok and pt.speedup > best[0].speedup:
            best = (pt, exe, pm)
        return pt

    starts: list[tuple[str, dict[int, int]]] = []
    for s in (UNIFORM if seeds is None else seeds):
        if isinstance(s, Mapping):
            bad = set(s) - set(roots)
            if bad:
                raise ValueError(f"seed {dict(s)} names groups {sorted(bad)}; the prunable groups are {roots}")
            starts.append((f"seed {[int(s.get(g, full[g])) for g in roots]}", {g: int(s.get(g, full[g])) for g in roots}))
        else:
            starts.append((f"seed uniform {float(s):g}", uniform_keep(groups, float(s), m)))
    starts += [(f"seed {p.note or 'descent'}", dict(p.keep)) for p in list(points) if key(dict(p.keep)) != key(full)]
    for note, k in starts:                                                    # every seed measured
        build(k, note)
    floor_budget = qual(full) - quality_budget
    cands: list[tuple[str, dict[int, int]]] = []
    for note, k in starts:                                                    # beat each seed per layer
        better = local_search(k, qual(k), latency=lat, quality=qual, ladders=ladders)
        if key(better) != key(k):
            cands.append((f"local from {note[5:]}", better))
    ok_keeps = [k for _, k in starts + cands if qual(k) >= floor_budget] or [full]
    fastest = min(ok_keeps, key=lat)                                            # the fastest within budget, faster
    cands.insert(0, ("local within budget", local_search(fastest, floor_budget, latency=lat, quality=qual,
                                                         ladders=ladders)))
    # measure the candidates; the last slot goes to a local search from the fastest *measured* point
    # within budget (measured latency, not the tables, picks where the last descent starts)
    queue, done, refined = list(cands), 0, False
    while done < measure and (queue or not refined):
        if not refined and (done == measure - 1 or not queue):
            refined = True
            if best[0] is not base:
                k = local_search(dict(best[0].keep), floor_budget, latency=lat, quality=qual, ladders=ladders)
                if (key(k), ()) not in measured:
                    build(k, "local from the best measured")
                    done += 1
            continue
        note, k = queue.pop(0)
        if (key(k), ()) not in measured and key(k) != key(full):
            build(k, note)
            done += 1
    ax.search_evals += qual.evals
    if formats is not None:
        done += _formats_stage(ax, formats, points, build, key, full, floor_budget, quality_budget, measure)
    trace.append({"front": {"seeds": len(starts), "candidates": len(cands), "measured": done,
                            "jax_quality_evals": qual.evals}})
    say(f"approx: front search: {len(starts)} seeds, {done} local-search points measured, "
        f"{qual.evals} configurations scored in JAX on the given data")
    return best


def _formats_setup(ax: Approximator, table: LatencyTable, base: ParetoPoint, base_exe: CompiledModel, points: list,
                   seen: dict, formats: Sequence[Format], *, method: str, quality_budget: float,
                   base_profile: dict) -> tuple:
    """Before the descent rounds with formats: for each non-reference format, the network with every layer
    that can take it in it (all-int8, all-sparse at level ``s``, ...) tuned, built and measured, its kernels'
    in-network times beside ``base_profile`` (the base build's) giving the ratios the descent prices; returns
    ``(latency of configurations, {int8 layer: input (scale, zero point)}, {(layer, sparsity): weight mask},
    [(point, executable, model) per format])``."""
    per = fm.eligible_formats(ax.model, formats)
    int8 = [n for n, fs in per.items() if INT8 in fs]
    ranges = calibrate_ranges(ax.model, ax.x, int8)
    full = {g: ax.groups.size(g) for g in ax.groups.prunable()}
    seeds = []
    profiled = dict(base_profile)  # the base build's in-network times (the ratios: in-network both sides)
    for f in formats[1:]:
        names = [n for n, fs in per.items() if f in fs]
        if not names:
            ax._say(f"approx: no layer can run {fm.label(f)}")
            continue
        pt, exe, pm = ax.point(full, method, baseline=base, base_exe=base_exe, note=f"seed {fm.label(f)}",
                               formats=dict.fromkeys(names, f))
        points.append(pt)
        seeds.append((pt, exe, pm))
        seen[(pt.keep, pt.formats)] = within(pt.quality_loss, quality_budget)
        if table.kind == "cost_model":
            profiled.update(inside := ax.layer_latencies(exe))
            table.observe({**inside, **ax.measured()})
        ax._say(f"approx: all-{fm.label(f)} ({len(names)} layers): {pt.latency_s * 1e3:.4g} ms ({pt.speedup:.2f}x), "
                f"{ax.metric} {pt.quality:.4f} (loss {pt.quality_loss:+.4f})")
    flat = FormatLatency(ax.model, table, per, profiled=profiled)
    for n, fs in per.items():
        ax._say(f"approx: {n}: measured / float32 latency " + ", ".join(f"{fm.label(f)} {flat.ratio(n, f):.2f}"
                                                                         for f in fs[1:]))
    return (flat, {n: act_qparams(*ranges[n]) for n in int8}, fm.weight_masks(ax.model, per), seeds)


def _formats_stage(ax: Approximator, formats: tuple, points: list, build: Callable, key: Callable, full: dict,
                   floor: float, quality_budget: float, measure: int) -> int:
    """The greedy format pass of the front search (beside the descent's proposals): for the full network
    and each float32 point measured within budget (fastest first) the layers' formats
    :func:`~felixjax.approx.precision.assign` picks, built and measured (at most ``measure``)."""
    flat, qparams, masks, _ = formats
    qual = MaskedQuality(ax, qparams=qparams, formats=flat.formats, masks=masks)
    starts = [full] + [dict(p.keep) for p in sorted(points, key=lambda p: -p.speedup)
                       if not p.formats and within(p.quality_loss, quality_budget)]
    done, tried = 0, set()
    for k in starts:
        if done >= measure:
            break
        if key(k) in tried:
            continue
        tried.add(key(k))
        chosen = assign(k, floor, latency=flat, quality=qual)
        before = len(points)
        if chosen and build(k, fm.summary(chosen), chosen) is not None and len(points) > before:
            done += 1  # (a point measured before, by the descent, is neither counted nor measured again)
    ax.search_evals += qual.evals
    ax._say(f"approx: formats: {len(flat.formats)} layers may change format; {done} mixed points measured "
            f"by the greedy pass")
    return done

def _decisions(before: Model, after: Model) -> tuple[LayerDecision, ...]:
    new = {n.name: n for n in after.graph.nodes if n.is_anchor}
    out = []
    for n in before.graph.nodes:
        if n.is_anchor and n.name in new:
            a = new[n.name].task
            out.append(LayerDecision(n.name, n.task.name, a.name, (n.task.output_shape[1], a.output_shape[1]),
                                     precision_of(a), float(a.sparsity)))
    return tuple(out)
