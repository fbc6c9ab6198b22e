"""The relaxation of the GPU sketch ``cuda_tiled`` (issue 18): the CPU coordinates, GPU limits.

The GPU sketch's :class:`~codegen.space.Config` has the same shape as a CPU one (4 tile levels per
spatial axis, 2 per reduction axis, ``parallel``, ``vec``, ``unroll``), read the GPU way (blocks,
virtual threads, threads, inner; ``parallel`` = shared-memory staging 0/1; ``vec`` = 1). So the
point ``x`` of :mod:`felixjax.relax` encodes it unchanged: prime exponents of every tile level,
``x[I_UNROLL] = log2 unroll``, ``x[I_PAR]`` = staging in [0, 1] (``n_spatial`` is 1 for this sketch),
``x[I_VEC] = 0`` (its box is [0, 0]). What differs are the limits:

* :class:`GpuTable` -- fixed-size arrays of one (task, GPU): which axes each buffer depends on, the
  coefficients of its index boxes, its strides, the task's FLOPs and the spec's limits. The features
  (:mod:`felixjax.features_gpu`) and the constraints read it.
* :func:`gpu_constraints` -- ``log lhs − log rhs ≤ 0`` for threads per block ≤ 1024, staged shared
  memory ≤ the static per-block limit, estimated registers per thread ≤ 255 and per block ≤ the
  register file, and (soft, a preference) at least one block per SM.
* :class:`GpuRelaxation` -- the :class:`~felixjax.relax.Relaxation` whose descent penalty is
  :func:`gpu_penalty` (``descent_arrays`` carries both tables), whose validity check adds the GPU
  limits (vectorized, so neighbourhoods keep only valid points) and whose rounding repairs GPU
  violations with :meth:`codegen.cuda.space.CudaSpace.repair` (moves of prime factors to the grid).

Example:
    >>> import numpy as np
    >>> from codegen.cuda.space import CudaSpace
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> sp = CudaSpace(matmul(256, 256, 256), Target.cuda_sim("a100"))
    >>> rel = GpuRelaxation(sp)
    >>> cfgs = rel.round_x(np.random.default_rng(0).uniform(-2, 9, size=(16, N_X)))
    >>> all(sp.is_valid(c) for c in cfgs)
    True
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from codegen.cuda.sim import row_major_strides
from codegen.cuda.space import REG_OVERHEAD, STATIC_SMEM_LIMIT, CudaSpace
from codegen.ops import Access
from felixjax.points import first_appearance
from felixjax.relax import (
    I_PAR,
    MAX_AXES,
    N_X,
    Relaxation,
    RelaxedSpace,
    log_tiles,
    project,
)

MAX_DIMS = 4  # dimensions of a buffer index (front-padded)
BUFFERS = ("data", "weight", "out")
GPU_CONSTRAINTS = ("threads_per_block", "shared_memory", "registers_per_thread", "registers_per_block",
                   "blocks_per_sm")  # the last one is soft


class GpuTable(NamedTuple):
    """Fixed-size arrays of one (task, GPU) for jitted code (a pytree; float32).

    Attributes:
        spatial, reduce: ``[A]`` 1 for real spatial / reduction axes.
        last: ``[A]`` one-hot of the last spatial axis (``threadIdx.x`` fastest along it).
        dep: ``[3, A]`` 1 where buffer (data, weight, out) depends on a spatial axis.
        coef: ``[3, D, A]`` |coefficient| of each axis in each dimension's index (the box of a tile
            ``T`` spans ``Π_d (1 + Σ_a coef·(T_a − 1))`` elements, as ``codegen.cuda.space.box_extents``).
        step: ``[3]`` global elements between the addresses of two threads one apart along the last
            axis with inner tile 1 (0: the buffer does not depend on it, a broadcast).
        elems: ``[3]`` elements of the API buffers.
        flops, outputs, reduction: the task.
        scalars of the spec: sms, clock, lanes (fp32 FMA per SM per clock), peak, bandwidth, l2,
            smem_sm, smem_block (the static limit), regs_sm, regs_thread, max_warps, max_blocks,
            max_threads, warp.
    """

    spatial: jax.Array
    reduce: jax.Array
    last: jax.Array
    dep: jax.Array
    coef: jax.Array
    step: jax.Array
    elems: jax.Array
    flops: jax.Array
    outputs: jax.Array
    reduction: jax.Array
    sms: jax.Array
    clock: jax.Array
    lanes: jax.Array
    peak: jax.Array
    bandwidth: jax.Array
    l2: jax.Array
    smem_sm: jax.Array
    smem_block: jax.Array
    regs_sm: jax.Array
    regs_thread: jax.Array
    max_warps: jax.Array
    max_blocks: jax.Array
    max_threads: jax.Array
    warp: jax.Array


class GpuArrays(NamedTuple):
    """What the gradient strategy's descent passes to :func:`gpu_penalty` / :func:`gpu_project`."""

    base: RelaxedSpace
    gpu: GpuTable


