"""C source of the sparse sketch (:mod:`codegen.sparse`, :mod:`codegen.sparse_lower`): block-sparse rows.

The weights are ``static const`` arrays of the source (values, block columns, block-row pointers),
never unrolled into code, so a kernel's size grows with its non-zeros as data. Its structure::

    X = data / x.T / im2col(image)                         (timed copy into the workspace, if any)
    parallel for each block-row ob (br output features):
      for each column block of ts columns (s):             (S > 1: vectors along s)
        acc[br][ts / vec] = 0
        for each kept block p of block-row ob:             (#pragma GCC unroll <unroll>)
          for j < bc: x = X[col[p] + j, s .. s + ts]; acc[i] += w[p, i, j] * x   for i < br
        epilogue (bias, residual, activation) and store
    with one column (S == 1, a batch-1 dense layer): ``unroll`` partial sums per row instead of vectors
    (no reassociation flags: independent sums hide the FMA latency), added at the end.

Zero blocks are never visited. The kernel ABI is every kernel's (:mod:`codegen.renderers`); its
weight argument is unused (a 16-float token: the Python side checks the weights' fingerprint).

Example:
    >>> from codegen.ops import dense
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> sp = Space(dense(1, 16, 8, sparsity=0.5), "sparse_bsr", Target.cpu())
    >>> src = render_sparse(lower(sp, sp.default()))
    >>> "static const float" in src and "fj_time" in src
    True
"""
from __future__ import annotations

import numpy as np

from .cstyle import Writer
from .harness import TIMING_HARNESS_C

PRELUDE = "#include <math.h>\n#include <stddef.h>\n#include <time.h>\n#include <omp.h>\n"
LINE_BYTES = 96  # weight bytes per source line


def _escape_table() -> np.ndarray:
    """C string-literal spelling of every byte: printable ASCII as itself (but ``"``, ``\\``, ``?``), else a
    3-digit octal escape (never followed by a misread digit: octal escapes stop at 3 digits)."""
    out = []
    for b in range(256):
        ch = chr(b)
        out.append(ch if 32 <= b < 127 and ch not in '"\\?' else f"\\{b:03o}")
    return np.array(out, dtype=object)


_ESCAPES = _escape_table()


def _string_lines(blob: bytes) -> list[str]:
    """``blob`` as C string-literal lines (about ``LINE_BYTES`` bytes each)."""
    codes = _ESCAPES[np.frombuffer(blob, np.uint8)]
    return ['"' + "".join(codes[i:i + LINE_BYTES]) + '"' for i in range(0, len(codes), LINE_BYTES)] or ['""']


def _pad64(b: bytes) -> bytes:
    return b + bytes(-len(b) % 64)


def _static_data(plan, w: Writer, prefix: str) -> None:
    """One ``static const`` blob (a string literal: compiles about 15x faster than a float initializer
    list of the same size) holding the values, block columns and block-row pointers, 64-byte aligned,
    read through a union (type punning through a union is defined in GNU C)."""
    b = plan.blocks
    short = b.cols <= 65535
    vals = _pad64(np.ascontiguousarray(b.values, np.float32).tobytes())
    cols = _pad64(np.ascontiguousarray(b.block_col, np.uint16 if short else np.int32).tobytes())
    ptrs = _pad64(np.ascontiguousarray(b.block_ptr, np.int32).tobytes())
    n = len(vals) + len(cols) + len(ptrs)
    w(f"/* weights: {b.rows}x{b.cols} in {b.br}x{b.bc} blocks, {b.nnz_blocks} kept ({b.stored} values stored), "
      f"fingerprint {plan.weights_fingerprint}; bytes: values, block columns, block-row pointers */")
    w(f"static const union {{ unsigned char c[{n + 1}]; float f[{n // 4}]; int i[{n // 4}]; "
      f"unsigned short h[{n // 2}]; }} {prefix}_blob __attribute__((aligned(64))) = {{ .c =")
    for line in _string_lines(vals + cols + ptrs):
        w("  " + line)
    w("};")
    w(f"static const float* const {prefix}_val = {prefix}_blob.f;")
    if short:
        w(f"static const unsigned short* const {prefix}_col = {prefix}_blob.h + {len(vals) // 2};")
    else:
        w(f"static const int* const {prefix}_col = {prefix}_blob.i + {len(vals) // 4};")
    w(f"static const int* const {prefix}_ptr = {prefix}_blob.i + {(len(vals) + len(cols)) // 4};")


