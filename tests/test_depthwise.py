"""The dedicated depthwise sketch (dw_rows, codegen.depthwise / codegen.renderers.depthwise): every
emitted kernel matches numpy (strides 1-3, paddings, dilations, multipliers, odd sizes, epilogues,
both edge modes, exact and padded variants); the relaxation and the genetic codec see its knob."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen.build import build
from codegen.depthwise import DW_SKETCH, applies
from codegen.lower import lower
from codegen.measure_records import check_output
from codegen.ops import FP16_ACCUMULATE, Task, conv2d, depthwise_conv2d
from codegen.render_c import render
from codegen.runtime import Kernel
from codegen.space import Space, default_sketch, sketches_for
from codegen.target import Target

TARGET = Target.cpu()
# the tests of the AVX2 paths (8-lane vectors: F16C, vpmovzxbd, masked moves) pin that register file; an
# AVX-512 host runs them too (and its own 16-lane defaults through the property tests)
AVX2 = Target.cpu(simd_lanes=8, vector_registers=16)


def test_it_applies_to_float32_and_float16_depthwise_convs_only():
    dw = depthwise_conv2d(1, 8, 10, 10, kernel=3, padding=1)
    assert applies(dw) and DW_SKETCH in [s.name for s in sketches_for(dw)]
    assert not applies(conv2d(1, 8, 10, 10, out_channels=8, kernel=3))
    assert not applies(conv2d(1, 8, 10, 10, out_channels=8, kernel=3, groups=2))
    f16 = depthwise_conv2d(1, 8, 10, 10, kernel=3, dtype="float16")
    assert applies(f16) and default_sketch(f16, TARGET).name == DW_SKETCH
    # float16 accumulation and int8 stay on the generic sketches
    acc16 = Task(f16.op, f16.params, dtype="float16", dtypes=FP16_ACCUMULATE)
    assert not applies(acc16) and default_sketch(acc16, TARGET).name != DW_SKETCH
    # int8: exact float32 sums up to INT8_MAX_TAPS taps (a 22x22 kernel), the generic sketches beyond
    q8 = depthwise_conv2d(1, 8, 10, 10, kernel=3, dtype="int8")
    assert applies(q8) and default_sketch(q8, TARGET).name == DW_SKETCH
    assert applies(depthwise_conv2d(1, 2, 24, 24, kernel=22, dtype="int8"))
    assert not applies(depthwise_conv2d(1, 2, 24, 24, kernel=23, dtype="int8"))


@st.composite
def _cases(draw, dtype="float32", **precision):
    k = draw(st.sampled_from([1, 3, 5]))
    stride = draw(st.sampled_from([1, 2, 3]))
    dil = draw(st.sampled_from([1, 1, 2]))
    pad = draw(st.integers(0, k // 2 * dil + 1))
    h = draw(st.integers(max(3, (k - 1) * dil + 1), 19))
    w = draw(st.integers(max(3, (k - 1) * dil + 1), 37))
    task = depthwise_conv2d(draw(st.sampled_from([1, 2])), draw(st.sampled_from([2, 3, 8])), h, w, kernel=k,
                            stride=stride, padding=pad, dilation=dil, multiplier=draw(st.sampled_from([1, 1, 2])),
                            bias=draw(st.booleans()), act=draw(st.sampled_from([None, "relu", "relu6"])),
                            residual=draw(st.booleans()), dtype=dtype, **precision)
    names = [s.name for s in sketches_for(task, TARGET) if s.base == DW_SKETCH]
    space = Space(task, draw(st.sampled_from(names)), TARGET)
    cfg = space.default() if draw(st.booleans()) else space.sample(np.random.default_rng(draw(st.integers(0, 99))))
    stage = [k for k in space.knobs if k.name == "dw_stage"]
    if stage:
        cfg = space.with_knobs(cfg, {"dw_stage": draw(st.sampled_from(stage[0].values(space)))})
    return space, cfg


@pytest.mark.cc
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_every_kernel_matches_numpy(case):
    space, cfg = case
    plan = lower(space, cfg)
    b = build(render(plan))
    assert b.status == "ok", b.error
    arrays = space.task.random_inputs(seed=2)
    ref = space.task.reference(*arrays)
    y = Kernel(plan, b.lib_path, threads=2)(*arrays)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.cc
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("stage", [0, 1])
def test_vectorized_defaults_match_numpy_without_a_padded_copy(stride, stage):
    """The MobileNet-like shapes the sketch is for: full-width vectors along the width, no padded copy."""
    task = depthwise_conv2d(1, 16, 32, 32, kernel=3, stride=stride, padding=1, bias=True, act="relu6")
    space = Space(task, DW_SKETCH, TARGET)
    cfg = space.with_knobs(space.default(), {"dw_stage": stage})
    assert cfg.vec == max(v for v in space.vec_choices if space.axes[space.vector_index].extent % v == 0) > 1
    src = render(lower(space, cfg))
    assert ("stg[" in src) == bool(stage) and ("__builtin_shuffle" in src) == (stride == 2 and cfg.vec > 1)
    b = build(src)
    assert b.status == "ok", b.error
    arrays = task.random_inputs(seed=3)
    plan = lower(space, cfg)
    np.testing.assert_allclose(Kernel(plan, b.lib_path, threads=2)(*arrays), task.reference(*arrays),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.cc
@pytest.mark.parametrize("width,stride,residual", [(28, 2, True), (33, 2, False), (14, 1, True), (13, 2, True),
                                                   (30, 2, False)])
def test_staged_rows_split_by_vectors_and_partial_vectors_masked(width, stride, residual):
    """Staged float32 rows at stride 2 are deinterleaved 8 pairs at a time (the last step overlapping the
    one before where the row's pairs are not a multiple of 8: widths 28, 30, 33; 13: no full step), and
    the last ``OW % 8`` columns of a row are stored by one masked vector (the residual read masked too);
    the zero padding is written once per thread, so several units per thread must still see zeros."""
    task = depthwise_conv2d(1, 6, 11, width, kernel=3, stride=stride, padding=1, bias=True, act="relu6",
                            residual=residual)
    padded = next(s for s in sketches_for(task, AVX2) if s.base == DW_SKETCH and s.pad)
    space = Space(task, padded, AVX2)
    cfg = space.default()
    assert cfg.vec == 8
    src = render(lower(space, cfg))
    assert "_mm256_maskstore_ps" in src and ("_mm256_maskload_ps" in src) == residual
    assert ("_split(" in src) == (stride == 2)
    b = build(src)
    assert b.status == "ok", b.error
    arrays = task.random_inputs(seed=5)
    kern = Kernel(lower(space, cfg), b.lib_path, threads=2)
    for _ in range(2):
        np.testing.assert_allclose(kern(*arrays), task.reference(*arrays), rtol=1e-4, atol=1e-4)


def _check_float16(space, cfg, threads=2):
    """The kernel's float16 output against the reference: within ``Task.tolerance`` (what the runner
    checks) and, tighter, rounded once: float32 products and sums, one rounding to float16 at the store
    (half an ulp, 2**-11 relative; the float32 sums' own error is far below the absolute term)."""
    plan = lower(space, cfg)
    src = render(plan)
    b = build(src)
    assert b.status == "ok", b.error
    task = space.task
    arrays = task.random_inputs(seed=4)
    assert [a.dtype.name for a in arrays] == ["float16", "float16"] + ["float32"] * task.bias + ["float16"] * task.residual
    ref = task.reference(*arrays)
    kern = Kernel(plan, b.lib_path, threads=threads)
    for _ in range(2):  # nothing accumulates into the output across calls
        y = kern(*arrays)
        assert y.dtype == np.float16
        rtol, atol = task.tolerance(ref)
        ok, msg = check_output(y, ref, plan.con.reduction_size, rtol, atol=atol)
        assert ok, f"{task.name} {cfg.dumps()}: {msg}"
        np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2.0 ** -11 * 1.01, atol=1e-5,
                                   err_msg=f"{task.name} {cfg.dumps()}")
    return src


