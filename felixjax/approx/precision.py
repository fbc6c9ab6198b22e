"""Layer formats as a per-layer knob of :func:`felixjax.approximate`: precision
(``precisions=("float32", "int8")``, ``"float16"`` where the build takes it) and unstructured sparsity
(``sparsities=(0.5, 0.9)``); the formats themselves are :mod:`felixjax.approx.formats`.

* which layers: every conv / dense / matmul anchor with constant weights, for each format whose kernel
  exists for it (:func:`felixjax.quantize.int8_task`; sparse kernels: conv2d groups 1, dense, matmul
  without batch, float32 only);
* latency (:class:`FormatLatency`): a layer in format ``k`` costs its float32 entry of the channel tables
  times ``ratio_k``, the ratio of its task in that format and its float32 task at full size. Measured:
  before the descent the network with every eligible layer in format ``k`` (all-int8, all-float16, all
  sparse at level ``s``: weights masked by magnitude, tasks marked sparse) is tuned, built and profiled
  layer by layer, and its kernels' latencies go into the tables; the cost model's prediction before
  that. The ratio is assumed to hold at pruned extents. With ``latency="flops"`` every format counts
  its float32 twin's FLOPs: the proxy never sees a reason to change a layer's format;
* quality: the format's arithmetic in the JAX executor (:func:`felixjax.approx.formats.transform`: fake
  quantization with each int8 layer's input range calibrated on the given data, float16 rounding, the
  fixed magnitude mask of a sparse layer's weights);
* choice: the descent of :mod:`felixjax.approx.objective` relaxes each layer's format to shares
  (latency :meth:`FormatLatency.relaxed`, quality through the share-weighted mix of the formats'
  inputs) and rounds them; beside it, :func:`assign` is a greedy pass for a given channel
  configuration: (layer, format) moves by latency saving while the quality on the given data (channel
  masks and formats together) stays at or above a floor.

Every configuration chosen this way is then built (:func:`with_formats`: the sparse layers masked and
marked on the pruned network, the int8 ones calibrated on it) and measured: real latency, real quality.
The measured ratios decide: on an AVX2 CPU a sparse kernel at 50% zeros is usually slower than the
dense one (and float16 kernels widen what they load), so those formats are usually rejected by the
tables, not by a rule.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..onnx_import import Model
from ..quantize import int8_task, with_precisions
from . import executor
from .formats import INT8, REFERENCE, Format, format_task, sparse_layers
from .objective import LatencyTable


def eligible(model: Model) -> list[str]:
    """The anchors of ``model`` that can be built at int8 (constant weights, a task with an int8 twin)."""
    out = []
    for n in model.graph.nodes:
        if n.is_anchor and n.inputs[1] in model.graph.constants:
            try:
                int8_task(n.task)
            except ValueError:
                continue
            out.append(n.name)
    return out


def calibrate_ranges(model: Model, x: np.ndarray, names: Iterable[str], *, chunk: int = 256
                     ) -> dict[str, tuple[float, float]]:
    """``{anchor: (min, max)}`` of each named anchor's data input over the samples ``x`` (float32 run)."""
    import jax
    import jax.numpy as jnp

    g, want = model.graph, set(names)
    inp = g.inputs[0]

    def one(xi: Any) -> dict:
        seen: dict[str, Any] = {}

        def hook(node: Any, args: list) -> list:
            if node.name in want:
                seen[node.name] = jnp.stack([jnp.min(args[0]), jnp.max(args[0])])
            return args
        executor.run(g, {inp: xi}, anchor_inputs=hook)
        return seen

    f = jax.jit(jax.vmap(one))
    parts = [f(x[i: i + chunk]) for i in range(0, len(x), chunk)]
    return {n: (float(min(np.min(p[n][:, 0]) for p in parts)), float(max(np.max(p[n][:, 1]) for p in parts)))
            for n in want}


def with_formats(model: Model, chosen: Mapping[str, Format], x: np.ndarray) -> Model:
    """``model`` with each layer of ``chosen`` in its format: the sparse ones masked and marked first
    (:func:`~felixjax.approx.formats.sparse_layers`), then the int8 / float16 ones through
    :func:`felixjax.quantize.with_precisions`, the int8 inputs calibrated on ``x`` on the masked network
    (what the int8 layers will see)."""
    model = sparse_layers(model, {n: s for n, (_, s) in chosen.items() if s})
    low = {n: p for n, (p, s) in chosen.items() if p != "float32" and not s}
    if not low:
        return model
    int8 = sorted(n for n, p in low.items() if p == "int8")
    return with_precisions(model, low, calibrate_ranges(model, x, int8) if int8 else {})


def quantized(model: Model, int8: Iterable[str], x: np.ndarray) -> Model:
    """``model`` with the layers ``int8`` at int8, calibrated on ``x`` (on this model's own graph)."""
    return with_formats(model, {n: INT8 for n in int8}, x)


