"""``conv_flat``: a 1x1 convolution scheduled over its flattened image, as a GEMM; ``conv_im2col``: a
strided convolution as the same GEMM over its columns (issue 14).

A 1x1, stride-1, unpadded convolution reads every input channel and writes every output channel as
one row of ``H * W`` contiguous pixels, so it is the same contraction over one pixel axis of extent
``H * W`` as over the two axes ``H`` and ``W``: ``out[k, p] = sum_c w[k, c] * x[c, p]``, a GEMM with the
weights as the left operand. The sketch schedules the task's flattened twin (:func:`flat_task`:
``H = 1``, ``W = H * W``; the same buffers, byte for byte) with ``conv_direct``'s structure: vectors
along the pixels, the weights broadcast, blocked by output channels. The register block then spans
two vectors of pixels whatever the image's width (14 x 14 = 196 pixels, padded to 208 = 13 x 16, where
a row-wise block pads each row of 14 to 16), and its rows are output channels padded to the GEMM
micro-kernel's 6 on AVX2 (1024 -> 1026: zero weights, packed at load, untimed;
:func:`codegen.padding.row_padded_sketch`): the 6 x 2-vector block of ``gemm_packed``.

Why (issue 14, quiet AVX2 EPYC, 1 thread, CPU time, 7 interleaved rounds, 256 x 14 x 14 -> 1024): the
default then, ``conv_spatial_pack.pad_x18`` (vectors along output channels, so its output is
transposed in the epilogue), ran at 55 GFLOP/s; ``conv_flat.pad_k1026_x208`` at 74-79 GFLOP/s;
onnxruntime (an im2col-free GEMM) at 77 (``benchmarks/conv_block_probe.py`` times the defaults).

``conv_im2col`` gathers the columns of a strided convolution (one per input channel and kernel tap,
``OH * OW`` pixels each, zero outside the image) into the workspace with a timed copy, then runs the
``conv_flat`` GEMM over them (:func:`im2col_task`: ``C * R * S`` channels, the weights' own order). It
is in the tuning space of strided convolutions, not a default: its untuned default against the
previous default (``conv_spatial_pack``), interleaved with onnxruntime on five stride-2 3x3 convs it was
not designed on, won 3 of 5 at 1 thread (0.81-0.87x onnxruntime against 0.57-0.71x) but lost 2 (0.73x
and 0.83x against 0.97x and 1.05x), and at 2 threads lost 4 of 5 (0.40-0.48x against 0.54-1.08x: it did
not scale, not yet understood).

Example:
    >>> from codegen.ops import conv2d
    >>> t = conv2d(1, 256, 14, 14, out_channels=1024, kernel=1)
    >>> applies(t), flat_task(t).input_shapes()[0]
    (True, (1, 256, 1, 196))
    >>> applies(conv2d(1, 256, 14, 14, out_channels=1024, kernel=1, stride=2))
    False
"""
from __future__ import annotations

from .ops import Task, conv2d

FLAT_SKETCH = "conv_flat"
IM2COL_SKETCH = "conv_im2col"


def applies(task: Task) -> bool:
    """Whether ``conv_flat`` schedules ``task``: a dense float32 ungrouped 1x1 convolution, stride 1, no
    padding, more than one image row (one row is flat already)."""
    if task.op != "conv2d" or task.dtype != "float32" or task.sparsity:
        return False
    p = task.p
    return ((p["r"], p["s"]) == (1, 1) and tuple(p["stride"]) == (1, 1) and not any(p["pad"])
            and p["groups"] == 1 and p["h"] > 1)


def flat_task(task: Task) -> Task:
    """The twin of a 1x1 convolution over one row of ``H * W`` pixels (same buffers, same epilogue)."""
    if not applies(task):
        raise ValueError(f"{task.name}: conv_flat takes dense float32 ungrouped 1x1 convolutions with stride 1 "
                         f"and no padding")
    p = task.p
    return conv2d(p["n"], p["c"], 1, p["h"] * p["w"], out_channels=p["k"], kernel=1, bias=task.bias,
                  act=task.act, residual=task.residual)


def im2col_applies(task: Task) -> bool:
    """Whether ``conv_im2col`` schedules ``task``: a dense float32 ungrouped strided convolution. (Stride 1
    has Winograd for 3x3 and ``conv_flat`` for 1x1; on the 3x3 stride-1 convs we timed, 96x24x24 and
    128x17x17, im2col ran at 0.8x onnxruntime against Winograd's 1.3-1.6x, so it stays out of their
    spaces.)"""
    if task.op != "conv2d" or task.dtype != "float32" or task.sparsity or task.p["groups"] != 1:
        return False
    return tuple(task.p["stride"]) != (1, 1)


def im2col_task(task: Task) -> Task:
    """The 1x1 convolution over the columns of ``task``: ``C * R * S`` channels (one per input channel and
    kernel tap, the weights' own order) by ``OH * OW`` pixels; ``conv_im2col`` fills its input (the
    columns) from the real one with a timed gather (:func:`im2col_geometry`)."""
    if not im2col_applies(task):
        raise ValueError(f"{task.name}: conv_im2col takes dense float32 ungrouped strided convolutions")
    p = task.p
    oh, ow = task.output_shape[2:]
    return conv2d(p["n"], p["c"] * p["r"] * p["s"], 1, int(oh) * int(ow), out_channels=p["k"], kernel=1,
                  bias=task.bias, act=task.act, residual=task.residual)


def im2col_geometry(task: Task) -> dict[str, int]:
    """Sizes of the gather: N, C, H, W (input), R, S (taps), SY, SX (strides), DY, DX (dilations), PT,
    PL (top / left padding), OH, OW (output)."""
    p = task.p
    oh, ow = task.output_shape[2:]
    return {"N": p["n"], "C": p["c"], "H": p["h"], "W": p["w"], "R": p["r"], "S": p["s"],
            "SY": p["stride"][0], "SX": p["stride"][1], "DY": p["dilation"][0], "DX": p["dilation"][1],
            "PT": p["pad"][0], "PL": p["pad"][1], "OH": int(oh), "OW": int(ow)}
