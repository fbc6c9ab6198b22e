"""The relaxation of declared knobs (:mod:`codegen.knobs`): one continuous coordinate per knob.

Every registered knob owns one of :data:`~codegen.knobs.MAX_EXTRA_KNOBS` fixed slots of ``x``
(``x[I_EXTRA + slot]``, see :mod:`felixjax.relax`), the same slot in every space; where the knob does
not apply to the sketch the slot is masked (bounds [0, 0], value 0). A slot's coordinate is

* ``"index"`` knobs: the position in the sorted domain (0 .. n − 1); between two integers the value
  is interpolated linearly;
* ``"log2"`` knobs: ``log2(value)``, the value ``2**x``.

Allowed coordinates are the *points* of the domain; rounding takes the nearest point, a neighbour
step goes to the next point up or down (as the vector width does).

The arrays here have fixed shapes (``[E]``, ``[E, V]`` with ``V = MAX_KNOB_VALUES``), so they ride
in :class:`~felixjax.relax.RelaxedSpace` and one compilation serves every space.
"""
from __future__ import annotations

import numpy as np

from codegen.knobs import MAX_EXTRA_KNOBS, MAX_KNOB_VALUES, knob_slot
from codegen.space import Config, Space

E, V = MAX_EXTRA_KNOBS, MAX_KNOB_VALUES
FIELDS = ("extra_mask", "extra_lo", "extra_hi", "extra_log2", "extra_points", "extra_values")


def knob_arrays(space: Space) -> dict[str, np.ndarray]:
    """The fixed-shape description of the space's declared knobs (float32 numpy), by field name.

    ``extra_points [E, V]`` and ``extra_values [E, V]`` are padded past a domain's end with points
    ``hi + 1, hi + 2, ...`` and the last value, so interpolation inside ``[lo, hi]`` never sees them.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.target import Target
        >>> a = knob_arrays(Space(matmul(8, 8, 8), "gemm_packed", Target()))
        >>> a["extra_mask"].tolist()
        [0.0, 0.0, 0.0, 0.0]
    """
    f32 = np.float32
    out = {"extra_mask": np.zeros(E, f32), "extra_lo": np.zeros(E, f32), "extra_hi": np.zeros(E, f32),
           "extra_log2": np.zeros(E, f32), "extra_points": np.tile(np.arange(V, dtype=f32), (E, 1)),
           "extra_values": np.zeros((E, V), f32)}
    for k in space.knobs:
        s = knob_slot(k.name)
        pts, vals = k.points(space), k.values(space)
        n = len(pts)
        out["extra_mask"][s] = 1.0
        out["extra_lo"][s], out["extra_hi"][s] = pts[0], pts[-1]
        out["extra_log2"][s] = float(k.relax == "log2")
        out["extra_points"][s, :n] = pts
        out["extra_points"][s, n:] = pts[-1] + np.arange(1, V - n + 1)
        out["extra_values"][s, :n] = vals
        out["extra_values"][s, n:] = vals[-1]
    return out


def knob_values(rs, xe, xp):
    """The value of every slot's knob ``[..., E]`` from the extra coordinates ``xe [..., E]`` of
    points (``x[..., I_EXTRA:]``; masked slots: 0).

    Differentiable with ``xp = jax.numpy`` (linear between the points of an index knob, ``2**x`` for
    a log2 knob); exact at integer points.
    """
    cols = []
    for s in range(E):
        c = xp.clip(xe[..., s], rs.extra_lo[s], rs.extra_hi[s])
        lin = xp.interp(c, rs.extra_points[s], rs.extra_values[s])
        cols.append(rs.extra_mask[s] * xp.where(rs.extra_log2[s] > 0, xp.exp2(c), lin))
    return xp.stack(cols, axis=-1)


def project_extra(rs, xe, xp):
    """Clip the extra coordinates ``[..., E]`` to their bounds (masked slots to 0)."""
    return xp.clip(xe, rs.extra_lo, rs.extra_hi) * rs.extra_mask


def from_uniform(rs, u, xp):
    """Points uniform on every slot's interval from ``u ~ U(0, 1) [n, E]`` (masked slots: 0)."""
    return (rs.extra_lo + u * (rs.extra_hi - rs.extra_lo)) * rs.extra_mask


class KnobCoder:
    """The integer side of one space's declared knobs (numpy): encoding, rounding, validity, steps."""

    def __init__(self, space: Space):
        self.space = space
        self.knobs = [(k, knob_slot(k.name)) for k in space.knobs]
        self.points = {s: np.array(k.points(space)) for k, s in self.knobs}
        self.values = {s: np.array(k.values(space), np.int64) for k, s in self.knobs}
        self.defaults = {s: k.default_value(space) for k, s in self.knobs}
        self.mask = np.zeros(E, bool)
        for _, s in self.knobs:
            self.mask[s] = True

    def encode(self, config: Config) -> np.ndarray:
        """The coordinates ``[E]`` of a config's knobs (defaults for those it leaves out)."""
        xe = np.zeros(E, np.float32)
        for k, s in self.knobs:
            v = self.space.knob_value(config, k)
            hit = np.flatnonzero(self.values[s] == v)
            if not len(hit):
                raise ValueError(f"{k.name}={v}: valid values are {tuple(self.values[s].tolist())}")
            xe[s] = self.points[s][hit[0]]
        return xe

    def round(self, xe: np.ndarray) -> np.ndarray:
        """The nearest point of every slot ``[B, E]`` (ties to the lower one); masked slots 0."""
        out = np.zeros(xe.shape, np.float64)
        for _, s in self.knobs:
            p = self.points[s]
            out[:, s] = p[np.argmin(np.abs(xe[:, s, None] - p[None, :]), axis=1)]
        return out

    def valid(self, xe: np.ndarray) -> np.ndarray:
        """Rows ``[B, E]`` whose slots hold allowed points (masked slots exactly 0)."""
        ok = np.all(xe[:, ~self.mask] == 0, axis=1)
        for _, s in self.knobs:
            ok &= np.isin(xe[:, s], self.points[s])
        return ok

    def extra(self, xe: np.ndarray) -> list[tuple[tuple[str, int], ...]]:
        """``Config.extra`` of every integer row ``[B, E]`` (default values left out)."""
        cols = []
        for k, s in self.knobs:
            idx = np.clip(np.searchsorted(self.points[s], xe[:, s]), 0, len(self.points[s]) - 1)
            cols.append((k.name, self.values[s][idx].tolist(), self.defaults[s]))
        if not cols:
            return [()] * len(xe)
        return [tuple((name, v[i]) for name, v, d in cols if v[i] != d) for i in range(len(xe))]

    def steps(self, x: np.ndarray, offset: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Copies of integer points ``x [B, N_X]`` with one knob moved to its next point down or up
        (``x[:, offset + slot]`` is the knob's coordinate), each with the rows of ``x`` it came from."""
        out = []
        for _, s in self.knobs:
            p = self.points[s]
            idx = np.searchsorted(p, np.rint(x[:, offset + s]))
            for step in (-1, 1):
                j = idx + step
                ok = (j >= 0) & (j < len(p))
                y = x[ok].copy()
                y[:, offset + s] = p[j[ok]]
                out.append((y, np.flatnonzero(ok)))
        return out
