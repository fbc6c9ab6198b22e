"""The cost-model protocol, the feature bundle, and ranking metrics.

A cost model maps a batch of program features to a score, "predicted −log(latency in seconds)":
higher is faster. Models take arrays only; turning schedules and records into arrays is the job of
``felixjax``.

Feature layout (one batch of ``B`` programs):

- ``access``: float32 ``[B, A, F]``, one row of ``F`` features per buffer access, ``A`` slots
  (padded), already ``log(1 + v)``-transformed.
- ``mask``: float32 ``[B, A]``, 1 for real access slots, 0 for padding.
- ``glob``: float32 ``[B, G]``, per-program features (FLOPs, bytes, parallel efficiency, ...).

``apply`` also accepts any number of leading batch axes (or none: ``[A, F]``, ``[A]``, ``[G]`` for
one program), so it can be used under ``jax.vmap`` and ``jax.grad`` per program.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np


class Features(NamedTuple):
    """Features of a batch of programs (a pytree: it passes through ``jit``, ``vmap`` and ``grad``).

    Attributes:
        access: ``[..., A, F]`` per-access features (``log(1 + v)``).
        mask: ``[..., A]`` 1.0 for real access slots, 0.0 for padding.
        glob: ``[..., G]`` per-program features.

    Example:
        >>> import numpy as np
        >>> f = Features(np.zeros((2, 4, 3)), np.ones((2, 4)), np.zeros((2, 5)))
        >>> num_programs(f)
        2
    """

    access: Any
    mask: Any
    glob: Any


@runtime_checkable
class CostModel(Protocol):
    """What every cost model provides. Scores are predicted ``−log(latency in seconds)``.

    ``apply`` is pure and differentiable (``jit``, ``vmap``, ``grad`` w.r.t. the feature arrays);
    ``predict`` is its numpy convenience; ``update`` trains on measurements (a no-op for the prior)
    and returns metrics.
    """

    @property
    def params(self) -> Any:
        """The pytree that ``apply`` takes."""
        ...

    def apply(self, params: Any, features: Features) -> Any:
        """Pure score function: ``[..., A, F]`` features → ``[...]`` scores (jnp)."""
        ...

    def predict(self, features: Features) -> np.ndarray:
        """Scores ``[B]`` as a numpy array."""
        ...

    def update(self, features: Features, latencies: Any, groups: Any) -> dict[str, float]:
        """Trains on measured latencies (seconds); ``groups`` are int task ids."""
        ...


def num_programs(features: Features) -> int:
    """Number of programs ``B`` in a batched ``Features``.

    Example:
        >>> num_programs(Features(np.zeros((3, 2, 4)), np.ones((3, 2)), np.zeros((3, 1))))
        3
    """
    return int(np.shape(features.access)[0])


def as_numpy_features(features: Features) -> Features:
    """Validates a batched ``Features`` and returns it as float32 numpy arrays.

    Raises:
        ValueError: if the shapes do not agree with ``[B, A, F]``, ``[B, A]``, ``[B, G]``.

    Example:
        >>> f = as_numpy_features(Features(np.zeros((2, 4, 3)), np.ones((2, 4)), np.zeros((2, 5))))
        >>> f.access.dtype, f.glob.shape
        (dtype('float32'), (2, 5))
    """
    access = np.asarray(features.access, dtype=np.float32)
    mask = np.asarray(features.mask, dtype=np.float32)
    glob = np.asarray(features.glob, dtype=np.float32)
    if access.ndim != 3 or mask.shape != access.shape[:2] or glob.ndim != 2:
        raise ValueError(
            "expected access [B, A, F], mask [B, A], glob [B, G]; got "
            f"{access.shape}, {mask.shape}, {glob.shape}"
        )
    if glob.shape[0] != access.shape[0]:
        raise ValueError(f"batch sizes differ: access {access.shape[0]}, glob {glob.shape[0]}")
    return Features(access, mask, glob)


def take(features: Features, index: Any) -> Features:
    """Selects programs ``index`` (an int array or slice) from a batched ``Features``.

    Example:
        >>> f = Features(np.zeros((5, 2, 3)), np.ones((5, 2)), np.zeros((5, 1)))
        >>> take(f, np.array([0, 4])).access.shape
        (2, 2, 3)
    """
    return Features(features.access[index], features.mask[index], features.glob[index])


def pad_accesses(features: Features, num_slots: int) -> Features:
    """Pads the access axis of numpy ``Features`` with masked-out zero slots up to ``num_slots``.

    Example:
        >>> f = Features(np.ones((2, 3, 4)), np.ones((2, 3)), np.zeros((2, 1)))
        >>> g = pad_accesses(f, 5)
        >>> g.access.shape, g.mask[0].tolist()
        ((2, 5, 4), [1.0, 1.0, 1.0, 0.0, 0.0])
    """
    extra = num_slots - features.access.shape[1]
    if extra < 0:
        raise ValueError(f"cannot pad {features.access.shape[1]} access slots down to {num_slots}")
    if extra == 0:
        return features
    access = np.pad(features.access, ((0, 0), (0, extra), (0, 0)))
    mask = np.pad(features.mask, ((0, 0), (0, extra)))
    return Features(access, mask, features.glob)


def concat_features(parts: "list[Features]") -> Features:
    """Concatenates numpy ``Features`` along the batch axis, padding each to the widest access axis.

    Example:
        >>> a = Features(np.ones((2, 3, 4)), np.ones((2, 3)), np.zeros((2, 1)))
        >>> b = Features(np.ones((1, 5, 4)), np.ones((1, 5)), np.zeros((1, 1)))
        >>> concat_features([a, b]).access.shape
        (3, 5, 4)
    """
    slots = max(f.access.shape[1] for f in parts)
    parts = [pad_accesses(f, slots) for f in parts]
    return Features(*(np.concatenate([getattr(f, k) for f in parts]) for k in ("access", "mask", "glob")))


def pad_batch(features: Features, size: int) -> Features:
    """Pads numpy ``Features`` along the batch axis with zero programs up to ``size``.

    Example:
        >>> f = Features(np.ones((2, 3, 4)), np.ones((2, 3)), np.ones((2, 1)))
        >>> pad_batch(f, 4).glob[:, 0].tolist()
        [1.0, 1.0, 0.0, 0.0]
    """
    extra = size - features.access.shape[0]
    if extra <= 0:
        return features
    return Features(
        np.pad(features.access, ((0, extra), (0, 0), (0, 0))),
        np.pad(features.mask, ((0, extra), (0, 0))),
        np.pad(features.glob, ((0, extra), (0, 0))),
    )


# Inference runs in chunks padded to one of two sizes, so it compiles at most twice per architecture.
_SMALL_CHUNK, _LARGE_CHUNK = 64, 512


def inference_chunks(n: int) -> list[tuple[int, int, int]]:
    """``(start, stop, padded_size)`` chunks covering ``range(n)`` with fixed padded sizes.

    Example:
        >>> inference_chunks(600)
        [(0, 512, 512), (512, 600, 512)]
        >>> inference_chunks(50)
        [(0, 50, 64)]
    """
    chunks = []
    for start in range(0, n, _LARGE_CHUNK):
        stop = min(start + _LARGE_CHUNK, n)
        chunks.append((start, stop, _SMALL_CHUNK if stop - start <= _SMALL_CHUNK else _LARGE_CHUNK))
    return chunks


def predict_in_chunks(fn: Any, params: Any, features: Features) -> Any:
    """Runs a jitted ``fn(params, features)`` over numpy ``Features`` in fixed-size padded chunks.

    ``fn`` returns one ``[chunk]`` array or a tuple of them; the result has the same structure,
    as numpy arrays of length ``B``.

    Example:
        >>> f = Features(np.ones((70, 2, 3)), np.ones((70, 2)), np.ones((70, 1)))
        >>> predict_in_chunks(lambda p, f: f.glob[:, 0] * p, 2.0, f).shape
        (70,)
    """
    pieces = []
    for start, stop, size in inference_chunks(features.access.shape[0]):
        out = fn(params, pad_batch(take(features, slice(start, stop)), size))
        pieces.append(jax.tree_util.tree_map(lambda x, n=stop - start: np.asarray(x)[:n], out))
    if not pieces:
        probe = fn(params, pad_batch(take(features, slice(0, 0)), _SMALL_CHUNK))
        return jax.tree_util.tree_map(lambda x: np.zeros(0, np.asarray(x).dtype), probe)
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *pieces)


def holdout_mask(features: Features, fraction: float) -> np.ndarray:
    """A stable hold-out assignment: row ``i`` is held out iff a hash of its features says so.

    The same program (same real access slots and glob features) always lands on the same side,
    whatever else is in the dataset and however many padding slots it has; so held-out rows stay
    unseen across online updates, and repeated measurements of one program never straddle the split.

    Example:
        >>> f = Features(np.arange(40.0).reshape(20, 1, 2), np.ones((20, 1)), np.zeros((20, 1)))
        >>> m = holdout_mask(f, 0.5)
        >>> bool((holdout_mask(take(f, slice(0, 10)), 0.5) == m[:10]).all())
        True
    """
    access = np.asarray(features.access, np.float32)
    mask = np.asarray(features.mask, np.float32) > 0
    glob = np.asarray(features.glob, np.float32)
    out = np.zeros(len(access), bool)
    for i in range(len(access)):
        digest = hashlib.blake2b(np.ascontiguousarray(access[i][mask[i]]).tobytes(), digest_size=8)
        digest.update(np.ascontiguousarray(glob[i]).tobytes())
        out[i] = int.from_bytes(digest.digest(), "little") < fraction * 2.0**64
    return out


def neg_log_latency(latencies: Any) -> np.ndarray:
    """The regression target: ``−log(latency in seconds)`` as float64 numpy.

    Example:
        >>> float(neg_log_latency([1.0])[0])
        -0.0
    """
    return -np.log(np.asarray(latencies, dtype=np.float64))


def _group_slices(groups: np.ndarray) -> list[np.ndarray]:
    """Indices of each group, in order of first appearance."""
    _, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.diff(inverse[order])) + 1
    return np.split(order, bounds)


def _pair_counts(scores: np.ndarray, latencies: np.ndarray, rtol: float) -> tuple[float, int]:
    """(correct pairs, with score ties as half, and number of compared pairs) in one group."""
    n = len(scores)
    correct = 0.0
    total = 0
    block = 1024  # rows per block, so a group of 10k programs stays within ~100 MB
    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        d_lat = latencies[rows, None] - latencies[None, :]
        d_score = scores[rows, None] - scores[None, :]
        # upper triangle only: each unordered pair once
        upper = np.arange(start, rows.stop)[:, None] < np.arange(n)[None, :]
        scale = np.maximum(np.abs(latencies[rows, None]), np.abs(latencies[None, :]))
        valid = upper & (np.abs(d_lat) > rtol * scale) & (d_lat != 0)
        # the faster program (smaller latency) should have the higher score
        agree = np.sign(d_score) * -np.sign(d_lat)
        correct += float(np.sum((agree > 0) & valid)) + 0.5 * float(np.sum((agree == 0) & valid))
        total += int(np.sum(valid))
    return correct, total


def pairwise_accuracy(scores: Any, latencies: Any, groups: Any = None, *, rtol: float = 0.0) -> float:
    """Fraction of within-group pairs that the scores order like the latencies.

    Higher score must mean lower latency. Pairs from different groups are never compared; pairs
    with equal latency (within ``rtol`` relative) are skipped; equal scores count as half right.

    Args:
        scores: ``[N]`` predicted scores (higher = faster).
        latencies: ``[N]`` measured latencies.
        groups: ``[N]`` int task ids; ``None`` puts everything in one group.
        rtol: latencies closer than this (relative) are treated as ties.

    Returns:
        The accuracy in ``[0, 1]``, or ``nan`` when there is no comparable pair.

    Example:
        >>> pairwise_accuracy([3.0, 2.0, 1.0], [1e-3, 2e-3, 3e-3], [0, 0, 0])
        1.0
        >>> pairwise_accuracy([1.0, 2.0, 5.0, 0.0], [1.0, 2.0, 1.0, 2.0], [0, 0, 1, 1])
        0.5
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    latencies = np.asarray(latencies, dtype=np.float64).reshape(-1)
    groups = np.zeros(len(scores), np.int64) if groups is None else np.asarray(groups).reshape(-1)
    correct, total = 0.0, 0
    for idx in _group_slices(groups):
        c, t = _pair_counts(scores[idx], latencies[idx], rtol)
        correct += c
        total += t
    return correct / total if total else float("nan")


