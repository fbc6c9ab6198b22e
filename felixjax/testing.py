"""Fakes for running search without hardware: an analytic latency oracle and a replaying measurer.

Both plug in wherever the tuner's :class:`~felixjax.tuner.Measurer` goes: an object with
``measure(configs, on_result)`` that calls ``on_result(config, MeasureResult)`` per config in order
and stops when it returns False. ``fj.compare(..., replay=True)`` uses them, so strategies can be
compared on search logic alone, repeatably.

* :class:`SyntheticOracle`: a noise-free analytic latency of any config of a task: roofline-style
  compute time divided by a product of smooth efficiencies of the log tile sizes and knobs
  (vector width, register block size, inner reduction tile, L1 and L2 footprints, unroll, parallel
  chunks and balance, sketch). Its preferred values are drawn per task from ``seed``, so the optimum
  is not where a hand-written default puts it; on small tasks :func:`dense_table` finds it exactly.
* :class:`TimingNoise`: the oracle (or any latency) as a noisy host would time it.
* :class:`ReplayRunner`: returns recorded latencies without timing: from a table (for instance
  every valid config of a small task, enumerated with the oracle, or the records of a database) or
  from a callable such as the oracle. Unrecorded configs fail with ``runtime_error``.

Example:
    >>> import felixjax as fj
    >>> t = fj.ops.matmul(4, 8, 8)
    >>> table = dense_table(t)
    >>> replay = ReplayRunner(table)
    >>> best = min(table, key=table.get)
    >>> out = []
    >>> replay.measure([best], lambda c, r: out.append(r.latency_s) or True)
    >>> out[0] == replay.optimum
    True
"""
from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from codegen.measure import MeasureResult
from codegen.ops import Task
from codegen.padding import waste
from codegen.space import Config, Space, sketches_for
from codegen.target import Target

from .database import Database
from .strategies.genetic import LEVELS, Codec

CLOCK_HZ = 2.7e9


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


