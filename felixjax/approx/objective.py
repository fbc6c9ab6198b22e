"""The joint objective: layer latency from the learned cost model + a quality term, descended with optax.

**Relaxed channel counts meet factorized schedule spaces.** A schedule space is built on the prime
factors of its extents, so a changing channel count changes the space itself: there is no schedule at
"45.3 channels". The relaxation therefore never puts a fractional extent into a space. Each layer's
latency is tabulated on a grid of *real* extents (multiples of the SIMD width, which the kernels like;
odd ones run on the padded sketches of ``codegen.padding``), each entry the cost model's predicted
latency of that task at its best known schedule (the database's best record if the task was measured,
else the best-scored default of every sketch), and the table is calibrated per layer by the measured
latency of the full-size layer. The relaxed counts ``(c_in, c_out)`` read the table by bilinear
interpolation in log-extents (:func:`interp2`), so ``d latency / d channels`` is the slope between
neighbouring schedulable extents: flat where an extent change keeps the vector lanes busy the same
way, steep where it crosses a register-block or padding boundary. With ``latency="flops"`` the entries
are FLOP counts instead (the proxy baseline this objective must beat). Measured latencies of rounded
points are written back into the tables (:meth:`LatencyTable.observe`).

**Relaxed formats meet the same tables.** A layer's *format* is its precision and sparsity
(:mod:`felixjax.approx.formats`: ``("float32", 0.0)`` the reference, ``("int8", 0.0)``, ``("float16",
0.0)`` where the build takes it, ``("float32", s)`` sparse at level ``s``). With ``precisions=("float32",
"int8")`` and / or ``sparsities=(0.5, 0.9)`` every layer with more than one eligible format gets one logit
per non-reference format (the reference's fixed at 0), its shares ``p = softmax(logits)``
(:class:`RelaxedFormats`; with two formats ``p = (1 - q, q)``, ``q = sigmoid(phi)``: the int8 share of
earlier versions, :func:`RelaxedPrecision`). Its latency is ``sum_k p_k r_k lat_fp32(c_in, c_out)``:
``lat_fp32`` is the channel table above and ``r_k`` the ratio of the layer's task in format ``k`` and its
float32 task at full size (:meth:`felixjax.approx.precision.FormatLatency.ratio`): measured, since the
network with every eligible layer in format ``k`` (all-int8, all-sparse at level ``s``, ...) is built
and profiled before the descent and its kernels (an int8 layer's quantize step folded in) go into the
tables; the cost model's prediction where a kernel was not measured. The ratio is assumed to hold at
pruned extents (measured pruned kernels do not update it). So ``d latency / d p_k = r_k lat_fp32(c)`` is
a kernel's measured cost in that format and ``d latency / d c`` the table's slope times ``sum_k p_k
r_k``; neither is a FLOPs count: an int8, float16 or sparse task counts the FLOPs of its dense float32
twin, so under ``latency="flops"`` every ``r_k = 1`` (the proxy never sees a reason to change a
format). The quality term sees the layer's inputs as ``sum_k p_k T_k(x)``, ``T_k`` the format's
arithmetic (:func:`felixjax.approx.formats.transform`): int8 fake quantization
(:func:`felixjax.quantize.fake_quant_inputs`) and float16 rounding through a straight-through
estimator, a sparse level as the product of the weights with the fixed magnitude mask of the layer's
own weights (a plain product, no STE: the layer is linear in its weights and the mask is constant, so
the gradient is exact), so ``d quality / d p_k`` is the loss that format causes at that layer.
Channels and shares are descended together; each layer takes its largest share
(:func:`round_formats`; with int8 alone: int8 share >= 0.5, :func:`round_precisions`), and the rounded
point is built and measured like any other.

Example:
    >>> import numpy as np
    >>> float(interp2(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([8.0, 16.0]), np.array([8.0, 16.0]),
    ...               8.0, 16.0))
    2.0
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from codegen import ops
from codegen.ops import Task
from codegen.spaces import spaces_for
from codegen.target import Target
from felixjax.graph_passes import Graph, Node

from . import executor
from .formats import INT8, REFERENCE, Format, mix, transform
from .knobs import Groups, mask_vector
from .quality import soft_mask, surrogate

FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def round_channels(n: float, size: int, multiple: int) -> int:
    """A channel count the kernels like: a multiple of ``multiple`` (the SIMD width) in ``[multiple, size]``,
    or ``size`` itself.

    Example:
        >>> round_channels(21.7, 64, 8), round_channels(3.0, 64, 8), round_channels(60.0, 64, 8)
        (24, 8, 64)
    """
    if size <= multiple:
        return size
    return int(min(size, max(multiple, multiple * round(n / multiple))))


def grid(size: int, multiple: int, fractions: tuple[float, ...] = FRACTIONS) -> np.ndarray:
    """The extents a group of ``size`` channels is tabulated at."""
    return np.unique([round_channels(size * f, size, multiple) for f in fractions] + [size]).astype(np.float64)


def interp2(table: Any, gi: np.ndarray, go: np.ndarray, ci: Any, co: Any) -> Any:
    """Bilinear interpolation of ``table[i, o]`` (positive) in log-extents, log-values; clamped at the ends."""
    def frac(g: np.ndarray, c: Any) -> Any:
        if len(g) == 1:
            return jnp.zeros(())
        return jnp.interp(jnp.log(c), jnp.log(jnp.asarray(g)), jnp.arange(len(g), dtype=jnp.float32))

    t = jnp.log(jnp.asarray(table))
    fi, fo = frac(gi, ci), frac(go, co)
    i0 = jnp.clip(jnp.floor(fi).astype(jnp.int32), 0, max(len(gi) - 2, 0))
    o0 = jnp.clip(jnp.floor(fo).astype(jnp.int32), 0, max(len(go) - 2, 0))
    i1, o1 = jnp.minimum(i0 + 1, len(gi) - 1), jnp.minimum(o0 + 1, len(go) - 1)
    a, b = fi - i0, fo - o0
    v = ((1 - a) * (1 - b) * t[i0, o0] + a * (1 - b) * t[i1, o0] + (1 - a) * b * t[i0, o1] + a * b * t[i1, o1])
    return jnp.exp(v)


def resized(task: Task, cin: int, cout: int) -> Task:
    """``task`` with ``cin`` input and ``cout`` output channels (a depthwise conv: both ``cin``)."""
    p = task.p
    kw = {"bias": task.bias, "act": task.act, "residual": task.residual}
    if task.op == "dense":
        return ops.dense(p["n"], cin, cout, **kw)
    if task.op != "conv2d":
        raise ValueError(f"{task.name}: only conv2d and dense layers change channels")
    dw = p["groups"] > 1
    return ops.conv2d(p["n"], cin, p["h"], p["w"], out_channels=cin if dw else cout, kernel=(p["r"], p["s"]),
                      stride=p["stride"], padding=p["pad"], dilation=p["dilation"], groups=cin if dw else 1, **kw)


@dataclass
class Layer:
    """One anchor whose extents follow channel groups: ``ins`` / ``out`` are (group, channels, inner)
    segments of its input and output channel axes (frozen groups count as constants)."""

    node: Node
    ins: tuple[tuple[int | None, int, int], ...]
    out: tuple[tuple[int | None, int, int], ...]
    gi: np.ndarray = field(default_factory=lambda: np.ones(1))
    go: np.ndarray = field(default_factory=lambda: np.ones(1))
    table: np.ndarray = field(default_factory=lambda: np.ones((1, 1)))

    @property
    def depthwise(self) -> bool:
        return self.node.task.op == "conv2d" and self.node.task.p["groups"] > 1

    def extents(self, kappa: Mapping[int, Any]) -> tuple[Any, Any]:
        def total(segs: tuple) -> Any:
            return sum((kappa[g] if g is not None and g in kappa else size) * inner for g, size, inner in segs)
        return total(self.ins), total(self.out) if not self.depthwise else total(self.ins)


def _segments(groups: Groups, layout: Any) -> tuple[tuple[int | None, int, int], ...]:
    if layout is None:
        return ()
    return tuple((None if groups.is_frozen(g) else groups.find(g), s, layout.inner) for g, s in layout.segments)


class LatencyTable:
    """Per layer latency over channel extents (see the module docstring)."""

    def __init__(self, graph: Graph, groups: Groups, target: Target, *, measured: Mapping[Task, float],
                 kind: str = "cost_model", multiple: int | None = None, fractions: tuple[float, ...] = FRACTIONS,
                 predictor: Callable[[Task], float] | None = None):
        if kind not in ("cost_model", "flops"):
            raise ValueError(f"latency must be 'cost_model' or 'flops', got {kind!r}")
        self.kind, self.target, self.groups = kind, target, groups
        self.multiple = multiple or max(1, int(target.simd_lanes))
        self.measured = dict(measured)
        self._predict = predictor or _CostModelPredictor(target, self.measured)
        self.layers: list[Layer] = []
        for node in graph.nodes:
            if not node.is_anchor:
                continue
            ins = _segments(groups, groups.layouts.get(node.inputs[0]))
            out = _segments(groups, groups.layouts.get(node.outputs[0]))
            if not any(g is not None for g, _, _ in ins + out):
                continue  # nothing of this layer changes
            lay = Layer(node, ins, out)
            self._tabulate(lay, fractions)
            self.layers.append(lay)
        self.full = {id(l): self.value(l.node.task) for l in self.layers}

    def value(self, task: Task) -> float:
        """Seconds of ``task`` (measured, else predicted by the cost model; FLOPs for ``kind="flops"``)."""
        if self.kind == "flops":
            return float(task.flops)
        return float(self.measured.get(task) or self._predict(task))

    def _tabulate(self, lay: Layer, fractions: tuple[float, ...]) -> None:
        task = lay.node.task
        cin = task.input_shapes()[0][1]
        cout = task.output_shape[1]
        m = self.multiple
        lay.gi = grid(cin, m, fractions) if any(g is not None for g, _, _ in lay.ins) else np.array([float(cin)])
        lay.go = (grid(cout, m, fractions) if any(g is not None for g, _, _ in lay.out) and not lay.depthwise
                  else np.array([float(cout)]))
        lay.table = np.array([[self.value(resized(task, int(i), int(o))) for o in lay.go] for i in lay.gi])
        full = self.value(task)
        scale = (self.measured.get(task) or full) / max(lay.table[-1, -1], 1e-30)
        if self.kind == "cost_model" and task in self.measured:
            lay.table = lay.table * scale  # calibrated: the full layer's entry is its measured latency

    def observe(self, measured: Mapping[Task, float]) -> int:
        """Write measured task latencies into the tables where a layer's grid holds that task; returns
        how many entries changed."""
        self.measured.update(measured)
        if self.kind == "flops":
            return 0
        changed = 0
        for lay in self.layers:
            for a, i in enumerate(lay.gi):
                for b, o in enumerate(lay.go):
                    t = resized(lay.node.task, int(i), int(o))
                    if t in measured:
                        lay.table[a, b] = measured[t]
                        changed += 1
        return changed

    def of_layer(self, name: str, kappa: Mapping[int, Any]) -> Any:
        """One anchor's latency at (relaxed) counts ``kappa``, differentiable in them; KeyError for a layer
        whose channels never change (not tabulated: its latency is its full task's, ``value(node.task)``)."""
        for lay in self.layers:
            if lay.node.name == name:
                return interp2(lay.table, lay.gi, lay.go, *lay.extents(kappa))
        raise KeyError(name)

    def total(self, kappa: Mapping[int, Any]) -> Any:
        """Sum of the layers' latencies at relaxed counts ``kappa`` (group root -> channels)."""
        out = 0.0
        for lay in self.layers:
            ci, co = lay.extents(kappa)
            out = out + interp2(lay.table, lay.gi, lay.go, ci, co)
        return out


class _CostModelPredictor:
    """Predicted seconds of a task at its best known schedule: ``exp(-score)`` of the learned model
    (trained on every record of the database given), the best over the sketches' defaults."""

    def __init__(self, target: Target, measured: Mapping[Task, float], model: Any = None):
        from felixjax.model import OnlineCostModel

        self.target = target
        self.model = model or OnlineCostModel(target)
        self.cache: dict[Task, float] = {}

    def __call__(self, task: Task) -> float:
        if task not in self.cache:
            spaces = spaces_for(task, self.target)
            try:
                scorer = self.model.scorer(spaces)
                configs = [s.default() for s in spaces.values()]
                self.cache[task] = float(np.min(np.exp(-scorer.score(configs))))
            except ValueError:  # a sketch whose default does not lower at this extent: score the others
                best = []
                for name, space in spaces.items():
                    try:
                        best.append(float(np.exp(-self.model.scorer({name: space}).score([space.default()]))[0]))
                    except ValueError:
                        continue
                if not best:
                    raise
                self.cache[task] = min(best)
        return self.cache[task]


@dataclass(frozen=True)
class Relaxed:
    """The relaxed knobs: one unconstrained coordinate per prunable group."""

    roots: tuple[int, ...]
    sizes: tuple[int, ...]
    lows: tuple[int, ...]

    def kappa(self, theta: Any) -> dict[int, Any]:
        s = jax.nn.sigmoid(theta)
        return {g: lo + (n - lo) * s[k] for k, (g, n, lo) in enumerate(zip(self.roots, self.sizes, self.lows))}

    def theta_of(self, keep: Mapping[int, float]) -> np.ndarray:
        out = []
        for g, n, lo in zip(self.roots, self.sizes, self.lows):
            f = (float(keep.get(g, n)) - lo) / max(n - lo, 1e-9)
            f = min(max(f, 0.02), 0.9)  # off the sigmoid's flat end, so a few steps move it
            out.append(math.log(f / (1 - f)))
        return np.asarray(out, np.float32)


@dataclass(frozen=True)
class RelaxedFormats:
    """The relaxed format knob (module docstring): a layer with ``K`` formats (the reference first) has
    ``K - 1`` unconstrained logits, the reference's fixed at 0; its shares are their softmax (for
    ``K = 2``: ``(1 - q, q)``, ``q = sigmoid(phi)``, the int8 share of earlier versions)."""

    #: layer -> its formats, the reference ``("float32", 0.0)`` first
    #: (:func:`~felixjax.approx.formats.eligible_formats`)
    formats: Mapping[str, tuple[Format, ...]]
    #: seconds at relaxed counts and shares (:meth:`felixjax.approx.precision.FormatLatency.relaxed`)
    latency: Callable[[Mapping[int, Any], Mapping[str, Any]], Any]
    #: int8 layer -> its input's uint8 ``(scale, zero point)`` (calibrated on the given data)
    qparams: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    #: ``(layer, sparsity)`` -> the fixed 0/1 mask of its weights (:func:`~felixjax.approx.formats.weight_masks`)
    masks: Mapping[tuple[str, float], Any] = field(default_factory=dict)
    #: layer -> its format in the start point (share 0.9, the others share 0.1 between them)
    start: Mapping[str, Format] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.formats))

    @property
    def size(self) -> int:
        """How many logits (``params["q"]``): one per non-reference format of each layer."""
        return sum(len(self.formats[n]) - 1 for n in self.names)

    def shares(self, phi: Any) -> dict[str, Any]:
        """``{layer: shares over its formats}`` (vectors summing to 1) of the logits ``phi``."""
        out, o = {}, 0
        for n in self.names:
            k = len(self.formats[n]) - 1
            if k == 1:  # the sigmoid, as the int8 share always was
                s = jax.nn.sigmoid(phi[o])
                out[n] = jnp.stack([1 - s, s])
            else:
                out[n] = jax.nn.softmax(jnp.concatenate([jnp.zeros(1, phi.dtype), phi[o: o + k]]))
            o += k
        return out

    def theta_of(self) -> np.ndarray:
        """The start logits: share 0.9 on each layer's start format (default the reference)."""
        out = []
        for n in self.names:
            fmts = self.formats[n]
            j = fmts.index(self.start[n]) if self.start.get(n) in fmts else 0
            big = math.log(9.0 * (len(fmts) - 1))
            out += [(big if k == j else 0.0) if j else -big for k in range(1, len(fmts))]
        return np.asarray(out, np.float32)

    phi_of = theta_of

    def inputs(self, shares: Mapping[str, Any]) -> Callable[[Node, list], list]:
        """An ``anchor_inputs`` hook: a layer's inputs as ``sum_k share_k T_k(inputs)``, ``T_k`` the
        arithmetic of format ``k`` (:func:`~felixjax.approx.formats.transform`: int8 and float16
        roundings through a straight-through estimator, a sparse level's fixed weight mask as a plain
        product), so ``d quality / d share_k`` is the effect of that format on the layer."""
        def hook(node: Node, args: list) -> list:
            fmts = self.formats.get(node.name)
            if fmts is None:
                return args
            outs = [transform(node.task, args, f, qparams=self.qparams.get(node.name),
                              mask=self.masks.get((node.name, f[1]))) for f in fmts]
            p = shares[node.name]
            return mix(args, outs, [p[k] for k in range(len(fmts))])
        return hook


