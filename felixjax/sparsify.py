"""Sparse layers of an imported network (issue 16): run a conv / dense / matmul layer whose weights
are mostly zeros as a sparse task (:mod:`codegen.sparse`). Off by default: a model's layers are dense
tasks unless :func:`sparsify` marks them.

``measure=True`` keeps a layer dense where its default dense kernel ran faster than its default sparse one
(timed here, interleaved): at 50% zeros that is most layers.

The sparse task holds the layer's zero fraction only (rounded down to ``decimals``); tuning measures
kernels built for ``task.random_inputs`` (the same fraction, a random pattern), and
:func:`felixjax.network_build.graph_to_spec` regenerates each sparse layer's kernel for the layer's
real weights (:func:`codegen.sparse_lower.with_weights`), so two layers of one task keep their own.

Example:
    >>> import felixjax as fj
    >>> m = fj.load_onnx(fj.zoo.make_model("transformer_block", seq=8, dim=32, heads=2))
    >>> [t.sparsity for t, _ in sparsify(m, min_sparsity=0.5).tasks]   # random dense weights: nothing marked
    [0.0, 0.0, 0.0, 0.0]
"""
from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import replace
from typing import Any

import numpy as np

from .graph_passes import Graph, Node
from .onnx_import import Model


def zero_fraction(weights: np.ndarray) -> float:
    """The fraction of exact zeros in ``weights``.

    Example:
        >>> zero_fraction(np.array([0.0, 1.0, 0.0, 2.0]))
        0.5
    """
    w = np.asarray(weights)
    return float((w == 0).sum()) / max(1, w.size)


def _layer_weights(graph: Graph, node: Node) -> np.ndarray | None:
    """The constant weight tensor of an anchor node in its task's API shape, or None (not a constant)."""
    name = node.inputs[1] if len(node.inputs) > 1 else ""
    if name not in graph.constants:
        return None
    w = np.asarray(graph.constants[name], dtype=np.float32)
    shape = node.task.input_shapes()[1]
    return w.reshape(shape) if w.size == math.prod(shape) else None


def layer_weights(graph: Graph, node: Node) -> np.ndarray:
    """The weights a sparse layer's kernel is built for (its constant, in the task's weight shape)."""
    w = _layer_weights(graph, node)
    if w is None:
        raise ValueError(f"layer {node.name!r}: a sparse task needs constant weights")
    return w


def _keep_faster(g: Graph, nodes: list[Node], target: Any, threads: int | None, rounds: int) -> list[Node]:
    """``nodes`` with each sparse layer made dense again where its dense default kernel ran faster."""
    from codegen.measure import LocalRunner
    from codegen.spaces import default_config
    from codegen.target import Target

    from .measurer import Measurer

    target = Target.parse(target)
    if target.is_gpu:
        raise ValueError(f"sparsify(measure=True) times CPU kernels; on {target.kind} a sparse task builds as its "
                         f"dense CUDA sketch anyway")
    pairs = {n.task: o.task for n, o in zip(nodes, g.nodes) if n.is_anchor and n.task.sparsity and n is not o}
    if not pairs:
        return nodes
    times: dict = {}
    with LocalRunner() as runner:
        for sparse, dense in pairs.items():
            arms = [(t, Measurer(t, target, runner, threads=threads), default_config(t, target))
                    for t in (dense, sparse)]
            got: list[list[float]] = [[], []]
            for _ in range(max(1, int(rounds))):
                for i, (_, m, cfg) in enumerate(arms):
                    res = []
                    m.measure([cfg], lambda c, r, res=res: res.append(r) or True)
                    if res and res[0].ok:
                        got[i].append(res[0].latency_s)
            times[sparse] = tuple(statistics.median(t) if t else math.inf for t in got)
    slower, out = [], []
    for n, o in zip(nodes, g.nodes):
        if n.is_anchor and n.task in times and times[n.task][1] >= times[n.task][0]:
            d, s = (f"{t * 1e3:.4g} ms" if math.isfinite(t) else "no clean timing" for t in times[n.task])
            slower.append(f"{n.name} ({n.task.sparsity:.0%} zeros: sparse {s}, dense {d})")
            n = o
        out.append(n)
    if slower:
        warnings.warn(f"sparsify: {len(slower)} layer(s) stay dense, their dense kernel ran faster (default "
                      f"schedules): {'; '.join(slower[:5])}{' ...' if len(slower) > 5 else ''}", RuntimeWarning,
                      stacklevel=3)
    return out


def sparsify(model: Model, *, min_sparsity: float = 0.5, decimals: int = 2, measure: bool = False,
             target: Any = None, threads: int | None = None, rounds: int = 3) -> Model:
    """A copy of ``model`` whose anchor layers (conv2d with groups 1, dense, matmul without batch) with
    constant weights of at least ``min_sparsity`` zeros are sparse tasks.

    A layer sparse enough but of a kind without sparse kernels (a grouped or depthwise conv, a conv in the
    channel-blocked layout, a batched matmul, low precision) stays dense, named in one ``RuntimeWarning``.
    ``measure=True`` also times each such layer's default sparse kernel against its default dense kernel on
    ``target`` (this CPU by default; ``threads`` per kernel, default all its cores), interleaved, ``rounds``
    times, and keeps it dense where the dense kernel ran faster (at 50% zeros it usually does), named in a
    ``RuntimeWarning`` with both medians. Kernels are timed with random weights of the layer's zero fraction.

    Raises:
        ValueError: ``min_sparsity`` outside (0, 1).
    """
    if not 0.0 < float(min_sparsity) < 1.0:
        raise ValueError(f"min_sparsity must be in (0, 1), got {min_sparsity!r}")
    g = model.graph
    nodes, dense = [], []
    for node in g.nodes:
        if node.is_anchor and not node.task.sparsity:
            w = _layer_weights(g, node)
            frac = zero_fraction(w) if w is not None else 0.0
            if frac >= min_sparsity:
                s = math.floor(frac * 10 ** decimals) / 10 ** decimals
                try:
                    task = replace(node.task, sparsity=min(s, 1.0 - 10 ** -decimals))
                except ValueError as e:  # not a sparse kind (grouped conv, batched matmul, low precision)
                    task, why = None, str(e)
                if task is not None:
                    node = replace(node, attrs={**node.attrs, "task": task})
                else:
                    dense.append(f"{node.name} ({frac:.0%} zeros: {why})")
        nodes.append(node)
    if measure:
        nodes = _keep_faster(g, nodes, target, threads, rounds)
    if dense:  # a review (session 77): these stayed dense without a word
        warnings.warn(f"sparsify: {len(dense)} layer(s) with at least {min_sparsity:g} zero weights stay dense, "
                      f"no sparse kernel for their kind: {'; '.join(dense[:5])}{' ...' if len(dense) > 5 else ''}",
                      RuntimeWarning, stacklevel=2)
    return replace(model, graph=replace(g, nodes=tuple(nodes)))
