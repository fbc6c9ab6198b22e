"""Real data offline: scikit-learn's bundled digits, upsampled, and a small residual CNN trained in Flax.

The benchmark and notebook 05 train :func:`train_cnn` on the digits (1,797 8x8 images, 10 classes),
upsampled to ``size x size`` (a multiple of 8) so the network does real work (at ``size=32``, ``width=32``: about 80
MFLOP, its conv kernels almost all of the float32 build's time), then export it to ONNX with
``onnx.helper`` (:func:`to_onnx`) for ``fj.approximate``. Architecture::

    conv3x3(1 -> w) relu -> conv3x3(w -> 2w) relu -> maxpool 2 -> conv3x3(2w -> 2w) relu
    -> conv3x3(2w -> 2w) + skip, relu -> average pool to 4x4 -> flatten -> dense(32w -> 10)

scikit-learn is a dev dependency (``pip install -e .[dev]``).

Example:
    >>> x, y = load(size=16)
    >>> x.shape, y.shape, x.dtype
    ((1797, 1, 16, 16), (1797,), dtype('float32'))
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
from onnx import TensorProto, helper, numpy_helper


def load(size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as ``(N, 1, size, size)`` float32 in [0, 1] (bilinear upsampling) and int labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise ImportError("the digits data set comes with scikit-learn: pip install scikit-learn") from e
    d = load_digits()
    img = jnp.asarray(d.images[:, None].astype(np.float32) / 16.0)
    up = jax.image.resize(img, (len(img), 1, size, size), method="bilinear")
    return np.asarray(up, np.float32), d.target.astype(np.int64)


def split(n: int, *, held_out: float = 0.35, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random split of ``range(n)``: (train indices, held-out indices)."""
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(n * held_out))
    return np.sort(perm[k:]), np.sort(perm[:k])


def _init(width: int, seed: int) -> dict[str, jnp.ndarray]:
    rng = np.random.default_rng(seed)
    w2 = 2 * width

    def he(shape: tuple[int, ...]) -> jnp.ndarray:
        fan = int(np.prod(shape[1:]))
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * np.sqrt(2.0 / fan))

    return {"w1": he((width, 1, 3, 3)), "b1": jnp.zeros(width), "w2": he((w2, width, 3, 3)), "b2": jnp.zeros(w2),
            "w3": he((w2, w2, 3, 3)), "b3": jnp.zeros(w2), "w4": he((w2, w2, 3, 3)) * 0.5, "b4": jnp.zeros(w2),
            "wd": he((10, w2 * 16)) * 0.5, "bd": jnp.zeros(10)}


def forward(p: dict[str, Any], x: Any) -> Any:
    """Logits of a batch ``(B, 1, H, W)`` (the network :func:`to_onnx` exports)."""
    def conv(v: Any, w: Any, b: Any) -> Any:
        y = jax.lax.conv_general_dilated(v, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + b.reshape(1, -1, 1, 1)

    h = jax.nn.relu(conv(x, p["w1"], p["b1"]))
    h = jax.nn.relu(conv(h, p["w2"], p["b2"]))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    r = jax.nn.relu(conv(h, p["w3"], p["b3"]))
    h = jax.nn.relu(conv(r, p["w4"], p["b4"]) + h)
    k = h.shape[2] // 4
    h = jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 1, k, k), (1, 1, k, k), "VALID") / (k * k)
    return h.reshape(h.shape[0], -1) @ p["wd"].T + p["bd"]


def train_cnn(x: np.ndarray, y: np.ndarray, *, width: int = 32, epochs: int = 4, batch: int = 64,
              lr: float = 3e-3, seed: int = 0) -> dict[str, np.ndarray]:
    """Train the CNN (Adam, cross-entropy) and return its float32 weights."""
    params = _init(width, seed)
    opt = optax.adam(lr)
    state = opt.init(params)

    def loss(p: Any, xb: Any, yb: Any) -> Any:
        logits = forward(p, xb)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], axis=1))

    @jax.jit
    def step(p: Any, s: Any, xb: Any, yb: Any) -> tuple:
        g = jax.grad(loss)(p, xb, yb)
        u, s = opt.update(g, s)
        return optax.apply_updates(p, u), s

    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        perm = rng.permutation(len(x))
        for k in range(0, len(x) - batch + 1, batch):
            idx = perm[k: k + batch]
            params, state = step(params, state, x[idx], y[idx])
    return {k: np.asarray(v, np.float32) for k, v in params.items()}


def accuracy(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of the trained weights in JAX."""
    return float(np.mean(np.asarray(jax.jit(forward)(params, x)).argmax(axis=1) == y))


def to_onnx(params: dict[str, np.ndarray], size: int) -> onnx.ModelProto:
    """The trained CNN as an ONNX model (opset 13, batch 1, input ``"image"``, output ``"logits"``)."""
    init = [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in params.items()]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1", **conv),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", **conv),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p2", "w3", "b3"], ["c3"], name="conv3", **conv),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["r3", "w4", "b4"], ["c4"], name="conv4", **conv),
        helper.make_node("Add", ["c4", "p2"], ["a4"], name="skip"),
        helper.make_node("Relu", ["a4"], ["r4"], name="relu4"),
        helper.make_node("AveragePool", ["r4"], ["g"], name="avgpool", kernel_shape=[size // 8] * 2,
                         strides=[size // 8] * 2),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wd", "bd"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "digits_cnn",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def untrained_model(width: int = 8, seed: int = 0, n: int = 40) -> tuple[Any, onnx.ModelProto, np.ndarray]:
    """``(loaded model, ONNX proto, n random 8x8 images)`` of the digits CNN at random (untrained) weights:
    the small network the approximation tests build at every format.

    Example:
        >>> model, proto, x = untrained_model()
        >>> x.shape, sum(n.is_anchor for n in model.graph.nodes)
        ((40, 1, 8, 8), 5)
    """
    from felixjax.onnx_import import load_onnx

    proto = to_onnx({k: np.asarray(v) for k, v in _init(width, seed).items()}, 8)
    x = np.random.default_rng(seed).uniform(0, 1, (n, 1, 8, 8)).astype(np.float32)
    return load_onnx(proto), proto, x
