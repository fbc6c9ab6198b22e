"""The neutral description of a network (values and steps) that the front end fills in, and the
error every stage of the whole-network build raises."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..lower import Plan

VALUE_KINDS = ("input", "const", "temp")


class NetBuildError(ValueError):
    """The spec cannot be built: an unknown op, a malformed step, an unsupported attribute value."""


# ----------------------------------------------------------------------------------------------
# The neutral description
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Value:
    """A tensor of the network: a graph ``input``, a ``const`` (with its ``data``) or a ``temp`` (an
    intermediate or output, produced by exactly one step). ``dtype`` is float32 but for the 8-bit
    activations a ``quantize`` step writes (``"uint8"``), the int32 zero points of int8 kernels and the
    ``"float16"`` data, residual and output of a float16 kernel (written and read by ``to_float16`` /
    ``to_float32`` steps); graph inputs and outputs are float32."""

    shape: tuple[int, ...]
    kind: str
    data: np.ndarray | None = None
    dtype: str = "float32"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def floats(self) -> int:
        """Storage in 4-byte slots (the arena and the weights blob count floats)."""
        return -(-self.size * np.dtype(self.dtype).itemsize // 4)


@dataclass(frozen=True, eq=False)
class Step:
    """``outputs = op(inputs)``; inputs and outputs are value ids (``None`` marks an absent optional
    input or an output nobody reads). ``plan`` is set for ``op == "kernel"``; ``op == "quantize"``
    writes its float32 input as uint8 ``clip(round(x / scale) + zero_point, 0, 255)`` (attrs ``scale``,
    ``zero_point``; the data of an int8 kernel); ``to_float16`` / ``to_float32`` convert one value to
    the other type, element by element (round to nearest even / exact; the data, residual and output of a
    float16 kernel, :mod:`codegen.netbuild.convert`). ``label`` only appears in Python error
    messages, never in the C source."""

    op: str
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    plan: Plan | None = None
    label: str = ""

    def where(self) -> str:
        return f"step {self.label or self.op!r} ({'kernel ' + self.plan.space.task.name if self.plan else self.op})"


@dataclass(frozen=True, eq=False)
class NetSpec:
    """A network as values and steps (see the module docstring). ``inputs`` / ``outputs`` are value ids
    in the order of the C entry point's arrays."""

    values: tuple[Value, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    steps: tuple[Step, ...]


# ----------------------------------------------------------------------------------------------
# Static memory plan
# ----------------------------------------------------------------------------------------------
