"""Layer formats: the per-layer choice of :func:`felixjax.approximate` beside channels (issue 17).

A *format* is ``(precision, sparsity)``: how one conv / dense / matmul layer is built.

* ``("float32", 0.0)``: the reference (:data:`REFERENCE`), every layer's start;
* ``("int8", 0.0)``: an int8 kernel (:func:`felixjax.quantize.int8_task`, calibrated uint8 data);
* ``("float16", 0.0)``: a float16 kernel, where the network build takes it
  (``"float16" in felixjax.quantize.BUILD_PRECISIONS``; see :func:`available_precisions`);
* ``("float32", s)``: a sparse float32 kernel (:mod:`codegen.sparse`): the fraction ``s`` of the
  layer's weights with the smallest magnitudes set to zero (:func:`felixjax.approx.quality.magnitude_mask`,
  a fixed mask from the layer's weights) and the task marked ``sparsity=s``, so the build regenerates
  the layer's kernel for its real (masked) weights. Sparse kernels are float32 only: a layer is int8,
  float16, or float32 at some sparsity, never two of them; grouped / depthwise convs and batched
  matmuls have no sparse kernel and stay dense.

This module holds what every side of the choice shares: the task of a layer in a format
(:func:`format_task`, which the latency tables price), which layers may take which formats
(:func:`eligible_formats`), the model with chosen layers sparse (:func:`sparse_layers`; the precisions
then go through :func:`felixjax.quantize.with_precisions`, :func:`felixjax.approx.precision.with_formats`),
and the float arithmetic of a format in JAX (:func:`transform`), which the relaxed objective mixes by
shares and the front search's quality evaluation selects.

Example:
    >>> formats_of(("float32", "int8"), (0.9, 0.5))
    (('float32', 0.0), ('int8', 0.0), ('float32', 0.5), ('float32', 0.9))
    >>> [label(f) for f in formats_of(("float32", "int8"), (0.5,))]
    ['float32', 'int8', 'sparse 0.5']
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from codegen import ops
from codegen.ops import Task

from .. import quantize
from ..onnx_import import Model
from .quality import magnitude_mask, ste

#: ``(precision, sparsity)`` of one layer
Format = tuple[str, float]
REFERENCE: Format = ("float32", 0.0)
INT8: Format = ("int8", 0.0)
FLOAT16: Format = ("float16", 0.0)


def available_precisions() -> tuple[str, ...]:
    """The precisions the network build takes (:data:`felixjax.quantize.BUILD_PRECISIONS`), in the
    order formats are listed: float32, int8, float16."""
    return tuple(p for p in ("float32", "int8", "float16") if p in quantize.BUILD_PRECISIONS)


def sparsity_supported() -> bool:
    """Whether ``codegen.ops`` builds sparse tasks (the ``sparsities=`` knob of :func:`felixjax.approximate`)."""
    try:
        ops.dense(1, 64, 64, sparsity=0.5)
        return True
    except (TypeError, ValueError):
        return False


def check_sparsities(sparsities: Any) -> tuple[float, ...]:
    """The sparsity levels as floats, sorted and deduplicated.

    Raises:
        ValueError: a level that is not a number in (0, 1) (one clear line).

    Example:
        >>> check_sparsities([0.9, 0.5, 0.5])
        (0.5, 0.9)
    """
    if isinstance(sparsities, (str, bytes)) or not isinstance(sparsities, Iterable):
        raise ValueError(f"sparsities must be a sequence of fractions of zero weights in (0, 1), got {sparsities!r}")  # noqa: TRY004
    out = []
    for s in sparsities:
        ok = isinstance(s, (int, float, np.floating, np.integer)) and not isinstance(s, bool)
        if not ok or not math.isfinite(float(s)) or not 0.0 < float(s) < 1.0:
            raise ValueError(f"a sparsity is a fraction of zero weights in (0, 1) (0.5: half the weights "
                             f"zero), got {s!r}")
        out.append(float(s))
    return tuple(sorted(set(out)))


def formats_of(precisions: Sequence[str], sparsities: Sequence[float] = ()) -> tuple[Format, ...]:
    """The formats a layer may take: the reference first, then the other precisions (dense), then one
    sparse float32 format per level (ascending)."""
    out = [REFERENCE] + [(p, 0.0) for p in dict.fromkeys(precisions) if p != "float32"]
    return tuple(out + [("float32", s) for s in check_sparsities(sparsities)])


def label(fmt: Format) -> str:
    """``"float32"``, ``"int8"``, ``"float16"`` or ``"sparse 0.5"``."""
    p, s = fmt
    return f"sparse {s:g}" if s else p


def format_task(task: Task, fmt: Format) -> Task:
    """The task a float32 dense layer ``task`` is built as in ``fmt``.

    Raises:
        ValueError: the layer has no kernel in that format (a grouped conv at a sparsity, a batched
            matmul at int8, ...), with the reason.

    Example:
        >>> from codegen import ops
        >>> [format_task(ops.dense(1, 16, 8), f).name for f in (REFERENCE, INT8, ("float32", 0.5))]
        ['dense_1x16_8', 'dense_1x16_8_int8_w7', 'dense_1x16_8_sp0.5']
    """
    p, s = fmt
    if s:
        if p != "float32":
            raise ValueError(f"{task.name}: sparse kernels are float32 only, not {p}")
        if task.dtype != "float32" or task.sparsity:
            raise ValueError(f"{task.name}: only a dense float32 layer can be made sparse")
        return replace(task, sparsity=float(s))  # Task validates the kinds with sparse kernels
    if p == "float32":
        return task
    if p == "int8":
        return quantize.int8_task(task)
    if p == "float16" and "float16" in available_precisions():
        return quantize.float16_task(task)
    raise ValueError(f"{task.name}: the network build does not take precision {p!r} "
                     f"(it takes {available_precisions()})")


def eligible_formats(model: Model, formats: Sequence[Format]) -> dict[str, tuple[Format, ...]]:
    """``{anchor: its formats, the reference first}`` for the anchors with constant weights that can take
    at least one of ``formats`` besides the reference, in graph order."""
    g, out = model.graph, {}
    for n in g.nodes:
        if not n.is_anchor or len(n.inputs) < 2 or n.inputs[1] not in g.constants:
            continue
        ok = [REFERENCE]
        for f in formats:
            if f == REFERENCE:
                continue
            try:
                format_task(n.task, f)
            except ValueError:
                continue
            ok.append(f)
        if len(ok) > 1:
            out[n.name] = tuple(ok)
    return out


def weight_masks(model: Model, formats: Mapping[str, Sequence[Format]]) -> dict[tuple[str, float], np.ndarray]:
    """``{(anchor, sparsity): 0/1 mask of its weight constant}`` for every sparse format in ``formats``
    (:func:`~felixjax.approx.quality.magnitude_mask` of the layer's own weights: fixed, not relaxed)."""
    g = model.graph
    by_name = {n.name: n for n in g.nodes}
    return {(name, s): magnitude_mask(np.asarray(g.constants[by_name[name].inputs[1]], np.float32), s)
            for name, fmts in formats.items() for _, s in fmts if s}


def sparse_layers(model: Model, levels: Mapping[str, float]) -> Model:
    """A copy of ``model`` whose anchors named in ``levels`` have their weights masked by magnitude at
    that level (the ``ceil(s * size)`` smallest zeroed, :func:`~felixjax.approx.quality.magnitude_mask`:
    at least the fraction ``s`` is zero) and are sparse tasks (``task.sparsity = s``), as
    :func:`felixjax.sparsify.sparsify` marks them; a weight constant another node also reads is copied
    first.

    Raises:
        ValueError: an unknown layer, a level outside (0, 1), a layer without constant weights or
            without a sparse kernel.
    """
    if not levels:
        return model
    g = model.graph
    anchors = {n.name for n in g.nodes if n.is_anchor}
    bad = sorted(set(levels) - anchors)
    if bad:
        raise ValueError(f"sparsity names {bad}, which are not conv / dense / matmul layers of the model")
    check_sparsities(levels.values())
    uses = Counter(i for n in g.nodes for i in n.inputs)
    consts, nodes = dict(g.constants), []
    for node in g.nodes:
        s = levels.get(node.name)
        if s:
            wname = node.inputs[1]
            if wname not in consts:
                raise ValueError(f"layer {node.name!r} cannot be sparse: its weights are not a constant")
            try:
                task = format_task(node.task, ("float32", float(s)))
            except ValueError as e:
                raise ValueError(f"layer {node.name!r} cannot be sparse: {e}") from None
            w = np.asarray(consts[wname], np.float32)
            if uses[wname] > 1:  # shared weights: this layer gets its own masked copy
                wname = f"{wname}__{node.name}_sparse"
                node = replace(node, inputs=(node.inputs[0], wname) + tuple(node.inputs[2:]))
            consts[wname] = (w * magnitude_mask(w, float(s))).astype(np.float32)
            node = replace(node, attrs={**node.attrs, "task": task})
        nodes.append(node)
    return replace(model, graph=g.replace(nodes=tuple(nodes), constants=consts))


def transform(task: Task, args: list, fmt: Format, *, qparams: tuple[float, int] | None = None,
              mask: Any = None, straight: bool = True) -> list:
    """The inputs ``[data, weight, ...]`` of a float32 anchor as its kernel in ``fmt`` sees them, in
    float (JAX). The roundings go through a straight-through estimator (:func:`~felixjax.approx.quality.ste`):
    int8 as :func:`felixjax.quantize.fake_quant_inputs` (``qparams``: the input's uint8 ``(scale, zero
    point)``), float16 data, weights and residual rounded to float16 (the bias stays float32). A sparse
    format multiplies the weights by the fixed 0/1 ``mask`` (a plain product: the function is linear in
    the weights, its gradient exact, nothing to straighten). Arguments a format leaves alone are
    returned as the same objects (the reference returns ``args``). ``straight=False``: the rounded values
    themselves, no STE (for evaluation only). A float16 kernel also rounds its output to float16 once;
    that half-ulp is not modelled here (the built network's measured quality has it)."""
    import jax.numpy as jnp

    p, s = fmt
    if s:
        return [args[0], args[1] * jnp.reshape(jnp.asarray(mask, jnp.float32), jnp.shape(args[1]))] + list(args[2:])
    if p == "int8":
        fq = quantize.fake_quant_inputs(task, args, *qparams, jnp)
        return [ste(a, b) if straight else b for a, b in zip(args[:2], fq[:2])] + list(args[2:])
    if p == "float16":
        names = task.input_names()
        out = [a if a is None or nm == "bias" else ste(a, quantize.round_float16(a)) if straight else quantize.round_float16(a)
               for nm, a in zip(names, args)]
        return out + list(args[len(names):])
    return args


def mix(args: list, outs: Sequence[list], weights: Sequence[Any]) -> list:
    """``sum_k weights[k] * outs[k][i]`` per argument ``i``; an argument no format changed stays as it
    is (``outs[0]`` is the reference, ``args`` itself)."""
    res = []
    for i, a in enumerate(args):
        vals = [o[i] for o in outs]
        if all(v is a for v in vals):
            res.append(a)
            continue
        acc = weights[0] * vals[0]
        for w, v in zip(weights[1:], vals[1:]):
            acc = acc + w * v
        res.append(acc)
    return res


def key(chosen: Mapping[str, Format]) -> tuple[tuple[str, str, float], ...]:
    """A hashable, sorted record of the non-reference layers of a configuration:
    ``((layer, precision, sparsity), ...)``.

    Example:
        >>> key({"b": ("float32", 0.5), "a": INT8, "c": REFERENCE})
        (('a', 'int8', 0.0), ('b', 'float32', 0.5))
    """
    return tuple(sorted((n, p, float(s)) for n, (p, s) in chosen.items() if (p, s) != REFERENCE))


def of_key(k: Iterable[tuple[str, str, float]]) -> dict[str, Format]:
    """The inverse of :func:`key`."""
    return {n: (p, float(s)) for n, p, s in k}


def summary(chosen: Mapping[str, Format]) -> str:
    """``"int8 x2, sparse 0.5 x1"``: how many layers take each non-reference format."""
    c = Counter(label(f) for f in chosen.values() if f != REFERENCE)
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items()))


def describe(chosen: Mapping[str, Format]) -> str:
    """``"int8: conv2, fc; sparse 0.5: conv3"``: the layers of each non-reference format.

    Example:
        >>> describe({"fc": INT8, "conv3": ("float32", 0.5), "conv2": INT8})
        'int8: conv2, fc; sparse 0.5: conv3'
    """
    by: dict[str, list[str]] = {}
    for n, f in sorted(chosen.items()):
        if f != REFERENCE:
            by.setdefault(label(f), []).append(n)
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in by.items())
