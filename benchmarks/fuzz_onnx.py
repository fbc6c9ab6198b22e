"""Malformed-ONNX fuzzing (issue 12): every mutated model either loads or raises one clear felixjax error.

A case is one seeded mutation of a small valid seed model, as bytes:

* **bytes** mutations of the serialized protobuf: bit flips, truncation, inserted / deleted /
  duplicated / overwritten byte runs;
* **semantic** mutations built with ``onnx.helper``: wrong dtypes, graph cycles, absurd shapes (10^12,
  negative, zero, symbolic dims), missing or dangling inputs, duplicate names, unknown ops and domains,
  wrong attribute types and values, Reshape to impossible shapes, bad opsets and IR versions,
  corrupt initializers (wrong data length, external data), removed outputs, shuffled nodes, ...

Each case goes through ``felixjax.load_onnx``; a model that loads also goes through ``model.tasks``,
``model.summary()`` and (when all its values are small) ``model.run_numpy`` on zeros. The outcome is

* ``loaded``: everything above worked;
* ``refused``: a clear error (``felixjax.errors.UnsupportedModelError`` / ``ModelFormatError`` or
  ``codegen.limits.SizeLimitError``) raised by felixjax itself, not an internal error it wrapped;
* ``traceback``: any other exception (KeyError, IndexError, numpy errors, RecursionError, ...) or a
  clear error whose cause is an internal exception (the import's last-resort safety net);
* ``hang``: the case ran past its budget (a per-case ``SIGALRM`` watchdog; a hang inside C code that
  never returns to Python is caught by ``faulthandler`` killing the process after 10 budgets).

``tests/test_fuzz_onnx.py`` runs >= 500 cases in one process in CI; this driver runs as many as asked:

    python benchmarks/fuzz_onnx.py --cases 5000 --seed 1           # summary + every failure
    python benchmarks/fuzz_onnx.py --cases 20000 --json fuzz.json  # keep the outcomes

New seed models (for example the real-models issue's new ops) go into :data:`SEEDS`.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import json
import math
import random
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Seed models: small, valid, covering the importer's ops
# ----------------------------------------------------------------------------------------------

F = TensorProto.FLOAT


def _w(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _model(nodes, inputs, outputs, inits, opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fuzz_seed", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def seed_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "s", "t", "m", "v"], ["bn"], epsilon=1e-5, name="bn"),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2, name="conv2"),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], axis=1, name="flat"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["o"], transB=1, name="fc"),
        helper.make_node("Softmax", ["o"], ["y"], axis=1, name="softmax"),
    ]
    inits = [_w(rng, "w1", 4, 3, 3, 3), _w(rng, "b1", 4), _w(rng, "s", 4), _w(rng, "t", 4), _w(rng, "m", 4),
             numpy_helper.from_array(np.abs(rng.standard_normal(4)).astype(np.float32) + 0.5, "v"),
             _w(rng, "w2", 4, 2, 3, 3), _w(rng, "w3", 5, 4), _w(rng, "b3", 5)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", F, [1, 5])], inits)


def seed_mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
        helper.make_node("Tanh", ["hb"], ["t"], name="tanh"),
        helper.make_node("Reshape", ["t", "shape"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["tr"], perm=[0, 2, 1], name="transpose"),
        helper.make_node("Reshape", ["tr", "shape2"], ["r2"], name="reshape2"),
        helper.make_node("MatMul", ["r2", "w2"], ["h2"], name="mm2"),
        helper.make_node("Sigmoid", ["h2"], ["sg"], name="sigmoid"),
        helper.make_node("Mul", ["sg", "h2"], ["y"], name="mul"),
    ]
    inits = [_w(rng, "w1", 16, 8), _w(rng, "b1", 8), _i64("shape", [2, 2, 4]), _i64("shape2", [2, 8]),
             _w(rng, "w2", 8, 6)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 16])],
                  [helper.make_tensor_value_info("y", F, [2, 6])], inits)


def seed_misc() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Pad", ["x", "pads", "pv"], ["p"], mode="constant", name="pad"),
        helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[3, 3], strides=[1, 1], name="avgpool"),
        helper.make_node("Clip", ["a", "lo", "hi"], ["c"], name="clip"),
        helper.make_node("Concat", ["c", "c"], ["cc"], axis=1, name="concat"),
        helper.make_node("ReduceMean", ["cc"], ["rm"], axes=[2, 3], keepdims=1, name="reducemean"),
        helper.make_node("Sqrt", ["rm"], ["sq"], name="sqrt"),
        helper.make_node("Pow", ["sq", "two"], ["pw"], name="pow"),
        helper.make_node("Div", ["pw", "three"], ["d"], name="div"),
        helper.make_node("Sub", ["d", "one"], ["sb"], name="sub"),
        helper.make_node("Dropout", ["sb"], ["dr"], name="dropout"),
        helper.make_node("Identity", ["dr"], ["y"], name="identity"),
    ]
    f32 = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [_i64("pads", [0, 0, 1, 1, 0, 0, 1, 1]), f32("pv", 0.0), f32("lo", 0.0), f32("hi", 6.0),
             f32("two", 2.0), f32("three", 3.0), f32("one", 1.0)]
    del rng
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 6, 6])],
                  [helper.make_tensor_value_info("y", F, [1, 4, 1, 1])], inits)


def seed_transformer() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5, name="ln"),
        helper.make_node("MatMul", ["ln", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["ln", "wk"], ["k"], name="k"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "ln"], ["o"], name="attn"),
        helper.make_node("Div", ["o", "sqrt2"], ["od"], name="div"),
        helper.make_node("Erf", ["od"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "x"], ["y"], name="residual"),
    ]
    inits = [_w(rng, "g", 8), _w(rng, "b", 8), _w(rng, "wq", 8, 8), _w(rng, "wk", 8, 8),
             numpy_helper.from_array(np.asarray(1.4142135, np.float32), "sqrt2")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [4, 8])],
                  [helper.make_tensor_value_info("y", F, [4, 8])], inits, opset=17)


def seed_constants() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Constant", [], ["shp"], value=_i64("shp_v", [1, 4]), name="const_shape"),
        helper.make_node("ConstantOfShape", ["shp"], ["ones"], value=numpy_helper.from_array(
            np.ones(1, np.float32), "one"), name="cos"),
        helper.make_node("Constant", [], ["half"], value_float=0.5, name="const_half"),
        helper.make_node("Mul", ["ones", "half"], ["h"], name="mul"),
        helper.make_node("Add", ["x", "h"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 4])],
                  [helper.make_tensor_value_info("y", F, [1, 4])], [])


def seed_legacy_opset() -> onnx.ModelProto:
    """Opset 9: Pad / Clip bounds as attributes, Softmax's flatten-to-2-D axis."""
    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Pad", ["x"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1], value=0.0, name="pad"),
        helper.make_node("Conv", ["p", "w"], ["c"], kernel_shape=[3, 3], strides=[2, 2], name="conv"),
        helper.make_node("Clip", ["c"], ["cl"], min=0.0, max=6.0, name="clip"),
        helper.make_node("Flatten", ["cl"], ["f"], name="flat"),
        helper.make_node("Softmax", ["f"], ["y"], axis=1, name="softmax"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 6, 6])],
                  [helper.make_tensor_value_info("y", F, [1, 3 * 3 * 3])], [_w(rng, "w", 3, 2, 3, 3)], opset=9)