class SyntheticOracle:
    """Analytic, noise-free latency (seconds) of a config of ``task`` on ``target``.

    ``latency = flops / (peak * parallel speedup * efficiency) + overhead`` where ``efficiency`` is
    a product of smooth terms in (0, 1] of the log tile sizes and knobs:

    * vector lanes used, ``(vec / simd) ** 0.9``;
    * register block, a Gaussian in ``log2(prod(S3) / vec)`` around a preferred accumulator count
      (latency hiding against register pressure);
    * inner reduction tile ``prod(R1)``, a Gaussian in log2 around a preferred size;
    * L1 / L2: softplus penalties on the log ratio of the ``S2``- / ``S1``-level tile footprints
      (outputs, weights and inputs it touches) to the cache size;
    * unroll, a shallow Gaussian in ``log2(unroll)``; a fixed per-sketch factor.

    Parallel speedup is ``chunks / ceil(chunks / cores)`` for the outer fused loops' chunks.
    The preferred values come from a generator seeded by ``seed`` and the task, so different
    tasks and seeds have different optima.

    Example:
        >>> import felixjax as fj
        >>> t = fj.ops.matmul(64, 64, 64)
        >>> o = SyntheticOracle(t)
        >>> sp = o.spaces[0]
        >>> 0 < o(sp.default()) < 1
        True
    """

    def __init__(self, task: Task, target: Target | None = None, *, seed: int = 0):
        self.task = task
        self.target = target or Target.cpu()
        if self.target.is_gpu:
            raise ValueError(f"the synthetic oracle models CPU sketches, not {self.target.kind} targets: replay a "
                             "simulated GPU's own database, or tune it (its timings are simulated already)")
        # the exact sketches first (spaces[0] is the first), then the padded variants (codegen.padding)
        exact = [Space(task, sk, self.target) for sk in sketches_for(task)]
        self.spaces = exact + [Space(task, sk, self.target) for sk in sketches_for(task, self.target) if sk.pad]
        self.codec = Codec({sp.sketch.name: sp for sp in self.spaces})
        rng = np.random.default_rng([seed, int(task.key[:12], 16)])
        con = self.spaces[0].con
        red = math.prod(a.extent for a in con.reduction)
        self.pref_acc = float(rng.uniform(8, 20))
        self.pref_r1 = float(min(rng.uniform(5, 9), math.log2(max(red, 2))))
        self.pref_unroll = float(rng.uniform(1, 6))
        # one factor per sketch, drawn in the exact sketches' order (``sketches_for`` appends new sketches,
        # such as conv_flat, so the earlier ones keep their factors), then the padded ones' (so adding the
        # padded variants left the exact sketches' factors as they were); a padded sketch pays its waste
        factor = {n: rng.uniform(0.7, 1.0) for n in [sp.sketch.name for sp in exact]}
        for sp in self.spaces[len(exact):]:
            factor[sp.sketch.name] = factor[sp.sketch.base] / waste(sp.con, sp.api_con)
        self.sketch_factor = np.array([factor[n] for n in self.codec.sketches])
        self.simd = max(1, int(self.target.simd_lanes))
        self.peak = self.simd * 2 * 2 * CLOCK_HZ  # 2 FMA ports, 2 flops each, per core
        self.cores = max(1, int(self.target.cores))
        self.l1 = float(self.target.l1d_bytes or 32768)
        self.l2 = float(self.target.l2_bytes or 1 << 20)
        names = [a.name for a in con.axes]
        # which axes each buffer depends on (its tile footprint is the product of their tiles)
        self.uses = np.array([[acc.depends_on(n) for n in names] for acc in (con.out, con.weight, con.data)])
        self.flops = float(task.flops)

    def __call__(self, cfg: Config) -> float:
        return float(self.latencies([cfg])[0])

    def latencies(self, configs) -> np.ndarray:
        """Latencies of many configs (vectorized)."""
        return self.rows_latency(self.codec.encode_many(configs))

    def rows_latency(self, rows: np.ndarray) -> np.ndarray:
        """Latencies of :class:`~felixjax.strategies.genetic.Codec` rows."""
        c = self.codec
        t = c.tiles(rows).astype(float)
        sp = c.spatial
        vec = rows[:, c.c_vec].astype(float)
        unroll = rows[:, c.c_unroll].astype(float)
        par = rows[:, c.c_par]
        acc = np.prod(t[:, sp, LEVELS - 1], axis=1) / vec
        e_vec = (vec / self.simd) ** 0.9
        e_reg = np.exp(-0.35 * (np.log2(acc) - math.log2(self.pref_acc)) ** 2)
        r1 = np.prod(t[:, ~sp, 1], axis=1) if (~sp).any() else np.ones(len(rows))
        e_red = np.exp(-0.06 * (np.log2(r1) - self.pref_r1) ** 2)
        # per-axis extents of the tile at the S2 level (S2*S3; R1 for reductions) and the S1 level
        lvl2 = np.where(sp, t[:, :, 2] * t[:, :, 3], t[:, :, 1])
        lvl1 = np.where(sp, t[:, :, 1] * t[:, :, 2] * t[:, :, 3], t[:, :, 0] * t[:, :, 1])
        foot2 = 4 * sum(np.prod(np.where(u, lvl2, 1.0), axis=1) for u in self.uses)
        foot1 = 4 * sum(np.prod(np.where(u, lvl1, 1.0), axis=1) for u in self.uses)
        e_l1 = 1.0 / (1.0 + 0.25 * _softplus(2.0 * (np.log2(foot2) - math.log2(self.l1))))
        e_l2 = 1.0 / (1.0 + 0.15 * _softplus(2.0 * (np.log2(foot1) - math.log2(self.l2))))
        e_unroll = np.exp(-0.03 * (np.log2(unroll) - self.pref_unroll) ** 2)
        eff = e_vec * e_reg * e_red * e_l1 * e_l2 * e_unroll * self.sketch_factor[rows[:, 0]]
        outer = t[:, sp, 0]
        first = np.arange(outer.shape[1])[None, :] < par[:, None]
        chunks = np.prod(np.where(first, outer, 1.0), axis=1)
        speedup = chunks / np.ceil(chunks / self.cores)
        overhead = 2e-7 + 1.5e-6 * (par > 0)  # call, and waking the OpenMP team
        return self.flops / (self.peak * speedup * eff) + overhead