def RelaxedPrecision(qparams: Mapping[str, tuple[float, int]], latency: Callable, start: frozenset = frozenset()
                     ) -> RelaxedFormats:
    """The int8 / float32 case of :class:`RelaxedFormats` (the name of earlier versions): every layer of
    ``qparams`` may run at int8, those in ``start`` start there."""
    return RelaxedFormats({n: (REFERENCE, INT8) for n in qparams}, latency, dict(qparams),
                          start={n: INT8 for n in start})


def round_formats(formats: Mapping[str, tuple[Format, ...]], shares: Mapping[str, Any]) -> dict[str, Format]:
    """The format a relaxed point gives each layer: its largest share (a tie goes to the later format,
    so an int8 share of exactly 0.5 rounds to int8 as :func:`round_precisions`); returns the layers not
    at the reference.

    Example:
        >>> f = (("float32", 0.0), ("int8", 0.0), ("float32", 0.5))
        >>> round_formats({"a": f, "b": f}, {"a": [0.2, 0.3, 0.5], "b": [0.6, 0.3, 0.1]})
        {'a': ('float32', 0.5)}
    """
    out = {}
    for n, fmts in formats.items():
        p = [float(v) for v in shares[n]]
        k = max(range(len(fmts)), key=lambda i: (p[i], i))
        if fmts[k] != REFERENCE:
            out[n] = fmts[k]
    return out


