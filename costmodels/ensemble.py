"""A small ensemble of MLP cost models, for uncertainty (exploration bonuses, UCB, ...).

Members differ in their seed (initialization and shuffling) and, by default, each trains on its own
bootstrap resample of the training rows; all share one held-out split for early stopping. ``apply``
is the members' mean, computed with ``jax.vmap`` over their stacked parameters, so the ensemble
stays one pure, differentiable function.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from costmodels.base import Features, check_measurements, neg_log_latency, predict_in_chunks, ranking_metrics, take
from costmodels.checkpoint import load_npz, save_npz, unflatten_params
from costmodels.mlp import MLPCostModel, TrainConfig, _score, check_dims, split_indices


def _member_scores(graphdef: nnx.GraphDef, params: Any, features: Features) -> jax.Array:
    """``[K, ...]`` scores of every member (params stacked on a leading K axis)."""
    return jax.vmap(functools.partial(_score, graphdef), in_axes=(0, None))(params, features)


@functools.lru_cache(maxsize=None)
def _jitted_mean_std(graphdef: nnx.GraphDef) -> Any:
    def mean_std(params, features):
        scores = _member_scores(graphdef, params, features)
        return scores.mean(axis=0), scores.std(axis=0)

    return jax.jit(mean_std)


@functools.lru_cache(maxsize=None)
def _jitted_members(graphdef: nnx.GraphDef) -> Any:
    return jax.jit(lambda params, features: tuple(_member_scores(graphdef, params, features)))


ACQUISITIONS = ("mean", "ucb", "thompson")


def acquire(score: Any, deviations: Any, n: int, *, kind: str = "ucb", beta: float = 1.0,
            rng: np.random.Generator | None = None) -> np.ndarray:
    """Pick ``n`` candidates (indices, best first) by an acquisition over an ensemble.

    ``score`` ``[B]`` is the point estimate to rank by (e.g. the mean, or another model's score);
    ``deviations`` ``[K, B]`` are the members' scores minus their mean (their spread is the
    uncertainty). ``kind``:

    * ``"mean"``: the top ``n`` of ``score`` (no exploration);
    * ``"ucb"``: the top ``n`` of ``score + beta * std`` (optimism where members disagree);
    * ``"thompson"``: each pick draws one member ``k`` at random and takes the best not yet picked
      of ``score + beta * deviations[k]`` (a sample of a plausible model per pick).

    Example:
        >>> s = np.array([1.0, 0.9, 0.0])
        >>> dev = np.array([[0.0, 0.0, 2.0], [0.0, 0.0, -2.0]])
        >>> acquire(s, dev, 1, kind="mean").tolist(), acquire(s, dev, 1, kind="ucb").tolist()
        ([0], [2])
    """
    score = np.asarray(score, np.float64).reshape(-1)
    n = min(int(n), len(score))
    if n <= 0:
        return np.zeros(0, np.int64)
    dev = np.asarray(deviations, np.float64).reshape(-1, len(score))
    if kind == "mean" or not len(dev):
        return np.argsort(-score, kind="stable")[:n]
    if kind == "ucb":
        return np.argsort(-(score + beta * dev.std(axis=0)), kind="stable")[:n]
    if kind != "thompson":
        raise ValueError(f"unknown acquisition {kind!r}; valid: {', '.join(ACQUISITIONS)}")
    rng = rng or np.random.default_rng(0)
    taken = np.zeros(len(score), bool)
    out = []
    for k in rng.integers(len(dev), size=n):
        v = np.where(taken, -np.inf, score + beta * dev[k])
        i = int(np.argmax(v))
        taken[i] = True
        out.append(i)
    return np.asarray(out, np.int64)


class EnsembleCostModel:
    """``num_members`` ``MLPCostModel``s; score = their mean, uncertainty = their std.

    Args:
        n_access_features: ``F``, features per access slot.
        n_glob_features: ``G``, per-program features.
        num_members: ``K``, the number of MLPs.
        hidden: width of each MLP.
        seed: member ``k`` uses seed ``seed + k``; the split uses ``seed`` too.
        bootstrap: train each member on a bootstrap resample of the training rows.
        max_accesses: see ``MLPCostModel``.
        config: training hyperparameters shared by all members.

    Example:
        >>> import numpy as np
        >>> ens = EnsembleCostModel(3, 2, num_members=2, hidden=8)
        >>> f = Features(np.ones((4, 2, 3)), np.ones((4, 2)), np.ones((4, 2)))
        >>> mean, std = ens.predict_with_std(f)
        >>> mean.shape, bool((std > 0).all())
        ((4,), True)
    """

    KIND = "ensemble"

    def __init__(
        self,
        n_access_features: int,
        n_glob_features: int,
        *,
        num_members: int = 3,
        hidden: int = 256,
        seed: int = 0,
        bootstrap: bool = True,
        max_accesses: int | None = None,
        config: TrainConfig = TrainConfig(),
    ):
        if num_members < 1:
            raise ValueError("an ensemble needs at least one member")
        self.seed = int(seed)
        self.bootstrap = bool(bootstrap)
        self.members = [
            MLPCostModel(
                n_access_features,
                n_glob_features,
                hidden=hidden,
                seed=seed + k,
                max_accesses=max_accesses,
                config=config,
            )
            for k in range(num_members)
        ]
        self.last_val_index = np.zeros(0, np.int64)
        self._rng = np.random.default_rng([seed, 7919])  # bootstrap stream, apart from the members'
        self._stacked = None

    @property
    def params(self) -> Any:
        """Member params stacked on a leading ``K`` axis (a pytree)."""
        if self._stacked is None:
            # stacked in numpy: eager jnp.stack would compile once per leaf shape; eagerly even when first
            # read inside a jit trace (`jit(lambda f: ens.apply(ens.params, f))`): a cached tracer leaked out
            # of it and broke the next save / predict (session 78, seen when the test order changed)
            stack = lambda *xs: jnp.asarray(np.stack([np.asarray(x) for x in xs]))  # noqa: E731
            with jax.ensure_compile_time_eval():
                self._stacked = jax.tree_util.tree_map(stack, *(m.params for m in self.members))
        return self._stacked

    @params.setter
    def params(self, value: Any) -> None:
        for k, member in enumerate(self.members):
            member.params = jax.tree_util.tree_map(lambda x: np.asarray(x)[k], value)
        self._stacked = None

    @property
    def graphdef(self) -> nnx.GraphDef:
        """The members' shared NNX graph definition."""
        return self.members[0].graphdef

    def apply(self, params: Any, features: Features) -> jax.Array:
        """Pure mean score over members, ``[...]`` (jit/vmap/grad-safe).

        Example:
            >>> ens = EnsembleCostModel(3, 2, num_members=2, hidden=8)
            >>> f = Features(jnp.ones((4, 2, 3)), jnp.ones((4, 2)), jnp.ones((4, 2)))
            >>> jax.jit(ens.apply)(ens.params, f).shape
            (4,)
        """
        return _member_scores(self.graphdef, params, features).mean(axis=0)

    def apply_with_std(self, params: Any, features: Features) -> tuple[jax.Array, jax.Array]:
        """Pure ``(mean, std)`` over members (std with ``ddof=0``)."""
        scores = _member_scores(self.graphdef, params, features)
        return scores.mean(axis=0), scores.std(axis=0)

    def _prepare(self, features: Features) -> Features:
        prepared = self.members[0]._prepare(features)
        for member in self.members[1:]:
            member.max_accesses = self.members[0].max_accesses
        return prepared

    def _predict_prepared(self, features: Features) -> tuple[np.ndarray, np.ndarray]:
        return predict_in_chunks(_jitted_mean_std(self.graphdef), self.params, features)

    def predict(self, features: Features) -> np.ndarray:
        """Mean scores ``[B]`` (numpy)."""
        return self._predict_prepared(self._prepare(features))[0]

    def predict_with_std(self, features: Features) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std)`` of member scores, each ``[B]`` (numpy)."""
        return self._predict_prepared(self._prepare(features))

    def predict_members(self, features: Features) -> np.ndarray:
        """Every member's scores ``[K, B]`` (numpy): what :func:`acquire` samples from.

        Example:
            >>> ens = EnsembleCostModel(3, 2, num_members=2, hidden=8)
            >>> f = Features(np.ones((5, 2, 3)), np.ones((5, 2)), np.ones((5, 2)))
            >>> ens.predict_members(f).shape
            (2, 5)
        """
        out = predict_in_chunks(_jitted_members(self.graphdef), self.params, self._prepare(features))
        return np.stack(out)

    def _fit_targets(self, features: Features, target: np.ndarray, groups: np.ndarray) -> dict[str, float]:
        start = time.perf_counter()
        cfg = self.members[0].config
        train_index, val_index = split_indices(
            features, val_fraction=cfg.val_fraction, min_val_size=cfg.min_val_size
        )
        member_metrics = []
        for member in self.members:
            rows = train_index
            if self.bootstrap and len(train_index) > 1:
                rows = np.sort(self._rng.choice(train_index, size=len(train_index), replace=True))
            member_metrics.append(member.fit_indices(features, target, groups, rows, val_index))
        self._stacked = None
        self.last_val_index = val_index
        metrics = {
            "member_val_pairwise_accuracy": float(np.mean([m["val_pairwise_accuracy"] for m in member_metrics])),
            "loss": float(np.mean([m["loss"] for m in member_metrics])),
            "epochs": float(np.mean([m["epochs"] for m in member_metrics])),
            "n_train": float(len(train_index)),
            "n_val": float(len(val_index)),
        }
        for name in ("val_pairwise_accuracy", "val_kendall_tau", "val_log_rmse", "val_mean_std"):
            metrics[name] = float("nan")  # overwritten below when there is a hold-out
        if len(val_index):
            mean, std = self._predict_prepared(take(features, val_index))
            metrics.update(ranking_metrics(mean, np.exp(-target[val_index]), groups[val_index], prefix="val_"))
            metrics["val_mean_std"] = float(np.mean(std))
        metrics["seconds"] = time.perf_counter() - start
        return metrics

    def update(self, features: Features, latencies: Any, groups: Any = None) -> dict[str, float]:
        """Fine-tunes every member on measurements (seconds); see ``MLPCostModel.update``.

        Example:
            >>> rng = np.random.default_rng(0)
            >>> f = Features(rng.normal(size=(200, 2, 3)), np.ones((200, 2)), rng.normal(size=(200, 2)))
            >>> ens = EnsembleCostModel(3, 2, num_members=2, hidden=16, config=TrainConfig(max_epochs=5))
            >>> ens.update(f, np.exp(f.glob[:, 0]), None)["val_pairwise_accuracy"] > 0.6
            True
        """
        features, latencies, groups, dropped = check_measurements(features, latencies, groups)
        metrics = self._fit_targets(self._prepare(features), neg_log_latency(latencies), groups)
        return {**metrics, "n_dropped": float(dropped)}

    def fit_to_prior(self, features: Features, prior_scores: Any, groups: Any = None) -> dict[str, float]:
        """Cold start of every member on a prior's scores; see ``MLPCostModel.fit_to_prior``."""
        prior_scores = np.asarray(prior_scores, dtype=np.float64).reshape(-1)
        placeholder = np.where(np.isfinite(prior_scores), 1.0, np.nan)
        features, _, groups, dropped = check_measurements(features, placeholder, groups)
        target = prior_scores[np.isfinite(prior_scores)]
        metrics = self._fit_targets(self._prepare(features), target, groups)
        return {**metrics, "n_dropped": float(dropped)}

    def save(self, path: str | os.PathLike) -> None:
        """Writes all members (stacked params) and their configuration to one ``.npz``.

        Example:
            >>> import tempfile
            >>> p = os.path.join(tempfile.mkdtemp(), "ens.npz")
            >>> EnsembleCostModel(3, 2, num_members=2, hidden=8).save(p)
            >>> len(EnsembleCostModel.load(p).members)
            2
        """
        meta = {
            "kind": self.KIND,
            "seed": self.seed,
            "bootstrap": self.bootstrap,
            "members": [{"config": m._config(), "state": m._state()} for m in self.members],
        }
        save_npz(path, self.params, meta)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "EnsembleCostModel":
        """Reads an ensemble written by ``save`` (predictions are identical)."""
        flat, meta = load_npz(path)
        if meta.get("kind") != cls.KIND:
            raise ValueError(f"{path} holds a {meta.get('kind')!r}, not a {cls.KIND!r}")
        try:
            first = meta["members"][0]["config"]
            for m in meta["members"]:  # every member is made below: each one's sizes are the arrays'
                check_dims(m["config"], flat)
            ensemble = cls(
                first["n_access_features"],
                first["n_glob_features"],
                num_members=len(meta["members"]),
                hidden=first["hidden"],
                seed=meta["seed"],
                bootstrap=meta["bootstrap"],
                max_accesses=first["max_accesses"],
                config=TrainConfig(**first["train"]),
            )
            ensemble.members = [MLPCostModel._from_config(m["config"], m["state"]) for m in meta["members"]]
            ensemble.params = unflatten_params(ensemble.params, flat)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: a damaged {cls.KIND!r} checkpoint ({e!s:.200})") from None
        return ensemble
