"""Relaxation of a schedule space into continuous variables (DESIGN.md ③–④).

A :class:`~codegen.space.Config` of the CPU sketch becomes a vector ``x`` of fixed length
:data:`N_X`:

* ``x[:N_TILE]`` reshaped ``[MAX_AXES, FREE_LEVELS, MAX_PRIMES]``: for every axis, free tile level
  and prime factor of the axis's extent, the exponent of that prime in the tile. Spatial axes have
  the free levels S1, S2, S3 (slots 0, 1, 2); reduction axes R1 (slot 0). The outermost level (S0,
  R0) is the quotient. Tile = Π_p p^x over the extent's **actual** primes (197, 13, 1000 = 2³5³
  all work), so divisibility and Π tiles = extent become the linear constraints
  ``Σ_levels x[a, :, p] ≤ e[a, p]``, ``x ≥ 0``.
* ``x[I_UNROLL]``: log2(unroll) in [0, log2 max(space.unroll_steps)] (6 on CPUs: ``MAX_UNROLL_STEP``).
* ``x[I_VEC]``: log2(vec) in [0, log2 simd_lanes]; rounded to the allowed widths {1, 4, 8, 16}.
* ``x[I_PAR]``: parallel fuse depth in [0, n_spatial].
* ``x[I_EXTRA:]``: one coordinate per declared knob (:mod:`codegen.knobs`), in the knob's fixed slot,
  masked where it does not apply (:mod:`felixjax.relax_knobs`).

Padding: every space uses the same sizes (``MAX_AXES = 8`` axes, the most any op has (conv2d);
``MAX_PRIMES = 4`` distinct primes per extent (2·3·5·7 = 210 is the smallest extent with four; an
extent with five distinct primes, ≥ 2310, raises ``ValueError``); ``FREE_LEVELS = 3``). Unused slots
are masked, so one ``jax.jit`` compilation serves every task, shape and sketch.

:class:`RelaxedSpace` holds those arrays (a pytree: it can be stacked and vmapped over tasks);
:class:`Relaxation` wraps it with the integer side: ``to_x``/``from_x``, sampling, rounding with
repair, and the ±1 integer neighbourhood.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target(cores=2, simd_lanes=16, vector_registers=32))
    >>> rel = Relaxation(sp)
    >>> cfg = sp.default()
    >>> rel.from_x(rel.to_x(cfg)) == cfg
    True
    >>> import jax
    >>> all(sp.is_valid(c) for c in rel.round_x(rel.sample_x(jax.random.PRNGKey(0), 8)))
    True
"""
from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from codegen.knobs import MAX_EXTRA_KNOBS
from codegen.space import Config, Space, factorize
from felixjax.points import first_appearance, unique_rows
from felixjax.relax_knobs import KnobCoder, from_uniform, knob_arrays, project_extra

MAX_AXES = 8
MAX_PRIMES = 4
FREE_LEVELS = 3
TILE_LEVELS = 4  # S0..S3 (reduction axes use R0, R1 and leave 2, 3 empty)
N_TILE = MAX_AXES * FREE_LEVELS * MAX_PRIMES
I_UNROLL, I_VEC, I_PAR = N_TILE, N_TILE + 1, N_TILE + 2
I_EXTRA = N_TILE + 3  # the declared knobs' slots (codegen.knobs), MAX_EXTRA_KNOBS of them
N_X = N_TILE + 3 + MAX_EXTRA_KNOBS

# Nest positions of the loop levels, outermost first: S0 S1 R0 S2 R1 S3.
POSITIONS = ("S0", "S1", "R0", "S2", "R1", "S3")
N_POS = len(POSITIONS)
_SPATIAL_POS = (0, 1, 3, 5)
_REDUCE_POS = (2, 4, -1, -1)

# Hardware constraint names, in the order `constraints` returns them; the last one is soft.
CONSTRAINTS = ("vec_divides_inner_tile", "register_block", "parallel_chunks")


