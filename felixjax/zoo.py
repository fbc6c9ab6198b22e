"""A model zoo built with ``onnx.helper`` and seeded random weights, generated on demand (never committed).

``resnet18``, ``mobilenet_v2`` and ``vgg16`` at ``dataset="cifar10"`` (32x32 input, 10 classes, the usual
CIFAR variants: no stem down-sampling) or ``"imagenet"`` (224x224, 1000 classes), and
``transformer_block`` (a post-norm encoder block: Q/K/V projections, softmax attention, a GELU (Erf) MLP, one
LayerNormalization and one ReduceMean-based layer norm). Models are written with IR version 8 and opset 13
(17 for the transformer, whose LayerNormalization needs it), which onnxruntime 1.18+ loads.

Weights are float32 and He-initialized; BatchNormalization gets random running statistics drawn around the
statistics its input is expected to have (tracked through the network analytically), so activations stay
O(1) from input to logits without any calibration data.

Example:
    >>> m = make_model("resnet18", dataset="cifar10", seed=0)
    >>> m.opset_import[0].version, [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    (13, [1, 3, 32, 32])
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
DATASETS = {"cifar10": (32, 10), "imagenet": (224, 1000)}


class _Builder:
    """Appends nodes and initializers; tracks each tensor's expected mean square to pick BN statistics."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.ms: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        k = self.counts[prefix] = self.counts.get(prefix, 0) + 1
        return f"{prefix}{k}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], ms: float, **attrs) -> str:
        name = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        self.ms[name] = ms
        return name

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    # ---- layers -------------------------------------------------------------------------------
    def conv(self, x: str, cin: int, cout: int, k: int, *, stride: int = 1, groups: int = 1, bias: bool = False,
             gain: float = 2.0) -> str:
        fan_in = cin // groups * k * k
        w = self.const("W", self.normal((cout, cin // groups, k, k), math.sqrt(gain / fan_in)))
        inputs = [x, w] + ([self.const("B", self.normal((cout,), 0.05))] if bias else [])
        p = k // 2
        return self.node("Conv", inputs, gain * self.ms[x], kernel_shape=[k, k], strides=[stride, stride],
                         pads=[p, p, p, p], group=groups)

    def bn(self, x: str, c: int, *, gamma: tuple[float, float] = (0.8, 1.2)) -> str:
        ms = self.ms[x]
        scale = self.rng.uniform(*gamma, c).astype(np.float32)
        shift = self.normal((c,), 0.1)
        mean = self.normal((c,), 0.1 * math.sqrt(ms))
        var = (ms * self.rng.uniform(0.8, 1.25, c)).astype(np.float32)
        names = [self.const(p, v) for p, v in (("gamma", scale), ("beta", shift), ("mean", mean), ("var", var))]
        return self.node("BatchNormalization", [x] + names, 1.0, epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.node("Relu", [x], self.ms[x] / 2)

    def relu6(self, x: str) -> str:
        lo, hi = self.const("min", np.array(0, np.float32)), self.const("max", np.array(6, np.float32))
        return self.node("Clip", [x, lo, hi], self.ms[x] / 2)

    def add(self, a: str, b: str) -> str:
        return self.node("Add", [a, b], self.ms[a] + self.ms[b])

    def gemm(self, x: str, cin: int, cout: int, *, gain: float = 2.0) -> str:
        w = self.const("W", self.normal((cout, cin), math.sqrt(gain / cin)))
        b = self.const("B", self.normal((cout,), 0.05))
        return self.node("Gemm", [x, w, b], gain * self.ms[x], transB=1)

    def matmul_bias(self, x: str, cin: int, cout: int, *, gain: float = 1.0) -> str:
        w = self.const("W", self.normal((cin, cout), math.sqrt(gain / cin)))
        y = self.node("MatMul", [x, w], gain * self.ms[x])
        return self.node("Add", [y, self.const("B", self.normal((cout,), 0.05))], self.ms[y])

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], output: str, out_shape: list[int],
              opset: int) -> onnx.ModelProto:
        out = helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)
        graph = helper.make_graph(self.nodes, name, inputs, [out], initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION,
                                 producer_name="felixjax.zoo")


def _image_input(b: _Builder, batch: int, size: int) -> onnx.ValueInfoProto:
    b.ms["input"] = 1.0
    return helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, size, size])


