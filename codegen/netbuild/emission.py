"""Emission of the whole-network C file: the tuned kernels, one function per cheap-op step, the entry
points (run, run_with, time_with, profile_with, set_threads), the header and the weights blob."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..renderers.c import render_kernel
from ..renderers.cstyle import Writer as _Writer
from .cheap_ops import PARALLEL_MIN, _Ctx
from .convert import CONVERSIONS, F16_PRELUDE, emit_conversion
from .kernels import _PRELUDE, _RENDERERS, CHEAP_OPS
from .memory import ALIGN, MemoryPlan, _aligned_zeros, plan_memory
from .spec import VALUE_KINDS, NetBuildError, NetSpec, Step, Value


# ----------------------------------------------------------------------------------------------
# Emission of the whole file
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class NetSource:
    """A generated whole-network build: C source, header, weights blob and memory plan.

    Attributes:
        source: ``model.c`` (self-contained).
        header: ``model.h`` (the C interface, sizes as macros).
        weights: the float32 weights blob ``fj_model_init`` takes (``weights.bin``).
        memory: the static memory plan.
        input_shapes, output_shapes: in entry-point order.
        kernels: number of distinct tuned kernel functions.
    """

    source: str
    header: str
    weights: np.ndarray
    memory: MemoryPlan
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    kernels: int
    steps: int
    #: what its int8 / float16 kernels' intrinsics need: ``(preprocessor macros, a -march that has them)``;
    #: ``((), "")`` for float32 kernels only (they compile for any -march)
    needs: tuple[tuple[str, ...], str] = ((), "")

    @property
    def arena_bytes(self) -> int:
        return 4 * self.memory.arena_floats

    @property
    def weight_bytes(self) -> int:
        return 4 * self.memory.weight_floats


def _check_step(step: Step, values: Sequence[Value]) -> None:
    if step.op == "kernel":
        if step.plan is None:
            raise NetBuildError(f"{step.where()}: a kernel step needs a plan")
        task = step.plan.space.task
        shapes = task.input_shapes()
        if len(step.inputs) != len(shapes) or any(i is None for i in step.inputs):
            raise NetBuildError(f"{step.where()}: takes {len(shapes)} inputs (data, weight[, bias][, residual])")
        names, dtypes = task.input_names(), task.input_dtypes()
        for k, (i, s) in enumerate(zip(step.inputs, shapes)):
            if values[i].size != math.prod(s):
                raise NetBuildError(f"{step.where()}: input {k} has {values[i].size} elements, the task "
                                    f"expects shape {s}")
            # the weight is a float32 constant converted (quantized) and packed at load; the rest is read as is
            if k != 1 and values[i].dtype != dtypes[k].name:
                raise NetBuildError(f"{step.where()}: input {k} ({names[k]}) is {values[i].dtype}, the task reads "
                                    f"{dtypes[k].name} (convert it in a step before the kernel)")
        if len(step.outputs) != 1 or step.outputs[0] is None or values[step.outputs[0]].size != math.prod(
                task.output_shape):
            raise NetBuildError(f"{step.where()}: one output of shape {task.output_shape} expected")
        out_dtype = task.buffer_dtypes.for_buffer("out")
        if values[step.outputs[0]].dtype != out_dtype:
            raise NetBuildError(f"{step.where()}: the kernel writes {out_dtype}, its output value is "
                                f"{values[step.outputs[0]].dtype}")
        return
    if step.op in CONVERSIONS:
        src, dst = CONVERSIONS[step.op]
        if (len(step.inputs) != 1 or step.inputs[0] is None or len(step.outputs) != 1 or step.outputs[0] is None
                or values[step.inputs[0]].dtype != src or values[step.outputs[0]].dtype != dst
                or values[step.outputs[0]].size != values[step.inputs[0]].size):
            raise NetBuildError(f"{step.where()}: a {step.op} step takes one {src} value to a {dst} value of its size")
        return
    if step.op == "quantize":
        if (len(step.inputs) != 1 or step.inputs[0] is None or len(step.outputs) != 1 or step.outputs[0] is None
                or values[step.outputs[0]].dtype != "uint8" or values[step.inputs[0]].dtype != "float32"
                or values[step.outputs[0]].size != values[step.inputs[0]].size
                or not 0 <= int(step.attrs.get("zero_point", -1)) <= 255 or not float(step.attrs.get("scale", 0)) > 0):
            raise NetBuildError(f"{step.where()}: a quantize step takes one float32 value to a uint8 value of "
                                "its size, with attrs scale > 0 and zero_point in [0, 255]")
        return
    if step.op not in _RENDERERS:
        raise NetBuildError(f"{step.where()}: op {step.op!r} has no C implementation; supported: "
                            f"{', '.join(CHEAP_OPS)}")
    if not step.outputs or step.outputs[0] is None:
        raise NetBuildError(f"{step.where()}: the first output is required")


def emit(spec: NetSpec) -> NetSource:
    """Generate the C source, header and weights blob of a network (see the module docstring).

    Raises:
        NetBuildError: a malformed spec or an op / attribute the C build does not implement.
    """
    values = spec.values
    for v in values:
        if v.kind not in VALUE_KINDS:
            raise NetBuildError(f"value kind {v.kind!r}; expected one of {VALUE_KINDS}")
        if v.kind == "const" and (v.data is None or np.asarray(v.data).size != v.size):
            raise NetBuildError(f"constant of shape {v.shape} has no data of that size")
    for v in spec.inputs + spec.outputs:
        if values[v].dtype != "float32":
            raise NetBuildError(f"graph inputs and outputs are float32; value {v} is {values[v].dtype}")
    for step in spec.steps:
        _check_step(step, values)
    mem = plan_memory(spec)

    # weights blob
    blob = _aligned_zeros(mem.weight_floats)
    for (v, s), off in mem.packed.items():
        plan = spec.steps[s].plan
        wshape = plan.space.task.input_shapes()[1]
        packed = plan.pack_weight(np.asarray(values[v].data, dtype=np.float32).reshape(wshape))
        _put(blob, off, packed)
    for v, (kind, off) in mem.where.items():
        if kind == "const":
            _put(blob, off, np.asarray(values[v].data, dtype=values[v].dtype))

    blob.flags.writeable = False

    def ref(v: int) -> str:
        kind, x = mem.where[mem.root(v)]
        return {"input": f"in[{x}]", "output": f"out[{x}]", "const": f"(W + {x})", "arena": f"(A + {x})"}[kind]

    w = _Writer()
    n_kernels = 0
    w("/* felixjax whole-network build (generated: do not edit).")
    w(f" * {len(spec.steps)} steps, arena {mem.arena_floats} floats, weights {mem.weight_floats} floats. */")
    w(_PRELUDE.rstrip("\n"))
    needs = vector_units(spec)
    if needs[0]:  # a clear stop instead of gcc's "inlining failed ... target specific option mismatch"
        w(f"#if !({' && '.join(f'defined({m})' for m in needs[0])})")  # (and before immintrin.h: not on ARM)
        w(f'#error "the int8 / float16 kernels of this model.c need {", ".join(needs[0])}: compile with '
          f'-march=native on the CPU it was generated for, or {needs[1]} (README.txt)"')
        w("#endif")
    if any(st.op == "kernel" and st.plan.space.task.dtype != "float32" for st in spec.steps):
        w("#include <immintrin.h>  /* the conversion intrinsics of low-precision kernels */")
    if any(st.op in CONVERSIONS for st in spec.steps):
        w(F16_PRELUDE.rstrip("\n"))
    w()
    # tuned kernels, one function per distinct (task, config)
    # (task, config, weights of a sparse kernel: compiled in) -> function name
    kernel_names: dict[tuple[str, str, str], str] = {}
    for step in spec.steps:
        if step.op != "kernel":
            continue
        key = (step.plan.space.task.key, step.plan.config.dumps(), getattr(step.plan, "weights_fingerprint", ""))
        if key in kernel_names:
            continue
        name = kernel_names[key] = f"fj_k{len(kernel_names)}"
        w(f"/* kernel {name}: {step.plan.space.task.name}, sketch {step.plan.config.sketch} */")
        render_kernel(step.plan, w, name=name, static=True, local_types=True)
        w()
    n_kernels = len(kernel_names)
    # cheap ops, one function per step
    calls: list[str] = []
    for s, step in enumerate(spec.steps):
        if step.op == "kernel":
            name = kernel_names[(step.plan.space.task.key, step.plan.config.dumps(),
                                 getattr(step.plan, "weights_fingerprint", ""))]
            args = [f"(float*){ref(step.inputs[0])}", f"(float*)(W + {mem.packed[(step.inputs[1], s)]})"]
            args += [f"(float*){ref(i)}" for i in step.inputs[2:]]
            args.append(ref(step.outputs[0]))
            args.append(f"(A + {mem.scratch[s]})" if s in mem.scratch else "NULL")
            calls.append(f"{{ void* b[] = {{{', '.join(args)}}}; {name}(b); }}  /* {step.plan.space.task.name} */")
            continue
        if step.op == "quantize":
            _quantize(w, s, values[step.inputs[0]].size, step.attrs)
            calls.append(f"fj_s{s}({ref(step.inputs[0])}, (unsigned char*){ref(step.outputs[0])});")
            continue
        if step.op in CONVERSIONS:
            src, dst = emit_conversion(w, s, step.op, values[step.inputs[0]].size)
            calls.append(f"fj_s{s}((const {src}*){ref(step.inputs[0])}, ({dst}*){ref(step.outputs[0])});")
            continue
        if step.op == "Reshape" and mem.where[step.outputs[0]][0] == "alias":
            calls.append(f"/* step {s}: Reshape (aliases its input) */")
            continue
        ins = [i for i in step.inputs]
        c = _Ctx(step, [values[i].shape if i is not None else None for i in ins],
                 [values[o].shape if o is not None else None for o in step.outputs],
                 [f"x{k}" if i is not None else None for k, i in enumerate(ins)],
                 [f"y{k}" if o is not None else None for k, o in enumerate(step.outputs)],
                 [np.asarray(values[i].data) if i is not None and values[i].kind == "const" else None for i in ins])
        params = [f"const float* restrict x{k}" for k, i in enumerate(ins) if i is not None]
        params += [f"float* restrict y{k}" for k, o in enumerate(step.outputs) if o is not None]
        params.append("float* restrict ws")
        w(f"/* step {s}: {step.op} */")
        w.open(f"static void fj_s{s}({', '.join(params)})")
        w(" ".join(f"(void){p.split()[-1]};" for p in params))
        _RENDERERS[step.op](c, w)
        w.close()
        w()
        args = [ref(i) for i in ins if i is not None]
        args += [ref(o) for o in step.outputs if o is not None]
        args.append(f"(A + {mem.scratch[s]})" if s in mem.scratch else "NULL")
        calls.append(f"fj_s{s}({', '.join(args)});")
    copies = [f"memcpy(out[{j}], {ref(v)}, {4 * values[v].size});" for j, v in mem.copies]

    arena_decl = max(mem.arena_floats, ALIGN)
    w(f"static float fj_arena[{arena_decl}] __attribute__((aligned(64)));")
    w("static const float* fj_weights;")
    w("static int fj_ready;")
    w()
    w("long fj_model_arena_floats(void) { return %dL; }" % mem.arena_floats)
    w()
    n_in, n_out = len(spec.inputs), len(spec.outputs)
    w.open("int fj_model_run_with(const float* weights, float* arena, const float* const* in, float* const* out)")
    w(f"if ((!weights && {mem.weight_floats}L > 0) || (!arena && {mem.arena_floats}L > 0) || "
      f"(!in && {n_in} > 0) || !out) return 1;")
    w(f"for (int k = 0; k < {n_in}; ++k) if (!in[k]) return 1;")
    w(f"for (int k = 0; k < {n_out}; ++k) if (!out[k]) return 1;")
    w("const float* W = weights;")
    w("float* A = arena;")
    w("(void)W; (void)A; (void)in;")
    for line in calls + copies:
        w(line)
    w("return 0;")
    w.close()
    w()
    w.open("int fj_model_init(const float* weights)")
    w(f"if (!weights && {mem.weight_floats}L > 0) return 1;")
    w("fj_weights = weights;")
    w("fj_ready = 1;")
    w("return 0;")
    w.close()
    w()
    w.open("int fj_model_run(const float* const* inputs, float* const* outputs)")
    w("if (!fj_ready) return 1;")
    w("return fj_model_run_with(fj_weights, fj_arena, inputs, outputs);")
    w.close()
    w()
    w.open("double fj_model_time_with(const float* weights, float* arena, const float* const* inputs, "
           "float* const* outputs, long number)")
    w("int (*volatile run)(const float*, float*, const float* const*, float* const*) = fj_model_run_with;")
    w("struct timespec t0, t1;")
    w("clock_gettime(CLOCK_MONOTONIC, &t0);")
    w("for (long i = 0; i < number; ++i) { run(weights, arena, inputs, outputs); "
      "__asm__ __volatile__(\"\" ::: \"memory\"); }")
    w("clock_gettime(CLOCK_MONOTONIC, &t1);")
    w("return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);")
    w.close()
    w()
    w.open("void fj_model_profile_with(const float* weights, float* arena, const float* const* in, float* const* out, "
           "double* seconds)")
    w("/* one run with every step timed (seconds[k] += time of step k): where the time goes */")
    w("const float* W = weights;")
    w("float* A = arena;")
    w("(void)W; (void)A; (void)in;")
    w("struct timespec t0, t1;")
    for k, line in enumerate(calls):
        w(f"clock_gettime(CLOCK_MONOTONIC, &t0); {line}")
        w(f"clock_gettime(CLOCK_MONOTONIC, &t1); seconds[{k}] += (double)(t1.tv_sec - t0.tv_sec) + "
          "1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);")
    for line in copies:
        w(line)
    w.close()
    w()
    w.open("void fj_model_set_threads(int n)")
    w("#ifdef _OPENMP")
    w("if (n > 0) omp_set_num_threads(n);")
    w("#else")
    w("(void)n;")
    w("#endif")
    w.close()
    w()
    s1, s2 = weights_checksum(blob[:mem.weight_floats])
    w.open("int fj_model_weights_match(const float* weights)")
    w("/* 1 when `weights` are the ones written with this model.c (their layouts follow its schedules: another")
    w("   export's weights.bin of the same size computes wrong numbers); two sums of the 32-bit words */")
    w("if (!weights) return 0;")
    w("const unsigned char* b = (const unsigned char*)weights;")
    w("unsigned long long s1 = 0, s2 = 0;")
    w.open(f"for (long i = 0; i < {mem.weight_floats}L; ++i)")
    w("unsigned int v;")
    w("memcpy(&v, b + 4 * i, 4);")
    w("s1 += v;")
    w("s2 += (unsigned long long)(i + 1) * v;")
    w.close()
    w(f"return s1 == {s1}ULL && s2 == {s2}ULL;")
    w.close()

    in_shapes = tuple(values[v].shape for v in spec.inputs)
    out_shapes = tuple(values[v].shape for v in spec.outputs)
    text = w.text()
    if "__builtin_shuffle(" in text:  # clang has no two-source permute by a vector of indices
        text = text.replace(_PRELUDE.rstrip("\n"), _PRELUDE.rstrip("\n") + "\n" + _GCC_ONLY, 1)
    return NetSource(text, _header(in_shapes, out_shapes, mem, len(spec.steps)), blob, mem, in_shapes, out_shapes, n_kernels,
                     len(spec.steps), needs)


_GCC_ONLY = ('#if defined(__clang__) || !defined(__GNUC__)\n#error "this model.c uses GCC\'s __builtin_shuffle '
             '(strided loads of its kernels): build it with gcc"\n#endif')


def vector_units(spec: NetSpec) -> tuple[tuple[str, ...], str]:
    """The x86 vector units the int8 / float16 kernels' intrinsics need (their target's SIMD width), as
    preprocessor macros, and a -march that has them; ``((), "")`` where every kernel is float32."""
    low = [st.plan for st in spec.steps if st.op == "kernel" and st.plan.space.task.dtype != "float32"]
    if not low:
        return (), ""
    t = low[0].space.target
    int8 = any(p.space.task.dtype == "int8" for p in low)
    if t.simd_lanes >= 16:
        vnni = int8 and bool(getattr(t, "avx512_vnni", False))
        return (("__AVX512F__", "__AVX512BW__") + (("__AVX512VNNI__",) if vnni else ()),
                "-march=x86-64-v4" + (" -mavx512vnni" if vnni else ""))
    if t.simd_lanes >= 8:
        return ("__AVX2__", "__F16C__", "__FMA__"), "-march=x86-64-v3"
    return ("__SSE4_1__", "__F16C__"), "-march=x86-64-v2 -mf16c"


def weights_checksum(weights: np.ndarray) -> tuple[int, int]:
    """Two sums modulo 2**64 of the float32 blob's 32-bit words ``v[i]``: ``sum(v)`` and
    ``sum((i + 1) * v[i])`` (position-sensitive), as ``fj_model_weights_match`` computes them in C.

    Example:
        >>> weights_checksum(np.array([1.0, 2.0], np.float32))
        (2139095040, 3212836864)
    """
    words = np.ascontiguousarray(weights, dtype=np.float32).reshape(-1).view(np.uint32)
    s1 = s2 = 0
    for lo in range(0, words.size, 1 << 20):  # chunks: a resnet's blob in uint64 at once would be ~0.4 GB
        part = words[lo:lo + (1 << 20)].astype(np.uint64)
        s1 += int(part.sum(dtype=np.uint64))
        s2 += int((part * np.arange(lo + 1, lo + 1 + part.size, dtype=np.uint64)).sum(dtype=np.uint64))
    return s1 % (1 << 64), s2 % (1 << 64)


def _put(blob: np.ndarray, off: int, data: np.ndarray) -> None:
    """Write ``data`` (any element type: packed int8 weights, int32 zero points) at float ``off``."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    blob.view(np.uint8)[4 * off: 4 * off + raw.size] = raw