@pytest.mark.cc
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases("float16"))
def test_every_float16_kernel_matches_the_reference(case):
    """float16 storage, float32 arithmetic: random shapes (odd widths, strides 1-3, dilations,
    multipliers, paddings, epilogues), both edge modes, default and sampled schedules."""
    _check_float16(*case)


@pytest.mark.cc
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, "padded"])
def test_float16_vectorized_defaults_widen_with_f16c(stride, stage):
    """MobileNet-like float16 shapes, full vectors: taps widened on load (peeled, ``dw_stage=0``) or rows
    widened while staged (``dw_stage=1``; at stride 2 widened and deinterleaved in one pass), the output narrowed
    by vcvtps2ph; an odd width (27) through the padded variant (staged, a partial last vector)."""
    w = 27 if stage == "padded" else 32
    task = depthwise_conv2d(1, 8, 12, w, kernel=3, stride=stride, padding=1, bias=True, act="relu6",
                            residual=True, dtype="float16")
    name = next(s.name for s in sketches_for(task, AVX2) if s.base == DW_SKETCH and (s.pad != ()) == (w == 27))
    space = Space(task, name, AVX2)
    cfg = space.default() if stage == "padded" else space.with_knobs(space.default(), {"dw_stage": stage})
    assert cfg.vec == 8
    src = _check_float16(space, cfg)
    assert "_mm256_cvtps_ph" in src and "_mm256_cvtph_ps" in src
    assert ("_cvt(stg" in src or "_split(stg" in src) == (stage != 0)