def seed_shape_ops() -> onnx.ModelProto:
    """Shape arithmetic and newer ops (folded or imported, depending on the importer's coverage)."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "idx"], ["n"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["nu"], name="unsqueeze"),
        helper.make_node("Concat", ["nu", "m1"], ["tshape"], axis=0, name="concat_shape"),
        helper.make_node("Reshape", ["x", "tshape"], ["r"], name="reshape"),
        helper.make_node("Slice", ["r", "st", "en", "ax1"], ["sl"], name="slice"),
        helper.make_node("MatMul", ["sl", "w"], ["mm"], name="matmul"),
        helper.make_node("LeakyRelu", ["mm"], ["y"], alpha=0.1, name="leaky"),
    ]
    inits = [_i64("idx", 0), _i64("ax0", [0]), _i64("m1", [-1]), _i64("st", [0]), _i64("en", [6]), _i64("ax1", [1]),
             _w(rng, "w", 6, 3)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 2, 4])],
                  [helper.make_tensor_value_info("y", F, [2, 3])], inits)


def seed_more_ops() -> onnx.ModelProto:
    """Ops beyond the anchors' neighbourhood: transposed convolution, resize, normalizations, selection."""
    rng = np.random.default_rng(6)
    f32 = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("ConvTranspose", ["x", "wt"], ["ct"], kernel_shape=[2, 2], strides=[2, 2], name="deconv"),
        helper.make_node("InstanceNormalization", ["ct", "isc", "ib"], ["inn"], epsilon=1e-5, name="instnorm"),
        helper.make_node("PRelu", ["inn", "slope"], ["pr"], name="prelu"),
        helper.make_node("Resize", ["pr", "", "scales"], ["rs"], mode="nearest", name="resize"),
        helper.make_node("HardSwish", ["rs"], ["hs"], name="hardswish"),
        helper.make_node("Split", ["hs", "split"], ["s0", "s1"], axis=1, name="split"),
        helper.make_node("Max", ["s0", "s1"], ["mx"], name="max"),
        helper.make_node("Where", ["cond", "mx", "s1"], ["wh"], name="where"),
        helper.make_node("ReduceSum", ["wh", "axes"], ["rsum"], keepdims=0, name="reducesum"),
        helper.make_node("Unsqueeze", ["rsum", "ax1"], ["un"], name="unsqueeze"),
        helper.make_node("Expand", ["un", "eshape"], ["ex"], name="expand"),
        helper.make_node("GlobalMaxPool", ["ex"], ["gmp"], name="gmp"),
        helper.make_node("Squeeze", ["gmp", "ax23"], ["sq"], name="squeeze"),
        helper.make_node("Gather", ["sq", "gidx"], ["ga"], axis=1, name="gather"),
        helper.make_node("Exp", ["ga"], ["y"], name="exp"),
    ]
    inits = [_w(rng, "wt", 2, 2, 2, 2), _w(rng, "isc", 2), _w(rng, "ib", 2), f32("slope", [0.1]),
             f32("scales", [1, 1, 2, 2]), _i64("split", [1, 1]),
             numpy_helper.from_array(rng.random((1, 1, 16, 16)) > 0.5, "cond"), _i64("axes", [1]),
             _i64("ax1", [1]), _i64("eshape", [1, 3, 16, 16]), _i64("ax23", [2, 3]), _i64("gidx", [0, 2])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 4, 4])],
                  [helper.make_tensor_value_info("y", F, [1, 2])], inits, opset=14)


