"""Precision as a per-layer knob of :func:`felixjax.approximate` (``precisions=("float32", "int8")``).

* which layers: every conv / dense / matmul anchor the int8 build takes (:func:`felixjax.quantize.int8_task`);
* latency: a layer at int8 costs its float32 entry of the channel tables times the ratio of its int8 and
  float32 tasks at full size (measured once the all-int8 network is built and profiled, the cost model
  before), so channel counts and precision are priced by the same tables (with ``latency="flops"`` both
  tasks count the same FLOPs: the proxy does not see dtype, so it never puts a layer at int8);
* quality: fake quantization in the JAX executor (:func:`felixjax.quantize.fake_quant_inputs`, the
  arithmetic of the int8 kernels in float), with each layer's input range calibrated on the given data;
* choice: the descent of :mod:`felixjax.approx.objective` relaxes each layer's precision to an int8 share
  (latency :meth:`PrecisionLatency.relaxed`, quality through relaxed fake quantization) and rounds it;
  beside it, :func:`assign` is a greedy pass for a given channel configuration: layers go to int8 by their
  latency saving while the quality on the given data (channel masks and fake quantization together)
  stays at or above a floor.

Every configuration chosen this way is then built (the calibration redone on the pruned network, the
int8 layers quantized at load) and measured: real latency, real quality.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ..onnx_import import Model
from ..quantize import int8_task, with_precisions
from . import executor
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


def quantized(model: Model, int8: Iterable[str], x: np.ndarray) -> Model:
    """``model`` with the layers ``int8`` at int8, calibrated on ``x`` (on this model's own graph)."""
    int8 = sorted(int8)
    if not int8:
        return model
    return with_precisions(model, {n: "int8" for n in int8}, calibrate_ranges(model, x, int8))


class PrecisionLatency:
    """Latency of a configuration ``(keep, int8 layers)`` from the channel tables (module docstring)."""

    def __init__(self, model: Model, table: LatencyTable, names: Iterable[str]):
        self.table = table
        self.tasks = {n.name: n.task for n in model.graph.nodes if n.name in set(names)}

    def ratio(self, name: str) -> float:
        """int8 / float32 seconds of a layer at full size (measured where known, else the cost model)."""
        t = self.tasks[name]
        return self.table.value(int8_task(t)) / max(self.table.value(t), 1e-30)

    def layer(self, name: str, keep: Mapping[int, Any]) -> Any:
        """float32 seconds of a layer at (relaxed) counts ``keep``, differentiable in them."""
        try:
            return self.table.of_layer(name, keep)
        except KeyError:
            return self.table.value(self.tasks[name])

    def saving(self, name: str, keep: Mapping[int, float]) -> float:
        """Seconds a layer saves at int8 under ``keep`` (negative: int8 is slower there)."""
        return float((1.0 - self.ratio(name)) * self.layer(name, keep))

    def relaxed(self, kappa: Mapping[int, Any], share: Mapping[str, Any]) -> Any:
        """Seconds at relaxed counts ``kappa`` with layer ``n`` at int8 share ``share[n]`` in [0, 1]: each
        layer ``(1 - q) lat_fp32(channels) + q lat_int8(channels)`` with ``lat_int8 = ratio * lat_fp32``
        (differentiable in both; the descent's latency, :class:`~felixjax.approx.objective.RelaxedPrecision`)."""
        out = self.table.total(kappa)
        for n, q in share.items():
            out = out - q * (1.0 - self.ratio(n)) * self.layer(n, kappa)
        return out

    def total(self, keep: Mapping[int, float], int8: Iterable[str] = ()) -> float:
        """Seconds of a rounded configuration: :meth:`relaxed` at shares 0 / 1."""
        return float(self.relaxed(keep, {n: 1.0 for n in int8}))


def assign(keep: Mapping[int, int], floor: float, *, latency: PrecisionLatency,
           quality: Callable[[Mapping[int, int], frozenset], float]) -> frozenset:
    """The int8 layers for a channel configuration: greedily by latency saving (largest first, only
    those the tables say pay), each kept while ``quality(keep, int8) >= floor``."""
    k = {g: float(n) for g, n in keep.items()}
    order = sorted((n for n in latency.tasks if latency.saving(n, k) > 0), key=lambda n: -latency.saving(n, k))
    cur: frozenset = frozenset()
    for n in order:
        if quality(keep, cur | {n}) >= floor:
            cur = cur | {n}
    return cur
