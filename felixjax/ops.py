"""Operator constructors (``fj.ops.matmul``, ``dense``, ``conv2d``, ``depthwise_conv2d``) and specs.

Example:
    >>> import felixjax as fj
    >>> fj.ops.conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1).output_shape
    (1, 64, 56, 56)
"""
from codegen.ops import Task, conv2d, dense, depthwise_conv2d, matmul, parse_spec

__all__ = ["Task", "conv2d", "dense", "depthwise_conv2d", "matmul", "parse_spec"]