SEEDS: dict[str, Callable[[], onnx.ModelProto]] = {
    "cnn": seed_cnn, "mlp": seed_mlp, "misc": seed_misc, "transformer": seed_transformer,
    "constants": seed_constants, "legacy_opset": seed_legacy_opset, "shape_ops": seed_shape_ops,
    "more_ops": seed_more_ops,
}


@lru_cache(maxsize=None)
def _seed_bytes(name: str) -> bytes:
    return SEEDS[name]().SerializeToString()


def seed_model(name: str) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.ParseFromString(_seed_bytes(name))
    return m


# ----------------------------------------------------------------------------------------------
# Mutations
# ----------------------------------------------------------------------------------------------

def _bitflip(r: random.Random, b: bytearray) -> str:
    k = r.choice((1, 1, 2, 4, 8, 32))
    for _ in range(k):
        i = r.randrange(len(b))
        b[i] ^= 1 << r.randrange(8)
    return f"{k} bit flips"


def _truncate(r: random.Random, b: bytearray) -> str:
    n = r.randrange(len(b))
    del b[n:]
    return f"truncated to {n} bytes"


def _insert(r: random.Random, b: bytearray) -> str:
    i, n = r.randrange(len(b) + 1), r.choice((1, 2, 5, 16, 100))
    b[i:i] = bytes(r.randrange(256) for _ in range(n))
    return f"{n} random bytes inserted at {i}"


def _delete(r: random.Random, b: bytearray) -> str:
    i = r.randrange(len(b))
    n = r.choice((1, 2, 4, 16))
    del b[i:i + n]
    return f"{n} bytes deleted at {i}"


def _duplicate(r: random.Random, b: bytearray) -> str:
    i = r.randrange(len(b))
    n = r.choice((2, 8, 32, 128))
    b[i:i] = b[i:i + n]
    return f"{n} bytes duplicated at {i}"


def _overwrite(r: random.Random, b: bytearray) -> str:
    i = r.randrange(len(b))
    fill = r.choice((0x00, 0xFF, 0x7F, 0x80))
    n = r.choice((1, 4, 10))
    b[i:i + n] = bytes([fill]) * len(b[i:i + n])
    return f"{n} bytes at {i} set to {fill:#x}"


BYTE_MUTATIONS = (_bitflip, _bitflip, _truncate, _insert, _delete, _duplicate, _overwrite)

_DTYPES = (TensorProto.INT64, TensorProto.DOUBLE, TensorProto.STRING, TensorProto.FLOAT16, TensorProto.BOOL,
           TensorProto.UINT8, TensorProto.INT32, TensorProto.COMPLEX64, TensorProto.UNDEFINED, 999)
_ABSURD = (10**12, 2**31, 2**40, 2**63 - 1, -1, -5, 0, 10**6)


def _values(m: onnx.ModelProto) -> list[str]:
    names = [v.name for v in m.graph.input] + [t.name for t in m.graph.initializer]
    return names + [o for n in m.graph.node for o in n.output]


