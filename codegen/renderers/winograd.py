"""C source of the Winograd sketches (``conv_winograd`` and ``conv_winograd4``, :mod:`codegen.winograd`):
F(2x2, 3x3) or F(4x4, 3x3) over blocks of output tiles, input transform -> 16 or 36 GEMMs (register
blocks of tiles x channel vectors) -> output transform with the fused bias, residual and activation. The
transforms are emitted from the variant's matrices (:func:`_combo`: adds for +-1, multiplies otherwise).

The plan is the standard lowering of the sketch's virtual contraction (:func:`codegen.winograd.virtual_task`);
this renderer reads the schedule from its config (:func:`codegen.winograd.schedule`), the argument order
from ``plan.args`` and the workspace (per thread ``V`` and ``M``) from ``plan.workspace``.

Example:
    >>> from codegen.ops import conv2d
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> sp = Space(conv2d(1, 16, 12, 12, out_channels=16, kernel=3, padding=1), "conv_winograd", Target.cpu())
    >>> "16 GEMMs" in render_winograd(lower(sp, sp.default()))
    True
"""
from __future__ import annotations

from ..winograd import VARIANTS, geometry, schedule, variant_of, workspace_floats
from .cstyle import Writer
from .harness import standalone_c


def is_winograd(plan) -> bool:
    """Whether ``plan`` is a plan of the Winograd sketch (rendered here)."""
    return plan.space.sketch.base in VARIANTS


def _combo(coefs, terms) -> str:
    """C for ``sum(c * t)`` over the non-zero coefficients: ``+-1`` as adds / subtractions, others as
    float32 multiplies (vector operands broadcast the scalar)."""
    out = ""
    for c, t in zip(coefs, terms):
        c = float(c)
        if c == 0.0:
            continue
        sign = "-" if c < 0 else "+"
        mag = abs(c)
        term = t if mag == 1.0 else f"{mag!r}f * {t}"
        out += (f" {sign} " if out else ("-" if sign == "-" else "")) + term
    return out or "0.0f"


