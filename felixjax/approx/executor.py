"""A JAX executor of the fused graph (stage ② output): the quality side of approximation, differentiable.

Every op here has the semantics of ``felixjax.graph_passes.evaluate`` (the numpy executor the C build is
checked against). :data:`JAX_OPS` is the op table: the ops of ``felixjax.op_table`` (written once for
both executors) bound to ``jax.numpy``, plus ``Conv`` (``lax.conv_general_dilated``; numpy runs
``Task.reference``) and the fused anchors; :func:`drift_report` runs every op
of the table through both executors on random inputs, so a change to one that the other does not follow
fails ``tests/test_approx.py`` (the two cannot drift silently). An op outside the table is a clear error.

Hooks make the same graph run approximated: ``weights`` replaces constants (pruned or fine-tuned
weights), ``anchor_inputs(node, args)`` rewrites an anchor's inputs (fake quantization, magnitude
masks) and ``value_hook(name, value)`` rewrites every produced value (soft channel masks).

Example:
    >>> import numpy as np
    >>> from felixjax.graph_passes import Graph, Node
    >>> g = Graph((Node("Relu", ("x",), ("y",)),), ("x",), ("y",), {"x": (2,), "y": (2,)}, {})
    >>> np.asarray(run(g, {"x": np.array([-1.0, 2.0], np.float32)})["y"]).tolist()
    [0.0, 2.0]
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from felixjax import op_table
from felixjax.graph_passes import Graph, Node

Args = Sequence[Any]


def _act(y: Any, act: str | None) -> Any:
    if act == "relu":
        return jnp.maximum(y, 0.0)
    if act == "relu6":
        return jnp.clip(y, 0.0, 6.0)
    return y


def conv(x: Any, w: Any, *, stride: Sequence[int], pad: Sequence[int], dilation: Sequence[int],
         groups: int) -> Any:
    """NCHW x OIHW convolution; ``pad`` is (top, left, bottom, right) as in ``codegen.ops``."""
    pt, pl, pb, pr = pad
    return jax.lax.conv_general_dilated(x, w, tuple(stride), ((pt, pb), (pl, pr)), rhs_dilation=tuple(dilation),
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
                                        precision=jax.lax.Precision.HIGHEST)


def anchor(node: Node, args: Args) -> Any:
    """An anchor (``conv2d`` / ``dense`` / ``matmul``) with its fused epilogue, as ``Task.reference``."""
    task = node.task
    shapes = task.input_shapes()
    x, w = jnp.reshape(args[0], shapes[0]), jnp.reshape(args[1], shapes[1])
    p = task.p
    hi = jax.lax.Precision.HIGHEST
    if task.op == "conv2d":
        y = conv(x, w, stride=p["stride"], pad=p["pad"], dilation=p["dilation"], groups=p["groups"])
    elif task.op == "dense":
        y = jnp.matmul(x, w.T, precision=hi)
    else:
        y = jnp.matmul(x, w, precision=hi)
    rest = list(args[2:])
    if task.bias:
        b = jnp.reshape(rest.pop(0), shapes[2])
        y = y + (b.reshape(1, -1, 1, 1) if task.op == "conv2d" else b)
    if task.residual:
        y = y + jnp.reshape(rest.pop(0), y.shape)
    return _act(y, task.act)


def _channel(v: Any, rank: int) -> Any:
    return jnp.reshape(v, (1, -1) + (1,) * (rank - 2))


#: op -> ``(attrs, args, out_shapes) -> outputs``; anchors are handled by :func:`anchor`. Every op but
#: ``Conv`` is ``felixjax.op_table``'s, written once for numpy and JAX.
JAX_OPS: dict[str, Callable[[Mapping[str, Any], Args, Sequence[Sequence[int]]], list]] = {
    **{op: functools.partial(f, jnp) for op, f in op_table.OPS.items()},
    "Conv": lambda a, args, s: [conv(args[0], args[1], stride=a["strides"], pad=a["pads"], dilation=a["dilations"],
                                     groups=a["groups"])
                                + (0 if len(args) < 3 or args[2] is None else _channel(args[2], 4))],
}


def supported(graph: Graph) -> list[str]:
    """The ops of ``graph`` this executor cannot run (empty: it runs the whole graph)."""
    return sorted({n.op for n in graph.nodes if not n.is_anchor and n.op not in JAX_OPS}
                  | {n.task.op for n in graph.nodes if n.is_anchor and n.task.op not in ("conv2d", "dense", "matmul")})


def check_supported(graph: Graph) -> None:
    """Raise a clear ValueError naming the ops outside :data:`JAX_OPS`."""
    missing = supported(graph)
    if missing:
        raise ValueError(f"the JAX quality executor does not run {', '.join(missing)} yet (it runs "
                         f"{len(JAX_OPS)} ops and the conv2d / dense / matmul anchors)")


def evaluate(node: Node, args: Args, out_shapes: Sequence[Sequence[int]]) -> list:
    """JAX semantics of one canonical node (the twin of ``graph_passes.evaluate``)."""
    if node.is_anchor:
        return [jnp.reshape(anchor(node, args), out_shapes[0])]
    if node.op not in JAX_OPS:
        raise ValueError(f"node {node.name!r}: the JAX executor has no op {node.op!r}")
    return JAX_OPS[node.op](node.attrs, args, out_shapes)


def run(graph: Graph, feeds: Mapping[str, Any], *, weights: Mapping[str, Any] | None = None,
        anchor_inputs: Callable[[Node, list], list] | None = None,
        value_hook: Callable[[str, Any], Any] | None = None) -> dict[str, Any]:
    """Run ``graph`` in JAX (traceable: jit, grad and vmap go through it).

    Args:
        graph: a fused graph (``Model.graph``).
        feeds: ``{input name: array}`` of the graph's input shapes.
        weights: constants to use instead of ``graph.constants`` (same names, same shapes).
        anchor_inputs: ``(anchor node, [data, weight, ...]) -> new args`` (fake quantization, masks).
        value_hook: ``(value name, value) -> value`` applied to every node output (channel masks).

    Returns:
        ``{output name: jax array}``.
    """
    env: dict[str, Any] = dict(graph.constants)
    if weights:
        env.update(weights)
    for name in graph.inputs:
        if name not in feeds:
            raise ValueError(f"missing input {name!r}; the graph takes {list(graph.inputs)}")
        env[name] = feeds[name]
    for node in graph.nodes:
        args = [env[i] if i else None for i in node.inputs]
        if node.is_anchor and anchor_inputs is not None:
            args = anchor_inputs(node, args)
        outs = evaluate(node, args, [graph.shapes.get(o) for o in node.outputs])
        for name, value in zip(node.outputs, outs):
            if name:
                env[name] = value_hook(name, value) if value_hook is not None else value
    return {o: env[o] for o in graph.outputs}


def batched(graph: Graph, **hooks: Any) -> Callable[..., Any]:
    """``f(xs, weights=None) -> first output per sample`` over a batch (leading axis) of single-input
    samples of the graph's input shape, vmapped (the graph's own batch is usually 1)."""
    name = graph.inputs[0]
    out = graph.outputs[0]

    def one(x: Any, weights: Mapping[str, Any] | None) -> Any:
        return run(graph, {name: x}, weights=weights, **hooks)[out]

    return jax.vmap(one, in_axes=(0, None))


def drift_report(*, seed: int = 0) -> list[str]:
    """Run every op of :data:`JAX_OPS` on random inputs through both executors; the mismatches.

    Example:
        >>> drift_report()
        []
    """
    from felixjax import graph_passes

    rng = np.random.default_rng(seed)
    x4 = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    pos = (np.abs(x4) + 0.5).astype(np.float32)
    vec = rng.standard_normal((4,)).astype(np.float32)
    m2 = rng.standard_normal((3, 5)).astype(np.float32)
    pool = {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 1), "ceil_mode": 1,
            "count_include_pad": 0}
    cases: dict[str, tuple[dict, list, list]] = {
        "HardSigmoid": ({"alpha": 0.2, "beta": 0.5}, [x4], [x4.shape]),
        "LeakyRelu": ({"alpha": 0.1}, [x4], [x4.shape]), "Elu": ({"alpha": 1.0}, [x4], [x4.shape]),
        "Gelu": ({"approximate": "tanh"}, [x4], [x4.shape]),
        "PRelu": ({}, [x4, vec.reshape(1, 4, 1, 1)], [x4.shape]),
        "Clip": ({}, [x4, np.float32(-0.5), np.float32(0.5)], [x4.shape]),
        "Conv": ({"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "groups": 2},
                 [x4, rng.standard_normal((6, 2, 3, 3)).astype(np.float32), vec[:2].repeat(3)], [(1, 6, 6, 6)]),
        "Gemm": ({"alpha": 0.5, "beta": 2.0, "trans_a": 0, "trans_b": 1}, [m2, m2, m2[:, :3]], [(3, 3)]),
        "MatMul": ({}, [m2, m2.T], [(3, 3)]),
        "BatchNormalization": ({"epsilon": 1e-5}, [x4, vec, vec, vec, np.abs(vec)], [x4.shape]),
        "ScaleShift": ({}, [x4, vec, vec], [x4.shape]),
        "LayerNormalization": ({"axis": 2, "epsilon": 1e-5}, [x4, np.ones((6, 6), np.float32)], [x4.shape]),
        "ReduceMean": ({"axes": (2, 3), "keepdims": 1}, [x4], [(1, 4, 1, 1)]),
        "ReduceSum": ({"axes": (1,), "keepdims": 0}, [x4], [(1, 6, 6)]),
        "ReduceMax": ({"axes": (3,), "keepdims": 1}, [x4], [(1, 4, 6, 1)]),
        "ReduceMin": ({"axes": (1, 2), "keepdims": 0}, [x4], [(1, 6)]),
        "MaxPool": (pool, [x4], [(1, 4, 4, 4)]), "AveragePool": (pool, [x4], [(1, 4, 4, 4)]),
        "Reshape": ({"shape": (1, 144)}, [x4], [(1, 144)]), "Flatten": ({}, [x4], [(1, 144)]),
        "Transpose": ({"perm": (0, 2, 3, 1)}, [x4], [(1, 6, 6, 4)]),
        "Concat": ({"axis": 1}, [x4, x4], [(1, 8, 6, 6)]),
        "Softmax": ({"axes": (1,)}, [x4], [x4.shape]), "LogSoftmax": ({"axes": (1,)}, [x4], [x4.shape]),
        "Pad": ({"pads": ((0, 0), (0, 0), (1, -1), (2, 0))}, [x4, np.float32(0.5)], [(1, 4, 6, 8)]),
        "Slice": ({"slices": ((0, 1, 1), (1, 3, 1), (0, 6, 2), (0, None, 1))}, [x4], [(1, 2, 3, 6)]),
        **{op: ({}, [(0.9 * np.tanh(x4)).astype(np.float32)], [x4.shape]) for op in ("Asin", "Acos", "Atanh")},
        "Acosh": ({}, [pos + np.float32(1)], [x4.shape]),  # (their domains: NaN outside compares unequal)
    }
    nodes, arglists, shapelists = [], [], []
    for op in JAX_OPS:
        attrs, args, shapes = cases.get(op, ({}, [pos] + ([pos] if _is_binary(op) else []), [x4.shape]))
        nodes.append(Node(op, tuple(f"i{k}" for k in range(len(args))), tuple(f"o{k}" for k in range(len(shapes))),
                          attrs, op))
        arglists.append(args)
        shapelists.append(shapes)
    # every op in one jitted program (one compilation instead of one per op)
    got_all = jax.jit(lambda arrays: [evaluate(n, a, s) for n, a, s in zip(nodes, arrays, shapelists)])(
        [[jnp.asarray(a) for a in args] for args in arglists])
    bad = []
    for node, args, shapes, got in zip(nodes, arglists, shapelists, got_all):
        want = graph_passes.evaluate(node, args, shapes)
        for w, g in zip(want, got):
            if np.shape(w) != np.shape(g) or not np.allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5):
                bad.append(f"{node.op}: JAX and numpy executors disagree")
    return bad


def _is_binary(op: str) -> bool:
    return op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")
