"""The table of target spellings a C-family renderer draws from (:class:`Dialect`), and the source
writer (:class:`Writer`); :mod:`codegen.renderers.cstyle` renders plans with them."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Dialect:
    """Every target-specific spelling of a C-family renderer.

    Templates are ``str.format`` strings; the placeholders each takes are named in the comment next to
    it. ``{T}`` is the vector (or scalar) value type, ``{S}`` the scalar element type.
    """

    name: str
    prelude: str  # includes / helpers at the top of a standalone kernel source
    harness: str  # appended to a standalone kernel source: the timing entry points (see codegen.renderers.harness)
    # element types by Task dtype, and the spelling of a zero of the scalar type
    scalar_types: dict[str, str] = field(default_factory=lambda: {
        "float32": "float", "float16": "_Float16", "int8": "signed char", "uint8": "unsigned char", "int32": "int",
        "int16": "short"})
    # low precision: what a source with float16 / int8 buffers includes (for the conversion intrinsics)
    lowp_prelude: str = "#include <immintrin.h>\n"
    # a storage vector (float16 / int8 lanes) read unaligned: {S}, {name}, {bytes}, {align}
    storage_typedef: str = "typedef {S} {name} __attribute__((vector_size({bytes}), aligned({align})));"
    # widening loads by (storage dtype, accumulator dtype, lanes): {ptr}; F16C / AVX2 / AVX-512 intrinsics.
    # A pair missing here is converted with __builtin_convertvector of the storage vector (gcc 12 turns
    # that into lane-by-lane inserts, so the table matters)
    convert_loads: dict[tuple[str, str, int], str] = field(default_factory=lambda: {
        ("float16", "float32", 4): "(vf)_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)({ptr})))",
        ("float16", "float32", 8): "(vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)({ptr})))",
        ("float16", "float32", 16): "(vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)({ptr})))",
        ("int8", "int32", 4): "(vf)_mm_cvtepi8_epi32(_mm_loadu_si32({ptr}))",
        ("int8", "int32", 8): "(vf)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)({ptr})))",
        ("int8", "int32", 16): "(vf)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)({ptr})))",
        ("uint8", "int32", 4): "(vf)_mm_cvtepu8_epi32(_mm_loadu_si32({ptr}))",
        ("uint8", "int32", 8): "(vf)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)({ptr})))",
        ("uint8", "int32", 16): "(vf)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)({ptr})))"})
    convert_vector: str = "__builtin_convertvector(*(const {U}*)({ptr}), vf)"  # {U}: storage vector type, {ptr}
    # int8 pairs (Plan.pairs == 2), by lanes: the operand type, 2*lanes int8 weights sign-extended to int16,
    # a broadcast data pair (two int16 in an int32), the exact pair dot product vpmaddwd added to an accumulator
    madd_types: dict[int, str] = field(default_factory=lambda: {4: "__m128i", 8: "__m256i", 16: "__m512i"})
    madd_load: dict[int, str] = field(default_factory=lambda: {
        4: "_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i*)({ptr})))",
        8: "_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)({ptr})))",
        16: "_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)({ptr})))"})
    madd_bcast: dict[int, str] = field(default_factory=lambda: {
        4: "_mm_set1_epi32({v})", 8: "_mm256_set1_epi32({v})", 16: "_mm512_set1_epi32({v})"})
    madd: dict[int, str] = field(default_factory=lambda: {
        4: "{acc} += (vf)_mm_madd_epi16({a}, {b});", 8: "{acc} += (vf)_mm256_madd_epi16({a}, {b});",
        16: "{acc} += (vf)_mm512_madd_epi16({a}, {b});"})
    # int8 groups of four (Plan.pairs == 4, AVX512-VNNI; 4 / 8 lanes need AVX512VL): 4*lanes int8 weights,
    # a broadcast quad of uint8 data, vpdpbusd (u8 x s8, four products summed into each int32 lane)
    dot4_load: dict[int, str] = field(default_factory=lambda: {
        4: "_mm_loadu_si128((const __m128i*)({ptr}))", 8: "_mm256_loadu_si256((const __m256i*)({ptr}))",
        16: "_mm512_loadu_si512((const void*)({ptr}))"})
    dot4: dict[int, str] = field(default_factory=lambda: {
        4: "{acc} = (vf)_mm_dpbusd_epi32((__m128i){acc}, {a}, {b});",
        8: "{acc} = (vf)_mm256_dpbusd_epi32((__m256i){acc}, {a}, {b});",
        16: "{acc} = (vf)_mm512_dpbusd_epi32((__m512i){acc}, {a}, {b});"})
    # int8 groups of four without VNNI (AVX2, 7-bit weights: Task.weight_bits == 7): vpmaddubsw (u8 x s8 ->
    # int16 pair sums; exact, |sum| <= 2 * 255 * 64) then vpmaddwd with ones16 (-> int32), added to an accumulator
    dot4_avx2: dict[int, str] = field(default_factory=lambda: {
        4: "{acc} += (vf)_mm_madd_epi16(_mm_maddubs_epi16({a}, {b}), ones16);",
        8: "{acc} += (vf)_mm256_madd_epi16(_mm256_maddubs_epi16({a}, {b}), ones16);",
        16: "{acc} += (vf)_mm512_madd_epi16(_mm512_maddubs_epi16({a}, {b}), ones16);"})
    load_quad: str = "_mm_cvtsi128_si32(_mm_loadu_si32({ptr}))"  # 4 bytes as an int (no aliasing violation)
    loop_step: str = "for (long {var} = 0; {var} < {n}; {var} += {step})"  # {var}, {n}, {step}
    zero: str = "0.0f"
    # qualifiers
    restrict: str = "restrict"
    static: str = "static "  # internal linkage (several kernels in one file)
    kernel_qualifier: str = ""  # e.g. CUDA's "__global__ "
    # a function attribute turning gcc's predictive commoning off (see CStyleRenderer._scalar_taps); "": none
    no_predictive_commoning: str = ""
    # the kernel ABI: untyped buffer pointers (each bound to a pointer of its dtype) and a byte workspace
    kernel_signature: str = "{qual}void {name}(void* const* bufs)"  # {qual}, {name}
    bind_arg: str = "{const}{S}* {restrict} {name} = ({const}{S}*)bufs[{i}];"  # {const}, {S}, {restrict}, {name}, {i}
    bind_workspace: str = "unsigned char* {restrict} ws = (unsigned char*)bufs[{i}];"  # {restrict}, {i}
    bind_ws_buffer: str = "{S}* {restrict} {name} = ({S}*)(ws + {offset});"  # {S}, {restrict}, {name}, {offset} (bytes)
    # vector types: declared once per source (or per function with local_types)
    vector_typedefs: tuple[str, ...] = (
        "typedef {S} vf __attribute__((vector_size({bytes})));",
        "typedef {S} vfu __attribute__((vector_size({bytes}), aligned({align})));  /* unaligned */")
    vector_typedefs_local: tuple[str, ...] = (
        "typedef {S} vf __attribute__((vector_size({bytes})));",
        "typedef {S} vfu __attribute__((vector_size({bytes}), aligned({align})));")
    vector_type: str = "vf"
    vector_zero: str = "({T}){{0}}"  # {T}
    load_scalar: str = "*({ptr})"  # {ptr}
    load_unaligned: str = "*(const vfu*)({ptr})"  # {ptr}
    # stride-2 load: two overlapping unaligned loads and one two-source permute; {idx}: lane indices
    load_stride2: str = ("__builtin_shuffle(*(const vfu*)({ptr}), *(const vfu*)({ptr} + {second}), "
                         "(int __attribute__((vector_size({bytes})))){{{idx}}})")  # {ptr}, {second}, {bytes}, {idx}
    load_gather: str = "(vf){{{lanes}}}"  # {lanes}: comma-separated scalar loads
    store_unaligned: str = "*(vfu*)({ptr}) = {v};"  # {ptr}, {v}
    lane: str = "{v}[{j}]"  # {v}, {j}
    fma: str = "{acc} += {a} * {b};"  # {acc}, {a}, {b} (a vector and a vector or a broadcast scalar)
    # keep a loaded vector operand in a register ({v}): without it gcc folds the load into every FMA that
    # reads it (one load per FMA) even when accumulators, vectors and broadcasts all fit the register
    # file ({vec}: its lanes); "" where a dialect has no such spelling. pin_macro defines it once per source
    # (#ifndef-guarded)
    pin: str = ""
    pin_macro: str = ""
    # a float32 broadcast operand read straight from memory into a vector ({ptr}), for 8-lane vectors,
    # where a scalar load + register broadcast lets gcc carry the scalars across the unrolled kernel-width
    # loop (see CStyleRenderer._memory_broadcasts); bcast_macro defines it once per source. "": none
    bcast8: str = ""
    bcast_macro: str = ""
    # the last, partial vectors of a masked padded sketch (codegen.padding.masked_tail): {n} valid lanes
    # (any integer expression; <= 0 none, >= {vec} all) loaded (the rest zero) and stored from {ptr};
    # mask_macro defines them once per source. "": the dialect has none (such plans are refused)
    load_masked: str = ""  # {vec}, {ptr}, {n}
    store_masked: str = ""  # {vec}, {ptr}, {n}, {v}
    mask_macro: str = ""
    # loops and thread mapping
    loop: str = "for (long {var} = 0; {var} < {n}; ++{var})"  # {var}, {n}
    parallel_for: str = "#pragma omp parallel for schedule(static)"  # before the parallel loop ("": none)
    collapse: str = " collapse({n})"  # appended to parallel_for for a collapsed nest of {n} loops
    parallel_loop: str = "for (long {var} = 0; {var} < {n}; ++{var})"  # the fused parallel loop: {var}, {n}
    unroll: str = "#pragma GCC unroll {n}"  # "": none
    simd: str = "#pragma omp simd"  # "": none
    stack_array: str = "{S} {name}[{n}] __attribute__((aligned({align})));"  # {S}, {name}, {n}, {align}
    # activations of the fused epilogue ({v}: the value); compare-and-select, not fmaxf/fminf: without
    # -ffinite-math-only gcc emits a libm call per element for those (the relu6 epilogue of a 1x1 conv
    # then cost 4x its FMAs); a select vectorizes, and lets a NaN pass as numpy's maximum / clip do.
    activations: dict[str | None, str] = field(default_factory=lambda: {
        None: "{v}", "relu": "({v} < 0.0f ? 0.0f : {v})",
        "relu6": "({v} < 0.0f ? 0.0f : ({v} > 6.0f ? 6.0f : {v}))"})

    def scalar(self, dtype: str) -> str:
        try:
            return self.scalar_types[dtype]
        except KeyError:
            raise ValueError(f"dialect {self.name!r} has no element type for dtype {dtype!r}") from None


def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def _storage_vec(dtype: str) -> str:
    """The name of the (unaligned) storage vector type of a low-precision operand."""
    return f"vs_{dtype}"


class Writer:
    """Indented lines of C-family source."""

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