class _Gen:
    def __init__(self, plan, name: str):
        self.plan, self.name = plan, name
        sp, cfg = plan.space, plan.config
        self.v = variant_of(sp.sketch)
        self.g = geometry(sp.task, self.v.m)
        self.s = schedule(sp, cfg)
        self.threads = plan.workspace // max(1, workspace_floats(sp, cfg, 1))
        self.task = sp.task

    def helpers(self, w: Writer) -> None:
        V = self.s["vec"]
        w(f"typedef float {self.name}_vf __attribute__((vector_size({4 * V})));")
        w(f"typedef float {self.name}_vfu __attribute__((vector_size({4 * V}), aligned(4)));")
        w("#ifdef _OPENMP")  # without OpenMP (an exported network built without -fopenmp): one thread
        w("int omp_get_thread_num(void);")
        w("int omp_get_max_threads(void);")
        w("#else")
        w("#ifndef omp_get_thread_num")
        w("#define omp_get_thread_num() 0")
        w("#define omp_get_max_threads() 1")
        w("#endif")
        w("#endif")

    def _input_transform(self, w: Writer) -> None:
        g, s, v = self.g, self.s, self.v
        H, W, PT, PL = g["H"], g["W"], g["PT"], g["PL"]
        TB, XB = s["YB"] * s["XB"], s["XB"]
        A, m = v.alpha, v.m
        w(f"/* input transform: V[e][c][t] = (B^T d B)[e] of the {A}x{A} patch of tile t, input channel c */")
        w.open(f"for (int c = 0; c < {g['C']}; ++c)")
        w(f"const float* restrict p = ip + (long)c * {H * W};")
        w(f"float* restrict vc = V + (long)c * {TB};")
        w.open(f"for (int t = 0; t < {TB}; ++t)")
        w(f"const int iy = {m} * (ty0 + t / {XB}) - {PT}, ix = {m} * (tx0 + t % {XB}) - {PL};")
        w(f"float d[{A}][{A}];")
        w.open(f"if (iy >= 0 && iy + {A} <= {H} && ix >= 0 && ix + {A} <= {W})")
        w(f"for (int i = 0; i < {A}; ++i) for (int j = 0; j < {A}; ++j) d[i][j] = p[(iy + i) * {W} + ix + j];")
        w.close(" else {")
        w.depth += 1
        w(f"for (int i = 0; i < {A}; ++i) for (int j = 0; j < {A}; ++j) {{")
        w("    const int y = iy + i, x = ix + j;")
        w(f"    d[i][j] = (y >= 0 && y < {H} && x >= 0 && x < {W}) ? p[y * {W} + x] : 0.0f;")
        w("}")
        w.close()
        w(f"float m[{A}][{A}];")
        w.open(f"for (int j = 0; j < {A}; ++j)")
        for i in range(A):
            w(f"m[{i}][j] = {_combo(v.BT[i], [f'd[{k}][j]' for k in range(A)])};")
        w.close()
        stride = g["C"] * TB
        w.open(f"for (int i = 0; i < {A}; ++i)")
        w(f"float* restrict vi = vc + t + (long)i * {A * stride};")
        for j in range(A):
            w(f"vi[{j * stride}] = {_combo(v.BT[j], [f'm[i][{k}]' for k in range(A)])};")
        w.close()
        w.close()
        w.close()

    def _gemms(self, w: Writer) -> None:
        g, s, n = self.g, self.s, self.name
        V, KV, YR, XR, YB, XB, CB = s["vec"], s["KV"], s["YR"], s["XR"], s["YB"], s["XB"], s["CB"]
        TB, C, NKB = YB * XB, g["C"], g["K"] // KV
        Q = KV // V
        rows = [(ry, rx) for ry in range(YR) for rx in range(XR)]
        E = self.v.alpha ** 2
        w(f"/* {E} GEMMs: M[e][t][k] = sum_c V[e][c][t] U[e][c][k], register block {YR * XR} tiles x {Q} vectors */")
        w.open(f"for (int e = 0; e < {E}; ++e)")
        w(f"const float* restrict ue = U + ((long)e * {NKB} + kb) * {C * KV};")
        w(f"const float* restrict ve = V + (long)e * {C * TB};")
        w(f"float* restrict me = M + (long)e * {TB * KV};")
        w.open(f"for (int c0 = 0; c0 < {C}; c0 += {CB})")
        w.open(f"for (int by = 0; by < {YB}; by += {YR})")
        w.open(f"for (int bx = 0; bx < {XB}; bx += {XR})")
        w(f"const int t0 = by * {XB} + bx;")
        for r, (ry, rx) in enumerate(rows):
            for q in range(Q):
                w(f"{n}_vf a{r}_{q};")
        w.open("if (c0 == 0)")
        for r in range(len(rows)):
            for q in range(Q):
                w(f"a{r}_{q} = ({n}_vf){{0}};")
        w.close(" else {")
        w.depth += 1
        for r, (ry, rx) in enumerate(rows):
            for q in range(Q):
                w(f"a{r}_{q} = *(const {n}_vfu*)(me + (long)(t0 + {ry * XB + rx}) * {KV} + {q * V});")
        w.close()
        w("#pragma GCC unroll 4")
        w.open(f"for (int c = c0; c < c0 + {CB}; ++c)")
        for q in range(Q):
            w(f"const {n}_vf w{q} = *(const {n}_vfu*)(ue + (long)c * {KV} + {q * V});")
        w(f"const float* restrict vt = ve + (long)c * {TB} + t0;")
        for r, (ry, rx) in enumerate(rows):
            w(f"const float b{r} = vt[{ry * XB + rx}];")
            for q in range(Q):
                w(f"a{r}_{q} += b{r} * w{q};")
        w.close()
        for r, (ry, rx) in enumerate(rows):
            for q in range(Q):
                w(f"*({n}_vfu*)(me + (long)(t0 + {ry * XB + rx}) * {KV} + {q * V}) = a{r}_{q};")
        w.close()
        w.close()
        w.close()
        w.close()

    def _output_transform(self, w: Writer) -> None:
        g, s, n, task, v = self.g, self.s, self.name, self.task, self.v
        V, KV, XB = s["vec"], s["KV"], s["XB"]
        TB = s["YB"] * XB
        OH, OW = g["OH"], g["OW"]
        A, m = v.alpha, v.m
        w("/* output transform: Y = A^T M A per tile and channel vector, then bias, residual, activation */")
        w.open(f"for (int t = 0; t < {TB}; ++t)")
        w(f"const int oy = {m} * (ty0 + t / {XB}), ox = {m} * (tx0 + t % {XB});")
        w.open(f"for (int q = 0; q < {KV // V}; ++q)")
        w(f"{n}_vf m[{A * A}];")
        w(f"for (int e = 0; e < {A * A}; ++e) m[e] = *(const {n}_vfu*)(M + ((long)e * {TB} + t) * {KV} + q * {V});")
        w(f"{n}_vf " + ", ".join(f"r{i}[{A}]" for i in range(m)) + ";")
        w.open(f"for (int j = 0; j < {A}; ++j)")
        for i in range(m):
            w(f"r{i}[j] = {_combo(v.AT[i], [f'm[{k * A} + j]' for k in range(A)])};")
        w.close()
        w(f"float y[{m * m}][{V}] __attribute__((aligned(64)));")
        for i in range(m):
            for j in range(m):
                w(f"*({n}_vfu*)y[{i * m + j}] = {_combo(v.AT[j], [f'r{i}[{k}]' for k in range(A)])};")
        w(f"const int k0 = kb * {KV} + q * {V};")
        w.open(f"for (int l = 0; l < {V}; ++l)")
        w(f"const long plane = ((long)nimg * {g['K']} + k0 + l) * {OH * OW};")
        w.open(f"for (int a = 0; a < {m * m}; ++a)")
        w(f"const int yy = oy + a / {m}, xx = ox + a % {m};")
        w(f"if (yy >= {OH} || xx >= {OW}) continue;")  # odd outputs / padded tile grids
        w("float v = y[a][l];")
        if task.bias:
            w("v += bias[k0 + l];")
        if task.residual:
            w(f"v += res[plane + yy * {OW} + xx];")
        if task.act in ("relu", "relu6"):
            w("v = v < 0.0f ? 0.0f : v;")
            if task.act == "relu6":
                w("v = v > 6.0f ? 6.0f : v;")
        w(f"out[plane + yy * {OW} + xx] = v;")
        w.close()
        w.close()
        w.close()
        w.close()

    def kernel(self, w: Writer, *, static: bool) -> None:
        g, s, plan, task = self.g, self.s, self.plan, self.task
        args = plan.args
        data = "data_in" if "data_in" in args else "data"
        YB, XB = s["YB"], s["XB"]
        TB = YB * XB
        nby, nbx = g["TH"] // YB, g["TW"] // XB
        per = plan.workspace // max(1, self.threads)
        w.open(f"{'static ' if static else ''}void {self.name}(void* const* args)")
        w(f"const float* restrict in = (const float*)args[{args.index(data)}];")
        w("const float* restrict U = (const float*)args[1];")
        if task.bias:
            w(f"const float* restrict bias = (const float*)args[{args.index('bias')}];")
        if task.residual:
            w(f"const float* restrict res = (const float*)args[{args.index('residual')}];")
        w(f"float* restrict out = (float*)args[{args.index('out')}];")
        w(f"float* restrict ws = (float*)args[{len(args)}];")
        units, kbs = g["N"] * nby * nbx, g["K"] // s["KV"]
        if s["parallel"]:  # at most the threads the workspace was sized for
            w(f"const int nt = omp_get_max_threads() < {self.threads} ? omp_get_max_threads() : {self.threads};")
            # fewer tile blocks than threads (small planes: a 4x4 tile grid is one block): the output
            # channels are split into parts too, each part redoing its block's input transform
            w(f"const int kp = nt <= {units} ? 1 : (nt + {units - 1}) / {units} < {kbs} ? (nt + {units - 1}) / {units} "
              f": {kbs};")
            w("#pragma omp parallel for schedule(static) num_threads(nt)")
        else:
            w("const int kp = 1;")
        w.open(f"for (long u = 0; u < {units}L * kp; ++u)")
        w("const int tid = " + ("omp_get_thread_num();" if s["parallel"] else "0;"))
        w(f"float* restrict V = ws + (long)tid * {per};")
        w(f"float* restrict M = V + {self.v.alpha ** 2 * g['C'] * TB};")
        w("const long ub = u / kp; const int part = (int)(u % kp);")
        w(f"const int nimg = (int)(ub / {nby * nbx}), ty0 = (int)(ub / {nbx} % {nby}) * {YB}, "
          f"tx0 = (int)(ub % {nbx}) * {XB};")
        w(f"const float* restrict ip = in + (long)nimg * {g['C'] * g['H'] * g['W']};")
        self._input_transform(w)
        w.open(f"for (int kb = part * {kbs} / kp; kb < (part + 1) * {kbs} / kp; ++kb)")
        self._gemms(w)
        self._output_transform(w)
        w.close()
        w.close()
        w.close()


def render_winograd_kernel(plan, w: Writer, *, name: str = "fj_kernel", static: bool = False,
                           local_types: bool = False) -> None:
    """The types and the kernel function of a Winograd plan into ``w`` (file-scope names carry ``name``)."""
    del local_types
    gen = _Gen(plan, name)
    gen.helpers(w)
    gen.kernel(w, static=static)


def render_winograd(plan) -> str:
    """Full source of one Winograd kernel: header, the kernel and the timing harness."""
    m = variant_of(plan.space.sketch).m
    title = f"Winograd kernel ({plan.space.sketch.base}: F({m}x{m}, 3x3), tiles x channel vectors)"
    return standalone_c(plan, title, render_winograd_kernel, includes=("stddef.h",))
