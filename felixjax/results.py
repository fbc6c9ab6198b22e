"""What a tuning run returns: :class:`TuneResult` (records, the best kernel, its source, a callable)."""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from codegen.build import build
from codegen.cuda.emulate import Emulated
from codegen.cuda.render import render as render_cuda
from codegen.cuda.space import CudaSpace
from codegen.lower import Plan, lower
from codegen.ops import Task
from codegen.render_c import render
from codegen.runtime import Kernel
from codegen.space import Config, Space
from codegen.target import Target

from .database import UPPER_BOUND, TuningRecord, as_bound, disturbed_below


@dataclass
class TuneResult:
    """Outcome of :func:`tune`: every record of the run, the best one, its source and a callable."""

    task: Task
    target: Target
    run: str
    history: list[TuningRecord]
    stats: dict = field(default_factory=dict)
    retimed: list[TuningRecord] = field(default_factory=list)
    stop_reason: str = ""

    @property
    def best(self) -> TuningRecord | None:
        """The best kernel: its re-timed record (timed again at the end of the run, interleaved with
        the runner-ups) when the run re-timed, else its best record while tuning. Where a config re-timed only on a
        busy machine (``noisy``: its timings are upper bounds) ran faster than the fastest clean re-timing, that
        config is the best, as its fastest record while tuning (a slower runner-up became the best, session 79),
        else (timed only disturbed) as its re-timing at its lowest timing, an upper bound (``database.as_bound``)."""
        ok = [r for r in self.retimed if r.ok]
        best = min(ok, key=lambda r: r.latency_s) if ok else None
        noisy = disturbed_below(self.retimed, best)
        if noisy is not None:
            mine = [r for r in self.history if r.ok and r.config == noisy.config]
            return min(mine, key=lambda r: r.latency_s) if mine else as_bound(noisy)  # timed only disturbed
        return best if best is not None else self.best_while_tuning

    @property
    def best_while_tuning(self) -> TuningRecord | None:
        """The fastest record of the run's history (a minimum over noisy timings: optimistic)."""
        ok = [r for r in self.history if r.ok]
        return min(ok, key=lambda r: r.latency_s) if ok else None

    def _best_plan(self) -> Plan:
        if self.best is None:
            raise RuntimeError(f"{self.task.name}: no correct kernel was measured in run {self.run!r} "
                               f"(statuses: {self.status_counts()})")
        return lower(Space(self.task, self.best.config.sketch, self.target), self.best.config)

    @property
    def source(self) -> str:
        """Source of the best kernel: C, or CUDA C on a GPU target."""
        if self.target.is_gpu:
            if self.best is None:
                self._best_plan()  # raises: no correct kernel was measured
            return render_cuda(CudaSpace(self.task, self.target), self.best.config).source
        return render(self._best_plan())

    def kernel(self, *, threads: int | None = None) -> Kernel:
        """The best kernel as a callable ``kernel(*arrays) -> ndarray`` (API layouts); on a GPU target
        the CUDA kernel run by CPU emulation (:class:`codegen.cuda.emulate.Emulated`)."""
        if self.target.is_gpu:
            if self.best is None:
                self._best_plan()  # raises: no correct kernel was measured
            return Emulated(CudaSpace(self.task, self.target), self.best.config)
        plan = self._best_plan()
        b = build(render(plan))
        if b.status != "ok":
            raise RuntimeError(f"rebuilding the best kernel failed: {b.error}")
        return Kernel(plan, b.lib_path, threads=threads or self.target.cores)

    def status_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.history:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(trial index, best latency so far) of this run."""
        best, ys = math.inf, []
        for r in self.history:
            best = min(best, r.latency_s)
            ys.append(best)
        return np.arange(1, len(ys) + 1), np.array(ys)

    def __repr__(self) -> str:
        b = self.best
        le = "<= " if b and b.result.error == UPPER_BOUND else ""  # timed only disturbed: an upper bound
        s = f"{'>= ' if le else ''}{b.gflops:.1f} GFLOP/s, {le}{b.latency_s * 1e3:.4g} ms" if b else "no correct kernel"
        sim = f", simulated on {self.target.name}" if self.target.is_gpu else ""  # (no GPU ran: the CLI says so too)
        return f"TuneResult({self.task.name}, run={self.run!r}, {len(self.history)} trials, best {s}{sim})"


def noisy_contender(history: list[TuningRecord], clean_best_s: float, sketches: Collection[str]) -> Config | None:
    """The config of the lowest ``noisy`` timing in ``history`` (timings are upper bounds) where it is below
    ``clean_best_s`` (the fastest clean record), else None; of ``sketches`` only (the run's, exclusions left out):
    the end-of-run re-timing times it beside the clean bests (one timed only disturbed lost to one 10x slower)."""
    noisy = [r for r in history if r.result.status == "noisy" and r.result.latencies and r.config.sketch in sketches]
    low = min(noisy, key=lambda r: min(r.result.latencies), default=None)
    return low.config if low is not None and min(low.result.latencies) < clean_best_s else None
