"""``conv_flat``: a 1x1 convolution scheduled over its flattened image, as a GEMM (issue 14).

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
