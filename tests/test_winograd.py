"""The Winograd sketches (codegen.winograd): F(2x2, 3x3) and F(4x4, 3x3) against numpy, their space and errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from codegen import winograd as wg
from codegen.ops import conv2d, depthwise_conv2d
from codegen.space import Space, sketches_for
from codegen.target import Target
from felixjax.baselines import kernel_contender

TARGET = Target.cpu()


def _run(task, cfg):
    arrays = task.random_inputs(0)
    expected = task.reference(*arrays)
    c = kernel_contender(task, cfg, arrays, threads=2, target=TARGET, expected=expected)
    c.check()  # raises on a wrong result (task tolerance)
    return c.output(), expected


VARIANTS = pytest.mark.parametrize("v", [wg.F2, wg.F4], ids=lambda v: v.sketch)


@VARIANTS
@pytest.mark.parametrize("task", [
    conv2d(1, 16, 12, 12, out_channels=16, kernel=3, padding=1, bias=True, act="relu"),
    conv2d(2, 8, 9, 11, out_channels=24, kernel=3, padding=1, residual=True, act="relu6"),
    conv2d(1, 32, 10, 7, out_channels=32, kernel=3, padding=0, bias=True),
    conv2d(1, 8, 7, 9, out_channels=8, kernel=3, padding=2),
], ids=lambda t: t.name)
def test_default_schedule_matches_numpy(task, v):
    sp = Space(task, v.sketch, TARGET)
    out, expected = _run(task, sp.default())
    assert np.abs(out - expected).max() <= 1e-4 * np.abs(expected).max()


@VARIANTS
def test_numpy_model_of_the_algorithm_matches_the_conv(v):
    task = conv2d(1, 8, 9, 10, out_channels=12, kernel=3, padding=1, bias=True, act="relu")
    arrays = task.random_inputs(1)
    np.testing.assert_allclose(wg.reference(task, arrays, v), task.reference(*arrays), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("v", [wg.F2, wg.F4], ids=lambda v: v.sketch)
def test_transforms_compute_a_1d_correlation(v):
    """A^T [(G g) * (B^T d)] is the valid correlation of d with g (m outputs from alpha inputs)."""
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal(v.alpha), rng.standard_normal(3)
    np.testing.assert_allclose(v.AT @ ((v.G @ g) * (v.BT @ d)), [d[i:i + 3] @ g for i in range(v.m)], atol=1e-12)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), four=st.booleans())
def test_sampled_configs_match_numpy(seed, four):
    task = conv2d(1, 16, 10, 14, out_channels=24, kernel=3, padding=1, bias=True)
    sp = Space(task, wg.WG4_SKETCH if four else wg.WG_SKETCH, TARGET)
    cfg = sp.sample(np.random.default_rng(seed))
    _run(task, cfg)


def test_f4_error_is_larger_than_f2s_and_well_within_the_float32_check():
    """F(4x4, 3x3)'s transforms (coefficients up to 8 and 1/24) lose more bits than F(2x2, 3x3)'s: on a
    64-channel 3x3 conv, max |error| / max |output| against a float64 conv stays below 1e-4 (the float32
    check's rtol) but above F(2x2)'s."""
    task = conv2d(1, 64, 20, 20, out_channels=32, kernel=3, padding=1)
    arrays = task.random_inputs(0)  # what _run measures
    x, w = (np.asarray(a, np.float64) for a in arrays[:2])
    win = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    exact = np.einsum("nchwij,kcij->nkhw", win, w)
    errs = {}
    for v in (wg.F2, wg.F4):
        out, _ = _run(task, Space(task, v.sketch, TARGET).default())
        errs[v.m] = np.abs(out - exact).max() / np.abs(exact).max()
    assert errs[2] < errs[4] < 1e-4, errs


def test_applies_only_to_3x3_stride1_ungrouped_float32():
    assert wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, stride=2, padding=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, dilation=2, padding=2))
    assert not wg.applies(depthwise_conv2d(1, 16, 8, 8, kernel=3, padding=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1, dtype="float16"))
    with pytest.raises(ValueError, match="does not apply"):
        Space(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, stride=2, padding=1), wg.WG_SKETCH, TARGET)


def test_sketch_in_the_space_and_default_on_larger_grids_or_little_waste():
    from codegen.space import default_sketch

    small = conv2d(1, 16, 5, 5, out_channels=16, kernel=3, padding=1)  # 3x3 tiles, 25 of 36 outputs used
    even = conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1)  # 4x4 tiles, every output used
    large = conv2d(1, 16, 28, 28, out_channels=16, kernel=3, padding=1)  # 14x14 tiles
    for task in (small, even, large):
        assert wg.WG_SKETCH in [s.name for s in sketches_for(task, TARGET)]
        assert wg.WG_SKETCH in [s.name for s in sketches_for(task)]
    # F(4x4) where its 4x4 tiles cover the output with little waste, F(2x2) elsewhere
    assert default_sketch(large, TARGET).name == wg.WG4_SKETCH == default_sketch(even, TARGET).name
    ragged = conv2d(1, 16, 14, 14, out_channels=16, kernel=3, padding=1)  # 4x4 tiles cover 16x16: 1.31x the work
    assert wg.WG4_SKETCH in [s.name for s in sketches_for(ragged, TARGET)]
    assert default_sketch(ragged, TARGET).name == wg.WG_SKETCH
    assert default_sketch(small, TARGET).name not in wg.VARIANTS
    assert default_sketch(large, Target(simd_lanes=1)).name not in wg.VARIANTS
    assert not wg.applies4(conv2d(1, 16, 3, 3, out_channels=16, kernel=3, padding=1))  # 3x3 out: F(2x2) only


@pytest.mark.cc
@VARIANTS
def test_a_small_grid_splits_its_output_channels_over_threads_and_stays_exact(v):
    """A 4x4 tile grid is one block of tiles: with more threads than blocks the kernel splits the output
    channels into parts (each redoing its block's input transform); every thread count gives the same
    result as numpy."""
    from codegen.build import build
    from codegen.lower import lower
    from codegen.renderers.c import render
    from codegen.runtime import Kernel

    task = conv2d(1, 32, 8, 8, out_channels=48, kernel=3, padding=1, bias=True, act="relu")
    space = Space(task, v.sketch, TARGET)
    plan = lower(space, space.default())
    src = render(plan)
    assert "const int kp = nt <=" in src and "part * " in src
    b = build(src)
    assert b.status == "ok", b.error
    arrays = task.random_inputs(seed=3)
    ref = task.reference(*arrays)
    for threads in (1, 2, 3):
        y = Kernel(plan, b.lib_path, threads=threads)(*arrays)
        np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max()))


def test_one_thread_runs_one_thread():
    """The kernel's OpenMP loop never runs more threads than the caller allows (it once forced the
    workspace's thread count, so a 1-thread timing ran 2 threads)."""
    from codegen.lower import lower
    from codegen.renderers.c import render

    task = conv2d(1, 16, 12, 12, out_channels=16, kernel=3, padding=1)
    src = render(lower(Space(task, wg.WG_SKETCH, TARGET), Space(task, wg.WG_SKETCH, TARGET).default()))
    assert "num_threads(nt)" in src and "omp_get_max_threads() <" in src


def test_scalar_vectors_work_and_bad_weights_are_refused():
    task = conv2d(1, 8, 6, 6, out_channels=8, kernel=3, padding=1)
    sp = Space(task, wg.WG_SKETCH, TARGET)
    cfg = sp.default()
    names = [a.name for a in sp.axes]
    tiles = list(cfg.tiles)
    tiles[names.index("k")] = (8, 1, 1, 1)
    tiles[names.index("x")] = (1, 1, 1, 3)  # 3 tiles x 1 channel per register block
    tiles[names.index("y")] = (3, 1, 1, 1)
    _run(task, type(cfg)(cfg.sketch, tuple(tiles), cfg.parallel, 1, cfg.unroll))  # 1-lane "vectors"
    with pytest.raises(ValueError, match="winograd weights"):
        wg.transform_weight(np.zeros((16, 16, 5, 5), np.float32), 8)
