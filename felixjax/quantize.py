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

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from codegen.ops import Task

# the arithmetic of low-precision layers lives in fake_quant (Model.run_numpy needs it); importable from here too
from .fake_quant import (
    WEIGHT_MAX,
    fake_float16_inputs,
    fake_quant_act,
    fake_quant_inputs,
    fake_quant_layer,
    fake_quant_output,
    fake_quant_outputs,
    fake_quant_run,
    precision_of,
    round_float16,
    weight_scales,
)
from .onnx_import import Model

__all__ = ["BUILD_PRECISIONS", "WEIGHT_MAX", "act_qparams", "fake_float16_inputs", "fake_quant_act",
           "fake_quant_inputs", "fake_quant_layer", "fake_quant_output", "fake_quant_outputs", "fake_quant_run",
           "float16_task", "int8_task", "precision_of", "quantize_weights", "round_float16", "weight_scales",
           "with_precisions"]

#: the precisions a layer may be built at
BUILD_PRECISIONS = ("float32", "float16", "int8")


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

