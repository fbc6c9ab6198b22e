"""The knob registry (codegen/knobs.py): declarations are checked, slots are fixed, a log2 knob relaxes
through 2**x, knobs on several sketches go through the genetic codec. (The full walkthrough of one
knob through every stage is tests/test_knob_walkthrough.py.)"""
from __future__ import annotations

import jax
import numpy as np
import pytest

from codegen.knobs import (MAX_EXTRA_KNOBS, Knob, knob_slot, knobs_for, register_knob, registered, registry_key,
                           unregister_knob)
from codegen.ops import conv2d
from codegen.space import Space, sketches_for
from codegen.target import Target
from felixjax.relax import I_EXTRA, Relaxation
from felixjax.relax_knobs import knob_values
from felixjax.strategies.genetic import Codec

#: the knobs the package itself registers (e.g. the sparse and depthwise sketches'): the tests add theirs
BUILTIN = registered()
TARGET = Target(cores=2, simd_lanes=8, vector_registers=16)
TASK = conv2d(1, 4, 6, 6, out_channels=8, padding=1)

# a log2 knob on every sketch, with a gap in its powers of two, and an index knob on one sketch
SPLIT = Knob("split_test", (), (1, 4, 16), 4, relax="log2", mutation_weight=0.1)
ALIGN = Knob("align_test", ("conv_spatial_pack",), lambda sp: (0, 1, 2), lambda sp: 1)


@pytest.fixture
def knobs():
    register_knob(SPLIT)
    register_knob(ALIGN)
    try:
        yield
    finally:
        unregister_knob(SPLIT)
        unregister_knob(ALIGN)


def test_declarations_are_checked():
    for bad, msg in [(Knob("vec", (), (1, 2), 1), "identifier other than"),
                     (Knob("x_test", (), (1, 3), 1, relax="log2"), None),
                     (Knob("x_test", (), (1, 2), 1, relax="cubic"), "relax must be"),
                     (Knob("x_test", (), (1, 2), 1, feature_names=("f",)), "feature_names")]:
        if msg is None:  # a log2 domain that is not powers of two fails when a space reads it
            register_knob(bad)
            try:
                with pytest.raises(ValueError, match="powers of two"):
                    Space(TASK, "conv_direct", TARGET).knobs[0].values(None)
            finally:
                unregister_knob(bad)
            continue
        with pytest.raises(ValueError, match=msg):
            register_knob(bad)
    assert registered() == BUILTIN


def test_slots_are_fixed_and_limited(knobs):
    with pytest.raises(ValueError, match="already registered"):
        register_knob(SPLIT)
    key = registry_key()
    extra = [Knob(f"k{i}_test", (), (0, 1), 0) for i in range(MAX_EXTRA_KNOBS - 2 - len(BUILTIN))]
    for k in extra:
        register_knob(k)
    try:
        with pytest.raises(ValueError, match="slots are taken"):
            register_knob(Knob("one_too_many", (), (0, 1), 0))
        assert sorted(knob_slot(k.name) for k in registered()) == list(range(MAX_EXTRA_KNOBS))
    finally:
        for k in extra:
            unregister_knob(k)
    assert registry_key() == key  # the same registry again: compiled feature code is found again
    assert [k.name for k in knobs_for("conv_direct")] == ["split_test"]
    assert [k.name for k in knobs_for("conv_spatial_pack")] == ["align_test", "split_test"]


def test_a_log2_knob_relaxes_through_powers_of_two(knobs):
    sp = Space(TASK, "conv_spatial_pack", TARGET)
    rel = Relaxation(sp)
    s = I_EXTRA + knob_slot("split_test")
    for c in sp.sample_many(np.random.default_rng(0), 30):
        x = rel.to_x(c)
        assert x[s] == np.log2(sp.knob_value(c, SPLIT)) and rel.from_x(x) == c
    # 2**x between the points; rounding to the nearest allowed point in log2 (1, 4, 16 -> 0, 2, 4)
    xe = np.zeros((3, MAX_EXTRA_KNOBS), np.float32)
    xe[:, knob_slot("split_test")] = (1.0, 2.9, 3.2)
    vals = np.asarray(knob_values(rel.arrays, jax.numpy.asarray(xe), jax.numpy))[:, knob_slot("split_test")]
    np.testing.assert_allclose(vals, 2.0 ** np.array([1.0, 2.9, 3.2]), rtol=1e-5)
    x = np.zeros((3, len(rel.to_x(sp.default()))), np.float32)
    x[:, s] = (1.0, 2.9, 3.2)
    assert [sp.knob_value(c, SPLIT) for c in rel.round_x(x)] == [1, 4, 16]
    # a neighbour step moves to the next allowed value (4 -> 1 and 4 -> 16), never to 2 or 8
    steps = {sp.knob_value(c, SPLIT) for c in rel.neighbours(sp.default())}
    assert steps == {1, 4, 16}


def test_the_codec_handles_knobs_of_some_sketches(knobs):
    spaces = {s.name: Space(TASK, s, TARGET) for s in sketches_for(TASK)}
    codec = Codec(spaces)
    rng = np.random.default_rng(1)
    rows = codec.sample(rng, 400)
    cfgs = codec.decode_many(rows)
    for c in cfgs:
        spaces[c.sketch].validate(c)
    assert (codec.encode_many(cfgs) == rows).all()
    assert {c.knob("align_test") for c in cfgs if c.sketch == "conv_direct"} == {None}
    assert {c.knob("align_test", 1) for c in cfgs if c.sketch == "conv_spatial_pack"} == {0, 1, 2}
    kids = codec.mutate(rows, "align_test", rng)
    pack = rows[:, 0] == codec.sketch_id["conv_spatial_pack"]
    col = codec.c_extra + [k.name for k in codec.knobs].index("align_test")
    assert (kids[pack, col] != rows[pack, col]).all() and (kids[~pack] == rows[~pack]).all()
    assert codec.valid(kids).all()