def _check_int8(space, cfg, threads=2):
    """int8: within ``Task.tolerance`` (float32 output: rtol 1e-5; int8 output: one quantum) and,
    tighter, the accumulation exact: without an epilogue the float32 output is the exact integer sum
    times ``x_scale * w_scale`` with two float32 roundings (an integer sum off by one would be off by
    more than 1e-6 relative); an int8 output matches the reference but at rounding ties."""
    plan = lower(space, cfg)
    src = render(plan)
    b = build(src)
    assert b.status == "ok", b.error
    task = space.task
    arrays = task.random_inputs(seed=6)
    ref = task.reference(*arrays)
    kern = Kernel(plan, b.lib_path, threads=threads)
    for _ in range(2):
        y = kern(*arrays)
        assert y.dtype == (np.int8 if task.out_dtype == "int8" else np.float32)
        rtol, atol = task.tolerance(ref)
        ok, msg = check_output(y, ref, plan.con.reduction_size, rtol, atol=atol)
        assert ok, f"{task.name} {cfg.dumps()}: {msg}"
        if task.out_dtype == "int8":
            assert np.abs(y.astype(np.float64) - ref).max() <= 1 and np.mean(y == ref) > 0.97
        elif not (task.bias or task.residual or task.act):
            np.testing.assert_allclose(y, ref, rtol=4e-7, atol=0, err_msg=f"{task.name} {cfg.dumps()}")
    return src


@pytest.mark.cc
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_int8_kernel_matches_the_reference(data):
    """int8 data (uint8 with a float32 output, or int8 with an int8 output), random shapes and
    schedules, both edge modes (peeled rows outside the image read the zero point)."""
    precision = data.draw(st.sampled_from([{}, {"act_signed": True, "out_dtype": "int8"}]))
    _check_int8(*data.draw(_cases("int8", **precision)))


@pytest.mark.cc
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("stage", [0, 1])
def test_int8_vectorized_defaults_are_exact(stride, stage):
    """Full vectors: uint8 / int8 widened (vpmovzxbd / vpmovsxbd) minus the zero point; the bare conv
    (exact sums) or the requantized int8 output with every epilogue (each in both edge modes)."""
    bare = (stride + stage) % 2 == 1
    prec = {} if bare else {"act_signed": True, "out_dtype": "int8", "bias": True, "residual": True, "act": "relu6"}
    task = depthwise_conv2d(1, 8, 12, 32, kernel=3, stride=stride, padding=1, dtype="int8", **prec)
    space = Space(task, DW_SKETCH, AVX2)
    cfg = space.with_knobs(space.default(), {"dw_stage": stage})
    assert cfg.vec == 8
    src = _check_int8(space, cfg)
    assert "_mm256_cvtep" in src and ("_cvt(stg" in src or "_split(stg" in src) == bool(stage)
    assert ("_stq(" in src) == (not bare)


