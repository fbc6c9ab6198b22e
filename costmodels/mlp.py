"""A Flax NNX segment-sum MLP cost model (after TenSet / Felix ``SegmentSumMLP``), trained with optax.

Architecture (``H`` = ``hidden``)::

    per access:   Linear(F→H) · ReLU · Linear(H→H) · ReLU       [..., A, H]
    masked sum over the A access slots                          [..., H]
    glob:         Linear(G→H) · ReLU                            [..., H]
    mix:          Linear(2H→H) · ReLU on the concatenation
    2 residual blocks:  h = ReLU(Linear(h)) + h
    output:       Linear(H→1)  → predicted −log(latency in seconds)

Inputs are standardized with per-column mean/std computed at the first fit, and the output is
de-standardized with the target mean/std of that fit; these statistics are part of ``params``
(under ``"norm"``) and are frozen afterwards, so ``apply`` stays a fixed, differentiable function.

Training: log-MSE plus a within-group pairwise RankNet loss, optax Adam(W) with global-norm
clipping, fixed-shape padded batches so the train step compiles once per architecture, a cosine
learning-rate decay per update, and early stopping on a held-out split by pairwise accuracy
(keeping the best weights, including the weights the update started from).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from costmodels.base import (
    Features,
    as_numpy_features,
    check_measurements,
    holdout_mask,
    neg_log_latency,
    pad_accesses,
    pairwise_accuracy,
    predict_in_chunks,
    ranking_metrics,
    take,
)
from costmodels.checkpoint import load_npz, save_npz, unflatten_params

# How many times each train step was traced (= compiled), keyed by architecture; see
# ``MLPCostModel.train_step_traces``.
_TRACE_COUNTS: collections.Counter = collections.Counter()

class SegmentSumMLP(nnx.Module):
    """The network: per-access encoder, masked sum, glob encoder, two residual blocks, one output.

    Args:
        n_access_features: ``F``, features per access slot.
        n_glob_features: ``G``, per-program features.
        hidden: ``H``, the width of every hidden layer.
        rngs: NNX random streams for initialization.

    Example:
        >>> net = SegmentSumMLP(3, 2, hidden=8, rngs=nnx.Rngs(0))
        >>> net(jnp.ones((5, 4, 3)), jnp.ones((5, 4)), jnp.ones((5, 2))).shape
        (5,)
    """

    def __init__(self, n_access_features: int, n_glob_features: int, *, hidden: int = 256, rngs: nnx.Rngs):
        self.access_in = nnx.Linear(n_access_features, hidden, rngs=rngs)
        self.access_hidden = nnx.Linear(hidden, hidden, rngs=rngs)
        self.glob_in = nnx.Linear(n_glob_features, hidden, rngs=rngs)
        self.mix = nnx.Linear(2 * hidden, hidden, rngs=rngs)
        self.residual1 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.residual2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, 1, rngs=rngs)

    def __call__(self, access: jax.Array, mask: jax.Array, glob: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.access_hidden(jax.nn.relu(self.access_in(access))))
        h = jnp.sum(h * mask[..., None], axis=-2)  # padded slots contribute nothing
        g = jax.nn.relu(self.glob_in(glob))
        h = jax.nn.relu(self.mix(jnp.concatenate([h, g], axis=-1)))
        h = jax.nn.relu(self.residual1(h)) + h
        h = jax.nn.relu(self.residual2(h)) + h
        return self.out(h)[..., 0]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters of ``MLPCostModel`` (Felix/TenSet defaults where they exist).

    Attributes:
        learning_rate: Adam step size at the start of each update (cosine-decayed within it).
        final_lr_fraction: the learning rate at the end of an update, as a fraction of the start.
        weight_decay: decoupled (AdamW) weight decay.
        grad_clip: global gradient-norm clip.
        batch_size: programs per step; every batch is padded to exactly this size.
        rank_weight: weight of the within-group RankNet loss next to the log-MSE.
        sample_budget: epochs per update = sample_budget / n_train (Felix: 30000 / |D|), clipped.
        min_epochs: at least this many epochs per update.
        max_epochs: at most this many epochs per update.
        max_samples: about this many rows visited per update at most (``epochs x rows``; each epoch
            at least one batch; 0, the default: no cap): a longer history trains each epoch on a fresh
            random subset of its rows, so an update's cost stops growing with the history (online
            tuning sets it).
        patience: early stop after ``max(3, patience · epochs)`` epochs without improvement.
        val_fraction: share of the programs held out for early stopping, chosen by a stable hash
            of each program's features (``holdout_mask``), so held-out rows stay held out across
            online updates.
        min_val_size: with fewer held-out programs than this, there is no hold-out.
        group_batches: build batches from few groups (shuffled within groups, then chunked) so
            the rank loss sees many within-group pairs per batch.
        min_feature_std: floor of the per-column std used for standardization (log-space units).

    Example:
        >>> TrainConfig(rank_weight=0.5).batch_size
        64
    """

    learning_rate: float = 7e-4
    final_lr_fraction: float = 0.1
    weight_decay: float = 1e-6
    grad_clip: float = 0.5
    batch_size: int = 64
    rank_weight: float = 1.0
    sample_budget: int = 12_288
    min_epochs: int = 5
    max_epochs: int = 400
    max_samples: int = 0
    patience: float = 0.5
    val_fraction: float = 0.1
    min_val_size: int = 8
    group_batches: bool = True
    min_feature_std: float = 0.1


