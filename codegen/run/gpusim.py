"""Measuring on a simulated GPU (``cuda-sim:<gpu>`` targets): build, check by emulation, simulate.

:class:`GpuSimMeasurer` has the measurer interface of the tuning session (``measure(configs,
on_result)``, like ``felixjax.measurer.Measurer``): for every config it

1. validates and renders the ``.cu`` kernel (:mod:`codegen.cuda.render`); a config outside the
   space is a ``compile_error``;
2. compiles it with ``nvcc -cubin -arch=<spec's sm>`` where nvcc exists and reads the ``ptxas -v``
   registers, shared memory and spills back (:mod:`codegen.cuda.nvcc`); otherwise the space's
   register estimate is used and marked ``estimated``;
3. compiles the same source for the CPU and runs sampled blocks against the numpy reference
   (:mod:`codegen.cuda.emulate`): a wrong kernel is ``wrong_result`` and never timed;
4. simulates the launch (:mod:`codegen.cuda.sim`); a block that cannot be resident (registers or
   shared memory beyond the SM) is a ``runtime_error``, as the launch would fail on the device.

The result's latency is the simulated seconds (one repeat: the simulator is deterministic).
``info[config]`` keeps the ptxas report (registers, shared memory, spill stores / loads; without nvcc the
register estimate with ``registers_estimated: True`` and spills ``None``) and the simulator's breakdown;
the tuning session stores it with the record (``TuningRecord.info``, the database's ``record_info``). Builds (nvcc and g++) run ``workers`` at a time in a thread
pool, each group checked and simulated before the next is built, so records arrive in order and a
seconds budget (wall-clock: builds, checks and simulation) stops the round soon after it runs out.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> m = GpuSimMeasurer(matmul(32, 32, 32), Target.cuda_sim("a100"), nvcc=False)
    >>> out = []
    >>> m.measure([m.spaces["cuda_tiled"].default()], lambda c, r: out.append(r) or True)
    >>> out[0].status, out[0].latency_s > 0
    ('ok', True)
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..cuda.emulate import build_emulator, check
from ..cuda.nvcc import NvccResult, compile_cubin, nvcc_path
from ..cuda.render import CUDA, CudaDialect, render
from ..cuda.sim import simulate_config
from ..cuda.space import cuda_spaces
from ..measure import MeasureResult
from ..ops import Task
from ..space import Config
from ..target import Target

__all__ = ["GpuSimMeasurer"]


class GpuSimMeasurer:
    """Builds, checks (CPU emulation) and simulates configs of one task on a ``cuda-sim`` target.

    Args:
        task, target: what is tuned and the simulated GPU (``Target.cuda_sim(name)``).
        nvcc: use nvcc for ptxas's register counts: ``None`` (where it is installed), True, False.
        max_blocks: blocks run by the emulation check (all of them for smaller grids).
        workers: parallel builds.
        dialect: the CUDA dialect table (tests plant bugs in it).
        input_seed: seed of the check's random inputs.
    """

    def __init__(self, task: Task, target: Target, *, nvcc: bool | None = None, max_blocks: int = 32,
                 workers: int = 2, dialect: CudaDialect = CUDA, input_seed: int = 0):
        if target.kind != "cuda-sim":
            raise ValueError(f"GpuSimMeasurer measures on cuda-sim targets, not {target.kind!r} (timing with CUDA "
                             "events on a real GPU is not implemented yet: use Target.cuda_sim(name))")
        self.task, self.target = task, target
        self.spec = target.spec
        self.spaces = cuda_spaces(task, target)
        self.use_nvcc = (nvcc_path() is not None) if nvcc is None else bool(nvcc)
        if self.use_nvcc and nvcc_path() is None:
            raise RuntimeError("nvcc=True but nvcc is not on PATH")
        self.max_blocks, self.workers, self.dialect = max_blocks, workers, dialect
        self.input_seed = input_seed
        self._arrays = None
        self._expected = None
        self.info: dict[Config, dict] = {}

    def _inputs(self):
        if self._arrays is None:
            self._arrays = self.task.random_inputs(seed=self.input_seed)
            self._expected = self.task.reference(*self._arrays)
        return self._arrays, self._expected

    def _build(self, cfg: Config):
        """Render + nvcc + the emulator's g++ build of one config (runs in a worker thread)."""
        t0 = time.perf_counter()
        space = self.spaces.get(cfg.sketch)
        if space is None:
            return None, None, f"sketch {cfg.sketch!r} does not apply to {self.target.name}", 0.0
        try:
            kernel = render(space, cfg, self.dialect)
        except ValueError as e:
            return None, None, str(e), time.perf_counter() - t0
        nv = compile_cubin(kernel.source, self.spec.arch) if self.use_nvcc else NvccResult("skipped")
        build_emulator(space, kernel)  # cached by content: check() finds it
        return kernel, nv, "", time.perf_counter() - t0

    def measure(self, configs: list[Config], on_result: Callable[[Config, MeasureResult], bool]) -> None:
        """Build all (in parallel), then check and simulate one by one; ``on_result`` returns False
        to stop early."""
        arrays, expected = self._inputs()
        step = max(1, self.workers)
        with ThreadPoolExecutor(max_workers=step) as pool:
            for i in range(0, len(configs), step):  # build a few at a time: a seconds budget stops soon
                chunk = configs[i: i + step]
                for cfg, (kernel, nv, err, build_s) in zip(chunk, pool.map(self._build, chunk)):
                    res = self._one(cfg, kernel, nv, err, build_s, arrays, expected)
                    if not on_result(cfg, res):
                        return

    def _one(self, cfg, kernel, nv, err, build_s, arrays, expected) -> MeasureResult:
        if kernel is None:
            return MeasureResult("compile_error", error=err, build_s=build_s)
        if nv.status in ("compile_error", "timeout"):
            return MeasureResult(nv.status, error=f"nvcc: {nv.error}", build_s=build_s)
        t0 = time.perf_counter()
        space = self.spaces[cfg.sketch]
        chk = check(space, cfg, arrays, expected, dialect=self.dialect, max_blocks=self.max_blocks, kernel=kernel)
        if not chk.ok:
            return MeasureResult(chk.status, error=chk.error, build_s=build_s, run_s=time.perf_counter() - t0)
        regs = nv.ptxas.get("registers") if nv.status == "ok" else None
        sim = simulate_config(space, cfg, registers=regs)
        ptx = dict(nv.ptxas) if nv.status == "ok" else {}
        self.info[cfg] = {"registers": regs if regs is not None else space.registers(cfg),
                          "registers_estimated": regs is None,
                          "smem_bytes": ptx.get("smem_bytes", kernel.smem_bytes),
                          "spill_stores": ptx.get("spill_stores"), "spill_loads": ptx.get("spill_loads"),
                          "ptxas": ptx, "arch": self.spec.arch, "bound": sim.bound,
                          "blocks_per_sm": sim.blocks_per_sm, "occupancy": sim.occupancy, "waves": sim.waves,
                          "roofline_s": sim.roofline_s, "emulated_blocks": chk.blocks_run,
                          "grid_blocks": chk.blocks_total}
        if sim.blocks_per_sm == 0:
            return MeasureResult("runtime_error", error=f"too many resources requested for launch on {self.spec.name}: "
                                 f"{self.info[cfg]['registers']} registers x {kernel.block} threads, "
                                 f"{kernel.smem_bytes} B shared memory", build_s=build_s,
                                 run_s=time.perf_counter() - t0)
        return MeasureResult("ok", (sim.seconds,), build_s=build_s, run_s=time.perf_counter() - t0)

    def close(self) -> None:
        pass