def round_precisions(shares: Mapping[str, float]) -> frozenset:
    """The layers a relaxed point puts at int8: int8 share >= 0.5 (the others float32).

    Example:
        >>> sorted(round_precisions({"a": 0.7, "b": 0.2, "c": 0.5}))
        ['a', 'c']
    """
    return frozenset(n for n, q in shares.items() if float(q) >= 0.5)


def objective(graph: Graph, groups: Groups, table: LatencyTable, *, metric: str, lam: float, multiple: int = 8,
              precision: RelaxedFormats | None = None, output: str | None = None
              ) -> tuple[Callable, Relaxed, float]:
    """``(loss, channel relaxation, full latency)`` of :func:`descend`: ``loss(params, xb, yb, rb) ->
    (value, (latency, quality))`` over ``params = {"c": channel coordinates, "q": format logits}``
    (``"q"`` empty without ``precision``, :attr:`RelaxedFormats.size` long with it); the latency is relative
    to the float32 full-size network's. The quality is that of ``output`` (default: the first output)."""
    roots = tuple(groups.prunable())
    sizes = tuple(groups.size(g) for g in roots)
    relaxed = Relaxed(roots, sizes, tuple(min(n, multiple) for n in sizes))
    name, outname = graph.inputs[0], output or graph.outputs[0]
    lat_full = float(table.total({g: float(n) for g, n in zip(roots, sizes)}))

    def outputs(params: Any, xb: Any) -> Any:
        kappa = relaxed.kappa(params["c"])
        masks = {g: soft_mask(kappa[g], n, tau=max(0.5, n / 64)) for g, n in zip(roots, sizes)}
        anchor_inputs = precision.inputs(precision.shares(params["q"])) if precision is not None else None

        def hook(v: str, val: Any) -> Any:
            lay = groups.layouts.get(v)
            if lay is None:
                return val
            m = mask_vector(groups, lay, masks, jnp)
            return val * m.reshape((1, -1) + (1,) * (val.ndim - 2))

        one = lambda xi: executor.run(graph, {name: xi}, value_hook=hook, anchor_inputs=anchor_inputs)[outname]
        return jax.vmap(one)(xb)

    def loss(params: Any, xb: Any, yb: Any, rb: Any) -> tuple[Any, tuple]:
        kappa = relaxed.kappa(params["c"])
        sec = (table.total(kappa) if precision is None
               else precision.latency(kappa, precision.shares(params["q"])))
        lat = sec / lat_full
        q = surrogate(outputs(params, xb), metric, labels=yb, reference=rb)
        return lat + lam * q, (lat, q)

    return loss, relaxed, lat_full