class TimingNoise:
    """Host-like timing noise over a noise-free latency: each measurement is the true latency times
    ``exp(sigma * |z|)``, ``z`` standard normal, drawn afresh per measurement (a kernel is never timed
    faster than it is; interference only slows it, so repeated timings scatter above their floor, as
    this host's do: ``benchmarks/timing_spread.py``). ``sigma=0.1`` puts a kernel's median timing
    about 7% above its lowest.

    Args:
        latency: ``config -> seconds``; with a vectorized ``latencies(configs)`` (a
            :class:`SyntheticOracle`) it is used.
        sigma: the scale of the log slowdown (> 0).
        seed: the draws' seed (with the same order of measurements, the same draws).

    Example:
        >>> import felixjax as fj
        >>> o = SyntheticOracle(fj.ops.matmul(64, 64, 64))
        >>> cfg = o.spaces[0].default()
        >>> noisy = TimingNoise(o, 0.1, seed=0)
        >>> ts = noisy.latencies([cfg] * 200)
        >>> bool((ts >= o(cfg)).all()), bool(1.03 < np.median(ts) / o(cfg) < 1.12)
        (True, True)
    """

    def __init__(self, latency: Callable[[Config], float], sigma: float, *, seed: int | list[int] = 0):
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0 (got {sigma})")
        self.latency, self.sigma = latency, float(sigma)
        self.rng = np.random.default_rng(seed)

    def __call__(self, cfg: Config) -> float:
        return float(self.latencies([cfg])[0])

    def latencies(self, configs) -> np.ndarray:
        configs = list(configs)
        batch = getattr(self.latency, "latencies", None)
        base = np.asarray(batch(configs) if batch is not None else [self.latency(c) for c in configs], float)
        return base * np.exp(self.sigma * np.abs(self.rng.standard_normal(len(base))))


def dense_table(task: Task, target: Target | None = None, oracle: Callable | None = None, *,
                seed: int = 0) -> dict[Config, float]:
    """Every valid config of a small task with its oracle latency (a densely recorded space).

    Example:
        >>> import felixjax as fj
        >>> len(dense_table(fj.ops.matmul(4, 8, 8))) > 1000
        True
    """
    oracle = oracle or SyntheticOracle(task, target, seed=seed)
    codec = oracle.codec if isinstance(oracle, SyntheticOracle) else Codec(
        {sk.name: Space(task, sk, target or Target.cpu()) for sk in sketches_for(task)})
    table: dict[Config, float] = {}
    for rows in codec.enumerate():
        cfgs = codec.decode_many(rows)
        lat = oracle.rows_latency(rows) if isinstance(oracle, SyntheticOracle) else [oracle(c) for c in cfgs]
        table.update(zip(cfgs, (float(x) for x in lat)))
    return table


