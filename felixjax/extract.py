"""An independent feature extractor: walk the lowered loop nest and count (small shapes only).

:func:`extract` computes, for one integer config, the same features as
:func:`felixjax.features.features` in hard mode, but without its formulas: it lowers the config
(:func:`codegen.lower.lower`), enumerates every iteration of every statement of the emitted
program, computes the address each buffer access touches from the plan's per-loop-variable strides
(``address = Σ stride[var] · var``), and counts: accesses, distinct addresses per tile, the lines
those addresses span, tiles, trip counts. The derived features (reuse, cache fits, traffic) follow
the definitions in :mod:`felixjax.features`' docstring, applied to the counted numbers.

It is the ground truth the closed-form features are tested against (DESIGN.md ⑤). Cost grows with
the iteration count of the whole nest: keep shapes small (a few 10⁴ iterations).

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from felixjax.features import GLOBAL_FEATURES
    >>> sp = Space(matmul(12, 16, 20), "gemm_packed", Target())
    >>> f = extract(sp, sp.default())
    >>> round(float(np.expm1(f.glob[GLOBAL_FEATURES.index("flops")])))
    7680
"""
from __future__ import annotations

import math

import numpy as np

from codegen.knobs import INFO_KEYS, MAX_EXTRA_KNOBS, knob_slot
from codegen.lower import Buffer, Loop, Plan, lower
from codegen.space import Config, Space
from costmodels.base import Features
from felixjax.features import LINE_BYTES, N_ACCESS_FEATURES, SLOTS, knob_features
from felixjax.relax import POSITIONS, operand_bytes

# The loops around each statement of the emitted C (codegen.render_c), by level name.
_BODY_POS = [POSITIONS.index(n) for n in ("S0", "S1", "R0", "S2", "R1")]  # FMAs; S3 = register block
_ACC_POS = [POSITIONS.index(n) for n in ("S0", "S1", "R0", "S2")]  # accumulator load / store
_EPI_POS = [POSITIONS.index(n) for n in ("S0", "S1", "S2", "S3")]  # fused epilogue


def _grid(extents: list[int]) -> np.ndarray:
    """All index combinations ``[prod(extents), len(extents)]`` (row-major)."""
    if not extents:
        return np.zeros((1, 0), np.int64)
    return np.indices(extents).reshape(len(extents), -1).T.astype(np.int64)


def _row_width(buf: Buffer) -> int:
    """Elements in one row of the innermost physical dimension (the block, or the last dim)."""
    for dl in buf.layout.dims:
        if dl.kind == "block":
            return dl.block
    return buf.layout.shape[-1]