def descend(graph: Graph, groups: Groups, table: LatencyTable, x: np.ndarray, *, metric: str,
            labels: np.ndarray | None, reference: np.ndarray | None, lam: float, start: Mapping[int, float],
            steps: int = 60, lr: float = 0.25, batch: int = 64, seed: int = 0, multiple: int = 8,
            precision: RelaxedFormats | None = None, output: str | None = None
            ) -> tuple[dict[int, float], dict]:
    """Minimize ``latency / latency_full + lam * (quality surrogate - its value at full size)`` over the
    groups' relaxed channel counts (and, with ``precision``, the layers' format shares) with optax Adam;
    returns the relaxed counts and a trace (``"format_share"``: ``{layer: shares over its formats}``, round
    them with :func:`round_formats`; ``"int8_share"``: the int8 share of each int8-capable layer)."""
    loss, relaxed, lat_full = objective(graph, groups, table, metric=metric, lam=lam, multiple=multiple,
                                        precision=precision, output=output)
    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    opt = optax.adam(lr)
    params = {"c": jnp.asarray(relaxed.theta_of(start)),
              "q": jnp.asarray(precision.theta_of() if precision is not None else np.zeros(0, np.float32))}
    state = opt.init(params)
    rng = np.random.default_rng(seed)
    trace, last = [], np.zeros(len(relaxed.roots))
    dummy_y = np.zeros(len(x), np.int64) if labels is None else labels
    dummy_r = np.zeros((len(x), 1), np.float32) if reference is None else reference
    for step in range(steps):
        idx = rng.choice(len(x), size=min(batch, len(x)), replace=False)
        (val, (lat, q)), gr = grad(params, x[idx], dummy_y[idx], dummy_r[idx])
        upd, state = opt.update(gr, state)
        last = np.asarray(gr["c"])
        params = optax.apply_updates(params, upd)
        trace.append((float(val), float(lat), float(q)))
    kappa = {g: float(v) for g, v in relaxed.kappa(params["c"]).items()}
    shares = ({n: tuple(float(v) for v in np.asarray(p)) for n, p in precision.shares(params["q"]).items()}
              if precision is not None else {})
    int8 = {n: p[precision.formats[n].index(INT8)] for n, p in shares.items() if INT8 in precision.formats[n]}
    return kappa, {"trace": trace, "grad": dict(zip(relaxed.roots, last.tolist())), "lat_full": lat_full,
                   "int8_share": int8, "format_share": shares}


