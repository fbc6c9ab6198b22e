"""Closed-form, differentiable program features of a relaxed schedule (DESIGN.md ⑤).

``features(inputs, x, smooth)`` maps one continuous point ``x`` (see :mod:`felixjax.relax`) to a
:class:`costmodels.base.Features` row: per buffer access ``[SLOTS, F]``, a mask ``[SLOTS]`` and
global features ``[G]``, every value ``log(1 + v)``. Shapes, extents, strides and the element size
are array inputs (:class:`FeatureInputs`), padded to fixed sizes, so :data:`batch_features` (jit +
vmap over candidates) compiles **once** for every task, shape and sketch. Inputs of several tasks
can be stacked and vmapped too.

The loop nest is the CPU sketch's ``S0 S1 R0 S2 R1 S3`` (:data:`~felixjax.relax.POSITIONS`).
For a statement, the *tile at level L* is the set of its iterations inside the loops at positions
≥ L. Access slots (:data:`SLOTS`) and their statements:

==============  ======================================================================
data, weight    read in the R1 loop body; per R1 iteration each distinct element of the S3
                register block is loaded once (as the C renderer dedups loads)
acc             the accumulator (``out``, or the channel-blocked ``scratch`` when the output is
                not unit-stride along the vector axis and its S3 tile > 1): loaded (except on the
                first R0 iteration) and stored once per S2 iteration, the S3 block each time
epilogue_acc,   the fused epilogue after each S1 tile: reads acc (and bias, residual), writes out,
epilogue_out,   one element per iteration of its S2, S3 loops
bias, residual
copy_in,        the timed padding / blocking copy of the data input (whole buffers; every level
copy_out        is the whole copy)
==============  ======================================================================

Per slot and level: ``bytes`` (element accesses × element size, per tile, averaged over tiles),
``unique_bytes`` (the tile's footprint), ``lines`` (64-byte lines the footprint spans: for every
row of the innermost physical dimension, ⌈(max − min + 1)·elem / 64⌉), ``reuse`` (accesses per
distinct element), and whether the footprint fits L1 / L2 / the L3 share. Per slot: its traffic
from each cache level (footprint × number of tiles at the outermost level whose total compute
footprint fits that cache), the stride of the vector loop (``S3`` of the vector axis) and of the
last reduction axis's ``R1`` loop. Global: FLOPs, totals, arithmetic intensity, vector and
register use, parallel chunks and balance, trip counts, unroll, total footprint per level, and
:data:`~codegen.knobs.MAX_KNOB_FEATURES` slots ``knob_0 ...`` filled by the declared knobs' feature
hooks (:mod:`codegen.knobs`; zero when no knob uses them).

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from felixjax.relax import Relaxation
    >>> target = Target(cores=2, simd_lanes=16, vector_registers=32)
    >>> rel = Relaxation(Space(matmul(12, 16, 20), "gemm_packed", target))
    >>> inp = feature_inputs(rel)
    >>> f = batch_features(inp, rel.sample_x(jax.random.PRNGKey(0), 4), Smooth.soft(1.0))
    >>> f.access.shape, f.mask.shape, f.glob.shape
    ((4, 9, 56), (4, 9), (4, 61))
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from codegen.knobs import INFO_KEYS, MAX_KNOB_FEATURES, feature_slots, knob_slot, registered, registry_key
from codegen.lower import lower
from codegen.ops import Access
from codegen.space import Config, Space
from costmodels.base import Features
from felixjax.relax import (
    I_EXTRA,
    I_PAR,
    I_UNROLL,
    I_VEC,
    MAX_AXES,
    N_POS,
    POSITIONS,
    TILE_LEVELS,
    Relaxation,
    RelaxedSpace,
    log_tiles,
)
from felixjax.relax_knobs import knob_values
from felixjax.smooth import Smooth

MAX_DIMS = 4  # logical dimensions of a buffer (front-padded with size-1 dims)
LINE_BYTES = 64
CACHES = ("l1", "l2", "l3")

# Statement kinds and the nest positions of the loops that enclose each.
BODY, ACC, EPILOGUE, COPY = 0, 1, 2, 3
ENCLOSING = np.array([[1, 1, 1, 1, 1, 0],   # R1 body: S0 S1 R0 S2 R1 (S3 is the register block)
                      [1, 1, 1, 1, 0, 0],   # accumulator load/store: S0 S1 R0 S2
                      [1, 1, 0, 1, 0, 1],   # epilogue: S0 S1, then its own S2 S3 loops
                      [0, 0, 0, 0, 0, 0]],  # input copy: outside the nest
                     np.float32)
READ, WRITE, READ_WRITE = 0, 1, 2

SLOTS = ("data", "weight", "acc", "epilogue_acc", "epilogue_out", "bias", "residual", "copy_in", "copy_out")
# Access descriptors come in two variants [V = 2, S]: the output accumulating in place, and the
# channel-blocked scratch (only these two acc slots differ); features blend them by "is scratch".
_SCRATCH_SLOTS = (2, 3)
_COMPUTE_SLOTS = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0], np.float32)
_BEFORE = np.triu(np.ones((N_POS, N_POS), np.float32), 1)  # [p, L] = 1 where position p < level L

_LEVEL_FEATURES = ("bytes", "unique_bytes", "lines", "reuse") + tuple(f"fits_{c}" for c in CACHES)
ACCESS_FEATURES = (
    ("read", "write", "read_write", "stmt_compute", "stmt_epilogue", "stmt_copy", "buffer_bytes",
     "vec_stride", "vec_contiguous", "vec_broadcast", "reduce_stride")
    + tuple(f"{lvl}_{name}" for lvl in POSITIONS for name in _LEVEL_FEATURES)
    + tuple(f"traffic_{c}" for c in CACHES))
GLOBAL_FEATURES = (
    ("flops", "elem_bytes", "bytes", "unique_bytes") + tuple(f"traffic_{c}" for c in CACHES)
    + ("intensity_l3", "intensity_l1", "vec", "vec_utilization", "accumulators", "register_utilization",
       "register_fits", "block_rows", "block_cols", "parallel", "chunks", "balance", "enough_chunks")
    + tuple(f"trips_{lvl}" for lvl in POSITIONS) + ("unroll", "unroll_effective")
    + tuple(f"footprint_{lvl}" for lvl in POSITIONS)
    + tuple(f"footprint_{lvl}_fits_{c}" for lvl in POSITIONS for c in CACHES)
    + ("data_copy", "scratch", "epilogue", "outputs", "reduction")
    + tuple(f"knob_{i}" for i in range(MAX_KNOB_FEATURES)))
N_ACCESS_FEATURES = len(ACCESS_FEATURES)
N_GLOBAL_FEATURES = len(GLOBAL_FEATURES)


class AccessTable(NamedTuple):
    """Fixed-size description of the buffer accesses of one (task, sketch).

    Every array has two leading axes ``[V = 2, S = 9]``: the access slots (:data:`SLOTS`) with the
    output accumulated in place (``V = 0``) and in the channel-blocked scratch (``V = 1``; only the
    acc slots differ). Written ``[K, ...]`` below for ``[V, S, ...]``. Index tables are one-hot
    (contracted with einsum), so the jitted features contain no gathers.

    Attributes:
        kind: ``[K, 4]`` one-hot statement kind (BODY, ACC, EPILOGUE, COPY).
        rw: ``[K, 3]`` one-hot READ, WRITE, READ_WRITE.
        enclosing: ``[K, 6]`` 1 at the nest positions of the loops enclosing the statement.
        present: ``[K]`` 1 unless the buffer does not exist for this task (bias, residual, copy).
        shape: ``[K, D]`` logical buffer shape, front-padded with 1.
        term_axis: ``[K, D, 2, A + 1]`` one-hot axis of up to two (axis, coefficient) terms of each
            dimension's affine index; unused terms select the dummy axis ``MAX_AXES`` (tile 1).
        term_coef: ``[K, D, 2]`` their coefficients.
        radix: ``[K, D]`` 1 where the two terms never collide (mixed radix): count = T1·T2.
        norm_a, norm_b: ``[K, D]`` coefficients divided by their gcd, for the general count
            ``T1·T2 − (T1 − b)₊(T2 − a)₊`` of distinct ``a·i + b·j``.
        blocked: ``[K]`` 1 if the layout blocks a dimension by an axis's S3 tile.
        block_dim: ``[K, D]`` one-hot of the blocked dimension.
        block_axis: ``[K, A]`` one-hot of the axis whose S3 tile is the block.
        stride_m, stride_beta: ``[K, D, D]``, ``[K, D]``: log physical stride of each dimension
            (its outer part if blocked) = ``stride_m @ log shape + stride_beta · log block``.
        vdim, vcoef, vdep, vone: where the vector axis indexes the buffer (one-hot dim,
            coefficient, whether it does, whether its S3 loop is the in-block lane: stride 1).
        rdim, rcoef, rdep: the same for the last reduction axis (its R1 loop).
        scratch_possible: the sketch accumulates in a blocked scratch when the vector axis's S3
            tile is > 1.
        epi_static: an epilogue runs regardless of tiles (bias, residual or activation).
        epi_ops: epilogue FLOPs per output.
        data_copy: the data input is copied (padded / blocked) inside the kernel.
        padded: a padded sketch (:mod:`codegen.padding`) that accumulates in a scratch (plain unless
            the sketch blocks it) and runs the cropping epilogue (not a masked one: ``masked_tail``).
    """

    kind: jax.Array
    rw: jax.Array
    enclosing: jax.Array
    present: jax.Array
    shape: jax.Array
    term_axis: jax.Array
    term_coef: jax.Array
    radix: jax.Array
    norm_a: jax.Array
    norm_b: jax.Array
    blocked: jax.Array
    block_dim: jax.Array
    block_axis: jax.Array
    stride_m: jax.Array
    stride_beta: jax.Array
    vdim: jax.Array
    vcoef: jax.Array
    vdep: jax.Array
    vone: jax.Array
    rdim: jax.Array
    rcoef: jax.Array
    rdep: jax.Array
    scratch_possible: jax.Array
    epi_static: jax.Array
    epi_ops: jax.Array
    data_copy: jax.Array
    padded: jax.Array


class FeatureInputs(NamedTuple):
    """Everything :func:`features` needs besides ``x``: a pytree of fixed-shape arrays."""

    knobs: RelaxedSpace
    access: AccessTable


# ----------------------------------------------------------------------------------------------
# Building the access table (numpy, once per space)
# ----------------------------------------------------------------------------------------------

def _probe_config(space: Space) -> Config:
    """A valid config whose vector-axis S3 tile is its smallest prime factor (when the register
    budget allows), so lowering shows every layout the sketch can use."""
    vi = space.vector_index
    tiles = []
    for i, a in enumerate(space.axes):
        if a.reduce:
            tiles.append((a.extent, 1))
        elif i == vi and a.extent > 1:
            p = min(d for d in range(2, a.extent + 1) if a.extent % d == 0)
            tiles.append((a.extent // p, 1, 1, p) if p <= space.max_accumulators else (a.extent, 1, 1, 1))
        else:
            tiles.append((a.extent, 1, 1, 1))
    return Config(space.sketch.name, tuple(tiles), 0, 1, 1)


def _layout_spec(layout, axis: int, front: bool) -> tuple:
    for d, dl in enumerate(layout.dims):
        if dl.kind == "block":
            return ("block", d, axis, front)
    return ("plain",)


def _stride_matrices(layout: tuple, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, beta) with log stride[d] = M[d] @ log shape + beta[d] · log block, for a front-padded
    layout; mirrors ``codegen.lower.plain_layout`` / ``blocked_layout``."""
    m = np.zeros((MAX_DIMS, MAX_DIMS), np.float32)
    beta = np.zeros(MAX_DIMS, np.float32)
    later = np.triu(np.ones((MAX_DIMS, MAX_DIMS), np.float32), 1)
    if layout[0] == "plain":
        return later, beta
    _, b, _, front = layout
    b += MAX_DIMS - ndim
    for d in range(MAX_DIMS):
        if front:
            m[d] = (np.arange(MAX_DIMS) != b) * (1.0 if d == b else later[d])
            beta[d] = 1.0
        else:
            m[d] = later[d]
            beta[d] = float(d >= b)
    return m, beta


