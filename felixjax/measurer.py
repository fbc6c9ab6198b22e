"""Building and measuring the configs of one task on this machine (DESIGN.md ⑨–⑩).

A :class:`Measurer` owns a task's inputs and its numpy reference, renders and builds every
candidate (gcc in parallel), then measures them one at a time in the runner's process, so compiles
never share the cores being timed. Anything with the same ``measure(configs, on_result)`` method
(e.g. :class:`felixjax.testing.ReplayRunner`) can stand in for it. A runner with a
``measure_stream(sources, requests)`` method (:class:`felixjax.DaskRunner`) is given the whole batch
instead, and yields one result per request in order (builds and measurements placed by the runner).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable

import numpy as np

from codegen.build import build_many
from codegen.lower import Plan, lower
from codegen.measure import LocalRunner, MeasureResult, RunRequest, TimingProtocol
from codegen.ops import Task
from codegen.render_c import render
from codegen.run import Runner
from codegen.space import Config, Space, sketches_for
from codegen.target import Target


class Measurer:
    """Builds and measures configs of one task: build phase (parallel gcc), then measure phase (one
    kernel at a time in the runner's process), so compiles never share the cores being timed."""

    def __init__(self, task: Task, target: Target, runner: LocalRunner, *, threads: int | None = None,
                 protocol: TimingProtocol | None = None, build_workers: int = 2, input_seed: int = 0,
                 renderer: Callable[[Plan], str] = render, cache_dir: str | os.PathLike | None = None):
        self.task, self.target, self.runner = task, target, runner
        self.cache_dir = cache_dir  # compiled-kernel cache (None: codegen.build's default); a session may set it per run
        self.renderer = renderer
        self.threads = int(threads or target.cores)
        self.protocol = protocol
        self.build_workers = build_workers
        self.spaces = {sk.name: Space(task, sk, target) for sk in sketches_for(task)}
        self.arrays = task.random_inputs(seed=input_seed)
        self.expected = task.reference(*self.arrays)
        self._packed: dict[tuple, np.ndarray] = {}

    def plan(self, cfg: Config) -> Plan:
        if cfg.sketch not in self.spaces:  # a padded variant (its name spells its extents)
            self.spaces[cfg.sketch] = Space(self.task, cfg.sketch, self.target)
        return lower(self.spaces[cfg.sketch], cfg)

    def _inputs(self, plan: Plan) -> list[np.ndarray]:
        wl = plan.buffers["weight"].layout
        if wl not in self._packed:
            if len(self._packed) > 8:
                self._packed.clear()
            self._packed[wl] = plan.pack_weight(self.arrays[1])
        ins = [np.ascontiguousarray(self.arrays[0]), self._packed[wl]]
        return ins + list(self.arrays[2:])

    def measure(self, configs: list[Config], on_result: Callable[[Config, MeasureResult], bool]) -> None:
        """Build all, then measure one by one; ``on_result`` returns False to stop early."""
        plans, sources = [], []
        for cfg in configs:
            plans.append(self.plan(cfg))
            sources.append(self.renderer(plans[-1]))
        stream = getattr(self.runner, "measure_stream", None)
        if stream is not None:  # a runner that builds and measures a whole batch itself (fj.DaskRunner), in order
            with contextlib.closing(stream(sources, [self._request(p) for p in plans])) as results:
                for cfg, res in zip(configs, results):
                    if not on_result(cfg, res):
                        return
            return
        # a runner of the codegen.run.Runner protocol decides where builds happen; a bare LocalRunner builds here
        builds = (self.runner.build(sources) if isinstance(self.runner, Runner)
                  else build_many(sources, workers=self.build_workers, cache_dir=self.cache_dir))
        for cfg, plan, b in zip(configs, plans, builds):
            if not on_result(cfg, self.runner.run(self._request(plan), build=b)):
                return

    def _request(self, plan: Plan) -> RunRequest:
        rtol, atol = self.task.tolerance(self.expected)  # per dtype (codegen.ops.Task.tolerance)
        return RunRequest(None, self._inputs(plan), self.task.output_shape, plan.workspace_bytes, self.expected,
                          reduction_size=plan.con.reduction_size, threads=self.threads, protocol=self.protocol,
                          out_dtype=plan.arg_dtypes()[-1].name, rtol=rtol, atol=atol)
