"""The numpy (and JAX) arithmetic of low-precision layers: what an int8 or float16 anchor of the C build
computes, in float. :mod:`felixjax.quantize` marks a model's layers and re-exports these;
:meth:`felixjax.onnx_import.Model.run_numpy` runs a model with low-precision layers through
:func:`fake_quant_run`, so a build's ``check()`` compares like with like.

Example:
    >>> import numpy as np
    >>> from codegen import ops
    >>> round_float16(np.float32(0.1)).item(), precision_of(ops.dense(1, 4, 2, dtype="float16"))
    (0.0999755859375, 'float16')
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from codegen.ops import Task

from .graph_passes import Graph, Node, evaluate, run_graph

WEIGHT_MAX = 63  # 7-bit weights, symmetric


def _float_twin(task: Task) -> Task:
    """The float32 task a low-precision one approximates (same op, shapes and epilogue)."""
    return replace(task, dtype="float32", dtypes=None, act_signed=False, out_dtype=None, weight_bits=8)


def _axis(task: Task) -> int:
    """The output-channel axis of the task's weights (matmul: the last, conv / dense: the first)."""
    return len(task.input_shapes()[1]) - 1 if task.op == "matmul" else 0


def weight_scales(task: Task, w: Any, xp: Any = np) -> Any:
    """Per-output-channel scales ``max |w| / 63``, broadcastable against ``w`` (numpy or JAX)."""
    ax = _axis(task)
    red = tuple(d for d in range(w.ndim) if d != ax)
    return xp.maximum(xp.max(xp.abs(w), axis=red, keepdims=True), 1e-30) / WEIGHT_MAX



def fake_quant_act(x: Any, scale: float, zero_point: int, xp: Any = np) -> Any:
    """``x`` through the uint8 quantize step and back: ``(clip(round(x / s) + zp, 0, 255) - zp) * s``."""
    s = np.float32(scale)
    return (xp.clip(xp.round(x / s) + zero_point, 0, 255) - zero_point) * s


def fake_quant_inputs(task: Task, args: list, scale: float, zero_point: int, xp: Any = np) -> list:
    """The float inputs ``[data, weight, ...]`` of an anchor as its int8 kernel sees them (dequantized
    activations and weights, each in its own shape)."""
    w = xp.reshape(args[1], task.input_shapes()[1])
    s = weight_scales(task, w, xp)
    wq = xp.clip(xp.round(w / s), -WEIGHT_MAX, WEIGHT_MAX) * s
    return [fake_quant_act(args[0], scale, zero_point, xp), xp.reshape(wq, np.shape(args[1]))] + list(args[2:])


def round_float16(x: Any) -> Any:
    """``x`` rounded to the nearest float16 (ties to even; beyond 65504: infinity) and widened back to
    float32, as a ``to_float16`` step and a float16 kernel's store round. numpy in, numpy out; a JAX
    array (traced too) through ``jax.lax.reduce_precision``, which XLA does not fold away as it may a
    float32 -> float16 -> float32 pair of converts under jit."""
    if isinstance(x, (np.ndarray, np.generic, float, int)):
        with np.errstate(over="ignore", invalid="ignore"):  # beyond 65504: infinity, as F16C
            return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
    import jax
    import jax.numpy as jnp

    return jax.lax.reduce_precision(jnp.asarray(x, jnp.float32), exponent_bits=5, mantissa_bits=10)


def fake_float16_inputs(task: Task, args: list) -> list:
    """The float inputs ``[data, weight, ...]`` of an anchor as its float16 kernel sees them: data,
    weights and residual rounded to float16 (:func:`round_float16`), the bias as it is (float32)."""
    names = _float_twin(task).input_names()
    return [a if n == "bias" or a is None else round_float16(a) for n, a in zip(names, args)]


def fake_quant_layer(node: Node, args: list, xp: Any = np) -> list:
    """The inputs of an anchor as its kernel sees them, in float (an ``anchor_inputs`` hook of the JAX
    executor): an int8-marked anchor's through :func:`fake_quant_inputs`, a float16 anchor's through
    :func:`fake_float16_inputs`; the inputs of other anchors unchanged."""
    if node.is_anchor and node.task.dtype == "float16":
        return fake_float16_inputs(node.task, args)
    q = node.attrs.get("quant")
    return args if q is None else fake_quant_inputs(node.task, args, q["scale"], q["zero_point"], xp)


def fake_quant_output(node: Node, y: Any) -> Any:
    """An anchor's float output as its kernel writes it: a float16 layer's rounded to float16 (the
    kernel's store, before the exact ``to_float32`` step); others unchanged."""
    return round_float16(y) if node.is_anchor and node.task.dtype == "float16" else y


def fake_quant_outputs(graph: Graph) -> Callable[[str, Any], Any]:
    """A ``value_hook`` of the JAX executor that rounds the outputs of ``graph``'s float16 anchors to
    float16 (:func:`fake_quant_output`); with ``anchor_inputs=fake_quant_layer``, the executor computes
    what the built network computes.

    Example:
        >>> import numpy as np
        >>> from codegen import ops
        >>> g = Graph((Node("dense", ("x", "w"), ("y",), {"task": ops.dense(1, 2, 1, dtype="float16")}),),
        ...           ("x",), ("y",), {"x": (1, 2), "y": (1, 1)}, {"w": np.ones((1, 2), np.float32)})
        >>> fake_quant_outputs(g)("y", np.float32(0.1)).item(), fake_quant_outputs(g)("x", np.float32(0.1)).item()
        (0.0999755859375, 0.10000000149011612)
    """
    half = {node.outputs[0] for node in graph.nodes if node.is_anchor and node.task.dtype == "float16"}
    return lambda name, value: round_float16(value) if name in half else value


def fake_quant_run(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``graph`` in numpy as the C build computes it: each int8 or float16 anchor is its float32
    twin on the inputs :func:`fake_quant_layer` gives (products and sums in float64, as
    ``Task.reference``), a float16 anchor's output rounded by :func:`fake_quant_output`; every other
    node as ``felixjax.graph_passes.evaluate``. Returns ``{output name: array}``.

    Example:
        >>> import numpy as np
        >>> from codegen import ops
        >>> g = Graph((Node("dense", ("x", "w"), ("y",), {"task": ops.dense(1, 2, 1, dtype="float16")}),),
        ...           ("x",), ("y",), {"x": (1, 2), "y": (1, 1)}, {"w": np.ones((1, 2), np.float32)})
        >>> fake_quant_run(g, {"x": np.array([[0.1, 1e-4]], np.float32)})["y"].item()
        0.10009765625
    """
    return run_graph(graph, {k: np.asarray(v, np.float32) for k, v in feeds.items()}, node_eval=_fake_quant_node)


def _fake_quant_node(node: Node, args: list, out_shapes: list) -> list:
    """One node as the C build computes it (a low-precision anchor: its float32 twin on fake-quantized
    inputs, a float16 one's output rounded); every other node as ``evaluate``."""
    if node.is_anchor and precision_of(node.task) != "float32":
        twin = replace(node, attrs={**node.attrs, "task": _float_twin(node.task)})
        return [fake_quant_output(node, evaluate(twin, fake_quant_layer(node, args), out_shapes)[0])]
    return evaluate(node, args, out_shapes)


def precision_of(task: Task) -> str:
    """``"int8"``, ``"float16"`` or ``"float32"`` (the precision a layer's task is built at)."""
    return "int8" if task.quantized else task.dtype
