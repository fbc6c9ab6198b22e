"""Differentiable features of the GPU sketch ``cuda_tiled`` (issue 18), for the same cost model.

``gpu_features(inputs, x, smooth)`` maps one relaxed point ``x`` of a
:class:`~felixjax.relax_gpu.GpuRelaxation` to a :class:`costmodels.base.Features` row: per buffer
(data, weight, out) ``access [3, len(GPU_ACCESS_FEATURES)]``, ``mask [3]`` and ``glob
[len(GPU_GLOBAL_FEATURES)]``, every value ``log(1 + v)``, as the CPU features of
:mod:`felixjax.features`.

**One model, two feature sets.** A tuning session has one target, and its
:class:`~felixjax.model.OnlineCostModel` is built for it: on a ``cuda-sim`` / ``cuda`` target the MLP
takes these GPU feature widths and the roofline prior reads the GPU columns (FLOPs, L2 traffic, SM
fill, FMA share) with the spec's peak and L2 bandwidth; on a CPU the CPU features as before. The MLP
is the same class (a per-access encoder summed over slots, then global features), so nothing in
``costmodels`` changes; records of GPU and CPU targets never meet in one model (they are kept apart
in the database too). The jitted scoring functions are keyed by the feature function.

What the features describe (per thread, per block, per launch), in hard mode equal to the
:class:`codegen.cuda.space.Geometry` and the simulator's occupancy of the integer config (checked by
``tests/test_cuda_features.py`` against them):

* per buffer: the per-thread fragment (registers of operands), the block's box per reduction step
  (bytes staged in shared memory), its bytes through L2 over the launch, the global stride between
  neighbouring threads (coalescing: contiguous, broadcast, estimated 32-byte sectors per warp
  request), the contiguous run of the cooperative fetch, the stride in shared memory between
  neighbouring threads (bank conflicts), reuse (FLOPs per byte);
* global: FLOPs, blocks, threads, warps (a partial warp counts whole), outputs per thread, estimated
  registers, shared memory, reduction steps and depth, unroll, staging, the occupancy inputs (blocks
  per SM allowed by warps, registers and shared memory; resident blocks; occupancy; waves; SM fill;
  tail efficiency; the share of a warp's lanes in use), instructions per thread by kind, FMA share, L2 and compulsory bytes, arithmetic
  intensities, compute / L2 / DRAM times at the spec's rates, and which limits hold.

Soft mode replaces ceil / floor / min / comparisons by the surrogates of :class:`~felixjax.smooth.Smooth`;
at a low temperature it approaches hard mode, and its gradients are finite.

Example:
    >>> import jax
    >>> from codegen.cuda.space import CudaSpace
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> from felixjax.relax_gpu import GpuRelaxation
    >>> rel = GpuRelaxation(CudaSpace(matmul(256, 256, 256), Target.cuda_sim("a100")))
    >>> f = gpu_features(gpu_feature_inputs(rel), jnp.asarray(rel.to_x(rel.space.default())), Smooth.hard_mode())
    >>> f.access.shape, f.glob.shape
    ((3, 14), (43,))
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels.base import Features
from felixjax.relax import I_PAR, I_UNROLL, RelaxedSpace, log_tiles
from felixjax.relax_gpu import BUFFERS, GpuRelaxation, GpuTable, geometry, registers, smem_bytes
from felixjax.smooth import Smooth

GPU_ACCESS_FEATURES = ("read", "write", "buffer_bytes", "fragment", "box_bytes", "smem_bytes", "l2_bytes",
                       "thread_stride", "contiguous", "broadcast", "sectors_per_request", "fetch_run",
                       "smem_stride", "reuse")
GPU_GLOBAL_FEATURES = (
    "flops", "blocks", "threads", "warps", "warp_efficiency", "outputs_per_thread", "registers", "smem_bytes",
    "steps", "depth", "unroll", "unroll_effective", "staged",
    "blocks_by_warps", "blocks_by_registers", "blocks_by_smem", "blocks_per_sm", "occupancy", "waves",
    "sm_fill", "tail_efficiency",
    "fma_per_thread", "shared_loads_per_thread", "global_loads_per_thread", "fetch_per_thread", "fma_share",
    "l2_bytes", "compulsory_bytes", "intensity_l2", "intensity_dram", "t_compute", "t_l2", "t_dram",
    "fits_threads", "fits_smem", "fits_registers", "fits_register_file", "valid",
    "sm_count", "peak_flops", "dram_bandwidth", "l2_bandwidth", "reduction")
N_GPU_ACCESS_FEATURES = len(GPU_ACCESS_FEATURES)
N_GPU_GLOBAL_FEATURES = len(GPU_GLOBAL_FEATURES)
L2_BYTES_PER_CLK_SM = 64.0  # the simulator's L2 -> SM rate (codegen.cuda.sim.CALIBRATION), for t_l2
SMEM_RESERVED = 1024.0      # bytes the driver reserves per block (sm_80+)
REG_GRANULE = 8.0


class GpuFeatureInputs(NamedTuple):
    """Everything :func:`gpu_features` needs besides ``x`` (a pytree of fixed-shape arrays)."""

    knobs: RelaxedSpace
    gpu: GpuTable


def gpu_feature_inputs(rel: GpuRelaxation) -> GpuFeatureInputs:
    """The inputs of a GPU relaxation."""
    return GpuFeatureInputs(rel.arrays, rel.table)


def _log1p(v):
    return jnp.log(1.0 + jnp.maximum(v, 0.0))


def gpu_features(inputs: GpuFeatureInputs, x: jax.Array, smooth: Smooth) -> Features:
    """Features of one point ``x [N_X]`` (see the module docstring); hard mode at integer points
    equals the integer config's geometry; soft mode is differentiable in ``x``."""
    rs, tab, sm = inputs.knobs, inputs.gpu, smooth
    lt = log_tiles(rs, x)
    staged, log2_unroll = x[I_PAR], x[I_UNROLL]
    if sm.hard:
        lt = jnp.log(jnp.round(jnp.exp(lt)))
        staged, log2_unroll = jnp.round(staged), jnp.round(log2_unroll)
    staged = jnp.clip(staged, 0.0, 1.0)
    geo = geometry(tab, lt)
    ex = lambda v: sm.integer(jnp.exp(v))  # noqa: E731 - a tile product, an integer at integer points
    blocks, threads, outputs = ex(geo.log_blocks), ex(geo.log_threads), ex(geo.log_outputs)
    steps, depth, inner_last = ex(geo.log_steps), ex(geo.log_depth), ex(geo.log_inner_last)
    frag = ex(geo.log_fragment)  # [3]
    box = _product(sm.integer(geo.box))  # [3] elements per block per step
    unroll = ex(jnp.log(2.0) * log2_unroll)
    regs = sm.integer(registers(geo))
    smem = sm.integer(smem_bytes(geo, staged))
    k = tab.reduction
    # ceil / floor of ratios of integers, nudged by 0.01: exact in hard mode, and the soft values just
    # above an integer (a soft ceil at a low temperature) still count as that integer
    ceil = lambda a, b: sm.ceil_div(a - 0.01, b)  # noqa: E731
    floor = lambda a, b: sm.floor_div(a + 0.01, b)  # noqa: E731
    warps = ceil(threads, tab.warp)

    # occupancy inputs (codegen.cuda.sim.occupancy with the estimated registers)
    by_warps = floor(tab.max_warps, warps)
    regs_alloc = REG_GRANULE * ceil(regs, REG_GRANULE)
    by_regs = floor(tab.regs_sm, warps * tab.warp * regs_alloc)
    by_smem = Smooth.select(staged, floor(tab.smem_sm, smem + SMEM_RESERVED), tab.max_blocks)
    per_sm = sm.minimum(sm.minimum(tab.max_blocks, by_warps), sm.minimum(by_regs, by_smem))
    resident = sm.maximum(per_sm, 1.0)
    occupancy = sm.minimum(1.0, per_sm * warps / tab.max_warps)
    waves = ceil(blocks, resident * tab.sms)
    fill = sm.minimum(1.0, blocks / tab.sms)
    tail = blocks / (waves * resident * tab.sms)

    # instructions per thread and traffic
    fma = outputs * k
    loads = k * (frag[0] + frag[1])
    fetch = steps * (ceil(box[0], threads) + ceil(box[1], threads))
    lds = staged * loads
    ldg = staged * fetch + (1.0 - staged) * loads
    sts = staged * fetch
    fma_share = fma / (fma + lds + ldg + sts + outputs)
    in_box_bytes = 4.0 * box[:2]
    l2_in = blocks * steps * in_box_bytes  # [2] bytes through L2 per input buffer
    out_bytes = 4.0 * tab.elems[2]
    l2_bytes = l2_in.sum() + out_bytes
    compulsory = 4.0 * tab.elems.sum()
    l2_bw = L2_BYTES_PER_CLK_SM * tab.sms * tab.clock

    # coalescing and shared-memory strides along the fastest thread axis
    stride = inner_last * tab.step  # [3] global elements between neighbouring threads
    dep_last = (tab.step > 0).astype(jnp.float32)
    contiguous = dep_last * sm.eq(stride + (1.0 - dep_last), 1.0)
    sectors = Smooth.select(dep_last, sm.minimum(32.0, sm.maximum(4.0, 4.0 * stride)), 1.0)
    run = geo.box[:, -1]  # the fetch's contiguous run: the box's last dimension
    box_stride = jnp.exp(jnp.cumsum(jnp.log(geo.box[:, ::-1]), axis=1)[:, ::-1])  # elements in dims ≥ d
    inner_stride = jnp.concatenate([box_stride[:, 1:], jnp.ones((3, 1))], axis=1)  # stride of dim d in the box
    last_coef = jnp.einsum("bda,a->bd", tab.coef, tab.last)
    smem_stride = inner_last * sm.integer((last_coef * inner_stride).sum(-1))

    fits = jnp.stack([sm.le(threads, tab.max_threads + 0.5), sm.le(smem + 1.0, tab.smem_block + 1.5),
                      sm.le(regs, tab.regs_thread + 0.5), sm.le(regs * threads, tab.regs_sm + 0.5)])
    glob = jnp.stack([
        tab.flops, blocks, threads, warps, threads / (warps * tab.warp), outputs, regs, smem,
        steps, depth, unroll, sm.minimum(unroll, depth), staged,
        by_warps, by_regs, by_smem, per_sm, occupancy, waves, fill, tail,
        fma, lds, ldg, sts, fma_share,
        l2_bytes, compulsory, tab.flops / l2_bytes, tab.flops / compulsory,
        tab.flops / tab.peak, l2_bytes / l2_bw, compulsory / tab.bandwidth,
        *fits, _product(fits[None])[0],
        tab.sms, tab.peak, tab.bandwidth, l2_bw, k])
    read = jnp.array([1.0, 1.0, 0.0])
    per_buffer_l2 = jnp.concatenate([l2_in, out_bytes[None]])
    access = jnp.stack([
        read, 1.0 - read, 4.0 * tab.elems, Smooth.select(read, frag, outputs), 4.0 * box,
        staged * read * 4.0 * box, per_buffer_l2, stride, contiguous, 1.0 - dep_last, sectors,
        read * run, staged * read * smem_stride, tab.flops / per_buffer_l2], axis=-1)
    return Features(_log1p(access), jnp.ones(len(BUFFERS)), _log1p(glob))


def _product(a: jax.Array) -> jax.Array:
    """Product over the last axis as a chain of multiplies (``jnp.prod``'s gradient compiles slowly)."""
    out = a[..., 0]
    for i in range(1, a.shape[-1]):
        out = out * a[..., i]
    return out


_BATCH: dict = {}


def batch_gpu_features(inputs: GpuFeatureInputs, x: jax.Array, smooth: Smooth) -> Features:
    """``(inputs, x [B, N_X], smooth) -> Features([B, 3, F], [B, 3], [B, G])``, jitted once."""
    if "fn" not in _BATCH:
        _BATCH["fn"] = jax.jit(jax.vmap(gpu_features, in_axes=(None, 0, None)))
    return _BATCH["fn"](inputs, x, smooth)


def gpu_config_features(rel: GpuRelaxation, configs) -> Features:
    """Exact (hard-mode) features of integer configs, as numpy."""
    xs = jnp.asarray(np.stack([rel.to_x(c) for c in configs]))
    f = batch_gpu_features(gpu_feature_inputs(rel), xs, Smooth.hard_mode())
    return Features(*(np.asarray(a) for a in f))
