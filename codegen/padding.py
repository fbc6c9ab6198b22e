"""Padded extents: tile awkward extents (primes such as 13, 17, 197, 257) over a padded range.

Tile sizes of a sketch divide their axis's extent, so an extent such as 257 (prime) can only be tiled
1 x 257: its register block has one row, and a vector axis of extent 13 cannot be vectorized at all.
A *padded variant* of a sketch computes the contraction over ``pad_to >= extent`` on some spatial
axes, a number with good factors (the next multiple of the SIMD width for the vector axis, of 4 or 8
for the others), so the register block and the vectors stay full:

* the space (:class:`codegen.space.Space`) of a padded sketch tiles the padded extents (its ``axes``
  and ``con`` are those of :func:`padded_contraction`; ``api_con`` keeps the task's shapes);
* weights are zero-padded when they are packed at load (untimed, :func:`embed`);
* the data input goes through the kernel's timed copy (as a padded convolution's does), which
  zero-fills the padding; a ``gemm_packed`` padded on its rows only copies the rows of its last,
  partial register block(s) (``Plan.tail_row`` in :mod:`codegen.lower`);
* the register block accumulates into a padded scratch buffer in the workspace and the fused
  epilogue writes only the in-range outputs (a guard per padded axis): the result is cropped there.

Reduction axes are never padded (a reduction tile of the whole extent costs nothing), nor the batch
axis. An axis that shares an index with another one in the weights / output (a grouped conv's
channel ``g * kg + k``) may only be padded when it is the outer term of that index.

A padded variant is a sketch of its own, named after its extents (``gemm_packed.pad_m264``,
``conv_direct.pad_y16_x16``), so a config's sketch name fully determines what it computes, configs of
the exact sketches keep their JSON and keys, and the relaxation handles the pad-to extent as a small
discrete choice (exact or padded sketch) whose tile factorization is relaxed as any other.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Sketch
    >>> sk = padded_sketch(matmul(257, 96, 384), Sketch("gemm_packed", "n", "n"), 8)
    >>> sk.name, sk.pad
    ('gemm_packed.pad_m264', (('m', 264),))
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np

from . import blocked
from .factors import largest_divisor_leq as _largest_divisor_leq
from .flat import FLAT_SKETCH, IM2COL_SKETCH, flat_task, im2col_task
from .ops import Access, Axis, Contraction, Task

PAD_SEP = ".pad_"  # a padded sketch's name: <sketch>.pad_<axis><extent>_...
#: a padded extent is at most twice the axis's, or this much above it (a database naming a pad of 2^34 on a
#: 5-output layer made its build allocate terabytes)
MAX_PAD_OVER = 128

MAX_WASTE_VECTOR = 1.5  # padded / real extent at most, on the vector axis
MAX_WASTE_ROWS = 1.34  # ... on the other spatial axes
MAX_WASTE_PIXELS = 1.15  # ... on conv_flat's pixel axis, padded to two vectors
#: sketches whose padded vector axis may run past its extent under masks (:func:`masked_tail`)
MASKED_BASES = ("gemm_packed", FLAT_SKETCH, "conv_direct", IM2COL_SKETCH)
MASKED_MIN_VECTORS = 4  # the data read in place under masks only where the axis spans this many vectors


def sketch_contraction(task: Task, sketch_name: str) -> Contraction:
    """The contraction a sketch of ``task`` schedules before padding: the task's own, or for ``conv_flat``
    that of its flattened twin (:func:`codegen.flat.flat_task`), for ``conv_im2col`` that of the 1x1
    convolution over its columns (:func:`codegen.flat.im2col_task`)."""
    base = sketch_name.split(PAD_SEP)[0]
    if base == FLAT_SKETCH:
        return flat_task(task).contraction()
    if base == blocked.FLAT_SKETCH:
        return blocked.flat_twin(task).contraction()
    return im2col_task(task).contraction() if base == IM2COL_SKETCH else task.contraction()


def round_up(n: int, q: int) -> int:
    return -(-int(n) // q) * q


def paddable(con: Contraction, axis: str) -> bool:
    """Whether ``axis`` of a contraction may be padded: a spatial axis other than the batch (the first),
    of extent > 1, the outer term of every weight / output / bias index it takes part in."""
    names = [a.name for a in con.axes]
    ax = con.axis(axis)
    if ax.reduce or ax.extent <= 1 or names.index(axis) == 0:
        return False
    ext = {a.name: a.extent for a in con.axes}
    for acc in (con.weight, con.out, con.bias):
        if acc is None:
            continue
        for terms in acc.dims:
            coef = {a: c for a, c in terms if c}
            if axis not in coef:
                continue
            if any(ext[a] > 1 and c > coef[axis] for a, c in coef.items() if a != axis):
                return False
    return True


def pad_extent(extent: int, *, vector: bool, lanes: int) -> int:
    """The pad-to extent of one axis (``extent`` itself when padding does not pay).

    Vector axis: the next multiple of the SIMD width (of half of it when that wastes less than
    :data:`MAX_WASTE_VECTOR`). Other axes, only when no divisor in 4..8 exists (register rows): the
    next multiple of 8 (extents >= 64) or 4, wasting at most :data:`MAX_WASTE_ROWS`.

    Example:
        >>> [pad_extent(e, vector=True, lanes=8) for e in (7, 13, 16, 17, 3)]
        [8, 16, 16, 24, 4]
        >>> [pad_extent(e, vector=False, lanes=8) for e in (7, 13, 17, 257, 2, 9)]
        [7, 16, 20, 264, 2, 12]
    """
    if vector:
        for q in (lanes, lanes // 2):
            if q > 1 and extent % q and round_up(extent, q) <= MAX_WASTE_VECTOR * extent:
                return round_up(extent, q)
            if q > 1 and extent % q == 0:
                return extent
        return extent
    if _largest_divisor_leq(extent, 8) >= 4:
        return extent
    q = 8 if extent >= 64 else 4
    padded = round_up(extent, q)
    return padded if padded <= MAX_WASTE_ROWS * extent else extent


def block_rows(vector_registers: int, reserve: int) -> int:
    """Rows of the widest two-vector GEMM register block a register file holds (``(registers - reserve)
    // 2``), when that is not a power of two and at most 8 (6 on AVX2: the 6 x 2-vector micro-kernel),
    else 0. Power-of-two extents (512, 1024) can never form such a block from exact divisors.

    Example:
        >>> block_rows(16, 4), block_rows(32, 4)
        (6, 0)
    """
    rows = (int(vector_registers) - int(reserve)) // 2
    return rows if 2 < rows <= 8 and rows & (rows - 1) else 0


def row_padded_sketch(task: Task, sketch, rows: int, lanes: int = 0):
    """The sketch with its register-block row axis padded to a multiple of ``rows`` (:func:`block_rows`),
    or None: when ``rows`` is 0, the axis already has the divisor, is too short, cannot be padded, or
    padding would waste more than :data:`MAX_WASTE_ROWS`.

    * ``gemm_packed``: rows ``m``, padded to a multiple of ``2 * rows`` (an even number of row blocks: a
      prime count, 258 = 6 x 43, left a 2-thread default one chunk) when ``m >= 4 * rows``. On the AVX2
      EPYC (quiet, 1 thread) matmul 512^3 ran at 55 GFLOP/s with its default 4 x 2-vector block and at
      81 GFLOP/s with a 6 x 2-vector block over 516 rows (``benchmarks/register_block_probe.py``).
    * ``conv_spatial_pack`` vectorized over output channels ``k``: rows are output columns ``x``, padded
      to a multiple of ``rows`` when ``x >= 2 * rows`` (56 -> 60, 28 -> 30, 14 -> 18). Its register block is
      then 6 columns x 2 channel vectors (``benchmarks/conv_block_probe.py``).
    * ``conv_flat`` (:mod:`codegen.flat`): rows are output channels ``k``, padded to a multiple of ``rows``
      when ``k >= 2 * rows``, and with ``lanes`` the pixels ``x`` to two vectors (196 -> 208); None when
      that wastes more than :data:`MAX_WASTE_PIXELS`. The register block is then 6 channels x 2 pixel
      vectors.

    Example:
        >>> from codegen.ops import conv2d, matmul
        >>> from codegen.space import Sketch
        >>> row_padded_sketch(matmul(512, 512, 512), Sketch("gemm_packed", "n", "n"), 6).name
        'gemm_packed.pad_m516'
        >>> row_padded_sketch(matmul(384, 512, 512), Sketch("gemm_packed", "n", "n"), 6) is None
        True
        >>> row_padded_sketch(conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1),
        ...                   Sketch("conv_spatial_pack", "k", "k"), 6).name
        'conv_spatial_pack.pad_x60'
        >>> row_padded_sketch(conv2d(1, 256, 14, 14, out_channels=1024, kernel=1), Sketch("conv_flat", "x", "k"),
        ...                   6, lanes=8).name
        'conv_flat.pad_k1026_x208'
    """
    if rows < 2:
        return None
    con = sketch_contraction(task, sketch.name)
    if sketch.name in (FLAT_SKETCH, IM2COL_SKETCH):
        pad = {}
        k, x = con.axis("k").extent, con.axis("x").extent
        if k % rows and k >= 2 * rows and round_up(k, rows) <= MAX_WASTE_ROWS * k:
            pad["k"] = round_up(k, rows)
        if lanes > 1 and x % (2 * lanes):
            if round_up(x, 2 * lanes) > MAX_WASTE_PIXELS * x:
                return None  # the block's two pixel vectors would not fit (7 x 7 = 49 pixels)
            pad["x"] = round_up(x, 2 * lanes)
        return with_pad(task, sketch, pad) if pad else None
    if sketch.name == "gemm_packed":
        axis, quantum, shortest = "m", 2 * rows, 4 * rows
    elif sketch.name == "conv_spatial_pack" and sketch.vector_axis == "k":
        axis, quantum, shortest = "x", rows, 2 * rows
    else:
        return None
    n = con.axis(axis).extent
    if n % rows == 0 or n < shortest or not paddable(con, axis):
        return None
    padded = round_up(n, quantum)
    if padded > MAX_WASTE_ROWS * n:
        return None
    return with_pad(task, sketch, {axis: padded})


def widest_vector(extent: int, lanes: int, vec_choices: tuple[int, ...]) -> int:
    """The widest vector (of ``vec_choices``, at most ``lanes``) that divides ``extent``."""
    return max(c for c in vec_choices if c <= lanes and extent % c == 0)


def vector_padded_sketch(task: Task, sketch, lanes: int, vec_choices: tuple[int, ...]):
    """``sketch`` with only its vector axis padded (:func:`pad_extent`), or None where that gains no wider vector
    (5 -> 6 columns on 4 lanes: vectors of 1, 4, 8 or 16) or the axis cannot be padded. The sparse sketch's
    variant (its weights keep their shape).

    Example:
        >>> from codegen.ops import conv2d
        >>> from codegen.space import Sketch
        >>> t = conv2d(1, 8, 7, 7, out_channels=8, kernel=1, sparsity=0.5)
        >>> vector_padded_sketch(t, Sketch("sparse_bsr", "x", "k"), 16, (1, 4, 8, 16)).name
        'sparse_bsr.pad_x8'
    """
    v, con = sketch.vector_axis, task.contraction()
    n = con.axis(v).extent
    e = pad_extent(n, vector=True, lanes=lanes)
    gains = widest_vector(e, lanes, vec_choices) > widest_vector(n, lanes, vec_choices)
    return with_pad(task, sketch, {v: e}) if gains and paddable(con, v) else None


def pad_name(base: str, pad: dict[str, int], con: Contraction) -> str:
    return base + PAD_SEP + "_".join(f"{a.name}{pad[a.name]}" for a in con.axes if a.name in pad)


def padded_sketch(task: Task, sketch, lanes: int):
    """The padded variant of ``sketch`` on ``task`` for a target of ``lanes`` fp32 lanes, or None when no
    axis is awkward (see :func:`pad_extent`)."""
    con = sketch_contraction(task, sketch.name)
    pad = {}
    for a in con.spatial:
        if not paddable(con, a.name):
            continue
        e = pad_extent(a.extent, vector=a.name == sketch.vector_axis, lanes=lanes)
        if e != a.extent:
            pad[a.name] = e
    if not pad:
        return None
    return with_pad(task, sketch, pad)


def with_pad(task: Task, sketch, pad: dict[str, int]):
    """``sketch`` padded to ``pad`` (``{axis: pad_to}``), checked."""
    con = sketch_contraction(task, sketch.name)
    for name, e in pad.items():
        if name not in {a.name for a in con.axes}:
            raise ValueError(f"padded sketch: {task.name} has no axis {name!r}")
        if not paddable(con, name):
            raise ValueError(f"padded sketch: axis {name!r} of {task.name} cannot be padded (a reduction, the "
                             f"batch, extent 1, or the inner term of a shared index)")
        if e <= con.axis(name).extent:
            raise ValueError(f"padded sketch: {name} padded to {e}, not above its extent {con.axis(name).extent}")
        cap = max(2 * con.axis(name).extent, con.axis(name).extent + MAX_PAD_OVER)
        if e > cap:  # the search pads to a vector / register block; a stored name asking for more is refused
            raise ValueError(f"padded sketch: {name} padded to {e}, far past its extent {con.axis(name).extent} "
                             f"(at most {cap})")
    pad = {a.name: int(pad[a.name]) for a in con.axes if a.name in pad}
    return replace(sketch, name=pad_name(sketch.name, pad, con), pad=tuple(pad.items()))


def parse_pad(task: Task, name: str, spec: str) -> dict[str, int]:
    """``"y16_x16"`` -> ``{"y": 16, "x": 16}`` (the tail of a padded sketch's name)."""
    out = {}
    for tok in spec.split("_"):
        m = re.fullmatch(r"([a-z]+)(\d+)", tok)
        if not m:
            raise ValueError(f"sketch {name!r}: bad padded extent {tok!r} (expected <axis><extent>, e.g. m264)")
        out[m.group(1)] = int(m.group(2))
    return out


def _unit_innermost(acc: Access, axis: str) -> bool:
    """Whether ``axis`` indexes only the innermost dimension of ``acc``, with coefficient 1 (other axes may
    share that dimension: a valid convolution's ``x + rx``)."""
    if not acc.dims:
        return False
    inner = {a: c for a, c in acc.dims[-1] if c}
    outer = any(a == axis and c for dim in acc.dims[:-1] for a, c in dim)
    return inner.get(axis) == 1 and not outer


def masked_tail(task: Task, sketch, target) -> str:
    """How a padded sketch's vector axis runs past its extent: ``""`` (a padded scratch, cropped by the
    epilogue, and a zero-padded copy of the data), ``"out"`` (the output written in place, the last
    vector of each row by a masked store; the data copied as before or not indexed by the axis) or
    ``"data"`` (that, and the data read in place by masked loads: no copy at all).

    Only the vector axis may be padded, on a CPU target, float32 (low precision keeps its scratch), for
    the sketches the generic C renderer draws, where the output (and the data read in place) step the
    axis with unit stride. The register block checks once whether its vectors run past the extent and
    takes a masked copy of its body only then (``codegen.renderers.cstyle``).

    Why (issue 14, Zen 4, 1 thread): the fresh suite's 1x1 conv 256x14x14 -> 1024 ran its padded
    ``conv_flat.pad_x208`` at 105 GFLOP/s where the same kernel on an exact 208-pixel image ran at 116
    (99% of peak): 196 / 208 of the lanes are useful (94%), and the copy in plus the cropping epilogue
    cost another 4%.

    Example:
        >>> from codegen.ops import conv2d
        >>> from codegen.space import Sketch
        >>> from codegen.target import Target
        >>> t = conv2d(1, 256, 14, 14, out_channels=1024, kernel=1)
        >>> masked_tail(t, with_pad(t, Sketch("conv_flat", "x", "k"), {"x": 208}), Target(simd_lanes=16))
        'data'
    """
    if (getattr(target, "kind", "cpu") != "cpu" or task.dtype != "float32" or task.quantized or task.sparsity
            or len(sketch.pad) != 1 or sketch.pad[0][0] != sketch.vector_axis or sketch.base not in MASKED_BASES):
        return ""
    v = sketch.vector_axis
    con = sketch_contraction(task, sketch.base)
    # short rows (14 in 16 lanes: every vector a tail) ran slower masked than copied and cropped
    if not _unit_innermost(con.out, v) or con.axis(v).extent < MASKED_MIN_VECTORS * max(1, int(target.simd_lanes)):
        return ""
    if not con.data.depends_on(v) or sketch.base == IM2COL_SKETCH or any(b or a for b, a in con.pad):
        return "out"  # the data is copied (zero-padded), or does not step the axis
    return "data" if _unit_innermost(con.data, v) else ""


def padded_contraction(con: Contraction, pad: dict[str, int], keep: tuple[str, ...] = ()) -> Contraction:
    """``con`` over padded extents: axes, and every access's logical shape grown to cover the padded
    index range (the data's extra rows / columns are zero padding after its end). Accesses named in
    ``keep`` (``"data"``, ``"out"``, ``"bias"``) keep their API shapes: the kernel masks what lies beyond
    (:func:`masked_tail`)."""
    axes = tuple(Axis(a.name, int(pad.get(a.name, a.extent)), a.reduce) for a in con.axes)
    ext = {a.name: a.extent for a in axes}

    def grow(acc: Access | None) -> Access | None:
        if acc is None or acc.buffer in keep:
            return acc
        shape = tuple(max(n, 1 + sum(c * (ext[a] - 1) for a, c in terms)) for n, terms in zip(acc.shape, acc.dims))
        return Access(acc.buffer, shape, acc.dims)

    data = grow(con.data)
    pads = tuple((b, n - b - api) for (b, _), n, api in zip(con.pad, data.shape, con.data_api_shape))
    return Contraction(axes, data, grow(con.weight), grow(con.out), grow(con.bias), con.data_api_shape, pads)


def embed(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` zero-padded at the end of every dimension to ``shape`` (itself when equal)."""
    array = np.asarray(array)
    if tuple(array.shape) == tuple(shape):
        return array
    if len(shape) != array.ndim or any(s < n for s, n in zip(shape, array.shape)):
        raise ValueError(f"cannot embed an array of shape {array.shape} in {shape}")
    return np.pad(array, [(0, s - n) for s, n in zip(shape, array.shape)])


def waste(con: Contraction, api: Contraction) -> float:
    """Padded over real output count (the share of the work the padding adds, + 1)."""
    return math.prod(a.extent for a in con.spatial) / math.prod(a.extent for a in api.spatial)