class RelaxedSpace(NamedTuple):
    """Fixed-size arrays describing one (task, sketch, target) for jitted relaxed code.

    Attributes:
        log_p: ``[A, P]`` log of each prime of each axis's extent (0 in padding).
        cap: ``[A, P]`` exponent of that prime in the extent (0 in padding).
        slot_mask: ``[A, J, P]`` 1 where ``x`` has a free variable.
        log_extent: ``[A]`` log of each extent (an input: pruning knobs may move it).
        pos: ``[A, TILE_LEVELS]`` nest position (0..5) of each tile level, −1 where none.
        spatial: ``[A]`` 1 for real spatial axes.
        reduce: ``[A]`` 1 for real reduction axes.
        spatial_rank: ``[A]`` order in which parallel fusion takes spatial axes (1e6 otherwise).
        vec_axis: ``[A]`` one-hot of the sketch's vector axis.
        vec_two: ``[A, P]`` one-hot of prime 2 of the vector axis (all 0 if its extent is odd).
        n_spatial: number of spatial axes (upper bound of the parallel depth).
        log2_simd: log2 of the target's fp32 lanes (upper bound of ``x[I_VEC]``).
        log2_unroll: log2 of the largest of the space's ``unroll_steps`` (upper bound of ``x[I_UNROLL]``).
        cores, l1_bytes, l2_bytes, l3_bytes: the target.
        max_acc: register budget in vector accumulators (``Space.max_accumulators``).
        simd_lanes: fp32 lanes of one vector register.
        elem_bytes: bytes per element; default (None) the task's operand size (:func:`operand_bytes`:
            4 for float32, 2 for float16, 1 for int8), so one model sees every dtype.
        extra_mask, extra_lo, extra_hi, extra_log2: ``[E]`` per declared-knob slot: whether a knob
            applies, the bounds of its coordinate, whether it is a log2 knob.
        extra_points, extra_values: ``[E, V]`` the coordinates and values of each knob's domain
            (see :mod:`felixjax.relax_knobs`).
    """

    log_p: jax.Array
    cap: jax.Array
    slot_mask: jax.Array
    log_extent: jax.Array
    pos: jax.Array
    spatial: jax.Array
    reduce: jax.Array
    spatial_rank: jax.Array
    vec_axis: jax.Array
    vec_two: jax.Array
    n_spatial: jax.Array
    log2_simd: jax.Array
    log2_unroll: jax.Array
    cores: jax.Array
    l1_bytes: jax.Array
    l2_bytes: jax.Array
    l3_bytes: jax.Array
    max_acc: jax.Array
    simd_lanes: jax.Array
    elem_bytes: jax.Array
    extra_mask: jax.Array
    extra_lo: jax.Array
    extra_hi: jax.Array
    extra_log2: jax.Array
    extra_points: jax.Array
    extra_values: jax.Array


# ----------------------------------------------------------------------------------------------
# Building the arrays
# ----------------------------------------------------------------------------------------------

def axis_primes(extent: int) -> tuple[tuple[int, int], ...]:
    """The prime factorization ``((p, e), ...)`` of an extent, checked against ``MAX_PRIMES``.

    Example:
        >>> axis_primes(1000), axis_primes(197)
        (((2, 3), (5, 3)), ((197, 1),))
    """
    f = factorize(int(extent))
    if len(f) > MAX_PRIMES:
        raise ValueError(f"extent {extent} has {len(f)} distinct prime factors; at most {MAX_PRIMES} "
                         f"are supported (raise felixjax.relax.MAX_PRIMES)")
    return f


def operand_bytes(space) -> int:
    """Bytes of one operand element of a space's task (the data input's dtype): the ``elem_bytes`` the
    features use, so float32 features are unchanged and float16 / int8 tasks are told apart.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> operand_bytes(Space(matmul(8, 8, 8, dtype="int8"), "gemm_packed", Target()))
        1
    """
    task = getattr(space, "task", None)
    dts = getattr(task, "buffer_dtypes", None)
    return int(np.dtype(dts.inputs).itemsize) if dts is not None else 4


def relaxed_space(space: Space, *, elem_bytes: int | None = None) -> RelaxedSpace:
    """Build the fixed-size arrays of a space.

    Example:
        >>> from codegen.ops import conv2d
        >>> from codegen.target import Target
        >>> sp = Space(conv2d(1, 4, 6, 6, out_channels=8, padding=1), "conv_direct", Target(cores=2))
        >>> rs = relaxed_space(sp)
        >>> rs.cap.shape, float(rs.n_spatial)
        ((8, 4), 5.0)
    """
    if elem_bytes is None:
        elem_bytes = operand_bytes(space)
    axes = space.axes
    if len(axes) > MAX_AXES:
        raise ValueError(f"{space}: {len(axes)} axes, at most {MAX_AXES} supported")
    f32 = np.float32
    log_p = np.zeros((MAX_AXES, MAX_PRIMES), f32)
    cap = np.zeros((MAX_AXES, MAX_PRIMES), f32)
    mask = np.zeros((MAX_AXES, FREE_LEVELS, MAX_PRIMES), f32)
    log_extent = np.zeros(MAX_AXES, f32)
    pos = np.full((MAX_AXES, TILE_LEVELS), -1, np.int32)
    spatial = np.zeros(MAX_AXES, f32)
    reduce = np.zeros(MAX_AXES, f32)
    rank = np.full(MAX_AXES, 1e6, f32)
    vec_axis = np.zeros(MAX_AXES, f32)
    vec_two = np.zeros((MAX_AXES, MAX_PRIMES), f32)
    n_sp = 0
    for i, a in enumerate(axes):
        primes = axis_primes(a.extent)
        for j, (p, e) in enumerate(primes):
            log_p[i, j], cap[i, j] = math.log(p), e
        mask[i, : (1 if a.reduce else FREE_LEVELS), : len(primes)] = 1
        log_extent[i] = math.log(a.extent)
        pos[i] = _REDUCE_POS if a.reduce else _SPATIAL_POS
        reduce[i], spatial[i] = float(a.reduce), float(not a.reduce)
        if not a.reduce:
            rank[i] = n_sp
            n_sp += 1
        if i == space.vector_index:
            vec_axis[i] = 1
            for j, (p, _) in enumerate(primes):
                vec_two[i, j] = float(p == 2)
    t = space.target
    kn = knob_arrays(space)
    return RelaxedSpace(
        jnp.asarray(log_p), jnp.asarray(cap), jnp.asarray(mask), jnp.asarray(log_extent), jnp.asarray(pos),
        jnp.asarray(spatial), jnp.asarray(reduce), jnp.asarray(rank), jnp.asarray(vec_axis),
        jnp.asarray(vec_two), jnp.float32(n_sp), jnp.float32(math.log2(max(space.vec_choices))),
        jnp.float32(math.log2(max(space.unroll_steps))),
        jnp.float32(t.cores), jnp.float32(t.l1d_bytes), jnp.float32(t.l2_bytes), jnp.float32(t.l3_bytes),
        jnp.float32(space.max_accumulators), jnp.float32(t.simd_lanes), jnp.float32(elem_bytes),
        *(jnp.asarray(kn[f]) for f in ("extra_mask", "extra_lo", "extra_hi", "extra_log2", "extra_points",
                                       "extra_values")))


