"""An analytic roofline prior: ranks programs before any measurement exists.

    latency ≈ max(flops / (peak_flops · efficiency), bytes / bandwidth) + overhead
    score    = −log(latency)

``efficiency`` is the product of the utilization columns given (e.g. parallel efficiency and vector
lane utilization, each a fraction in [0, 1]). All inputs are read from ``glob`` columns chosen at
construction. No training; ``update`` only reports how well the prior ranks the data it is given.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from costmodels.base import Features, as_numpy_features, check_measurements, predict_in_chunks, ranking_metrics
from costmodels.checkpoint import load_npz, save_npz, unflatten_params


class RooflineModel:
    """Roofline prior over ``glob`` columns; differentiable w.r.t. features and machine params.

    Args:
        flops_col: column of ``glob`` holding FLOPs.
        bytes_col: column of ``glob`` holding bytes moved at the DRAM (or L2) level.
        peak_flops: machine peak FLOP/s (all cores, full vector width).
        bandwidth: machine bandwidth in bytes/s at that level.
        efficiency_cols: columns of ``glob`` holding utilization fractions in [0, 1] (parallel
            efficiency, vector lane utilization, ...); their product scales the peak.
        overhead: fixed per-call latency in seconds (launch, OpenMP fork/join).
        log1p: the columns hold ``log(1 + v)`` (the felixjax convention), so ``v = expm1(col)``.
        softness: 0 for the exact ``max``; > 0 replaces it by a log-sum-exp with this temperature
            in log-time (smoother gradients where compute and memory time cross).
        min_efficiency: efficiency is clipped to ``[min_efficiency, 1]``.

    Example:
        >>> import numpy as np
        >>> prior = RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e11, bandwidth=1e10,
        ...                       efficiency_cols=(2,), overhead=0.0)
        >>> glob = np.log1p(np.array([[1e9, 1e6, 1.0], [1e9, 1e6, 0.5]], np.float32))
        >>> f = Features(np.zeros((2, 1, 1)), np.ones((2, 1)), glob)
        >>> [round(float(t), 6) for t in np.exp(-prior.predict(f))]  # 10 ms, 20 ms at half efficiency
        [0.01, 0.02]
    """

    KIND = "roofline"

    def __init__(
        self,
        *,
        flops_col: int,
        bytes_col: int,
        peak_flops: float,
        bandwidth: float,
        efficiency_cols: tuple[int, ...] | list[int] = (),
        overhead: float = 2e-6,
        log1p: bool = True,
        softness: float = 0.0,
        min_efficiency: float = 1e-3,
    ):
        if peak_flops <= 0 or bandwidth <= 0 or overhead < 0:
            raise ValueError("peak_flops and bandwidth must be > 0 and overhead >= 0")
        self.flops_col = int(flops_col)
        self.bytes_col = int(bytes_col)
        self.efficiency_cols = tuple(int(c) for c in efficiency_cols)
        self.log1p = bool(log1p)
        self.softness = float(softness)
        self.min_efficiency = float(min_efficiency)
        # machine numbers are params (log space), so they could be calibrated by gradient later
        self._params = {
            "log_peak_flops": jnp.asarray(np.log(peak_flops), jnp.float32),
            "log_bandwidth": jnp.asarray(np.log(bandwidth), jnp.float32),
            "log_overhead": jnp.asarray(np.log(max(overhead, 1e-30)), jnp.float32),
        }
        self._jitted = None

    @property
    def params(self) -> dict[str, jax.Array]:
        """``{'log_peak_flops', 'log_bandwidth', 'log_overhead'}`` scalars."""
        return self._params

    def _column(self, glob: jax.Array, col: int) -> jax.Array:
        value = glob[..., col]
        return jnp.expm1(value) if self.log1p else value

    def apply(self, params: dict[str, jax.Array], features: Features) -> jax.Array:
        """Pure score ``−log(latency)``, ``[...]`` for ``glob`` of shape ``[..., G]``.

        Example:
            >>> prior = RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e9, bandwidth=1e9)
            >>> f = Features(jnp.zeros((1, 1)), jnp.ones(1), jnp.log1p(jnp.array([1e6, 1e3])))
            >>> g = jax.grad(lambda f: prior.apply(prior.params, f))(f)
            >>> bool(g.glob[0] < 0)  # more FLOPs, lower score
            True
        """
        glob = jnp.asarray(features.glob, jnp.float32)
        flops = self._column(glob, self.flops_col)
        moved = self._column(glob, self.bytes_col)
        log_eff = jnp.zeros_like(flops)
        for col in self.efficiency_cols:
            eff = jnp.clip(self._column(glob, col), self.min_efficiency, 1.0)
            log_eff = log_eff + jnp.log(eff)
        tiny = 1e-30  # keeps log finite for empty programs; float32-representable
        log_compute = jnp.log(jnp.maximum(flops, tiny)) - params["log_peak_flops"] - log_eff
        log_memory = jnp.log(jnp.maximum(moved, tiny)) - params["log_bandwidth"]
        if self.softness > 0:
            tau = self.softness
            log_roof = tau * jnp.logaddexp(log_compute / tau, log_memory / tau)
        else:
            log_roof = jnp.maximum(log_compute, log_memory)
        return -jnp.logaddexp(log_roof, params["log_overhead"])

    def predict(self, features: Features) -> np.ndarray:
        """Scores ``[B]`` (numpy float32), in fixed-size chunks so it compiles at most twice."""
        if self._jitted is None:
            self._jitted = jax.jit(self.apply)
        return predict_in_chunks(self._jitted, self._params, as_numpy_features(features))

    def update(self, features: Features, latencies: Any, groups: Any = None) -> dict[str, float]:
        """No training; returns how well the prior ranks these measurements.

        Example:
            >>> prior = RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e9, bandwidth=1e9)
            >>> glob = np.log1p(np.array([[1e6, 1.0], [2e6, 1.0]], np.float32))
            >>> f = Features(np.zeros((2, 1, 1)), np.ones((2, 1)), glob)
            >>> prior.update(f, [1e-3, 2e-3], [0, 0])["pairwise_accuracy"]
            1.0
        """
        features, latencies, groups, dropped = check_measurements(features, latencies, groups)
        metrics = ranking_metrics(self.predict(features), latencies, groups)
        return {**metrics, "n_samples": float(len(latencies)), "n_dropped": float(dropped)}

    def _config(self) -> dict[str, Any]:
        return {
            "flops_col": self.flops_col,
            "bytes_col": self.bytes_col,
            "efficiency_cols": list(self.efficiency_cols),
            "log1p": self.log1p,
            "softness": self.softness,
            "min_efficiency": self.min_efficiency,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Writes the prior (columns and machine numbers) to one ``.npz``; see ``load``."""
        save_npz(path, self._params, {"kind": self.KIND, "config": self._config()})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RooflineModel":
        """Reads a prior written by ``save``.

        Example:
            >>> import tempfile, os
            >>> p = os.path.join(tempfile.mkdtemp(), "prior.npz")
            >>> RooflineModel(flops_col=0, bytes_col=1, peak_flops=2e9, bandwidth=1e9).save(p)
            >>> round(float(np.exp(RooflineModel.load(p).params["log_peak_flops"])) / 1e9, 3)
            2.0
        """
        flat, meta = load_npz(path)
        if meta.get("kind") != cls.KIND:
            raise ValueError(f"{path} holds a {meta.get('kind')!r}, not a {cls.KIND!r}")
        model = cls(peak_flops=1.0, bandwidth=1.0, **meta["config"])
        model._params = {k: jnp.asarray(v) for k, v in unflatten_params(model._params, flat).items()}
        return model