def _kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b of one group (O(n²), blocked); nan if either side is constant."""
    n = len(x)
    concordant_minus_discordant = 0.0
    n_pairs = n * (n - 1) // 2
    ties_x = ties_y = 0
    block = 1024
    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        upper = np.arange(start, rows.stop)[:, None] < np.arange(n)[None, :]
        sx = np.sign(x[rows, None] - x[None, :])
        sy = np.sign(y[rows, None] - y[None, :])
        concordant_minus_discordant += float(np.sum(sx * sy * upper))
        ties_x += int(np.sum((sx == 0) & upper))
        ties_y += int(np.sum((sy == 0) & upper))
    denom = np.sqrt(float(n_pairs - ties_x) * float(n_pairs - ties_y))
    return concordant_minus_discordant / denom if denom > 0 else float("nan")


def kendall_tau(scores: Any, latencies: Any, groups: Any = None) -> float:
    """Kendall's tau-b between scores and speed (``−latency``), per group, averaged over groups.

    Groups with fewer than two programs, or with constant scores or latencies, are left out.

    Args:
        scores: ``[N]`` predicted scores (higher = faster).
        latencies: ``[N]`` measured latencies.
        groups: ``[N]`` int task ids; ``None`` puts everything in one group.

    Returns:
        The mean tau in ``[-1, 1]``, or ``nan`` when no group qualifies.

    Example:
        >>> kendall_tau([3.0, 2.0, 1.0, 0.0, 1.0], [1.0, 2.0, 3.0, 1.0, 2.0], [0, 0, 0, 1, 1])
        0.0
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    latencies = np.asarray(latencies, dtype=np.float64).reshape(-1)
    groups = np.zeros(len(scores), np.int64) if groups is None else np.asarray(groups).reshape(-1)
    taus = [_kendall_tau_b(scores[idx], -latencies[idx]) for idx in _group_slices(groups)]
    taus = [t for t in taus if np.isfinite(t)]
    return float(np.mean(taus)) if taus else float("nan")


