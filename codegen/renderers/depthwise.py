"""C source of the depthwise sketch (``dw_rows``, :mod:`codegen.depthwise`): register blocks of output rows
x vectors along the output width, taps broadcast from registers, edges peeled or rows staged.

The plan is the standard lowering of the sketch's tiles (:func:`codegen.lower.lower`); this renderer
reads the schedule from it (``S3`` tiles of ``y`` and ``x``: the register block; ``S2 x S3`` of ``y``:
the rows of a work unit; ``vec``; ``parallel > 0``: OpenMP over the units; the ``dw_stage`` knob), the
argument order from ``plan.args`` and the packed weight layout from ``plan.buffers["weight"]``. The
workspace is unused (no padded copy of the input).

Example:
    >>> from codegen.ops import depthwise_conv2d
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> sp = Space(depthwise_conv2d(1, 16, 32, 32, kernel=3, stride=2, padding=1), "dw_rows", Target.cpu())
    >>> "__builtin_shuffle" in render_depthwise(lower(sp, sp.default()))
    True
"""
from __future__ import annotations

from ..depthwise import DW_SKETCH, DW_STAGE, geometry, stage_rows
from ..space import Space
from .cstyle import Writer
from .harness import standalone_c


def is_depthwise(plan) -> bool:
    """Whether ``plan`` is a plan of the depthwise sketch (rendered here)."""
    return plan.space.sketch.base == DW_SKETCH