class _Batch(NamedTuple):
    features: Features
    target: jax.Array  # −log latency
    group: jax.Array
    weight: jax.Array  # 1 for real rows, 0 for padding


def _score(graphdef: nnx.GraphDef, params: dict[str, Any], features: Features) -> jax.Array:
    """Pure forward pass: standardize, run the network, de-standardize."""
    norm = params["norm"]
    access = (jnp.asarray(features.access, jnp.float32) - norm["access_mean"]) / norm["access_std"]
    glob = (jnp.asarray(features.glob, jnp.float32) - norm["glob_mean"]) / norm["glob_std"]
    mask = jnp.asarray(features.mask, jnp.float32)
    z = nnx.merge(graphdef, params["net"])(access, mask, glob)
    return z * norm["target_std"] + norm["target_mean"]


@functools.lru_cache(maxsize=None)
def _jitted_score(graphdef: nnx.GraphDef) -> Any:
    """One jitted forward per architecture, shared by all models (and ensemble members)."""
    return jax.jit(functools.partial(_score, graphdef))


def _losses(score: jax.Array, batch: _Batch, target_std: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log-MSE, RankNet) in standardized units, both averaged over real rows / valid pairs."""
    w = batch.weight
    err = (score - batch.target) / target_std
    mse = jnp.sum(w * err**2) / jnp.maximum(jnp.sum(w), 1.0)
    s = score / target_std
    # pair (i, j) counts when both rows are real, same task, and i is strictly faster than j
    pair = (
        w[:, None]
        * w[None, :]
        * (batch.group[:, None] == batch.group[None, :])
        * (batch.target[:, None] > batch.target[None, :])
    )
    rank = jnp.sum(pair * jax.nn.softplus(-(s[:, None] - s[None, :]))) / jnp.maximum(jnp.sum(pair), 1.0)
    return mse, rank


def _optimizer(grad_clip: float, weight_decay: float) -> optax.GradientTransformation:
    # AdamW without the learning-rate scale: the step applies a traced lr, so schedules never retrace
    return optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.scale_by_adam(),
        optax.add_decayed_weights(weight_decay),
    )


@functools.lru_cache(maxsize=None)
def _train_step(graphdef: nnx.GraphDef, grad_clip: float, weight_decay: float) -> Any:
    """The jitted train step of one architecture + optimizer, shared by all models using it."""
    key = (graphdef, grad_clip, weight_decay)
    tx = _optimizer(grad_clip, weight_decay)

    def step(net, opt_state, norm, batch: _Batch, lr, rank_weight):
        _TRACE_COUNTS[key] += 1  # Python side effect: runs once per trace, not per call

        def loss_fn(net):
            score = _score(graphdef, {"net": net, "norm": norm}, batch.features)
            mse, rank = _losses(score, batch, norm["target_std"])
            return mse + rank_weight * rank, (mse, rank)

        (loss, (mse, rank)), grads = jax.value_and_grad(loss_fn, has_aux=True)(net)
        updates, opt_state = tx.update(grads, opt_state, net)
        net = jax.tree_util.tree_map(lambda p, u: p - lr * u, net, updates)
        return net, opt_state, jnp.stack([loss, mse, rank])

    return jax.jit(step)


@functools.lru_cache(maxsize=None)
def _graphdef_and_shapes(n_access_features: int, n_glob_features: int, hidden: int) -> tuple[nnx.GraphDef, Any]:
    """The network's graphdef and abstract weights, without running (or compiling) anything."""
    abstract = nnx.eval_shape(
        lambda: SegmentSumMLP(n_access_features, n_glob_features, hidden=hidden, rngs=nnx.Rngs(0))
    )
    graphdef, state = nnx.split(abstract)
    return graphdef, nnx.to_pure_dict(state)