class ReplayRunner:
    """A measurer that replays recorded latencies (no building, no timing).

    Args:
        latency: ``{config: latency seconds or MeasureResult}`` (a recorded space) or a callable
            ``config -> latency seconds`` (e.g. a :class:`SyntheticOracle`). A config missing from
            the table, or a non-finite latency, comes back as ``runtime_error``.
        trial_s: simulated seconds one trial costs (building and timing a real kernel takes ~0.3 s);
            ``fj.compare`` adds it to a run's clock so seconds budgets behave as on hardware.

    Example:
        >>> import felixjax as fj
        >>> r = ReplayRunner(SyntheticOracle(fj.ops.matmul(32, 32, 32)))
        >>> sp = Space(fj.ops.matmul(32, 32, 32), "gemm_packed", fj.Target.cpu())
        >>> got = []
        >>> r.measure([sp.default()], lambda c, res: got.append(res.status) or True)
        >>> got
        ['ok']
    """

    #: its records are marked ``{"replayed": true}`` (``TuningRecord.info``): a measured run never continues
    #: a replayed one, nor the reverse (:meth:`felixjax.session.TuningSession.add`)
    replayed = True

    def __init__(self, latency: Mapping[Config, float | MeasureResult] | Callable[[Config], float], *,
                 trial_s: float = 0.3):
        self.latency = latency
        self.trial_s = float(trial_s)
        self.calls: list[Config] = []  # every config measured, in order

    @property
    def optimum(self) -> float:
        """The best recorded latency (tables only)."""
        if not isinstance(self.latency, Mapping):
            raise TypeError("the optimum is known for a recorded table only")
        vals = [v.latency_s if isinstance(v, MeasureResult) else v for v in self.latency.values()]
        return min(vals)

    def result(self, cfg: Config) -> MeasureResult:
        if isinstance(self.latency, Mapping):
            if cfg not in self.latency:
                return MeasureResult("runtime_error", error="replay: config not in the recorded table")
            v = self.latency[cfg]
        else:
            v = self.latency(cfg)
        return self._result(v)

    @staticmethod
    def _result(v) -> MeasureResult:
        if isinstance(v, MeasureResult):
            return v
        if not math.isfinite(v) or v <= 0:
            return MeasureResult("runtime_error", error=f"replay: recorded latency {v}")
        return MeasureResult("ok", (float(v),))

    def measure(self, configs: list[Config], on_result: Callable[[Config, MeasureResult], bool]) -> None:
        """Like :meth:`felixjax.tuner.Measurer.measure`: ``on_result`` returns False to stop."""
        batch = getattr(self.latency, "latencies", None)  # a vectorized oracle: all at once
        lat = list(batch(configs)) if batch is not None and configs else None
        for i, cfg in enumerate(configs):
            self.calls.append(cfg)
            if not on_result(cfg, self.result(cfg) if lat is None else self._result(lat[i])):
                return

    @classmethod
    def from_oracle(cls, task: Task, target: Target | None = None, *, seed: int = 0, dense: bool = False,
                    trial_s: float = 0.3, noise: float = 0.0) -> "ReplayRunner":
        """Replay the synthetic oracle of ``task``: analytically, or (``dense=True``, small tasks)
        from the table of every valid config; ``noise > 0``: every measurement with
        :class:`TimingNoise` of that scale (analytic only; drawn from ``seed`` and the task)."""
        oracle = SyntheticOracle(task, target, seed=seed)
        if noise and dense:
            raise ValueError("noise applies to the analytic oracle; a dense table replays fixed latencies")
        if noise:
            return cls(TimingNoise(oracle, noise, seed=[seed, int(task.key[:12], 16)]), trial_s=trial_s)
        return cls(dense_table(task, target, oracle) if dense else oracle, trial_s=trial_s)

    @classmethod
    def from_database(cls, db, task: Task, *, trial_s: float = 0.3) -> "ReplayRunner":
        """Replay the records of ``task`` in a database (path or :class:`~felixjax.Database`): each
        config's median over its ok measurements, else its last recorded failure. A path is opened
        read-only (``Database(path, readonly=True)``: read-only files work, nothing is written) and
        closed again; a :class:`~felixjax.Database` passed in is left open."""
        database = db if isinstance(db, Database) else Database(db, readonly=True)
        ok: dict[Config, list[float]] = {}
        failed: dict[Config, MeasureResult] = {}
        try:
            records = database.records(task=task)
            path = database.path
        finally:
            if database is not db:
                database.close()
        for rec in records:
            if rec.ok:
                ok.setdefault(rec.config, []).append(rec.latency_s)
            else:
                failed[rec.config] = rec.result
        if not ok and not failed:
            raise ValueError(f"{path}: no records of {task.name} to replay")
        table: dict[Config, float | MeasureResult] = dict(failed)
        table.update({c: float(np.median(v)) for c, v in ok.items()})
        return cls(table, trial_s=trial_s)


