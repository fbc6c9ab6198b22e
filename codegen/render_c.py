"""C renderer: a lowered :class:`~codegen.lower.Plan` -> readable C source with the kernel ABI.

The structure mirrors the plan: an optional timed input copy (padding / channel blocking), the main
nest ``S0 S1 R0 S2 R1 S3`` with the outer ``S0`` loops fused into one OpenMP parallel loop, a register
block of GCC-vector accumulators held across the ``R1`` loop, and the fused epilogue after each ``S1``
tile's reduction. For ``gemm_packed``, where the register block's data rows would thrash one L1 set
(rows a multiple of 4 KiB apart outnumbering the L1 ways, e.g. 16 rows of a K=1024 matrix), the data
micro-panel is copied (timed) into a padded contiguous stack buffer inside the ``S2`` loops and reused
by the inner ``S2`` loops: a function of the config, not a knob (see :func:`_data_pack`). Target-specific spellings (vector types, loads, pragmas) live in :data:`C_DIALECT`
so a CUDA renderer can share :func:`render_body` helpers and differ in tables.

ABI (every kernel library exports):

* ``void fj_kernel(float* const* bufs)``: ``bufs`` = kernel inputs (``Plan.args`` order: data,
  packed weights, bias, residual), then the output, then the workspace;
* ``double fj_time(float* const* bufs, long number)``: seconds for ``number`` back-to-back calls;
* ``void fj_set_threads(int n)``.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> sp = Space(matmul(64, 64, 64), "gemm_packed", Target.cpu())
    >>> "fj_kernel" in render(lower(sp, sp.default()))
    True
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from .lower import Buffer, Loop, Plan
from .measure import TIMING_HARNESS_C

C_DIALECT = {
    "prelude": (
        "#include <math.h>\n#include <stddef.h>\n#include <time.h>\n#include <omp.h>\n"
    ),
    "restrict": "restrict",
    "parallel_for": "#pragma omp parallel for schedule(static)",
    "unroll": "#pragma GCC unroll {n}",
    "simd": "#pragma omp simd",
}

MAX_UNROLLED_FMAS = 2048

# Compare-and-select, not fmaxf/fminf: without -ffinite-math-only gcc emits a libm call per element for
# those (the relu6 epilogue of a 1x1 conv then cost 4x its FMAs); a select vectorizes, and lets a NaN
# pass as numpy's maximum / clip do.
_ACT = {None: "{v}", "relu": "({v} < 0.0f ? 0.0f : {v})",
        "relu6": "({v} < 0.0f ? 0.0f : ({v} > 6.0f ? 6.0f : {v}))"}


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.depth + line) if line else "")

    def open(self, line: str) -> None:
        self(line + " {")
        self.depth += 1

    def close(self, tail: str = "") -> None:
        self.depth -= 1
        self("}" + tail)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _affine(terms: dict[str, int], const: int = 0) -> str:
    """Render sum(coeff * var) + const as a C expression (vars are long)."""
    parts = [(f"{c}*{v}" if c != 1 else v) for v, c in sorted(terms.items()) if c]
    if const or not parts:
        parts.append(str(const))
    return " + ".join(parts)


def _offset(buf: Buffer, loops: list[Loop]) -> dict[str, int]:
    """The strides of ``buf`` restricted to the given (non-trivial) loops."""
    return {lp.var: buf.stride(lp.var) for lp in loops if lp.extent > 1 and buf.stride(lp.var)}


def _live(loops: tuple[Loop, ...]) -> list[Loop]:
    return [lp for lp in loops if lp.extent > 1]


def render(plan: Plan) -> str:
    """Full C source of one kernel: header comment, vector types, ``fj_kernel`` and the harness."""
    task, cfg = plan.space.task, plan.config
    w = _Writer()
    w("/* felixjax generated kernel")
    w(f" * task:   {task.name}  ({task.key})")
    w(f" * sketch: {cfg.sketch}")
    w(f" * config: {cfg.dumps()}")
    w(" * loop order S0 S1 R0 S2 R1 S3; S3 is a register block held across R1. */")
    w(C_DIALECT["prelude"].rstrip("\n"))
    if plan.vec > 1:
        w(f"typedef float vf __attribute__((vector_size({4 * plan.vec})));")
        w(f"typedef float vfu __attribute__((vector_size({4 * plan.vec}), aligned(4)));  /* unaligned */")
    w()
    render_kernel(plan, w)
    return w.text() + TIMING_HARNESS_C


def render_kernel(plan: Plan, w: _Writer, *, name: str = "fj_kernel", static: bool = False,
                  local_types: bool = False) -> None:
    """Render only the kernel function of ``plan`` into ``w``.

    ``name`` renames the function and ``static`` gives it internal linkage, so several kernels can share
    one translation unit (the whole-network build). ``local_types`` declares the vector types ``vf`` /
    ``vfu`` inside the function body, since kernels of one file may use different vector widths.
    """
    r = C_DIALECT["restrict"]
    B = plan.buffers
    if not (name.isascii() and name.isidentifier()):
        raise ValueError(f"kernel name {name!r} is not a C identifier")
    w.open(f"{'static ' if static else ''}void {name}(float* const* bufs)")
    if local_types and plan.vec > 1:
        w(f"typedef float vf __attribute__((vector_size({4 * plan.vec})));")
        w(f"typedef float vfu __attribute__((vector_size({4 * plan.vec}), aligned(4)));")
    for i, name in enumerate(plan.args):
        const = "" if name == "out" else "const "
        w(f"{const}float* {r} {name} = bufs[{i}];")
    w(f"float* {r} ws = bufs[{len(plan.args)}];")
    for name, buf in B.items():
        if buf.storage == "workspace":
            w(f"float* {r} {name} = ws + {buf.ws_offset};")
    w("(void)ws;")
    if plan.data_copy:
        _render_data_copy(plan, w)
    _render_main(plan, w)
    w.close()


def _render_data_copy(plan: Plan, w: _Writer) -> None:
    """Timed layout change of the data input: zero padding and optional channel blocking."""
    con = plan.con
    dst = plan.buffers["data"].layout
    shape = dst.shape
    w(f"/* copy the data input into its padded{' / blocked' if any(d.kind == 'block' for d in dst.dims) else ''}"
      f" layout (timed) */")
    # loop over the logical padded coordinates; the innermost dimension is vectorizable
    names = [f"i{d}" for d in range(len(shape))]
    w(C_DIALECT["parallel_for"] + (" collapse(2)" if len(shape) > 1 else ""))
    for d, n in enumerate(shape):
        if d == len(shape) - 1:
            w(C_DIALECT["simd"])
        w.open(f"for (long {names[d]} = 0; {names[d]} < {n}; ++{names[d]})")
    dst_terms = []
    for d, dl in enumerate(dst.dims):
        if dl.kind == "plain":
            dst_terms.append(f"{dl.stride}*{names[d]}")
        else:
            dst_terms.append(f"{dl.stride}*({names[d]} / {dl.block}) + {names[d]} % {dl.block}")
    api = con.data_api_shape
    src_strides = [math.prod(api[d + 1:]) for d in range(len(api))]
    conds, src_terms = [], []
    for d, (before, _after) in enumerate(con.pad):
        idx = f"({names[d]} - {before})" if before else names[d]
        if before or _after:
            conds.append(f"{idx} >= 0 && {idx} < {api[d]}")
        src_terms.append(f"{src_strides[d]}*{idx}")
    cond = " && ".join(conds) if conds else "1"
    w(f"data[{' + '.join(dst_terms)}] = ({cond}) ? data_in[{' + '.join(src_terms)}] : 0.0f;")
    for _ in shape:
        w.close()


def _render_main(plan: Plan, w: _Writer) -> None:
    L = plan.levels
    B = plan.buffers
    fused = _live(plan.parallel)
    serial_s0 = _live(L["S0"][len(plan.parallel):])
    w("/* main nest: S0 S1 R0 S2 R1 S3 */")
    depth0 = w.depth
    if fused:
        total = math.prod(lp.extent for lp in fused)
        if total > 1:
            w(C_DIALECT["parallel_for"])
        w.open(f"for (long fused = 0; fused < {total}; ++fused)")
        for i, lp in enumerate(fused):
            below = math.prod(f.extent for f in fused[i + 1:])
            expr = f"fused / {below}" if below > 1 else "fused"
            w(f"const long {lp.var} = {expr if i == 0 else f'({expr}) % {lp.extent}'};")
    for lp in serial_s0 + _live(L["S1"]):
        w.open(f"for (long {lp.var} = 0; {lp.var} < {lp.extent}; ++{lp.var})")
    # ---- reduction R0, S2, register block -------------------------------------------------------
    r0 = _live(L["R0"])
    for lp in r0:
        w.open(f"for (long {lp.var} = 0; {lp.var} < {lp.extent}; ++{lp.var})")
    first = " && ".join(f"{lp.var} == 0" for lp in r0) or "1"
    w(f"const int first = {first};")
    pack = _data_pack(plan)
    for i, lp in enumerate(_live(L["S2"])):
        w.open(f"for (long {lp.var} = 0; {lp.var} < {lp.extent}; ++{lp.var})")
        if pack is not None and i == pack.after:
            _render_data_pack(plan, pack, w)
    if pack is not None and pack.after < 0:
        _render_data_pack(plan, pack, w)
    _render_register_block(plan, w, pack)
    for _ in _live(L["S2"]):
        w.close()
    for _ in r0:
        w.close()
    if plan.epilogue:
        _render_epilogue(plan, w)
    while w.depth > depth0:
        w.close()


PACK_NAME = "dpack"
PACK_MIN_REUSE = 2  # pack only when the micro-panel is reused by at least this many register blocks
PACK_MAX_FLOATS = 16384  # 64 KiB of stack per thread at most
PACK_PAD = 16  # floats between packed rows (one cache line): consecutive rows fall in different L1 sets
L1_SET_BYTES = 4096  # bytes of address space one L1 way covers (64 sets x 64 B on every x86 core)


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
        off = 4 * sum(data.stride(lp.var) * i for lp, i in zip(rows, row))
        key = (off % L1_SET_BYTES) // 64
        sets[key] = sets.get(key, 0) + 1
    return max(sets.values(), default=0)


def _data_pack(plan: Plan) -> "_DataPack | None":
    """The data micro-panel pack of a ``gemm_packed`` plan, made only where it pays: the register
    block's data rows thrash an L1 set (more rows in one set than the L1 has ways) and the panel is
    reused by at least :data:`PACK_MIN_REUSE` register blocks. Not a knob: a function of the config."""
    if plan.config.sketch != "gemm_packed" or plan.data_copy:
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


def _render_data_pack(plan: Plan, pack: _DataPack, w: _Writer) -> None:
    """Copy the data micro-panel of the current S2 position into ``dpack`` (timed, in the kernel)."""
    L, data = plan.levels, plan.buffers["data"]
    outer = [lp for name in ("S0", "S1", "R0") for lp in _live(L[name])]
    outer += _live(L["S2"])[: pack.after + 1]
    k = pack.r1
    w(f"/* pack the data micro-panel: {math.prod(lp.extent for lp in pack.rows)} rows x {k.extent} */")
    w(f"float {PACK_NAME}[{pack.size}] __attribute__((aligned(64)));")
    w("{")
    w.depth += 1
    w(f"const float* {C_DIALECT['restrict']} src = data + {_affine(_offset(data, outer))};")
    for row in itertools.product(*[range(lp.extent) for lp in pack.rows]):
        so = sum(data.stride(lp.var) * i for lp, i in zip(pack.rows, row))
        po = sum(pack.buf.stride(lp.var) * i for lp, i in zip(pack.rows, row))
        w(C_DIALECT["simd"])
        w(f"for (long {k.var} = 0; {k.var} < {k.extent}; ++{k.var}) "
          f"{PACK_NAME}[{po} + {k.var}] = src[{so} + {k.var}];")
    w.depth -= 1
    w("}")


def _render_register_block(plan: Plan, w: _Writer, pack: "_DataPack | None" = None) -> None:
    """Accumulators in registers across the R1 loop: load (or zero), R1 FMAs, store. With a data
    ``pack``, the data operand is read from the packed micro-panel instead of the data buffer."""
    L = plan.levels
    B = plan.buffers
    vec = plan.vec
    vaxis = plan.vector_axis
    s3 = [lp for lp in L["S3"] if lp.extent > 1]
    rows_loops = [lp for lp in s3 if lp.axis != vaxis]
    vloop = next((lp for lp in L["S3"] if lp.axis == vaxis), None)
    ncols = (vloop.extent if vloop else 1) // vec
    rows = list(itertools.product(*[range(lp.extent) for lp in rows_loops]))
    outer = [lp for name in ("S0", "S1", "S2") for lp in _live(L[name])]
    r0 = _live(L["R0"])
    r1 = _live(L["R1"])
    acc = B[plan.acc]
    T = "vf" if vec > 1 else "float"
    w("/* register block: %d row(s) x %d column(s) of %s accumulators */" % (len(rows), ncols,
                                                                           f"{vec}-lane" if vec > 1 else "scalar"))
    w("{")
    w.depth += 1
    w(f"const long acc_base = {_affine(_offset(acc, outer))};")

    def elem_off(buf: Buffer, row: tuple[int, ...], col: int) -> int:
        off = sum(buf.stride(lp.var) * i for lp, i in zip(rows_loops, row))
        if vloop is not None:
            off += buf.stride(vloop.var) * col * vec
        return off

    def load(ptr: str, stride: int) -> str:
        if vec == 1:
            return f"*({ptr})"
        if stride == 1:
            return f"*(const vfu*)({ptr})"
        if stride == 2:
            # two overlapping loads of ptr[0 .. 2*vec-2] and one two-source permute (vpermi2ps), not
            # vec scalar loads and inserts; the second load starts at vec-1 so nothing past the last
            # element used is read
            idx = ", ".join(str(2 * j if 2 * j < vec else 2 * j + 1) for j in range(vec))
            return (f"__builtin_shuffle(*(const vfu*)({ptr}), *(const vfu*)({ptr} + {vec - 1}), "
                    f"(int __attribute__((vector_size({4 * vec})))){{{idx}}})")
        lanes = ", ".join(f"({ptr})[{j * stride}]" for j in range(vec))
        return f"(vf){{{lanes}}}"

    acc_vs = acc.stride(vloop.var) if vloop is not None else 0
    for ri, row in enumerate(rows):
        for c in range(ncols):
            w(f"{T} acc_{ri}_{c};")
    w.open("if (first)")
    for ri in range(len(rows)):
        for c in range(ncols):
            w(f"acc_{ri}_{c} = ({T}){{0}};" if vec > 1 else f"acc_{ri}_{c} = 0.0f;")
    w.close(" else {")
    w.depth += 1
    for ri, row in enumerate(rows):
        for c in range(ncols):
            w(f"acc_{ri}_{c} = {load(f'{plan.acc} + acc_base + {elem_off(acc, row, c)}', acc_vs)};")
    w.close()
    # operand base pointers (outer loops incl. R0)
    ops = [B["data"] if pack is None else pack.buf, B["weight"]]
    for op in ops:
        base = PACK_NAME if pack is not None and op is pack.buf else f"{op.name} + {_affine(_offset(op, outer + r0))}"
        w(f"const float* {C_DIALECT['restrict']} {op.name}_p = {base};")
    # R1 loops
    # the knob is a *max* unroll step; the emitted unroll is also capped so the unrolled body stays
    # under MAX_UNROLLED_FMAS statements (a 256x unroll of a 25-accumulator block takes gcc ~50 s)
    fmas = max(1, len(rows) * ncols)
    cap = 1 << max(0, (MAX_UNROLLED_FMAS // fmas).bit_length() - 1)
    unroll = min(plan.unroll, cap)
    cum = 1
    unroll_pragmas = {}
    for lp in reversed(r1):
        if lp is r1[-1]:
            n = min(unroll, lp.extent)
            if n > 1:
                unroll_pragmas[lp.var] = n
        elif cum * lp.extent <= unroll:
            unroll_pragmas[lp.var] = lp.extent
        cum *= lp.extent
    for lp in r1:
        if lp.var in unroll_pragmas:
            w(C_DIALECT["unroll"].format(n=unroll_pragmas[lp.var]))
        w.open(f"for (long {lp.var} = 0; {lp.var} < {lp.extent}; ++{lp.var})")
    names: dict[tuple[str, int], str] = {}
    for op in ops:
        r1off = _affine(_offset(op, r1))
        vs = op.stride(vloop.var) if vloop is not None else 0
        for row in rows:
            for c in range(ncols):
                off = elem_off(op, row, c)
                if (op.name, off) in names:
                    continue
                nm = f"{op.name[0]}{len(names)}"
                names[(op.name, off)] = nm
                ptr = f"{op.name}_p + {r1off} + {off}" if r1off != "0" else f"{op.name}_p + {off}"
                if vs == 0:  # broadcast operand: one scalar per row
                    w(f"const float {nm} = {op.name}_p[{r1off} + {off}];" if r1off != "0" else
                      f"const float {nm} = {op.name}_p[{off}];")
                else:
                    w(f"const {T} {nm} = {load(ptr, vs)};")
    for ri, row in enumerate(rows):
        for c in range(ncols):
            a = names[("data", elem_off(ops[0], row, c))]
            b = names[("weight", elem_off(B["weight"], row, c))]
            w(f"acc_{ri}_{c} += {a} * {b};")
    for _ in r1:
        w.close()
    # store
    for ri, row in enumerate(rows):
        for c in range(ncols):
            off = elem_off(acc, row, c)
            if vec == 1:
                w(f"{plan.acc}[acc_base + {off}] = acc_{ri}_{c};")
            elif acc_vs == 1:
                w(f"*(vfu*)({plan.acc} + acc_base + {off}) = acc_{ri}_{c};")
            else:
                for j in range(vec):
                    w(f"{plan.acc}[acc_base + {off + j * acc_vs}] = acc_{ri}_{c}[{j}];")
    w.close()


def _render_epilogue(plan: Plan, w: _Writer) -> None:
    """After an S1 tile's reduction: out = act(acc + bias + residual), unpacking a blocked scratch."""
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
    for i, lp in enumerate(loops):
        if i == len(loops) - 1:
            w(C_DIALECT["simd"])
        w.open(f"for (long {lp.var} = 0; {lp.var} < {lp.extent}; ++{lp.var})")
    w(f"float v = {plan.acc}[{_affine(_offset(B[plan.acc], allv))}];")
    if "bias" in B:
        w(f"v += bias[{_affine(_offset(B['bias'], allv))}];")
    if "residual" in B:
        w(f"v += residual[{_affine(_offset(B['residual'], allv))}];")
    w(f"out[{_affine(_offset(B['out'], allv))}] = {_ACT[task.act].format(v='v')};")
    for _ in loops:
        w.close()