def m_dtype(r, m):
    pool = list(m.graph.input) + list(m.graph.output)
    if r.random() < 0.5 and m.graph.initializer:
        t = r.choice(m.graph.initializer)
        t.data_type = r.choice(_DTYPES)
        return f"initializer {t.name} dtype {t.data_type}"
    vi = r.choice(pool)
    vi.type.tensor_type.elem_type = r.choice(_DTYPES)
    return f"value {vi.name} dtype {vi.type.tensor_type.elem_type}"


def m_cycle(r, m):
    nodes = m.graph.node
    if len(nodes) < 2:
        return "no cycle (1 node)"
    i, j = sorted(r.sample(range(len(nodes)), 2))
    k = r.randrange(len(nodes[i].input)) if nodes[i].input else 0
    if nodes[i].input:
        nodes[i].input[k] = nodes[j].output[0]
    else:
        nodes[i].input.append(nodes[j].output[0])
    return f"node {i} reads node {j}'s output (cycle)"


def m_self_loop(r, m):
    n = r.choice(m.graph.node)
    if n.input:
        n.input[0] = n.output[0]
    return f"node {n.name} reads its own output"


def m_absurd_input_shape(r, m):
    vi = r.choice(list(m.graph.input))
    dims = vi.type.tensor_type.shape.dim
    if not dims:
        return "scalar input"
    d = r.choice(dims)
    choice = r.random()
    if choice < 0.15:
        d.dim_param = r.choice(("N", "batch", ""))
        return f"{vi.name} dim symbolic"
    if choice < 0.25:
        dims.add().dim_value = r.choice(_ABSURD)
        return f"{vi.name} extra dim"
    if choice < 0.32:
        del dims[-1]
        return f"{vi.name} rank reduced"
    d.dim_value = r.choice(_ABSURD)
    return f"{vi.name} dim {d.dim_value}"


def m_absurd_output_shape(r, m):
    vi = r.choice(list(m.graph.output))
    dims = vi.type.tensor_type.shape.dim
    if dims:
        r.choice(dims).dim_value = r.choice(_ABSURD)
    else:
        vi.type.tensor_type.ClearField("shape")
    return f"output {vi.name} shape changed"


def m_initializer_dims(r, m):
    if not m.graph.initializer:
        return "no initializer"
    t = r.choice(m.graph.initializer)
    choice = r.random()
    if choice < 0.4 and t.dims:
        i = r.randrange(len(t.dims))
        t.dims[i] = r.choice(_ABSURD + (t.dims[i] + 1, max(0, t.dims[i] - 1)))
    elif choice < 0.6:
        t.dims.append(r.choice((1, 2, 10**9)))
    elif choice < 0.8 and t.dims:
        del t.dims[-1]
    else:
        del t.dims[:]
    return f"initializer {t.name} dims {list(t.dims)}"


def m_initializer_data(r, m):
    if not m.graph.initializer:
        return "no initializer"
    t = r.choice(m.graph.initializer)
    choice = r.random()
    if choice < 0.3 and t.raw_data:
        t.raw_data = t.raw_data[: r.randrange(len(t.raw_data) + 1)]
        return f"initializer {t.name} raw_data cut"
    if choice < 0.5:
        t.raw_data = bytes(r.randrange(256) for _ in range(r.choice((0, 3, 7, 64))))
        return f"initializer {t.name} raw_data garbage"
    if choice < 0.65:
        t.ClearField("raw_data")
        t.float_data.extend([1.0] * r.choice((0, 1, 3)))
        return f"initializer {t.name} float_data {len(t.float_data)}"
    if choice < 0.8:
        t.data_location = TensorProto.EXTERNAL
        e = t.external_data.add()
        e.key, e.value = "location", r.choice(("../../etc/passwd", "weights.bin", "/dev/zero", ""))
        return f"initializer {t.name} external data"
    if choice < 0.9:
        t.raw_data = np.full(max(1, int(np.prod(t.dims)) if t.dims else 1),
                             r.choice((np.nan, np.inf, -np.inf)), np.float32).tobytes()
        return f"initializer {t.name} non-finite"
    t.string_data.append(b"x")
    return f"initializer {t.name} string data"


def m_missing_input(r, m):
    choice = r.random()
    if choice < 0.3 and m.graph.input:
        vi = r.choice(list(m.graph.input))
        m.graph.input.remove(vi)
        return f"graph input {vi.name} removed"
    if choice < 0.6 and m.graph.initializer:
        t = r.choice(list(m.graph.initializer))
        m.graph.initializer.remove(t)
        return f"initializer {t.name} removed"
    n = r.choice(m.graph.node)
    if n.input:
        n.input[r.randrange(len(n.input))] = r.choice(("nonexistent", "", "x "))
    else:
        n.input.append("nonexistent")
    return f"node {n.name} reads a missing value"