# ----------------------------------------------------------------------------------------------
# Pure jnp functions of x (jit / vmap friendly)
# ----------------------------------------------------------------------------------------------

def tile_exponents(x: jax.Array) -> jax.Array:
    """``x[..., :N_TILE]`` as ``[..., A, J, P]``.

    Example:
        >>> tile_exponents(jnp.zeros(N_X)).shape
        (8, 3, 4)
    """
    return x[..., :N_TILE].reshape(x.shape[:-1] + (MAX_AXES, FREE_LEVELS, MAX_PRIMES))


def log_tiles(rs: RelaxedSpace, x: jax.Array) -> jax.Array:
    """Log tile sizes ``[A, TILE_LEVELS]`` of one ``x``: level 0 is the quotient ``log E − Σ free``.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target())
        >>> rel = Relaxation(sp)
        >>> cfg = sp.default()
        >>> t = jnp.exp(log_tiles(rel.arrays, jnp.asarray(rel.to_x(cfg))))
        >>> [round(float(v)) for v in t[1]] == list(cfg.tiles[1])
        True
    """
    free = jnp.einsum("ajp,ap->aj", tile_exponents(x) * rs.slot_mask, rs.log_p)
    level0 = rs.log_extent - free.sum(-1)
    return jnp.concatenate([level0[:, None], free], axis=1)


def _project_groups(y, valid, cap, xp):
    """Euclidean projection of each row of ``y`` (last axis, entries where ``valid``) onto the
    capped simplex ``{z ≥ 0, Σ z ≤ cap}``; ``xp`` is ``jax.numpy`` or ``numpy``."""
    y = xp.where(valid, y, 0.0)
    pos_part = xp.maximum(y, 0.0)
    inside = pos_part.sum(-1) <= cap
    # otherwise project onto {z ≥ 0, Σ z = cap}: z = max(y − θ, 0) with the sort-based θ
    u = -xp.sort(-xp.where(valid, y, -1e30), axis=-1)
    k = xp.arange(1, y.shape[-1] + 1, dtype=y.dtype)
    css = xp.cumsum(xp.where(valid, u, 0.0), axis=-1)
    sorted_valid = -xp.sort(-valid.astype(y.dtype), axis=-1) > 0
    cond = sorted_valid & (u - (css - cap[..., None]) / k > 0)
    rho = xp.maximum(cond.sum(-1), 1)
    theta = (xp.take_along_axis(css, (rho - 1)[..., None], axis=-1)[..., 0] - cap) / rho
    on_face = xp.where(valid, xp.maximum(y - theta[..., None], 0.0), 0.0)
    return xp.where(inside[..., None], pos_part, on_face)


def project(rs: RelaxedSpace, x: jax.Array, *, xp=jnp) -> jax.Array:
    """Project ``x`` (any leading batch axes) onto the polytope: a capped simplex per (axis, prime)
    and boxes for unroll, vec and parallel. Padded slots become 0.

    ``xp=numpy`` runs the same code in numpy (``rs`` then holds numpy arrays), e.g. in float64 for
    rounding.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> rel = Relaxation(Space(matmul(2, 2, 2), "gemm_packed", Target()))
        >>> x = jnp.zeros(N_X).at[4 * 3 * 1].set(0.6).at[4 * 3 * 1 + 4].set(0.6)  # axis m: S1, S2 of prime 2
        >>> [round(float(v), 3) for v in project(rel.arrays, x)[12:20:4]]
        [0.5, 0.5]
    """
    ex = xp.swapaxes(tile_exponents(x), -1, -2)  # [..., A, P, J]
    valid = xp.swapaxes(rs.slot_mask, -1, -2) > 0
    proj = xp.swapaxes(_project_groups(ex, valid, rs.cap, xp), -1, -2)
    lead = x.shape[:-1]
    tiles = proj.reshape(lead + (N_TILE,))
    unroll = xp.clip(x[..., I_UNROLL], 0.0, rs.log2_unroll)
    vec = xp.clip(x[..., I_VEC], 0.0, rs.log2_simd)
    par = xp.clip(x[..., I_PAR], 0.0, rs.n_spatial)
    extra = project_extra(rs, x[..., I_EXTRA:], xp)
    return xp.concatenate([tiles, unroll[..., None], vec[..., None], par[..., None], extra], axis=-1)