def gpu_table(space: CudaSpace, *, xp=jnp) -> GpuTable:
    """The :class:`GpuTable` of a GPU space (``xp=numpy`` for the integer side)."""
    if len(space.axes) > MAX_AXES:
        raise ValueError(f"{space}: {len(space.axes)} axes, at most {MAX_AXES} supported")
    con, task, s = space.con, space.task, space.spec
    names = [a.name for a in space.axes]
    f32 = np.float32
    spatial = np.zeros(MAX_AXES, f32)
    reduce = np.zeros(MAX_AXES, f32)
    for i, a in enumerate(space.axes):
        spatial[i], reduce[i] = float(not a.reduce), float(a.reduce)
    last_name = [a.name for a in con.spatial][-1]
    last = np.zeros(MAX_AXES, f32)
    last[names.index(last_name)] = 1
    dep = np.zeros((3, MAX_AXES), f32)
    coef = np.zeros((3, MAX_DIMS, MAX_AXES), f32)
    step = np.zeros(3, f32)
    elems = np.zeros(3, f32)
    shapes = (con.data_api_shape, con.weight.shape, con.out.shape)
    for b, (acc, shape) in enumerate(zip((con.data, con.weight, con.out), shapes)):
        acc: Access
        if len(acc.dims) > MAX_DIMS:
            raise ValueError(f"{acc.buffer}: {len(acc.dims)} dimensions, at most {MAX_DIMS} supported")
        pad = MAX_DIMS - len(acc.dims)
        for d, (terms, stride) in enumerate(zip(acc.dims, row_major_strides(shape))):
            for a, c in terms:
                if c:
                    coef[b, pad + d, names.index(a)] += abs(c)
                    if a == last_name:
                        step[b] += abs(c) * stride
        for i, a in enumerate(space.axes):
            dep[b, i] = float((not a.reduce) and acc.depends_on(a.name))
        elems[b] = math.prod(shape)
    flops = float(task.flops)
    vals = [spatial, reduce, last, dep, coef, step, elems, flops, float(math.prod(con.out.shape)),
            float(con.reduction_size), float(s.sm_count), s.clock_hz, float(s.fp32_fma_per_sm_clock), s.peak_flops,
            s.dram_bandwidth, float(s.l2_bytes), float(s.smem_per_sm), float(min(s.smem_per_block, STATIC_SMEM_LIMIT)),
            float(s.regs_per_sm), float(s.regs_per_thread), float(s.max_warps_per_sm), float(s.max_blocks_per_sm),
            float(s.max_threads_per_block), float(s.warp_size)]
    return GpuTable(*(xp.asarray(v, dtype=xp.float32) for v in vals))


class Geo(NamedTuple):
    """The GPU geometry of a (relaxed) point, every field a real number (logs where named so)."""

    log_blocks: jax.Array
    log_threads: jax.Array
    log_outputs: jax.Array      # per thread: Π (S1·S3)
    log_steps: jax.Array
    log_depth: jax.Array
    log_inner_last: jax.Array   # S3 of the last spatial axis
    log_fragment: jax.Array     # [3] per buffer: distinct elements one thread reads per reduction index
    box: jax.Array              # [3, D] box extent per dimension (data, weight, out)


def geometry(tab: GpuTable, lt, xp=jnp) -> Geo:
    """:class:`Geo` from log tiles ``lt [..., A, 4]`` (integer tiles give the exact values of
    :class:`codegen.cuda.space.Geometry`); leading batch axes are kept."""
    sp, rd = tab.spatial, tab.reduce
    per_thread = lt[..., 1] + lt[..., 3]
    tile = xp.exp(sp * (lt[..., 1] + lt[..., 2] + lt[..., 3]) + rd * lt[..., 1])  # block tile / R1 slice per axis
    box = 1.0 + xp.einsum("bda,...a->...bd", tab.coef, tile - 1.0)
    return Geo(lt[..., 0] @ sp, lt[..., 2] @ sp, per_thread @ sp, lt[..., 0] @ rd, lt[..., 1] @ rd,
               lt[..., 3] @ tab.last, per_thread @ tab.dep.T, box)


def registers(geo: Geo, xp=jnp):
    """The space's register estimate: accumulators + a data and a weight fragment + overhead."""
    return xp.exp(geo.log_outputs) + xp.exp(geo.log_fragment[..., 0]) + xp.exp(geo.log_fragment[..., 1]) + REG_OVERHEAD