class FormatLatency:
    """Latency of a configuration ``(keep, {layer: format})`` from the channel tables (module docstring).

    ``formats``: ``{layer: its formats, the reference first}`` (:func:`~felixjax.approx.formats.eligible_formats`)."""

    def __init__(self, model: Model, table: LatencyTable, formats: Mapping[str, Sequence[Format]], *,
                 profiled: Mapping[Any, float] | None = None):
        self.table = table
        self.formats = {n: tuple(f) for n, f in formats.items()}
        self.tasks = {n.name: n.task for n in model.graph.nodes if n.name in self.formats}  # graph order
        self.profiled = dict(profiled or {})  # task -> seconds inside a built network (both sides of a ratio)

    def ratio(self, name: str, fmt: Format = INT8) -> float:
        """Seconds of a layer in ``fmt`` over its float32 seconds, at full size: both profiled inside built
        networks where ``profiled`` has them (like with like: the tables hold float32 kernels timed alone,
        which made every format look 1.4-26x slower), else the tables (measured where known, else the cost
        model; FLOPs under ``latency="flops"``, where every format counts the same)."""
        t = self.tasks[name]
        ft = format_task(t, fmt)
        if self.table.kind != "flops" and ft in self.profiled and t in self.profiled:
            return self.profiled[ft] / max(self.profiled[t], 1e-30)
        return self.table.value(ft) / max(self.table.value(t), 1e-30)

    def layer(self, name: str, keep: Mapping[int, Any]) -> Any:
        """float32 seconds of a layer at (relaxed) counts ``keep``, differentiable in them."""
        try:
            return self.table.of_layer(name, keep)
        except KeyError:
            return self.table.value(self.tasks[name])

    def saving(self, name: str, keep: Mapping[int, float], fmt: Format = INT8) -> float:
        """Seconds a layer saves in ``fmt`` under ``keep`` (negative: that format is slower there)."""
        return float((1.0 - self.ratio(name, fmt)) * self.layer(name, keep))

    def relaxed(self, kappa: Mapping[int, Any], share: Mapping[str, Any]) -> Any:
        """Seconds at relaxed counts ``kappa`` with layer ``n``'s formats at shares ``share[n]`` (a vector
        over ``formats[n]`` summing to 1; a scalar: the int8 share of an int8 / float32 layer): each
        layer ``sum_k share_k ratio_k lat_fp32(channels)``, written as the float32 total less each
        format's saving (differentiable in counts and shares; the descent's latency,
        :class:`~felixjax.approx.objective.RelaxedFormats`)."""
        out = self.table.total(kappa)
        for n, q in share.items():
            if np.ndim(q) == 0:
                out = out - q * (1.0 - self.ratio(n, INT8)) * self.layer(n, kappa)
                continue
            for k, fmt in enumerate(self.formats[n][1:], start=1):
                out = out - q[k] * (1.0 - self.ratio(n, fmt)) * self.layer(n, kappa)
        return out

    def total(self, keep: Mapping[int, float], chosen: Mapping[str, Format] | Iterable[str] = ()) -> float:
        """Seconds of a rounded configuration (``chosen``: ``{layer: format}``, or the int8 layers)."""
        chosen = chosen if isinstance(chosen, Mapping) else {n: INT8 for n in chosen}
        out = self.table.total(keep)
        for n, fmt in chosen.items():
            if fmt != REFERENCE:
                out = out - (1.0 - self.ratio(n, fmt)) * self.layer(n, keep)
        return float(out)


class PrecisionLatency(FormatLatency):
    """:class:`FormatLatency` of int8 / float32 layers (``names``: the int8-capable ones)."""

    def __init__(self, model: Model, table: LatencyTable, names: Iterable[str]):
        super().__init__(model, table, {n: (REFERENCE, INT8) for n in names})


def assign(keep: Mapping[int, int], floor: float, *, latency: FormatLatency,
           quality: Callable[[Mapping[int, int], Mapping[str, Format]], float]) -> dict[str, Format]:
    """The layers' formats for a channel configuration: greedily by latency saving (largest first over
    every (layer, format) the tables say pays), each kept while ``quality(keep, formats) >= floor``;
    a layer whose best format breaks the floor may still take its next one. Returns the non-reference
    layers."""
    k = {g: float(n) for g, n in keep.items()}
    moves = [(n, f) for n in latency.tasks for f in latency.formats[n][1:] if latency.saving(n, k, f) > 0]
    moves.sort(key=lambda m: -latency.saving(m[0], k, m[1]))
    cur: dict[str, Format] = {}
    for n, f in moves:
        if n not in cur and quality(keep, {**cur, n: f}) >= floor:
            cur[n] = f
    return cur