def _from_draws(rs: RelaxedSpace, e, u, ue, xp):
    """Uniform points from i.i.d. draws: ``e`` Exp(1) ``[n, A, P, J + 1]``, ``u`` U(0, 1) ``[n, 3]``,
    ``ue`` U(0, 1) ``[n, E]`` (the declared knobs).

    Each (axis, prime) group is uniform on its capped simplex ``{y ≥ 0, Σ y ≤ e}``: a flat
    Dirichlet over the free levels plus the slack (normalized exponentials), scaled by ``e``.
    """
    valid = xp.concatenate([xp.swapaxes(rs.slot_mask, -1, -2), xp.ones((MAX_AXES, MAX_PRIMES, 1))], -1)
    e = e * valid
    y = (e / e.sum(-1, keepdims=True))[..., :FREE_LEVELS] * rs.cap[..., None]
    tiles = xp.swapaxes(y, -1, -2).reshape(len(u), N_TILE)
    hi = xp.stack([rs.log2_unroll, rs.log2_simd, rs.n_spatial])
    return xp.concatenate([tiles, u * hi, from_uniform(rs, ue, xp)], axis=-1)


@partial(jax.jit, static_argnames="n")
def sample(rs: RelaxedSpace, key: jax.Array, n: int) -> jax.Array:
    """``n`` points uniform in the polytope ``[n, N_X]`` (jnp, for use inside jitted code).

    Each (axis, prime) group is uniform on its capped simplex ``{y ≥ 0, Σ y ≤ e}``; the scalar
    knobs are uniform on their intervals. :meth:`Relaxation.sample_x` draws the same distribution
    with numpy (no compilation).

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> rel = Relaxation(Space(matmul(8, 8, 8), "gemm_packed", Target()))
        >>> sample(rel.arrays, jax.random.PRNGKey(0), 5).shape
        (5, 103)
    """
    k_tiles, k_scalars = jax.random.split(key)
    e = jax.random.exponential(k_tiles, (n, MAX_AXES, MAX_PRIMES, FREE_LEVELS + 1))
    ue = jax.random.uniform(jax.random.fold_in(k_scalars, 1), (n, MAX_EXTRA_KNOBS))
    return _from_draws(rs, e, jax.random.uniform(k_scalars, (n, 3)), ue, jnp)


def constraints(rs: RelaxedSpace, x: jax.Array) -> jax.Array:
    """Hardware constraints ``g(x) = log lhs − log rhs ≤ 0`` of one ``x``, in :data:`CONSTRAINTS` order.

    * ``vec_divides_inner_tile``: ``log vec ≤ log 2^(ν₂(S3 tile of the vector axis))``, i.e. the
      vector width divides the innermost tile (stronger than ``vec ≤ tile``, and linear in ``x``);
    * ``register_block``: ``log(Π S3 tiles / vec) ≤ log max_acc``;
    * ``parallel_chunks`` (soft, a preference): ``log cores ≤ log(parallel chunks)``.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target(cores=2, simd_lanes=16, vector_registers=32))
        >>> rel = Relaxation(sp)
        >>> bool((constraints(rel.arrays, jnp.asarray(rel.to_x(sp.default())))[:2] <= 1e-6).all())
        True
    """
    lt = log_tiles(rs, x)
    ln2 = jnp.log(2.0)
    two_exp = jnp.sum(tile_exponents(x)[:, FREE_LEVELS - 1, :] * rs.vec_two)
    g_vec = ln2 * (x[I_VEC] - two_exp)
    log_block = jnp.sum(lt[:, TILE_LEVELS - 1] * rs.spatial)
    g_reg = log_block - ln2 * x[I_VEC] - jnp.log(rs.max_acc)
    fused = jnp.clip(x[I_PAR] - rs.spatial_rank, 0.0, 1.0)
    g_par = jnp.log(rs.cores) - jnp.sum(fused * lt[:, 0])
    return jnp.stack([g_vec, g_reg, g_par])


def penalty(rs: RelaxedSpace, x: jax.Array, *, soft_weight: float = 0.1) -> jax.Array:
    """Squared-hinge penalty ``Σ w·max(g, 0)²`` of one ``x`` (the soft constraint weighted lower).

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> rel = Relaxation(Space(matmul(12, 16, 20), "gemm_packed", Target(cores=1)))
        >>> float(penalty(rel.arrays, jnp.asarray(rel.to_x(rel.space.default()))))
        0.0
    """
    w = jnp.array([1.0, 1.0, soft_weight])
    return jnp.sum(w * jnp.maximum(constraints(rs, x), 0.0) ** 2)


# ----------------------------------------------------------------------------------------------
# Integer side (numpy): encoding, rounding with repair, neighbourhood
# ----------------------------------------------------------------------------------------------

def _valuation(n: int, p: int) -> int:
    k = 0
    while n % p == 0 and n > 1:
        n //= p
        k += 1
    return k


