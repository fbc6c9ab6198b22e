"""The CPU schedule space (DESIGN.md ③): sketches, integer configs, validation, sampling.

A :class:`Sketch` fixes the loop structure and data layouts; a :class:`Config` holds its integer knobs:

* ``tiles``: per task axis (in ``Contraction.axes`` order), the tile size of every level, outermost
  first. Spatial axes have 4 levels ``S0 S1 S2 S3``, reduction axes 2 levels ``R0 R1``; the product of
  an axis's tiles is its extent (level 0 is the quotient). Loop order: ``S0 S1 R0 S2 R1 S3``.
* ``parallel``: how many outer ``S0`` loops are fused into one OpenMP parallel loop (0 = serial).
* ``vec``: SIMD width in {1, 4, 8, 16} (fp32 lanes, at most the target's); divides the ``S3`` tile of
  the sketch's vector axis.
* ``unroll``: max unroll step of the innermost reduction loop, in {1, 2, 4, ..., 512}.
* ``extra``: the declared knobs of :mod:`codegen.knobs` that apply to the sketch, those at a value
  other than their default (validation, sampling and enumeration iterate over them generically).

The ``S3`` tiles form a register block: ``prod(S3) / vec`` vector accumulators that stay in registers
across the ``R1`` loop; their count is bounded by the target's register file.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> sp = Space(matmul(64, 64, 64), "gemm_packed", Target.cpu())
    >>> cfg = sp.sample(np.random.default_rng(0))
    >>> sp.validate(cfg) is None
    True
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from . import blocked as _blocked
from . import factors as _fa
from . import flat as _flat
from . import gemm_default as _gemm
from . import winograd as _wg
from .depthwise import DW_SKETCH
from .depthwise import applies as _depthwise_applies
from .depthwise import default_schedule as _depthwise_default
from .factors import (  # noqa: F401
    count_factorizations,
    divisors,
    factorizations,
    factorize,
    random_factorization,
)
from .factors import largest_divisor_leq as _largest_divisor_leq
from .knobs import Knob, knobs_for
from .ops import Contraction, Task
from .padding import (
    PAD_SEP,
    block_rows,
    masked_tail,
    padded_contraction,
    padded_sketch,
    parse_pad,
    row_padded_sketch,
    sketch_contraction,
    vector_padded_sketch,
    widest_vector,
    with_pad,
)
from .sparse import SPARSE_SKETCH
from .target import Target

SPATIAL_LEVELS = 4
REDUCE_LEVELS = 2
VEC_CHOICES = (1, 4, 8, 16)
UNROLL_CHOICES = tuple(2 ** i for i in range(10))  # 1 .. 512: the values a config may hold
#: the largest unroll step a C kernel is built with (a config above it builds this one's kernel): 128-512
#: were never faster and took gcc up to 40x longer (``benchmarks/unroll_probe.py``, docs/ARCHITECTURE.md)
MAX_UNROLL_STEP = 64
UNROLL_STEPS = tuple(u for u in UNROLL_CHOICES if u <= MAX_UNROLL_STEP)
REGISTER_RESERVE = 4  # vector registers left for operand loads and broadcasts
# accumulators of the register block the defaults aim for (at most the register file's budget): 12 is
# AVX2's 6 x 2-vector block (16 registers); benchmarks/accumulator_probe.py tries more on 32 registers
ACCUMULATOR_CAP = 12


@dataclass(frozen=True)
class Sketch:
    """One loop structure / layout choice of a task.

    Attributes:
        name: ``gemm_packed`` (packed weight panels), ``conv_direct`` (NCHW, vectorized along output
            width) or ``conv_spatial_pack`` (NCHW[x]c: channel-blocked output and pre-packed weights,
            vectorized along output channels).
        vector_axis: the spatial axis whose ``S3`` tile is the SIMD dimension.
        weight_axis: the spatial axis the packed weights are blocked by (its ``S3`` tile is the block):
            the vector axis when the weights depend on it, else the output-channel axis, so the
            register block's broadcast weights are contiguous.
    """

    name: str
    vector_axis: str
    weight_axis: str
    #: padded extents ``((axis, pad_to), ...)`` of a padded variant (:mod:`codegen.padding`); empty for
    #: the exact sketch. The name of a padded variant spells them: ``gemm_packed.pad_m264``
    pad: tuple[tuple[str, int], ...] = ()

    @property
    def base(self) -> str:
        """The exact sketch's name (``gemm_packed`` for ``gemm_packed.pad_m264``)."""
        return self.name.split(PAD_SEP)[0]