def _lines(addresses: np.ndarray, width: int, elem: int) -> int:
    """Σ over rows of ⌈(max − min + 1) · elem / 64⌉ for a set of addresses."""
    rows = addresses // width
    cols = addresses % width
    order = np.lexsort((cols, rows))
    rows, cols = rows[order], cols[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    lo = cols[starts]
    hi = np.maximum.reduceat(cols, starts)
    return int(np.sum(-(-((hi - lo + 1) * elem) // LINE_BYTES)))


class _Statement:
    """One statement of the emitted program: its enclosing loops and, per execution, the addresses
    it touches in one buffer."""

    def __init__(self, plan: Plan, positions: np.ndarray, buf: Buffer, *, block: bool):
        self.loops: list[tuple[int, Loop]] = [(p, lp) for p in positions for lp in plan.levels[POSITIONS[p]]]
        self.iters = _grid([lp.extent for _, lp in self.loops])  # [n_exec, n_loops]
        base = self.iters @ np.array([buf.stride(lp.var) for _, lp in self.loops], np.int64)
        # the register block: per execution, the S3 box (loads deduplicated per address)
        box = plan.levels["S3"] if block else ()
        inner = _grid([lp.extent for lp in box]) @ np.array([buf.stride(lp.var) for lp in box], np.int64)
        self.addresses = base[:, None] + inner[None, :]  # [n_exec, n_box]
        srt = np.sort(self.addresses, axis=1)
        self.distinct = 1 + np.count_nonzero(np.diff(srt, axis=1), axis=1)  # per execution

    def outer(self, level: int) -> np.ndarray:
        return np.array([p < level for p, _ in self.loops], bool)

    def ntiles(self, level: int) -> int:
        """Number of distinct tiles at ``level``: distinct values of the outer loop variables."""
        outer = self.outer(level)
        extents = [lp.extent for (_, lp), o in zip(self.loops, outer) if o]
        if not extents:
            return 1
        key = np.ravel_multi_index(tuple(self.iters[:, outer].T), extents)
        return len(np.unique(key))

    def first_tile(self, level: int) -> np.ndarray:
        """Distinct addresses of the tile at ``level`` whose outer loop variables are all 0."""
        rows = np.all(self.iters[:, self.outer(level)] == 0, axis=1)
        return np.unique(self.addresses[rows])


def _level_rows(stmt: _Statement, accesses: int, buf: Buffer, elem: int) -> list[list[float]]:
    out = []
    for level in range(len(POSITIONS)):
        ntiles = stmt.ntiles(level)
        addr = stmt.first_tile(level)
        out.append([accesses / ntiles, len(addr), _lines(addr, _row_width(buf), elem), ntiles])
    return out


def _copy_rows(buf: Buffer, elem: int) -> tuple[int, list[list[float]]]:
    addr = np.unique(buf.layout.offsets().ravel())
    row = [len(addr), len(addr), _lines(addr, _row_width(buf), elem), 1]
    return len(addr), [row] * len(POSITIONS)


def extract(space: Space, config: Config, *, elem_bytes: int | None = None) -> Features:
    """Exact features of one config by enumeration: ``Features(access [9, F], mask [9], glob [G])``
    as numpy, ``log(1 + v)``; slots absent from the program are all zero with mask 0.

    Example:
        >>> from codegen.ops import conv2d
        >>> from codegen.target import Target
        >>> sp = Space(conv2d(1, 4, 6, 6, out_channels=8, padding=1), "conv_direct", Target())
        >>> f = extract(sp, sp.default())
        >>> f.mask.tolist()
        [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    """
    plan = lower(space, config)
    target = space.target
    elem = elem_bytes if elem_bytes is not None else operand_bytes(space)
    caches = (target.l1d_bytes, target.l2_bytes, target.l3_bytes)
    v3 = f"{plan.vector_axis}3"
    r1 = f"{[a.name for a in space.axes if a.reduce][-1]}1"
    bufs = plan.buffers
    acc = bufs[plan.acc]

    slots: dict[str, dict] = {}

    def add(name: str, buf: Buffer, rw: int, stmt_kind: int, accesses: int, rows, copy: bool = False):
        if copy:
            dl = buf.layout.dims[-1]
            vstride, vdep, rstride = (dl.stride if dl.kind == "plain" else 1), 1, 0
        else:
            vstride, vdep, rstride = buf.stride(v3), int(buf.stride(v3) != 0), buf.stride(r1)
        slots[name] = dict(buf=buf, rw=rw, stmt=stmt_kind, accesses=accesses, rows=rows, vstride=vstride,
                           vdep=vdep, rstride=rstride)

    # main nest: operands in the R1 body, the accumulator around it
    for name in ("data", "weight"):
        st = _Statement(plan, _BODY_POS, bufs[name], block=True)
        n = int(st.distinct.sum())
        add(name, bufs[name], 0, 0, n, _level_rows(st, n, bufs[name], elem))
    st = _Statement(plan, _ACC_POS, acc, block=True)
    r0 = np.array([p == POSITIONS.index("R0") for p, _ in st.loops], bool)
    first = np.all(st.iters[:, r0] == 0, axis=1)  # the accumulators start from zero: no load
    n = int((st.distinct * np.where(first, 1, 2)).sum())
    add("acc", acc, 2, 0, n, _level_rows(st, n, acc, elem))
    # fused epilogue after each S1 tile
    if plan.epilogue:
        for name, buf, rw in (("epilogue_acc", acc, 0), ("epilogue_out", bufs["out"], 1),
                              ("bias", bufs.get("bias"), 0), ("residual", bufs.get("residual"), 0)):
            if buf is None:
                continue
            st = _Statement(plan, _EPI_POS, buf, block=False)
            n = int(st.distinct.sum())
            add(name, buf, rw, 1, n, _level_rows(st, n, buf, elem))
    # timed copy of the data input
    if plan.data_copy:
        for name, buf, rw in (("copy_in", bufs["data_in"], 0), ("copy_out", bufs["data"], 1)):
            n, rows = _copy_rows(buf, elem)
            add(name, buf, rw, 2, n, rows, copy=True)

    footprint = [sum(elem * slots[s]["rows"][lvl][1] for s in ("data", "weight", "acc"))
                 for lvl in range(len(POSITIONS))]
    access = np.zeros((len(SLOTS), N_ACCESS_FEATURES))
    mask = np.zeros(len(SLOTS))
    traffic_total = np.zeros(3)
    for i, name in enumerate(SLOTS):
        if name not in slots:
            continue
        row, traffic = _slot_row(slots[name], elem, caches, footprint, compute=i < 3)
        access[i], mask[i] = row, 1.0
        traffic_total += traffic
    glob = _global_row(space, config, plan, slots, elem, caches, footprint, traffic_total)
    return Features(np.log1p(access), mask, np.log1p(glob))


def _slot_row(s: dict, elem: int, caches, footprint, *, compute: bool) -> tuple[np.ndarray, np.ndarray]:
    rows = s["rows"]
    head = [float(s["rw"] == k) for k in range(3)] + [float(s["stmt"] == k) for k in range(3)]
    head += [elem * s["buf"].layout.size, s["vstride"], float(s["vdep"] and s["vstride"] == 1),
             float(not s["vdep"]), s["rstride"]]
    levels = []
    for per_tile, unique, lines, _ in rows:
        levels += [elem * per_tile, elem * unique, lines, per_tile / unique]
        levels += [float(elem * unique <= c) for c in caches]
    traffic = []
    for c in caches:
        if not compute:
            traffic.append(elem * rows[0][1])
            continue
        fitting = [lvl for lvl in range(len(POSITIONS)) if footprint[lvl] <= c]
        if fitting:
            lvl = fitting[0]
            traffic.append(elem * rows[lvl][1] * rows[lvl][3])
        else:
            traffic.append(elem * s["accesses"])
    return np.array(head + levels + traffic), np.array(traffic)


def _global_row(space: Space, config: Config, plan: Plan, slots: dict, elem: int, caches, footprint,
                traffic) -> np.ndarray:
    task, target = space.task, space.target
    vaxis = space.sketch.vector_axis
    s3 = {lp.axis: lp.extent for lp in plan.levels["S3"]}
    block = math.prod(s3.values())
    accs = space.accumulators(config)
    chunks = math.prod(lp.extent for lp in plan.parallel)
    cores = target.cores
    trips = [math.prod(lp.extent for lp in plan.levels[p]) for p in POSITIONS]
    outputs = math.prod(a.extent for a in space.con.spatial)
    # the FLOPs of the computed nest (a padded sketch's padded range; task.flops otherwise)
    epi_ops = int(task.bias) + int(task.residual) + int(task.act is not None)
    flops = 2 * outputs * space.con.reduction_size + epi_ops * outputs
    # declared knobs: their own feature hooks, on the config's values and the counted loop nest
    values, applies = np.zeros(MAX_EXTRA_KNOBS), np.zeros(MAX_EXTRA_KNOBS)
    for k in space.knobs:
        values[knob_slot(k.name)], applies[knob_slot(k.name)] = space.knob_value(config, k), 1.0
    unroll = plan.unroll  # the step the kernel is built with (at most codegen.space.MAX_UNROLL_STEP)
    info = dict(zip(INFO_KEYS, [float(t) for t in trips] + [config.vec, unroll, elem, flops]))
    knob_row = np.asarray(knob_features(np, values, applies, info), np.float64)
    return np.array(
        [flops, elem, sum(elem * s["accesses"] for s in slots.values()),
         sum(elem * s["rows"][0][1] for s in slots.values()), *traffic,
         flops / traffic[2], flops / traffic[0], config.vec, config.vec / target.simd_lanes, accs,
         accs / space.max_accumulators, float(accs <= space.max_accumulators), block / s3[vaxis],
         s3[vaxis] / config.vec, config.parallel, chunks, chunks / (-(-chunks // cores) * cores),
         float(chunks >= cores), *trips, unroll, min(unroll, trips[POSITIONS.index("R1")]),
         *footprint, *[float(fp <= c) for fp in footprint for c in caches],
         float(plan.data_copy), float(plan.acc == "scratch"), float(plan.epilogue), outputs,
         space.con.reduction_size, *knob_row], np.float64)
