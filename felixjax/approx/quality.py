"""Quality of an approximated network, computed differentiably in JAX, and its measured metrics.

* soft channel masks: keeping a relaxed number ``kappa`` of a group's channels, ranked by filter L1
  norm, gives rank ``r`` the weight ``sigmoid((kappa - r - 0.5) / tau)`` (the hard top-``n`` mask at
  integer ``kappa`` as ``tau -> 0``);
* the straight-through estimator (:func:`ste`: the forward pass sees rounded values, the backward pass
  the identity) through which the formats fake the build's int8 and float16 arithmetic
  (``felixjax.quantize.fake_quant_inputs`` / ``round_float16``, the same arithmetic the C build runs);
* magnitude pruning masks: the fraction ``s`` of a layer's weights with the smallest magnitudes is zero
  (exactly ``ceil(s * size)`` of them; the sparse formats of :mod:`felixjax.approx.formats`).

Metrics (``metric=``): ``"accuracy"`` (top-1 against labels) and ``"fidelity"`` (top-1 agreement with
the float32 network for classifiers, else ``1 - relative L2 error``).

Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> w = jnp.asarray(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    >>> float(jax.grad(lambda v: ste(v, jnp.round(v)).sum())(w).mean())
    1.0
    >>> float(magnitude_mask(w, 0.5).mean())
    0.5
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

METRICS = ("accuracy", "fidelity")


def ste(x: Any, rounded: Any) -> Any:
    """``rounded`` in the forward pass, gradient of the identity in the backward pass."""
    return x + jax.lax.stop_gradient(rounded - x)


def magnitude_mask(w: Any, sparsity: Any) -> np.ndarray:
    """0 at the ``ceil(sparsity * size)`` entries of smallest ``|w|`` (ties by position, so exactly that
    many), 1 elsewhere: a fixed numpy mask from a layer's weights, in their shape.

    Example:
        >>> magnitude_mask(np.array([0.3, -0.1, 0.2, 0.4]), 0.5).tolist()
        [1.0, 0.0, 0.0, 1.0]
    """
    if not 0.0 <= float(sparsity) < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    a = np.abs(np.asarray(w, np.float32)).reshape(-1)
    k = math.ceil(float(sparsity) * a.size - 1e-9)
    m = np.ones(a.size, np.float32)
    m[np.argsort(a, kind="stable")[:k]] = 0.0
    return m.reshape(np.shape(w))


def soft_mask(kappa: Any, size: int, tau: float = 0.5) -> Any:
    """Weights of ranks ``0..size-1`` when keeping a relaxed ``kappa`` channels (best rank first).

    Example:
        >>> np.round(np.asarray(soft_mask(2.0, 4, tau=0.05)), 3).tolist()
        [1.0, 1.0, 0.0, 0.0]
    """
    r = jnp.arange(size, dtype=jnp.float32)
    return jax.nn.sigmoid((kappa - r - 0.5) / tau)


def check_data(x: Any, y: Any, input_shape: Sequence[int], output_shape: Sequence[int], metric: str,
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate ``(x, y)`` for a single-input network; ``x`` gets the graph's batch axis per sample.

    Raises:
        ValueError: one clear line (wrong sample shape, labels of the wrong count or range, ...).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    x = np.asarray(x, dtype=np.float32)
    given = x.shape
    sample = tuple(input_shape[1:]) if input_shape and input_shape[0] == 1 else tuple(input_shape)
    if x.ndim == len(sample):
        x = x[None]
    elif x.ndim == len(sample) + 2 and len(sample) < len(input_shape) and x.shape[1] == 1:
        x = x[:, 0]  # (N, 1, ...): each sample with the graph's batch axis of 1
    if x.ndim != len(sample) + 1 or tuple(x.shape[1:]) != sample or len(x) == 0:
        raise ValueError(f"data x has shape {given}; the model takes samples of shape {sample}, so x must be "
                         f"(N, {', '.join(map(str, sample))})")
    if not np.isfinite(x).all():
        raise ValueError("data x has NaN or infinite values")
    if metric == "fidelity":
        return x.reshape((len(x),) + tuple(input_shape)), None
    if y is None:
        raise ValueError('metric="accuracy" needs labels: data=(x, y); without labels use metric="fidelity"')
    y = np.asarray(y)
    # a graph whose batch axis is pinned above 1 takes B images per sample of x and answers B rows of scores:
    # its labels are (N, B), and accuracy compares each row with its own label (never one argmax over B rows)
    batch = 1
    if len(input_shape) >= 2 and len(output_shape) >= 2 and int(input_shape[0]) == int(output_shape[0]) > 1:
        batch = int(input_shape[0])
    want = (len(x),) if batch == 1 else (len(x), batch)
    if y.shape != want:
        raise ValueError(f"labels y have shape {y.shape}; expected {want}, one class index per "
                         + ("sample of x" if batch == 1 else f"image ({batch} per sample of x)"))
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise ValueError("labels y must be integer class indices")
        y = y.astype(np.int64)
    classes = int(np.prod(output_shape[1:])) if len(output_shape) > 1 else int(output_shape[0])
    if y.min() < 0 or y.max() >= classes:
        raise ValueError(f"labels y range over [{y.min()}, {y.max()}] but the output has {classes} classes")
    return x.reshape((len(x),) + tuple(input_shape)), y.astype(np.int64)


def within(loss: float, budget: float) -> bool:
    """Whether a quality loss is within the budget (a loss of exactly one sample in a hundred is 0.01
    in decimal but 0.010000000000000009 in floats: the budget gets that rounding's slack).

    Example:
        >>> within(1 - 0.99, 0.01), within(0.0101, 0.01)
        (True, False)
    """
    return loss <= budget + 1e-9


def score_rows(sample_shape: Sequence[int]) -> int | None:
    """Rows of class scores in one sample's output, or ``None`` when it is not a classifier's: a
    classifier answers ``(rows, classes)`` with any unit axes after the rows (``(1, 10)``,
    ``(1, 10, 1, 1)``, ``(4, 10)`` for a graph pinned to batch 4), or a bare ``(classes,)`` vector;
    feature maps such as ``(1, 4, 16, 16)`` or a sequence ``(1, 16, 32)`` are not.

    Example:
        >>> score_rows((1, 10)), score_rows((4, 10, 1, 1)), score_rows((1, 4, 16, 16)), score_rows((1, 1))
        (1, 4, None, None)
    """
    shape = tuple(int(d) for d in sample_shape)
    if len(shape) == 1:
        return 1 if shape[0] > 1 else None
    return shape[0] if len(shape) > 1 and sum(d > 1 for d in shape[1:]) == 1 else None


def metric_value(outputs: np.ndarray, metric: str, *, labels: np.ndarray | None = None,
                 reference: np.ndarray | None = None) -> float:
    """The metric (higher is better) of outputs ``[N, ...]``: accuracy (labels ``[N]``, or ``[N, B]`` for a
    graph answering B rows per sample), or fidelity to ``reference``: top-1 agreement per row of scores for
    a classifier's outputs (:func:`score_rows`), else 1 - the relative L2 error.

    Example:
        >>> out = np.array([[0.1, 0.9], [0.8, 0.2]])
        >>> metric_value(out, "accuracy", labels=np.array([1, 1]))
        0.5
    """
    outputs = np.asarray(outputs, np.float64)
    if metric == "accuracy":
        lab = np.asarray(labels).reshape(-1)
        return float(np.mean(outputs.reshape(lab.size, -1).argmax(axis=1) == lab))
    r = np.asarray(reference, np.float64)
    rows = score_rows(outputs.shape[1:])
    if rows is not None:
        o, r = outputs.reshape(len(outputs) * rows, -1), r.reshape(len(r) * rows, -1)
        return float(np.mean(o.argmax(axis=1) == r.argmax(axis=1)))
    return float(1.0 - np.linalg.norm(outputs - r) / max(np.linalg.norm(r), 1e-30))


def surrogate(outputs: Any, metric: str, *, labels: Any = None, reference: Any = None) -> Any:
    """The differentiable stand-in of a metric's loss: cross-entropy to the labels (accuracy), to the
    float32 network's softmax (fidelity of a classifier, per row of scores), else the relative squared
    error."""
    if metric == "accuracy":
        lab = labels.reshape(-1)
        o = outputs.reshape(lab.shape[0], -1)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(o), lab[:, None], axis=1))
    rows = score_rows(outputs.shape[1:])
    if rows is not None:
        o = outputs.reshape(outputs.shape[0] * rows, -1)
        r = reference.reshape(reference.shape[0] * rows, -1)
        return -jnp.mean(jnp.sum(jax.nn.softmax(r) * jax.nn.log_softmax(o), axis=1))
    return jnp.sum((outputs - reference) ** 2) / jnp.maximum(jnp.sum(reference ** 2), 1e-30)


def binomial_ci(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson 95% interval of a proportion ``p`` measured on ``n`` samples."""
    if n <= 0:
        return (0.0, 1.0)
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (float(c - h), float(c + h))