def sketches_for(task: Task, target: Target | None = None) -> tuple[Sketch, ...]:
    """The sketches that apply to a task, in a fixed order; with a ``target``, each followed by its
    padded variant where the task has awkward extents (:func:`codegen.padding.padded_sketch`).

    Example:
        >>> from codegen.ops import conv2d
        >>> [s.name for s in sketches_for(conv2d(1, 8, 8, 8, out_channels=8))]
        ['conv_direct', 'conv_spatial_pack', 'conv_winograd', 'conv_winograd4']
        >>> [s.name for s in sketches_for(conv2d(1, 8, 9, 9, out_channels=8), Target(simd_lanes=8))][:3]  # 7x7 out
        ['conv_direct', 'conv_direct.pad_x8', 'conv_spatial_pack']
        >>> [s.name for s in sketches_for(conv2d(1, 8, 15, 15, out_channels=8), Target(simd_lanes=8))][:4]  # 13x13
        ['conv_direct', 'conv_direct.pad_y16_x16', 'conv_spatial_pack', 'conv_spatial_pack.pad_y16_x16']
    """
    if task.sparsity:  # weights compiled into the kernel, zeros skipped (codegen.sparse): one sketch, and on a
        # target its variant padded on the vector axis only (the weights keep their shape)
        sparse = Sketch(SPARSE_SKETCH, "x" if task.op == "conv2d" else "m", "k" if task.op == "conv2d" else "n")
        padded = _sparse_padded(task, sparse, target) if target is not None else None
        return (sparse,) + ((padded,) if padded is not None else ())
    if task.op in ("matmul", "dense"):
        base: tuple[Sketch, ...] = (Sketch("gemm_packed", "n", "n"),)
    elif task.op == _blocked.OP:  # channel-blocked (codegen.blocked); a 1x1 conv also over its flat pixels
        flat, is_flat, blk = Sketch(_blocked.FLAT_SKETCH, "v", "v"), _blocked.flat_applies(task), Sketch(_blocked.SKETCH, "v", "v")
        pad, px = (_blocked.flat_pad(task) if is_flat else None, _blocked.pad_x(task)) if target else (None, None)
        dw = (Sketch(_blocked.DW_SKETCH, "v", "v"),) if _blocked.dw_applies(task) else ()  # read in place
        return ((blk,) + ((with_pad(task, blk, {"x": px}),) if px else ()) + dw + ((flat,) if is_flat else ())
                + ((with_pad(task, flat, {"x": pad}),) if pad else ()))  # pad: an even pixel count; px: primes
    else:
        con = task.contraction()
        channel = "k" if con.axis("k").extent > 1 or con.axis("g").extent == 1 else "g"
        base = (Sketch("conv_direct", "x", channel), Sketch("conv_spatial_pack", channel, channel))
        if _depthwise_applies(task):  # the dedicated depthwise sketch (codegen.depthwise)
            base += (Sketch(DW_SKETCH, "x", channel),)
        if _wg.applies(task):  # Winograd F(2x2, 3x3) (codegen.winograd)
            base += (Sketch(_wg.WG_SKETCH, "k", "k"),)
        if _wg.applies4(task):  # and F(4x4, 3x3)
            base += (Sketch(_wg.WG4_SKETCH, "k", "k"),)
        if _flat.applies(task):  # a 1x1 conv over its flattened image, a GEMM (codegen.flat)
            base += (Sketch(_flat.FLAT_SKETCH, "x", "k"),)
        if _flat.im2col_applies(task):  # im2col + the same GEMM (codegen.flat)
            base += (Sketch(_flat.IM2COL_SKETCH, "x", "k"),)
    if target is None:
        return base
    out: list[Sketch] = []
    rows = block_rows(int(target.vector_registers), REGISTER_RESERVE)
    for s in base:
        out.append(s)
        if s.name in _wg.VARIANTS:  # its tiles cover a virtual tile grid: no padded variants
            continue
        lanes = int(target.simd_lanes)
        for padded in (padded_sketch(task, s, lanes), row_padded_sketch(task, s, rows, lanes)):
            if padded is not None and padded.name not in {o.name for o in out}:
                out.append(padded)
    return tuple(out)


def _sparse_padded(task: Task, sketch: Sketch, target: Target) -> Sketch | None:
    """The sparse sketch with its columns padded to whole vectors, or None (:func:`vector_padded_sketch`: 7x7 /
    14x14 outputs and 12 rows had scalar or 4-lane schedules only, 3-25x slower than dense in a session-77 review)."""
    return vector_padded_sketch(task, sketch, int(target.simd_lanes), VEC_CHOICES)


def get_sketch(task: Task, name: str | Sketch) -> Sketch:
    """The sketch named ``name`` (a padded variant's name spells its extents, so no target is needed)."""
    if isinstance(name, Sketch):
        return name
    base, sep, pads = name.partition(PAD_SEP)
    for s in sketches_for(task):
        if s.name == base:
            if not sep:  # ("gemm_packed.pad_", no extents, is a malformed name: parse_pad says so)
                return s
            pad = parse_pad(task, name, pads)
            if task.sparsity and set(pad) != {s.vector_axis}:
                raise ValueError(f"sketch {name!r}: a sparse task pads only its vector axis {s.vector_axis!r}")
            return with_pad(task, s, pad)
    raise ValueError(f"sketch {name!r} does not apply to {task.name}; valid: "
                     f"{', '.join(s.name for s in sketches_for(task))} (and their padded variants '<name>{PAD_SEP}...')")