def ranking_metrics(scores: Any, latencies: Any, groups: Any = None, *, prefix: str = "") -> dict[str, float]:
    """Pairwise accuracy, Kendall tau and log-RMSE of scores against latencies, as one dict.

    Example:
        >>> m = ranking_metrics([3.0, 2.0], [np.exp(-3.0), np.exp(-2.0)], prefix="val_")
        >>> m["val_pairwise_accuracy"], m["val_log_rmse"]
        (1.0, 0.0)
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    target = neg_log_latency(latencies).reshape(-1)
    rmse = float(np.sqrt(np.mean((scores - target) ** 2))) if len(scores) else float("nan")
    return {
        f"{prefix}pairwise_accuracy": pairwise_accuracy(scores, latencies, groups),
        f"{prefix}kendall_tau": kendall_tau(scores, latencies, groups),
        f"{prefix}log_rmse": round(rmse, 12),
    }


def check_measurements(
    features: Features, latencies: Any, groups: Any
) -> tuple[Features, np.ndarray, np.ndarray, int]:
    """Validates a training set; drops rows whose latency is not finite and positive.

    Returns:
        ``(features, latencies, groups, n_dropped)`` as numpy arrays (float32, float64, int64).

    Example:
        >>> f = Features(np.zeros((3, 1, 2)), np.ones((3, 1)), np.zeros((3, 1)))
        >>> _, lat, grp, dropped = check_measurements(f, [1e-3, np.inf, 2e-3], None)
        >>> lat.tolist(), grp.tolist(), dropped
        ([0.001, 0.002], [0, 0], 1)
    """
    features = as_numpy_features(features)
    latencies = np.asarray(latencies, dtype=np.float64).reshape(-1)
    n = num_programs(features)
    groups = np.zeros(n, np.int64) if groups is None else np.asarray(groups, dtype=np.int64).reshape(-1)
    if len(latencies) != n or len(groups) != n:
        raise ValueError(f"{n} programs but {len(latencies)} latencies and {len(groups)} groups")
    ok = np.isfinite(latencies) & (latencies > 0)
    if ok.all():
        return features, latencies, groups, 0
    return take(features, ok), latencies[ok], groups[ok], int(n - ok.sum())