def m_extra_inputs(r, m):
    n = r.choice(m.graph.node)
    for _ in range(r.choice((1, 3, 8))):
        n.input.append(r.choice(_values(m) + [""]))
    return f"node {n.name} has {len(n.input)} inputs"


def m_drop_node_inputs(r, m):
    n = r.choice(m.graph.node)
    del n.input[r.randrange(len(n.input) + 1) if n.input else 0:]
    return f"node {n.name} keeps {len(n.input)} inputs"


def m_outputs(r, m):
    n = r.choice(m.graph.node)
    choice = r.random()
    if choice < 0.3:
        n.output.append(r.choice(("extra_out", n.output[0] if n.output else "", "")))
    elif choice < 0.6:
        del n.output[:]
    else:
        n.output[0] = r.choice(("", "x", m.graph.output[0].name if m.graph.output else "y"))
    return f"node {n.name} outputs {list(n.output)}"


def m_duplicate_names(r, m):
    choice = r.random()
    if choice < 0.4 and len(m.graph.node) >= 2:
        a, b = r.sample(list(m.graph.node), 2)
        b.output[0] = a.output[0]
        return f"nodes {a.name} and {b.name} write {a.output[0]}"
    if choice < 0.7 and m.graph.initializer:
        t = r.choice(list(m.graph.initializer))
        dup = m.graph.initializer.add()
        dup.CopyFrom(t)
        if r.random() < 0.5:
            dup.CopyFrom(numpy_helper.from_array(np.zeros((3, 1), np.float32), t.name))
        return f"initializer {t.name} twice"
    vi = r.choice(list(m.graph.input))
    if m.graph.initializer:
        t = r.choice(list(m.graph.initializer))
        t.name = vi.name
        return f"initializer renamed to input {vi.name}"
    dup = m.graph.input.add()
    dup.CopyFrom(vi)
    return f"input {vi.name} twice"


def m_unknown_op(r, m):
    n = r.choice(m.graph.node)
    choice = r.random()
    if choice < 0.4:
        n.op_type = r.choice(("FooBar", "", "conv", "If", "Loop", "Scan", "NonMaxSuppression", "Relu\x00"))
    elif choice < 0.7:
        n.domain = r.choice(("com.evil", "ai.onnx.ml", "com.microsoft", "\xff"))
    else:
        other = r.choice(m.graph.node)
        n.op_type = other.op_type  # same inputs and attributes under another op: arity / attrs mismatch
    return f"node {n.name} op {n.domain}:{n.op_type}"


def m_attr_type(r, m):
    nodes = [n for n in m.graph.node if n.attribute] or list(m.graph.node)
    n = r.choice(nodes)
    name = r.choice([a.name for a in n.attribute]) if n.attribute else r.choice(("axis", "kernel_shape", "perm"))
    keep = [a for a in n.attribute if a.name != name]
    del n.attribute[:]
    n.attribute.extend(keep)
    value = r.choice(("text", b"bytes", 3.5, [1.5, 2.5], ["a", "b"], 7, [], [10**12, -10**12],
                      numpy_helper.from_array(np.zeros(2, np.float32), "t"),
                      helper.make_graph([], "sub", [], [])))
    try:
        n.attribute.append(helper.make_attribute(name, value))
    except (ValueError, TypeError):
        n.attribute.append(helper.make_attribute(name, "fallback"))
    return f"node {n.name} attribute {name} = {type(value).__name__}"


def m_attr_value(r, m):
    n = r.choice(m.graph.node)
    name, value = r.choice((
        ("axis", r.choice((-100, 100, 2**40, -1))), ("perm", [0, 0, 1]), ("perm", [5, 1, 0]),
        ("kernel_shape", r.choice(([0, 0], [100, 100], [-1, 3], [3], [1, 1, 1]))),
        ("strides", r.choice(([0, 0], [-1, 1], [10**9, 1], [1]))), ("dilations", r.choice(([0, 1], [10**6, 1]))),
        ("pads", r.choice(([-1, 0, 0, 0], [10**9, 0, 0, 0], [1, 1], [10**12] * 4, [0] * 8))),
        ("group", r.choice((0, -1, 3, 10**9))), ("auto_pad", r.choice(("SAME_UPPER", "BOGUS", ""))),
        ("transA", 1), ("transB", 7), ("alpha", float("nan")), ("epsilon", -1.0), ("keepdims", 5),
        ("axes", r.choice(([10], [0, 0], [-10], []))), ("ceil_mode", 1), ("count_include_pad", 1),
        ("mode", r.choice(("reflect", "edge", "wrap", "bogus"))), ("training_mode", 1), ("spatial", 0),
        ("allowzero", 1), ("noop_with_empty_axes", 1), ("storage_order", 1), ("min", 10.0), ("max", -10.0),
    ))
    keep = [a for a in n.attribute if a.name != name]
    del n.attribute[:]
    n.attribute.extend(keep)
    n.attribute.append(helper.make_attribute(name, value))
    return f"node {n.name} {name}={value}"


