"""Low-precision kernels (issue 16): float16 and int8 tasks on every sketch of the four ops.

Layers: the task records (argument order, keys, errors); property tests per dtype (an emitted kernel
of a random tiny task and config matches ``Task.reference`` within ``Task.tolerance``); the paths a
target selects, forced (the float16 fallback through F16C on any x86 CPU; the float16-accumulation
kernel run here, compiled for AVX512-FP16 only to read its assembly, skipped when gcc lacks the
flag); a short real tuning run of an int8 task.
"""
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import felixjax as fj
from codegen import ops
from codegen.build import DEFAULT_FLAGS, assemble, build
from codegen.ir import DTypes
from codegen.lower import lower
from codegen.measure_records import check_output
from codegen.ops import FP16_ACCUMULATE, Task, parse_spec
from codegen.renderers.c import render
from codegen.runtime import Kernel
from codegen.space import Space, sketches_for
from codegen.target import Target
from felixjax.relax import operand_bytes

TARGET = Target.cpu(cores=2, simd_lanes=8, vector_registers=16, avx512_fp16=False, avx512_vnni=False)
PRECISIONS = [dict(dtype="float16"), dict(dtype="int8"), dict(dtype="int8", act_signed=True, out_dtype="int8")]


# ---- records ----------------------------------------------------------------------------------

def test_argument_order_dtypes_and_keys():
    t = ops.conv2d(1, 4, 6, 6, out_channels=8, padding=1, bias=True, residual=True, dtype="int8", out_dtype="int8")
    assert t.input_names() == ["data", "weight", "bias", "residual", "x_scale", "x_zp", "w_scales", "y_scale",
                               "y_zp"]
    arrays = t.random_inputs(seed=3)
    assert [a.dtype.name for a in arrays] == ["uint8", "int8", "float32", "float32", "float32", "int32", "float32",
                                              "float32", "int32"]
    assert [a.shape for a in arrays] == t.input_shapes() and arrays[6].shape == (8,)
    assert Task.from_json(t.to_json()) == t and t.key != ops.conv2d(1, 4, 6, 6, out_channels=8, padding=1).key
    f16 = ops.matmul(4, 8, 8, dtype="float16", bias=True)
    assert [a.dtype.name for a in f16.random_inputs()] == ["float16", "float16", "float32"]
    # float32 tasks serialize as before: no new keys in their JSON
    assert set(ops.matmul(4, 8, 8).to_json()) == {"op", "params", "bias", "act", "residual", "dtype"}
    assert parse_spec("dense:n=1,in=16,out=8,dtype=int8,act_signed=1") == ops.dense(1, 16, 8, dtype="int8",
                                                                                     act_signed=True)


def test_int8_reference_is_exact_integer_arithmetic():
    t = ops.matmul(3, 5, 7, dtype="int8", act_signed=True)
    x, w, xs, xzp, ws = t.random_inputs(seed=1)
    acc = (x.astype(np.int64) - int(xzp[0])) @ w.astype(np.int64)  # exact int32 sums
    np.testing.assert_allclose(t.reference(x, w, xs, xzp, ws), acc * (float(xs[0]) * ws.astype(np.float64)),
                               rtol=1e-6)
    q = ops.matmul(3, 5, 7, dtype="int8", out_dtype="int8").random_inputs(seed=2)
    y = ops.matmul(3, 5, 7, dtype="int8", out_dtype="int8").reference(*q)
    assert y.min() >= -128 and y.max() <= 127 and np.array_equal(y, np.round(y))
    # the requantization scale fits the outputs: few of them saturate
    assert np.mean(np.abs(y) >= 127) < 0.2


@pytest.mark.parametrize("make,msg", [
    (lambda: ops.matmul(4, 4, 4, dtype="bfloat16"), "unknown dtype"),
    (lambda: ops.matmul(4, 4, 4, dtype="float16", act_signed=True), "act_signed"),
    (lambda: ops.matmul(4, 4, 4, out_dtype="int8"), "out_dtype"),
    (lambda: parse_spec("matmul:m=4,n=4,k=4,dtype=int4"), "unknown dtype"),
    (lambda: Task("matmul", ops.matmul(4, 4, 4).params, dtype="float32", dtypes=DTypes.of("float16")),
     "not supported for dtype"),
])
def test_bad_precision_input_is_a_clear_error(make, msg):
    with pytest.raises(ValueError, match=msg):
        make()


