"""C source of the blocked depthwise sketch (``dw_nchwc``, :mod:`codegen.blocked`): a depthwise conv on
NCHW8c data read in place, no padded copy of the input.

Every pixel of a channel block is one vector of 8 channels, so every tap of every output pixel is one
contiguous vector load times one weight vector, at any stride (no shuffles). The schedule read from the
plan (the standard lowering of the same tiles, :func:`codegen.lower.lower`): the ``S3`` tiles of ``y``
and ``x`` are the register block (``RY`` output rows x ``RX`` output pixels, fully unrolled, each input
vector loaded once per block and shared by the taps that read it), ``S2 x S3`` of ``y`` the rows of a
work unit, ``parallel > 0`` OpenMP over (channel block, row chunk). The vector width is the layout's
block (8), whatever ``vec`` says. Padding:

* rows outside the image read a static zero row (a pointer chosen once per register block, no branch in
  the tap loops);
* columns: the output columns whose taps all fall inside the row run in register blocks (a last,
  narrower block for the remainder); the few edge columns are emitted one by one at their constant
  column, with only their in-image taps: no guard is evaluated at run time.

The epilogue (bias, residual, relu / relu6) runs on the accumulators before the one store per pixel.

Example:
    >>> from codegen.blocked import conv2d_nchwc, DW_SKETCH
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> t = conv2d_nchwc(1, 16, 12, 12, out_channels=16, kernel=3, stride=2, padding=1, groups=16)
    >>> sp = Space(t, DW_SKETCH, Target.cpu())
    >>> "zrow" in render_dw_nchwc(lower(sp, sp.default()))
    True
"""
from __future__ import annotations

from ..blocked import DW_SKETCH, block_of, dw_geometry
from .cstyle import Writer
from .depthwise import _dim_offset
from .harness import standalone_c


def is_dw_nchwc(plan) -> bool:
    """Whether ``plan`` is a plan of the blocked depthwise sketch (rendered here)."""
    return plan.space.sketch.base == DW_SKETCH


