"""Building and measuring the configs of one task on this machine (DESIGN.md ⑨–⑩).

A :class:`Measurer` owns a task's inputs and its numpy reference, renders and builds the candidates
(gcc in parallel), then measures them one at a time in the runner's process, so compiles never share
the cores being timed. With ``build_chunk=k`` it alternates: build ``k``, measure those ``k``, build the
next ``k``; results then arrive from the first chunk on instead of after every build of the batch
(``benchmarks/measure_chunks.py`` times both), and a run stopped early skips the builds it no longer
needs. Anything with the same ``measure(configs, on_result)`` method (e.g.
:class:`felixjax.testing.ReplayRunner`) can stand in for it. A runner with a ``measure_stream(sources,
requests)`` method (:class:`felixjax.DaskRunner`) is given the whole batch
instead, and yields one result per request in order (builds and measurements placed by the runner).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable

import numpy as np

from codegen.build import build_many
from codegen.lower import Plan, lower
from codegen.measure import (
    CRASHED,
    LocalRunner,
    MeasureResult,
    RunRequest,
    TimingProtocol,
)
from codegen.ops import Task
from codegen.render_c import render
from codegen.run import Runner
from codegen.space import Config, Space, sketches_for
from codegen.target import Target

BUILD_CHUNK = 8
"""Candidates built before they are measured, by default: on this project's 2-core host (session 64,
``benchmarks/measure_chunks.py``, 12 ops x 32 random configs) the first result of a batch arrived 3.0-4.5x
sooner than after building the whole batch, for 3% more time per batch (geomean; 0-10% per op; chunks
of 4: 7%, of 2: 14%)."""


class Measurer:
    """Builds and measures configs of one task: build phase (parallel gcc), then measure phase (one
    kernel at a time in the runner's process), so compiles never share the cores being timed.

    ``build_chunk``: candidates built before measuring them (``None``: the whole batch; ``k``, by default
    :data:`BUILD_CHUNK`: build ``k``, measure them, build the next ``k``, so the first results arrive
    after ``k`` builds, not all)."""

    def __init__(self, task: Task, target: Target, runner: LocalRunner, *, threads: int | None = None,
                 protocol: TimingProtocol | None = None, build_workers: int = 2,
                 build_chunk: int | None = BUILD_CHUNK, input_seed: int = 0,
                 renderer: Callable[[Plan], str] = render, cache_dir: str | os.PathLike | None = None):
        if not (hasattr(runner, "measure") or hasattr(runner, "measure_stream") or hasattr(runner, "run")):
            raise TypeError(f"runner= takes a runner object (codegen.measure.LocalRunner, fj.DaskRunner, ...), got "
                            f"{runner!r}" + ("; for a Dask cluster: felixjax.dask_runner.connect(address)"
                                             if isinstance(runner, str) else ""))
        self.task, self.target, self.runner = task, target, runner
        self.cache_dir = cache_dir  # compiled-kernel cache (None: codegen.build's default); a session may set it per run
        self.renderer = renderer
        self.threads = int(threads or target.cores)
        self.protocol = protocol
        self.build_workers = build_workers
        if build_chunk is not None and int(build_chunk) < 1:
            raise ValueError(f"build_chunk must be None or >= 1, got {build_chunk!r}")
        self.build_chunk = None if build_chunk is None else int(build_chunk)
        self.spaces = {sk.name: Space(task, sk, target) for sk in sketches_for(task)}
        self.arrays = task.random_inputs(seed=input_seed)
        self.expected = task.reference(*self.arrays)
        self._packed: dict[tuple, np.ndarray] = {}

    def plan(self, cfg: Config) -> Plan:
        if cfg.sketch not in self.spaces:  # a padded variant (its name spells its extents)
            self.spaces[cfg.sketch] = Space(self.task, cfg.sketch, self.target)
        return lower(self.spaces[cfg.sketch], cfg)

    def _inputs(self, plan: Plan) -> list[np.ndarray]:
        key = plan.weight_key()  # not the layout alone: int8 pairs / quads pack the same layout differently
        if key not in self._packed:
            if len(self._packed) > 8:
                self._packed.clear()
            self._packed[key] = plan.pack_weight(self.arrays[1])
        ins = [np.ascontiguousarray(self.arrays[0]), self._packed[key]]
        return ins + list(self.arrays[2:])

    def measure(self, configs: list[Config], on_result: Callable[[Config, MeasureResult], bool]) -> None:
        """Build (all, or ``build_chunk`` at a time), then measure one by one; ``on_result`` returns False
        to stop early (no later chunk is built then)."""
        plans, sources = [], []
        for cfg in configs:
            plans.append(self.plan(cfg))
            sources.append(self.renderer(plans[-1]))
        stream = getattr(self.runner, "measure_stream", None)
        if stream is not None:  # a runner that builds and measures a whole batch itself (fj.DaskRunner), in order
            try:
                with contextlib.closing(stream(sources, [self._request(p) for p in plans])) as results:
                    for cfg, res in zip(configs, results):
                        if not on_result(cfg, res):
                            return
            except BaseException:  # Ctrl-C, a lost scheduler: results that finished after an unfinished one too
                for i, res in getattr(self.runner, "take_stranded", list)():
                    if not on_result(configs[i], res):
                        break
                raise
            return
        step = self.build_chunk or max(1, len(sources))
        for lo in range(0, len(sources), step):
            # a runner of the codegen.run.Runner protocol decides where builds happen; a bare LocalRunner builds here
            part = sources[lo:lo + step]
            builds = self._build(part)
            for cfg, plan, b, src in zip(configs[lo:lo + step], plans[lo:lo + step], builds, part):
                if not on_result(cfg, self._run(plan, b, src)):
                    return

    def _build(self, sources: list[str]) -> list:
        return (self.runner.build(sources) if isinstance(self.runner, Runner)
                else build_many(sources, workers=self.build_workers, cache_dir=self.cache_dir))

    def _run(self, plan: Plan, b, source: str) -> MeasureResult:
        """Measure one build. A library of this machine's cache deleted since its build (a cleared cache) is
        built again, and a cached one that crashed the measuring process is dropped and built afresh once
        (a damaged file the ELF check passes): neither is stored as the config's failure."""
        local = b.status == "ok" and b.lib_path is not None and os.path.isabs(b.lib_path)
        if local and not os.path.exists(b.lib_path):
            b = self._build([source])[0]
        res = self.runner.run(self._request(plan), build=b)
        if local and b.cached and res.status == "runtime_error" and res.error.startswith(CRASHED):
            with contextlib.suppress(OSError):
                os.unlink(b.lib_path)
            res = self.runner.run(self._request(plan), build=self._build([source])[0])
        return res

    def _request(self, plan: Plan) -> RunRequest:
        rtol, atol = self.task.tolerance(self.expected)  # per dtype (codegen.ops.Task.tolerance)
        return RunRequest(None, self._inputs(plan), self.task.output_shape, plan.workspace_bytes, self.expected,
                          reduction_size=plan.con.reduction_size, threads=self.threads, protocol=self.protocol,
                          out_dtype=plan.arg_dtypes()[-1].name, rtol=rtol, atol=atol)