def m_reshape_impossible(r, m):
    shapes = [t for t in m.graph.initializer if t.data_type == TensorProto.INT64]
    spec = r.choice(([-1, -1], [0, 7], [3, 10**12], [-2], [7], [], [1, 0, 0, 0, 0, 0], [2**62, 2**62],
                     [-1, 0], [10**12, -1], [5, 5, 5, 5]))
    if shapes:
        t = r.choice(shapes)
        t.CopyFrom(_i64(t.name, spec))
        return f"int64 initializer {t.name} = {spec}"
    n = r.choice(m.graph.node)
    if n.input:
        name = f"fuzz_shape_{r.randrange(1000)}"
        m.graph.initializer.append(_i64(name, spec))
        m.graph.node.insert(list(m.graph.node).index(n) + 1, helper.make_node(
            "Reshape", [n.output[0], name], [n.output[0] + "_rs"], name="fuzz_reshape"))
    return f"reshape to {spec}"


def m_opset(r, m):
    choice = r.random()
    if choice < 0.3:
        m.opset_import[0].version = r.choice((1, 5, 6, 7, 10, 11, 12, 30, 9999, -1))
    elif choice < 0.5:
        del m.opset_import[:]
    elif choice < 0.7:
        m.opset_import[0].domain = r.choice(("com.evil", "ai.onnx.ml"))
    elif choice < 0.85:
        m.ir_version = r.choice((0, 1, 2, 3, 100, -1))
    else:
        m.opset_import.add().CopyFrom(helper.make_opsetid("", 7))
    return f"opsets {[(o.domain, o.version) for o in m.opset_import]} ir {m.ir_version}"


def m_graph_outputs(r, m):
    choice = r.random()
    if choice < 0.3:
        del m.graph.output[:]
    elif choice < 0.6:
        m.graph.output[0].name = r.choice(("nonexistent", "x", ""))
    elif choice < 0.8:
        m.graph.output.add().CopyFrom(helper.make_tensor_value_info(
            r.choice(_values(m)), r.choice((F, TensorProto.INT64)), None))
    else:
        m.graph.output[0].type.Clear()
    return f"graph outputs {[o.name for o in m.graph.output]}"


def m_shuffle_nodes(r, m):
    nodes = list(m.graph.node)
    r.shuffle(nodes)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return "nodes shuffled"


def m_drop_node(r, m):
    n = r.choice(list(m.graph.node))
    m.graph.node.remove(n)
    return f"node {n.name} removed"


def m_constant_node(r, m):
    choice = r.random()
    value = r.choice((
        None, numpy_helper.from_array(np.zeros((0,), np.float32), "v"), 2**63 - 1, [float("inf")],
        numpy_helper.from_array(np.array(["s"], dtype=object), "v"),
    ))
    name = f"fuzz_const_{r.randrange(100)}"
    if value is None:
        node = helper.make_node("Constant", [], [name])
    elif isinstance(value, onnx.TensorProto):
        node = helper.make_node("Constant", [], [name], value=value)
    elif isinstance(value, list):
        node = helper.make_node("Constant", [], [name], value_floats=value)
    else:
        node = helper.make_node("Constant", [], [name], value_int=value)
    if choice < 0.5:
        node.attribute.append(helper.make_attribute("sparse_value", helper.make_sparse_tensor(
            numpy_helper.from_array(np.ones(1, np.float32), "sv"), numpy_helper.from_array(np.zeros(1, np.int64), "si"),
            [10**6])))
    m.graph.node.insert(0, node)
    tgt = r.choice(m.graph.node[1:] if len(m.graph.node) > 1 else m.graph.node)
    if tgt.input:
        tgt.input[r.randrange(len(tgt.input))] = name
    return f"constant {name} feeds {tgt.name}"