def _init_weights(shapes: Any, seed: int) -> Any:
    """LeCun-normal kernels (truncated at 2σ, the ``nnx.Linear`` default) and zero biases.

    Drawn with numpy: compiling JAX's random initializers costs seconds on a CPU, per process.
    """
    rng = np.random.default_rng(seed)

    def init(path: tuple[Any, ...], leaf: Any) -> jax.Array:
        if getattr(path[-1], "key", None) != "kernel":
            return jnp.zeros(leaf.shape, jnp.float32)
        fan_in = leaf.shape[0]
        sample = rng.standard_normal(leaf.shape)
        outside = np.abs(sample) > 2.0
        while outside.any():  # resample until every value lies within ±2σ
            sample[outside] = rng.standard_normal(int(outside.sum()))
            outside = np.abs(sample) > 2.0
        std = 1.0 / np.sqrt(max(fan_in, 1)) / 0.87962566103423978  # std of N(0,1) truncated at ±2
        return jnp.asarray(sample * std, jnp.float32)

    return jax.tree_util.tree_map_with_path(init, shapes)


def split_indices(features: Features, *, val_fraction: float, min_val_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Train / held-out row indices from ``holdout_mask``; no hold-out when it would be too small.

    Example:
        >>> f = Features(np.random.default_rng(0).normal(size=(200, 2, 3)), np.ones((200, 2)), np.ones((200, 1)))
        >>> tr, va = split_indices(f, val_fraction=0.1, min_val_size=8)
        >>> len(tr) + len(va), 10 <= len(va) <= 30
        (200, True)
    """
    held_out = holdout_mask(features, val_fraction)
    if held_out.sum() < min_val_size or held_out.all():
        return np.arange(len(held_out)), np.zeros(0, np.int64)
    return np.flatnonzero(~held_out), np.flatnonzero(held_out)


def check_dims(config: dict[str, Any], flat: dict[str, np.ndarray]) -> None:
    """A ValueError unless the sizes a checkpoint's metadata names are those of its input layers' arrays
    (checked before a model of those sizes is made: a damaged ``hidden`` asked for terabytes)."""
    for key, rows in (("net/access_in/kernel", "n_access_features"), ("net/glob_in/kernel", "n_glob_features")):
        shape = np.shape(flat[key])[-2:]
        if shape != (config[rows], config["hidden"]):
            raise ValueError(f"{key} has shape {shape}; the metadata says {rows}={config[rows]}, "
                             f"hidden={config['hidden']}")


class MLPCostModel:
    """The learned cost model: a ``SegmentSumMLP`` plus its training loop and checkpoints.

    Args:
        n_access_features: ``F``, features per access slot.
        n_glob_features: ``G``, per-program features.
        hidden: width ``H`` of the network.
        seed: seeds initialization and data shuffling.
        max_accesses: access slots are padded to this many for training and ``predict``, so
            datasets of different widths share one compilation; ``None`` takes the width of the
            first data seen. Wider inputs raise it, at the cost of one recompilation.
        config: training hyperparameters.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> f = Features(rng.normal(size=(200, 2, 3)), np.ones((200, 2)), rng.normal(size=(200, 2)))
        >>> latency = np.exp(f.glob[:, 0])  # slower with glob column 0
        >>> model = MLPCostModel(3, 2, hidden=16)
        >>> metrics = model.update(f, latency, np.zeros(200, int))
        >>> metrics["val_pairwise_accuracy"] > 0.9
        True
    """

    KIND = "mlp"

    def __init__(
        self,
        n_access_features: int,
        n_glob_features: int,
        *,
        hidden: int = 256,
        seed: int = 0,
        max_accesses: int | None = None,
        config: TrainConfig = TrainConfig(),
    ):
        self.n_access_features = int(n_access_features)
        self.n_glob_features = int(n_glob_features)
        self.hidden = int(hidden)
        self.seed = int(seed)
        self.max_accesses = None if max_accesses is None else int(max_accesses)
        self.config = config
        self.fitted = False  # standardization statistics are set by the first fit
        self.n_updates = 0
        self.last_val_index = np.zeros(0, np.int64)
        self._rng = np.random.default_rng(seed)
        f, g = self.n_access_features, self.n_glob_features
        self._graphdef, shapes = _graphdef_and_shapes(f, g, self.hidden)
        self._params = {
            "net": _init_weights(shapes, seed),
            "norm": {
                "access_mean": jnp.zeros(f, jnp.float32),
                "access_std": jnp.ones(f, jnp.float32),
                "glob_mean": jnp.zeros(g, jnp.float32),
                "glob_std": jnp.ones(g, jnp.float32),
                "target_mean": jnp.zeros((), jnp.float32),
                "target_std": jnp.ones((), jnp.float32),
            },
        }

    # ---- scoring ---------------------------------------------------------------------------

    @property
    def params(self) -> dict[str, Any]:
        """``{"net": network weights, "norm": standardization statistics}`` (a pytree)."""
        return self._params

    @params.setter
    def params(self, value: dict[str, Any]) -> None:
        self._params = jax.tree_util.tree_map(jnp.asarray, value)

    @property
    def graphdef(self) -> nnx.GraphDef:
        """The NNX graph definition (the static half of the network)."""
        return self._graphdef

    def apply(self, params: dict[str, Any], features: Features) -> jax.Array:
        """Pure score ``−log(latency)``: ``[..., A, F]`` features → ``[...]`` (jit/vmap/grad-safe).

        Example:
            >>> model = MLPCostModel(3, 2, hidden=8)
            >>> f = Features(jnp.ones((4, 5, 3)), jnp.ones((4, 5)), jnp.ones((4, 2)))
            >>> grads = jax.grad(lambda f: model.apply(model.params, f).sum())(f)
            >>> grads.access.shape, bool(jnp.isfinite(grads.glob).all())
            ((4, 5, 3), True)
        """
        return _score(self._graphdef, params, features)

    def _prepare(self, features: Features) -> Features:
        """Numpy float32 features with the access axis padded to ``max_accesses``."""
        features = as_numpy_features(features)
        if features.access.shape[2] != self.n_access_features or features.glob.shape[1] != self.n_glob_features:
            raise ValueError(
                f"model expects F={self.n_access_features}, G={self.n_glob_features}; got "
                f"F={features.access.shape[2]}, G={features.glob.shape[1]}"
            )
        self.max_accesses = max(self.max_accesses or 0, features.access.shape[1])
        return pad_accesses(features, self.max_accesses)

    def _predict_prepared(self, params: dict[str, Any], features: Features) -> np.ndarray:
        return predict_in_chunks(_jitted_score(self._graphdef), params, features)

    def predict(self, features: Features, params: dict[str, Any] | None = None) -> np.ndarray:
        """Scores ``[B]`` (numpy float32); batched in fixed-size chunks, so it compiles once.
        ``params``: other weights of this architecture (e.g. a checkpoint's as loaded) instead of the current.

        Example:
            >>> model = MLPCostModel(3, 2, hidden=8)
            >>> model.predict(Features(np.ones((3, 2, 3)), np.ones((3, 2)), np.ones((3, 2)))).shape
            (3,)
        """
        return self._predict_prepared(self._params if params is None else params, self._prepare(features))

    # ---- training --------------------------------------------------------------------------

    @property
    def train_step_traces(self) -> int:
        """How often the train step of this architecture has been traced (compiled), all models."""
        return _TRACE_COUNTS[(self._graphdef, self.config.grad_clip, self.config.weight_decay)]

    def _set_normalization(self, features: Features, target: np.ndarray) -> None:
        """Per-column mean/std of real access slots, of glob, and of the target (first fit only)."""
        floor = self.config.min_feature_std
        mask = features.mask[..., None]
        count = max(float(mask.sum()), 1.0)
        a_mean = (features.access * mask).sum(axis=(0, 1)) / count
        a_var = (((features.access - a_mean) * mask) ** 2).sum(axis=(0, 1)) / count
        g_mean = features.glob.mean(axis=0)
        g_std = features.glob.std(axis=0)
        self._params["norm"] = {
            "access_mean": jnp.asarray(a_mean, jnp.float32),
            "access_std": jnp.asarray(np.maximum(np.sqrt(a_var), floor), jnp.float32),
            "glob_mean": jnp.asarray(g_mean, jnp.float32),
            "glob_std": jnp.asarray(np.maximum(g_std, floor), jnp.float32),
            "target_mean": jnp.asarray(target.mean(), jnp.float32),
            "target_std": jnp.asarray(max(float(target.std()), 1e-2), jnp.float32),
        }
        self.fitted = True

    def _epoch_batches(self, index: np.ndarray, groups: np.ndarray) -> list[np.ndarray]:
        """One epoch of batches (row indices, padded with -1 to ``batch_size``)."""
        bs = self.config.batch_size
        if self.config.group_batches:
            # shuffle groups and rows within groups, chunk, then shuffle the chunks
            order = self._rng.permutation(len(index))
            index = index[order]
            unique = np.unique(groups[index])
            group_rank = self._rng.permutation(len(unique))[np.searchsorted(unique, groups[index])]
            index = index[np.argsort(group_rank, kind="stable")]
        else:
            index = self._rng.permutation(index)
        n_batches = math.ceil(len(index) / bs)
        padded = np.full(n_batches * bs, -1, np.int64)
        padded[: len(index)] = index
        batches = padded.reshape(n_batches, bs)
        return list(batches[self._rng.permutation(n_batches)])

    def _make_batch(self, rows: np.ndarray, features: Features, target: np.ndarray, groups: np.ndarray) -> _Batch:
        real = rows >= 0
        rows = np.where(real, rows, 0)  # padding rows repeat row 0 with weight 0
        return _Batch(
            take(features, rows),
            target[rows].astype(np.float32),
            groups[rows].astype(np.int32),
            real.astype(np.float32),
        )

    def _evaluate(
        self, params: dict[str, Any], features: Features, target: np.ndarray, groups: np.ndarray
    ) -> tuple[float, float]:
        """(pairwise accuracy, log-MSE) on held-out rows; accuracy is nan without pairs."""
        score = self._predict_prepared(params, features)
        latency = np.exp(-target)
        return pairwise_accuracy(score, latency, groups), float(np.mean((score - target) ** 2))

    def fit_indices(
        self,
        features: Features,
        target: np.ndarray,
        groups: np.ndarray,
        train_index: np.ndarray,
        val_index: np.ndarray,
    ) -> dict[str, float]:
        """Trains on ``train_index`` rows, early-stops on ``val_index`` rows (the ensemble's hook).

        ``features`` must already be prepared (numpy, padded to ``max_accesses``); ``target`` is
        ``−log latency``. Continues from the current weights with a fresh optimizer state.
        """
        cfg = self.config
        start_time = time.perf_counter()
        if not self.fitted:
            self._set_normalization(take(features, train_index), target[train_index])
        step = _train_step(self._graphdef, cfg.grad_clip, cfg.weight_decay)
        tx = _optimizer(cfg.grad_clip, cfg.weight_decay)
        net, norm = self._params["net"], self._params["norm"]
        opt_state = tx.init(net)

        n_train = len(train_index)
        epochs = int(np.clip(round(cfg.sample_budget / max(n_train, 1)), cfg.min_epochs, cfg.max_epochs))
        # a long history: each epoch a fresh random subset, so one update visits at most max_samples rows
        per_epoch = n_train if not cfg.max_samples or epochs * n_train <= cfg.max_samples else min(n_train, max(
            cfg.batch_size, cfg.max_samples // epochs))
        steps_per_epoch = math.ceil(per_epoch / cfg.batch_size)
        patience = max(3, math.ceil(cfg.patience * epochs))
        total_steps = epochs * steps_per_epoch
        val = take(features, val_index), target[val_index], groups[val_index]
        has_val = len(val_index) > 0

        def selection_key(acc: float, mse: float) -> tuple[float, float]:
            # rank first; without comparable pairs (nan) fall back to the regression error
            return (acc if np.isfinite(acc) else -np.inf, -mse)

        best_key, best_epoch, best_net = None, 0, net
        val_acc, val_mse = float("nan"), float("nan")
        if has_val:
            val_acc, val_mse = self._evaluate(self._params, *val)
            best_key = selection_key(val_acc, val_mse)
        step_count, epoch, last_loss = 0, 0, np.zeros(3)
        for epoch in range(1, epochs + 1):
            losses = []
            subset = train_index if per_epoch >= n_train else self._rng.choice(train_index, per_epoch, replace=False)
            for rows in self._epoch_batches(subset, groups):
                frac = step_count / max(total_steps, 1)
                lr = cfg.learning_rate * (
                    cfg.final_lr_fraction + (1 - cfg.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * frac))
                )
                batch = self._make_batch(rows, features, target, groups)
                lr, rank_weight = np.float32(lr), np.float32(cfg.rank_weight)  # traced: no retrace
                net, opt_state, loss = step(net, opt_state, norm, batch, lr, rank_weight)
                losses.append(loss)
                step_count += 1
            last_loss = np.mean(np.asarray(losses), axis=0)
            if not has_val:
                best_net, best_epoch = net, epoch
                continue
            acc, mse = self._evaluate({"net": net, "norm": norm}, *val)
            key = selection_key(acc, mse)
            if key > best_key:
                best_key, best_epoch, best_net = key, epoch, net
                val_acc, val_mse = acc, mse
            elif epoch - best_epoch >= patience:
                break
        self._params = {"net": best_net, "norm": norm}
        self.n_updates += 1
        return {
            "loss": float(last_loss[0]),
            "train_mse": float(last_loss[1]),
            "train_rank_loss": float(last_loss[2]),
            "val_pairwise_accuracy": float(val_acc),
            "val_mse": float(val_mse),
            "epochs": float(epoch),
            "best_epoch": float(best_epoch),
            "n_train": float(n_train),
            "rows_per_epoch": float(per_epoch),
            "n_val": float(len(val_index)),
            "seconds": time.perf_counter() - start_time,
        }

    def _fit_targets(self, features: Features, target: np.ndarray, groups: np.ndarray) -> dict[str, float]:
        """Split, train, and report held-out ranking metrics (indices refer to the given rows)."""
        cfg = self.config
        train_index, val_index = split_indices(
            features, val_fraction=cfg.val_fraction, min_val_size=cfg.min_val_size
        )
        metrics = self.fit_indices(features, target, groups, train_index, val_index)
        metrics.update({"val_kendall_tau": float("nan"), "val_log_rmse": float("nan")})  # without hold-out
        if len(val_index):
            score = self._predict_prepared(self._params, take(features, val_index))
            metrics.update(ranking_metrics(score, np.exp(-target[val_index]), groups[val_index], prefix="val_"))
        self.last_val_index = val_index
        return metrics

    def update(self, features: Features, latencies: Any, groups: Any = None) -> dict[str, float]:
        """Online fine-tune on measurements (seconds), continuing from the current weights.

        Pass the whole measured dataset (or a recent window): the model trains on exactly what it
        is given. Rows with non-finite or non-positive latency are dropped (``n_dropped``).
        ``last_val_index`` afterwards holds the held-out rows (indices into the kept rows).

        Args:
            features: ``Features`` with ``access [B, A, F]``, ``mask [B, A]``, ``glob [B, G]``.
            latencies: ``[B]`` latencies in seconds.
            groups: ``[B]`` int task ids (ranking pairs are formed within a task only).

        Returns:
            Metrics: ``val_pairwise_accuracy``, ``val_kendall_tau``, ``val_log_rmse`` (held out;
            nan when the data is too small for a hold-out, < ~80 programs), training losses,
            ``epochs``, ``best_epoch``, ``n_train``, ``n_val``, ``seconds``.

        Example:
            >>> rng = np.random.default_rng(1)
            >>> f = Features(rng.normal(size=(200, 2, 3)), np.ones((200, 2)), rng.normal(size=(200, 2)))
            >>> m = MLPCostModel(3, 2, hidden=16, config=TrainConfig(max_epochs=5))
            >>> sorted(k for k in m.update(f, np.exp(f.glob[:, 0]), None) if k.startswith("val_"))
            ['val_kendall_tau', 'val_log_rmse', 'val_mse', 'val_pairwise_accuracy']
        """
        features, latencies, groups, dropped = check_measurements(features, latencies, groups)
        metrics = self._fit_targets(self._prepare(features), neg_log_latency(latencies), groups)
        return {**metrics, "n_dropped": float(dropped)}

    def fit_to_prior(self, features: Features, prior_scores: Any, groups: Any = None) -> dict[str, float]:
        """Cold start: regresses (and ranks) the scores of a prior on unmeasured, random configs.

        Args:
            features: features of the random configs.
            prior_scores: ``[B]`` prior scores (``−log latency``), e.g. ``RooflineModel.predict``.
            groups: ``[B]`` task ids; ``None`` means one task.

        Example:
            >>> rng = np.random.default_rng(2)
            >>> f = Features(rng.normal(size=(100, 2, 3)), np.ones((100, 2)), rng.normal(size=(100, 2)))
            >>> m = MLPCostModel(3, 2, hidden=16, config=TrainConfig(max_epochs=5))
            >>> "val_pairwise_accuracy" in m.fit_to_prior(f, -f.glob[:, 1])
            True
        """
        prior_scores = np.asarray(prior_scores, dtype=np.float64).reshape(-1)
        # placeholder latencies of 1 s (valid) or nan (dropped) only to reuse the checks
        placeholder = np.where(np.isfinite(prior_scores), 1.0, np.nan)
        features, _, groups, dropped = check_measurements(features, placeholder, groups)
        target = prior_scores[np.isfinite(prior_scores)]
        metrics = self._fit_targets(self._prepare(features), target, groups)
        return {**metrics, "n_dropped": float(dropped)}

    # ---- checkpoints -----------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {
            "n_access_features": self.n_access_features,
            "n_glob_features": self.n_glob_features,
            "hidden": self.hidden,
            "seed": self.seed,
            "max_accesses": self.max_accesses,
            "train": dataclasses.asdict(self.config),
        }

    def _state(self) -> dict[str, Any]:
        return {"fitted": self.fitted, "n_updates": self.n_updates}

    def save(self, path: str | os.PathLike) -> None:
        """Writes weights, standardization statistics and configuration to one ``.npz``.

        Example:
            >>> import tempfile
            >>> p = os.path.join(tempfile.mkdtemp(), "mlp.npz")
            >>> m = MLPCostModel(3, 2, hidden=8)
            >>> m.save(p)
            >>> MLPCostModel.load(p).hidden
            8
        """
        save_npz(path, self._params, {"kind": self.KIND, "config": self._config(), "state": self._state()})

    @classmethod
    def _from_config(cls, config: dict[str, Any], state: dict[str, Any]) -> "MLPCostModel":
        config = dict(config)
        train = TrainConfig(**config.pop("train"))
        model = cls(config.pop("n_access_features"), config.pop("n_glob_features"), config=train, **config)
        model.fitted = bool(state["fitted"])
        model.n_updates = int(state["n_updates"])
        return model

    @classmethod
    def load(cls, path: str | os.PathLike) -> "MLPCostModel":
        """Reads a model written by ``save`` (predictions are identical)."""
        flat, meta = load_npz(path)
        if meta.get("kind") != cls.KIND:
            raise ValueError(f"{path} holds a {meta.get('kind')!r}, not a {cls.KIND!r}")
        try:
            check_dims(meta["config"], flat)
            model = cls._from_config(meta["config"], meta["state"])
            model.params = unflatten_params(model.params, flat)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: a damaged {cls.KIND!r} checkpoint ({e!s:.200})") from None
        return model