def finetune(graph: Graph, x: np.ndarray, *, metric: str, labels: np.ndarray | None,
             reference: np.ndarray | None, steps: int = 30, lr: float = 1e-3, batch: int = 64,
             seed: int = 0, output: str | None = None) -> Graph:
    """A short fine-tune of the anchors' weights and biases (Adam on the quality surrogate of ``output``, default
    the first output, in JAX); returns the graph with the new constants."""
    names = sorted({i for n in graph.nodes if n.is_anchor for i in n.inputs[1:3] if i in graph.constants})
    params = {k: jnp.asarray(graph.constants[k]) for k in names}
    name, outname = graph.inputs[0], output or graph.outputs[0]
    dummy_y = np.zeros(len(x), np.int64) if labels is None else labels
    dummy_r = np.zeros((len(x), 1), np.float32) if reference is None else reference

    def loss(p: Any, xb: Any, yb: Any, rb: Any) -> Any:
        out = jax.vmap(lambda xi: executor.run(graph, {name: xi}, weights=p)[outname])(xb)
        return surrogate(out, metric, labels=yb, reference=rb)

    step = jax.jit(jax.value_and_grad(loss))
    opt = optax.adam(lr)
    state = opt.init(params)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = rng.choice(len(x), size=min(batch, len(x)), replace=False)
        _, g = step(params, x[idx], dummy_y[idx], dummy_r[idx])
        upd, state = opt.update(g, state)
        params = optax.apply_updates(params, upd)
    consts = dict(graph.constants)
    consts.update({k: np.asarray(v, np.float32) for k, v in params.items()})
    return graph.replace(constants=consts)