class _Gen:
    def __init__(self, plan, name: str):
        sp, cfg = plan.space, plan.config
        self.plan, self.name, self.task = plan, name, sp.task
        self.g = dw_geometry(sp.task)
        tiles = {a.name: t for a, t in zip(sp.axes, cfg.tiles)}
        g = self.g
        self.RY = tiles["y"][-1] if "y" in tiles else 1
        self.RX = tiles["x"][-1]
        self.chunk = tiles["y"][-1] * tiles["y"][-2] if "y" in tiles else 1
        self.parallel = cfg.parallel > 0
        self.B = block_of(sp.task)
        # output columns whose taps all lie inside the row: [xlo, xhi)
        self.xlo = min(g["OW"], -(-g["PL"] // g["SX"]))
        last = g["W"] - 1 + g["PL"] - (g["KW"] - 1) * g["DX"]
        self.xhi = max(self.xlo, min(g["OW"], last // g["SX"] + 1)) if last >= 0 else self.xlo
        self.vt, self.it = f"{name}_vf", f"{name}_vi"

    def helpers(self, w: Writer) -> None:
        n, vt, it, B = self.name, self.vt, self.it, self.B
        w(f"typedef float {vt} __attribute__((vector_size({4 * B})));")
        w(f"typedef int {it} __attribute__((vector_size({4 * B})));")
        w(f"static inline {vt} {n}_ld(const float* p) {{ {vt} v; __builtin_memcpy(&v, p, sizeof v); return v; }}")
        w(f"static inline void {n}_st(float* p, {vt} v) {{ __builtin_memcpy(p, &v, sizeof v); }}")
        if self.task.act in ("relu", "relu6"):  # (a NaN kept: numpy's maximum(x, 0) keeps it)
            w(f"static inline {vt} {n}_relu({vt} a) {{ {vt} z = {{0}}; return ({vt})((({it})a) & ~(a < z)); }}")
        if self.task.act == "relu6":
            w(f"static inline {vt} {n}_min6({vt} a) {{ {vt} s = {{0}}; s += 6.0f; {it} big = a > s; "
              f"return ({vt})((({it})a & ~big) | (({it})s & big)); }}")

    def _block(self, w: Writer, rows: int, x0: str, cols: int, taps) -> None:
        """``rows`` x ``cols`` output pixels from column ``x0`` (a C expression); ``taps(c)``: the ``kx``
        of output column ``c`` of the block to read (all of them except at the edges)."""
        g, n, B = self.g, self.name, self.B
        loads: dict[tuple[int, int], str] = {}
        w.open("")
        for r in range(rows):
            for c in range(cols):
                w(f"{self.vt} a{r}_{c} = {{0}};")
        for ky in range(g["KH"]):
            for kx in range(g["KW"]):
                for r in range(rows):
                    t = r * g["SY"] + ky * g["DY"]  # the input row (offset within the block's rows)
                    for c in range(cols):
                        if kx not in taps(c):
                            continue
                        j = c * g["SX"] + kx * g["DX"]  # the input column, relative to x0 * SX - PL
                        if (t, j) not in loads:
                            loads[(t, j)] = f"i{t}_{j}"
                            w(f"const {self.vt} i{t}_{j} = {n}_ld(q{t} + ({x0} * {g['SX']} + {j - g['PL']}) * {B});")
                        w(f"a{r}_{c} += {loads[(t, j)]} * w{ky}_{kx};")
        for r in range(rows):
            for c in range(cols):
                idx = f"((y + {r}) * {g['OW']} + {x0} + {c}) * {B}"
                v = f"a{r}_{c}"
                if self.task.bias:
                    w(f"{v} += bb;")
                if self.task.residual:
                    w(f"{v} += {n}_ld(rp + {idx});")
                if self.task.act in ("relu", "relu6"):
                    w(f"{v} = {n}_relu({v});")
                if self.task.act == "relu6":
                    w(f"{v} = {n}_min6({v});")
                w(f"{n}_st(op + {idx}, {v});")
        w.close()

    def _rows(self, w: Writer, rows: int) -> None:
        """One register block of ``rows`` output rows from row ``y``: the row pointers, then the columns."""
        g, B = self.g, self.B
        w.open("")
        need = sorted({r * g["SY"] + ky * g["DY"] for r in range(rows) for ky in range(g["KH"])})
        for t in need:
            w(f"const int iy{t} = y * {g['SY']} + {t - g['PT']};")
            w(f"const float* restrict q{t} = (iy{t} >= 0 && iy{t} < {g['H']}) ? ip + (long)iy{t} * {g['W'] * B} : zrow;")
        every = range(g["KW"])

        def inside(x: int):
            return lambda c: [kx for kx in every if 0 <= (x + c) * g["SX"] + kx * g["DX"] - g["PL"] < g["W"]]

        for x in range(self.xlo):  # left edge columns: constant, their in-row taps only
            self._block(w, rows, str(x), 1, inside(x))
        inner = self.xhi - self.xlo
        if inner > 0:
            RX = min(self.RX, inner)
            full, rest = divmod(inner, RX)
            w.open(f"for (int x = {self.xlo}; x < {self.xlo + full * RX}; x += {RX})")
            self._block(w, rows, "x", RX, lambda c: every)
            w.close()
            if rest:
                self._block(w, rows, str(self.xlo + full * RX), rest, lambda c: every)
        for x in range(self.xhi, g["OW"]):  # right edge columns
            self._block(w, rows, str(x), 1, inside(x))
        w.close()

    def kernel(self, w: Writer, *, static: bool) -> None:
        g, plan, B, n = self.g, self.plan, self.B, self.name
        args = plan.args
        data = "data_in" if "data_in" in args else "data"
        nch = -(-g["OH"] // self.chunk)
        units = g["N"] * g["KB"]
        w.open(f"{'static ' if static else ''}void {n}(void* const* args)")
        w(f"const float* restrict in = (const float*)args[{args.index(data)}];")
        w(f"const float* restrict wt = (const float*)args[{args.index('weight')}];")
        if self.task.bias:
            w(f"const float* restrict bias = (const float*)args[{args.index('bias')}];")
        if self.task.residual:
            w(f"const float* restrict res = (const float*)args[{args.index('residual')}];")
        w(f"float* restrict out = (float*)args[{args.index('out')}];")
        w(f"static const float zrow[{g['W'] * B}] __attribute__((aligned(64))) = {{0}};")
        if self.parallel:
            w("#pragma omp parallel for schedule(static)")
        w.open(f"for (long u = 0; u < {units * nch}L; ++u)")
        w(f"const long ch = u / {nch}; const int yc = (int)(u % {nch}); const int k = (int)(ch % {g['KB']});")
        w(f"const float* restrict ip = in + ch * {g['H'] * g['W'] * B}L;")
        w(f"float* restrict op = out + ch * {g['OH'] * g['OW'] * B}L;")
        if self.task.residual:
            w(f"const float* restrict rp = res + ch * {g['OH'] * g['OW'] * B}L;")
        if self.task.bias:
            w(f"const {self.vt} bb = {n}_ld(bias + k * {B});")
        wl = plan.buffers["weight"].layout.dims
        for ky in range(g["KH"]):
            for kx in range(g["KW"]):
                off = f"{_dim_offset(wl[0], 'k')} + {_dim_offset(wl[1], ky) + _dim_offset(wl[2], kx)}"
                lanes = [_dim_offset(wl[3], lane) for lane in range(B)]
                if lanes == list(range(B)):  # the packed lanes contiguous (v's S3 tile a multiple of 8)
                    w(f"const {self.vt} w{ky}_{kx} = {n}_ld(wt + {off});")
                else:  # packed by a narrower v tile: gathered once per channel block
                    w(f"const {self.vt} w{ky}_{kx} = {{{', '.join(f'wt[{off} + {o}]' for o in lanes)}}};")
        w(f"const int y_end = (yc + 1) * {self.chunk} < {g['OH']} ? (yc + 1) * {self.chunk} : {g['OH']};")
        w(f"int y = yc * {self.chunk};")
        w.open(f"for (; y + {self.RY} <= y_end; y += {self.RY})")
        self._rows(w, self.RY)
        w.close()
        if self.RY > 1:
            w.open("for (; y < y_end; ++y)")
            self._rows(w, 1)
            w.close()
        w.close()
        w.close()


def render_dw_nchwc_kernel(plan, w: Writer, *, name: str = "fj_kernel", static: bool = False,
                           local_types: bool = False) -> None:
    """The helpers and the kernel function of a ``dw_nchwc`` plan into ``w`` (file-scope names carry
    ``name``, so kernels of one network file never clash)."""
    del local_types
    gen = _Gen(plan, name)
    gen.helpers(w)
    gen.kernel(w, static=static)


def render_dw_nchwc(plan) -> str:
    """Full source of one blocked depthwise kernel: header, helpers, the kernel and the timing harness."""
    return standalone_c(plan, 'blocked depthwise kernel (dw_nchwc: NCHW8c read in place, edges peeled)', render_dw_nchwc_kernel)