def _dim_offset(dl, index: str | int) -> str | int:
    """The C offset of index ``index`` (a constant or a C expression) in one dimension's layout."""
    if isinstance(index, int):
        return dl.stride * index if dl.kind == "plain" else dl.stride * (index // dl.block) + index % dl.block
    if dl.kind == "plain":
        return f"{dl.stride}L * {index}"
    return f"({dl.stride}L * ({index} / {dl.block}) + {index} % {dl.block})"


def _strided_load(w: Writer, n: str, vt: str, it: str, PT: str, ldc: str, V: int, sx: int, *,
                  zp: str = "", sub: str = "", cast: str = "") -> None:
    """``{n}_ld``: ``V`` lanes ``sx`` elements apart from ``p``, through the contiguous load ``ldc``
    (``zp`` / ``sub``: an extra zero-point parameter and its subtraction, for int8 rows)."""
    if sx == 1:
        w(f"static inline {vt} {n}_ld(const {PT}* p{zp}) {{ return {ldc}(p){sub}; }}")
    elif sx == 2:  # even lanes of p[0 .. 2V-2]: the second load starts at V-1, so nothing past is read
        idx = ", ".join([str(2 * i) for i in range(V // 2)] + [str(V + 2 * i + 1) for i in range(V // 2)])
        w(f"static inline {vt} {n}_ld(const {PT}* p{zp}) {{ {vt} a = {ldc}(p), "
          f"b = {ldc}(p + {V - 1}); return __builtin_shuffle(a, b, ({it}){{{idx}}}){sub}; }}")
    else:
        lanes = ", ".join(f"{cast}p[{sx * i}]" for i in range(V))
        w(f"static inline {vt} {n}_ld(const {PT}* p{zp}) {{ return ({vt}){{{lanes}}}{sub}; }}")


class _Gen:
    """One kernel's text: the schedule and geometry read once, then the pieces."""

    def __init__(self, plan, name: str):
        sp, cfg = plan.space, plan.config
        self.plan, self.name = plan, name
        self.g = geometry(sp.api_con)
        tiles = {a.name: t for a, t in zip(sp.axes, cfg.tiles)}
        self.V = cfg.vec
        self.RX = max(1, tiles["x"][-1] // self.V)
        self.RY = tiles["y"][-1]
        self.chunk = tiles["y"][-1] * tiles["y"][-2]
        self.parallel = cfg.parallel > 0
        knob = next((k for k in sp.knobs if k.name == "dw_stage"), None)
        if knob is not None:
            self.stage = sp.knob_value(cfg, knob) == 1
        else:  # a padded variant (no declared knobs): staged where it fits, for its partial last vector
            self.stage = DW_STAGE.values(Space(sp.task, DW_SKETCH, sp.target)) == (0, 1)
        task = sp.task
        self.bias, self.res, self.act = bool(task.bias), bool(task.residual), task.act
        # float16 (codegen.depthwise.applies): data, weights, residual and output stored as _Float16,
        # everything computed in float32; staged rows are float32 (widened while staged), peeled rows are
        # read in place (widened on load)
        self.half = task.buffer_dtypes.inputs == "float16"
        self.S = "_Float16" if self.half else "float"
        # int8 (quantized): uint8 / int8 data widened to float32 minus the zero point (exact), int8 taps
        # as float32, float32 FMAs: every product and partial sum is an integer below 2**24
        # (codegen.depthwise.applies bounds the taps), so the float32 sum is the exact int32 sum; then
        # the generic epilogue's dequantize (acc * (x_scale * w_scale[oc])), bias, residual, activation
        # and float32 output or requantization (round half to even, zero point, saturate)
        self.q = bool(task.quantized)
        if self.q and getattr(plan, "pairs", 1) > 1:  # weights packed in pairs / groups of four
            raise ValueError(f"dw_rows reads plainly packed int8 weights, got a plan with pairs={plan.pairs}")
        self.qout = self.q and task.buffer_dtypes.output == "int8"
        self.S_in = ("signed char" if task.buffer_dtypes.inputs == "int8" else "unsigned char") if self.q else self.S
        self.S_w = "signed char" if self.q else self.S
        self.S_res = "float" if self.q else self.S
        self.S_out = ("signed char" if self.qout else "float") if self.q else self.S
        self.PT = "float" if self.stage else self.S_in  # the element type the tap row pointers read
        self.zarg = ", xzv" if self.q and not self.stage else ""  # peeled int8 loads subtract the zero point
        g = self.g
        self.OHW = g["OH"] * g["OW"]
        if self.stage:  # staged rows: input column ix sits at ix + PL; every output column is in range
            reach = (g["OW"] - 1 + self.V) * g["SX"] + (g["KW"] - 1) * g["DX"] + 1  # + a partial last vector
            self.SW = max(g["PL"] + g["W"], reach) + 8
            self.SW += -self.SW % 16
            self.NR = stage_rows(g, self.RY)
            # stride 2: each staged row deinterleaved once into its even and odd columns (halves of HW
            # floats), so every tap is one contiguous vector load instead of two loads and a shuffle
            self.split = g["SX"] == 2 and self.V > 1
            self.HW = (self.SW + 1) // 2 + self.V + 8
            self.HW += -self.HW % 16
            if self.split:
                self.SW = 2 * self.HW
            self.xlo, self.xhi, self.col0 = 0, g["OW"], 0
        else:  # columns whose taps all fall inside the row run vectorized; the others are peeled
            self.split = False
            self.SW = g["W"]
            self.xlo = min(g["OW"], -(-g["PL"] // g["SX"]))
            last = (g["W"] - 1 + g["PL"] - (g["KW"] - 1) * g["DX"])
            self.xhi = max(0, min(g["OW"], last // g["SX"] + 1)) if last >= 0 else 0
            self.col0 = -g["PL"]
        self.vt, self.it = f"{name}_vf", f"{name}_vi"
        # float32 staged rows: the last OW % V columns stored by one masked vector store (AVX)
        self.masked = self.stage and not (self.half or self.q) and self.V in (4, 8) and g["OW"] % self.V > 0
        self.ht = f"{name}_vh"  # float16: V storage lanes (the conversions without an intrinsic)

    # ---- file-scope helpers: the vector types and the loads -----------------------------------------
    def helpers(self, w: Writer) -> None:
        V, vt, it, sx, n, PT = self.V, self.vt, self.it, self.g["SX"], self.name, self.PT
        if self.q:
            self._quant_helpers(w)
            return
        if self.split and not self.half:  # float32: the plain vector loads below deinterleave the rows
            self._split_helper(w)
        if self.half:
            w("#include <immintrin.h>")
            if self.split:
                self._split_helper(w)
            elif self.stage:  # one input row widened into float32 (F16C; gcc 12 converts a plain loop lane by lane)
                W = self.g["W"]
                w(f"static inline void {n}_cvt(float* restrict d, const _Float16* restrict s) {{")
                w("  int j = 0;")
                w("#ifdef __F16C__")
                w(f"  for (; j + 8 <= {W}; j += 8) _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128("
                  f"(const __m128i*)(s + j))));")
                w(f"  if (j + 4 <= {W}) {{ _mm_storeu_ps(d + j, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)(s + j)))); "
                  f"j += 4; }}")
                w("#endif")
                w(f"  for (; j < {W}; ++j) d[j] = s[j];")
                w("}")
        if V == 1:
            w(f"typedef float {vt};")
            w(f"static inline {vt} {n}_ld(const {PT}* p) {{ return p[0]; }}")
            return
        if self.masked:
            w("#ifdef __AVX__")
            w("#include <immintrin.h>")
            w("#endif")
        w(f"typedef float {vt} __attribute__((vector_size({4 * V})));")
        w(f"typedef int {it} __attribute__((vector_size({4 * V})));")
        w(f"static inline {vt} {n}_ldu(const float* p) {{ {vt} v; __builtin_memcpy(&v, p, sizeof v); return v; }}")
        w(f"static inline void {n}_stu(float* p, {vt} v) {{ __builtin_memcpy(p, &v, sizeof v); }}")
        if self.half:  # V float16 lanes widened on load / narrowed on store (F16C; round to nearest even)
            w(f"typedef _Float16 {self.ht} __attribute__((vector_size({2 * V})));")
            ld = {4: "_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)p))",
                  8: "_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p))",
                  16: "_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))"}.get(V)
            st = {4: "_mm_storel_epi64((__m128i*)p, _mm_cvtps_ph((__m128)v, 0))",
                  8: "_mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph((__m256)v, 0))",
                  16: "_mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph((__m512)v, 0))"}.get(V)
            w(f"static inline {vt} {n}_ldh(const _Float16* p) {{ "
              + (f"return ({vt}){ld}; }}" if ld else
                 f"{self.ht} h; __builtin_memcpy(&h, p, sizeof h); return __builtin_convertvector(h, {vt}); }}"))
            w(f"static inline void {n}_sth(_Float16* p, {vt} v) {{ "
              + (f"{st}; }}" if st else
                 f"{self.ht} h = __builtin_convertvector(v, {self.ht}); __builtin_memcpy(p, &h, sizeof h); }}"))
        ldc = f"{n}_ldh" if PT == "_Float16" else f"{n}_ldu"  # a contiguous vector of the row pointers' type
        _strided_load(w, n, vt, it, PT, ldc, V, sx)

    def _quant_helpers(self, w: Writer) -> None:
        """int8: the widening loads (minus the zero point ``z``), the staged row's widening and the
        vector requantizing store."""
        V, vt, it, sx, n, PT, S = self.V, self.vt, self.it, self.g["SX"], self.name, self.PT, self.S_in
        u = "u" if S == "unsigned char" else "i"  # _mm256_cvtepu8_epi32 / _mm256_cvtepi8_epi32
        w("#include <immintrin.h>")
        w("#include <math.h>")
        if self.split:
            self._split_helper(w)
        elif self.stage:  # one row widened to float32 minus the zero point (exact)
            W = self.g["W"]
            w(f"static inline void {n}_cvt(float* restrict d, const {S}* restrict s, float z) {{")
            w("  int j = 0;")
            w("#ifdef __AVX2__")
            w("  const __m256 zz = _mm256_set1_ps(z);")
            w(f"  for (; j + 8 <= {W}; j += 8) _mm256_storeu_ps(d + j, _mm256_sub_ps(_mm256_cvtepi32_ps("
              f"_mm256_cvtep{u}8_epi32(_mm_loadl_epi64((const __m128i*)(s + j)))), zz));")
            w("#endif")
            w(f"  for (; j < {W}; ++j) d[j] = (float)s[j] - z;")
            w("}")
        if V == 1:
            w(f"typedef float {vt};")
            zp = ", float z" if self.zarg else ""
            w(f"static inline {vt} {n}_ld(const {PT}* p{zp}) {{ return p[0]{' - z' if zp else ''}; }}")
            return
        w(f"typedef float {vt} __attribute__((vector_size({4 * V})));")
        w(f"typedef int {it} __attribute__((vector_size({4 * V})));")
        w(f"static inline {vt} {n}_ldu(const float* p) {{ {vt} v; __builtin_memcpy(&v, p, sizeof v); return v; }}")
        w(f"static inline void {n}_stu(float* p, {vt} v) {{ __builtin_memcpy(p, &v, sizeof v); }}")
        if self.qout:  # round half to even (the default rounding mode), zero point, saturate, narrow
            if V == 8:
                w(f"static inline void {n}_stq(signed char* p, {vt} v, {vt} ys, {vt} yz) {{")
                w("  __m256 q = _mm256_add_ps(_mm256_round_ps((__m256)(v / ys), _MM_FROUND_CUR_DIRECTION), "
                  "(__m256)yz);")
                w("  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));")
                w("  __m256i i = _mm256_cvtps_epi32(q);")
                w("  __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extractf128_si256(i, 1));")
                w("  _mm_storel_epi64((__m128i*)p, _mm_packs_epi16(h, h)); }")
            else:
                w(f"static inline void {n}_stq(signed char* p, {vt} v, {vt} ys, {vt} yz) {{")
                w(f"  for (int l = 0; l < {V}; ++l) {{ float q = nearbyintf(v[l] / ys[l]) + yz[l]; "
                  "p[l] = (signed char)(q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q)); } }")
        if self.stage:
            ldc = f"{n}_ldu"
            zp, sub = "", ""
        else:  # V data elements widened (vpmovzxbd / vpmovsxbd, vcvtdq2ps) minus the zero point
            ld = {4: f"_mm_cvtepi32_ps(_mm_cvtep{u}8_epi32(_mm_cvtsi32_si128(*(const int*)p)))",
                  8: f"_mm256_cvtepi32_ps(_mm256_cvtep{u}8_epi32(_mm_loadl_epi64((const __m128i*)p)))",
                  16: f"_mm512_cvtepi32_ps(_mm512_cvtep{u}8_epi32(_mm_loadu_si128((const __m128i*)p)))"}.get(V)
            if V == 4:  # an unaligned 4-byte read without the aliasing cast
                ld = f"_mm_cvtepi32_ps(_mm_cvtep{u}8_epi32(_mm_cvtsi32_si128(({{ int t; __builtin_memcpy(&t, p, 4); t; }}))))"
            lanes = ", ".join(f"(float)p[{i}]" for i in range(V))
            w(f"static inline {vt} {n}_ldq(const {S}* p) {{ return "
              + (f"({vt}){ld}; }}" if ld else f"({vt}){{{lanes}}}; }}"))
            ldc, zp, sub = f"{n}_ldq", f", {vt} z", " - z"
        _strided_load(w, n, vt, it, PT, ldc, V, sx, zp=zp, sub=sub, cast="(float)")

    def _split_helper(self, w: Writer) -> None:
        """Stride 2, staged: one input row (float16 / int8: widened) and deinterleaved in one pass (16
        elements -> 8 even + 8 odd floats per step); where the row holds 8 pairs or more, the last step
        overlaps the one before (rewriting the same values) instead of a scalar remainder, so only the
        one or two edge columns run scalar. (float32 rows copied element by element with a stride-2 read
        cost 3x the whole 192x28x28 stride-2 kernel's arithmetic. The scalar edge loops must not test
        the column against the vector range: gcc if-converts such a loop into a masked one over the
        whole row, converting every element lane by lane, 3x slower than the two-pass copy.)"""
        n, S, pl, W = self.name, self.S_in, self.g["PL"], self.g["W"]
        j0, j1 = -(-pl // 2), (W - 2 + pl) // 2 + 1  # columns j whose pair s[2j - PL], s[2j + 1 - PL] is in the row
        (e0, e1), (o0, o1) = self._split_ranges()
        if not (self.half or self.q):  # float32: plain (unaligned) loads
            guard, zp, conv = "", "", "s[{i}]"
            load = "({{ f8 t_; __builtin_memcpy(&t_, {p}, sizeof t_); t_; }})"
        elif self.q:
            u = "u" if S == "unsigned char" else "i"
            guard, zp, conv = "__AVX2__", ", float z", "(float)s[{i}] - z"
            load = (f"(f8)_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtep{u}8_epi32(_mm_loadl_epi64("
                    f"(const __m128i*)({{p}})))), _mm256_set1_ps(z))")
        else:
            guard, zp, conv = "__F16C__", "", "s[{i}]"
            load = "(f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)({p})))"
        w(f"static inline void {n}_split(float* restrict e, float* restrict o, const {S}* restrict s{zp}) {{")
        w(f"  int j = {j0};")
        if guard:
            w(f"#ifdef {guard}")
        w("  typedef float f8 __attribute__((vector_size(32))); typedef int i8 __attribute__((vector_size(32)));")
        overlap = j1 - j0 >= 8 and (j1 - j0) % 8  # a last step at j1 - 8 re-writes a few columns
        w(f"  for (int k = 0; k < {(j1 - j0) // 8 + (1 if overlap else 0)}; ++k) {{")
        w(f"    j = {j0} + 8 * k < {j1 - 8} ? {j0} + 8 * k : {j1 - 8};" if overlap else f"    j = {j0} + 8 * k;")
        w(f"    const {S}* q = s + 2 * j - {pl};")
        w(f"    f8 a = {load.format(p='q')}, b = {load.format(p='q + 8')};")
        w("    f8 ev = __builtin_shuffle(a, b, (i8){0, 2, 4, 6, 8, 10, 12, 14}), "
          "od = __builtin_shuffle(a, b, (i8){1, 3, 5, 7, 9, 11, 13, 15});")
        w("    __builtin_memcpy(e + j, &ev, sizeof ev); __builtin_memcpy(o + j, &od, sizeof od); }")
        w(f"  j = {j0 + (j1 - j0) // 8 * 8 if not overlap else j1};")
        if guard:
            w("#else")
            w(f"  j = {j0};")
            w("#endif")
        if min(j0, o1) > o0:
            w(f"  for (int k = {o0}; k < {min(j0, o1)}; ++k) o[k] = {conv.format(i=f'2 * k + {1 - pl}')};")
        assert e0 == j0
        w(f"  for (int k = j; k < {e1}; ++k) e[k] = {conv.format(i=f'2 * k - {pl}')};")
        w(f"  for (int k = j; k < {o1}; ++k) o[k] = {conv.format(i=f'2 * k + {1 - pl}')};")
        w("}")

    # ---- the epilogue of one value (vector or scalar) -------------------------------------------------
    def _finish(self, w: Writer, v: str, vector: bool, out_idx: str, mask: str = "") -> None:
        """The epilogue of ``v`` and its store at ``out_idx``; ``mask``: a float32 vector's lanes to
        load (residual) and store (AVX masked moves), the rest untouched."""
        if mask:
            mt = "__m256" if self.V == 8 else "__m128"
            sfx = "256" if self.V == 8 else ""
            if self.bias:
                w(f"{v} += bb;")
            if self.res:
                w(f"{v} += ({self.vt})_mm{sfx}_maskload_ps(rp + {out_idx}, {mask});")
            self._activation(w, v, True)
            w(f"_mm{sfx}_maskstore_ps(op + {out_idx}, {mask}, ({mt}){v});")
            return
        if self.q:  # dequantize the exact sum (the generic epilogue's order: acc * (x_scale * w_scale))
            w(f"{v} = {v} * {'scv' if vector else 'sc'};")
        if self.bias:
            w(f"{v} += bb;")
        if self.res:
            ld = f"{self.name}_ldh" if self.half and not self.q else f"{self.name}_ldu"
            w(f"{v} += {ld}(rp + {out_idx});" if vector else f"{v} += rp[{out_idx}];")
        self._activation(w, v, vector)
        if self.qout:
            if vector:
                w(f"{self.name}_stq(op + {out_idx}, {v}, ysv, yzv);")
            else:
                w(f"{{ float q = nearbyintf({v} / ys) + (float)yzp; "
                  f"op[{out_idx}] = (signed char)(q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q)); }}")
        elif vector:
            w(f"{self.name}_{'sth' if self.half else 'stu'}(op + {out_idx}, {v});")
        else:
            w(f"op[{out_idx}] = {v};")  # float16: narrowed (round to nearest even)

    def _activation(self, w: Writer, v: str, vector: bool) -> None:
        if self.act not in ("relu", "relu6"):
            return
        if vector:
            w(f"{v} = ({self.vt})((({self.it}){v}) & ~({v} < zv));")  # a NaN kept, as in the scalar columns
            if self.act == "relu6":
                w(f"{{ {self.it} big = {v} > six; {v} = ({self.vt})((({self.it}){v} & ~big) | "
                  f"(({self.it})six & big)); }}")
        else:
            w(f"{v} = {v} < 0.0f ? 0.0f : {v};")
            if self.act == "relu6":
                w(f"{v} = {v} > 6.0f ? 6.0f : {v};")

    def _split_ranges(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Stride 2, staged: the ``[lo, hi)`` of the even half's columns j (input column 2j - PL) and of
        the odd half's (2j + 1 - PL) that fall inside the row."""
        pl, W = self.g["PL"], self.g["W"]
        return (-(-pl // 2), (W - 1 + pl) // 2 + 1), (max(0, -(-(pl - 1) // 2)), (W - 2 + pl) // 2 + 1)

    def _tap(self, r: int, ky: int, kx: int, xexpr: str) -> str:
        """The load of tap (ky, kx) for the vector of outputs starting at column ``xexpr`` of row r."""
        g = self.g
        c = kx * g["DX"]
        if self.split:
            off = c // 2 if c % 2 == 0 else self.HW + (c - 1) // 2
            return f"{self.name}_ldu(p{r}_{ky} + {xexpr} + {off})"
        return f"{self.name}_ld(p{r}_{ky} + ({xexpr}) * {g['SX']} + {self.col0 + c}{self.zarg})"

    def _accumulate(self, w: Writer, accs: list[tuple[str, int, str]]) -> None:
        """Declare the vector accumulators ``(name, row, column expression)`` and add every tap into them,
        one broadcast weight per tap."""
        for name, _, _ in accs:
            w(f"{self.vt} {name} = zv;")
        for ky in range(self.g["KH"]):
            for kx in range(self.g["KW"]):
                w(f"{{ const {self.vt} wb = zv + w{ky}_{kx};")
                for name, r, col in accs:
                    w(f"  {name} += wb * {self._tap(r, ky, kx, col)};")
                w("}")

    def _vec_block(self, w: Writer, R: int, RX: int) -> None:
        g, V = self.g, self.V
        vector = V > 1
        w.open("")
        self._accumulate(w, [(f"a{r}_{j}", r, f"x + {j * V}") for r in range(R) for j in range(RX)])
        for r in range(R):
            for j in range(RX):
                self._finish(w, f"a{r}_{j}", vector, f"(y + {r}) * {g['OW']} + x + {j * V}")
        w.close()

    def _scalar_cols(self, w: Writer, R: int, hi: str) -> None:
        g = self.g
        w.open(f"for (; x < {hi}; ++x)")
        for r in range(R):
            w(f"float s{r} = 0.0f;")
        for kx in range(g["KW"]):
            col = f"x * {g['SX']} + {self.col0 + kx * g['DX']}"
            if self.split:
                c = kx * g["DX"]
                col = f"x + {c // 2 if c % 2 == 0 else self.HW + (c - 1) // 2}"
            guard = "" if self.stage else f"if ((unsigned)({col}) < {g['W']}u) "
            w(f"{guard}{{ const long c = {col};")
            for r in range(R):
                x = "((float)p{r}_{ky}[c] - xzf)" if self.zarg else "p{r}_{ky}[c]"
                terms = " + ".join(f"w{ky}_{kx} * " + x.format(r=r, ky=ky) for ky in range(g["KH"]))
                w(f"  s{r} += {terms};")
            w("}")
        for r in range(R):
            self._finish(w, f"s{r}", False, f"(y + {r}) * {g['OW']} + x")
        w.close()

    def _block(self, w: Writer, R: int) -> None:
        """A register block of R output rows at row ``y``: row pointers, then the columns."""
        g = self.g
        w.open("")
        if self.stage:
            for i in range(stage_rows(g, R)):
                w(f"{{ const int iy = y * {g['SY']} - {g['PT']} + {i};")
                if self.split:  # deinterleaved (float16 / int8: and widened) in one pass
                    w(f"  if ((unsigned)iy < {g['H']}u) {self.name}_split(stg + {i * self.SW}, "
                      f"stg + {i * self.SW + self.HW}, ip + (long)iy * {g['W']}{', xzf' if self.q else ''}); }}")
                    continue
                if self.half or self.q:  # widened while staged (int8: minus the zero point)
                    w(f"  if ((unsigned)iy < {g['H']}u) {self.name}_cvt(stg + {i * self.SW + g['PL']}, "
                      f"ip + (long)iy * {g['W']}{', xzf' if self.q else ''}); }}")
                    continue
                w(f"  if ((unsigned)iy < {g['H']}u) __builtin_memcpy(stg + {i * self.SW + g['PL']}, "
                  f"ip + (long)iy * {g['W']}, {4 * g['W']}); }}")
        for r in range(R):
            for ky in range(g["KH"]):
                iy = f"(y + {r}) * {g['SY']} - {g['PT']} + {ky * g['DY']}"
                src = f"stg + {(r * g['SY'] + ky * g['DY']) * self.SW}" if self.stage else f"ip + (long)({iy}) * {g['W']}"
                w(f"const {self.PT}* restrict p{r}_{ky} = (unsigned)({iy}) < {g['H']}u ? {src} : zrow;")
        w("int x = 0;")
        if self.xlo > 0:
            self._scalar_cols(w, R, str(self.xlo))
        step = self.RX * self.V
        if self.xhi > self.xlo and self.xhi - self.xlo >= self.V:
            if self.xlo:
                w(f"x = {self.xlo};")
            w.open(f"for (; x + {step} <= {self.xhi}; x += {step})")
            self._vec_block(w, R, self.RX)
            w.close()
            if self.RX > 1:
                w.open(f"for (; x + {self.V} <= {self.xhi}; x += {self.V})")
                self._vec_block(w, R, 1)
                w.close()
        if self.stage and self.V > 1 and g["OW"] % self.V:
            self._partial_block(w, R)
        else:
            self._scalar_cols(w, R, str(g["OW"]))
        w.close()

    def _partial_block(self, w: Writer, R: int) -> None:
        """Staged rows: the last ``OW % V`` columns as one vector (the staged row's zeros beyond the image
        are read, the lanes past the row are not stored)."""
        g, V = self.g, self.V
        w.open(f"if (x < {g['OW']})")
        self._accumulate(w, [(f"a{r}", r, "x") for r in range(R)])
        if self.masked:  # float32: the vector epilogue, then a masked store of the OW % V valid lanes
            w("#ifdef __AVX__")
            lanes = ", ".join("-1" if i < g["OW"] % V else "0" for i in range(V))
            mt = "__m256i" if V == 8 else "__m128i"
            w(f"const {mt} m = ({mt})({self.it}){{{lanes}}};")
            for r in range(R):
                self._finish(w, f"a{r}", True, f"(y + {r}) * {g['OW']} + x", mask="m")
            w("#else")
        w(f"float t[{V}] __attribute__((aligned(64)));")
        for r in range(R):
            w(f"{self.name}_stu(t, a{r});")
            w.open(f"for (int l = 0; x + l < {g['OW']}; ++l)")
            w("float s = t[l];")
            self._finish(w, "s", False, f"(y + {r}) * {g['OW']} + x + l")
            w.close()
        if self.masked:
            w("#endif")
        w.close()

    def kernel(self, w: Writer, *, static: bool) -> None:
        g, plan = self.g, self.plan
        args = plan.args
        data = "data_in" if "data_in" in args else "data"
        nch = -(-g["OH"] // self.chunk)
        GM = g["G"] * g["M"]
        w.open(f"{'static ' if static else ''}void {self.name}(void* const* args)")
        w(f"const {self.S_in}* restrict in = (const {self.S_in}*)args[{args.index(data)}];")
        w(f"const {self.S_w}* restrict wt = (const {self.S_w}*)args[1];")
        if self.bias:
            w(f"const float* restrict bias = (const float*)args[{args.index('bias')}];")
        if self.res:
            w(f"const {self.S_res}* restrict res = (const {self.S_res}*)args[{args.index('residual')}];")
        w(f"{self.S_out}* restrict out = ({self.S_out}*)args[{args.index('out')}];")
        if self.q:
            w(f"const float xs = *(const float*)args[{args.index('x_scale')}];")
            w(f"const int xzp = *(const int*)args[{args.index('x_zp')}]; const float xzf = (float)xzp; (void)xzf;")
            w(f"const float* restrict w_scales = (const float*)args[{args.index('w_scales')}];")
            if self.qout:
                w(f"const float ys = *(const float*)args[{args.index('y_scale')}];")
                w(f"const int yzp = *(const int*)args[{args.index('y_zp')}];")
        if self.zarg:  # peeled int8: rows outside the image read the zero point (the real zero)
            w(f"{self.PT} zrow[{self.SW}];")
            w("__builtin_memset(zrow, xzp, sizeof zrow);")
        else:
            w(f"static const {self.PT} zrow[{self.SW}] = {{0}};")
        if self.V > 1:
            w(f"const {self.vt} zv = {{0}};")
            if self.act == "relu6":
                w(f"const {self.vt} six = zv + 6.0f;")
            if self.zarg:
                w(f"const {self.vt} xzv = zv + xzf;")
            if self.qout:
                w(f"const {self.vt} ysv = zv + ys, yzv = zv + (float)yzp;")
        else:
            w("const float zv = 0.0f;")
            if self.zarg:
                w("const float xzv = xzf;")
        # the staged rows' zero padding (columns staging never writes) is written once per thread, not
        # once per work unit (the memset cost a quarter of a 192x28x28 stride-2 kernel's time)
        if self.stage:
            w.open("")
            if self.parallel:
                w("#pragma omp parallel")
                w.open("")
            w(f"float stg[{self.NR * self.SW}] __attribute__((aligned(64)));")
            w("__builtin_memset(stg, 0, sizeof stg);")
            if self.parallel:
                w("#pragma omp for schedule(static)")
        elif self.parallel:
            w("#pragma omp parallel for schedule(static)")
        w.open(f"for (long u = 0; u < {g['N'] * GM * nch}L; ++u)")
        w(f"const long ch = u / {nch}; const int yc = (int)(u % {nch});")
        w(f"const long n = ch / {GM}; const int oc = (int)(ch % {GM}); const int gi = oc / {g['M']};")
        w(f"const {self.S_in}* restrict ip = in + (n * {g['G']} + gi) * {g['H'] * g['W']}L;")
        w(f"{self.S_out}* restrict op = out + ch * {self.OHW}L;")
        if self.res:
            w(f"const {self.S_res}* restrict rp = res + ch * {self.OHW}L;")
        else:
            w("(void)zv;")
        if self.bias:
            w("const float bb = bias[oc];")
        if self.q:
            w("const float sc = xs * w_scales[oc];")
            if self.V > 1:
                w(f"const {self.vt} scv = zv + sc;")
        wl = plan.buffers["weight"].layout.dims
        for ky in range(g["KH"]):
            for kx in range(g["KW"]):
                off = f"{_dim_offset(wl[0], 'oc')} + {_dim_offset(wl[2], ky) + _dim_offset(wl[3], kx)}"
                w(f"const float w{ky}_{kx} = wt[{off}];")  # float16: widened once per channel plane
        w(f"const int y_end = (yc + 1) * {self.chunk} < {g['OH']} ? (yc + 1) * {self.chunk} : {g['OH']};")
        w(f"int y = yc * {self.chunk};")
        w.open(f"for (; y + {self.RY} <= y_end; y += {self.RY})")
        self._block(w, self.RY)
        w.close()
        if self.RY > 1:
            w.open("for (; y < y_end; ++y)")
            self._block(w, 1)
            w.close()
        w.close()
        if self.stage:
            w.close()
            if self.parallel:
                w.close()
        w.close()


def render_depthwise_kernel(plan, w: Writer, *, name: str = "fj_kernel", static: bool = False,
                            local_types: bool = False) -> None:
    """The helpers and the kernel function of a depthwise plan into ``w`` (named ``name``; file-scope
    helpers and types carry the name, so kernels of one network file never clash)."""
    del local_types  # the vector types are file-scope and named after the kernel
    gen = _Gen(plan, name)
    gen.helpers(w)
    gen.kernel(w, static=static)


def render_depthwise(plan) -> str:
    """Full source of one depthwise kernel: header, helpers, the kernel and the timing harness."""
    return standalone_c(plan, 'depthwise kernel (dw_rows: row blocks x vectors along the width)', render_depthwise_kernel)