def _epilogue_value(plan, v: str, o: str, idx: str) -> list[str]:
    """Lines turning accumulator value ``v`` of feature ``o`` at output index ``idx`` into ``y``."""
    task = plan.space.task
    lines = [f"float y = {v};"]
    if task.bias:
        lines.append(f"y += bias[{o}];")
    if task.residual:
        lines.append(f"y += residual[{idx}];")
    if task.act == "relu":
        lines.append("y = y > 0.0f ? y : 0.0f;")
    elif task.act == "relu6":
        lines.append("y = y > 0.0f ? (y < 6.0f ? y : 6.0f) : 0.0f;")
    lines.append(f"out[{idx}] = y;")
    return lines


def _copy(plan, w: Writer, par: str) -> None:
    """The timed copy forming ``X [R, S]`` of batch item ``b`` in the workspace."""
    g, task = plan.geometry, plan.space.task
    if g.copy == "transpose":  # x [S, R] -> X [R, S] (padded: [R, cols], zeros past S)
        w(par)
        w(f"for (long r = 0; r < {g.R}; ++r) {{")
        w(f"  for (long s = 0; s < {g.S}; ++s) xt[r * {g.cols} + s] = data[s * {g.R} + r];")
        if g.cols > g.S:
            w(f"  for (long s = {g.S}; s < {g.cols}; ++s) xt[r * {g.cols} + s] = 0.0f;")
        w("}")
        return
    p = task.p
    c, h, wd = p["c"], p["h"], p["w"]
    kr, ks = p["r"], p["s"]
    (sh, sw), (dh, dw) = p["stride"], p["dilation"]
    pt, pl = p["pad"][0], p["pad"][1]
    _, _, oh, ow = task.output_shape
    w(f"/* im2col of image b (timed): X[(c * R + ry) * S + rx][y * {g.row_pad} + x], zeros for x >= {ow} */")
    w(par)
    w(f"for (long cr = 0; cr < {c * kr * ks}; ++cr) {{")
    w(f"  const long ci = cr / {kr * ks}, ry = cr / {ks} % {kr}, rx = cr % {ks};")
    w(f"  const float* src = data + (b * {c} + ci) * {h * wd};")
    w(f"  float* dst = xt + cr * {g.cols};")
    # the columns whose input lies inside the row, [xlo, xhi), computed once: no per-element test (gcc 12
    # -O3 miscompiled the guarded select of the earlier form: wrong columns, 1x1x6x3 3x3 p1, session 12)
    w(f"  const long t0 = {pl} - rx * {dw}, t1 = {wd - 1 + pl} - rx * {dw};")
    w(f"  long xlo = t0 > 0 ? (t0 + {sw - 1}) / {sw} : 0, xhi = t1 < 0 ? 0 : t1 / {sw} + 1;")
    w(f"  if (xlo > {ow}) xlo = {ow};")
    w(f"  if (xhi > {ow}) xhi = {ow};")
    w("  if (xhi < xlo) xhi = xlo;")
    w(f"  for (long y = 0; y < {oh}; ++y) {{")
    w(f"    const long iy = y * {sh} + ry * {dh} - {pt};")
    w(f"    float* drow = dst + y * {g.row_pad};")
    w(f"    if (iy < 0 || iy >= {h}) {{ for (long x = 0; x < {g.row_pad}; ++x) drow[x] = 0.0f; continue; }}")
    # the first in-image column's source (no pointer before the row); at stride 1 one memcpy: gcc 12.2's loop
    # vectorizer miscompiled the element loop there (session 79, a review: 1-wide kernels with padding, outputs
    # up to 1e35; a standalone copy got 240 values wrong at -O3 -march=native, none at -O2 or without vectorizing)
    w(f"    const float* srow = src + iy * {wd} + (xlo * {sw} - {pl} + rx * {dw});")
    w("    for (long x = 0; x < xlo; ++x) drow[x] = 0.0f;")
    if sw == 1:
        w("    if (xhi > xlo) __builtin_memcpy(drow + xlo, srow, (size_t)(xhi - xlo) * sizeof(float));")
    else:
        w(f"    for (long x = xlo; x < xhi; ++x) drow[x] = srow[(x - xlo) * {sw}];")
    w(f"    for (long x = xhi; x < {g.row_pad}; ++x) drow[x] = 0.0f;")
    w("  }")
    w("}")