@dataclass(frozen=True)
class Config:
    """Integer knobs of one sketch (see module docstring). Frozen, hashable, JSON round-trip."""

    sketch: str
    tiles: tuple[tuple[int, ...], ...]
    parallel: int
    vec: int
    unroll: int
    #: declared knobs (:mod:`codegen.knobs`) at a value other than their default, ``(name, value)``
    #: sorted by name; written to JSON only when non-empty, so configs without them keep their keys
    extra: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.extra:
            items = self.extra.items() if isinstance(self.extra, dict) else self.extra
            extra = tuple(sorted((str(k), int(v)) for k, v in items))
            if len({k for k, _ in extra}) != len(extra):
                raise ValueError(f"extra: a knob is given twice in {extra}")
            object.__setattr__(self, "extra", extra)

    def knob(self, name: str, default: int | None = None) -> int | None:
        """The value of declared knob ``name`` (``default`` when it is not in ``extra``)."""
        for k, v in self.extra:
            if k == name:
                return v
        return default

    def to_json(self) -> dict:
        d = {"sketch": self.sketch, "tiles": [list(t) for t in self.tiles], "parallel": self.parallel,
             "vec": self.vec, "unroll": self.unroll}
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @staticmethod
    def from_json(d: dict | str) -> Config:
        if isinstance(d, str):
            d = json.loads(d)
        return Config(str(d["sketch"]), tuple(tuple(_fa.as_whole(x, "a tile") for x in t) for t in d["tiles"]),
                      *(_fa.as_whole(d[k], k) for k in ("parallel", "vec", "unroll")),
                      tuple((d.get("extra") or {}).items()))

    def dumps(self) -> str:
        """Canonical JSON string (a database key)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


# ----------------------------------------------------------------------------------------------
# The space
# ----------------------------------------------------------------------------------------------

class Space:
    """Valid configs of one (task, sketch, target): validation, uniform sampling, enumeration."""

    def __init__(self, task: Task, sketch: str | Sketch, target: Target):
        self.task = task
        self.sketch = get_sketch(task, sketch)
        self.target = target
        #: the task's contraction (API shapes; for ``conv_flat`` that of the task's flattened twin, the
        #: same buffers: :mod:`codegen.flat`); ``con`` is the one the kernel computes: the same, or over
        #: padded extents for a padded sketch (:mod:`codegen.padding`)
        self.api_con: Contraction = sketch_contraction(task, self.sketch.name)
        self.con: Contraction = self.api_con
        #: how the padded vector axis runs past its extent (:func:`codegen.padding.masked_tail`): "", "out", "data"
        self.masked = masked_tail(task, self.sketch, target) if self.sketch.pad else ""
        if self.sketch.pad:
            keep = {"": (), "out": ("out", "bias"), "data": ("data", "out", "bias")}[self.masked]
            self.con = padded_contraction(self.api_con, dict(self.sketch.pad), keep)
        if self.sketch.base in _wg.VARIANTS:  # the alpha x alpha "conv" over the tile grid (codegen.winograd)
            self.con = _wg.virtual_task(task, _wg.variant_of(self.sketch)).contraction()
        self.axes = self.con.axes
        self.levels = tuple(REDUCE_LEVELS if a.reduce else SPATIAL_LEVELS for a in self.axes)
        self.vector_index = [a.name for a in self.axes].index(self.sketch.vector_axis)
        self.n_spatial = len(self.con.spatial)
        simd = max(1, int(target.simd_lanes))
        self.vec_choices = tuple(v for v in VEC_CHOICES if v <= simd)
        self.unroll_steps = UNROLL_STEPS  # what search draws; any of UNROLL_CHOICES is valid
        self.max_accumulators = int(target.vector_registers) - REGISTER_RESERVE
        self.default_accumulators = max(1, min(ACCUMULATOR_CAP, self.max_accumulators))  # the defaults' budget

    def __repr__(self) -> str:
        return f"Space({self.task.name}, {self.sketch.name})"

    # ---- declared knobs (codegen.knobs) ----------------------------------------------------------
    @property
    def knobs(self) -> tuple[Knob, ...]:
        """The registered knobs that apply to this sketch, sorted by name."""
        return knobs_for(self.sketch.name)

    def knob_value(self, cfg: Config, knob: Knob) -> int:
        """The value of a declared knob in ``cfg`` (its default when ``cfg.extra`` leaves it out)."""
        v = cfg.knob(knob.name)
        return knob.default_value(self) if v is None else v

    def with_knobs(self, cfg: Config, values: dict[str, int]) -> Config:
        """``cfg`` with declared knobs set; values equal to a knob's default are left out of ``extra``."""
        extra = dict(cfg.extra)
        for k in self.knobs:
            if k.name in values:
                v = int(values[k.name])
                if v == k.default_value(self):
                    extra.pop(k.name, None)
                else:
                    extra[k.name] = v
        unknown = set(values) - {k.name for k in self.knobs}
        if unknown:
            raise ValueError(f"knobs {sorted(unknown)} do not apply to sketch {self.sketch.name!r}")
        return Config(cfg.sketch, cfg.tiles, cfg.parallel, cfg.vec, cfg.unroll, tuple(extra.items()))

    # ---- constraints ---------------------------------------------------------------------------
    def accumulators(self, cfg: Config) -> int:
        """Register-block size in vector registers: ``prod(S3 tiles) / vec``."""
        s3 = math.prod(t[-1] for t, a in zip(cfg.tiles, self.axes) if not a.reduce)
        return s3 // cfg.vec

    def validate(self, cfg: Config) -> None:
        """Raise ``ValueError`` naming the knob and its valid range if ``cfg`` is not in the space."""
        if cfg.sketch != self.sketch.name:
            raise ValueError(f"config is for sketch {cfg.sketch!r}, space is {self.sketch.name!r}")
        check_tiles(self.axes, self.levels, cfg.tiles)
        if not _fa.whole(cfg.parallel) or not 0 <= cfg.parallel <= self.n_spatial:
            raise ValueError(f"parallel={cfg.parallel}: valid range is 0..{self.n_spatial} (fused outer loops)")
        if not _fa.whole(cfg.vec) or cfg.vec not in self.vec_choices:
            raise ValueError(f"vec={cfg.vec}: valid values are {self.vec_choices}")
        inner = cfg.tiles[self.vector_index][-1]
        if inner % cfg.vec:
            raise ValueError(f"vec={cfg.vec} must divide the innermost tile of vector axis "
                             f"{self.sketch.vector_axis!r} ({inner})")
        if not _fa.whole(cfg.unroll) or cfg.unroll not in UNROLL_CHOICES:
            raise ValueError(f"unroll={cfg.unroll}: valid values are 1, 2, 4, ..., 512")
        acc = self.accumulators(cfg)
        if acc > self.max_accumulators:
            raise ValueError(f"register block: {acc} accumulators (prod of S3 tiles / vec) exceed the "
                             f"register file budget {self.max_accumulators}")
        if cfg.extra:
            known = {k.name: k for k in self.knobs}
            for name, value in cfg.extra:
                if name not in known:
                    raise ValueError(f"knob {name!r} does not apply to sketch {self.sketch.name!r} (declared knobs "
                                     f"here: {', '.join(known) or 'none'})")
                dom = known[name].values(self)
                if value not in dom:
                    raise ValueError(f"{name}={value}: valid values are {dom}")

    def is_valid(self, cfg: Config) -> bool:
        try:
            self.validate(cfg)
            return True
        except ValueError:
            return False

    # ---- sampling ------------------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator) -> Config:
        tiles = tuple(random_factorization(rng, a.extent, lv) for a, lv in zip(self.axes, self.levels))
        par, vec, unroll = (int(rng.integers(0, self.n_spatial + 1)), int(rng.choice(self.vec_choices)),
                            int(rng.choice(self.unroll_steps)))
        extra = []  # declared knobs are drawn after the core ones (no draw at all when there are none)
        for k in self.knobs:
            dom = k.values(self)
            v = dom[int(rng.integers(len(dom)))]
            if v != k.default_value(self):
                extra.append((k.name, v))
        return Config(self.sketch.name, tiles, par, vec, unroll, tuple(extra))

    def sample(self, rng: np.random.Generator, *, max_tries: int = 100_000) -> Config:
        """A uniformly random valid config (rejection sampling over the product of knob domains)."""
        for _ in range(max_tries):
            cfg = self._draw(rng)
            if self.is_valid(cfg):
                return cfg
        raise RuntimeError(f"{self}: no valid config found in {max_tries} draws")

    def sample_many(self, rng: np.random.Generator, n: int) -> list[Config]:
        return [self.sample(rng) for _ in range(n)]

    def size(self) -> int:
        """Number of configs in the unconstrained product of knob domains (an upper bound), unroll
        counted over :attr:`unroll_steps` (larger valid values build the same kernels)."""
        tiles = math.prod(count_factorizations(a.extent, lv) for a, lv in zip(self.axes, self.levels))
        extra = math.prod(len(k.values(self)) for k in self.knobs)
        return tiles * (self.n_spatial + 1) * len(self.vec_choices) * len(self.unroll_steps) * extra

    def enumerate(self) -> Iterator[Config]:
        """Every valid config with unroll in :attr:`unroll_steps`: every distinct kernel (only sensible
        for small tasks)."""
        import itertools

        per_axis = [list(factorizations(a.extent, lv)) for a, lv in zip(self.axes, self.levels)]
        knobs = self.knobs
        extras = [tuple((k.name, v) for k, v in zip(knobs, vals) if v != k.default_value(self))
                  for vals in itertools.product(*[k.values(self) for k in knobs])]
        for tiles in itertools.product(*per_axis):
            for par in range(self.n_spatial + 1):
                for vec in self.vec_choices:
                    for unroll in self.unroll_steps:
                        for extra in extras:
                            cfg = Config(self.sketch.name, tuple(tiles), par, vec, unroll, extra)
                            if self.is_valid(cfg):
                                yield cfg

    # ---- a sensible hand-written default ----------------------------------------------------------
    def default(self) -> Config:
        """A reasonable untuned schedule: a register block of about 12 accumulators, reduction tiles near
        256, parallel loops fused until there are enough chunks for every core."""
        return default_config(self)