def _where(access: Access, axis_name: str) -> tuple[int, int] | None:
    """(dim, coefficient) of an axis in an access, or None."""
    for d, terms in enumerate(access.dims):
        for a, c in terms:
            if a == axis_name and c != 0:
                return d, c
    return None


def _index_terms(space: Space, access: Access, ndim_pad: int) -> dict[str, np.ndarray]:
    """Each dimension's affine index as up to two (one-hot axis, coefficient) terms, plus whether
    the terms never collide (mixed radix) and their gcd-normalized coefficients."""
    names = [a.name for a in space.axes]
    ext = {a.name: a.extent for a in space.axes}
    term_axis = np.zeros((MAX_DIMS, 2, MAX_AXES + 1), np.float32)
    term_axis[..., MAX_AXES] = 1  # unused terms: the dummy axis of extent 1
    term_coef = np.zeros((MAX_DIMS, 2), np.float32)
    radix = np.ones(MAX_DIMS, np.float32)
    norm = np.ones((MAX_DIMS, 2), np.float32)
    for d, terms in enumerate(access.dims):
        d += ndim_pad
        terms = [(a, c) for a, c in terms if c != 0]
        if len(terms) > 2:
            raise ValueError(f"{access.buffer}: more than two axes in one index are not supported")
        for j, (a, c) in enumerate(terms):
            term_axis[d, j] = np.eye(MAX_AXES + 1)[names.index(a)]
            term_coef[d, j] = c
        if len(terms) == 2:
            (a0, c0), (a1, c1) = terms
            radix[d] = float(c0 >= c1 * ext[a1] or c1 >= c0 * ext[a0])
            g = math.gcd(c0, c1)
            norm[d] = (c0 // g, c1 // g)
    return dict(term_axis=term_axis, term_coef=term_coef, radix=radix, norm_a=norm[:, 0], norm_b=norm[:, 1])


def _loop_var(space: Space, access: Access, layout: tuple, axis_name: str | None) -> tuple:
    """(one-hot dim, coefficient, depends, is the in-block lane) of an axis's innermost loop in a
    buffer; mirrors which strides ``codegen.lower`` leaves out (extent-1 axes of blocked dims)."""
    dim = np.zeros(MAX_DIMS, np.float32)
    hit = _where(access, axis_name) if axis_name else None
    if hit is None:
        return dim, 1.0, 0.0, 0.0
    d, c = hit
    dim[MAX_DIMS - len(access.shape) + d] = 1
    in_block = layout[0] == "block" and d == layout[1]
    ext = {a.name: a.extent for a in space.axes}
    lane = in_block and [a.name for a in space.axes].index(axis_name) == layout[2]
    return dim, float(c), float(not (in_block and ext[axis_name] == 1)), float(lane)


def _descriptor(space: Space, access: Access, layout: tuple, kind: int, rw: int, present: bool) -> dict:
    """The arrays of one access slot (one row of :class:`AccessTable`)."""
    ndim_pad = MAX_DIMS - len(access.shape)
    shape = np.ones(MAX_DIMS, np.float32)
    shape[ndim_pad:] = access.shape
    blocked = layout[0] == "block"
    block_dim = np.zeros(MAX_DIMS, np.float32)
    block_axis = np.zeros(MAX_AXES, np.float32)
    if blocked:
        block_dim[ndim_pad + layout[1]] = 1
        block_axis[layout[2]] = 1
    m, beta = _stride_matrices(layout, len(access.shape))
    if kind == COPY:  # whole buffers; the copy's innermost loop runs along the last logical dim
        terms = _index_terms(space, Access(access.buffer, access.shape, ()), ndim_pad)
        v = (np.eye(MAX_DIMS, dtype=np.float32)[-1], 1.0, 1.0, float(blocked and block_dim[-1] > 0))
        r = (np.zeros(MAX_DIMS, np.float32), 1.0, 0.0, 0.0)
    else:
        terms = _index_terms(space, access, ndim_pad)
        v = _loop_var(space, access, layout, space.sketch.vector_axis)
        r = _loop_var(space, access, layout, [a.name for a in space.axes if a.reduce][-1])
    return dict(kind=np.eye(4)[kind], rw=np.eye(3)[rw], enclosing=ENCLOSING[kind], present=float(present),
                shape=shape, **terms, blocked=float(blocked), block_dim=block_dim, block_axis=block_axis,
                stride_m=m, stride_beta=beta, vdim=v[0], vcoef=v[1], vdep=v[2], vone=v[3],
                rdim=r[0], rcoef=r[1], rdep=r[2])


def access_table(space: Space) -> AccessTable:
    """The :class:`AccessTable` of a space (layouts read from a probe lowering).

    Example:
        >>> from codegen.ops import conv2d
        >>> from codegen.target import Target
        >>> t = access_table(Space(conv2d(1, 4, 6, 6, out_channels=8, padding=1), "conv_direct", Target()))
        >>> t.shape.shape, float(t.data_copy)
        ((2, 9, 4), 1.0)
    """
    con, task, sk = space.con, space.task, space.sketch
    names = [a.name for a in space.axes]
    plan = lower(space, _probe_config(space))
    bufs = plan.buffers
    vi, wi = names.index(sk.vector_axis), names.index(sk.weight_axis)
    data_l = _layout_spec(bufs["data"].layout, vi, False)
    weight_l = _layout_spec(bufs["weight"].layout, wi, True)
    scratch = "scratch" in bufs
    scratch_l = _layout_spec(bufs["scratch"].layout, vi, False) if scratch else ("plain",)
    out_acc = Access("out", con.out.shape, con.out.dims)
    # the timed copy reads the kernel's data argument (conv_im2col: the real image, not its columns)
    api_shape = bufs["data_in"].access.shape if "data_in" in bufs else con.data_api_shape
    api = Access("data_in", api_shape, tuple(() for _ in api_shape))
    bias = con.bias if con.bias is not None else out_acc
    descs = [  # in SLOTS order
        _descriptor(space, con.data, data_l, BODY, READ, True),
        _descriptor(space, con.weight, weight_l, BODY, READ, True),
        _descriptor(space, out_acc, ("plain",), ACC, READ_WRITE, True),
        _descriptor(space, out_acc, ("plain",), EPILOGUE, READ, True),
        _descriptor(space, out_acc, ("plain",), EPILOGUE, WRITE, True),
        _descriptor(space, bias, ("plain",), EPILOGUE, READ, con.bias is not None),
        _descriptor(space, out_acc, ("plain",), EPILOGUE, READ, task.residual),
        _descriptor(space, api, ("plain",), COPY, READ, plan.data_copy),
        _descriptor(space, con.data, data_l, COPY, WRITE, plan.data_copy),
    ]
    scratch_descs = list(descs)
    scratch_descs[_SCRATCH_SLOTS[0]] = _descriptor(space, out_acc, scratch_l, ACC, READ_WRITE, True)
    scratch_descs[_SCRATCH_SLOTS[1]] = _descriptor(space, out_acc, scratch_l, EPILOGUE, READ, True)
    stacked = {k: jnp.asarray(np.stack([np.stack([np.asarray(d[k]) for d in v]) for v in (descs, scratch_descs)]),
                              jnp.float32) for k in descs[0]}
    epi_static = con.bias is not None or task.residual or task.act is not None
    epi_ops = int(con.bias is not None) + int(task.residual) + int(task.act is not None)
    return AccessTable(**stacked, scratch_possible=jnp.float32(scratch), epi_static=jnp.float32(epi_static),
                       epi_ops=jnp.float32(epi_ops), data_copy=jnp.float32(plan.data_copy),
                       padded=jnp.float32(bool(sk.pad) and not space.masked))


def feature_inputs(relaxation: Relaxation | Space) -> FeatureInputs:
    """The :class:`FeatureInputs` of a relaxation (or a space, relaxed with fp32 elements).

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> inp = feature_inputs(Space(matmul(8, 8, 8), "gemm_packed", Target()))
        >>> inp.access.kind[0].argmax(-1).tolist()
        [0, 0, 1, 2, 2, 2, 2, 3, 3]
    """
    rel = relaxation if isinstance(relaxation, Relaxation) else Relaxation(relaxation)
    return FeatureInputs(rel.arrays, access_table(rel.space))


# ----------------------------------------------------------------------------------------------
# The features (jnp)
# ----------------------------------------------------------------------------------------------

def _level_logs(rs: RelaxedSpace, lt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``logT [A + 1, 6]``: log of each axis's index range in the tile at each level (a dummy axis
    of extent 1 appended); ``lp [6]``: log of the product of the loop extents at each position."""
    levels = jnp.arange(N_POS)
    real = (rs.pos >= 0)[..., None]
    inner = (real & (rs.pos[..., None] >= levels)).astype(jnp.float32)  # [A, 4, 6]
    at = (real & (rs.pos[..., None] == levels)).astype(jnp.float32)
    log_t = jnp.einsum("al,alk->ak", lt, inner)
    lp = jnp.einsum("al,alk->k", lt, at)
    return jnp.concatenate([log_t, jnp.zeros((1, N_POS))], axis=0), lp


def _product(a: jax.Array, axis: int) -> jax.Array:
    """Product along a small axis as a chain of multiplies (``jnp.prod``'s gradient compiles slowly)."""
    parts = [jax.lax.index_in_dim(a, i, axis, keepdims=False) for i in range(a.shape[axis])]
    out = parts[0]
    for p in parts[1:]:
        out = out * p
    return out


def _descriptor_quantities(at: AccessTable, lt: jax.Array, t_range: jax.Array, lp: jax.Array,
                           elem: jax.Array, sm: Smooth) -> dict[str, jax.Array]:
    """Accesses, tiles, footprints, lines and strides of every access descriptor ``[V, S, ...]``."""
    log_b = at.block_axis @ lt[:, TILE_LEVELS - 1]  # log of the layout's block (an S3 tile)
    unique, lines, size = _footprints(at, t_range, sm.integer(jnp.exp(log_b)), elem, sm)
    accesses, ntiles = _executions(at, lp, unique, size, sm)
    vstride, rstride = _strides(at, log_b, sm)
    return dict(accesses=accesses, ntiles=ntiles, unique=unique, lines=lines, size=size, vstride=vstride,
                vdep=at.vdep, rstride=rstride, rdep=at.rdep, kind=at.kind, rw=at.rw, present=at.present)


def _footprints(at: AccessTable, t_range: jax.Array, block: jax.Array, elem: jax.Array, sm: Smooth):
    """Distinct elements ``[V, S, 6]`` of the tile at each level, the 64-byte lines they span, and
    the buffer sizes ``[V, S]``."""
    # distinct values of each dimension's index c1·i + c2·j over the tile's index ranges T1, T2
    t1 = jnp.einsum("...da,al->...dl", at.term_axis[..., 0, :], t_range)  # [V, S, D, 6]
    t2 = jnp.einsum("...da,al->...dl", at.term_axis[..., 1, :], t_range)
    c1, c2 = at.term_coef[..., 0, None], at.term_coef[..., 1, None]
    collide = sm.relu(t1 - at.norm_b[..., None]) * sm.relu(t2 - at.norm_a[..., None])
    count = jnp.where(at.radix[..., None] > 0, t1 * t2, t1 * t2 - collide)
    span = c1 * (t1 - 1.0) + c2 * (t2 - 1.0) + 1.0
    copy = (at.kind[..., COPY] > 0)[..., None]  # the copy touches whole buffers
    size = _product(at.shape, axis=-1)
    log_unique = jnp.log(jnp.maximum(count, 1e-30)).sum(-2)
    unique = jnp.where(copy, size[..., None], sm.integer(jnp.exp(log_unique)))
    # rows of the innermost physical dimension (the layout's block, or the last logical dimension)
    blocked = (at.blocked > 0)[..., None]
    col_count = jnp.where(blocked, block[..., None], jnp.where(copy, at.shape[..., -1:], count[..., -1, :]))
    col_span = jnp.where(blocked, block[..., None], jnp.where(copy, at.shape[..., -1:], span[..., -1, :]))
    lines = unique / col_count * sm.ceil_div(col_span * elem, float(LINE_BYTES))
    return unique, lines, size


def _executions(at: AccessTable, lp: jax.Array, unique: jax.Array, size: jax.Array, sm: Smooth):
    """Element accesses of each statement ``[V, S]`` and its number of tiles at each level."""
    inside = at.enclosing * lp
    ntiles = sm.integer(jnp.exp(inside @ jnp.asarray(_BEFORE)))  # loops at positions < L
    execs = sm.integer(jnp.exp(inside.sum(-1)))
    block_elems = unique[..., -1]  # distinct elements of the S3 register block
    r0_trips = sm.integer(jnp.exp(lp[POSITIONS.index("R0")]))  # the first R0 iteration loads nothing
    per_exec = jnp.stack([block_elems, block_elems * (2.0 - 1.0 / r0_trips), jnp.ones_like(size), size], -1)
    return execs * (at.kind * per_exec).sum(-1), ntiles


def _strides(at: AccessTable, log_b: jax.Array, sm: Smooth):
    """Strides (elements) of the vector loop and of the last reduction axis's R1 loop ``[V, S]``."""
    log_s = jnp.einsum("...de,...e->...d", at.stride_m, jnp.log(at.shape)) + at.stride_beta * log_b[..., None]

    def stride(dim, coef, lane):
        log_v = (dim * log_s).sum(-1) + jnp.log(coef) - (dim * at.block_dim).sum(-1) * log_b
        return sm.integer(jnp.exp(jnp.where(lane > 0, 0.0, log_v)))

    return stride(at.vdim, at.vcoef, at.vone), stride(at.rdim, at.rcoef, jnp.zeros_like(at.rcoef))


def _to_slots(q: dict[str, jax.Array], is_scratch: jax.Array) -> dict[str, jax.Array]:
    """``[V, S, ...]`` -> ``[S, ...]``: the scratch variant where the sketch accumulates there."""
    return {k: Smooth.select(is_scratch, v[1], v[0]) for k, v in q.items()}


def _cache_traffic(s: dict[str, jax.Array], ub: jax.Array, elem: jax.Array, caches: jax.Array, sm: Smooth):
    """Per-slot bytes moved from each cache level ``[S, 3]`` and the total compute footprint."""
    compute = jnp.asarray(_COMPUTE_SLOTS)
    footprint = compute @ ub  # [6]
    fit = sm.le(footprint[:, None], caches[None, :] + 0.5)  # [6, 3]
    # the outermost fitting level takes the traffic: fit[L] · Π_{L' < L} (1 − fit[L'])
    log_miss = jnp.log(jnp.maximum(1.0 - fit, 1e-30))
    before = jnp.exp(jnp.asarray(_BEFORE).T @ log_miss)  # [6, 3]
    none = jnp.exp(log_miss.sum(0))  # [3]: no level fits
    moved = jnp.einsum("lc,sl->sc", fit * before, ub * s["ntiles"]) + none[None, :] * (
        s["accesses"] * elem)[:, None]
    traffic = jnp.where(compute[:, None] > 0, moved, ub[:, :1])
    return traffic, footprint, fit


_TRACES = [0]


def trace_count() -> int:
    """How many times :func:`features` has been traced (or called eagerly): watch for recompiles.

    Example:
        >>> isinstance(trace_count(), int)
        True
    """
    return _TRACES[0]


def features(inputs: FeatureInputs, x: jax.Array, smooth: Smooth) -> Features:
    """Features of one point ``x [N_X]``: ``Features(access [9, 56], mask [9], glob [61])``.

    Hard mode (``Smooth.hard_mode()``) at an integer point equals :func:`felixjax.extract.extract`
    of the config; soft mode is differentiable in ``x`` (and in the float inputs: extents, shapes,
    element size, cache sizes). Values are ``log(1 + max(v, 0))``.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target())
        >>> rel = Relaxation(sp)
        >>> f = features(feature_inputs(rel), jnp.asarray(rel.to_x(sp.default())), Smooth.hard_mode())
        >>> round(float(jnp.expm1(f.glob[GLOBAL_FEATURES.index("flops")])))
        7680
    """
    _TRACES[0] += 1  # Python side effect: runs once per trace under jit
    rs, at, sm = inputs.knobs, inputs.access, smooth
    lt = log_tiles(rs, x)
    if sm.hard:
        lt = jnp.log(jnp.round(jnp.exp(lt)))
    log_range, lp = _level_logs(rs, lt)
    knobs = _knob_values(rs, x, lt, sm)
    is_scratch = at.scratch_possible * sm.step(jnp.log(knobs["t_v3"]) - jnp.log(1.5))
    q = _descriptor_quantities(at, lt, sm.integer(jnp.exp(log_range)), lp, rs.elem_bytes, sm)
    s = _to_slots(q, is_scratch)
    scratch = is_scratch + (1.0 - is_scratch) * at.padded  # a padded sketch always has one
    epilogue = at.epi_static + (1.0 - at.epi_static) * scratch
    mask = jnp.concatenate([jnp.ones(3), jnp.stack([epilogue, epilogue]), s["present"][5:]])
    access, traffic, footprint, footprint_fits = _access_features(rs, s, sm)
    glob = _global_features(rs, at, lp, knobs, s, mask, traffic, footprint, footprint_fits, scratch,
                            epilogue, sm)
    values = knob_values(rs, x[I_EXTRA:], jnp)
    if sm.hard:
        values = jnp.round(values)
    loops = sm.integer(jnp.exp(lp))
    info = dict(zip(INFO_KEYS, [loops[i] for i in range(N_POS)] + [
        knobs["vec"], knobs["unroll"], rs.elem_bytes, glob[GLOBAL_FEATURES.index("flops")]]))
    glob = _concat([glob, knob_features(jnp, values, rs.extra_mask, info)])
    return Features(_log1p(access), mask, _log1p(glob))


def knob_features(xp, values, applies, info: dict):
    """The declared knobs' global features ``[MAX_KNOB_FEATURES]`` (raw, before ``log(1 + v)``): each
    registered knob's ``features(xp, value, info)`` in its feature slots where the knob applies
    (``applies [E]``, per relaxation slot), zero elsewhere. ``values [E]``: the knobs' values by slot;
    ``info``: the loop-nest quantities of :data:`codegen.knobs.INFO_KEYS`. Shared by the closed-form
    features (``xp = jax.numpy``) and the extractor (``xp = numpy``, counted inputs)."""
    out = [xp.zeros((), xp.float32)] * MAX_KNOB_FEATURES
    for k in registered():
        if k.features is None:
            continue
        s = knob_slot(k.name)
        got = k.features(xp, values[s], info)
        for name, f in zip(k.feature_names, feature_slots(k.name)):
            out[f] = xp.where(applies[s] > 0, xp.asarray(got[name], xp.float32), 0.0).astype(xp.float32)
    return xp.stack(out)


def _knob_values(rs: RelaxedSpace, x: jax.Array, lt: jax.Array, sm: Smooth) -> dict[str, jax.Array]:
    """vec, the S3 register block, the vector axis's S3 tile, parallel chunks and unroll."""
    par = x[I_PAR]
    par = jnp.round(par) if sm.hard else par
    fused = sm.ramp(par - rs.spatial_rank)  # 1 for the spatial S0 loops fused into the parallel loop
    s3, s0 = lt[:, TILE_LEVELS - 1], lt[:, 0]
    ln2 = jnp.log(2.0)
    return dict(par=par, vec=sm.integer(jnp.exp(ln2 * x[I_VEC])), block=sm.integer(jnp.exp(rs.spatial @ s3)),
                t_v3=sm.integer(jnp.exp(rs.vec_axis @ s3)), chunks=sm.integer(jnp.exp(fused @ s0)),
                unroll=sm.integer(jnp.exp(ln2 * x[I_UNROLL])))


def _access_features(rs: RelaxedSpace, s: dict[str, jax.Array], sm: Smooth):
    """The ``[S, F]`` access features (before log1p), per-slot traffic and the total footprint."""
    elem = rs.elem_bytes
    caches = jnp.stack([rs.l1_bytes, rs.l2_bytes, rs.l3_bytes])
    per_tile = s["accesses"][:, None] / s["ntiles"]  # [S, 6]
    ub = elem * s["unique"]
    traffic, footprint, footprint_fits = _cache_traffic(s, ub, elem, caches, sm)
    levels = jnp.stack([elem * per_tile, ub, s["lines"], per_tile / s["unique"]], axis=-1)
    fits = sm.le(ub[..., None], caches + 0.5)
    levels = jnp.concatenate([levels, fits], axis=-1).reshape(len(SLOTS), -1)  # level-major
    kind = s["kind"]
    stmt = jnp.stack([kind[:, BODY] + kind[:, ACC], kind[:, EPILOGUE], kind[:, COPY]], -1)
    contiguous = s["vdep"] * sm.eq(s["vstride"], 1.0)
    strides = jnp.stack([elem * s["size"], s["vdep"] * s["vstride"], contiguous, 1.0 - s["vdep"],
                         s["rdep"] * s["rstride"]], -1)
    access = _concat([s["rw"], stmt, strides, levels, traffic], axis=-1) * s["present"][:, None]
    return access, traffic, footprint, footprint_fits


def _global_features(rs, at, lp, knobs, s, mask, traffic, footprint, footprint_fits, is_scratch, epilogue,
                     sm: Smooth) -> jax.Array:
    """The ``[G]`` global features (before log1p), in GLOBAL_FEATURES order."""
    elem = rs.elem_bytes
    loops = sm.integer(jnp.exp(lp))
    outputs = sm.integer(jnp.exp(rs.spatial @ rs.log_extent))
    reduction = sm.integer(jnp.exp(rs.reduce @ rs.log_extent))
    flops = 2.0 * outputs * reduction + at.epi_ops * outputs
    moved = mask @ traffic  # [3]
    l1_moved, l2_moved, l3_moved = moved
    vec, block, t_v3, chunks, unroll = (knobs[k] for k in ("vec", "block", "t_v3", "chunks", "unroll"))
    accs = block / vec
    balance = chunks / (sm.ceil_div(chunks, rs.cores) * rs.cores)
    scalars = jnp.stack([
        flops, elem, elem * (mask @ s["accesses"]), elem * (mask @ s["unique"][:, 0]),
        l1_moved, l2_moved, l3_moved, flops / l3_moved, flops / l1_moved,
        vec, vec / rs.simd_lanes, accs, accs / rs.max_acc, sm.le(accs, rs.max_acc + 0.5), block / t_v3,
        t_v3 / vec, knobs["par"], chunks, balance, sm.ge(chunks, rs.cores - 0.5)])
    tail = jnp.stack([at.data_copy, is_scratch, epilogue, outputs, reduction])
    r1_trips = loops[POSITIONS.index("R1")]
    return _concat([scalars, loops, jnp.stack([unroll, sm.minimum(unroll, r1_trips)]), footprint,
                    footprint_fits.reshape(-1), tail])


def _concat(parts: list[jax.Array], axis: int = 0) -> jax.Array:
    # Materialize the parts first: a concatenate fused with its producers compiles very slowly on
    # XLA:CPU (every operand's producer tree is emitted per output element branch).
    return jnp.concatenate(jax.lax.optimization_barrier(parts), axis=axis)


def _log1p(v: jax.Array) -> jax.Array:
    # log(1 + v) rather than log1p: XLA:CPU's log1p is several times slower, and v ≥ 0 here
    return jnp.log(1.0 + jnp.maximum(v, 0.0))


_BATCH: dict = {}


def batch_features(inputs: FeatureInputs, x: jax.Array, smooth: Smooth) -> Features:
    """``batch_features(inputs, x [B, N_X], smooth) -> Features([B, 9, 56], [B, 9], [B, 61])``, jitted:
    one compilation per registry of declared knobs (:func:`codegen.knobs.registry_key`), whose feature
    hooks it calls."""
    key = registry_key()
    if key not in _BATCH:
        _BATCH[key] = jax.jit(jax.vmap(features, in_axes=(None, 0, None)))
    return _BATCH[key](inputs, x, smooth)


def config_features(relaxation: Relaxation, configs: Sequence[Config],
                    inputs: FeatureInputs | None = None) -> Features:
    """Exact (hard-mode) features of integer configs, e.g. measured ones for training, as numpy.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> rel = Relaxation(Space(matmul(12, 16, 20), "gemm_packed", Target()))
        >>> config_features(rel, [rel.space.default()]).access.shape
        (1, 9, 56)
    """
    inputs = inputs if inputs is not None else feature_inputs(relaxation)
    xs = jnp.asarray(np.stack([relaxation.to_x(c) for c in configs]))
    f = batch_features(inputs, xs, Smooth.hard_mode())
    return Features(*(np.asarray(a) for a in f))
