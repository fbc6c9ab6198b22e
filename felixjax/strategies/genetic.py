"""Genetic search, faithful to Ansor's evolutionary search (the baseline of every comparison).

One round (Ansor ``SketchPolicy::SearchOneRound``; TVM MetaSchedule ``EvolutionarySearch``):

1. Initial population: the best ``int(measured_ratio * population)`` configs measured in this run
   plus random valid samples up to ``population`` (at least ``min_unmeasured`` of them).
2. ``generations`` generations. Each child: a parent drawn by roulette selection with weights
   proportional to the predicted normalized throughput ``exp(score - max score)`` (scores are
   predicted ``-log latency``, so this is ``best latency / latency``); with probability
   ``mutation_prob`` it is mutated by one of the kinds that can change its row (drawn by the target's
   weights: ``mutation_weights``, or the GPU table on a GPU target; a row no kind can change is copied),
   else copied. A mutated child that leaves the space is retried with a fresh parent and mutation
   (at most ``max_fail`` times, then the slot is dropped, as MetaSchedule does). No crossover
   (Ansor has none).
3. Every distinct unmeasured config scored in the round competes for a heap of the best
   ``2 n``; the round proposes the best ``n - int(eps_greedy * n)`` of it plus ``int(eps_greedy * n)``
   random valid unmeasured samples (3 of 64).

Mutation kinds and the default CPU weights (Ansor: TileSize 0.90, AutoUnroll 0.04, ComputeLocation
0.05, Parallel 0.01; our space has no compute location, so that mass goes to the parallel depth); on a
GPU target Ansor's GPU weights, TileSize 0.90 and AutoUnroll 0.10 (:data:`GPU_MUTATION_WEIGHTS`: the GPU
sketch's ``parallel``, its shared-memory staging switch, is a sketch rule in Ansor, not a mutation, so it
varies through the random samples). Each child draws its kind among those that can change its row (as
Ansor retries a mutation that does not apply): a knob that does not apply to the row's sketch, or
whose domain there has one value (``vec`` on a GPU), takes no share of that row's draw:

* ``tile`` (0.90): Ansor's MutateTileSize: pick an axis with extent > 1, a random order of its tile
  levels, the first level ``src`` in that order whose tile is > 1 and the next level ``dst``; move a
  divisor ``d > 1`` of ``tile[src]`` (uniform among its divisors) from ``src`` to ``dst``.
* ``unroll`` (0.04), ``parallel`` (0.05), ``vec`` (0.01): a new value, uniform among the others
  of the knob's domain.
* every declared knob (:mod:`codegen.knobs`), by its name, with its declaration's
  ``mutation_weight``: a new value, uniform among the others of its domain on the row's sketch.

The knob domains and constraints are exactly those of :class:`codegen.space.Space` (every strategy
searches the same space). Configs are handled as rows of one integer matrix (:class:`Codec`) so a
round of 2048 x 4 generations costs tens of milliseconds of numpy, not seconds of Python; the cost
model is called once per generation on the generation's new distinct configs.

Example:
    >>> import numpy as np, felixjax as fj
    >>> from felixjax.strategies import SearchContext
    >>> from codegen.space import Space, sketches_for
    >>> t, tg = fj.ops.matmul(64, 64, 64), fj.Target.cpu()
    >>> ctx = SearchContext(t, tg, {s.name: Space(t, s, tg) for s in sketches_for(t)}, np.random.default_rng(0))
    >>> cands = GeneticSearch(population=256).propose(ctx, 64)
    >>> len(cands), len(set(cands))
    (64, 64)
"""
from __future__ import annotations

import math
import numbers
import time
import warnings
from typing import Callable

import numpy as np

from codegen.knobs import registered
from codegen.space import Config, Space, factorizations, divisors

from ..context import PessimisticScorer, check_opening, check_pessimism, check_judge, check_ranker, judge_for
from .base import SearchContext, count_option, interleave, register, spread_picks

MUTATIONS = ("tile", "unroll", "parallel", "vec")
CPU_MUTATION_WEIGHTS = {"tile": 0.90, "unroll": 0.04, "parallel": 0.05, "vec": 0.01}
GPU_MUTATION_WEIGHTS = {"tile": 0.90, "unroll": 0.10}  # Ansor's GPU table (no vector or parallel mutation)
LEVELS = 4  # tile levels per axis in a row (reduction axes use the first 2; the rest stay 1)


def mutation_kinds() -> tuple[str, ...]:
    """The core mutation kinds, then one per registered declared knob (by name)."""
    return MUTATIONS + tuple(k.name for k in registered())