def check_tiles(axes, levels, tiles) -> None:
    """Raise ``ValueError`` naming the axis unless ``tiles`` has one tuple of ``levels[i]`` positive
    sizes per axis whose product is the axis's extent (shared by every sketch's ``validate``)."""
    if len(tiles) != len(axes):
        raise ValueError(f"tiles: expected {len(axes)} axes ({', '.join(a.name for a in axes)}), got {len(tiles)}")
    for a, lv, t in zip(axes, levels, tiles):
        if len(t) != lv:
            raise ValueError(f"tiles[{a.name}]: expected {lv} levels, got {len(t)}")
        if any(not _fa.whole(x) or x < 1 for x in t) or math.prod(t) != a.extent:
            raise ValueError(f"tiles[{a.name}]={list(t)}: tile sizes must be positive integers and multiply to the "
                             f"extent {a.extent}")


def _depthwise_sketch(task: Task, target: Target, sketches: tuple[Sketch, ...]) -> Sketch:
    """The depthwise default (float32 / float16 / int8): ``conv_spatial_pack`` (vectors along channels)
    for float32 output planes narrower than one SIMD vector, or than two at stride 1; else ``dw_rows``,
    its column-padded variant where the width is not a multiple of the lanes (one vector plus a masked
    partial one per row, not scalar columns).

    Chosen on MobileNetV2's ten depthwise convs at 224x224 (quiet EPYC, 1 thread, the defaults in one C
    loop each): the exact ``dw_rows`` default fell back to scalar or 4-lane columns on widths 7, 14 and
    28 (192x28x28 stride 2: 0.188 ms; padded 0.111); on 7x7 outputs and 14x14 stride-1 ones the
    channel-vectorized sketch ran 1.07-2.2x the padded ``dw_rows`` (960x7x7: 0.097 vs 0.215 ms), on
    every wider plane 2-6x slower (32x112x112: 1.17 vs 0.22 ms).

    Example:
        >>> from codegen.ops import depthwise_conv2d
        >>> avx2 = Target.cpu(simd_lanes=8, vector_registers=16)
        >>> [_depthwise_sketch(t, avx2, sketches_for(t, avx2)).name for t in (
        ...     depthwise_conv2d(1, 32, 56, 56, kernel=3, padding=1), depthwise_conv2d(1, 32, 28, 28, kernel=3,
        ...     stride=2, padding=1), depthwise_conv2d(1, 32, 14, 14, kernel=3, padding=1))]
        ['dw_rows', 'dw_rows.pad_x16', 'conv_spatial_pack']
    """
    # in columns of at most 8: on 16-lane AVX-512 (Zen 4, 1 thread, benchmarks/conv_block_probe.py
    # --shapes depthwise) the lanes-relative thresholds sent 28-wide planes to conv_spatial_pack at
    # 0.4-0.5x the padded dw_rows (192x28x28: 14.3 vs 28.5 GFLOP/s) and padded 56-wide rows that the
    # exact kernel runs 1.09-1.37x faster (8-lane tails)
    lanes = min(int(target.simd_lanes), 8)
    width = task.contraction().axis("x").extent
    stride = tuple(task.p.get("stride", (1, 1)))
    narrow = width < lanes or (stride == (1, 1) and width < 2 * lanes)
    by_name = {s.name: s for s in sketches}
    if narrow and task.dtype == "float32" and "conv_spatial_pack" in by_name:
        return by_name["conv_spatial_pack"]
    if width % lanes:
        padded = next((s for s in sketches if s.base == DW_SKETCH and s.pad), None)
        if padded is not None:
            return padded
    return by_name[DW_SKETCH]


