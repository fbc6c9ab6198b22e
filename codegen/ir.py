"""The IR's vocabulary: element types per buffer role, loop kinds and mappings, buffer scopes.

Shared by :class:`codegen.ops.Task` (its :class:`DTypes`), the lowered loop nest of
:mod:`codegen.lower` (every :class:`~codegen.lower.Loop` has a kind and a mapping, every
:class:`~codegen.lower.Buffer` a scope, a layout and a dtype) and the renderers. What a CPU plan uses
today is a subset: GPU block / thread mappings and the shared scope are reserved for the CUDA target.

Element types by role (:class:`DTypes`): the data ``inputs``, the ``weights``, the ``accumulator``
of the reduction, the ``output``. :meth:`DTypes.of` gives a precision's roles: float32 everywhere;
float16 storage with float32 accumulation (float16 accumulation is the variant
``DTypes("float16", "float16", "float16", "float16")``); int8 (or uint8) activations x int8 weights
with int32 accumulation and a float32 (dequantized) or int8 (requantized) output. The side buffers of a
quantized kernel (bias, residual, scales) are float32 and its zero points int32 (:meth:`DTypes.for_buffer`).

Example:
    >>> DTypes.of("int8")
    DTypes(inputs='int8', weights='int8', accumulator='int32', output='float32')
    >>> DTypes.of("float32").for_buffer("bias")
    'float32'
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

DTYPES = ("float32", "float16", "int8", "uint8", "int32")
ROLES = ("inputs", "weights", "accumulator", "output")
LOOP_KINDS = ("spatial", "reduce")
#: how a loop runs: a plain loop, the fused OpenMP parallel loop, the SIMD lanes of a vector, a loop
#: the renderer unrolls (the register block, the unrolled reduction), CUDA's grid and block indices
LOOP_MAPPINGS = ("serial", "parallel", "vectorized", "unrolled", "gpu_block", "gpu_thread")
#: where a buffer lives: global memory (kernel arguments, the workspace), thread-private storage
#: (registers, stack arrays), memory shared by a GPU thread block
SCOPES = ("global", "local", "shared")

# the role each kernel buffer's elements have
_BUFFER_ROLES = {"data": "inputs", "data_in": "inputs", "weight": "weights", "bias": "accumulator",
                 "scratch": "accumulator", "residual": "output", "out": "output"}

# the quantization parameters of an int8 kernel (arguments after data, weights, bias, residual)
_QUANT_BUFFERS = {"x_scale": "float32", "x_zp": "int32", "w_scales": "float32", "y_scale": "float32",
                  "y_zp": "int32"}


@dataclass(frozen=True)
class DTypes:
    """Element types per role; ``DTypes()`` is float32 everywhere. Checked on construction: inputs
    and weights are float32, float16 or int8; int8 operands come in pairs and accumulate in int32;
    float operands accumulate in a float type (float16 only when both operands are float16)."""

    inputs: str = "float32"
    weights: str = "float32"
    accumulator: str = "float32"
    output: str = "float32"

    def __post_init__(self) -> None:
        for role in ROLES:
            if getattr(self, role) not in DTYPES:
                raise ValueError(f"dtypes.{role}={getattr(self, role)!r}: valid element types are {DTYPES}")
        ops = (self.inputs, self.weights)
        if any(t == "int32" for t in ops):
            raise ValueError(f"dtypes: operands are float32, float16 or int8, got {ops}")
        ints = [t in ("int8", "uint8") for t in ops]
        if any(ints) and not (all(ints) and self.weights == "int8" and self.accumulator == "int32"):
            raise ValueError(f"dtypes: int8 operands (uint8 or int8 data, int8 weights) come in pairs and "
                             f"accumulate in int32, got {self}")
        if any(ints) and self.output not in ("float32", "int8"):
            raise ValueError(f"dtypes: a quantized kernel outputs float32 (dequantized) or int8, got {self.output!r}")
        if not any(ints) and self.accumulator not in ("float32", "float16"):
            raise ValueError(f"dtypes: float operands accumulate in float32 (or float16), got {self.accumulator!r}")
        if self.accumulator == "float16" and ops != ("float16", "float16"):
            raise ValueError("dtypes: a float16 accumulator needs float16 operands")

    @staticmethod
    def of(dtype: str) -> "DTypes":
        """The roles of a precision: ``float32``; ``float16`` (float32 accumulation, float16 output);
        ``int8`` (int32 accumulation, float32 dequantized output)."""
        table = {"float32": ("float32",) * 4, "float16": ("float16", "float16", "float32", "float16"),
                 "int8": ("int8", "int8", "int32", "float32")}
        if dtype not in table:
            raise ValueError(f"dtype {dtype!r}: valid precisions are {tuple(table)}")
        return DTypes(*table[dtype])

    def for_buffer(self, name: str) -> str:
        """The element type of a kernel buffer by its name in a plan (``data``, ``weight``, ``out``, ...).
        A quantized kernel (int32 accumulator) adds bias and residual after dequantizing (float32),
        its scales are float32 and its zero points int32."""
        if name in _QUANT_BUFFERS:
            return _QUANT_BUFFERS[name]
        if self.accumulator == "int32" and name in ("bias", "residual"):
            return "float32"
        return getattr(self, _BUFFER_ROLES.get(name, "output"))

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "DTypes":
        return DTypes(**{k: str(v) for k, v in d.items()})