def _largest_remainder(y: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Round the rows of ``y`` (``[..., m]``, ≥ 0) to integers summing exactly to ``total`` (``[...]``):
    floor, then give the missing units to the largest fractional parts (ties: lowest index)."""
    s = y.sum(-1, keepdims=True)
    scaled = np.where(s > 0, y * (total[..., None] / np.where(s > 0, s, 1.0)), 0.0)
    base = np.floor(scaled + 1e-9)
    missing = (total - base.sum(-1)).astype(np.int64)
    frac = scaled - base
    order = np.argsort(-frac, axis=-1, kind="stable")
    rank = np.argsort(order, axis=-1, kind="stable")
    return (base + (rank < missing[..., None])).astype(np.int64)


class Relaxation:
    """The relaxed view of one :class:`~codegen.space.Space`.

    Attributes:
        space: the integer space.
        arrays: its :class:`RelaxedSpace` (what jitted code takes).
        primes: per axis, the ``(p, e)`` factorization of its extent.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> rel = Relaxation(Space(matmul(8, 8, 8), "gemm_packed", Target()))
        >>> rel.primes[1]
        ((2, 3),)
    """

    #: the pure ``(relaxed space arrays, x)`` forms, for compiled callers (the gradient strategy's
    #: descent takes them from here, so one compilation serves every task)
    penalty_of = staticmethod(penalty)
    project_of = staticmethod(project)

    def __init__(self, space: Space, *, elem_bytes: int | None = None):
        self.space = space
        self.arrays = relaxed_space(space, elem_bytes=elem_bytes)
        self._np = RelaxedSpace(*(np.asarray(a, np.float64) for a in self.arrays))
        self.primes = tuple(axis_primes(a.extent) for a in space.axes)
        self._vec_log2 = np.array(sorted(int(math.log2(v)) for v in space.vec_choices))
        self._unroll_log2_max = int(math.log2(max(space.unroll_steps)))
        self._vec_choices = np.array(sorted(space.vec_choices), np.int64)
        self._pvals = np.ones((MAX_AXES, MAX_PRIMES), np.int64)  # primes per axis (1 in padding)
        for a, primes in enumerate(self.primes):
            for j, (p, _) in enumerate(primes):
                self._pvals[a, j] = p
        self._cap_i = np.rint(np.asarray(self.arrays.cap)).astype(np.int64)
        self._slot_mask_i = np.asarray(self.arrays.slot_mask).astype(np.int64)  # [A, J, P]
        self._spatial_axes = np.asarray(self.arrays.spatial) > 0
        self._knobs = KnobCoder(space)  # the declared knobs' integer side

    def __repr__(self) -> str:
        return f"Relaxation({self.space!r})"

    # ---- encoding -----------------------------------------------------------------------------------
    def to_x(self, config: Config) -> np.ndarray:
        """The exact continuous point ``[N_X]`` (float32) of an integer config.

        Raises:
            ValueError: a tile is not a product of its extent's primes, or tiles do not multiply
                to the extent.

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target())
            >>> x = Relaxation(sp).to_x(sp.default())
            >>> x.shape
            (103,)
        """
        if len(config.tiles) != len(self.space.axes):
            raise ValueError(f"config has {len(config.tiles)} axes, space has {len(self.space.axes)}")
        x = np.zeros(N_X, np.float32)
        ex = x[:N_TILE].reshape(MAX_AXES, FREE_LEVELS, MAX_PRIMES)
        for a, (axis, tiles, primes) in enumerate(zip(self.space.axes, config.tiles, self.primes)):
            if math.prod(tiles) != axis.extent:
                raise ValueError(f"tiles of {axis.name} {tiles} do not multiply to {axis.extent}")
            for lvl, t in enumerate(tiles[1:]):
                rest = t
                for j, (p, _) in enumerate(primes):
                    k = _valuation(t, p)
                    ex[a, lvl, j] = k
                    rest //= p ** k
                if rest != 1:
                    raise ValueError(f"tile {t} of {axis.name} is not a divisor of {axis.extent}")
        x[I_UNROLL] = min(math.log2(config.unroll), self._unroll_log2_max)  # larger: the same kernel
        x[I_VEC] = math.log2(config.vec)
        x[I_PAR] = config.parallel
        x[I_EXTRA:] = self._knobs.encode(config)
        return x

    def from_x(self, x: np.ndarray) -> Config:
        """The config at an integer point (exponents rounded to the nearest integer; no repair).

        The exact inverse of :meth:`to_x` on integer points. Use :meth:`round_x` for arbitrary
        continuous points.

        Raises:
            ValueError: the rounded exponents of an (axis, prime) exceed the extent's exponent.

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target())
            >>> rel = Relaxation(sp)
            >>> rel.from_x(rel.to_x(sp.default())) == sp.default()
            True
        """
        x = np.asarray(x, np.float64).reshape(1, N_X)
        ex, _ = self._exponents_of(x)
        if (ex[:, :, 0] < 0).any():
            raise ValueError("exponents exceed their extent's prime exponent; use round_x")
        return self.configs_from_x(x)[0]

    # ---- sampling and projection --------------------------------------------------------------------
    def sample_x(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` points uniform in the polytope ``[n, N_X]`` (float32), deterministic in ``key``.

        Drawn with numpy seeded from the key (the same distribution as :func:`sample`), so it
        costs no compilation.

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> rel = Relaxation(Space(matmul(8, 8, 8), "gemm_packed", Target()))
            >>> rel.sample_x(jax.random.PRNGKey(1), 3).shape
            (3, 103)
        """
        typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        seed = np.asarray(jax.random.key_data(key) if typed else key)
        rng = np.random.default_rng(seed.astype(np.uint64).ravel().tolist())
        e = rng.exponential(size=(n, MAX_AXES, MAX_PRIMES, FREE_LEVELS + 1))
        u = rng.uniform(size=(n, 3))
        x = _from_draws(self._np, e, u, rng.uniform(size=(n, MAX_EXTRA_KNOBS)), np)  # knobs drawn last
        return jnp.asarray(x, jnp.float32)

    def project(self, x: np.ndarray) -> np.ndarray:
        """Projection onto the polytope (see :func:`project`), in float64 numpy (no compilation).

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> rel = Relaxation(Space(matmul(8, 8, 8), "gemm_packed", Target()))
            >>> float(rel.project(np.full(N_X, -1.0)).max())
            0.0
        """
        return project(self._np, np.asarray(x, np.float64), xp=np)

    def constraints(self, x: jax.Array) -> jax.Array:
        """Hardware constraints of one ``x`` (see :func:`constraints`), jitted."""
        return _constraints_jit(self.arrays, jnp.asarray(x, jnp.float32))

    def penalty(self, x: jax.Array, *, soft_weight: float = 0.1) -> jax.Array:
        """Squared-hinge penalty of one ``x`` (see :func:`penalty`), jitted."""
        return _penalty_jit(self.arrays, jnp.asarray(x, jnp.float32), soft_weight=soft_weight)

    # ---- rounding -----------------------------------------------------------------------------------
    def _round_exponents(self, xp: np.ndarray) -> np.ndarray:
        """Projected ``[B, N_X]`` -> integer exponents ``[B, A, TILE_LEVELS, P]`` (level 0 = quotient)."""
        b = xp.shape[0]
        free = tile_exponents(xp).transpose(0, 1, 3, 2)  # [B, A, P, J]
        valid = np.asarray(self.arrays.slot_mask).transpose(0, 2, 1) > 0
        free = np.where(valid, np.maximum(free, 0.0), 0.0)
        cap = np.broadcast_to(np.asarray(self.arrays.cap, np.float64), (b, MAX_AXES, MAX_PRIMES))
        slack = np.maximum(cap - free.sum(-1), 0.0)
        parts = np.concatenate([slack[..., None], free], axis=-1)  # [B, A, P, 1 + J]
        ints = _largest_remainder(parts, np.rint(cap))
        return ints.transpose(0, 1, 3, 2)  # [B, A, 1 + J, P]

    def _round_scalars(self, xp: np.ndarray) -> np.ndarray:
        unroll = np.clip(np.rint(xp[:, I_UNROLL]), 0, self._unroll_log2_max)
        # nearest allowed vector width in log2 (ties to the narrower one)
        dist = np.abs(xp[:, I_VEC, None] - self._vec_log2[None, :])
        vec = self._vec_log2[np.argmin(dist, axis=1)]
        par = np.clip(np.rint(xp[:, I_PAR]), 0, self.space.n_spatial)
        extra = self._knobs.round(xp[:, I_EXTRA:])
        return np.concatenate([np.stack([unroll, vec, par], axis=1), extra], axis=1).astype(np.int64)

    def _tiles_array(self, ex: np.ndarray) -> np.ndarray:
        """Integer exponents ``[B, A, TILE_LEVELS, P]`` -> tile sizes ``[B, A, TILE_LEVELS]`` (int64)."""
        return np.prod(self._pvals[None, :, None, :] ** ex, axis=-1)

    def _repair_arrays(self, ex: np.ndarray, sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorized repair of integer exponents ``[B, A, L, P]`` + scalars ``[B, 3 + E]`` (log2 unroll,
        log2 vec, parallel, declared knobs): lower ``vec`` to the widest allowed width dividing the vector axis's S3
        tile, then move prime factors S3 -> S2 until the register block fits. The move taken is the
        smallest ``(is vector axis, prime, -S3 tile, axis, slot)`` that keeps ``vec`` dividing the
        vector axis's S3 tile (non-vector axes first, small primes first, big tiles first)."""
        ex, sc = ex.copy(), sc.copy()
        vi, ch = self.space.vector_index, self._vec_choices
        tiles = self._tiles_array(ex)
        vec = 2 ** sc[:, 1]
        ok = (ch[None, :] <= vec[:, None]) & (tiles[:, vi, TILE_LEVELS - 1, None] % ch[None, :] == 0)
        vec = np.max(np.where(ok, ch[None, :], 1), axis=1)
        is_vi = np.zeros(MAX_AXES, np.int64)
        is_vi[vi] = 1
        prio = (is_vi[:, None] << 50) + (self._pvals << 25)  # [A, P]; ties broken by the S3 tile, then (a, j)
        movable = self._spatial_axes[:, None] & (self._cap_i > 0)
        for _ in range(64 * MAX_AXES):
            acc = np.prod(np.where(self._spatial_axes[None], tiles[:, :, TILE_LEVELS - 1], 1), axis=1) // vec
            rows = np.flatnonzero(acc > self.space.max_accumulators)
            if not rows.size:
                break
            e3, t3, v = ex[rows, :, TILE_LEVELS - 1, :], tiles[rows, :, TILE_LEVELS - 1], vec[rows]
            cand = movable[None] & (e3 >= 1)
            cand[:, vi, :] &= (t3[:, vi, None] // self._pvals[None, vi, :]) % v[:, None] == 0
            key = np.where(cand, prio[None] + ((1 << 24) - t3[:, :, None]), np.iinfo(np.int64).max)
            flat = np.argmin(key.reshape(len(rows), -1), axis=1)
            a, j = flat // MAX_PRIMES, flat % MAX_PRIMES
            ex[rows, a, TILE_LEVELS - 1, j] -= 1
            ex[rows, a, TILE_LEVELS - 2, j] += 1
            tiles[rows] = self._tiles_array(ex[rows])
        else:  # pragma: no cover - impossible: a block of vec lanes is one accumulator
            raise AssertionError("register block cannot shrink")
        sc[:, 1] = np.log2(vec).astype(np.int64)
        return ex, sc

    def _x_of(self, ex: np.ndarray, sc: np.ndarray) -> np.ndarray:
        """Integer exponents ``[B, A, L, P]`` + scalars ``[B, 3 + E]`` -> integer points ``[B, N_X]`` (float32)."""
        free = ex[:, :, 1:, :] * self._slot_mask_i[None]
        return np.concatenate([free.reshape(len(ex), N_TILE), sc], axis=1).astype(np.float32)

    def _exponents_of(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Integer points ``[B, N_X]`` -> exponents ``[B, A, L, P]`` (level 0 = quotient) and scalars."""
        x = np.rint(np.asarray(x, np.float64)).astype(np.int64)
        free = tile_exponents(x) * self._slot_mask_i[None]
        ex = np.concatenate([(self._cap_i[None] - free.sum(2))[:, :, None], free], axis=2)
        return ex, x[:, N_TILE:]

    def valid_x(self, x: np.ndarray) -> np.ndarray:
        """Which rows of ``[B, N_X]`` are integer points of valid configs (vectorized
        :meth:`~codegen.space.Space.is_valid`)."""
        x = np.asarray(x, np.float64).reshape(-1, N_X)
        integral = np.all(x == np.rint(x), axis=1) & np.all(tile_exponents(x) * (1 - self._slot_mask_i) == 0,
                                                            axis=(1, 2, 3))
        ex, sc = self._exponents_of(x)
        tiles = self._tiles_array(np.maximum(ex, 0))
        vec = 2 ** np.clip(sc[:, 1], 0, 16)
        acc = np.prod(np.where(self._spatial_axes[None], tiles[:, :, TILE_LEVELS - 1], 1), axis=1) // vec
        return (integral & np.all(ex >= 0, axis=(1, 2, 3))
                & (sc[:, 0] >= 0) & (sc[:, 0] <= self._unroll_log2_max)
                & np.isin(sc[:, 1], self._vec_log2)
                & (sc[:, 2] >= 0) & (sc[:, 2] <= self.space.n_spatial)
                & (tiles[:, self.space.vector_index, TILE_LEVELS - 1] % vec == 0)
                & (acc <= self.space.max_accumulators) & self._knobs.valid(sc[:, 3:]))

    def configs_from_x(self, x: np.ndarray) -> list[Config]:
        """Configs of integer points ``[B, N_X]`` (rows assumed valid; see :meth:`valid_x`)."""
        ex, sc = self._exponents_of(np.asarray(x).reshape(-1, N_X))
        tiles = self._tiles_array(ex).tolist()
        levels = [2 if a.reduce else TILE_LEVELS for a in self.space.axes]
        name = self.space.sketch.name
        extra = self._knobs.extra(sc[:, 3:])
        out = [Config(name, tuple(tuple(t[a][:lv]) for a, lv in enumerate(levels)), int(s[2]), 1 << int(s[1]),
                      1 << int(s[0]), e)
               for t, s, e in zip(tiles, sc.tolist(), extra)]
        if getattr(self.space, "strict_validation", False):  # limits this relaxation does not model (GPU sketch)
            out = [self.space.repair(c) for c in out]
        return out

    def round_points(self, x_batch: jax.Array | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Round continuous points to valid integer points, deduplicated, without building configs:
        ``(unique [U, N_X] float32, index [B])`` with row ``i`` rounding to ``unique[index[i]]``
        (first-appearance order). See :meth:`round_x` for the steps."""
        x = np.asarray(x_batch, np.float64).reshape(-1, N_X)
        x = np.nan_to_num(x, nan=0.0, posinf=1e6, neginf=-1e6)  # a diverged start still gets a config
        xp = self.project(x)
        ex, sc = self._repair_arrays(self._round_exponents(xp), self._round_scalars(xp))
        pts = self._x_of(ex, sc)
        return first_appearance(pts)

    def round_x(self, x_batch: jax.Array | np.ndarray) -> list[Config]:
        """Round continuous points to valid configs, one per row (DESIGN.md ③).

        Project onto the polytope, floor with largest-remainder rounding per (axis, prime) budget
        (the quotient level takes part, so Σ exponents = e exactly), round the scalar knobs, then
        repair: lower ``vec`` until it divides the vector axis's S3 tile, and move prime factors from
        S3 to S2 until the register block fits. Every row yields a valid config (none is dropped);
        repeated integer points are repaired once.

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> rel = Relaxation(Space(matmul(12, 16, 20), "gemm_packed", Target()))
            >>> len(rel.round_x(np.zeros((4, N_X))))
            4
        """
        configs, index = self.round_unique(x_batch)
        return [configs[i] for i in index]

    def round_unique(self, x_batch: jax.Array | np.ndarray) -> tuple[list[Config], np.ndarray]:
        """Like :meth:`round_x`, deduplicated: ``(unique configs, index)`` with
        ``round_x(x)[i] == unique[index[i]]`` (first-appearance order).

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> rel = Relaxation(Space(matmul(12, 16, 20), "gemm_packed", Target()))
            >>> uniq, idx = rel.round_unique(np.zeros((4, N_X)))
            >>> len(uniq), idx.tolist()
            (1, [0, 0, 0, 0])
        """
        pts, index = self.round_points(x_batch)
        return self.configs_from_x(pts), index

    # ---- neighbourhood ------------------------------------------------------------------------------
    def neighbours(self, config: Config) -> list[Config]:
        """Valid configs one integer step away: one prime factor moved between two tile levels of an
        axis (Ansor's tile-size mutation), or unroll / vec / parallel one step up or down.

        Example:
            >>> from codegen.ops import matmul
            >>> from codegen.target import Target
            >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target())
            >>> nb = Relaxation(sp).neighbours(sp.default())
            >>> len(nb) > 10 and all(sp.is_valid(c) for c in nb)
            True
        """
        return self.configs_from_x(self.neighbours_x(self.to_x(config)[None]))

    def _moves(self) -> np.ndarray:
        """The ±1 steps of :meth:`neighbours_x` other than vec, as deltas ``[K, N_X]``: for every
        real (axis, prime), one factor from any tile level to any other (level 0 is implicit), and
        unroll and parallel one step each way."""
        if getattr(self, "_move_deltas", None) is None:
            rows = []
            for a, (axis, primes) in enumerate(zip(self.space.axes, self.primes)):
                levels = 2 if axis.reduce else TILE_LEVELS
                for j in range(len(primes)):
                    for src in range(levels):
                        for dst in range(levels):
                            if src == dst:
                                continue
                            d = np.zeros(N_X, np.float32)
                            ex = d[:N_TILE].reshape(MAX_AXES, FREE_LEVELS, MAX_PRIMES)
                            if src:
                                ex[a, src - 1, j] -= 1
                            if dst:
                                ex[a, dst - 1, j] += 1
                            rows.append(d)
            for i in (I_UNROLL, I_PAR):
                for step in (-1.0, 1.0):
                    d = np.zeros(N_X, np.float32)
                    d[i] = step
                    rows.append(d)
            self._move_deltas = np.stack(rows)
        return self._move_deltas

    def _steps_x(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every one-step move of every row of ``x [M, N_X]`` (valid or not) and the row it came from."""
        moves = self._moves()
        cands = [(x[:, None, :] + moves[None]).reshape(-1, N_X)]
        rows = [np.repeat(np.arange(len(x)), len(moves))]
        idx = np.searchsorted(self._vec_log2, np.rint(x[:, I_VEC]))
        for step in (-1, 1):  # vec: the next allowed width down / up (1 <-> 4 is one step)
            j = idx + step
            ok = (j >= 0) & (j < len(self._vec_log2))
            y = x[ok].copy()
            y[:, I_VEC] = self._vec_log2[j[ok]]
            cands.append(y)
            rows.append(np.flatnonzero(ok))
        for y, r in self._knobs.steps(x, I_EXTRA):  # declared knobs: the next point down / up
            cands.append(y)
            rows.append(r)
        return np.concatenate(cands), np.concatenate(rows)

    def neighbours_x(self, x: np.ndarray) -> np.ndarray:
        """The valid one-step neighbours ``[K, N_X]`` (unique, sorted) of integer points ``[M, N_X]``:
        the moves of :meth:`neighbours` applied to every row at once, invalid results (and the rows
        themselves) dropped."""
        x = np.asarray(x, np.float32).reshape(-1, N_X)
        cands, _ = self._steps_x(x)
        cands = cands[self.valid_x(cands)]
        if not len(cands):
            return np.zeros((0, N_X), np.float32)
        out = unique_rows(cands)[0]
        keep = ~(out[:, None, :] == x[None, :, :]).all(-1).any(-1)
        return out[keep]

    def neighbours_by_row(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's own valid one-step neighbours, for many rows in one call: points ``[K, N_X]``
        and the row ``[K]`` of ``x`` each belongs to, grouped by row in order; row ``i``'s points are
        exactly ``neighbours_x(x[i:i+1])`` (a point next to two rows is listed under both; the gradient
        search's ``flat`` ranking scores every candidate's neighbourhood this way)."""
        x = np.asarray(x, np.float32).reshape(-1, N_X)
        cands, rows = self._steps_x(x)
        ok = self.valid_x(cands) & ~(cands == x[rows]).all(-1)
        if not ok.any():
            return np.zeros((0, N_X), np.float32), np.zeros(0, np.int64)
        keyed = unique_rows(np.concatenate([rows[ok, None].astype(np.float32), cands[ok]], axis=1))[0]
        return keyed[:, 1:], keyed[:, 0].astype(np.int64)


_constraints_jit = jax.jit(constraints)
_penalty_jit = jax.jit(penalty, static_argnames="soft_weight")


def relax(space: Space, *, elem_bytes: int | None = None) -> Relaxation:
    """The :class:`Relaxation` of a space.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> relax(Space(matmul(8, 8, 8), "gemm_packed", Target())).arrays.cap.shape
        (8, 4)
    """
    return Relaxation(space, elem_bytes=elem_bytes)
