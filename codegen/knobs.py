"""Declared knobs: a scalar schedule knob is one :class:`Knob` record, registered once.

A knob's declaration holds everything every stage needs, next to each other:

* ``name`` and the ``sketches`` it applies to (``()``: every sketch; ``"<sketch>.pad_*"``: that sketch's
  padded variants, :mod:`codegen.padding`, which otherwise take no declared knobs);
* ``domain(space) -> tuple[int, ...]`` (or a fixed tuple) and ``default(space) -> int`` (or an int);
* ``relax``: how the relaxation sees it, ``"index"`` (the continuous coordinate is the position in
  the sorted domain; values in between are interpolated linearly) or ``"log2"`` (value = 2**x; the
  domain must be powers of two);
* ``lower(plan, value) -> Plan``: adjusts the lowered plan; typically :func:`add_hook` to emit lines
  at a named renderer :data:`SITES` (e.g. a prefetch in the reduction loop);
* ``features(xp, value, info) -> dict[str, value]``: the knob's global features (raw values; the
  feature code takes ``log(1 + v)`` of every feature), written against the array module ``xp``
  (numpy or ``jax.numpy``, passed in by felixjax: ``codegen`` itself never imports jax). ``value``
  is a float (array) in soft mode; ``info`` holds quantities of the loop nest (:data:`INFO_KEYS`).
  The dict's keys are ``feature_names``;
* ``mutation_weight``: its weight among the genetic search's mutation kinds.

Every stage iterates over the registered knobs generically: :class:`codegen.space.Space`
(validation, sampling, enumeration, defaults), :func:`codegen.lower.lower` (the ``lower`` hook),
the C-family renderer (hook sites), :mod:`felixjax.relax` (one extra coordinate per knob, in one of
:data:`MAX_EXTRA_KNOBS` fixed slots, masked where the knob does not apply, so one compilation
serves every shape), :mod:`felixjax.features` and :mod:`felixjax.extract` (the knob's features
fill :data:`MAX_KNOB_FEATURES` reserved global slots, zero otherwise) and the genetic codec. A
:class:`~codegen.space.Config` carries the knob's value in ``extra`` only when it differs from the
default, so configs (and database keys) of programs that do not use a knob never change.

Register knobs before building spaces and relaxations (they read the registry when built).

Example:
    >>> k = Knob("demo", ("gemm_packed",), (0, 1, 2), 0, features=lambda xp, v, info: {"demo": v},
    ...          feature_names=("demo",))
    >>> _ = register_knob(k)
    >>> [kn.name for kn in knobs_for("gemm_packed")], knobs_for("conv_direct")
    (['demo'], ())
    >>> unregister_knob("demo")
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

MAX_EXTRA_KNOBS = 8  # continuous coordinates the relaxation reserves for declared knobs (3 are taken by the
# built-in ones: sparse_bc and sparse_density of codegen.sparse, dw_stage of codegen.depthwise)
MAX_KNOB_FEATURES = 4  # global feature slots reserved for declared knobs' features
MAX_KNOB_VALUES = 32  # values in one knob's domain
RELAX_KINDS = ("index", "log2")
CORE_KNOBS = ("sketch", "tiles", "tile", "parallel", "vec", "unroll", "extra")
#: renderer sites a lowering hook can emit lines at: the start of the kernel body, around the
#: register block's reduction (``R1``) loops, and inside them before the operand loads
SITES = ("kernel_begin", "r1_before", "r1_body", "r1_after")
#: the loop-nest quantities passed to a knob's feature hook (``info``): trip counts of every loop
#: level, vector width, unroll, element bytes, FLOPs
INFO_KEYS = ("trips_S0", "trips_S1", "trips_R0", "trips_S2", "trips_R1", "trips_S3", "vec", "unroll",
             "elem_bytes", "flops")


@dataclass(frozen=True)
class Knob:
    """One scalar schedule knob (see the module docstring)."""

    name: str
    sketches: tuple[str, ...]
    domain: Callable[[Any], tuple[int, ...]] | tuple[int, ...]
    default: Callable[[Any], int] | int
    relax: str = "index"
    lower: Callable[[Any, int], Any] | None = None
    features: Callable[[Any, Any, dict], dict] | None = None
    feature_names: tuple[str, ...] = ()
    mutation_weight: float = 0.01
    doc: str = ""

    def applies(self, sketch: str) -> bool:
        if not self.sketches or sketch in self.sketches:
            return True
        base, sep, _ = sketch.partition(".pad_")
        return bool(sep) and base + ".pad_*" in self.sketches

    def values(self, space) -> tuple[int, ...]:
        """The sorted domain on ``space``, checked (at most :data:`MAX_KNOB_VALUES` distinct ints;
        powers of two for ``"log2"``)."""
        dom = self.domain(space) if callable(self.domain) else self.domain
        vals = tuple(sorted({int(v) for v in dom}))
        if not vals or len(vals) > MAX_KNOB_VALUES:
            raise ValueError(f"knob {self.name!r}: its domain must hold 1..{MAX_KNOB_VALUES} values, got {len(vals)}")
        if self.relax == "log2" and any(v < 1 or v & (v - 1) for v in vals):
            raise ValueError(f"knob {self.name!r}: a 'log2' knob's values must be powers of two, got {vals}")
        return vals

    def default_value(self, space) -> int:
        v = int(self.default(space) if callable(self.default) else self.default)
        if v not in self.values(space):
            raise ValueError(f"knob {self.name!r}: default {v} is not in its domain {self.values(space)}")
        return v

    def points(self, space) -> tuple[float, ...]:
        """The continuous coordinate of each domain value (sorted like :meth:`values`)."""
        vals = self.values(space)
        return tuple(float(math.log2(v)) for v in vals) if self.relax == "log2" else tuple(
            float(i) for i in range(len(vals)))


@dataclass(frozen=True)
class Hook:
    """Lines a knob's lowering emits at a renderer site: ``emit(site) -> list[str]``."""

    site: str
    emit: Callable[["Site"], list[str]]
    knob: str = ""