class OracleScorer:
    """A :class:`~felixjax.model.Scorer` that knows the synthetic oracle: ``-log latency`` plus
    optional Gaussian noise (a stand-in for a trained cost model in tests).

    Example:
        >>> import felixjax as fj
        >>> t = fj.ops.matmul(64, 64, 64)
        >>> sc = OracleScorer(SyntheticOracle(t))
        >>> sp = Space(t, "gemm_packed", fj.Target.cpu())
        >>> float(sc.score([sp.default()])[0]) == -math.log(sc.oracle(sp.default()))
        True
    """

    def __init__(self, oracle: SyntheticOracle, *, noise: float = 0.0, seed: int = 0):
        self.oracle, self.noise = oracle, float(noise)
        self.rng = np.random.default_rng(seed)

    def score(self, configs: list[Config]) -> np.ndarray:
        s = -np.log(self.oracle.latencies(configs))
        return s + self.rng.normal(scale=self.noise, size=len(s)) if self.noise else s

    def update(self, records: list) -> None:
        pass


class OracleUncertainty:
    """A stand-in for the cost-aware ensemble (:mod:`felixjax.cost_aware`): the synthetic oracle's
    ``−log latency`` plus a fixed per-config error (Gaussian, ``noise``, drawn from the config's hash),
    with a constant reported spread ``std``. Pass ``lambda: OracleUncertainty(oracle)`` as
    ``CostAware(uncertainty=...)``; without ``oracle``, the oracle of the run's task (``ctx.task``).

    Example:
        >>> import felixjax as fj
        >>> t = fj.ops.matmul(64, 64, 64)
        >>> u = OracleUncertainty(SyntheticOracle(t), noise=0.0)
        >>> cfg = Space(t, "gemm_packed", fj.Target.cpu()).default()
        >>> mean, std = u.predict(None, [cfg])
        >>> bool(abs(mean[0] + math.log(u.oracle(cfg))) < 1e-9), float(std[0])
        (True, 0.1)
    """

    def __init__(self, oracle: SyntheticOracle | None = None, *, noise: float = 0.1, std: float = 0.1):
        self.oracle, self.noise, self.std = oracle, float(noise), float(std)

    def update(self, ctx, records: list) -> None:
        pass

    def predict(self, ctx, configs: list) -> tuple[np.ndarray, np.ndarray]:
        if self.oracle is None:
            self.oracle = SyntheticOracle(ctx.task, ctx.target)
        mean = -np.log(self.oracle.latencies(list(configs)))
        if self.noise:
            import hashlib

            err = [np.random.default_rng(int.from_bytes(hashlib.sha256(c.dumps().encode()).digest()[:8], "little"))
                   .normal(scale=self.noise) for c in configs]
            mean = mean + np.asarray(err)
        return mean, np.full(len(mean), self.std)


def run_standalone(folder: str | Path, x: np.ndarray, *, runs: int = 1,
                   cflags: str | None = None) -> tuple[np.ndarray, str]:
    """Build an exported standalone network (``CompiledModel.export``) with ``make`` and run its demo on
    ``x`` (written as ``inputs.bin``) ``runs`` times: ``(the flat float32 outputs, the demo's stdout)``.
    ``cflags``: the Makefile's ``CFLAGS`` instead of its own (say without ``-fopenmp``). Argument lists
    only, never a shell.

    Raises:
        AssertionError: ``make`` or the demo failed (their stderr in the message).
    """
    out = Path(folder)
    np.ascontiguousarray(x, dtype=np.float32).tofile(out / "inputs.bin")
    make = ["make"] + ([f"CFLAGS={cflags}"] if cflags is not None else [])
    r = subprocess.run(make, cwd=out, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["./demo", "weights.bin", "inputs.bin", "outputs.bin", str(int(runs))], cwd=out,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out / "outputs.bin", dtype="<f4"), r.stdout
