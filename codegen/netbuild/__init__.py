"""Whole-network C build: one C library for a whole model, from a neutral description of its steps.

The description (:class:`NetSpec`) knows nothing of ONNX or of felixjax's graph records; the front end
fills it in. It is a list of *values* (graph inputs, constants, intermediates, each with a static shape)
and a list of *steps* in execution order:

* ``Step("kernel", ..., plan=plan)``: an anchor, i.e. a tuned (or default) contraction kernel lowered to
  a :class:`~codegen.lower.Plan`. Its inputs follow the Task order (data, weight, [bias], [residual]); the
  weight must be a constant, which is packed once into the kernel's layout (as at inference).
* a cheap op by name (:data:`CHEAP_OPS`): numpy semantics, broadcasting included; each gets a small
  generated C function with every shape baked in. The attributes are those of the canonical node forms
  (``felixjax.graph_passes``): e.g. ``MaxPool`` takes ``kernel``, ``strides``, ``dilations``, ``pads``
  (top, left, bottom, right); ``Softmax`` ``axes`` (a contiguous range); ``Pad`` ``pads`` (before, after)
  per dimension, possibly negative.
* ``Step("quantize", (x,), (q,), {"scale": s, "zero_point": z})``: a float32 value to a ``uint8`` value
  (``Value(dtype="uint8")``), the data of an int8 kernel step (whose scales and int32 zero point are
  constants after its bias / residual, in the Task order; its weights are quantized, packed at load).
* ``Step("to_float16", (x,), (h,))`` and ``Step("to_float32", (h,), (y,))``: float32 <-> ``float16``
  values (round to nearest even; F16C where the compiler targets it, else portable C): the data and
  residual of a float16 kernel step (whose weights are converted to float16 and packed at load), and its
  float16 output back to float32 (:mod:`codegen.netbuild.convert`). Activations between steps stay float32.

:func:`emit` turns a spec into a :class:`NetSource`: one self-contained C file, a weights blob (packed
kernel weights and the other constants, 64-byte aligned entries) and a static memory plan. Intermediates
live in one arena, placed by liveness (first fit over values whose lifetimes overlap), so a step's
outputs never overlap its inputs; only ``Reshape`` may alias its input (when its output is not a graph
output). Graph outputs are written directly into the caller's buffers.

The C interface of every build::

    int    fj_model_init(const float* weights);                    // keeps the pointer; 0 = ok
    int    fj_model_run(const float* const* inputs, float* const* outputs);
    int    fj_model_run_with(const float* weights, float* arena,   // re-entrant: caller-owned arena
                             const float* const* inputs, float* const* outputs);
    double fj_model_time_with(const float* weights, float* arena, const float* const* inputs,
                              float* const* outputs, long number);  // seconds for `number` runs
    void   fj_model_profile_with(const float* weights, float* arena, const float* const* inputs,
                                 float* const* outputs, double* seconds);  // += seconds of every step
    long   fj_model_arena_floats(void);
    void   fj_model_set_threads(int n);

:func:`load` compiles it (``codegen.build``) and returns a callable :class:`NetLibrary`; :func:`export`
writes a standalone folder (``model.c``, ``model.h``, ``main.c``, ``Makefile``, ``weights.bin``,
``README.txt``) that builds with ``make`` and nothing but a C compiler.

Every C identifier is generated here (``fj_k3``, ``fj_s12``); no name from the model reaches the source.

Example:
    >>> import numpy as np
    >>> spec = NetSpec(values=(Value((2, 3), "input"), Value((3,), "const", np.ones(3, np.float32)),
    ...                        Value((2, 3), "temp"), Value((2, 3), "temp")),
    ...                inputs=(0,), outputs=(3,),
    ...                steps=(Step("Add", (0, 1), (2,)), Step("Relu", (2,), (3,))))
    >>> net = load(emit(spec))
    >>> net([np.array([[-3, 0, 1], [2, -1, 5]], np.float32)])[0]
    array([[0., 1., 2.],
           [3., 0., 6.]], dtype=float32)
"""
from __future__ import annotations

from .cheap_ops import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, PARALLEL_MIN
from .convert import CONVERSIONS
from .emission import NetSource, emit
from .kernels import CHEAP_OPS
from .library import NetLibrary, load
from .memory import ALIGN, MemoryPlan, plan_memory
from .spec import VALUE_KINDS, NetBuildError, NetSpec, Step, Value
from .standalone import export

__all__ = ["ALIGN", "CHEAP_OPS", "CONVERSIONS", "ELEMENTWISE_BINARY", "ELEMENTWISE_UNARY", "PARALLEL_MIN",
           "VALUE_KINDS", "MemoryPlan", "NetBuildError", "NetLibrary", "NetSource", "NetSpec", "Step", "Value", "emit",
           "export", "load", "plan_memory"]