def default_sketch(task: Task, target: Target, *, winograd: bool = True) -> Sketch:
    """The sketch an untuned build uses: ``dw_rows`` for depthwise convs (float32, float16 and int8) (:mod:`codegen.depthwise`);
    ``conv_flat`` for float32 1x1 stride-1 unpadded convs on targets with a 6-row GEMM block (AVX2), where
    its 6 channels x 2 pixel vectors fit (:func:`_flat_default`, :mod:`codegen.flat`); on the same targets
    ``conv_im2col`` with that block for strided float32 convs, else ``conv_spatial_pack`` (:func:`_strided_default`);
    Winograd (unless ``winograd=False``) for float32 3x3 stride-1 convs with at least 6x6 output tiles, or fewer that
    waste little (:func:`codegen.winograd.prefer_by_default`): F(4x4, 3x3) where its 4x4 tiles cover the
    output with little waste, else F(2x2, 3x3) (:func:`codegen.winograd.default_variant`);
    for float32 matmul / dense and float32 convolutions whose output columns pad to the register block
    (:func:`codegen.padding.row_padded_sketch`), the row-padded ``gemm_packed`` / ``conv_spatial_pack``; else
    the first one, except for non-depthwise convolutions whose
    output rows are shorter than half a SIMD vector (e.g. 4x4 outputs with 16 lanes), where
    ``conv_direct`` could only vectorize 4 lanes along the width and ``conv_spatial_pack`` (vectorized
    along output channels) runs its default about 2x faster, and non-depthwise float16 / int8
    convolutions (``conv_spatial_pack`` too).

    Example:
        >>> from codegen.ops import conv2d
        >>> t = conv2d(1, 160, 4, 4, out_channels=960, kernel=1)
        >>> default_sketch(t, Target.cpu(simd_lanes=16, vector_registers=32)).name
        'conv_spatial_pack'
        >>> default_sketch(t, Target.cpu(simd_lanes=8, vector_registers=16)).name
        'conv_flat'
        >>> avx2 = Target.cpu(simd_lanes=8, vector_registers=16)
        >>> default_sketch(conv2d(1, 512, 7, 7, out_channels=128, kernel=1), avx2).name  # 49 pixels: not flat
        'conv_direct.pad_x8'
        >>> default_sketch(conv2d(1, 512, 7, 7, out_channels=512), Target.cpu(simd_lanes=8)).name  # 5x5 out
        'conv_spatial_pack'
        >>> default_sketch(conv2d(1, 64, 56, 56, out_channels=64, padding=1), Target.cpu(simd_lanes=8)).name
        'conv_winograd4'
        >>> default_sketch(conv2d(1, 256, 14, 14, out_channels=256, padding=1), Target.cpu(simd_lanes=8)).name
        'conv_winograd'
        >>> default_sketch(conv2d(1, 64, 56, 56, out_channels=128, kernel=1), avx2).name
        'conv_flat.pad_k132'
        >>> default_sketch(conv2d(1, 64, 56, 56, out_channels=128, kernel=3, padding=1, stride=2), avx2).name
        'conv_im2col.pad_k132'
        >>> default_sketch(conv2d(1, 256, 14, 14, out_channels=512, kernel=3, padding=1, stride=2), avx2).name
        'conv_spatial_pack'
    """
    sketches = sketches_for(task)
    if task.sparsity:  # its columns padded where the exact count takes vectors of under half the lanes
        padded, lanes = _sparse_padded(task, sketches[0], target), int(target.simd_lanes)
        exact = widest_vector(task.contraction().axis(sketches[0].vector_axis).extent, lanes, VEC_CHOICES)
        return padded if padded is not None and 2 * exact < lanes else sketches[0]
    if task.op == _blocked.OP:
        return _blocked.default_sketch(task, sketches_for(task, target), target)
    if task.op in ("matmul", "dense") and task.dtype == "float32" and not task.sparsity:
        # the full-height register block (6 rows x 2 vectors on AVX2) over rows padded to its multiple
        padded = row_padded_sketch(task, sketches[0], block_rows(int(target.vector_registers), REGISTER_RESERVE))
        if padded is not None:
            return padded
        padded = _gemm_padded_default(task, target, sketches[0])
        if padded is not None:
            return padded
    if _depthwise_applies(task):  # its own sketch: 1.1-2.6x conv_direct's default in a smoke run (issue 14)
        return _depthwise_sketch(task, target, sketches_for(task, target))
    if task.op == "conv2d":
        con = task.contraction()
        flat = _flat_default(task, target)
        if flat is not None:
            return flat
        strided = _strided_default(task, target, sketches)
        if strided is not None:
            return strided
        wg = _wg.default_variant(task, target) if winograd else None  # False: the direct default instead
        if wg is not None:
            return next(s for s in sketches if s.name == wg.sketch)
        pack = next((s for s in sketches if s.name == "conv_spatial_pack"), None)
        if pack is not None and task.dtype == "float32" and not task.sparsity:
            # output columns padded to the full-height register block (6 columns x 2 channel vectors on
            # AVX2): benchmarks/conv_block_probe.py
            padded = row_padded_sketch(task, pack, block_rows(int(target.vector_registers), REGISTER_RESERVE))
            unpadded = not any(lo or hi for lo, hi in con.pad)
            strided = tuple(task.p.get("stride", (1, 1))) != (1, 1)
            if padded is not None and (strided or (unpadded and con.axis("k").extent < 128)):
                # no input padding: the padded variant's timed copy of the whole input is extra work, paid
                # back only over many output channels (quiet EPYC, 1 thread, exact vs padded: 1x1 convs
                # 144->24 at 56x56 1.05x vs 0.82x onnxruntime, 192->64 at 35x35 1.18x vs 0.78x; 256->256 at
                # 14x14 0.83x vs 0.94x); nor at stride 2 (64->128 3x3 at 56x56: 0.68x / 0.70x exact vs
                # 0.66x / 0.61x padded, 1 / 2 threads)
                return pack
            if padded is not None:
                return padded
        if pack is not None and pack.vector_axis == "k" and 2 * con.axis("x").extent < int(target.simd_lanes):
            return pack
        if pack is not None and task.dtype != "float32":
            # float16 / int8: conv_direct broadcasts a weight that must be widened per use; the packed
            # sketch widens weight vectors and can take int8 pairs (1x1 conv 64x256x28x28 on the AVX2
            # EPYC, defaults: 3x faster at fp16 and int8, 1.5x on the 3x3 conv)
            return pack
        lanes = int(target.simd_lanes)
        width = con.axis("x").extent
        if width % lanes:
            # conv_direct would vectorize a partial width (7 columns: scalar; a 512x7x7 conv ran its
            # default at 0.05x onnxruntime): its column-padded variant where that adds at most 15%
            # (7 -> 8: 16.7 GFLOP/s vs 10.7 channel-vectorized), else the channel-vectorized sketch
            # (12 x 12: 24.3 vs 14.1 padded to 16; 4 x 4: 14.0 vs 10.0; busy AVX2 EPYC, interleaved)
            padded = padded_sketch(task, sketches[0], lanes)
            if padded is not None and dict(padded.pad).get("x", width) <= 1.15 * width:
                return padded
            if pack is not None and pack.vector_axis == "k":
                return pack
    return sketches[0]