def m_constant_of_shape(r, m):
    spec = r.choice(([10**12], [-1, 3], [2**31, 2**31], [0], [3, 0, 2], [10**6, 10**6]))
    sname, oname = f"fuzz_cos_shape_{r.randrange(100)}", f"fuzz_cos_{r.randrange(100)}"
    m.graph.initializer.append(_i64(sname, spec))
    m.graph.node.insert(0, helper.make_node("ConstantOfShape", [sname], [oname], name="fuzz_cos"))
    tgt = r.choice(m.graph.node[1:])
    if tgt.input:
        tgt.input[r.randrange(len(tgt.input))] = oname
    return f"ConstantOfShape {spec} feeds {tgt.name}"


def m_deep_chain(r, m):
    n = r.choice((500, 2000))
    prev = m.graph.output[0].name
    for i in range(n):
        m.graph.node.append(helper.make_node("Relu", [prev], [f"chain{i}"], name=f"chain{i}"))
        prev = f"chain{i}"
    m.graph.output[0].name = prev
    return f"{n}-node Relu chain"


def m_nested_mutations(r, m):
    done = [r.choice(SEMANTIC_MUTATIONS[:-1])(r, m) for _ in range(r.choice((2, 3, 4)))]
    return " + ".join(done)


SEMANTIC_MUTATIONS: tuple[Callable, ...] = (
    m_dtype, m_cycle, m_self_loop, m_absurd_input_shape, m_absurd_output_shape, m_initializer_dims,
    m_initializer_data, m_missing_input, m_extra_inputs, m_drop_node_inputs, m_outputs, m_duplicate_names,
    m_unknown_op, m_attr_type, m_attr_value, m_reshape_impossible, m_opset, m_graph_outputs,
    m_shuffle_nodes, m_drop_node, m_constant_node, m_constant_of_shape, m_deep_chain, m_nested_mutations,
)


@dataclasses.dataclass(frozen=True)
class Case:
    index: int
    seed_model: str
    kind: str  # "bytes" or "semantic"
    mutation: str
    description: str
    data: bytes


def make_case(index: int, base_seed: int = 0) -> Case:
    """Case ``index`` of the corpus with ``base_seed``: deterministic (same bytes on every machine)."""
    r = random.Random(f"{base_seed}:{index}")
    seed_name = r.choice(sorted(SEEDS))
    if r.random() < 0.45:
        b = bytearray(_seed_bytes(seed_name))
        fn = r.choice(BYTE_MUTATIONS)
        desc = fn(r, b)
        if r.random() < 0.25:
            desc += " + " + r.choice(BYTE_MUTATIONS)(r, b) if b else ""
        return Case(index, seed_name, "bytes", fn.__name__.lstrip("_"), desc, bytes(b))
    m = seed_model(seed_name)
    fn = r.choice(SEMANTIC_MUTATIONS)
    try:
        desc = fn(r, m)
        data = m.SerializeToString()
    except Exception as e:  # a mutation that protobuf itself refuses: keep the seed, note it
        desc, data = f"mutation not representable ({type(e).__name__}: {e})", _seed_bytes(seed_name)
    return Case(index, seed_name, "semantic", fn.__name__, desc, data)


def cases(n: int, base_seed: int = 0) -> Iterator[Case]:
    for i in range(n):
        yield make_case(i, base_seed)


# ----------------------------------------------------------------------------------------------
# Running one case under a watchdog
# ----------------------------------------------------------------------------------------------

class CaseTimeout(BaseException):
    """Raised by the watchdog; a BaseException so that no ``except Exception`` in the code under test
    turns a hang into an ordinary error."""


@dataclasses.dataclass
class Outcome:
    case: Case
    status: str  # loaded | refused | traceback | hang
    error_type: str = ""
    message: str = ""
    trace: str = ""
    seconds: float = 0.0
    stage: str = ""

    def to_json(self) -> dict:
        c = self.case
        return {"index": c.index, "seed_model": c.seed_model, "kind": c.kind, "mutation": c.mutation,
                "description": c.description, "status": self.status, "error_type": self.error_type,
                "message": self.message[:500], "stage": self.stage, "seconds": round(self.seconds, 4),
                "trace": self.trace}


def clear_error_types() -> tuple[type, ...]:
    from codegen.limits import SizeLimitError
    from felixjax.errors import UnsupportedModelError

    return (UnsupportedModelError, SizeLimitError)


def _is_clear(e: BaseException, clear: tuple[type, ...]) -> bool:
    """A felixjax error raised on purpose: not one wrapping an internal exception (the safety net)."""
    if not isinstance(e, clear):
        return False
    cause = e.__cause__
    return cause is None or isinstance(cause, clear)


