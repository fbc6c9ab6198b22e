"""The GPU sketch ``cuda_tiled`` (after Ansor's multi-level GPU tiling) and its constraints.

The same :class:`codegen.space.Config` as the CPU sketches, with its knobs read the GPU way:

* ``tiles``: per spatial axis 4 levels ``(S0, S1, S2, S3)`` = (blocks, virtual threads, threads,
  inner): the block tile of an axis is ``S1 * S2 * S3`` and a thread owns ``S1 * S3`` of its
  elements, at ``v * (S2 * S3) + t * S3 + i`` inside the block tile (virtual threads are strided by
  the thread tile, as Ansor's vthreads, so neighbouring threads touch neighbouring chunks). Per
  reduction axis 2 levels ``(R0, R1)``: ``R0`` outer steps, each staging an ``R1`` slice.
* ``parallel``: shared-memory staging, 0 = operands read from global memory by every thread,
  1 = each reduction step copies the block's data and weight tiles into ``__shared__`` arrays by
  cooperative fetch (all threads of the block, strided by the thread count), between barriers.
* ``vec``: always 1 (fp32 scalar loads; vector loads are future work).
* ``unroll``: ``#pragma unroll N`` on the inner reduction loop (1 = not unrolled), 1 .. 512.

Threads of a block are laid out with the last spatial axis fastest (``threadIdx.x`` decomposed
innermost-first), so for matmul consecutive threads own consecutive ``n`` columns: coalesced
weight reads and output writes when ``S3 == 1`` along ``n``. Blocks are laid out the same way on
``blockIdx.x``.

Constraints (``validate``): threads per block ``prod(S2) <= 1024`` (the spec's limit); a block size
that is not a multiple of the warp size (32) is allowed (tiny extents need it) and the simulator
charges the partial warp in full; shared memory of the staged tiles within the per-block limit and
within the 48 KB that static ``__shared__`` arrays may use (dynamic shared memory is future work);
estimated registers per thread (accumulators + operand fragments + a fixed overhead) within the
per-thread limit and one block's registers within the SM's register file.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> sp = CudaSpace(matmul(256, 256, 256), Target.cuda_sim("a100"))
    >>> cfg = sp.default()
    >>> sp.validate(cfg) is None, sp.geometry(cfg).n_threads
    (True, 128)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ops import Access, Task
from ..space import (REDUCE_LEVELS, SPATIAL_LEVELS, UNROLL_CHOICES, Config, Sketch, Space, check_tiles,
                     _largest_divisor_leq, count_factorizations, random_factorization)
from ..factors import whole
from ..target import Target

SKETCH = "cuda_tiled"
STAGING_CHOICES = (0, 1)
REG_OVERHEAD = 24  # indices, pointers, loop counters, address arithmetic (an estimate)
STATIC_SMEM_LIMIT = 48 * 1024  # static __shared__ arrays; more needs dynamic shared memory (not emitted yet)


@dataclass(frozen=True)
class Geometry:
    """What a config means on the GPU: grid, block, per-thread work, staged tiles.

    Attributes are dicts by axis name: ``blocks`` (S0), ``vthreads`` (S1), ``threads`` (S2),
    ``inner`` (S3), ``block_tile`` (S1*S2*S3), ``red_outer`` (R0), ``red_inner`` (R1).
    ``boxes``: per input buffer ("data", "weight"), the extents of the region one block reads in
    one reduction step (its shared-memory tile when staged).
    """

    spatial: tuple[str, ...]
    reduce: tuple[str, ...]
    blocks: dict
    vthreads: dict
    threads: dict
    inner: dict
    block_tile: dict
    red_outer: dict
    red_inner: dict
    staged: bool
    unroll: int
    boxes: dict

    @property
    def n_blocks(self) -> int:
        return math.prod(self.blocks.values())

    @property
    def n_threads(self) -> int:
        return math.prod(self.threads.values())

    @property
    def outputs_per_thread(self) -> int:
        return math.prod(self.vthreads[a] * self.inner[a] for a in self.spatial)

    @property
    def steps(self) -> int:
        """Reduction steps (outer iterations, each a staged tile)."""
        return math.prod(self.red_outer.values()) if self.reduce else 1

    @property
    def step_depth(self) -> int:
        """Reduction iterations per step (``prod R1``)."""
        return math.prod(self.red_inner.values()) if self.reduce else 1

    def box_elems(self, buffer: str) -> int:
        return math.prod(self.boxes[buffer])

    @property
    def smem_bytes(self) -> int:
        return 4 * sum(self.box_elems(b) for b in ("data", "weight")) if self.staged else 0

    def fragment(self, access: Access) -> int:
        """Distinct elements of ``access`` one thread reads per reduction iteration."""
        return math.prod(self.vthreads[a] * self.inner[a] for a in self.spatial if access.depends_on(a))


def box_extents(access: Access, tile: dict) -> tuple[int, ...]:
    """Extents of the index box an access covers when every axis ranges over ``tile[axis]`` values."""
    return tuple(1 + sum(abs(c) * (tile.get(a, 1) - 1) for a, c in dim) for dim in access.dims)


class CudaSpace(Space):
    """Valid ``cuda_tiled`` configs of one (task, GPU target)."""

    def __init__(self, task: Task, target: Target, sketch: str | Sketch = SKETCH):
        name = sketch.name if isinstance(sketch, Sketch) else sketch
        if name != SKETCH:
            raise ValueError(f"sketch {name!r} does not apply to a GPU target; valid: {SKETCH}")
        if task.dtype != "float32" or task.dtypes is not None or task.out_dtype not in (None, "float32"):
            # the CUDA renderer, its emulator and the simulator's byte counts are float32 only
            raise ValueError(f"{task.name}: {task.dtype} kernels are not generated for GPU targets yet (CUDA "
                             "kernels are float32); tune it on a CPU target, or tune the float32 task")
        self.task, self.target, self.spec = task, target, target.spec
        self.con = task.contraction()
        self.axes = self.con.axes
        spatial = [a.name for a in self.con.spatial]
        self.sketch = Sketch(SKETCH, spatial[-1], spatial[-1])
        self.levels = tuple(REDUCE_LEVELS if a.reduce else SPATIAL_LEVELS for a in self.axes)
        self.vector_index = [a.name for a in self.axes].index(self.sketch.vector_axis)
        self.n_spatial = 1  # "parallel" is the staging switch, 0..1 (what the genetic codec draws and mutates)
        self.vec_choices = (1,)
        self.unroll_steps = UNROLL_CHOICES  # nvcc: the CPU renderer's MAX_UNROLL_STEP does not apply
        self.max_accumulators = int(self.spec.regs_per_thread)
        self.strict_validation = True  # constraints beyond the CPU codec's checks (see genetic.Codec)

    def __repr__(self) -> str:
        return f"CudaSpace({self.task.name}, {self.spec.name})"

    # ---- meaning of a config ---------------------------------------------------------------------
    def geometry(self, cfg: Config) -> Geometry:
        sp = [a.name for a in self.con.spatial]
        rd = [a.name for a in self.con.reduction]
        t = {a.name: tuple(x) for a, x in zip(self.axes, cfg.tiles)}
        blocks = {a: t[a][0] for a in sp}
        vth = {a: t[a][1] for a in sp}
        thr = {a: t[a][2] for a in sp}
        inn = {a: t[a][3] for a in sp}
        btile = {a: vth[a] * thr[a] * inn[a] for a in sp}
        ro = {a: t[a][0] for a in rd}
        ri = {a: t[a][1] for a in rd}
        tile = {**btile, **ri}
        boxes = {"data": box_extents(self.con.data, tile), "weight": box_extents(self.con.weight, tile)}
        return Geometry(tuple(sp), tuple(rd), blocks, vth, thr, inn, btile, ro, ri, bool(cfg.parallel),
                        int(cfg.unroll), boxes)

    def registers(self, cfg: Config, geo: Geometry | None = None) -> int:
        """Estimated registers per thread: accumulators + one operand fragment each + overhead."""
        g = geo or self.geometry(cfg)
        return g.outputs_per_thread + g.fragment(self.con.data) + g.fragment(self.con.weight) + REG_OVERHEAD

    # ---- constraints -----------------------------------------------------------------------------
    def validate(self, cfg: Config) -> None:
        """Raise ``ValueError`` naming the knob and its valid range if ``cfg`` is not in the space."""
        if cfg.sketch != SKETCH:
            raise ValueError(f"config is for sketch {cfg.sketch!r}, space is {SKETCH!r}")
        check_tiles(self.axes, self.levels, cfg.tiles)
        if cfg.extra:
            raise ValueError(f"knobs {[k for k, _ in cfg.extra]} do not apply to sketch {SKETCH!r}")
        if not whole(cfg.parallel) or cfg.parallel not in STAGING_CHOICES:  # (True / 1.0: refused, as on CPUs)
            raise ValueError(f"parallel={cfg.parallel}: the GPU sketch reads it as shared-memory staging, 0 or 1")
        if not whole(cfg.vec) or cfg.vec != 1:
            raise ValueError(f"vec={cfg.vec}: the GPU sketch uses scalar fp32 loads (vec=1)")
        if not whole(cfg.unroll) or cfg.unroll not in UNROLL_CHOICES:
            raise ValueError(f"unroll={cfg.unroll}: valid values are 1, 2, 4, ..., 512")
        g = self.geometry(cfg)
        s = self.spec
        if g.n_threads > s.max_threads_per_block:
            raise ValueError(f"threads per block {g.n_threads} (prod of S2 tiles) exceed {s.max_threads_per_block}")
        smem_limit = min(s.smem_per_block, STATIC_SMEM_LIMIT)
        if g.smem_bytes > smem_limit:
            raise ValueError(f"shared memory {g.smem_bytes} B of the staged tiles exceeds the per-block limit "
                             f"{smem_limit} B (static __shared__ arrays on {s.name})")
        regs = self.registers(cfg, g)
        if regs > s.regs_per_thread:
            raise ValueError(f"estimated {regs} registers per thread exceed {s.regs_per_thread} "
                             f"({g.outputs_per_thread} accumulators per thread)")
        if regs * g.n_threads > s.regs_per_sm:
            raise ValueError(f"one block needs {regs * g.n_threads} registers, the SM has {s.regs_per_sm}")

    def repair(self, cfg: Config) -> Config:
        """The nearest valid config by moves of single prime factors to the grid level: threads
        (``S2``) over the limit move to ``S0``; staged shared memory over the limit shrinks the
        largest ``R1`` slice (then block tiles); registers over the limit shrink the largest
        per-thread tile (``S1`` or ``S3``). Knobs outside their domains are clamped. Terminates: every
        move lowers a block-level tile, and all-ones tiles are valid. Used where a search produces
        configs by its own rules (the CPU relaxation's rounding) and the GPU limits must still hold.

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> sp = CudaSpace(matmul(2048, 2048, 64), Target.cuda_sim("a100"))
            >>> bad = Config(SKETCH, ((1, 1, 1, 1), (1, 1, 64, 32), (1, 1, 64, 32), (8, 8)), 3, 4, 3)
            >>> sp.is_valid(sp.repair(bad))
            True
        """
        tiles = {a.name: list(t) for a, t in zip(self.axes, cfg.tiles)}
        unroll = max([u for u in UNROLL_CHOICES if u <= max(1, cfg.unroll)] or [1])
        fixed = Config(SKETCH, cfg.tiles, min(max(cfg.parallel, 0), 1), 1, unroll)
        sp = [a.name for a in self.con.spatial]
        rd = [a.name for a in self.con.reduction]

        def move(axis: str, src: int) -> bool:
            v = tiles[axis][src]
            if v <= 1:
                return False
            p = next(q for q in range(2, v + 1) if v % q == 0)  # smallest prime factor
            tiles[axis][src] //= p
            tiles[axis][0] *= p
            return True

        for _ in range(10_000):
            cand = Config(SKETCH, tuple(tuple(tiles[a.name]) for a in self.axes), fixed.parallel, 1, unroll)
            try:
                self.validate(cand)
                return cand
            except ValueError as e:
                msg = str(e)
            g = self.geometry(cand)
            if "threads per block" in msg:
                move(max(sp, key=lambda a: g.threads[a]), 2)
            elif "shared memory" in msg:
                if not (rd and move(max(rd, key=lambda a: g.red_inner[a]), 1)):
                    a = max(sp, key=lambda a: g.vthreads[a] * g.inner[a])
                    move(a, 1) or move(a, 3) or move(max(sp, key=lambda a: g.threads[a]), 2)
            elif "register" in msg:
                a = max(sp, key=lambda a: g.vthreads[a] * g.inner[a])
                if not (move(a, 1) or move(a, 3)):
                    move(max(sp, key=lambda a: g.threads[a]), 2)
            else:
                raise ValueError(f"cannot repair {cfg}: {msg}")
        raise ValueError(f"cannot repair {cfg}")

    # ---- sampling --------------------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator) -> Config:
        tiles = tuple(random_factorization(rng, a.extent, lv) for a, lv in zip(self.axes, self.levels))
        return Config(SKETCH, tiles, int(rng.choice(STAGING_CHOICES)), 1, int(rng.choice(UNROLL_CHOICES)))

    def size(self) -> int:
        tiles = math.prod(count_factorizations(a.extent, lv) for a, lv in zip(self.axes, self.levels))
        return tiles * len(STAGING_CHOICES) * len(UNROLL_CHOICES)

    def enumerate(self):
        raise NotImplementedError("the GPU space is sampled, not enumerated")

    def default(self) -> Config:
        """A conventional tiled schedule without search. First choice, for large outputs: 256 threads
        (32 along the last spatial axis, 8 along the one before), 4x4 virtual threads of 4x2 outputs
        (128 accumulators per thread, a 128x256 block tile on a matmul), reduction slices of 32 staged
        in shared memory; then 256 threads (16 along the last axis) with 2x2 virtual threads of 4x4 (or
        2x2) outputs and slices of 8, a plain 4x4 tile, and smaller fallbacks. The first valid one
        that keeps at least 3/4 of the SMs busy is taken (big tiles leave too few blocks on small
        outputs), else the one that best fills the GPU: ``min(1, blocks / SMs) * min(1, threads / 128)``
        (ties: the first)."""
        tries = [(256, 8, 32, 1, 4, 32, 2), (256, 16, 8, 1, 2), (256, 4, 8, 1, 2), (256, 16, 8, 1, 1),
                 (128, 8, 4, 1, 1), (64, 4, 1, 1, 1), (32, 1, 1, 0, 1), (1, 1, 1, 0, 1)]
        valid = [c for c in (self._default(*t) for t in tries) if self.is_valid(c)]
        if not valid:
            raise ValueError(f"{self}: no default schedule fits {self.spec.name}")

        def fill(c: Config) -> float:  # share of the SMs busy x share of a 128-thread block
            g = self.geometry(c)
            return min(1.0, g.n_blocks / self.spec.sm_count) * min(1.0, g.n_threads / 128)

        return next((c for c in valid if fill(c) >= 0.75), None) or max(valid, key=fill)

    def _default(self, threads: int, inner: int, depth: int, staged: int, vthreads: int, last_threads: int = 16,
                 last_inner: int = 4) -> Config:
        ext = {a.name: a.extent for a in self.axes}
        sp = [a.name for a in self.con.spatial]
        tiles = {}
        t_left, i_left = threads, inner
        for k, a in enumerate(reversed(sp)):
            i = _largest_divisor_leq(ext[a], max(1, min(last_inner if k == 0 else 4, i_left)))
            th = _largest_divisor_leq(ext[a] // i, max(1, min(last_threads if k == 0 else t_left, t_left)))
            v = vthreads if k < 2 and (ext[a] // (i * th)) % vthreads == 0 else 1
            tiles[a] = (ext[a] // (i * th * v), v, th, i)
            t_left //= th
            i_left //= i
        d_left = depth
        for a in reversed([a.name for a in self.con.reduction]):
            r1 = _largest_divisor_leq(ext[a], max(1, d_left))
            tiles[a] = (ext[a] // r1, r1)
            d_left = max(1, d_left // r1)
        return Config(SKETCH, tuple(tiles[a.name] for a in self.axes), staged, 1, 8 if staged else 1)


def cuda_spaces(task: Task, target: Target) -> dict[str, CudaSpace]:
    """The GPU spaces of a task, by sketch name (one sketch today)."""
    return {SKETCH: CudaSpace(task, target)}