def _quantize(w: _Writer, s: int, n: int, attrs) -> None:
    """Step ``s``: ``q[i] = clip(round(x[i] / scale) + zero_point, 0, 255)`` as uint8, rounding half to
    even (``nearbyintf``, as numpy and JAX round)."""
    scale, zp = float(attrs["scale"]), int(attrs["zero_point"])
    w(f"/* step {s}: quantize to uint8, scale {scale!r}, zero point {zp} */")
    w.open(f"static void fj_s{s}(const float* restrict x, unsigned char* restrict q)")
    if n >= PARALLEL_MIN:
        w("#pragma omp parallel for simd schedule(static)")
    else:
        w("#pragma omp simd")
    w.open(f"for (long i = 0; i < {n}L; ++i)")
    w(f"const float v = nearbyintf(x[i] / {scale!r}f) + {zp}.0f;")
    w("q[i] = (unsigned char)(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));")
    w.close()
    w.close()
    w()


def _header(in_shapes, out_shapes, mem: MemoryPlan, steps: int) -> str:
    def arr(shapes) -> str:
        return ", ".join(f"{math.prod(s)}L" for s in shapes) or "0L"

    def shape_lines(kind: str, shapes) -> list[str]:
        return [f" *   {kind} {k}: float32 {' x '.join(map(str, s)) or 'scalar'} (row-major)"
                for k, s in enumerate(shapes)]

    lines = [
        "/* felixjax whole-network build: the C interface (generated: do not edit).",
        " *",
        *shape_lines("input", in_shapes),
        *shape_lines("output", out_shapes),
        " *",
        " * weights.bin holds FJ_MODEL_WEIGHT_FLOATS little-endian float32 values: pass them to fj_model_init",
        " * (the pointer is kept, not copied). They are packed for this model.c's schedules (not the ONNX",
        " * file's layout): only the weights.bin written with it fit; fj_model_weights_match checks that.",
        " * fj_model_run uses a static arena: one call at a time; use fj_model_run_with and an arena of",
        " * fj_model_arena_floats() floats (64-byte aligned) per thread for concurrent calls. Input and",
        " * output buffers must not overlap. Functions returning int return 0 on success and 1 for a NULL",
        " * pointer (or fj_model_run before fj_model_init), except fj_model_weights_match (1: they match; 0 for",
        " * NULL). Sizes cannot be checked: every buffer must hold the floats given here.",
        " *",
        " * Threads: built with OpenMP (-fopenmp), a run uses OpenMP's thread count of the calling thread:",
        " * OMP_NUM_THREADS, else every core; fj_model_set_threads(n) is omp_set_num_threads(n) (the calling",
        " * thread's setting, for later runs). Without -fopenmp everything runs on the calling thread.",
        " *",
        " * fj_model_time_with: seconds for `number` back-to-back runs. fj_model_profile_with: one run with",
        " * each of the FJ_MODEL_STEPS steps timed, seconds[k] += the time of step k (zero it first).",
        " */",
        "#ifndef FJ_MODEL_H",
        "#define FJ_MODEL_H",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define FJ_MODEL_NUM_INPUTS {len(in_shapes)}",
        f"#define FJ_MODEL_NUM_OUTPUTS {len(out_shapes)}",
        f"#define FJ_MODEL_WEIGHT_FLOATS {mem.weight_floats}L",
        f"#define FJ_MODEL_ARENA_FLOATS {mem.arena_floats}L",
        f"#define FJ_MODEL_STEPS {steps}",
        f"static const long fj_model_input_floats[] = {{{arr(in_shapes)}}};",
        f"static const long fj_model_output_floats[] = {{{arr(out_shapes)}}};",
        "",
        "int fj_model_init(const float* weights);",
        "int fj_model_run(const float* const* inputs, float* const* outputs);",
        "int fj_model_run_with(const float* weights, float* arena, const float* const* inputs, float* const* outputs);",
        "double fj_model_time_with(const float* weights, float* arena, const float* const* inputs, "
        "float* const* outputs, long number);",
        "void fj_model_profile_with(const float* weights, float* arena, const float* const* inputs, "
        "float* const* outputs, double* seconds);",
        "long fj_model_arena_floats(void);",
        "void fj_model_set_threads(int n);",
        "int fj_model_weights_match(const float* weights);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "#endif",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Loading into Python and exporting
