"""Low-precision layers of an imported network (issue 17): run a conv / dense / matmul layer as an int8
or a float16 task of the code generator (:mod:`codegen.ops`, ``dtype="int8"`` / ``"float16"``). Off by
default: a model's layers are float32 tasks unless :func:`with_precisions` marks them.

int8, the scheme (as onnxruntime quantizes for AVX2's ``vpmaddubsw``):

* weights: 7-bit symmetric per output channel, ``scale = max |w| / 63`` over the channel's filter,
  ``q = round(w / scale)`` in [-63, 63] (``weight_bits=7``: the pairwise uint8 x int8 products cannot
  saturate); quantized and packed once at load, from the layer's real weights;
* activations: uint8 with a zero point, per tensor, from the range ``[lo, hi]`` of the layer's input on
  calibration data (widened to hold 0): ``scale = (hi - lo) / 255``, ``zero_point = round(-lo / scale)``;
  a post-ReLU input gets ``zero_point = 0`` and all 256 steps for its positive range. The C build
  quantizes the float32 input in a ``quantize`` step before the kernel;
* the kernel accumulates in int32 and writes float32, dequantized, with bias, residual and activation
  fused as in float32.

float16 (:func:`float16_task`; no calibration): activations between layers stay float32. The C build
converts the layer's input (and its residual) to float16 in timed ``to_float16`` steps (F16C where the
target has it), the kernel reads float16 data and weights (converted once at load), accumulates in
float32, adds the float32 bias and the residual, applies the activation and rounds its output to float16
once; a ``to_float32`` step widens it (exactly) for the next layer. On AVX2 there is no float16
arithmetic: the kernel widens what it loads, so a float16 layer is expected to be *slower* than its
float32 twin (quiet, one thread, default schedules: 0.50-0.64x on matmul and 1x1 / 3x3 convs,
``docs/BENCHMARKS.md``) except where it is bandwidth bound (depthwise: 1.11x), and the conversion steps
add to it. The approximation objective decides from measured latency, not from the dtype.

:func:`fake_quant_layer` (inputs) and :func:`fake_quant_output` (a float16 layer's output) are the
same arithmetic in float (numpy or JAX): the reference the built network is checked against
(:func:`fake_quant_run` in numpy, or ``felixjax.approx.executor.run`` with ``anchor_inputs=
fake_quant_layer`` and ``value_hook=fake_quant_outputs(graph)``), and the quality side of
:func:`felixjax.approximate`.

Example:
    >>> import numpy as np
    >>> from codegen import ops
    >>> t = ops.dense(1, 4, 2)
    >>> q, s = quantize_weights(t, np.array([[0.5, -1.0, 0.25, 0.0], [2.0, 1.0, 0.0, -2.0]], np.float32))
    >>> q.tolist(), np.round(s * 63, 3).tolist()
    ([[31.0, -63.0, 16.0, 0.0], [63.0, 31.0, 0.0, -63.0]], [1.0, 2.0])
    >>> scale, zp = act_qparams(-0.5, 2.05)
    >>> round(scale, 6), zp
    (0.01, 50)
    >>> float16_task(t).name, round_float16(np.float32(0.1)).item()
    ('dense_1x4_2_fp16', 0.0999755859375)
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from codegen.ops import Task

from .graph_passes import Graph, Node, evaluate
from .onnx_import import Model

#: the precisions a layer may be built at
BUILD_PRECISIONS = ("float32", "float16", "int8")
WEIGHT_MAX = 63  # 7-bit weights, symmetric


def int8_task(task: Task) -> Task:
    """The int8 twin of a float32 anchor task (uint8 data, 7-bit weights, float32 output).

    Raises:
        ValueError: a task the int8 build does not take (batched matmul: its weights are not a
            constant; a sparse or already low-precision task), with the reason.
    """
    if task.dtype != "float32" or task.sparsity:
        raise ValueError(f"{task.name}: only a dense float32 layer can be built at int8")
    if task.op == "matmul" and task.p.get("batch"):
        raise ValueError(f"{task.name}: a batched matmul has no constant weights to quantize")
    return replace(task, dtype="int8", weight_bits=7, act_signed=False, out_dtype=None, dtypes=None)


def float16_task(task: Task) -> Task:
    """The float16 twin of a float32 anchor task: float16 data, weights, residual and output, float32
    accumulation and bias (:meth:`codegen.ir.DTypes.of` ``("float16")``).

    Raises:
        ValueError: a task the float16 build does not take (a sparse or already low-precision task; a
            batched matmul, whose weights are not a constant), with the reason.

    Example:
        >>> from codegen import ops
        >>> [d.name for d in float16_task(ops.conv2d(1, 8, 6, 6, out_channels=8, bias=True)).input_dtypes()]
        ['float16', 'float16', 'float32']
    """
    if task.dtype != "float32" or task.sparsity:
        raise ValueError(f"{task.name}: only a dense float32 layer can be built at float16")
    if task.op == "matmul" and task.p.get("batch"):
        raise ValueError(f"{task.name}: a batched matmul has no constant weights to convert")
    return replace(task, dtype="float16", dtypes=None, act_signed=False, out_dtype=None, weight_bits=8)


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


def quantize_weights(task: Task, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(integer-valued float32 weights in [-63, 63], float32 scales per output channel)``."""
    w = np.asarray(w, np.float32).reshape(task.input_shapes()[1])
    s = weight_scales(task, w).astype(np.float32)
    return np.clip(np.round(w / s), -WEIGHT_MAX, WEIGHT_MAX).astype(np.float32), s.reshape(-1)