@contextlib.contextmanager
def watchdog(budget_s: float) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after ``budget_s``; hard-exit (with tracebacks) after 10x
    when the hang is inside C code that never returns to Python."""
    def on_alarm(signum, frame):
        raise CaseTimeout(f"ran past {budget_s:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    faulthandler.dump_traceback_later(max(10 * budget_s, 20.0), exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


MAX_RUN_ELEMENTS = 1 << 20  # run_numpy only on models whose values (all of them together) are this small:
# a bit flip can legitimately make a Pad 8 million wide, a valid model that numpy takes 20 s to run


def run_case(case: Case, budget_s: float = 2.0) -> Outcome:
    """Load the case (and, if it loads, list its tasks and run it on zeros) under a watchdog."""
    from felixjax import load_onnx

    clear = clear_error_types()
    stage = "load_onnx"
    t0 = time.perf_counter()
    try:
        with watchdog(budget_s):
            model = load_onnx(case.data)
            stage = "tasks"
            _ = model.tasks
            stage = "summary"
            model.summary()
            stage = "run_numpy"
            shapes = model.input_shapes
            if sum(math.prod(s) for s in model.graph.shapes.values()) <= MAX_RUN_ELEMENTS:
                model.run_numpy({k: np.zeros(s, np.float32) for k, s in shapes.items()})
        return Outcome(case, "loaded", seconds=time.perf_counter() - t0, stage="done")
    except CaseTimeout as e:
        return Outcome(case, "hang", "CaseTimeout", str(e), traceback.format_exc(limit=-8),
                       time.perf_counter() - t0, stage)
    except Exception as e:  # noqa: BLE001 - classifying every failure is the point
        status = "refused" if _is_clear(e, clear) else "traceback"
        trace = "" if status == "refused" else traceback.format_exc(limit=-8)
        return Outcome(case, status, type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "",
                       trace, time.perf_counter() - t0, stage)
    except RecursionError as e:  # pragma: no cover - RecursionError is an Exception; kept for clarity
        return Outcome(case, "traceback", type(e).__name__, str(e), "", time.perf_counter() - t0, stage)


def fuzz(n: int, base_seed: int = 0, budget_s: float = 2.0, *, deadline_s: float | None = None,
         on_outcome: Callable[[Outcome], None] | None = None, verbose: bool = False) -> list[Outcome]:
    """Run cases 0..n-1 (stopping early past ``deadline_s``); returns every outcome."""
    start = time.perf_counter()
    outs = []
    for case in cases(n, base_seed):
        if deadline_s is not None and time.perf_counter() - start > deadline_s:
            break
        if verbose:
            print(f"case #{case.index} ({case.seed_model} / {case.mutation}: {case.description[:150]})",
                  file=sys.stderr, flush=True)
        out = run_case(case, budget_s)
        outs.append(out)
        if on_outcome is not None:
            on_outcome(out)
    return outs


def summarize(outs: list[Outcome], seconds: float) -> str:
    counts = Counter(o.status for o in outs)
    kinds = Counter((o.case.kind, o.status) for o in outs)
    lines = [f"{len(outs)} cases in {seconds:.1f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
             "  bytes:    " + ", ".join(f"{s} {kinds['bytes', s]}" for s in sorted(counts)),
             "  semantic: " + ", ".join(f"{s} {kinds['semantic', s]}" for s in sorted(counts))]
    slow = max(outs, key=lambda o: o.seconds, default=None)
    if slow is not None:
        lines.append(f"  slowest case: #{slow.case.index} {slow.seconds:.2f} s ({slow.case.mutation}: "
                     f"{slow.case.description})")
    refused = Counter(o.error_type for o in outs if o.status == "refused")
    lines.append("  refused with: " + ", ".join(f"{k} {v}" for k, v in refused.most_common()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0, help="base seed of the corpus")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--json", help="write every outcome to this file")
    ap.add_argument("--verbose", action="store_true",
                    help="name each case on stderr before running it (finds a hang that kills the process)")
    args = ap.parse_args(argv)
    if args.cases < 1 or not args.budget > 0:
        ap.error("--cases must be >= 1 and --budget > 0")
    t0 = time.perf_counter()

    def show(o: Outcome) -> None:
        if o.status in ("traceback", "hang"):
            print(f"#{o.case.index} {o.status} at {o.stage}: {o.error_type}: {o.message[:200]}\n"
                  f"    {o.case.seed_model} / {o.case.mutation}: {o.case.description}\n{o.trace}", flush=True)

    outs = fuzz(args.cases, args.seed, args.budget, on_outcome=show, verbose=args.verbose)
    elapsed = time.perf_counter() - t0
    print(summarize(outs, elapsed))
    if args.json:
        Path(args.json).write_text(json.dumps([o.to_json() for o in outs], indent=1))
    return 1 if any(o.status in ("traceback", "hang") for o in outs) else 0


if __name__ == "__main__":
    sys.exit(main())
