"""``conv_flat`` and ``conv_im2col`` (codegen.flat): 1x1 convolutions over their flattened image and strided
convolutions over their columns, as one GEMM, against numpy."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from codegen import flat
from codegen.ops import conv2d, depthwise_conv2d
from codegen.space import Space, default_sketch, sketches_for
from codegen.target import Target
from felixjax.baselines import kernel_contender

TARGET = Target.cpu()
AVX2 = Target.cpu(simd_lanes=8, vector_registers=16)


def _check(task, cfg, target=TARGET):
    arrays = task.random_inputs(0)
    c = kernel_contender(task, cfg, arrays, threads=2, target=target, expected=task.reference(*arrays))
    c.check()  # raises on a wrong result (the task's tolerance)
    c()
    c.check()


@pytest.mark.cc
@pytest.mark.parametrize("sketch,task", [
    (flat.FLAT_SKETCH, conv2d(1, 24, 14, 14, out_channels=40, kernel=1, bias=True, act="relu")),  # k, pixels padded
    (flat.FLAT_SKETCH, conv2d(2, 16, 9, 11, out_channels=18, kernel=1, residual=True, act="relu6")),  # 99 pixels
    (flat.FLAT_SKETCH, conv2d(1, 8, 16, 16, out_channels=12, kernel=1, bias=True)),  # exact: 12 = 2 x 6, 256 px
    (flat.FLAT_SKETCH, conv2d(1, 32, 5, 3, out_channels=7, kernel=1)),  # 7 channels, 15 pixels: no rows to pad to
    (flat.IM2COL_SKETCH, conv2d(1, 8, 9, 11, out_channels=10, kernel=3, stride=2, padding=1, bias=True, act="relu")),
    (flat.IM2COL_SKETCH, conv2d(2, 3, 17, 16, out_channels=7, kernel=5, stride=2, padding=2, residual=True)),  # stem
    (flat.IM2COL_SKETCH, conv2d(1, 6, 10, 10, out_channels=12, kernel=3, stride=(2, 1), padding=(0, 1, 1, 0))),
    (flat.IM2COL_SKETCH, conv2d(1, 4, 13, 12, out_channels=6, kernel=3, stride=2, dilation=2, padding=2,
                                act="relu6")),
    # padding wider than some taps reach (columns of a tap entirely outside the image), stride 3
    (flat.IM2COL_SKETCH, conv2d(1, 3, 4, 5, out_channels=5, kernel=3, stride=3, padding=(3, 3, 2, 4))),
    (flat.IM2COL_SKETCH, conv2d(1, 16, 8, 8, out_channels=8, kernel=1, stride=2, bias=True)),  # ResNet shortcut
], ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_variant_default_matches_numpy(sketch, task):
    names = [s.name for s in sketches_for(task, AVX2) if s.base == sketch]
    assert names and names[0] == sketch
    for name in names:
        _check(task, Space(task, name, AVX2).default(), AVX2)


@pytest.mark.cc
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), padded=st.booleans())
def test_sampled_configs_match_numpy(seed, padded):
    task = conv2d(1, 12, 10, 10, out_channels=20, kernel=1, bias=True, act="relu")
    name = "conv_flat.pad_k24_x112" if padded else "conv_flat"
    sp = Space(task, name, TARGET)
    _check(task, sp.sample(np.random.default_rng(seed)))


def test_applies_to_dense_float32_ungrouped_1x1_stride1_unpadded_only():
    assert flat.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=1))
    assert not flat.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=1, stride=2))
    assert not flat.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=1, padding=1))
    assert not flat.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1))
    assert not flat.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=1, groups=2))
    assert not flat.applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=1, dtype="int8"))
    assert not flat.applies(conv2d(1, 16, 1, 8, out_channels=16, kernel=1))  # one row: flat already
    assert not flat.applies(depthwise_conv2d(1, 16, 8, 8, kernel=1))
    with pytest.raises(ValueError, match="does not apply|conv_flat takes"):
        Space(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1), flat.FLAT_SKETCH, TARGET)


def test_the_space_tiles_the_flattened_pixels_and_padded_channels():
    task = conv2d(1, 256, 14, 14, out_channels=1024, kernel=1)
    sp = Space(task, "conv_flat.pad_k1026_x208", AVX2)
    ext = {a.name: a.extent for a in sp.axes}
    assert (ext["y"], ext["x"], ext["k"]) == (1, 208, 1026)
    assert sp.api_con.data_api_shape == (1, 256, 1, 196)  # the task's own buffer, viewed flat
    cfg = sp.default()
    tiles = dict(zip((a.name for a in sp.axes), cfg.tiles))
    assert (tiles["k"][3], tiles["x"][3], cfg.vec) == (6, 16, 8)  # the 6 x 2-vector block


def test_default_on_avx2_where_the_block_fits_and_masked_on_avx512():
    assert default_sketch(conv2d(1, 256, 14, 14, out_channels=1024, kernel=1), AVX2).name == "conv_flat.pad_k1026_x208"
    assert default_sketch(conv2d(1, 16, 112, 112, out_channels=96, kernel=1), AVX2).name == "conv_flat"
    assert default_sketch(conv2d(1, 512, 7, 7, out_channels=128, kernel=1), AVX2).name != "conv_flat"  # 49 px
    # AVX-512 (no 6-row block): the pixel-padded variant where it runs masked in place (>= 4 vectors of
    # pixels, not a multiple of 16), else the previous defaults
    avx512 = Target.cpu(simd_lanes=16, vector_registers=32)
    t = conv2d(1, 256, 14, 14, out_channels=1024, kernel=1)
    assert default_sketch(t, avx512).name == "conv_flat.pad_x208" and Space(t, "conv_flat.pad_x208", avx512).masked
    for exact in (conv2d(1, 16, 112, 112, out_channels=96, kernel=1), conv2d(1, 512, 7, 7, out_channels=128, kernel=1)):
        assert not default_sketch(exact, avx512).name.startswith("conv_flat")  # 12544 px: a multiple of 16; 49 px: < 4 vectors


@pytest.mark.cc
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_sampled_im2col_configs_match_numpy(seed):
    task = conv2d(1, 8, 15, 15, out_channels=14, kernel=3, stride=2, padding=1, bias=True)
    sp = Space(task, "conv_im2col.pad_k18", TARGET)  # 8 x 8 = 64 pixels: padded on channels only
    _check(task, sp.sample(np.random.default_rng(seed)))


def test_im2col_only_in_strided_float32_dense_spaces():
    assert flat.im2col_applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, stride=2, padding=1))
    assert not flat.im2col_applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, padding=1))
    assert not flat.im2col_applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, stride=2, groups=2))
    assert not flat.im2col_applies(conv2d(1, 16, 8, 8, out_channels=16, kernel=3, stride=2, dtype="float16"))
    t = conv2d(1, 16, 8, 8, out_channels=32, kernel=3, stride=2, padding=1)
    assert flat.im2col_task(t).input_shapes()[0] == (1, 16 * 9, 1, 16)
    # the default on AVX2 where the 6 x 2-vector block fits (k 32 -> 36; 16 pixels), else conv_spatial_pack
    assert default_sketch(t, AVX2).name == "conv_im2col.pad_k36"
    assert default_sketch(conv2d(1, 256, 14, 14, out_channels=512, kernel=3, stride=2, padding=1),
                          AVX2).name == "conv_spatial_pack"  # 49 pixels: the block's two vectors do not fit
    assert not default_sketch(t, Target.cpu(simd_lanes=16, vector_registers=32)).name.startswith(flat.IM2COL_SKETCH)