def act_qparams(lo: float, hi: float) -> tuple[float, int]:
    """``(scale, zero point)`` of uint8 activations seen in ``[lo, hi]`` (widened to hold 0); the scale
    is a float32 value (the C step divides by the same number)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = float(np.float32(max(hi - lo, 1e-8) / 255.0))
    return scale, int(np.clip(round(-lo / scale), 0, 255))


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
    env: dict[str, Any] = dict(graph.constants)
    for name in graph.inputs:
        if name not in feeds:
            raise ValueError(f"missing input {name!r}; the graph takes {list(graph.inputs)}")
        env[name] = np.asarray(feeds[name], np.float32)
    for node in graph.nodes:
        args = [env[i] if i else None for i in node.inputs]
        out_shapes = [graph.shapes.get(o) for o in node.outputs]
        if node.is_anchor and precision_of(node.task) != "float32":
            twin = replace(node, attrs={**node.attrs, "task": _float_twin(node.task)})
            outs = [fake_quant_output(node, evaluate(twin, fake_quant_layer(node, args), out_shapes)[0])]
        else:
            outs = evaluate(node, args, out_shapes)
        env.update((o, v) for o, v in zip(node.outputs, outs) if o)
    return {o: env[o] for o in graph.outputs}


def with_precisions(model: Model, precisions: Mapping[str, str],
                    ranges: Mapping[str, tuple[float, float]] | None = None) -> Model:
    """A copy of ``model`` whose anchors named in ``precisions`` are built at that precision
    (:data:`BUILD_PRECISIONS`): ``"int8"`` makes an int8 task that keeps its input's uint8 parameters in
    ``node.attrs["quant"]`` (from ``ranges[name]``: the input's ``(min, max)`` on calibration data);
    ``"float16"`` a float16 task (:func:`float16_task`; no range needed); ``"float32"`` leaves a layer
    as it is.

    Raises:
        ValueError: an unknown node or precision, an int8 layer without a range, a layer that cannot be
            built at that precision (names it and says why).
    """
    ranges = ranges or {}
    by_name = {n.name: n for n in model.graph.nodes if n.is_anchor}
    for name, p in precisions.items():
        if name not in by_name:
            raise ValueError(f"precisions names {name!r}, which is not a conv / dense / matmul layer of the model")
        if p not in BUILD_PRECISIONS:
            raise ValueError(f"layer {name!r}: precision {p!r}; the network build takes {BUILD_PRECISIONS}")
        if p == "int8" and name not in ranges:
            raise ValueError(f"layer {name!r}: an int8 layer needs its input's calibrated range")
    nodes = []
    for node in model.graph.nodes:
        p = precisions.get(node.name, "float32") if node.is_anchor else "float32"
        if p != "float32":
            try:
                task = (int8_task if p == "int8" else float16_task)(node.task)
            except ValueError as e:
                raise ValueError(f"layer {node.name!r} cannot be built at {p}: {e}") from None
            if node.inputs[1] not in model.graph.constants:
                raise ValueError(f"layer {node.name!r} cannot be built at {p}: its weights are not a constant")
            attrs = {**node.attrs, "task": task}
            if p == "int8":
                scale, zp = act_qparams(*ranges[node.name])
                attrs["quant"] = {"scale": scale, "zero_point": zp}
            node = replace(node, attrs=attrs)
        nodes.append(node)
    return replace(model, graph=replace(model.graph, nodes=tuple(nodes)))


def precision_of(task: Task) -> str:
    """``"int8"``, ``"float16"`` or ``"float32"`` (the precision a layer's task is built at)."""
    return "int8" if task.quantized else task.dtype