class Codec:
    """The configs of one task's sketches as rows of an int64 matrix, for vectorized search.

    Row layout: ``[sketch id, tiles (axes x 4 levels, reduction axes padded with 1), declared knobs,
    parallel, vec, unroll]``. Sketch ids index ``codec.sketches`` (sorted names). Every sketch of a
    task shares the task's axes; only the vector axis differs. The declared knobs (``codec.knobs``:
    those that apply to any of the sketches, sorted by name) hold their value, or -1 on a row whose
    sketch the knob does not apply to.

    Example:
        >>> import numpy as np, felixjax as fj
        >>> from codegen.space import Space, sketches_for
        >>> t, tg = fj.ops.matmul(32, 32, 32), fj.Target.cpu()
        >>> codec = Codec({s.name: Space(t, s, tg) for s in sketches_for(t)})
        >>> rows = codec.sample(np.random.default_rng(0), 5)
        >>> cfgs = codec.decode_many(rows)
        >>> all(codec.spaces[0].is_valid(c) for c in cfgs), bool((codec.encode_many(cfgs) == rows).all())
        (True, True)
    """

    def __init__(self, spaces: dict[str, Space]):
        self.sketches = sorted(spaces)
        self.sketch_id = {n: i for i, n in enumerate(self.sketches)}
        self.spaces = [spaces[n] for n in self.sketches]
        sp = self.spaces[0]
        for other in self.spaces[1:]:
            if ([(a.name, a.reduce) for a in other.axes] != [(a.name, a.reduce) for a in sp.axes]
                    or other.vec_choices != sp.vec_choices):
                raise ValueError(f"sketches of {sp.task.name} disagree on axes or vector widths")
        self.axes = sp.axes
        self.A = len(sp.axes)
        self.levels = np.array(sp.levels)
        # padded sketches (codegen.padding) tile other extents: one set of factorization tables per
        # distinct extent vector ("group"), the rows of a sketch decoded with its group's tables
        ext_rows = [tuple(a.extent for a in s.axes) for s in self.spaces]
        groups = sorted(set(ext_rows), key=ext_rows.index)
        self.group_of = np.array([groups.index(e) for e in ext_rows], dtype=np.int64)
        self.sketch_extents = np.array(ext_rows, dtype=np.int64)  # [sketches, axes]
        self.extents = self.sketch_extents.max(axis=0)
        self.spatial = np.array([not a.reduce for a in sp.axes])
        self.n_spatial = sp.n_spatial
        self.max_acc = sp.max_accumulators
        self.vec_axis = np.array([s.vector_index for s in self.spaces])
        self.vec_choices = np.array(sp.vec_choices, dtype=np.int64)
        self.unroll_choices = np.array(sp.unroll_steps, dtype=np.int64)  # larger valid values: the same kernels
        # declared knobs: per knob, per sketch id, its sorted domain (None where it does not apply)
        self.knobs = sorted({k.name: k for s in self.spaces for k in s.knobs}.values(), key=lambda k: k.name)
        self.knob_values = [[np.array(k.values(s), np.int64) if k.applies(s.sketch.name) else None
                             for s in self.spaces] for k in self.knobs]
        self.knob_defaults = [np.array([k.default_value(s) if k.applies(s.sketch.name) else -1 for s in self.spaces],
                                       np.int64) for k in self.knobs]
        self.c_extra = 1 + LEVELS * self.A
        self.width = 1 + LEVELS * self.A + len(self.knobs) + 3
        self.c_par, self.c_vec, self.c_unroll = self.width - 3, self.width - 2, self.width - 1
        # every ordered factorization of each axis, padded to 4 levels: uniform sampling is an index draw
        self._group_tables = [[np.array([f + (1,) * (LEVELS - lv) for f in factorizations(int(e), int(lv))],
                                        dtype=np.int64) for e, lv in zip(g, self.levels)] for g in groups]
        self.tables = self._group_tables[0]  # those of the first sketch's extents
        # divisors > 1 of every possible tile value (padded), for the tile-size mutation
        values = sorted({d for e in self.sketch_extents.ravel() for d in divisors(int(e))})
        self.values = np.array(values, dtype=np.int64)
        divs = [[d for d in divisors(v) if d > 1] or [1] for v in values]
        self.div_count = np.array([len(d) if v > 1 else 0 for d, v in zip(divs, values)], dtype=np.int64)
        self.div_table = np.ones((len(values), max(len(d) for d in divs)), dtype=np.int64)
        for i, d in enumerate(divs):
            self.div_table[i, : len(d)] = d
        self.mutable_axes = np.flatnonzero(self.extents > 1)
        # decoding: a tile vector's code (digits in base extent + 1) locates it in its axis's table
        self._weights = [(int(e) + 1) ** np.arange(LEVELS, dtype=np.int64) for e in self.extents]
        self._codes = [[tab @ w for tab, w in zip(tables, self._weights)] for tables in self._group_tables]
        self._code_order = [[np.argsort(c) for c in codes] for codes in self._codes]
        self._tuples = [[[tuple(int(x) for x in row[:lv]) for row in tab] for tab, lv in zip(tables, self.levels)]
                        for tables in self._group_tables]
        self._void = np.dtype((np.void, 8 * self.width))

    # ---- conversion ----------------------------------------------------------------------------
    def tiles(self, rows: np.ndarray) -> np.ndarray:
        """The tile block of ``rows`` as an ``(n, axes, 4)`` view."""
        return rows[:, 1: 1 + LEVELS * self.A].reshape(len(rows), self.A, LEVELS)

    def encode(self, cfg: Config) -> np.ndarray:
        row = np.ones(self.width, dtype=np.int64)
        row[0] = self.sketch_id[cfg.sketch]
        for a, t in enumerate(cfg.tiles):
            row[1 + LEVELS * a: 1 + LEVELS * a + len(t)] = t
        # an unroll above the drawn steps (a valid value from an older record) builds the top step's kernel
        row[self.c_par], row[self.c_vec] = cfg.parallel, cfg.vec
        row[self.c_unroll] = min(cfg.unroll, int(self.unroll_choices[-1]))
        for e, k in enumerate(self.knobs):
            row[self.c_extra + e] = cfg.knob(k.name, int(self.knob_defaults[e][row[0]]))
        return row

    def encode_many(self, cfgs) -> np.ndarray:
        cfgs = list(cfgs)
        if not cfgs:
            return np.empty((0, self.width), dtype=np.int64)
        return np.stack([self.encode(c) for c in cfgs])

    def decode_many(self, rows: np.ndarray) -> list[Config]:
        if len(rows) == 0:
            return []
        t = self.tiles(rows)
        idx = np.empty((len(rows), self.A), dtype=np.int64)
        grp = self.group_of[rows[:, 0]]
        for g in np.unique(grp).tolist():
            on = grp == g
            for a in range(self.A):  # each axis's tiles -> its row in the group's factorization table
                codes, order = self._codes[g][a], self._code_order[g][a]
                idx[on, a] = order[np.searchsorted(codes, t[on, a] @ self._weights[a], sorter=order)]
        names, grp = self.sketches, grp.tolist()
        knobs = rows[:, [0, self.c_par, self.c_vec, self.c_unroll]].tolist()
        extra = self._extra(rows) if self.knobs else [()] * len(rows)
        return [Config(names[k[0]], tuple(map(list.__getitem__, self._tuples[g], r)), k[1], k[2], k[3], e)
                for r, k, e, g in zip(idx.tolist(), knobs, extra, grp)]

    def _extra(self, rows: np.ndarray) -> list[tuple[tuple[str, int], ...]]:
        """``Config.extra`` of every row: the declared knobs that apply, at a value other than their default."""
        vals = rows[:, self.c_extra: self.c_extra + len(self.knobs)]
        keep = np.stack([vals[:, e] != d[rows[:, 0]] for e, d in enumerate(self.knob_defaults)], axis=1)
        names = [k.name for k in self.knobs]
        return [tuple((names[e], v[e]) for e in range(len(names)) if kp[e])
                for v, kp in zip(vals.tolist(), keep.tolist())]

    def keys(self, rows: np.ndarray) -> list[bytes]:
        """One hashable key per row (its bytes)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        return [bytes(v) for v in rows.view(self._void).ravel()]

    def rows(self, keys: list[bytes]) -> np.ndarray:
        """Inverse of :meth:`keys`."""
        return np.frombuffer(b"".join(keys), dtype=np.int64).reshape(len(keys), self.width).copy()

    def unique(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(first index of each distinct row, inverse map)``, distinct rows in first-seen order."""
        v = np.ascontiguousarray(rows, dtype=np.int64).view(self._void).ravel()
        _, first, inv = np.unique(v, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return first[order], rank[inv.ravel()]

    # ---- the space -----------------------------------------------------------------------------
    def valid(self, rows: np.ndarray) -> np.ndarray:
        """Vectorized :meth:`Space.is_valid` (tile products equal extents by construction)."""
        if len(rows) == 0:
            return np.zeros(0, dtype=bool)
        t = self.tiles(rows)
        vec = rows[:, self.c_vec]
        inner = t[np.arange(len(rows)), self.vec_axis[rows[:, 0]], LEVELS - 1]
        acc = np.prod(t[:, self.spatial, LEVELS - 1], axis=1) // np.maximum(vec, 1)
        ok = ((vec >= 1) & (inner % np.maximum(vec, 1) == 0) & (acc <= self.max_acc)
              & np.isin(vec, self.vec_choices) & np.isin(rows[:, self.c_unroll], self.unroll_choices)
              & (rows[:, self.c_par] >= 0) & (rows[:, self.c_par] <= self.n_spatial))
        for e, per_sketch in enumerate(self.knob_values):
            col = rows[:, self.c_extra + e]
            for sk, vals in enumerate(per_sketch):
                on = rows[:, 0] == sk
                ok[on] &= np.isin(col[on], vals) if vals is not None else col[on] == -1
        return self._strict(rows, ok)

    def _strict(self, rows: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Spaces with limits beyond the checks above (``strict_validation``, e.g. the GPU sketch's
        threads, shared memory and registers) also pass each remaining row through ``is_valid``."""
        if not any(getattr(s, "strict_validation", False) for s in self.spaces):
            return ok
        idx = np.flatnonzero(ok)
        for i, cfg in zip(idx.tolist(), self.decode_many(rows[idx])):
            ok[i] = self.spaces[int(rows[i, 0])].is_valid(cfg)
        return ok

    def _draw(self, rng: np.random.Generator, sketch: int, n: int) -> np.ndarray:
        rows = np.empty((n, self.width), dtype=np.int64)
        rows[:, 0] = sketch
        t = np.empty((n, self.A, LEVELS), dtype=np.int64)
        for a, table in enumerate(self._group_tables[self.group_of[sketch]]):
            t[:, a] = table[rng.integers(len(table), size=n)]
        rows[:, 1: 1 + LEVELS * self.A] = t.reshape(n, -1)
        rows[:, self.c_par] = rng.integers(0, self.n_spatial + 1, size=n)
        rows[:, self.c_vec] = self.vec_choices[rng.integers(len(self.vec_choices), size=n)]
        rows[:, self.c_unroll] = self.unroll_choices[rng.integers(len(self.unroll_choices), size=n)]
        for e, per_sketch in enumerate(self.knob_values):  # declared knobs, drawn last
            vals = per_sketch[sketch]
            rows[:, self.c_extra + e] = vals[rng.integers(len(vals), size=n)] if vals is not None else -1
        return rows

    def sample(self, rng: np.random.Generator, n: int, *, max_batches: int = 64) -> np.ndarray:
        """``n`` valid configs, each from a uniform sketch then uniform within it (as ``Space.sample``:
        a uniform ordered factorization per axis, uniform knobs, rejection of invalid draws)."""
        counts = np.bincount(rng.integers(len(self.sketches), size=n), minlength=len(self.sketches))
        parts = []
        for sk, want in enumerate(counts):
            got, batch = [], max(16, int(want * 2))
            have = 0
            for _ in range(max_batches):
                if have >= want:
                    break
                rows = self._draw(rng, sk, batch)
                rows = rows[self.valid(rows)]
                got.append(rows)
                have += len(rows)
                batch = max(16, int((want - have) / max(len(rows) / batch, 0.05) * 1.2))
            if got:
                parts.append(np.concatenate(got)[:want])
        if not parts:
            return np.empty((0, self.width), dtype=np.int64)
        rows = np.concatenate(parts)
        return rows[rng.permutation(len(rows))]

    def enumerate(self, *, chunk: int = 1 << 16):
        """Every valid config as row blocks (only sensible for small tasks)."""
        import itertools

        core = [(p, v, u) for p in range(self.n_spatial + 1) for v in self.vec_choices for u in self.unroll_choices]
        for sk in range(len(self.sketches)):
            extra = itertools.product(*[vals[sk].tolist() if vals[sk] is not None else [-1]
                                        for vals in self.knob_values])
            knobs = np.array([e + c for e in extra for c in core], dtype=np.int64)
            tables = self._group_tables[self.group_of[sk]]
            combos = itertools.product(*[range(len(t)) for t in tables])
            while True:
                idx = np.array(list(itertools.islice(combos, max(1, chunk // len(knobs)))), dtype=np.int64)
                if len(idx) == 0:
                    break
                t = np.stack([tables[a][idx[:, a]] for a in range(self.A)], axis=1).reshape(len(idx), -1)
                rows = np.empty((len(idx) * len(knobs), self.width), dtype=np.int64)
                rows[:, 0] = sk
                rows[:, 1: 1 + LEVELS * self.A] = np.repeat(t, len(knobs), axis=0)
                rows[:, self.c_extra:] = np.tile(knobs, (len(idx), 1))
                yield rows[self.valid(rows)]

    # ---- mutations -----------------------------------------------------------------------------
    def mutable_kinds(self, kinds: tuple[str, ...]) -> np.ndarray:
        """``[sketches, kinds]`` booleans: whether a mutation of that kind can change a row of that sketch
        (a tile to move, a second unroll / parallel / vector value, a declared knob that applies to the
        sketch with a second value there); a kind this codec does not know is never mutable."""
        names = [k.name for k in self.knobs]
        core = {"tile": len(self.mutable_axes) > 0, "unroll": len(self.unroll_choices) > 1,
                "parallel": self.n_spatial >= 1, "vec": len(self.vec_choices) > 1}
        out = np.zeros((len(self.spaces), len(kinds)), dtype=bool)
        for j, kind in enumerate(kinds):
            if kind in core:
                out[:, j] = core[kind]
            elif kind in names:
                vals = self.knob_values[names.index(kind)]
                out[:, j] = [v is not None and len(v) > 1 for v in vals]
        return out

    def mutate(self, rows: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
        """Mutated copies of ``rows`` by one mutation kind (possibly invalid: the caller checks)."""
        rows = rows.copy()
        n = len(rows)
        if n == 0:
            return rows
        if kind == "tile":
            axis = self.mutable_axes[rng.integers(len(self.mutable_axes), size=n)]
            lv = self.levels[axis]
            t = self.tiles(rows)  # a view: writes go to rows
            r = np.arange(n)
            cur = t[r, axis]  # (n, 4) copy
            # a random order of the axis's levels (levels beyond the axis's count sort last)
            keys = rng.random((n, LEVELS)) + (np.arange(LEVELS)[None, :] >= lv[:, None]) * 2.0
            perm = np.argsort(keys, axis=1)
            ordered = np.take_along_axis(cur, perm, axis=1)
            first = np.argmax(ordered > 1, axis=1)  # the axis has extent > 1, so some level is > 1
            src = perm[r, first]
            dst = perm[r, (first + 1) % lv]
            v = cur[r, src]
            j = np.searchsorted(self.values, v)
            d = self.div_table[j, (rng.random(n) * self.div_count[j]).astype(np.int64)]
            cur[r, src] //= d
            cur[r, dst] *= d
            t[r, axis] = cur
        elif kind == "unroll":
            rows[:, self.c_unroll] = _other_choice(rng, self.unroll_choices, rows[:, self.c_unroll])
        elif kind == "parallel":
            rows[:, self.c_par] = _other_choice(rng, np.arange(self.n_spatial + 1), rows[:, self.c_par])
        elif kind == "vec":
            rows[:, self.c_vec] = _other_choice(rng, self.vec_choices, rows[:, self.c_vec])
        elif kind in (names := [k.name for k in self.knobs]):
            c = self.c_extra + names.index(kind)
            for sk, vals in enumerate(self.knob_values[names.index(kind)]):
                on = rows[:, 0] == sk
                if vals is not None and on.any():  # rows of sketches the knob does not apply to stay
                    rows[on, c] = _other_choice(rng, vals, rows[on, c])
        else:
            raise ValueError(f"unknown mutation kind {kind!r}; valid: {', '.join(MUTATIONS + tuple(names))}")
        return rows


def _other_choice(rng: np.random.Generator, choices: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """A value of ``choices`` other than ``cur`` (uniform among the others); ``cur`` if there is none."""
    k = len(choices)
    if k < 2:
        return cur.copy()
    pos = np.searchsorted(choices, cur)
    return choices[(pos + 1 + rng.integers(k - 1, size=len(cur))) % k]


def selection_probs(scores: np.ndarray) -> np.ndarray:
    """Roulette weights: predicted normalized throughput ``exp(score - max score)``, normalized.

    Example:
        >>> selection_probs(np.log([1.0, 2.0, 1.0])).round(2).tolist()
        [0.25, 0.5, 0.25]
    """
    s = np.where(np.isnan(scores), -np.inf, np.asarray(scores, dtype=float))
    top = s.max() if len(s) else -np.inf
    if not np.isfinite(top):
        return np.full(len(s), 1.0 / max(len(s), 1))
    w = np.exp(s - top)
    return w / w.sum()


@register("genetic")
class GeneticSearch:
    """Ansor-style evolutionary search over the schedule space (see the module docstring).

    Args:
        population: individuals per generation (Ansor 2048; MetaSchedule 512).
        generations: generations per round (4).
        mutation_prob: probability that a child is mutated rather than copied (0.85).
        measured_ratio: share of the population seeded with the best measured configs (0.2).
        eps_greedy: share of each round's proposals that are random samples (0.05: 3 of 64).
        mutation_weights: relative weights of ``tile``, ``unroll``, ``parallel``, ``vec``
            (default :data:`CPU_MUTATION_WEIGHTS`, :data:`GPU_MUTATION_WEIGHTS` on a GPU target; given
            here, they apply to every target); missing kinds get weight 0. Declared knobs
            (:mod:`codegen.knobs`, registered when the search is made) are kinds too, with their
            declaration's ``mutation_weight`` unless named here. A row draws among the kinds that can
            change it (:meth:`Codec.mutable_kinds`), in these proportions. Weights are finite and >= 0, one
            of ``tile``, ``unroll``, ``parallel``, ``vec`` positive (else ``ValueError``).
        min_unmeasured: random samples in the initial population at least (50, as Ansor).
        max_fail: retries of a child whose mutation left the space (10, as MetaSchedule).
        scorer: the cost model: a :class:`felixjax.model.Scorer`, or a factory ``ctx -> Scorer``;
            ``None`` uses the context's scorer (in a tuning session, the model every task of the
            run shares).
        batch_size: proposals per round (64, Ansor's ``num_measures_per_round``).
        cost_model: a pretrained MLP checkpoint for the default scorer to start from (the same
            option and default, ``"auto"``, as the gradient strategy's: equal equipment).
        ranker, ranker_data: rank with a tree ranker once it is fitted (the same options as the
            gradient strategy's; ``None``: the cost model ranks).
        opening: ``"packaged"``: a task's first rounds are ranked by the pretrained checkpoint as loaded
            (the gradient strategy's option of the same name: equal equipment); ``"shared"`` (the default):
            by the shared model as the session's other tasks fine-tuned it.
        pessimism, pessimism_model: rank by the model's score minus ``pessimism`` times a pretrained
            ensemble's disagreement (the gradient strategy's option of the same name, applied where
            this search ranks: equal equipment). 0 (the default) turns it off. ``pessimism_share``
            below 1: the population evolves on the plain score and that share of the picks is the
            pessimistic score's best among the plain score's ``8 · n`` best, interleaved with the
            plain order (the gradient strategy's hedge).
        spread: the picks of a round keep this L1 distance apart in the relaxed integer space of their
            sketch (the gradient strategy's option of the same name, applied to the best ``8 · n`` of the
            heap: equal equipment; needs a scorer with ``relaxations``). 0 (the default) turns it off.
        judge, judge_weight: the best ``8 · n`` of the heap re-ranked by ``(1 − judge_weight) · score +
            judge_weight · judge's score``, the judge a second pretrained model fine-tuned on the run's
            measurements (the gradient strategy's option of the same name: equal equipment;
            :class:`felixjax.context.Judge`). ``None`` (the default) turns it off.

    Attributes:
        stats: cumulative seconds per phase (``sample_s``, ``evolve_s``, ``score_s``, ``pick_s``,
            ``propose_s``) and mutation counts (``attempted``, ``accepted`` per kind, ``copied``).
        last_round: what the last round did: ``seeds`` (measured configs in the initial population),
            ``init_random`` (its random samples), ``good`` and ``random`` (the picks), ``heap``
            (``(score, config)`` of the best unmeasured, best first), ``scores_by_generation``.

    Example:
        >>> GeneticSearch(population=512).name
        'genetic'
    """

    name = "genetic"

    def __init__(self, *, population: int = 2048, generations: int = 4, mutation_prob: float = 0.85,
                 measured_ratio: float = 0.2, eps_greedy: float = 0.05,
                 mutation_weights: dict[str, float] | None = None, min_unmeasured: int = 50, max_fail: int = 10,
                 scorer=None, batch_size: int = 64, cost_model: str | None = "auto", ranker: str | None = None,
                 ranker_data: str | None = None, pessimism: float = 0.0, pessimism_model: str = "packaged",
                 pessimism_share: float = 1.0, spread: float = 0.0, judge: str | None = None,
                 judge_weight: float = 0.5, opening: str = "shared"):
        self.kinds = mutation_kinds()
        declared = {k.name: k.mutation_weight for k in registered()}

        def normalized(table: dict) -> dict[str, float]:
            weights = {**declared, **table}
            unknown = set(weights) - set(self.kinds)
            if unknown:
                raise ValueError(f"unknown mutation kinds {sorted(unknown)}; valid: {', '.join(self.kinds)}")
            w = np.array([float(weights.get(k, 0.0)) for k in self.kinds])
            if not (np.isfinite(w).all() and (w >= 0).all()):
                bad = {k: float(v) for k, v in zip(self.kinds, w) if not (math.isfinite(v) and v >= 0)}
                raise ValueError(f"mutation weights must be finite and >= 0 (got {bad})")
            if not w[: len(MUTATIONS)].sum() > 0:  # a declared knob's kind applies to some sketches only
                raise ValueError(f"a positive weight for one of {', '.join(MUTATIONS)} is required (they apply to "
                                 "every task)")
            return dict(zip(self.kinds, (w / w.sum()).tolist()))

        for what, value, least in (("population", population, 1), ("generations", generations, 0),
                                   ("batch_size", batch_size, 1), ("min_unmeasured", min_unmeasured, 0),
                                   ("max_fail", max_fail, 0)):
            count_option(what, value, least)  # (64.7 was truncated, '64' a TypeError, max_fail=-1 a crash)
        for what, value in (("mutation_prob", mutation_prob), ("measured_ratio", measured_ratio),
                            ("eps_greedy", eps_greedy)):  # shares: outside [0, 1] a slice took the wrong rows
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ValueError(f"{what} must be in [0, 1] (got {value!r})")
        self.population, self.generations = int(population), int(generations)
        self.mutation_prob, self.measured_ratio, self.eps_greedy = mutation_prob, measured_ratio, eps_greedy
        #: the kinds' weights on a CPU target (and on every target when ``mutation_weights`` is given)
        self.mutation_weights = normalized(CPU_MUTATION_WEIGHTS if mutation_weights is None else mutation_weights)
        self._gpu_weights = (normalized(GPU_MUTATION_WEIGHTS) if mutation_weights is None
                             else self.mutation_weights)
        self.min_unmeasured, self.max_fail = int(min_unmeasured), int(max_fail)
        self.batch_size = int(batch_size)
        self._scorer_arg, self.cost_model = scorer, cost_model
        self.ranker, self.ranker_data = check_ranker(ranker, ranker_data)
        self.opening = check_opening(opening)
        self.pessimism, self.pessimism_share = check_pessimism(pessimism, pessimism_share)
        self.pessimism_model = pessimism_model
        if spread < 0:
            raise ValueError(f"spread must be >= 0 (got {spread})")
        self.spread = float(spread)
        self.judge, self.judge_weight = check_judge(judge, judge_weight)
        self._judges: dict = {}  # id(context) -> (context, Judge)
        self._scorers: dict[str, object] = {}
        self._said_unscored = False
        self._codecs: dict[tuple, Codec] = {}
        self.stats = {"rounds": 0, "sample_s": 0.0, "evolve_s": 0.0, "score_s": 0.0, "pick_s": 0.0,
                      "propose_s": 0.0, "scored": 0, "attempted": dict.fromkeys(self.kinds, 0),
                      "accepted": dict.fromkeys(self.kinds, 0), "copied": 0, "dropped": 0}
        self.last_round: dict = {}

    # ---- wiring --------------------------------------------------------------------------------
    def scorer(self, ctx: SearchContext):
        """The cost model's view of ``ctx.task``: the ``scorer`` option when given (an object, or a
        factory called once per task), else the context's (the session's shared model)."""
        arg = self._scorer_arg
        if arg is None:
            scorer = ctx.get_scorer(self.cost_model, ranker=self.ranker, ranker_data=self.ranker_data,
                                    opening=self.opening)
            full = self.pessimism and self.pessimism_share >= 1.0
            return PessimisticScorer(scorer, self.pessimism_model, self.pessimism) if full else scorer
        if hasattr(arg, "score"):
            return arg
        key = ctx.task.key
        if key not in self._scorers:
            self._scorers[key] = arg(ctx)
        return self._scorers[key]

    def codec(self, ctx: SearchContext) -> Codec:
        key = (ctx.task.key, tuple(sorted(ctx.spaces)))
        if key not in self._codecs:
            self._codecs[key] = Codec(ctx.spaces)
        return self._codecs[key]

    # ---- one round -----------------------------------------------------------------------------
    def propose(self, ctx: SearchContext, n: int) -> list[Config]:
        t_start = time.perf_counter()
        rng, codec, scorer = ctx.rng, self.codec(ctx), self.scorer(ctx)
        measured = set(codec.keys(codec.encode_many(c for c in ctx.measured if c.sketch in codec.sketch_id)))

        # 1. initial population: the best measured configs, then random valid unmeasured samples
        t = time.perf_counter()
        seeds = self._measured_seeds(ctx, codec)
        n_random = max(self.population - len(seeds), self.min_unmeasured)
        randoms = codec.sample(rng, n_random)
        if len(randoms):
            randoms = randoms[[k not in measured for k in codec.keys(randoms)]]
        pop = np.concatenate([codec.encode_many(seeds), randoms])
        self.stats["sample_s"] += time.perf_counter() - t

        cache: dict[bytes, float] = {}  # the model is fixed within a round: score each config once
        heap: dict[bytes, float] = {}
        scores = self._score(codec, scorer, pop, cache, heap, measured)
        by_gen = [scores]
        # 2. generations of roulette selection + mutation
        for _ in range(self.generations):
            if len(pop) == 0:
                break
            t = time.perf_counter()
            pop, _ = self.evolve(codec, pop, scores, rng)
            self.stats["evolve_s"] += time.perf_counter() - t
            scores = self._score(codec, scorer, pop, cache, heap, measured)
            by_gen.append(scores)

        # 3. the best 2n unmeasured, of which n - int(eps n) are proposed, plus int(eps n) random samples
        t = time.perf_counter()
        order = sorted(heap, key=heap.__getitem__, reverse=True)
        judge = judge_for(self._judges, ctx, self.judge, self.judge_weight)
        if judge is not None and order:  # the best 8n re-ranked by the blend with the judge's scores
            short = order[: 8 * n]
            judged = judge.blend(codec.decode_many(codec.rows(short)), np.array([heap[k] for k in short]))
            order = [short[i] for i in np.argsort(-judged, kind="stable")] + order[8 * n:]
        deep = 8 * n if self.spread else 2 * n  # spread picks from a longer list
        ranked = order[:deep]
        if self.pessimism and self.pessimism_share < 1.0 and heap:  # the hedge: some picks pessimistic
            short = order[: 8 * n]
            pess = PessimisticScorer(scorer, self.pessimism_model, self.pessimism).score(
                codec.decode_many(codec.rows(short)))
            by_pess = [short[i] for i in np.argsort(-pess, kind="stable")]
            ranked = interleave(by_pess, short, self.pessimism_share, deep)
        if self.spread and ranked:
            ranked = self._spread_out(scorer, codec, ranked, 2 * n)
        n_rand = int(self.eps_greedy * n)
        good = ranked[: n - n_rand]
        taken = set(good)
        rand_pick = []  # random samples of the initial population (a short heap is filled with them too)
        rand_keys = codec.keys(randoms)
        for i in rng.permutation(len(rand_keys)):
            if len(good) + len(rand_pick) >= n:
                break
            if rand_keys[i] not in taken:
                taken.add(rand_keys[i])
                rand_pick.append(randoms[i])
        for k in ranked[n - n_rand:]:  # too few random samples left: more of the heap
            if len(good) + len(rand_pick) >= n:
                break
            if k not in taken:
                taken.add(k)
                good.append(k)
        good_cfgs = codec.decode_many(codec.rows(good))
        rand_cfgs = codec.decode_many(np.stack(rand_pick)) if rand_pick else []
        self.stats["pick_s"] += time.perf_counter() - t
        self.stats["propose_s"] += time.perf_counter() - t_start
        self.stats["rounds"] += 1
        heap_cfgs = codec.decode_many(codec.rows(ranked))
        self.last_round = {"seeds": seeds, "init_random": randoms, "good": good_cfgs, "random": rand_cfgs,
                           "heap": [(heap[k], c) for k, c in zip(ranked, heap_cfgs)],
                           "scores_by_generation": by_gen, "codec": codec}
        return good_cfgs + rand_cfgs

    def update(self, ctx: SearchContext, records: list) -> None:
        self.scorer(ctx).update(records)
        if self.judge is not None:
            judge_for(self._judges, ctx, self.judge, self.judge_weight).update(records)

    # ---- pieces (public for tests) -------------------------------------------------------------
    def _spread_out(self, scorer, codec: Codec, keys: list, k: int) -> list:
        """``k`` of ``keys`` (best first) kept ``spread`` apart by :func:`spread_picks` in the relaxed
        integer space of the scorer's relaxations (a config of a sketch without one counts as far from all)."""
        rels = getattr(scorer, "relaxations", None) or {}
        cfgs = codec.decode_many(codec.rows(keys))
        xs = [rels[c.sketch].to_x(c) if c.sketch in rels else None for c in cfgs]
        width = next((len(x) for x in xs if x is not None), 0)
        if not width:
            return keys[:k]
        pts = np.stack([x if x is not None else np.zeros(width) for x in xs])
        tags = [c.sketch if x is not None else f"\0{i}" for i, (c, x) in enumerate(zip(cfgs, xs))]
        return [keys[i] for i in spread_picks(np.arange(len(keys)), pts, tags, k, self.spread)]

    def _measured_seeds(self, ctx: SearchContext, codec: Codec) -> list[Config]:
        best: dict[Config, float] = {}
        for r in ctx.history:
            if r.ok and r.config.sketch in codec.sketch_id and r.latency_s < best.get(r.config, math.inf):
                best[r.config] = r.latency_s
        k = int(self.measured_ratio * self.population)
        return [c for c, _ in sorted(best.items(), key=lambda kv: kv[1])[:k]]

    def _score(self, codec: Codec, scorer, pop: np.ndarray, cache: dict, heap: dict, measured: set) -> np.ndarray:
        """Scores of ``pop``; the generation's new distinct configs go to the scorer in one call, and
        the unmeasured ones enter ``heap`` (key -> score; a key is its row's bytes)."""
        if len(pop) == 0:
            return np.zeros(0)
        first, inv = codec.unique(pop)
        keys = codec.keys(pop[first])
        new = [i for i, k in enumerate(keys) if k not in cache]
        if new:
            t = time.perf_counter()
            s = np.asarray(scorer.score(codec.decode_many(pop[first[new]])), dtype=float).reshape(-1)
            self.stats["score_s"] += time.perf_counter() - t
            if len(s) != len(new):
                raise ValueError(f"scorer returned {len(s)} scores for {len(new)} configs")
            self.stats["scored"] += len(new)
            if len(s) > 1 and not np.isfinite(s).any() and not self._said_unscored:  # said once per search
                self._said_unscored = True
                warnings.warn(f"scorer {type(scorer).__name__} gave no finite score to {len(s)} configs (NaN / "
                              f"inf): genetic search has nothing to select by", RuntimeWarning, stacklevel=2)
            s = np.where(np.isfinite(s), s, -math.inf).tolist()
            for i, v in zip(new, s):
                cache[keys[i]] = v
            heap.update((keys[i], v) for i, v in zip(new, s) if keys[i] not in measured)
        return np.array([cache[k] for k in keys])[inv]

    def kind_weights(self, codec: Codec) -> np.ndarray:
        """``[sketches, kinds]``: each kind's weight on rows of each sketch of ``codec``'s task, 0 where it
        cannot change the row (:meth:`Codec.mutable_kinds`); the target's table (CPU or GPU)."""
        gpu = any(getattr(s.target, "is_gpu", False) for s in codec.spaces)
        table = self._gpu_weights if gpu else self.mutation_weights
        return codec.mutable_kinds(self.kinds) * np.array([table[k] for k in self.kinds])

    def evolve(self, codec: Codec, pop: np.ndarray, scores: np.ndarray, rng: np.random.Generator,
               size: int | None = None) -> tuple[np.ndarray, dict]:
        """One generation: ``size`` (default: the population size) children of ``pop``.

        Returns the children and ``info`` with, per child, ``parent`` (index into ``pop``) and
        ``kind`` (index into ``self.kinds``: :data:`MUTATIONS`, then the declared knobs; -1 for a copy).
        """
        size = self.population if size is None else size
        cum = np.cumsum(selection_probs(scores))
        names = self.kinds
        # per sketch, the cumulative weights of the kinds that can change its rows (a registered knob that
        # applies to none of this task's sketches, e.g. sparse_bc on a dense task, takes no share anywhere)
        kind_cum = np.cumsum(self.kind_weights(codec), axis=1)
        children, parents, kinds = [], [], []
        need = size
        for _ in range(self.max_fail + 1):
            par = np.minimum(np.searchsorted(cum, rng.random(need) * cum[-1], side="right"), len(pop) - 1)
            sk_cum = kind_cum[pop[par, 0]]  # (need, kinds)
            total = sk_cum[:, -1]
            mutate = (rng.random(need) < self.mutation_prob) & (total > 0)  # a row no kind can change: a copy
            kind = np.minimum((sk_cum <= (rng.random(need) * total)[:, None]).sum(axis=1), len(names) - 1)
            kind[~mutate] = -1
            kids = pop[par]
            for k, name in enumerate(names):
                sel = kind == k
                if sel.any():
                    kids[sel] = codec.mutate(kids[sel], name, rng)
                    self.stats["attempted"][name] += int(sel.sum())
            ok = ~mutate | codec.valid(kids)
            self.stats["copied"] += int((~mutate).sum())
            for k, name in enumerate(names):
                self.stats["accepted"][name] += int((ok & (kind == k)).sum())
            children.append(kids[ok])
            parents.append(par[ok])
            kinds.append(kind[ok])
            need = int((~ok).sum())
            if need == 0:
                break
        self.stats["dropped"] += need
        return np.concatenate(children), {"parent": np.concatenate(parents), "kind": np.concatenate(kinds)}
