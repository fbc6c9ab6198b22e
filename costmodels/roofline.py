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


def _smooth_max(logs: list[jax.Array], softness: float) -> jax.Array:
    """``max`` of log-values, or ``softness · logsumexp(logs / softness)`` when ``softness > 0``."""
    stacked = jnp.stack(logs, axis=0)
    if softness > 0:
        return softness * jax.scipy.special.logsumexp(stacked / softness, axis=0)
    return jnp.max(stacked, axis=0)


class MultiLevelRoofline(RooflineModel):
    """A roofline over every cache level plus the register block's instruction issue (issue 15).

    ``RooflineModel`` sees FLOPs, DRAM bytes and utilization fractions, which are equal for most
    configs of a task once their tiles fit a cache, so it ties them. This prior times the inner loop
    the way an out-of-order core runs it. One iteration of the innermost reduction loop (``R1``) does
    ``a`` vector FMAs (``a`` = accumulators of the register block) and ``l`` loads (per operand
    slot: the distinct elements of its register-block tile, one vector load per ``vec`` of them
    where the access is contiguous along the vector axis, else one scalar/broadcast load each). It
    takes ``max(a / fma_ports, l / load_ports, fma_latency, (a + l + loop_ops / unroll) / issue_width)``
    cycles — the last-but-one term is the FMA chain of each accumulator: fewer than
    ``fma_latency · fma_ports`` accumulators cannot hide it. ``flops / (2 · vec · a)`` iterations,
    spread over ``cores · balance``. Each execution of the accumulator loop (``S2``) adds its vector
    loads and stores of the accumulators (one per cycle, the store port) and a pipeline drain of
    ``fma_latency`` cycles; the epilogue and copies add their vector accesses the same way. Memory:
    bytes moved into L1, L2 and L3 (``traffic_l1/l2/l3``) over the next level's bandwidth. All these
    times are combined as ``max(core, l2, l3, dram) + overhead`` (a log-sum-exp with ``softness``),
    so the score stays differentiable in the soft features.

    Args:
        cols: glob columns by name: ``flops``, ``elem_bytes``, ``vec``, ``accumulators``,
            ``balance``, ``unroll_effective``, ``traffic_l1``, ``traffic_l2``, ``traffic_l3`` and
            ``s2_trips`` (a tuple of the trip-count columns of the loops enclosing ``S2``, inclusive).
        operand_slots: access slots read in the inner loop (e.g. data, weight).
        other_slots: access slots counted as vector accesses outside the inner loop (acc, epilogue,
            copies).
        tile_col, total_col, contiguous_col: access-feature columns: distinct bytes of the
            register-block tile, total bytes accessed, 1 if contiguous along the vector axis.
        machine: ``clock_hz, fma_latency, fma_ports, load_ports, store_ports, issue_width, loop_ops,
            cores, l2_bw, l3_bw, dram_bw`` (bandwidths in bytes/s of one core, DRAM: all cores).
        overhead: fixed seconds per call; softness: log-sum-exp temperature in log-time.
    """

    KIND = "roofline_multilevel"
    MACHINE_KEYS = ("clock_hz", "fma_latency", "fma_ports", "load_ports", "store_ports", "issue_width", "loop_ops",
                    "cores", "l2_bw", "l3_bw", "dram_bw")

    def __init__(self, *, cols: dict, operand_slots: tuple, other_slots: tuple, tile_col: int, total_col: int,
                 contiguous_col: int, machine: dict, overhead: float = 2e-6, softness: float = 0.1, log1p: bool = True):
        missing = [k for k in self.MACHINE_KEYS if k not in machine]
        if missing:
            raise ValueError(f"machine lacks {missing}")
        self.cols = tuple(sorted((k, tuple(v) if isinstance(v, (tuple, list)) else int(v)) for k, v in cols.items()))
        self._c = dict(self.cols)
        self.operand_slots = tuple(int(s) for s in operand_slots)
        self.other_slots = tuple(int(s) for s in other_slots)
        self.tile_col, self.total_col, self.contiguous_col = int(tile_col), int(total_col), int(contiguous_col)
        self.machine = tuple((k, float(machine[k])) for k in self.MACHINE_KEYS)
        self.log1p = bool(log1p)
        self.softness = float(softness)
        # RooflineModel's attributes, for code that reads them (Blend's compile key)
        self.flops_col, self.bytes_col, self.efficiency_cols = self._c["flops"], self._c["traffic_l3"], ()
        self.min_efficiency = 1e-3
        self._params = {"log_overhead": jnp.asarray(np.log(max(overhead, 1e-30)), jnp.float32)}
        self._jitted = None

    def _raw(self, v: jax.Array) -> jax.Array:
        return jnp.maximum(jnp.expm1(v) if self.log1p else v, 0.0)

    def terms(self, params: dict, features: Features) -> dict[str, jax.Array]:
        """The log-seconds of each part (``core``, ``l2``, ``l3``, ``dram``, ``overhead``) and the
        inner loop's cycles per iteration (``cycles``), for inspection and tests."""
        m = dict(self.machine)
        glob = jnp.asarray(features.glob, jnp.float32)
        access = jnp.asarray(features.access, jnp.float32)
        mask = jnp.asarray(features.mask, jnp.float32)
        g = {k: self._raw(glob[..., c]) for k, c in self._c.items() if not isinstance(c, tuple)}
        elem = jnp.maximum(g["elem_bytes"], 1.0)
        vec = jnp.maximum(g["vec"], 1.0)
        block = jnp.maximum(g["accumulators"], 1e-3)  # block / vec: below 1 the vector's lanes are partly idle
        accs = jnp.maximum(block, 1.0)  # vector FMAs per iteration
        loads = 0.0
        for s in self.operand_slots:
            tile = self._raw(access[..., s, self.tile_col]) / elem * mask[..., s]
            contiguous = jnp.clip(self._raw(access[..., s, self.contiguous_col]), 0.0, 1.0)
            loads = loads + tile * (contiguous / vec + 1.0 - contiguous)
        loads = jnp.maximum(loads, 1.0)
        unroll = jnp.maximum(g["unroll_effective"], 1.0)
        tiny = 1e-30
        cycles = _smooth_max([jnp.log(accs / m["fma_ports"]), jnp.log(loads / m["load_ports"]),
                              jnp.log(jnp.full_like(accs, m["fma_latency"])),
                              jnp.log((accs + loads + m["loop_ops"] / unroll) / m["issue_width"])], self.softness)
        iters = jnp.maximum(g["flops"], tiny) / (2.0 * vec * block)
        workers = m["cores"] * jnp.clip(g["balance"], 1.0 / m["cores"], 1.0)
        others = 0.0
        for s in self.other_slots:
            others = others + self._raw(access[..., s, self.total_col]) * mask[..., s]
        s2 = 0.0 if not self._c["s2_trips"] else 1.0  # no columns: no per-S2 drain term
        for c in self._c["s2_trips"]:
            s2 = s2 * jnp.maximum(self._raw(glob[..., c]), 1.0)
        side = others / (elem * vec) / m["store_ports"] + s2 * (m["fma_latency"] + m["loop_ops"])
        log_core = jnp.log(iters * jnp.exp(cycles) + side) - jnp.log(m["clock_hz"] * workers)
        log_l2 = jnp.log(g["traffic_l1"] + tiny) - jnp.log(m["l2_bw"] * workers)
        log_l3 = jnp.log(g["traffic_l2"] + tiny) - jnp.log(m["l3_bw"] * workers)
        log_dram = jnp.log(g["traffic_l3"] + tiny) - jnp.log(m["dram_bw"])
        return {"core": log_core, "l2": log_l2, "l3": log_l3, "dram": log_dram, "cycles": cycles,
                "overhead": params["log_overhead"] + jnp.zeros_like(log_core)}

    def apply(self, params: dict, features: Features) -> jax.Array:
        """Pure score ``−log(latency)`` ``[...]``; differentiable in the features."""
        t = self.terms(params, features)
        roof = _smooth_max([t["core"], t["l2"], t["l3"], t["dram"]], self.softness)
        return -jnp.logaddexp(roof, params["log_overhead"])

    def _config(self) -> dict[str, Any]:
        return {"cols": {k: list(v) if isinstance(v, tuple) else v for k, v in self.cols},
                "operand_slots": list(self.operand_slots), "other_slots": list(self.other_slots),
                "tile_col": self.tile_col, "total_col": self.total_col, "contiguous_col": self.contiguous_col,
                "machine": dict(self.machine), "softness": self.softness, "log1p": self.log1p}

    @classmethod
    def load(cls, path: str | os.PathLike) -> "MultiLevelRoofline":
        """Reads a prior written by ``save``."""
        flat, meta = load_npz(path)
        if meta.get("kind") != cls.KIND:
            raise ValueError(f"{path} holds a {meta.get('kind')!r}, not a {cls.KIND!r}")
        model = cls(**meta["config"])
        model._params = {k: jnp.asarray(v) for k, v in unflatten_params(model._params, flat).items()}
        return model