#: whether float32 matmuls default to their row-padded ``gemm_packed`` variant where its register
#: block reuses loads better (:func:`_gemm_padded_default`); ``benchmarks/gemm_split_probe.py
#: --sketch`` turns it off to time the old choice
GEMM_PADDED_DEFAULT = True


def _gemm_padded_default(task: Task, target: Target, exact: Sketch) -> Sketch | None:
    """``gemm_packed``'s row-padded variant (:func:`codegen.padding.padded_sketch`: M up to a multiple of
    8) where its default register block, discounted by the padded rows' share, reuses each load at least
    10% more than the exact sketch's default block (:func:`codegen.gemm_default.block_reuse`): a prime M (197 ViT
    tokens, 257) gives the exact sketch 1-row blocks, 16 FMAs per 17 loads; padded, 8 rows x 2 vectors
    do 16 per 10. On targets with AVX2's 6-row block :func:`codegen.padding.row_padded_sketch` decides
    first. Zen 4, 2 threads: 197x768x768 97 -> 226 GFLOP/s, 257x96x384 114 -> 213
    (``benchmarks/gemm_split_probe.py --sketch``)."""
    if not GEMM_PADDED_DEFAULT:
        return None
    pads = [s for s in sketches_for(task, target) if s.base == exact.name and dict(s.pad).get("m") and len(s.pad) == 1]
    if not pads:
        return None
    ex_space, pad_space = Space(task, exact, target), Space(task, pads[0], target)
    share = task.contraction().axis("m").extent / dict(pads[0].pad)["m"]
    gain = (_gemm.block_reuse(pad_space, default_config(pad_space)) * share
            / _gemm.block_reuse(ex_space, default_config(ex_space)))
    return pads[0] if gain >= 1.1 else None


def _flat_default(task: Task, target: Target) -> Sketch | None:
    """``conv_flat`` (:mod:`codegen.flat`) with its 6 x 2-vector block where a 1x1 convolution's channels
    and pixels allow it (padded: :func:`codegen.padding.row_padded_sketch`), else None, on targets with a
    6-row GEMM block (AVX2, where it was measured: 256x14x14 -> 1024, 55 -> 74-79 GFLOP/s). Elsewhere its
    pixel-padded variant where that runs masked in place (:func:`codegen.padding.masked_tail`: pixels not a
    multiple of the lanes, at least 4 vectors of them): on AVX-512 (1 thread, ``benchmarks/conv_block_probe.py
    --shapes 1x1|1x1-heldout``) the fastest sketch default on all 5 such convs of the first set (1.01-1.73x
    onnxruntime, the previous defaults 0.88-1.46x)."""
    rows, lanes = block_rows(int(target.vector_registers), REGISTER_RESERVE), int(target.simd_lanes)
    if not _flat.applies(task):
        return None
    sketch = Sketch(_flat.FLAT_SKETCH, "x", "k")
    if not rows:  # no 6-row block (AVX-512): the pixel-padded variant where it runs masked, in place
        padded = padded_sketch(task, sketch, lanes)
        return padded if padded is not None and masked_tail(task, padded, target) == "data" else None
    padded = row_padded_sketch(task, sketch, rows, lanes)
    if padded is not None:
        return padded
    p = task.p
    return sketch if p["k"] % rows == 0 and (p["h"] * p["w"]) % (2 * lanes) == 0 else None


def _strided_default(task: Task, target: Target, sketches: tuple[Sketch, ...]) -> Sketch | None:
    """For strided float32 convolutions on targets with a 6-row GEMM block (AVX2): ``conv_im2col`` with
    that block (:func:`codegen.padding.row_padded_sketch`) where its channels and pixels allow it, else
    ``conv_spatial_pack``; None elsewhere. Quiet EPYC, after the im2col gather lost its per-pixel bounds
    check (session 8, ``benchmarks/conv_block_probe.py --shapes strided``): on 8 stems and downsampling
    convs the new default beat the previous one on 8 at 1 thread and 6 at 2 (geomean 1.34x / 1.27x;
    ``conv_spatial_pack`` replaced ``conv_direct.pad_x8`` on a 7x7-output one: 0.85x vs 0.42x onnxruntime);
    on 6 strided convs not used to choose it (``--shapes strided-heldout``): 4 and 3 of 6, geomean 1.23x /
    1.09x (docs/BENCHMARKS.md)."""
    rows, lanes = block_rows(int(target.vector_registers), REGISTER_RESERVE), int(target.simd_lanes)
    if not rows or not _flat.im2col_applies(task):
        return None
    padded = row_padded_sketch(task, Sketch(_flat.IM2COL_SKETCH, "x", "k"), rows, lanes)
    return padded if padded is not None else next((s for s in sketches if s.name == "conv_spatial_pack"), None)