def _out_index(plan, o: str, s: str) -> str:
    g = plan.geometry
    if g.op == "conv2d":
        return f"(b * {g.O} + {o}) * {g.S} + {s}"
    return f"({s}) * {g.O} + {o}"


def _rows_vector(plan, w: Writer, prefix: str) -> None:
    """S > 1: a register block of br rows x (ts / vec) vectors along s."""
    g, b = plan.geometry, plan.blocks
    br, bc, ts, vec = b.br, b.bc, plan.ts, plan.vec
    nv = ts // vec
    vt = "vf" if vec > 1 else "float"
    w(f"for (long st = 0; st < {g.cols}; st += {ts}) {{")
    for i in range(br):
        w("  " + " ".join(f"{vt} a{i}_{q} = {'(vf){0}' if vec > 1 else '0.0f'};" for q in range(nv)))
    # no more copies than the longest block-row has blocks: gcc took > 60 s on a 6x6x4 matmul whose
    # rows held one block each when asked for 512 copies of a loop with a run-time trip count
    unroll = min(plan.unroll, int(np.diff(b.block_ptr).max(initial=1)))
    if unroll > 1:
        w(f"  #pragma GCC unroll {unroll}")
    w(f"  for (int p = {prefix}_ptr[ob]; p < {prefix}_ptr[ob + 1]; ++p) {{")
    w(f"    const float* xr = xb + (long){prefix}_col[p] * {g.cols} + st;")
    w(f"    const float* wv = {prefix}_val + (long)p * {br * bc};")
    for j in range(bc):
        for q in range(nv):
            load = f"*(const vfu*)(xr + {j * g.cols + q * vec})" if vec > 1 else f"xr[{j * g.cols + q}]"
            w(f"    const {vt} x{j}_{q} = {load};")
        for i in range(br):
            for q in range(nv):
                w(f"    a{i}_{q} += wv[{i * bc + j}] * x{j}_{q};")
    w("  }")
    if g.padded:  # a block never straddles two rows (ts divides row_pad): outputs of real columns only
        w(f"  const long y0 = st / {g.row_pad}, x0 = st % {g.row_pad};")
    for i in range(br):
        o = f"ob * {br} + {i}"
        for q in range(nv):
            w("  {")
            w(f"    const long o = {o};")
            for lane in range(vec):
                val = f"a{i}_{q}[{lane}]" if vec > 1 else f"a{i}_{q}"
                c = q * vec + lane
                if g.padded:
                    idx = _out_index(plan, "o", f"y0 * {g.row} + x0 + {c}")
                    w(f"    if (x0 + {c} < {g.row}) {{ " + " ".join(_epilogue_value(plan, val, "o", idx)) + " }")
                else:
                    idx = _out_index(plan, "o", f"st + {c}")
                    w("    { " + " ".join(_epilogue_value(plan, val, "o", idx)) + " }")
            w("  }")
    w("}")