@dataclass(frozen=True)
class Site:
    """What a hook sees where it emits: the plan, the renderer's dialect, the C pointer expressions of
    the operands at this point (``"data"``, ``"weight"``: the register block's base pointers, before
    the ``R1`` offset) and the live (extent > 1) loops of the level (``R1`` for the ``r1_*`` sites)."""

    name: str
    plan: Any
    dialect: Any
    pointers: dict
    loops: tuple


def add_hook(plan, site: str, emit: Callable[[Site], list[str]], knob: str = ""):
    """A copy of ``plan`` whose renderer also emits ``emit(site)`` at ``site`` (one of :data:`SITES`)."""
    if site not in SITES:
        raise ValueError(f"unknown renderer site {site!r}; valid: {', '.join(SITES)}")
    return replace(plan, hooks=tuple(plan.hooks) + (Hook(site, emit, knob),))


# ----------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------

_REGISTRY: dict[str, tuple[Knob, int, tuple[int, ...]]] = {}  # name -> (knob, x slot, feature slots)
_VERSION = [0]


def register_knob(knob: Knob) -> Knob:
    """Register a knob: it takes the lowest free relaxation slot and as many feature slots as it has
    ``feature_names``. Raises ``ValueError`` for a bad or duplicate declaration or when the reserved
    slots are full."""
    if not (knob.name.isidentifier() and knob.name.isascii()) or knob.name in CORE_KNOBS:
        raise ValueError(f"knob name {knob.name!r} must be an identifier other than {', '.join(CORE_KNOBS)}")
    if knob.name in _REGISTRY:
        raise ValueError(f"knob {knob.name!r} is already registered")
    if knob.relax not in RELAX_KINDS:
        raise ValueError(f"knob {knob.name!r}: relax must be one of {RELAX_KINDS}, got {knob.relax!r}")
    if knob.mutation_weight < 0:
        raise ValueError(f"knob {knob.name!r}: mutation_weight must be >= 0")
    if len(set(knob.feature_names)) != len(knob.feature_names) or (knob.features is None) != (not knob.feature_names):
        raise ValueError(f"knob {knob.name!r}: give features together with distinct feature_names")
    if not callable(knob.domain):  # a fixed domain as a tuple: the record stays hashable (registry_key)
        knob = replace(knob, domain=tuple(int(v) for v in knob.domain))
    sketches = (knob.sketches,) if isinstance(knob.sketches, str) else tuple(knob.sketches)
    knob = replace(knob, sketches=sketches, feature_names=tuple(knob.feature_names))
    used = {s for _, s, _ in _REGISTRY.values()}
    free = [s for s in range(MAX_EXTRA_KNOBS) if s not in used]
    if not free:
        raise ValueError(f"all {MAX_EXTRA_KNOBS} knob slots are taken (raise codegen.knobs.MAX_EXTRA_KNOBS)")
    fused = {f for _, _, fs in _REGISTRY.values() for f in fs}
    ffree = [f for f in range(MAX_KNOB_FEATURES) if f not in fused]
    if len(ffree) < len(knob.feature_names):
        raise ValueError(f"knob {knob.name!r} needs {len(knob.feature_names)} feature slots, {len(ffree)} are free "
                         f"(raise codegen.knobs.MAX_KNOB_FEATURES)")
    _REGISTRY[knob.name] = (knob, free[0], tuple(ffree[: len(knob.feature_names)]))
    _VERSION[0] += 1
    return knob


def unregister_knob(knob: Knob | str) -> None:
    """Remove a registered knob (by record or name); unknown names are ignored."""
    name = knob if isinstance(knob, str) else knob.name
    if _REGISTRY.pop(name, None) is not None:
        _VERSION[0] += 1


def registered() -> tuple[Knob, ...]:
    """Every registered knob, sorted by name."""
    return tuple(_REGISTRY[n][0] for n in sorted(_REGISTRY))


def knobs_for(sketch: str) -> tuple[Knob, ...]:
    """The registered knobs that apply to a sketch, sorted by name."""
    return tuple(k for k in registered() if k.applies(sketch))


def get_knob(name: str) -> Knob:
    try:
        return _REGISTRY[name][0]
    except KeyError:
        raise ValueError(f"no knob {name!r} is registered; registered: {sorted(_REGISTRY) or 'none'}") from None


def knob_slot(name: str) -> int:
    """The relaxation slot (0 .. MAX_EXTRA_KNOBS - 1) of a registered knob."""
    get_knob(name)
    return _REGISTRY[name][1]


def feature_slots(name: str) -> tuple[int, ...]:
    """The global feature slots (0 .. MAX_KNOB_FEATURES - 1) of a registered knob's features."""
    get_knob(name)
    return _REGISTRY[name][2]


def registry_version() -> int:
    """A counter bumped by every (un)registration."""
    return _VERSION[0]


def registry_key() -> tuple:
    """A hashable snapshot of the registry (knobs and their slots): compiled code that calls the
    knobs' hooks (the features) keys its caches on it, so a registration retraces it and the same
    registry again finds the earlier compilation."""
    return tuple((n,) + _REGISTRY[n] for n in sorted(_REGISTRY))