def _resnet18(b: _Builder, batch: int, size: int, classes: int) -> tuple[list, str, list[int]]:
    inp = _image_input(b, batch, size)
    if size <= 64:  # CIFAR variant: 3x3 stem, no max-pool
        x = b.relu(b.bn(b.conv("input", 3, 64, 3), 64))
    else:
        x = b.relu(b.bn(b.conv("input", 3, 64, 7, stride=2), 64))
        x = b.node("MaxPool", [x], b.ms[x] * 1.5, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = b.relu(b.bn(b.conv(x, cin, cout, 3, stride=stride), cout))
            y = b.bn(b.conv(y, cout, cout, 3), cout, gamma=(0.4, 0.7))  # damped residual branch
            shortcut = x
            if stride != 1 or cin != cout:
                shortcut = b.bn(b.conv(x, cin, cout, 1, stride=stride), cout)
            x = b.relu(b.add(y, shortcut))
            cin = cout
    x = b.node("GlobalAveragePool", [x], b.ms[x])
    x = b.node("Flatten", [x], b.ms[x], axis=1)
    return [inp], b.gemm(x, 512, classes, gain=1.0), [batch, classes]


_MBV2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _mobilenet_v2(b: _Builder, batch: int, size: int, classes: int) -> tuple[list, str, list[int]]:
    inp = _image_input(b, batch, size)
    cifar = size <= 64  # CIFAR variant: stride 1 in the stem and in the 24-channel stage
    x = b.relu6(b.bn(b.conv("input", 3, 32, 3, stride=1 if cifar else 2), 32))
    cin = 32
    for i, (t, c, n, s) in enumerate(_MBV2):
        for j in range(n):
            stride = (1 if cifar and i == 1 else s) if j == 0 else 1
            hidden = cin * t
            y = x if t == 1 else b.relu6(b.bn(b.conv(x, cin, hidden, 1), hidden))
            y = b.relu6(b.bn(b.conv(y, hidden, hidden, 3, stride=stride, groups=hidden), hidden))
            y = b.bn(b.conv(y, hidden, c, 1, gain=1.0), c, gamma=(0.4, 0.7) if stride == 1 and cin == c else (0.8, 1.2))
            x = b.add(y, x) if stride == 1 and cin == c else y
            cin = c
    x = b.relu6(b.bn(b.conv(x, cin, 1280, 1), 1280))
    x = b.node("GlobalAveragePool", [x], b.ms[x])
    x = b.node("Flatten", [x], b.ms[x], axis=1)
    x = b.node("Dropout", [x], b.ms[x])
    return [inp], b.gemm(x, 1280, classes, gain=1.0), [batch, classes]


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _vgg16(b: _Builder, batch: int, size: int, classes: int) -> tuple[list, str, list[int]]:
    inp = _image_input(b, batch, size)
    x, cin = "input", 3
    for v in _VGG16:
        if v == "M":
            x = b.node("MaxPool", [x], b.ms[x] * 1.5, kernel_shape=[2, 2], strides=[2, 2])
        else:
            x, cin = b.relu(b.conv(x, cin, v, 3, bias=True)), v
    spatial = size // 32
    shape = b.const("shape", np.array([batch, -1], np.int64))
    x = b.node("Reshape", [x, shape], b.ms[x])
    hidden = 512 if size <= 64 else 4096
    features = 512 * spatial * spatial
    for _ in range(2):
        x = b.node("Dropout", [b.relu(b.gemm(x, features, hidden))], b.ms[x])
        features = hidden
    return [inp], b.gemm(x, hidden, classes, gain=1.0), [batch, classes]


def _layer_norm_reduce_mean(b: _Builder, x: str, dim: int) -> str:
    """Layer norm from ReduceMean / Sub / Pow / Sqrt / Div, as exporters emit it before opset 17."""
    mu = b.node("ReduceMean", [x], 0.0, axes=[-1], keepdims=1)
    d = b.node("Sub", [x, mu], b.ms[x])
    var = b.node("ReduceMean", [b.node("Pow", [d, b.const("two", np.array(2, np.float32))], 1.0)], 1.0, axes=[-1],
                 keepdims=1)
    std = b.node("Sqrt", [b.node("Add", [var, b.const("eps", np.array(1e-5, np.float32))], 1.0)], 1.0)
    y = b.node("Div", [d, std], 1.0)
    y = b.node("Mul", [y, b.const("gamma", b.rng.uniform(0.8, 1.2, dim).astype(np.float32))], 1.0)
    return b.node("Add", [y, b.const("beta", b.normal((dim,), 0.1))], 1.0)


def _transformer_block(b: _Builder, batch: int, seq: int = 128, dim: int = 256, heads: int = 4,
                       ffn: int | None = None) -> tuple[list, str, list[int]]:
    ffn = ffn or 4 * dim
    dh = dim // heads
    if dh * heads != dim:
        raise ValueError(f"dim={dim} is not divisible by heads={heads}")
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, dim])
    b.ms["x"] = 1.0
    split = b.const("shape", np.array([batch, seq, heads, dh], np.int64))
    q, k, v = (b.node("Reshape", [b.matmul_bias("x", dim, dim), split], 1.0) for _ in range(3))
    q = b.node("Transpose", [q], 1.0, perm=[0, 2, 1, 3])
    k = b.node("Transpose", [k], 1.0, perm=[0, 2, 3, 1])
    v = b.node("Transpose", [v], 1.0, perm=[0, 2, 1, 3])
    scores = b.node("Mul", [b.node("MatMul", [q, k], dh), b.const("scale", np.array(dh ** -0.5, np.float32))], 1.0)
    probs = b.node("Softmax", [scores], 1.0 / seq, axis=-1)
    ctx = b.node("Transpose", [b.node("MatMul", [probs, v], 1.0)], 1.0, perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, b.const("shape", np.array([batch, seq, dim], np.int64))], 1.0)
    h = b.add(b.matmul_bias(ctx, dim, dim), "x")
    ln_w, ln_b = b.const("gamma", b.rng.uniform(0.8, 1.2, dim).astype(np.float32)), b.const("beta", b.normal((dim,), 0.1))
    h = b.node("LayerNormalization", [h, ln_w, ln_b], 1.0, axis=-1, epsilon=1e-5)
    u = b.matmul_bias(h, dim, ffn)
    erf = b.node("Erf", [b.node("Div", [u, b.const("sqrt2", np.array(math.sqrt(2), np.float32))], 1.0)], 1.0)
    gelu = b.node("Mul", [b.node("Mul", [u, b.node("Add", [erf, b.const("one", np.array(1, np.float32))], 1.0)], 1.0),
                          b.const("half", np.array(0.5, np.float32))], 0.5)
    z = b.add(b.matmul_bias(gelu, ffn, dim, gain=2.0), h)
    return [inp], _layer_norm_reduce_mean(b, z, dim), [batch, seq, dim]