def _rows_scalar(plan, w: Writer, prefix: str) -> None:
    """S == 1: ``unroll`` (at most 8) partial sums per row, added at the end."""
    b = plan.blocks
    br, bc = b.br, b.bc
    parts = max(1, min(plan.unroll, 8))
    for i in range(br):
        w(" ".join(f"float a{i}_{u} = 0.0f;" for u in range(parts)))
    w(f"int p = {prefix}_ptr[ob];")
    w(f"const int e = {prefix}_ptr[ob + 1];")
    w(f"for (; p + {parts} <= e; p += {parts}) {{")
    for u in range(parts):
        w(f"  const float* x{u} = xb + {prefix}_col[p + {u}];")
        w(f"  const float* w{u} = {prefix}_val + (long)(p + {u}) * {br * bc};")
        for i in range(br):
            w(f"  a{i}_{u} += " + " + ".join(f"w{u}[{i * bc + j}] * x{u}[{j}]" for j in range(bc)) + ";")
    w("}")
    w("for (; p < e; ++p) {")
    w(f"  const float* x0 = xb + {prefix}_col[p];")
    w(f"  const float* w0 = {prefix}_val + (long)p * {br * bc};")
    for i in range(br):
        w(f"  a{i}_0 += " + " + ".join(f"w0[{i * bc + j}] * x0[{j}]" for j in range(bc)) + ";")
    w("}")
    for i in range(br):
        total = " + ".join(f"a{i}_{u}" for u in range(parts))
        w(f"{{ const long o = ob * {br} + {i}; " + " ".join(
            _epilogue_value(plan, f"({total})", "o", _out_index(plan, "o", "0"))) + " }")


def render_sparse_kernel(plan, w: Writer, *, name: str = "fj_kernel", static: bool = False,
                         local_types: bool = False) -> None:
    """The static weight arrays and the kernel function of a sparse plan (``name``d, ``static`` linkage
    for several kernels in one file; ``local_types`` declares the vector types inside the function)."""
    if not (name.isascii() and name.isidentifier()):
        raise ValueError(f"kernel name {name!r} is not a C identifier")
    g, task = plan.geometry, plan.space.task
    prefix = f"{name}_w"
    _static_data(plan, w, prefix)
    w.open(f"{'static ' if static else ''}void {name}(void* const* bufs)")
    if local_types and plan.vec > 1:
        _typedefs(plan, w)
    args = ["data", "weight"] + (["bias"] if task.bias else []) + (["residual"] if task.residual else [])
    for i, a in enumerate(args):
        w(f"const float* restrict {a} = (const float*)bufs[{i}];")
    w(f"float* restrict out = (float*)bufs[{len(args)}];")
    w(f"float* restrict xt = (float*)bufs[{len(args) + 1}];")
    w("(void)weight; (void)xt;")
    par = "#pragma omp parallel for schedule(static)" if plan.config.parallel > 0 else ""
    w.open(f"for (long b = 0; b < {g.batch}; ++b)")
    if g.copy != "none":
        _copy(plan, w, par)
        w("const float* xb = xt;")
    elif g.op == "conv2d":
        w(f"const float* xb = data + b * {g.R * g.S};")
    else:
        w("const float* xb = data;")
    if par:
        w(par)
    w.open(f"for (long ob = 0; ob < {g.O // plan.blocks.br}; ++ob)")
    if g.S > 1:
        _rows_vector(plan, w, prefix)
    else:
        _rows_scalar(plan, w, prefix)
    w.close()
    w.close()
    w.close()


def _typedefs(plan, w: Writer) -> None:
    w(f"typedef float vf __attribute__((vector_size({4 * plan.vec})));")
    w(f"typedef float vfu __attribute__((vector_size({4 * plan.vec}), aligned(4)));  /* unaligned */")


def render_sparse(plan) -> str:
    """Full source of one sparse kernel: header, static weights, the kernel and the timing harness."""
    task, cfg = plan.space.task, plan.config
    w = Writer()
    w("/* felixjax generated sparse kernel (block-sparse rows; weights compiled in)")
    w(f" * task:   {task.name}  ({task.key})")
    w(f" * sketch: {cfg.sketch}")
    w(f" * config: {cfg.dumps()} */")
    w(PRELUDE.rstrip("\n"))
    if plan.vec > 1:
        _typedefs(plan, w)
    w()
    render_sparse_kernel(plan, w)
    return w.text() + TIMING_HARNESS_C
