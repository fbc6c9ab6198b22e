"""The experimental Winograd sketch (codegen.winograd): F(2x2, 3x3) against numpy, its space and errors."""
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


@pytest.mark.parametrize("task", [
    conv2d(1, 16, 12, 12, out_channels=16, kernel=3, padding=1, bias=True, act="relu"),
    conv2d(2, 8, 9, 11, out_channels=24, kernel=3, padding=1, residual=True, act="relu6"),
    conv2d(1, 32, 10, 7, out_channels=32, kernel=3, padding=0, bias=True),
    conv2d(1, 8, 7, 9, out_channels=8, kernel=3, padding=2),
], ids=lambda t: t.name)
def test_default_schedule_matches_numpy(task):
    sp = Space(task, wg.WG_SKETCH, TARGET)
    out, expected = _run(task, sp.default())
    assert np.abs(out - expected).max() <= 1e-4 * np.abs(expected).max()


def test_numpy_model_of_the_algorithm_matches_the_conv():
    task = conv2d(1, 8, 9, 10, out_channels=12, kernel=3, padding=1, bias=True, act="relu")
    arrays = task.random_inputs(1)
    np.testing.assert_allclose(wg.reference(task, arrays), task.reference(*arrays), rtol=1e-5, atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_sampled_configs_match_numpy(seed):
    task = conv2d(1, 16, 10, 14, out_channels=24, kernel=3, padding=1, bias=True)
    sp = Space(task, wg.WG_SKETCH, TARGET)
    cfg = sp.sample(np.random.default_rng(seed))
    _run(task, cfg)


def test_applies_only_to_3x3_stride1_ungrouped_float32():
    assert wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, stride=2, padding=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, dilation=2, padding=2))
    assert not wg.applies(depthwise_conv2d(1, 16, 8, 8, kernel=3, padding=1))
    assert not wg.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1, dtype="float16"))
    with pytest.raises(ValueError, match="does not apply"):
        Space(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, stride=2, padding=1), wg.WG_SKETCH, TARGET)


def test_experimental_sketch_is_not_in_the_tuning_space():
    task = conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1)
    assert wg.WG_SKETCH not in [s.name for s in sketches_for(task, TARGET)]


def test_space_rejects_narrow_vectors_and_bad_weights():
    task = conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1)
    sp = Space(task, wg.WG_SKETCH, TARGET)
    cfg = sp.default()
    with pytest.raises(ValueError, match="at least 4 lanes"):
        sp.validate(type(cfg)(cfg.sketch, cfg.tiles, cfg.parallel, 1, cfg.unroll))
    with pytest.raises(ValueError, match="winograd weights"):
        wg.transform_weight(np.zeros((16, 16, 5, 5), np.float32), 8)