def test_relaxation_and_genetic_codec_see_its_knob():
    from felixjax.relax import Relaxation

    space = Space(depthwise_conv2d(1, 32, 28, 28, kernel=3, padding=1), DW_SKETCH, TARGET)
    rel = Relaxation(space)
    staged = space.with_knobs(space.default(), {"dw_stage": 1})
    assert rel.from_x(rel.to_x(staged)) == staged
    rng = np.random.default_rng(0)
    configs = rel.round_x(np.stack([rel.to_x(space.sample(rng)) + rng.normal(0, 0.3, rel.to_x(staged).shape)
                                    for _ in range(32)]))
    assert all(space.is_valid(c) for c in configs)
    knob = next(k for k in space.knobs if k.name == "dw_stage")
    assert knob.default_value(space) == 1 and {space.knob_value(c, knob) for c in configs} == {0, 1}


def test_depthwise_default_thresholds_count_columns_not_avx512_lanes():
    """The narrow-plane and padding thresholds are in columns of at most 8 (the AVX2 lanes they were set
    with): on 16 lanes a 28-wide stride-1 plane stays on (padded) ``dw_rows`` and a 56-wide row is not
    padded, where lanes-relative thresholds picked ``conv_spatial_pack`` (0.4-0.5x on Zen 4) and a
    padded row (0.7x); planes under 16 columns at stride 1 keep the channel-vectorized sketch."""
    from codegen.space import default_sketch

    avx512 = Target.cpu(simd_lanes=16, vector_registers=32)
    picks = {w: default_sketch(depthwise_conv2d(1, 64, w, w, kernel=3, padding=1), avx512).name for w in (56, 28, 20, 14, 7)}
    assert picks == {56: DW_SKETCH, 28: f"{DW_SKETCH}.pad_x32", 20: f"{DW_SKETCH}.pad_x24", 14: "conv_spatial_pack",
                     7: "conv_spatial_pack"}
    for w in (56, 28, 14):  # AVX2 unchanged
        t = depthwise_conv2d(1, 64, w, w, kernel=3, padding=1)
        assert default_sketch(t, AVX2).name == (DW_SKETCH if w == 56 else f"{DW_SKETCH}.pad_x32" if w == 28
                                                else "conv_spatial_pack")


@pytest.mark.cc
@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_a_nan_input_gives_nan_where_numpy_does_in_every_column(act):
    # a review: the vector columns' relu mask (v > 0) turned NaN into 0 while the scalar columns kept it
    from codegen import blocked

    tasks = [(depthwise_conv2d(1, 8, 6, 16, kernel=3, padding=1, act=act), DW_SKETCH),
             (blocked.conv2d_nchwc(1, 16, 6, 12, out_channels=16, kernel=3, padding=1, groups=16, act=act),
              blocked.DW_SKETCH)]
    for task, sketch in tasks:
        x, w = task.random_inputs(seed=0)[:2]
        x.reshape(-1)[[5, 77, 200]] = np.nan
        ref = task.reference(x, w)
        space = Space(task, sketch, TARGET)
        cfgs = [space.default()] + [space.with_knobs(space.default(), {"dw_stage": s}) for k in space.knobs
                                    if k.name == "dw_stage" for s in k.values(space)]
        for cfg in cfgs:
            plan = lower(space, cfg)
            y = Kernel(plan, build(render(plan)).lib_path)(x, w)
            np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
            np.testing.assert_allclose(np.nan_to_num(y), np.nan_to_num(ref), rtol=1e-4, atol=1e-4)