_CNNS: dict[str, Callable] = {"resnet18": _resnet18, "mobilenet_v2": _mobilenet_v2, "vgg16": _vgg16}
MODELS = tuple(_CNNS) + ("transformer_block",)


def make_model(name: str, dataset: str = "cifar10", *, seed: int = 0, batch: int = 1, **options) -> onnx.ModelProto:
    """Build zoo model ``name`` with seeded random weights.

    ``dataset`` ("cifar10" or "imagenet") sets the CNNs' input size and class count; the transformer block
    ignores it and takes ``seq`` (128), ``dim`` (256), ``heads`` (4) and ``ffn`` (4 * dim) instead.

    Example:
        >>> m = make_model("transformer_block", seq=64, dim=256)
        >>> m.opset_import[0].version, sorted({n.op_type for n in m.graph.node})[:4]
        (17, ['Add', 'Div', 'Erf', 'LayerNormalization'])
    """
    b = _Builder(seed)
    if name == "transformer_block":
        inputs, out, shape = _transformer_block(b, batch, **options)
        return b.model(name, inputs, out, shape, opset=17)
    if name not in _CNNS:
        raise ValueError(f"unknown zoo model {name!r}; available: {', '.join(MODELS)}")
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; available: {', '.join(DATASETS)}")
    if options:
        raise ValueError(f"{name} takes no options {sorted(options)}")
    size, classes = DATASETS[dataset]
    inputs, out, shape = _CNNS[name](b, batch, size, classes)
    return b.model(f"{name}_{dataset}", inputs, out, shape, opset=13)


def save(name: str, path: str | os.PathLike, dataset: str = "cifar10", *, seed: int = 0, batch: int = 1,
         **options) -> str:
    """Build zoo model ``name`` and write it to ``path`` (weights inline; the largest, VGG-16 at 224, is
    ~550 MB, under protobuf's 2 GB limit). Returns the path written.

    Example:
        >>> import tempfile, os
        >>> p = save("vgg16", os.path.join(tempfile.mkdtemp(), "vgg.onnx"))
        >>> os.path.getsize(p) > 50_000_000
        True
    """
    model = make_model(name, dataset, seed=seed, batch=batch, **options)
    onnx.save_model(model, os.fspath(path))
    return os.fspath(path)