def _register_block_default(space: Space, vec: int) -> tuple[dict[str, int], int]:
    """``S3`` tiles of a default register block and its vector width: the vector axis 1-2 vectors wide
    (2 preferred), rows from the largest other spatial axes (greedy, divisors), whichever uses more of
    the defaults' accumulator budget (``Space.default_accumulators``). Rows on the output columns ``x``
    come first among equally long axes when the block is vectorized over channels
    (``conv_spatial_pack``: contiguous broadcasts).

    A 7-column output (512x7x7 conv) gets 7 rows x 1 vector (7 accumulators) instead of 1 x 2.

    ``conv_direct`` of a convolution strided along its columns (:func:`strided_channel_rows`): one vector,
    rows from the output channels first."""
    axes = space.axes
    vi = space.vector_index
    vname, vec_extent = axes[vi].name, axes[vi].extent
    others = [a for a in axes if not a.reduce and a.name != vname]
    if vname == "k":  # x before y on ties (a stable sort keeps this order)
        others = sorted(others, key=lambda a: a.name != "x")
    others = sorted(others, key=lambda a: -a.extent)
    widths = ((2, 1) if vec > 1 else (None,))
    cap = space.default_accumulators
    if vec > 1 and strided_channel_rows(space):
        others = sorted(others, key=lambda a: a.name != space.sketch.weight_axis)
        widths, cap = (1,), max(1, min(STRIDED_ROWS_CAP, space.max_accumulators))
    best = None
    for j in widths:
        s3 = {a.name: 1 for a in axes}
        if j is None:
            s3[vname], v = _largest_divisor_leq(vec_extent, 4), vec
        else:
            s3[vname] = _largest_divisor_leq(vec_extent, j * vec, vec)
            v = vec
        if s3[vname] < v:
            v = max(c for c in space.vec_choices if s3[vname] % c == 0)
        budget = max(1, cap // max(1, s3[vname] // v))
        for a in others:
            if budget <= 1:
                break
            d = _largest_divisor_leq(a.extent, budget)
            s3[a.name] = d
            budget //= d
        acc = math.prod(s3[a.name] for a in others) * max(1, s3[vname] // v)
        if best is None or acc > best[0]:
            best = (acc, s3, v)
    return best[1], best[2]


#: whether ``conv_direct``'s default blocks registers over output channels when its columns are strided
#: (:func:`strided_channel_rows`); ``benchmarks/strided_direct_probe.py`` turns it off to time the old block
STRIDED_CHANNEL_ROWS = True
#: the most accumulators (rows of channels) of that block, within the register file's budget (28 on
#: AVX-512, 12 on AVX2): 24 against 12 on Zen 4, 10 held-out strided convs, 15 defaults: 1.08x / 1.07x
#: geomean (1 / 2 threads; 0.90-1.26x)
STRIDED_ROWS_CAP = 24


def strided_channel_rows(space: Space) -> bool:
    """Whether the default register block of ``space`` spans one vector of output columns by rows of
    output channels: ``conv_direct`` (and its padded variants) of a convolution strided along its
    columns. Each strided data vector costs two loads and a permute (:meth:`CStyleRenderer._load`) and
    feeds one FMA per row; rows of output channels share it (one broadcast weight each), rows of output
    rows or a second vector need their own. 3x128x128 -> 32 5x5 stride 2 on Zen 4 (AVX-512, 1 / 2
    threads): the old default (4 output rows x 2 vectors) 13-18 / 34 GFLOP/s, 8 channels x 1 vector
    105 / 181-190, 16 channels (:data:`STRIDED_ROWS_CAP`) 108 / 192-198, onnxruntime 77-80 / 133-141;
    on 10 strided convs not looked at, 8 channels x 1 vector ran 2.87x / 2.69x the old default
    (geomean of 9 changed defaults, min 1.19x) (``benchmarks/strided_direct_probe.py``,
    docs/BENCHMARKS.md "Issue 14, session 20").

    Example:
        >>> from codegen.ops import conv2d
        >>> t = conv2d(1, 3, 128, 128, out_channels=32, kernel=5, stride=2, padding=2)
        >>> avx512 = Target.cpu(simd_lanes=16, vector_registers=32)
        >>> [tl[3] for tl in default_config(Space(t, "conv_direct", avx512)).tiles[2:5]]  # k y x
        [16, 1, 16]
        >>> avx2 = Target.cpu(simd_lanes=8, vector_registers=16)
        >>> [tl[3] for tl in default_config(Space(t, "conv_direct", avx2)).tiles[2:5]]
        [8, 1, 8]
    """
    if not STRIDED_CHANNEL_ROWS or space.sketch.base != "conv_direct" or space.task.op != "conv2d":
        return False
    return tuple(space.task.p.get("stride", (1, 1)))[-1] > 1


def _channel_panel_cap(space: Space, s3: dict[str, int], vec: int) -> int:
    """``conv_spatial_pack``: the most input channels per reduction tile whose weight panel (``S3`` of the
    channels x input channels x taps, float32) fills at most half of L1, as a GEMM's ``kc`` does; 0 for
    other sketches. Conv 64x56x56 3x3, 6 x 2-vector block (busy AVX2 EPYC, CPU time, standalone): the
    whole 36 KiB panel 58-60 GFLOP/s, 16 channels (9 KiB) 60-65."""
    if space.sketch.base != "conv_spatial_pack" or space.sketch.vector_axis != "k":
        return 0
    taps = math.prod(a.extent for a in space.axes if a.reduce and a.name != "c")
    l1 = int(getattr(space.target, "l1d_bytes", 0) or 32768)
    return max(1, (l1 // 2) // (4 * s3.get("k", vec) * max(1, taps)))


def default_config(space: Space) -> Config:
    if space.sketch.base == SPARSE_SKETCH:
        return _sparse_default(space)
    own = {"gemm_packed": _gemm.default_schedule, DW_SKETCH: _depthwise_default, _wg.WG_SKETCH: _wg.default_schedule,
           _wg.WG4_SKETCH: _wg.default_schedule, _blocked.SKETCH: _blocked.default_schedule, _blocked.FLAT_SKETCH: _blocked.default_schedule,
           _blocked.DW_SKETCH: _blocked.dw_default_schedule}
    if space.sketch.base in own:
        cfg = Config(space.sketch.name, *own[space.sketch.base](space))
        space.validate(cfg)
        return cfg
    axes = space.axes
    vi = space.vector_index
    vec_extent = axes[vi].extent
    vec = max([v for v in space.vec_choices if vec_extent % v == 0] or [1])
    s3, vec = _register_block_default(space, vec)
    tiles = []
    cap_c = _channel_panel_cap(space, s3, vec)
    # int8 packed convs: the kernel taps in R0, so the input-channel loop is the innermost R1 loop and
    # takes int8 pairs / groups of four (codegen.lower.int8_pairs; 1-byte weights, so up to 256
    # channels). AVX2 EPYC, 7-bit weights, CPU time, busy machine: conv 64x56x56 3x3 32.6 -> 135 GOP/s;
    # 1x1 256x28x28 -> 128 81 -> 128 (the group loop then spans every channel)
    int8_taps = space.task.quantized and space.sketch.base == "conv_spatial_pack"
    for a in axes:
        if a.reduce and int8_taps:
            inner = _largest_divisor_leq(a.extent, 256) if a.name == "c" else 1
            tiles.append((a.extent // inner, inner))
        elif a.reduce:
            gemm = space.sketch.base in (_flat.FLAT_SKETCH, _flat.IM2COL_SKETCH)  # kc 256: 2 pixel vectors, L1 / 2
            inner = _largest_divisor_leq(a.extent, 256 if gemm or len(space.con.reduction) == 1 else 64)
            if a.name == "c" and cap_c:
                inner = _largest_divisor_leq(a.extent, min(inner, cap_c))
            tiles.append((a.extent // inner, inner))
        else:
            rest = a.extent // s3[a.name]
            # S2: a few register blocks so a tile of outputs stays in L1
            s2 = _largest_divisor_leq(rest, 4)
            rest //= s2
            tiles.append((rest, 1, s2, s3[a.name]))
    if space.sketch.base in (_flat.FLAT_SKETCH, _flat.IM2COL_SKETCH):
        tiles = _flat_order(space, tiles)
    # fuse outer loops until there are at least 2 chunks per core
    cores = int(getattr(space.target, "cores", 1) or 1)
    par, chunks = 0, 1
    for i, a in enumerate(axes[: space.n_spatial]):
        if chunks >= 2 * cores:
            break
        par, chunks = i + 1, chunks * tiles[i][0]
    cfg = Config(space.sketch.name, tuple(tiles), par, vec, 16)
    space.validate(cfg)
    return cfg


def _flat_order(space: Space, tiles: list) -> list:
    """The loop order of ``conv_flat`` and ``conv_im2col``: pixel blocks outermost, every channel block inside (``k`` wholly in
    ``S2``), when the weights fit half of L2 and the image does not, so each block of pixels is read
    once and the weights stay in L2; else channel blocks outermost (the image is re-read from L2 per
    block). 1 thread, AVX2 EPYC: 192x35x35 -> 64 (a 0.9 MiB image) ran its channels-outer default at
    50 GFLOP/s against 56 for ``conv_spatial_pack``."""
    names = [a.name for a in space.axes]
    ext = {a.name: a.extent for a in space.axes}
    half_l2 = int(getattr(space.target, "l2_bytes", 0) or 524288) // 2
    if 4 * ext["k"] * ext["c"] > half_l2 or 4 * ext["c"] * ext["x"] <= half_l2:
        return tiles
    k, x = names.index("k"), names.index("x")
    tiles[k] = (1, 1, ext["k"] // tiles[k][3], tiles[k][3])
    tiles[x] = (ext["x"] // tiles[x][3], 1, 1, tiles[x][3])
    return tiles


def _sparse_default(space: Space) -> Config:
    """The sparse sketch's default (:mod:`codegen.sparse`): CSR (1 x 1 blocks: unstructured zeros leave
    few all-zero blocks of more weights); with more than one column per weight row (``S > 1``), a
    register block of one row x up to 8 vectors along ``s``; with one (a batch-1 dense layer), 8
    partial sums per row (``unroll``); every row in parallel."""
    vi = space.vector_index
    ext = {a.name: a.extent for a in space.axes}
    v, wa = space.sketch.vector_axis, space.sketch.weight_axis
    vec = max([c for c in space.vec_choices if ext[v] % c == 0] or [1])
    ts = _largest_divisor_leq(ext[v], min(8, space.max_accumulators) * vec, vec) if vec > 1 else 1
    br = 1
    tiles = []
    for i, a in enumerate(space.axes):
        if a.reduce:
            tiles.append((a.extent, 1))
        else:
            s3 = ts if i == vi else (br if a.name == wa else 1)
            tiles.append((a.extent // s3, 1, 1, s3))
    # one column: 8 partial sums per row (4 ran ~20% slower on a 90%-sparse 1024x1024 layer here)
    cfg = Config(space.sketch.name, tuple(tiles), space.n_spatial, vec, 4 if ext[v] > 1 else 8)
    space.validate(cfg)
    return cfg
