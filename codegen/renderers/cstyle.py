"""The C-family renderer base: a lowered :class:`~codegen.lower.Plan` -> readable source, every
target-specific spelling taken from a :class:`Dialect` table.

The structure mirrors the plan: an optional timed input copy (padding / channel blocking), the main
nest ``S0 S1 R0 S2 R1 S3`` with the outer ``S0`` loops fused into one parallel loop, a register block of
vector accumulators held across the ``R1`` loop, and the fused epilogue after each ``S1`` tile's
reduction. For ``gemm_packed``, where the register block's data rows would thrash one L1 set (rows a
multiple of 4 KiB apart outnumbering the L1 ways, e.g. 16 rows of a K=1024 matrix), the data micro-panel
is copied (timed) into a padded contiguous stack buffer inside the ``S2`` loops and reused by the inner
``S2`` loops: a function of the config, not a knob (see :func:`_data_pack`).

What is shared (the loop structure, the register block, the epilogue) lives in :class:`CStyleRenderer`;
what differs between C + OpenMP + GCC vector extensions and, later, CUDA (vector types, loads, stores,
broadcasts, FMA, the parallel loop / thread mapping, pragmas, restrict, alignment, function qualifiers,
the kernel signature and the timing harness) is a :class:`Dialect` field. A new target is a new table
(and, where its loop structure differs, a sketch), not a new renderer.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from ..flat import IM2COL_SKETCH
from ..knobs import Site
from ..lower import WS_UNIT, Buffer, Loop, Plan
from . import copies
from .dialect import Dialect, Writer, _itemsize, _storage_vec  # noqa: F401  (Dialect, Writer re-exported)

MAX_UNROLLED_FMAS = 2048

PACK_NAME = "dpack"
PACK_MIN_REUSE = 2  # pack only when the micro-panel is reused by at least this many register blocks
PACK_MAX_FLOATS = 16384  # 64 KiB of stack per thread at most
PACK_PAD = 16  # floats between packed rows (one cache line): consecutive rows fall in different L1 sets
L1_SET_BYTES = 4096  # bytes of address space one L1 way covers (64 sets x 64 B on every x86 core)


_Writer = Writer  # the old private name (codegen.render_c._Writer)


def _affine(terms: dict[str, int], const: int = 0) -> str:
    """Render sum(coeff * var) + const as a C expression (vars are long)."""
    parts = [(f"{c}*{v}" if c != 1 else v) for v, c in sorted(terms.items()) if c]
    if const or not parts:
        parts.append(str(const))
    return " + ".join(parts)


def _offset(buf: Buffer, loops: list[Loop]) -> dict[str, int]:
    """The strides of ``buf`` restricted to the given (non-trivial) loops."""
    return {lp.var: buf.stride(lp.var) for lp in loops if lp.extent > 1 and buf.stride(lp.var)}


def _sliding_loops(r1: list, ops: list, offsets: list[list[int]]) -> set[str]:
    """The R1 loops that slide an operand along the register block (a conv's kernel-width loop ``rx``
    over rows ``x``): a step of the loop lands on an element another row / column of the block reads,
    so unrolled copies share loads, gcc keeps them live across the copies and spills accumulators.
    Such loops are left rolled. Measured on the AVX2 EPYC (1 thread, conv 64x56x56 3x3, 6 x 2-vector
    block over rows padded to 60): ``rx`` unrolled 39.6 GFLOP/s, rolled 67.7 (``ry`` unrolled both times).
    """
    out = set()
    for lp in r1:
        for op, offs in zip(ops, offsets):
            s = op.stride(lp.var)
            if s == 0 or lp.extent < 2:
                continue
            have = set(offs)
            if any(o + s * j in have for o in have for j in range(1, lp.extent)):
                out.add(lp.var)
                break
    return out


def _live(loops: tuple[Loop, ...]) -> list[Loop]:
    return [lp for lp in loops if lp.extent > 1]


@dataclass(frozen=True)
class _DataPack:
    """A contiguous copy of the data micro-panel one register block reads (its rows x the R1 range),
    made inside the S2 loops and reused by the inner S2 loops the data does not depend on (GEMM's
    "packed A"). Layout ``[rows][R1]`` with rows ``R1 + PACK_PAD`` floats apart."""

    after: int  # index in the live S2 loops after whose opening the pack is made (-1: before them)
    buf: Buffer  # the data operand with the pack's strides (same name, so loads are named alike)
    rows: tuple[Loop, ...]  # S3 loops (not the vector axis) the data depends on, outermost first
    r1: Loop  # the R1 loop (the contiguous dimension of every packed row)
    size: int  # floats


def _l1_conflicts(plan: Plan, rows: tuple[Loop, ...]) -> int:
    """The most register-block data rows whose addresses share one L1 set (rows a multiple of 4 KiB
    apart all land in the same set and evict each other once they outnumber the cache's ways)."""
    data = plan.buffers["data"]
    sets: dict[int, int] = {}
    for row in itertools.product(*[range(lp.extent) for lp in rows]):
        off = _itemsize(plan.space.task.dtype) * sum(data.stride(lp.var) * i for lp, i in zip(rows, row))
        key = (off % L1_SET_BYTES) // 64
        sets[key] = sets.get(key, 0) + 1
    return max(sets.values(), default=0)


def _data_pack(plan: Plan) -> "_DataPack | None":
    """The data micro-panel pack of a ``gemm_packed`` plan, made only where it pays: the register
    block's data rows thrash an L1 set (more rows in one set than the L1 has ways) and the panel is
    reused by at least :data:`PACK_MIN_REUSE` register blocks. Not a knob: a function of the config."""
    if plan.space.sketch.base != "gemm_packed" or plan.data_copy or plan.tail_row >= 0:
        return None
    L, data = plan.levels, plan.buffers["data"]
    rows = tuple(lp for lp in _live(L["S3"]) if lp.axis != plan.vector_axis and data.stride(lp.var))
    r1 = _live(L["R1"])
    if len(r1) != 1 or data.stride(r1[0].var) != 1 or not rows:
        return None
    s2 = _live(L["S2"])
    dep = [i for i, lp in enumerate(s2) if data.stride(lp.var)]
    after = dep[-1] if dep else -1
    reuse = math.prod(lp.extent for lp in s2[after + 1:])
    ways = max(1, int(plan.space.target.l1d_bytes) // L1_SET_BYTES)
    strides = {r1[0].var: 1}
    inner = r1[0].extent + PACK_PAD
    for lp in reversed(rows):
        strides[lp.var] = inner
        inner *= lp.extent
    if reuse < PACK_MIN_REUSE or inner > PACK_MAX_FLOATS or _l1_conflicts(plan, rows) <= ways:
        return None
    return _DataPack(after, replace(data, strides=tuple(sorted(strides.items()))), rows, r1[0], inner)


def _pad_guards(plan: Plan, loops: list[Loop], inner: Loop | None = None) -> tuple[list[str], list[str], str | None]:
    """``index < extent`` of every padded axis (its index from the given live loops, outermost level
    first), for the epilogue of a padded sketch, as ``(outside, inside, bound)``: the guards that do not
    involve ``inner`` (the innermost, SIMD loop; tested before it), those that do, and, where ``inner``
    steps a padded axis by 1, that axis' guard as ``inner``'s trip count (``min(n, extent - rest)``). A
    guard inside the SIMD loop kept gcc from vectorizing the epilogue: a scalar compare-and-branch per
    output of every padded sketch."""
    outside, inside, bound = [], [], None
    tiles = {a.name: t for a, t in zip(plan.space.axes, plan.config.tiles)}
    for axis, _ in plan.space.sketch.pad:
        t = tiles[axis]
        terms = {lp.var: math.prod(t[lp.level + 1:]) for lp in loops if lp.axis == axis}
        extent = plan.space.api_con.axis(axis).extent
        if inner is not None and terms.get(inner.var) == 1 and bound is None:
            rest = {v: c for v, c in terms.items() if v != inner.var}
            left = f"{extent}L - ({_affine(rest)})" if rest else f"{extent}L"
            bound = f"({left} < {inner.extent} ? {left} : {inner.extent})"
        elif inner is not None and inner.var in terms:
            inside.append(f"{_affine(terms)} < {extent}")
        else:
            outside.append(f"{_affine(terms)} < {extent}")
    return outside, inside, bound


class CStyleRenderer:
    """Renders plans in one :class:`Dialect`. ``render(plan)`` is a standalone kernel source (prelude,
    vector types, the kernel, the harness); ``render_kernel(plan, w)`` only the kernel function."""

    def __init__(self, dialect: Dialect):
        self.d = dialect

    def __repr__(self) -> str:
        return f"CStyleRenderer({self.d.name})"

    # ---- entry points ---------------------------------------------------------------------------

    def render(self, plan: Plan) -> str:
        """Full source of one kernel: header comment, vector types, the kernel and the harness."""
        task, cfg = plan.space.task, plan.config
        w = Writer()
        w("/* felixjax generated kernel")
        w(f" * task:   {task.name}  ({task.key})")
        w(f" * sketch: {cfg.sketch}")
        w(f" * config: {cfg.dumps()}")
        w(" * loop order S0 S1 R0 S2 R1 S3; S3 is a register block held across R1. */")
        w(self.d.prelude.rstrip("\n"))
        if plan.space.task.dtype != "float32":
            w(self.d.lowp_prelude.rstrip("\n"))
        if plan.vec > 1:
            self._vector_typedefs(plan, w, self.d.vector_typedefs)
        w()
        self.render_kernel(plan, w)
        return w.text() + self.d.harness

    def render_kernel(self, plan: Plan, w: Writer, *, name: str = "fj_kernel", static: bool = False,
                      local_types: bool = False) -> None:
        """Render only the kernel function of ``plan`` into ``w``.

        ``name`` renames the function and ``static`` gives it internal linkage, so several kernels can
        share one translation unit (the whole-network build). ``local_types`` declares the vector types
        inside the function body, since kernels of one file may use different vector widths.
        """
        d = self.d
        B = plan.buffers
        if not (name.isascii() and name.isidentifier()):
            raise ValueError(f"kernel name {name!r} is not a C identifier")
        qual = (d.static if static else "") + d.kernel_qualifier
        if d.no_predictive_commoning and self._scalar_taps(plan):
            qual = d.no_predictive_commoning + qual
        if d.pin_macro and self._pinned(plan):
            for line in d.pin_macro.splitlines():
                w(line)
        if d.bcast_macro and self._memory_broadcasts(plan):
            for line in d.bcast_macro.splitlines():
                w(line)
        if plan.space.masked:
            if not d.mask_macro:
                raise ValueError(f"dialect {d.name} has no masked loads: cannot render {plan.config.sketch}")
            for line in d.mask_macro.splitlines():
                w(line)
        w.open(d.kernel_signature.format(qual=qual, name=name))
        if local_types and plan.vec > 1:
            self._vector_typedefs(plan, w, d.vector_typedefs_local)
        for i, (arg, dt) in enumerate(zip(plan.args, plan.arg_dtypes())):
            w(d.bind_arg.format(const="" if arg == "out" else "const ", S=d.scalar(dt.name), restrict=d.restrict,
                                name=arg, i=i))
        w(d.bind_workspace.format(restrict=d.restrict, i=len(plan.args)))
        for bname, buf in B.items():
            if buf.storage == "workspace":
                w(d.bind_ws_buffer.format(S=d.scalar(buf.dtype), restrict=d.restrict, name=bname,
                                          offset=buf.ws_offset * WS_UNIT))
        w("(void)ws;")
        if "x_zp" in B:  # int8: the quantization parameters of one tensor, read once
            w("const int xzp = x_zp[0];")
            w("const float xs = x_scale[0];")
        if plan.pairs == 4:  # VNNI: raw uint8 data (signed data + 128); the zero point is corrected per channel
            w(f"const int* {d.restrict} wsum = (const int*)(weight + {plan.wsum_offset});")
            w(f"const int xzpe = xzp{' + 128' if plan.space.task.act_signed else ''};")
            if not plan.space.target.avx512_vnni:  # AVX2 quads: vpmaddwd's int16 ones
                w(f"const {d.madd_types[plan.vec]} ones16 = {d.madd_bcast[plan.vec].format(v='0x00010001')};")
        if "y_zp" in B:
            w("const int yzp = y_zp[0];")
            w("const float ys = y_scale[0];")
        if plan.tail_row >= 0:
            copies.data_tail(self.d, plan, w)
        self._hooks(plan, "kernel_begin", w, {}, ())
        if plan.data_copy:
            (copies.im2col_copy if plan.space.sketch.base == IM2COL_SKETCH else copies.data_copy)(self.d, plan, w)
        self._main(plan, w)
        w.close()

    # ---- pieces ---------------------------------------------------------------------------------

    def _hooks(self, plan: Plan, site: str, w: Writer, pointers: dict, loops: tuple) -> None:
        """The lines declared knobs' lowerings emit at ``site`` (:data:`codegen.knobs.SITES`)."""
        for hook in plan.hooks:
            if hook.site == site:
                for line in hook.emit(Site(site, plan, self.d, dict(pointers), loops)):
                    w(line)

    def _vector_typedefs(self, plan: Plan, w: Writer, lines: tuple[str, ...]) -> None:
        acc = plan.dtypes.accumulator
        S = self.d.scalar(acc)
        size = _itemsize(acc)
        for line in lines:
            w(line.format(S=S, bytes=size * plan.vec, align=size))
        for st in sorted({plan.buffers["data"].dtype, plan.buffers["weight"].dtype} - {acc}):
            w(self.d.storage_typedef.format(S=self.d.scalar(st), name=_storage_vec(st), bytes=_itemsize(st) * plan.vec,
                                            align=_itemsize(st)))

    def _main(self, plan: Plan, w: Writer) -> None:
        d = self.d
        L = plan.levels
        fused = _live(plan.parallel)
        serial_s0 = _live(L["S0"][len(plan.parallel):])
        w("/* main nest: S0 S1 R0 S2 R1 S3 */")
        depth0 = w.depth
        if fused:
            total = math.prod(lp.extent for lp in fused)
            if total > 1 and d.parallel_for:
                w(d.parallel_for)
            w.open(d.parallel_loop.format(var="fused", n=total))
            for i, lp in enumerate(fused):
                below = math.prod(f.extent for f in fused[i + 1:])
                expr = f"fused / {below}" if below > 1 else "fused"
                w(f"const long {lp.var} = {expr if i == 0 else f'({expr}) % {lp.extent}'};")
        for lp in serial_s0 + _live(L["S1"]):
            w.open(d.loop.format(var=lp.var, n=lp.extent))
        # ---- reduction R0, S2, register block ---------------------------------------------------
        r0 = _live(L["R0"])
        for lp in r0:
            w.open(d.loop.format(var=lp.var, n=lp.extent))
        first = " && ".join(f"{lp.var} == 0" for lp in r0) or "1"
        w(f"const int first = {first};")
        pack = _data_pack(plan)
        for i, lp in enumerate(_live(L["S2"])):
            w.open(d.loop.format(var=lp.var, n=lp.extent))
            if pack is not None and i == pack.after:
                self._data_pack(plan, pack, w)
        if pack is not None and pack.after < 0:
            self._data_pack(plan, pack, w)
        self._register_block(plan, w, pack)
        for _ in _live(L["S2"]):
            w.close()
        for _ in r0:
            w.close()
        if plan.epilogue:
            self._epilogue(plan, w)
        while w.depth > depth0:
            w.close()

    def _data_pack(self, plan: Plan, pack: _DataPack, w: Writer) -> None:
        """Copy the data micro-panel of the current S2 position into ``dpack`` (timed, in the kernel)."""
        d = self.d
        S = d.scalar(plan.buffers["data"].dtype)
        L, data = plan.levels, plan.buffers["data"]
        outer = [lp for name in ("S0", "S1", "R0") for lp in _live(L[name])]
        outer += _live(L["S2"])[: pack.after + 1]
        k = pack.r1
        w(f"/* pack the data micro-panel: {math.prod(lp.extent for lp in pack.rows)} rows x {k.extent} */")
        w(d.stack_array.format(S=S, name=PACK_NAME, n=pack.size, align=64))
        w("{")
        w.depth += 1
        w(f"const {S}* {d.restrict} src = data + {_affine(_offset(data, outer))};")
        for row in itertools.product(*[range(lp.extent) for lp in pack.rows]):
            so = sum(data.stride(lp.var) * i for lp, i in zip(pack.rows, row))
            po = sum(pack.buf.stride(lp.var) * i for lp, i in zip(pack.rows, row))
            if d.simd:
                w(d.simd)
            w(f"{d.loop.format(var=k.var, n=k.extent)} {PACK_NAME}[{po} + {k.var}] = src[{so} + {k.var}];")
        w.depth -= 1
        w("}")

    def _load(self, ptr: str, stride: int, vec: int, size: int) -> str:
        """A vector of ``vec`` elements ``stride`` apart from ``ptr`` (or one scalar when ``vec == 1``)."""
        d = self.d
        if vec == 1:
            return d.load_scalar.format(ptr=ptr)
        if stride == 1:
            return d.load_unaligned.format(ptr=ptr)
        if stride == 2:
            # two overlapping loads of ptr[0 .. 2*vec-2] and one two-source permute (vpermi2ps), not
            # vec scalar loads and inserts; the second load starts at vec-1 so nothing past the last
            # element used is read
            idx = ", ".join(str(2 * j if 2 * j < vec else 2 * j + 1) for j in range(vec))
            return d.load_stride2.format(ptr=ptr, second=vec - 1, bytes=size * vec, idx=idx)
        lanes = ", ".join(f"({ptr})[{j * stride}]" for j in range(vec))
        return d.load_gather.format(lanes=lanes)

    def _widen_scalar(self, plan: Plan, op: Buffer, elem: str) -> str:
        """One low-precision element as an accumulator-type scalar (int8 data: minus the zero point)."""
        acc = plan.dtypes.accumulator
        if op.dtype == acc:
            return elem
        val = f"({self.d.scalar(acc)}){elem}"
        return f"({val} - xzp)" if op.name == "data" and "x_zp" in plan.buffers else val

    def _pair_operand(self, plan: Plan, op: Buffer, r1off: str, off: int, kr: Loop) -> str:
        """An int8 pair operand: the weights' ``2 * vec`` interleaved int8 (rows k, k+1) sign-extended
        to int16, or the data pair ``(x[k] - zp, x[k+1] - zp)`` as two int16 in every int32 lane."""
        d, vec = self.d, plan.vec
        base = f"{op.name}_p + {r1off}" if r1off != "0" else f"{op.name}_p"
        if plan.pairs == 4:  # VNNI: 4*vec int8 weights; four uint8 data (signed: flipped to x + 128)
            if op.name == "weight":
                return d.dot4_load[vec].format(ptr=f"{base} + {4 * off}")
            sd = op.stride(kr.var)
            quad = (d.load_quad.format(ptr=f"({base}) + {off}") if sd == 1 or plan.data_quads else
                    "(int)(" + " | ".join(f"((unsigned)(unsigned char)({base})[{off + j * sd}] << {8 * j})"
                                          for j in range(4)) + ")")
            if plan.space.task.act_signed:
                quad = f"({quad} ^ (int)0x80808080u)"
            return d.madd_bcast[vec].format(v=quad)
        if op.name == "weight":
            return d.madd_load[vec].format(ptr=f"{base} + {2 * off}")
        if plan.data_quads:  # the copy holds (x - zp) as int16 pairs: one 4-byte broadcast
            return d.madd_bcast[vec].format(v=d.load_quad.format(ptr=f"({base}) + {off}"))
        lo = f"(unsigned)((int)({base})[{off}] - xzp)"
        hi = f"(unsigned)((int)({base})[{off + op.stride(kr.var)}] - xzp)"
        return d.madd_bcast[vec].format(v=f"(int)(({lo} & 0xFFFFu) | ({hi} << 16))")

    def _widen_load(self, plan: Plan, op: Buffer, ptr: str, stride: int) -> str:
        """``vec`` low-precision elements ``stride`` apart, widened to an accumulator vector (F16C
        float16 -> float32, sign / zero extension int8 / uint8 -> int32); int8 data minus the zero point."""
        d, acc, vec = self.d, plan.dtypes.accumulator, plan.vec
        if vec == 1:
            return self._widen_scalar(plan, op, d.load_scalar.format(ptr=ptr))
        if stride == 1:
            tmpl = d.convert_loads.get((op.dtype, acc, vec))
            v = (tmpl.format(ptr=ptr) if tmpl is not None
                 else d.convert_vector.format(U=_storage_vec(op.dtype), ptr=ptr))
        else:
            v = d.load_gather.format(lanes=", ".join(f"({ptr})[{j * stride}]" for j in range(vec)))
        return f"({v} - xzp)" if op.name == "data" and "x_zp" in plan.buffers else v

    def _register_block(self, plan: Plan, w: Writer, pack: "_DataPack | None" = None) -> None:
        """Accumulators in registers across the R1 loop: load (or zero), R1 FMAs, store. With a data
        ``pack``, the data operand is read from the packed micro-panel instead of the data buffer."""
        d = self.d
        S = d.scalar(plan.dtypes.accumulator)
        L = plan.levels
        vec = plan.vec
        vaxis = plan.vector_axis
        s3 = [lp for lp in L["S3"] if lp.extent > 1]
        rows_loops = [lp for lp in s3 if lp.axis != vaxis]
        vloop = next((lp for lp in L["S3"] if lp.axis == vaxis), None)
        ncols = (vloop.extent if vloop else 1) // vec
        rows = list(itertools.product(*[range(lp.extent) for lp in rows_loops]))
        outer = [lp for name in ("S0", "S1", "S2") for lp in _live(L[name])]
        acc = plan.buffers[plan.acc]
        T = d.vector_type if vec > 1 else S
        lanes = f"{vec}-lane" if vec > 1 else "scalar"
        w(f"/* register block: {len(rows)} row(s) x {ncols} column(s) of {lanes} accumulators */")
        w("{")
        w.depth += 1
        w(f"const long acc_base = {_affine(_offset(acc, outer))};")

        def elem_off(buf: Buffer, row: tuple[int, ...], col: int) -> int:
            off = sum(buf.stride(lp.var) * i for lp, i in zip(rows_loops, row))
            if vloop is not None:
                off += buf.stride(vloop.var) * col * vec
            return off

        for ri in range(len(rows)):
            for c in range(ncols):
                w(f"{T} acc_{ri}_{c};")
        if not plan.space.masked:
            self._block_body(plan, w, pack, rows, rows_loops, vloop, ncols, elem_off, outer)
        else:  # a masked padded sketch: the block's body twice, unmasked and for vectors past the extent
            t = dict(zip([a.name for a in plan.space.axes], plan.config.tiles))[vaxis]
            start = _affine({lp.var: math.prod(t[lp.level + 1:]) for lp in outer if lp.axis == vaxis})
            w(f"const long vrem = {plan.space.api_con.axis(vaxis).extent}L - ({start});  /* lanes left on {vaxis} */")
            w.open(f"if (vrem >= {max(1, ncols) * vec})")
            self._block_body(plan, w, pack, rows, rows_loops, vloop, ncols, elem_off, outer)
            w.close(" else {")
            w.depth += 1
            self._block_body(plan, w, pack, rows, rows_loops, vloop, ncols, elem_off, outer, masked=True)
            w.close()
        w.close()

    def _block_body(self, plan: Plan, w: Writer, pack, rows, rows_loops, vloop, ncols, elem_off, outer,
                    masked: bool = False) -> None:
        """The register block's accumulators loaded (or zeroed), its ``R1`` loops of FMAs, its store.
        ``masked``: the tail copy of a masked padded sketch, whose column ``c`` holds ``vrem - c * vec``
        valid lanes: the accumulators and the in-place data are loaded, and the results stored, under masks."""
        d = self.d
        S = d.scalar(plan.dtypes.accumulator)
        size = _itemsize(plan.dtypes.accumulator)
        L, B, vec = plan.levels, plan.buffers, plan.vec
        r0, r1 = _live(L["R0"]), _live(L["R1"])
        acc = B[plan.acc]
        T = d.vector_type if vec > 1 else S
        acc_vs = acc.stride(vloop.var) if vloop is not None else 0

        def lanes(col: int) -> str:
            return f"vrem - {col * vec}" if col else "vrem"

        def load(ptr: str, stride: int, col: int, mask: bool) -> str:
            if not (masked and mask):
                return self._load(ptr, stride, vec, size)
            if vec == 1:
                return f"({lanes(col)} > 0 ? {d.load_scalar.format(ptr=ptr)} : {d.zero})"
            return d.load_masked.format(vec=vec, ptr=ptr, n=lanes(col))

        w.open("if (first)")
        for ri in range(len(rows)):
            for c in range(ncols):
                w(f"acc_{ri}_{c} = {d.vector_zero.format(T=T)};" if vec > 1 else f"acc_{ri}_{c} = {d.zero};")
        w.close(" else {")
        w.depth += 1
        for ri, row in enumerate(rows):
            for c in range(ncols):
                ld = load(f"{plan.acc} + acc_base + {elem_off(acc, row, c)}", acc_vs, c, True)
                w(f"acc_{ri}_{c} = {ld};")
        w.close()
        # operand base pointers (outer loops incl. R0)
        ops = [B["data"] if pack is None else pack.buf, B["weight"]]
        for op in ops:
            base = (PACK_NAME if pack is not None and op is pack.buf
                    else f"{op.name} + {_affine(_offset(op, outer + r0))}")
            if op.name == "data" and plan.tail_row >= 0:  # rows of the partial block(s): from data_tail
                t = dict(zip([a.name for a in plan.space.axes], plan.config.tiles))["m"]
                row = _affine({lp.var: math.prod(t[lp.level + 1:]) for lp in outer if lp.axis == "m"})
                off = _affine(_offset(op, outer + r0))
                cols = plan.buffers["data_tail"].layout.shape[-1]
                base = (f"({row}) >= {plan.tail_row} ? data_tail + ({off} - {plan.tail_row * cols}) : "
                        f"data + ({off})")
            w(f"const {d.scalar(op.dtype)}* {d.restrict} {op.name}_p = {base};")
        pointers = {op.name: f"{op.name}_p" for op in ops}
        self._hooks(plan, "r1_before", w, pointers, tuple(r1))
        # R1 loops
        # the knob is a *max* unroll step; the emitted unroll is also capped so the unrolled body stays
        # under MAX_UNROLLED_FMAS statements (a 256x unroll of a 25-accumulator block takes gcc ~50 s)
        fmas = max(1, len(rows) * ncols)
        cap = 1 << max(0, (MAX_UNROLLED_FMAS // fmas).bit_length() - 1)
        unroll = min(plan.unroll, cap)
        cum = 1
        unroll_pragmas = {}
        mem_bcast = bool(d.bcast8) and self._memory_broadcasts(plan)
        sliding = set() if mem_bcast else _sliding_loops(
            r1, ops, [[elem_off(op, row, c) for row in rows for c in range(ncols)] for op in ops])
        for lp in reversed(r1):
            if lp.var in sliding:
                unroll_pragmas[lp.var] = 1  # explicit: gcc would peel a 3-trip loop on its own
            elif lp is r1[-1]:
                n = min(unroll, lp.extent)
                if n > 1:
                    unroll_pragmas[lp.var] = n
            elif cum * lp.extent <= unroll:
                unroll_pragmas[lp.var] = lp.extent
            cum *= lp.extent
        pairs = plan.pairs > 1  # int8: the innermost R1 loop 2 / 4 at a time (codegen.lower.int8_pairs)
        for lp in r1:
            if lp.var in unroll_pragmas and d.unroll:
                w(d.unroll.format(n=unroll_pragmas[lp.var]))
            w.open(d.loop_step.format(var=lp.var, n=lp.extent, step=plan.pairs) if pairs and lp is r1[-1]
                   else d.loop.format(var=lp.var, n=lp.extent))
        self._hooks(plan, "r1_body", w, pointers, tuple(r1))
        pin = bool(d.pin) and self._pinned(plan)
        in_place = plan.space.masked == "data"  # the data read in place: its tail vectors under masks
        names: dict[tuple, str] = {}

        def key(op: Buffer, row: tuple[int, ...], c: int) -> tuple:
            # a masked tail's data vector differs by column even where two offsets coincide
            masks = masked and in_place and op.name == "data" and vloop is not None and op.stride(vloop.var)
            return op.name, elem_off(op, row, c), c if masks else None

        for op in ops:
            r1off = _affine(_offset(op, r1))
            vs = op.stride(vloop.var) if vloop is not None else 0
            for row in rows:
                for c in range(ncols):
                    off = elem_off(op, row, c)
                    if key(op, row, c) in names:
                        continue
                    nm = f"{op.name[0]}{len(names)}"
                    names[key(op, row, c)] = nm
                    ptr = f"{op.name}_p + {r1off} + {off}" if r1off != "0" else f"{op.name}_p + {off}"
                    if pairs:
                        w(f"const {d.madd_types[vec]} {nm} = {self._pair_operand(plan, op, r1off, off, r1[-1])};")
                        continue
                    if vs == 0:  # broadcast operand: one scalar per row
                        elem = f"{op.name}_p[{r1off} + {off}]" if r1off != "0" else f"{op.name}_p[{off}]"
                        if mem_bcast and op.dtype == "float32":
                            w(f"const {T} {nm} = {d.bcast8.format(ptr='&' + elem)};")
                        elif vec > 1 and plan.dtypes.accumulator == "float16":
                            # a _Float16 scalar is evaluated in float (excess precision), which does not
                            # convert to a _Float16 vector implicitly: broadcast it explicitly
                            w(f"const {S} {nm}_s = {elem};")
                            w(f"const {T} {nm} = ({T}){{{', '.join([nm + '_s'] * vec)}}};")
                        else:
                            w(f"const {S} {nm} = {self._widen_scalar(plan, op, elem)};")
                    elif op.dtype != plan.dtypes.accumulator:  # low precision: widening load
                        w(f"const {T} {nm} = {self._widen_load(plan, op, ptr, vs)};")
                    elif pin:  # not const: the pin claims to rewrite it
                        w(f"{T} {nm} = {load(ptr, vs, c, in_place and op.name == 'data')};")
                        w(d.pin.format(v=nm, vec=vec))
                    else:
                        w(f"const {T} {nm} = {load(ptr, vs, c, in_place and op.name == 'data')};")
        for ri, row in enumerate(rows):
            for c in range(ncols):
                a, b = names[key(ops[0], row, c)], names[key(B["weight"], row, c)]
                dot4 = d.dot4 if plan.space.target.avx512_vnni else d.dot4_avx2
                tmpl = {4: dot4.get(vec), 2: d.madd.get(vec)}.get(plan.pairs, d.fma)
                w(tmpl.format(acc=f"acc_{ri}_{c}", a=a, b=b))
        for _ in r1:
            w.close()
        self._hooks(plan, "r1_after", w, pointers, tuple(r1))
        # store
        for ri, row in enumerate(rows):
            for c in range(ncols):
                off = elem_off(acc, row, c)
                if masked and vec == 1:
                    w(f"if ({lanes(c)} > 0) {plan.acc}[acc_base + {off}] = acc_{ri}_{c};")
                elif masked:
                    w(d.store_masked.format(vec=vec, ptr=f"{plan.acc} + acc_base + {off}", n=lanes(c), v=f"acc_{ri}_{c}"))
                elif vec == 1:
                    w(f"{plan.acc}[acc_base + {off}] = acc_{ri}_{c};")
                elif acc_vs == 1:
                    w(d.store_unaligned.format(ptr=f"{plan.acc} + acc_base + {off}", v=f"acc_{ri}_{c}"))
                else:
                    for j in range(vec):
                        w(f"{plan.acc}[acc_base + {off + j * acc_vs}] = {d.lane.format(v=f'acc_{ri}_{c}', j=j)};")

    @staticmethod
    def _scalar_taps(plan: Plan) -> bool:
        """Whether a blocked conv (``conv_nchwc``) runs with scalar accumulators (``vec`` 1) over a kernel
        wider than one tap: gcc's predictive commoning then took 90 s at -O3 on a 5x5 conv whose tap loop
        was rolled inside unrolled channel loops (0.8 s without it; hypothesis found it as a 60 s build
        timeout), so such kernels are compiled without it."""
        if plan.space.sketch.base != "conv_nchwc" or plan.vec != 1:
            return False
        return {a.name: a.extent for a in plan.space.axes}.get("rx", 1) > 1

    @staticmethod
    def _memory_broadcasts(plan: Plan) -> bool:
        """Whether a blocked conv's (``conv_nchwc``) data elements are broadcast straight from memory
        (:attr:`Dialect.bcast8`) and its kernel-width loop left to gcc: float32, 8-lane vectors, a
        kernel wider than one tap and a register block of several pixels along the row. As a scalar
        load + register broadcast gcc kept the broadcasts of the block's overlapping pixels alive across
        the tap loop (rolled: the scalars rotated through registers each tap; unrolled: spills).
        Measured side by side (AVX2 EPYC, 1 thread, defaults): 8 blocked 3x3 convs geomean 1.33x
        (512x7x7 23 -> 38-52 GFLOP/s, 64x32x32 39 -> 60; 64x56x56 0.93-1.38x), 8 held-out ones 1.15x;
        3x3 at stride 2 0.81-1.04x (4 convs): not there, but 5x5 / 7x7 at stride 2 (a 7x7 stem 1.31x, 6
        held-out 1.11-1.46x) yes; on NCHW kernels (broadcast weights shared by several columns) it halved
        the speed, on blocked 1x1s 0.87-1.03x: not there either (``benchmarks/blocked_bcast.py``)."""
        if plan.space.sketch.base != "conv_nchwc" or plan.pairs > 1 or plan.vec != 8:
            return False
        if plan.dtypes.accumulator != "float32" or plan.dtype != np.float32:
            return False
        s3 = {lp.axis: lp.extent for lp in plan.levels["S3"]}
        ext = {a.name: a.extent for a in plan.space.axes}
        stride_x = tuple(plan.space.task.p.get("stride", (1, 1)))[-1]
        return ext.get("rx", 1) > 1 and s3.get("x", 1) > 1 and (stride_x == 1 or ext["rx"] >= 5)

    @staticmethod
    def _pinned(plan: Plan) -> bool:
        """Whether the register block's vector operands are pinned (:attr:`Dialect.pin`): float32, one
        operand broadcast and the other loaded as vectors, reused by several rows, and the accumulators,
        the distinct vectors and the broadcasts together within the vector registers. Measured (AVX2
        EPYC, 1 thread, side by side): conv_nchwc 64x14x14 -> 384 1x1 with 2 out blocks x 2x2 pixels
        44 -> 62 GFLOP/s, 4 blocks x 1x2 52 -> 61; 3 blocks x 2x2 (19 registers: not pinned) would spill."""
        if plan.pairs > 1 or plan.vec == 1 or plan.dtypes.accumulator != "float32" or plan.dtype != np.float32:
            return False
        s3 = {lp.axis: lp.extent for lp in plan.levels["S3"]}
        v = plan.vector_axis
        data, weight = plan.buffers["data"], plan.buffers["weight"]
        rows = math.prod(e for a, e in s3.items() if a != v)
        cols = max(1, s3.get(v, 1) // plan.vec)
        if (data.stride(f"{v}3") == 0) == (weight.stride(f"{v}3") == 0):  # both broadcast or both vectors
            return False
        vec_op, bc_op = (weight, data) if data.stride(f"{v}3") == 0 else (data, weight)
        # distinct vectors / broadcasts: the rows a vector operand does not depend on share it
        vectors = cols * math.prod(e for a, e in s3.items() if a != v and vec_op.stride(f"{a}3"))
        scalars = math.prod(e for a, e in s3.items() if a != v and bc_op.stride(f"{a}3"))
        regs = int(plan.space.target.vector_registers)
        return vectors < rows * cols and rows * cols + vectors + scalars <= regs

    def _epilogue(self, plan: Plan, w: Writer) -> None:
        """After an S1 tile's reduction: out = act(acc + bias + residual), unpacking a blocked scratch."""
        d = self.d
        S = d.scalar("float32")  # the epilogue computes in float32 (low precision: dequantized / widened)
        L = plan.levels
        B = plan.buffers
        task = plan.space.task
        w("/* fused epilogue over this S1 tile */")
        loops = [lp for a in plan.con.spatial for lp in (L["S2"] + L["S3"]) if lp.axis == a.name and lp.extent > 1]
        # walk the accumulator in memory order (largest stride outermost, a stable sort): for a channel-blocked
        # scratch this reads it sequentially and keeps the blocked lanes innermost; the per-axis order (lanes
        # outside the spatial loops) hopped 4 KiB apart on both buffers and cost up to 7x the whole main nest
        loops = sorted(loops, key=lambda lp: -B[plan.acc].stride(lp.var))
        outer = [lp for name in ("S0", "S1") for lp in _live(L[name])]
        allv = outer + loops
        # a padded sketch: only the in-range outputs are written (the scratch is cropped); the innermost
        # loop's own guard becomes its trip count, the guards without its variable are tested before it
        inner = loops[-1] if loops else None
        outside, inside, bound = _pad_guards(plan, allv, inner)
        for i, lp in enumerate(loops):
            if lp is inner:
                if outside:
                    w.open(f"if ({' && '.join(outside)})")
                if d.simd:
                    w(d.simd)
            w.open(d.loop.format(var=lp.var, n=bound if (bound and lp is inner) else lp.extent))
        if inner is None and outside:  # no loops: the guard around the single output
            inside = outside
        if inside:
            w.open(f"if ({' && '.join(inside)})")
        out = B.get("out_api", B["out"])  # the real output's strides (padded sketches)
        accv = f"{plan.acc}[{_affine(_offset(B[plan.acc], allv))}]"
        if "w_scales" in B:  # int8: dequantize the exact int32 sum
            ch = _affine(_offset(B["w_scales"], allv))
            if plan.pairs == 4:  # VNNI summed raw data: subtract zero point x sum of the channel's weights
                accv = f"({accv} - xzpe * wsum[{ch}])"
            w(f"{S} v = ({S}){accv} * (xs * w_scales[{ch}]);")
        else:
            w(f"{S} v = {accv};")
        if "bias" in B:
            w(f"v += bias[{_affine(_offset(B['bias'], allv))}];")
        if "residual" in B:
            w(f"v += residual[{_affine(_offset(out, allv))}];")
        result = d.activations[task.act].format(v="v")
        if "y_zp" in B:  # requantize: round half to even (nearbyintf), zero point, saturate to int8
            w(f"{S} q = nearbyintf({result} / ys) + ({S})yzp;")
            result = "(signed char)(q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q))"
        elif out.dtype != "float32":
            result = f"({d.scalar(out.dtype)})({result})"
        w(f"out[{_affine(_offset(out, allv))}] = {result};")
        if inside:
            w.close()
        for _ in loops:
            w.close()
        if inner is not None and outside:
            w.close()
