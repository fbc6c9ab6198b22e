"""The timed input copies of a kernel, rendered in a :class:`~codegen.renderers.cstyle.Dialect` ``d``
into a :class:`~codegen.renderers.cstyle.Writer` ``w``: the zero-padded tail rows of a row-padded GEMM,
the im2col gather of ``conv_im2col``, and the padded / channel-blocked copy of the data input (for int8
groups by whole 4-byte words)."""
from __future__ import annotations

import math

from ..flat import im2col_geometry
from ..lower import Plan


def data_tail(d, plan: Plan, w) -> None:
    """The data rows from ``tail_row`` on, zero-padded to the padded extent, into ``data_tail``
    (timed; at most a register block and the padding of rows)."""
    tail = plan.buffers["data_tail"]
    cols = tail.layout.shape[-1]
    real = (plan.space.api_con.axis("m").extent - plan.tail_row) * cols
    w("/* the data rows of the last, partial register block(s), zero-padded (timed, small) */")
    if d.simd:
        w(d.simd)
    w(f"{d.loop.format(var='i', n=tail.size)} data_tail[i] = i < {real} ? data[{plan.tail_row * cols} + i] : "
      f"{d.zero};")


def im2col_copy(d, plan: Plan, w) -> None:
    """``conv_im2col``: gather the columns ``[n][c][r][s][pixel]`` from the NCHW input (timed), zero
    outside the image and on the padded pixels past ``OH * OW`` (:mod:`codegen.flat`)."""
    g = im2col_geometry(plan.space.task)
    px = plan.con.data.shape[-1]  # pixels per column, padded
    real = g["OH"] * g["OW"]
    w("/* im2col: gather the data input into columns (timed) */")
    if d.parallel_for:
        w(d.parallel_for + d.collapse.format(n=2))
    w.open(d.loop.format(var="i0", n=g["N"] * g["C"]))
    w.open(d.loop.format(var="t", n=g["R"] * g["S"]))
    w(f"const long r = t / {g['S']}, s = t % {g['S']};")
    w(f"float* {d.restrict} col = data + (i0 * {g['R'] * g['S']} + t) * {px};")
    w(f"const float* {d.restrict} img = data_in + i0 * {g['H'] * g['W']};")
    # the output columns whose input column ix = ox * SX + s * DX - PL is inside the image form one
    # range [lo, hi): zeros left and right of it, an unconditional (vectorizable) strided copy inside
    # (a per-pixel bounds check made the gather ~half of a 5x5 stride-2 stem's time)
    w(f"const long a = {g['PL']} - s * {g['DX']}, b = {g['W'] - 1 + g['PL']} - s * {g['DX']};")
    w(f"long lo = a > 0 ? (a + {g['SX'] - 1}) / {g['SX']} : 0, hi = b >= 0 ? b / {g['SX']} + 1 : 0;")
    w(f"lo = lo < {g['OW']} ? lo : {g['OW']}; hi = hi < {g['OW']} ? hi : {g['OW']}; hi = hi > lo ? hi : lo;")
    w.open(d.loop.format(var="oy", n=g["OH"]))
    w(f"const long iy = oy * {g['SY']} + r * {g['DY']} - {g['PT']};")
    w(f"float* {d.restrict} dst = col + oy * {g['OW']};")
    w.open(f"if (iy >= 0 && iy < {g['H']})")
    w(f"const float* {d.restrict} src = img + iy * {g['W']};")
    w(f"for (long ox = 0; ox < lo; ++ox) dst[ox] = {d.zero};")
    if d.simd and g["SX"] == 1:  # strided: left to the compiler's permutes (omp simd made gathers)
        w(d.simd)
    w(f"for (long ox = lo; ox < hi; ++ox) dst[ox] = src[ox * {g['SX']} - a];")
    w(f"for (long ox = hi; ox < {g['OW']}; ++ox) dst[ox] = {d.zero};")
    w.close()
    w.open("else")
    w(f"for (long ox = 0; ox < {g['OW']}; ++ox) dst[ox] = {d.zero};")
    w.close()
    w.close()
    if px > real:
        w(f"{d.loop.format(var='p', n=px - real)} col[{real} + p] = {d.zero};")
    w.close()
    w.close()


