"""int8 layers of an imported network (issue 17): run a conv / dense / matmul layer as an int8 task of
the code generator (:mod:`codegen.ops`, ``dtype="int8"``). Off by default: a model's layers are float32
tasks unless :func:`with_precisions` marks them.

The scheme (as onnxruntime quantizes for AVX2's ``vpmaddubsw``):

* weights: 7-bit symmetric per output channel, ``scale = max |w| / 63`` over the channel's filter,
  ``q = round(w / scale)`` in [-63, 63] (``weight_bits=7``: the pairwise uint8 x int8 products cannot
  saturate); quantized and packed once at load, from the layer's real weights;
* activations: uint8 with a zero point, per tensor, from the range ``[lo, hi]`` of the layer's input on
  calibration data (widened to hold 0): ``scale = (hi - lo) / 255``, ``zero_point = round(-lo / scale)``;
  a post-ReLU input gets ``zero_point = 0`` and all 256 steps for its positive range. The C build
  quantizes the float32 input in a ``quantize`` step before the kernel;
* the kernel accumulates in int32 and writes float32, dequantized, with bias, residual and activation
  fused as in float32.

:func:`fake_quant_layer` is the same arithmetic in float (numpy or JAX): the reference the built network
is checked against, and the quality side of :func:`felixjax.approximate`. float16 layers are not built:
the network build keeps float32 activations, and on AVX2 (no float16 arithmetic) float16 kernels are
slower than float32 ones (``docs/BENCHMARKS.md``), so a precision knob at float16 could only lose.

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
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from codegen.ops import Task

from .graph_passes import Node
from .onnx_import import Model

#: the precisions a layer may be built at
BUILD_PRECISIONS = ("float32", "int8")
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


def fake_quant_layer(node: Node, args: list, xp: Any = np) -> list:
    """:func:`fake_quant_inputs` of an int8-marked anchor (an ``anchor_inputs`` hook of the JAX
    executor); the inputs of other anchors unchanged."""
    q = node.attrs.get("quant")
    return args if q is None else fake_quant_inputs(node.task, args, q["scale"], q["zero_point"], xp)


def with_precisions(model: Model, precisions: Mapping[str, str],
                    ranges: Mapping[str, tuple[float, float]]) -> Model:
    """A copy of ``model`` whose anchors named in ``precisions`` with ``"int8"`` are int8 tasks; each
    keeps its input's uint8 parameters in ``node.attrs["quant"]`` (from ``ranges[name]``: the input's
    ``(min, max)`` on calibration data). ``"float32"`` leaves a layer as it is.

    Raises:
        ValueError: an unknown node or precision, an int8 layer without a range, a layer that cannot be
            built at int8 (names it and says why).
    """
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
        if node.is_anchor and precisions.get(node.name) == "int8":
            try:
                task = int8_task(node.task)
            except ValueError as e:
                raise ValueError(f"layer {node.name!r} cannot be built at int8: {e}") from None
            if node.inputs[1] not in model.graph.constants:
                raise ValueError(f"layer {node.name!r} cannot be built at int8: its weights are not a constant")
            scale, zp = act_qparams(*ranges[node.name])
            node = replace(node, attrs={**node.attrs, "task": task, "quant": {"scale": scale, "zero_point": zp}})
        nodes.append(node)
    return replace(model, graph=replace(model.graph, nodes=tuple(nodes)))


def precision_of(task: Task) -> str:
    """``"int8"`` or ``"float32"`` (the precision a layer's task is built at)."""
    return "int8" if task.quantized else task.dtype