def test_int8_without_scales_or_with_bad_scales_is_refused():
    t = ops.dense(1, 8, 4, dtype="int8")
    x, w, xs, xzp, ws = t.random_inputs()
    with pytest.raises(ValueError, match="needs its scales and zero points"):
        t.reference(x, w)
    with pytest.raises(ValueError, match="x_scale must be finite and > 0"):
        t.reference(x, w, np.zeros(1, np.float32), xzp, ws)
    with pytest.raises(ValueError, match="x_zp=300 is outside"):
        t.reference(x, w, xs, np.array([300], np.int32), ws)


def test_cli_rejects_an_unknown_dtype_with_exit_code_2(capsys, tmp_path):
    from felixjax.cli import main
    assert main(["tune", "--op", "matmul:m=8,n=8,k=8,dtype=int4", "--trials", "1",
                 "--db", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown dtype" in err and len(err.splitlines()) == 1


def test_features_see_the_operand_size():
    sizes = [operand_bytes(Space(ops.matmul(8, 8, 8, **p), "gemm_packed", TARGET))
             for p in (dict(), dict(dtype="float16"), dict(dtype="int8"))]
    assert sizes == [4, 2, 1]


# ---- kernels against the reference --------------------------------------------------------------

@st.composite
def lowp_case(draw, precision):
    small = st.integers(1, 13)
    epi = dict(bias=draw(st.booleans()), residual=draw(st.booleans()),
               act=draw(st.sampled_from([None, "relu", "relu6"])), **precision)
    kind = draw(st.sampled_from(["matmul", "dense", "conv2d", "depthwise"]))
    if kind == "matmul":
        t = ops.matmul(draw(small), draw(st.integers(1, 24)), draw(small), **epi)
    elif kind == "dense":
        t = ops.dense(1, draw(st.integers(1, 40)), draw(st.integers(1, 24)), **epi)
    else:
        h, w = draw(st.integers(3, 9)), draw(st.integers(3, 9))
        k, pad, stride = draw(st.sampled_from([1, 3])), draw(st.integers(0, 1)), draw(st.integers(1, 2))
        if kind == "depthwise":
            t = ops.depthwise_conv2d(1, draw(small), h, w, kernel=k, stride=stride, padding=pad, **epi)
        else:
            t = ops.conv2d(1, draw(st.sampled_from([3, 8])), h, w, out_channels=draw(small), kernel=k,
                           stride=stride, padding=pad, **epi)
    sketches = sketches_for(t, TARGET)  # the exact sketches and the padded variants (odd extents)
    sp = Space(t, draw(st.sampled_from(sketches)), TARGET)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    cfg = sp.default() if draw(st.booleans()) else sp.sample(rng)
    return sp, cfg


def check_kernel(sp, cfg, seed=5, threads=2):
    plan = lower(sp, cfg)
    b = build(render(plan))
    assert b.status == "ok", b.error
    kern = Kernel(plan, b.lib_path, threads=threads)
    arrays = sp.task.random_inputs(seed=seed)
    ref = sp.task.reference(*arrays)
    rtol, atol = sp.task.tolerance(ref)
    for _ in range(2):  # a kernel that accumulates into its output fails the second call
        y = kern(*arrays)
        assert y.dtype == plan.arg_dtypes()[-1]
        ok, msg = check_output(y, ref, plan.con.reduction_size, rtol, atol=atol)
        assert ok, f"{sp.task.name} {cfg.dumps()}: {msg}"
    return plan


@pytest.mark.cc
@pytest.mark.parametrize("precision", PRECISIONS, ids=lambda p: "-".join(map(str, p.values())))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(data=st.data())
def test_lowp_kernels_match_the_reference(precision, data):
    sp, cfg = data.draw(lowp_case(precision))
    plan = check_kernel(sp, cfg)
    dts = sp.task.buffer_dtypes
    assert plan.acc == "scratch" and plan.buffers["scratch"].dtype == dts.accumulator
    assert plan.buffers["weight"].dtype == dts.weights and plan.arg_dtypes()[0].name == dts.inputs


# ---- paths a target selects, forced -------------------------------------------------------------

def _gcc_accepts(*flags: str) -> bool:
    try:
        r = subprocess.run(["gcc", *flags, "-x", "c", "-fsyntax-only", "-"], input="int x;", text=True,
                           capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@pytest.mark.cc
def test_float16_fallback_converts_with_f16c_and_accumulates_in_float32():
    if not _gcc_accepts("-mf16c", "-mavx2", "-mfma"):
        pytest.skip("gcc cannot target F16C")
    t = ops.matmul(8, 16, 24, dtype="float16", bias=True)
    sp = Space(t, "gemm_packed", TARGET)
    cfg = sp.default()
    src = render(lower(sp, cfg))
    assert "_mm256_cvtph_ps" in src and "typedef float vf" in src
    asm = assemble(src, (*[f for f in DEFAULT_FLAGS if f != "-march=native"], "-mavx2", "-mfma", "-mf16c"))
    assert "vcvtph2ps" in asm and "vfmadd" in asm and "ps" in asm
    if "f16c" in open("/proc/cpuinfo").read():
        check_kernel(sp, cfg)


@pytest.mark.cc
def test_float16_accumulation_runs_anywhere_and_is_native_with_avx512_fp16():
    t = ops.matmul(8, 16, 32, dtype="float16")
    t16 = Task(t.op, t.params, dtype="float16", dtypes=FP16_ACCUMULATE)
    assert t16.buffer_dtypes.accumulator == "float16" and t16.key != t.key and t16.name.endswith("_acc16")
    sp = Space(t16, "gemm_packed", TARGET)
    check_kernel(sp, sp.default())  # without AVX512-FP16 gcc rounds every _Float16 operation in software
    if not _gcc_accepts("-mavx512fp16", "-mavx512vl"):
        pytest.skip("gcc has no -mavx512fp16 (gcc >= 12 needed) for the native path's compile check")
    native = Target.cpu(cores=2, simd_lanes=16, vector_registers=32, avx512_fp16=True)
    spn = Space(t16, "gemm_packed", native)
    src = render(lower(spn, spn.default()))
    asm = assemble(src, (*[f for f in DEFAULT_FLAGS if f != "-march=native"], "-mavx512f", "-mavx512fp16",
                         "-mavx512vl", "-mf16c"))
    assert "vfmadd" in asm and "ph" in asm.split("vfmadd", 1)[1][:16]  # vfmadd...ph: native float16 FMAs


@pytest.mark.cc
@pytest.mark.parametrize("task", [ops.matmul(6, 16, 34, dtype="int8", bias=True),
                                  ops.dense(1, 64, 24, dtype="int8", act_signed=True, out_dtype="int8"),
                                  ops.conv2d(1, 10, 5, 5, out_channels=16, kernel=1, dtype="int8", act="relu"),
                                  ops.conv2d(1, 6, 5, 5, out_channels=16, kernel=3, padding=1, dtype="int8")],
                         ids=lambda t: t.name)
def test_int8_pairs_path_is_exact(task):
    # the AVX2 pair path (vpmaddwd on weights packed in pairs at load) where the schedule allows it
    rng = np.random.default_rng(1)
    paired = [(sp, c) for sk in sketches_for(task, TARGET) for sp in [Space(task, sk, TARGET)]
              for c in [sp.default()] + sp.sample_many(rng, 40) if lower(sp, c).pairs == 2]
    assert paired, "no schedule took the pair path"
    sp, cfg = paired[0]
    plan = check_kernel(sp, cfg)
    assert "_madd_epi16" in render(plan)
    if plan.data_quads:  # the timed copy holds x - zp as int16 pairs: one broadcast per pair
        assert plan.buffers["data"].dtype == "int16" and "(short)((int)data_in[" in render(plan)
    w = sp.task.random_inputs()[1]
    assert sorted(plan.pack_weight(w).tolist()) == sorted(plan.buffers["weight"].layout.pack(w, np.int8).tolist())


@pytest.mark.cc
def test_int8_widening_loads_and_zero_point_padding():
    t = ops.conv2d(1, 8, 5, 5, out_channels=16, padding=1, dtype="int8", bias=True, act="relu")
    for sk in sketches_for(t, TARGET):
        sp = Space(t, sk, TARGET)
        plan = check_kernel(sp, sp.default())
        src = render(plan)
        if plan.data_quads and plan.buffers["data"].dtype == "int16":  # by words: x - zp pairs, padding 0
            assert "- xzp)" in src and "= 0u;" in src
        elif plan.data_quads:  # by words: raw bytes, padding the zero point in every byte
            assert "(unsigned char)xzp * 0x01010101u;" in src
        elif plan.data_copy and plan.buffers["data"].dtype == "int16":  # int8 pairs: the copy holds x - zp
            assert "- xzp) : 0;" in src  # so padded positions hold 0 (the real zero)
        elif plan.data_copy:
            assert ": xzp;" in src  # padded positions hold the zero point (the real zero)
        assert "w_scales[" in src and "xs *" in src


@pytest.mark.cc
def test_a_short_int8_tuning_run(tmp_path, runner):
    t = ops.dense(1, 64, 32, dtype="int8", bias=True, act="relu")
    res = fj.tune(t, strategy="random", trials=6, db=str(tmp_path / "q.db"), seed=0, runner=runner, threads=1,
                  progress=False)
    assert all(r.status == "ok" for r in res.history), res.status_counts()  # every kernel checked by the runner
    assert res.best.gflops > 0
    arrays = t.random_inputs(seed=9)
    ref = t.reference(*arrays)
    ok, msg = check_output(res.kernel(threads=1)(*arrays), ref, 64, *t.tolerance(ref)[:1], atol=t.tolerance(ref)[1])
    assert ok, msg


# the VNNI path (groups of four, vpdpbusd) cannot run on a CPU without AVX512-VNNI: its kernels are
# run here with vpdpbusd emulated in C (a dialect table, all else as emitted: packing in groups of
# four, the weight sums appended at load, raw uint8 data, signed data flipped by 128, the zero-point
# correction in the epilogue) and compiled for AVX512-VNNI to read the instruction in the assembly
_DP4_EMULATED = r"""
#include <immintrin.h>
__attribute__((noinline)) static __m256i fj_dp4_8(__m256i acc, __m256i a, __m256i b) {
    typedef unsigned char u8x32 __attribute__((vector_size(32)));
    typedef signed char s8x32 __attribute__((vector_size(32)));
    typedef int i32x8 __attribute__((vector_size(32)));
    u8x32 ua = (u8x32)a;
    s8x32 sb = (s8x32)b;
    i32x8 r = (i32x8)acc;
    for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 4; ++i)
            r[j] += (int)ua[4 * j + i] * (int)sb[4 * j + i];
    return (__m256i)r;
}
"""


@pytest.mark.cc
@pytest.mark.parametrize("task", [ops.matmul(6, 16, 36, dtype="int8", bias=True, act="relu"),
                                  ops.dense(1, 64, 24, dtype="int8", act_signed=True, out_dtype="int8"),
                                  ops.conv2d(1, 12, 5, 5, out_channels=16, kernel=1, padding=1, dtype="int8",
                                             residual=True)],
                         ids=lambda t: t.name)
def test_vnni_groups_of_four_emulated_and_compiled(task):
    from dataclasses import replace as dc_replace

    from codegen.renderers.c import C_DIALECT
    from codegen.renderers.cstyle import CStyleRenderer

    vnni = Target.cpu(cores=2, simd_lanes=8, vector_registers=16, avx512_vnni=True)
    rng = np.random.default_rng(2)
    grouped = [(sp, c) for sk in sketches_for(task, vnni) for sp in [Space(task, sk, vnni)]
               for c in [sp.default()] + sp.sample_many(rng, 60) if lower(sp, c).pairs == 4 and c.vec == 8]
    assert grouped, "no schedule took the VNNI path"
    emulated = CStyleRenderer(dc_replace(C_DIALECT, name="c_dp4_emulated", prelude=C_DIALECT.prelude + _DP4_EMULATED,
                                         dot4={8: "{acc} = (vf)fj_dp4_8((__m256i){acc}, {a}, {b});"}))
    for sp, cfg in grouped[:1]:
        plan = lower(sp, cfg)
        kern = Kernel(plan, build(emulated.render(plan)).lib_path, threads=2)
        arrays = task.random_inputs(seed=4)
        ref = task.reference(*arrays)
        rtol, atol = task.tolerance(ref)
        ok, msg = check_output(kern(*arrays), ref, plan.con.reduction_size, rtol, atol=atol)
        assert ok, f"{task.name} {cfg.dumps()}: {msg}"
    if not _gcc_accepts("-mavx512vnni", "-mavx512vl"):
        pytest.skip("gcc cannot target AVX512-VNNI")
    asm = assemble(render(lower(*grouped[0])), (*[f for f in DEFAULT_FLAGS if f != "-march=native"], "-mavx2",
                                                "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"))
    assert "vpdpbusd" in asm


# ---- AVX2 groups of four on 7-bit weights (vpmaddubsw + vpmaddwd ones) ---------------------------

def _u8s8_pair_sums_fit_int16(lo: int, hi: int) -> bool:
    """Every vpmaddubsw pair sum x0*w0 + x1*w1 (x uint8, w in [lo, hi]) fits int16 (no saturation)."""
    most, least = 2 * 255 * max(hi, 0), 2 * 255 * min(lo, 0)
    return most <= 32767 and least >= -32768


def test_weight_bits_records_and_the_exactness_bound():
    t = ops.matmul(4, 8, 8, dtype="int8", weight_bits=7)
    assert t.name.endswith("_w7") and Task.from_json(t.to_json()) == t and t.key != ops.matmul(4, 8, 8, dtype="int8").key
    assert "weight_bits" not in ops.matmul(4, 8, 8, dtype="int8").to_json()  # 8-bit keys unchanged
    assert parse_spec("matmul:m=4,n=8,k=8,dtype=int8,weight_bits=7") == t
    w = t.random_inputs(seed=0)[1]
    assert t.weight_range == (-64, 63) and w.min() >= -64 and w.max() <= 63
    # the range is exactly where u8 x s8 pair sums cannot saturate; one more bit can
    assert _u8s8_pair_sums_fit_int16(*t.weight_range)
    assert not _u8s8_pair_sums_fit_int16(*ops.matmul(4, 8, 8, dtype="int8").weight_range)
    with pytest.raises(ValueError, match="int8 tasks only"):
        ops.matmul(4, 8, 8, weight_bits=7)
    with pytest.raises(ValueError, match="8 or 7"):
        ops.matmul(4, 8, 8, dtype="int8", weight_bits=6)


def test_groups_of_four_only_for_7_bit_weights_on_avx2():
    # 8-bit weights never take vpmaddubsw on a non-VNNI target (it would saturate): pairs of int16 instead
    for wb, want in ((8, 2), (7, 4)):
        sp = Space(ops.matmul(8, 16, 32, dtype="int8", weight_bits=wb), "gemm_packed", TARGET)
        plan = lower(sp, sp.default())
        assert plan.pairs == want
        assert ("_maddubs_epi16" in render(plan)) == (want == 4)
    rng = np.random.default_rng(0)
    sp = Space(ops.conv2d(1, 8, 5, 5, out_channels=16, padding=1, dtype="int8"), "conv_spatial_pack", TARGET)
    assert all(lower(sp, c).pairs != 4 for c in [sp.default()] + sp.sample_many(rng, 40))


@pytest.mark.cc
@pytest.mark.parametrize("task", [ops.matmul(6, 16, 36, dtype="int8", bias=True, act="relu", weight_bits=7),
                                  ops.dense(1, 64, 24, dtype="int8", act_signed=True, out_dtype="int8", weight_bits=7),
                                  ops.conv2d(1, 12, 5, 5, out_channels=16, kernel=1, padding=1, dtype="int8",
                                             residual=True, weight_bits=7),
                                  ops.conv2d(1, 16, 4, 6, out_channels=8, kernel=1, dtype="int8", act_signed=True,
                                             weight_bits=7),
                                  ops.conv2d(1, 8, 5, 5, out_channels=16, kernel=3, padding=1, dtype="int8", bias=True,
                                             weight_bits=7)],
                         ids=lambda t: t.name)
def test_int8_groups_of_four_avx2_is_exact_at_the_extremes(task):
    # the vpmaddubsw path runs here (AVX2): exact against the reference on random inputs and on the
    # saturation edge (data at 255 / the signed extremes, weights at -64 and 63 in runs of four)
    rng = np.random.default_rng(3)
    grouped = [(sp, c) for sk in sketches_for(task, TARGET) for sp in [Space(task, sk, TARGET)]
               for c in [sp.default()] + sp.sample_many(rng, 60) if lower(sp, c).pairs == 4]
    assert grouped, "no schedule took the groups-of-four path"
    for sp, cfg in grouped[:1]:  # the default where it groups (convs: taps in R0, channels interleaved)
        plan = lower(sp, cfg)
        assert "_maddubs_epi16" in render(plan)
        kern = Kernel(plan, build(render(plan)).lib_path, threads=2)
        arrays = task.random_inputs(seed=4)
        edge = [a.copy() for a in arrays]
        hi = 127 if task.act_signed else 255
        lo = -128 if task.act_signed else 0
        edge[0][...] = np.where(rng.random(edge[0].shape) < 0.5, hi, lo)
        edge[1][...] = np.where(rng.random(edge[1].shape) < 0.5, 63, -64)
        edge[1].reshape(-1)[::3] = -64
        for arr in (arrays, edge):
            ref = task.reference(*arr)
            rtol, atol = task.tolerance(ref)
            ok, msg = check_output(kern(*arr), ref, plan.con.reduction_size, rtol, atol=atol)
            assert ok, f"{task.name} {cfg.dumps()}: {msg}"
        if plan.data_quads:  # channels interleaved in fours by the timed data copy, a group per word
            assert "((unsigned int*)data)[" in render(plan)
        bad = [a.copy() for a in arrays]
        bad[1].reshape(-1)[0] = 64  # out of the 7-bit range: would saturate; refused at packing
        with pytest.raises(ValueError, match="weight_bits=7"):
            plan.pack_weight(bad[1])


@pytest.mark.parametrize("target", [Target.cpu(cores=2, simd_lanes=16, vector_registers=32, avx512_vnni=True),
                                    Target.cpu(cores=2, simd_lanes=8, vector_registers=16, avx512_vnni=False)],
                         ids=["vnni", "avx2"])
@pytest.mark.parametrize("task", [
    ops.conv2d(1, 8, 6, 6, out_channels=8, kernel=3, padding=1, dtype="int8", residual=True, out_dtype="int8",
               act="relu"),
    ops.matmul(24, 16, 32, dtype="int8"),
    ops.conv2d(1, 16, 12, 12, out_channels=16, kernel=3, padding=1),  # float32: Winograd beside direct sketches
    ops.dense(1, 64, 32, sparsity=0.7, bias=True)], ids=["conv_i8", "matmul_i8", "conv_f32", "dense_sparse"])
def test_measurer_packs_each_plans_weights_as_the_plan_does(task, target):
    """Session 72: the measurer packed weights once per weight *layout*, but an int8 plan with pairs or VNNI quads
    packs the same layout differently (interleaved, sums appended), so a candidate measured after another of the
    same layout got the other's bytes and was recorded ``wrong_result``. Every plan must get its own packing."""
    from codegen.measure import LocalRunner
    from felixjax.measurer import Measurer

    m = Measurer(task, target, LocalRunner())
    rng = np.random.default_rng(0)
    cfgs = [c for sk in sketches_for(task, target) for sp in [Space(task, sk, target)]
            for c in [sp.default(), *sp.sample_many(rng, 5)]]
    packed: dict = {}
    for cfg in cfgs:
        plan = m.plan(cfg)
        want = plan.pack_weight(m.arrays[1])
        got = m._inputs(plan)[1]
        assert got.dtype == want.dtype and np.array_equal(got, want), (cfg.sketch, plan.pairs)
        packed.setdefault(plan.buffers["weight"].layout, set()).add(want.tobytes())
    if task.dtype == "int8" and target.avx512_vnni and task.op == "conv2d":  # the failing case: 1 layout, 2 packings
        assert any(len(v) > 1 for v in packed.values())