def smem_bytes(geo: Geo, staged, xp=jnp):
    """Bytes of the staged data and weight boxes (0 when not staged)."""
    return staged * 4.0 * (xp.prod(geo.box[..., 0, :], axis=-1) + xp.prod(geo.box[..., 1, :], axis=-1))


def gpu_constraints(arrs: GpuArrays, x: jax.Array) -> jax.Array:
    """``g(x) ≤ 0`` of one point, in :data:`GPU_CONSTRAINTS` order (the last one soft)."""
    tab = arrs.gpu
    lt = log_tiles(arrs.base, x)
    geo = geometry(tab, lt)
    staged = jnp.clip(x[I_PAR], 0.0, 1.0)
    regs = registers(geo)
    smem = smem_bytes(geo, staged)
    return jnp.stack([
        geo.log_threads - jnp.log(tab.max_threads),
        jnp.log(smem + 1.0) - jnp.log(tab.smem_block + 1.0),
        jnp.log(regs) - jnp.log(tab.regs_thread),
        jnp.log(regs) + geo.log_threads - jnp.log(tab.regs_sm),
        jnp.log(tab.sms) - geo.log_blocks])


def gpu_penalty(arrs: GpuArrays, x: jax.Array, *, soft_weight: float = 0.1) -> jax.Array:
    """Squared-hinge penalty ``Σ w·max(g, 0)²`` of :func:`gpu_constraints` (soft one weighted lower)."""
    w = jnp.array([1.0, 1.0, 1.0, 1.0, soft_weight])
    return jnp.sum(w * jnp.maximum(gpu_constraints(arrs, x), 0.0) ** 2)


def gpu_project(arrs: GpuArrays, x: jax.Array) -> jax.Array:
    """The polytope projection of :func:`felixjax.relax.project` (the GPU limits are penalties)."""
    return project(arrs.base, x)


class GpuRelaxation(Relaxation):
    """:class:`~felixjax.relax.Relaxation` of a :class:`~codegen.cuda.space.CudaSpace` with its GPU
    limits: penalty for the descent, vectorized validity, rounding with GPU repair."""

    penalty_of = staticmethod(gpu_penalty)
    project_of = staticmethod(gpu_project)

    def __init__(self, space: CudaSpace, *, elem_bytes: int = 4):
        if not isinstance(space, CudaSpace):
            raise TypeError(f"GpuRelaxation relaxes a CudaSpace, not {type(space).__name__}")
        super().__init__(space, elem_bytes=elem_bytes)
        self.table = gpu_table(space)
        self._tab_np = gpu_table(space, xp=np)
        self.descent_arrays = GpuArrays(self.arrays, self.table)

    def gpu_valid_x(self, x: np.ndarray) -> np.ndarray:
        """Which integer points ``[B, N_X]`` satisfy the GPU limits (threads, static shared memory,
        registers per thread and per block), vectorized; the CPU encoding checks are separate."""
        x = np.asarray(x, np.float64).reshape(-1, N_X)
        ex, sc = self._exponents_of(x)
        tiles = self._tiles_array(np.maximum(ex, 0)).astype(np.float64)  # [B, A, L]
        lt = np.log(np.maximum(tiles, 1.0))
        tab = self._tab_np
        geo = geometry(tab, lt, np)
        regs = np.rint(registers(geo, np))
        threads = np.rint(np.exp(geo.log_threads))
        smem = np.rint(smem_bytes(geo, (sc[:, 2] > 0).astype(np.float64), np))
        return ((threads <= tab.max_threads) & (smem <= tab.smem_block) & (regs <= tab.regs_thread)
                & (regs * threads <= tab.regs_sm))

    def valid_x(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64).reshape(-1, N_X)
        ok = super().valid_x(x)
        if ok.any():
            ok[ok] = self.gpu_valid_x(x[ok])
        return ok

    def round_points(self, x_batch) -> tuple[np.ndarray, np.ndarray]:
        """The CPU relaxation's rounding, then :meth:`CudaSpace.repair` of the points outside the GPU
        limits (every row still yields a valid point; duplicates after repair are merged)."""
        pts, index = super().round_points(x_batch)
        bad = ~self.gpu_valid_x(pts)
        if bad.any():
            pts = pts.copy()
            for i in np.flatnonzero(bad):
                cfg = super().configs_from_x(pts[i: i + 1])[0]  # already repaired (strict_validation)
                pts[i] = self.to_x(cfg)
            pts, merged = first_appearance(pts)
            index = merged[index]
        return pts.astype(np.float32), index


def relaxation_for(space) -> Relaxation:
    """:class:`GpuRelaxation` for a GPU space, else the CPU :class:`~felixjax.relax.Relaxation`."""
    return GpuRelaxation(space) if isinstance(space, CudaSpace) else Relaxation(space)