def data_copy(d, plan: Plan, w) -> None:
    """Timed layout change of the data input: zero padding and optional channel blocking."""
    con = plan.con
    dst = plan.buffers["data"].layout
    shape = dst.shape
    w(f"/* copy the data input into its padded{' / blocked' if any(x.kind == 'block' for x in dst.dims) else ''}"
      f" layout (timed) */")
    # loop over the logical padded coordinates; the innermost dimension is vectorizable
    names = [f"i{k}" for k in range(len(shape))]
    if d.parallel_for:
        w(d.parallel_for + (d.collapse.format(n=2) if len(shape) > 2 else ""))  # the innermost is the simd loop
    # int8 groups (Plan.data_quads): the channel loop steps over groups and the channels of a group
    # run innermost, so the copy writes a group's bytes contiguously per pixel (channel innermost
    # wrote single bytes 4 apart: 12% of a 3x3 conv's time)
    quad = next((k for k, dl in enumerate(dst.dims) if dl.kind == "block"), None) if plan.data_quads else None
    g = dst.dims[quad].block if quad is not None else 1
    if quad is not None and _quad_words(d, plan, w, quad, g, names):
        return
    for k, n in enumerate(shape):
        if k == len(shape) - 1 and d.simd:
            w(d.simd)
        w.open(d.loop.format(var=names[k] + ("q" if k == quad else ""), n=n // g if k == quad else n))
    if quad is not None:
        if d.unroll:
            w(d.unroll.format(n=g))
        w.open(d.loop.format(var="j", n=g))
        w(f"const long {names[quad]} = {g}*{names[quad]}q + j;")
    dst_terms = []
    for k, dl in enumerate(dst.dims):
        if dl.kind == "plain":
            dst_terms.append(f"{dl.stride}*{names[k]}")
        else:
            dst_terms.append(f"{dl.stride}*({names[k]} / {dl.block}) + {names[k]} % {dl.block}")
    api = con.data_api_shape
    src_strides = [math.prod(api[k + 1:]) for k in range(len(api))]
    conds, src_terms = [], []
    for k, (before, _after) in enumerate(con.pad):
        idx = f"({names[k]} - {before})" if before else names[k]
        if before or _after:
            conds.append(f"{idx} >= 0 && {idx} < {api[k]}")
        src_terms.append(f"{src_strides[k]}*{idx}")
    cond = " && ".join(conds) if conds else "1"
    fill = "xzp" if "x_zp" in plan.buffers else d.zero  # int8: the padding is the real zero, x_zp
    src = f"data_in[{' + '.join(src_terms)}]"
    if plan.buffers["data"].dtype == "int16":  # int8 pairs: x - zp, exact in int16 (the padding: 0)
        src, fill = f"(short)((int){src} - xzp)", "0"
    w(f"data[{' + '.join(dst_terms)}] = ({cond}) ? {src} : {fill};")
    for _ in range(len(shape) + (quad is not None)):
        w.close()


def _quad_words(d, plan: Plan, w, quad: int, g: int, names: list[str]) -> bool:
    """The int8 group copy (``Plan.data_quads``) as one 4-byte word per pixel and group: the group's
    ``g`` channels (raw bytes, or ``x - x_zp`` as int16 pairs) read from their ``g`` planes and
    shifted into place, so the innermost loop vectorizes to whole-word stores. Padding splits the
    innermost dimension into fill / unconditional copy / fill loops (a row outside the image is
    all fill), so no load is conditional. The byte-per-channel copy was a fifth of an int8 1x1
    conv's time (AVX2 EPYC, 1 thread, 256 x 28 x 28 -> 128: 0.116 of 0.573 ms; by words 0.014); a
    first word copy with a per-word padding test was slower than the byte copy on a padded 3x3
    conv (64 x 56 x 56: 2.12 against 2.01 ms). False (nothing written) where it does not apply."""
    con, dst = plan.con, plan.buffers["data"].layout
    pairs = plan.buffers["data"].dtype == "int16"
    if (g, pairs) not in ((4, False), (2, True)) or any(con.pad[quad]):
        return False
    if any(dl.kind == "plain" and dl.stride % g for dl in dst.dims) or dst.dims[quad].stride % g:
        return False
    shape, api, last = dst.shape, con.data_api_shape, len(dst.shape) - 1
    if quad == last:
        return False
    src_strides = [math.prod(api[k + 1:]) for k in range(len(api))]
    conds = []
    for k in range(last):
        before, after = con.pad[k]
        if before or after:
            idx = f"({names[k]} - {before})" if before else names[k]
            conds.append(f"{idx} >= 0 && {idx} < {api[k]}")
    for k in range(last):
        w.open(d.loop.format(var=names[k] + ("q" if k == quad else ""), n=shape[k] // g if k == quad else shape[k]))
    word = " + ".join(f"{dl.stride // g}*{names[k]}q" if k == quad else f"{dl.stride // g}*{names[k]}"
                      for k, dl in enumerate(dst.dims))
    pl = con.pad[last][0]
    idx = {k: f"{g}*{names[k]}q" if k == quad else (f"({names[k]} - {con.pad[k][0]})" if con.pad[k][0]
                                                    else names[k]) for k in range(len(api))}
    base = " + ".join(f"{src_strides[k]}*{idx[k]}" for k in range(len(api)))
    if pairs:  # x - zp as int16, two per word (the padding: 0, the real zero)
        parts = [f"(unsigned int)(unsigned short)(short)((int)data_in[{base} + {j * src_strides[quad]}] - xzp)"
                 f"{f' << {16 * j}' if j else ''}" for j in range(g)]
        fill = "0u"
    else:  # raw bytes (the padding: the zero point in every byte)
        parts = [f"(unsigned int)(unsigned char)data_in[{base} + {j * src_strides[quad]}]"
                 f"{f' << {8 * j}' if j else ''}" for j in range(g)]
        fill = "fill"
        w("const unsigned int fill = (unsigned int)(unsigned char)xzp * 0x01010101u;")
    v, n, lo, hi = names[last], shape[last], pl, pl + api[last]
    store = f"((unsigned int*)data)[{word}]"
    if conds:
        w.open(f"if ({' && '.join(conds)})")
    if lo:
        w(f"for (long {v} = 0; {v} < {lo}; ++{v}) {store} = {fill};")
    if d.simd:
        w(d.simd)
    w(f"for (long {v} = {lo}; {v} < {hi}; ++{v}) {store} = {' | '.join(parts)};")
    if hi < n:
        w(f"for (long {v} = {hi}; {v} < {n}; ++{v}) {store} = {fill};")
    if conds:
        w.close()
        w.open("else")
        if d.simd:
            w(d.simd)
        w(f"for (long {v} = 0; {v} < {n}; ++{v}) {store} = {fill};")
        w.close()
    for _ in range(last):
        w.close()
    return True
