"""Padded sketches (codegen.padding) through the relaxation, the genetic codec and the oracle.

The kernels themselves are checked against numpy in tests/test_codegen.py
(``test_padded_kernels_match_numpy``) and their hard features against the extractor in
tests/test_features.py (``test_padded_hard_features_equal_the_extractor``).
"""
import jax
import numpy as np
import pytest

from codegen import ops
from codegen.space import Space, sketches_for
from codegen.spaces import spaces_for
from codegen.target import Target
from felixjax.relax import Relaxation
from felixjax.strategies.genetic import Codec
from felixjax.testing import SyntheticOracle

TARGET = Target(cores=2, simd_lanes=8, vector_registers=16)
TASKS = [ops.matmul(257, 96, 384), ops.matmul(17, 13, 7, bias=True), ops.dense(1, 197, 257),
         ops.conv2d(1, 8, 15, 15, out_channels=13), ops.depthwise_conv2d(1, 13, 15, 15, stride=2, padding=1)]


def test_a_padded_sketch_far_past_its_extent_is_refused():
    # session 76 (a security review): a database naming gemm_packed.pad_n262144 for a 5-output dense layer had its
    # build pack 144 MiB of weights (2^34: terabytes); the search pads to a vector or register block only
    task = ops.dense(1, 144, 5)
    with pytest.raises(ValueError, match="far past its extent 5"):
        Space(task, "gemm_packed.pad_n262144", TARGET)
    assert Space(task, "gemm_packed.pad_n8", TARGET).task == task  # what the search makes still works


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_spaces_for_adds_the_padded_variants(task):
    spaces = spaces_for(task, TARGET)
    exact = [s.name for s in sketches_for(task)]
    padded = [n for n in spaces if n not in exact]
    assert set(exact) <= set(spaces) and padded
    for n in padded:
        sp = spaces[n]
        assert sp.sketch.base in exact and sp.sketch.pad
        # the padded extents have the small factors the exact ones lack
        for axis, e in sp.sketch.pad:
            assert max(d for d in range(1, 9) if e % d == 0) >= 4


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_relaxation_of_padded_spaces(task):
    for name, sp in spaces_for(task, TARGET).items():
        rel = Relaxation(sp)
        rng = np.random.default_rng(0)
        for c in sp.sample_many(rng, 10) + [sp.default()]:
            assert rel.from_x(rel.to_x(c)) == c
        configs = rel.round_x(rel.sample_x(jax.random.PRNGKey(0), 64))
        assert all(sp.is_valid(c) and c.sketch == name for c in configs)
        nb = rel.neighbours(sp.default())
        assert nb and all(sp.is_valid(c) for c in nb)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_codec_mixes_exact_and_padded_sketches(task):
    spaces = spaces_for(task, TARGET)
    codec = Codec(spaces)
    rows = codec.sample(np.random.default_rng(0), 200)
    configs = codec.decode_many(rows)
    assert {c.sketch for c in configs} == set(spaces)
    assert all(spaces[c.sketch].is_valid(c) for c in configs)
    assert (codec.encode_many(configs) == rows).all()
    for kind in ("tile", "vec", "unroll", "parallel"):
        m = codec.mutate(rows, kind, np.random.default_rng(1))
        for c in codec.decode_many(m[codec.valid(m)]):
            assert spaces[c.sketch].is_valid(c), c


def test_oracle_scores_padded_configs_and_keeps_the_exact_factors():
    task = ops.matmul(257, 96, 384)
    oracle = SyntheticOracle(task, TARGET, seed=3)
    names = [sp.sketch.name for sp in oracle.spaces]
    assert names[0] == "gemm_packed" and "gemm_packed.pad_m264" in names
    lat = oracle.latencies([sp.default() for sp in oracle.spaces])
    assert np.isfinite(lat).all() and (lat > 0).all()


def test_network_build_with_padded_schedules_matches_the_default_build():
    import felixjax as fj
    from felixjax import zoo
    from felixjax.onnx_import import load_onnx

    model = load_onnx(zoo.make_model("transformer_block", seq=17, dim=24, heads=2))  # 17 tokens: prime rows
    target = Target.cpu()
    configs = {}
    for task, _ in model.tasks:
        padded = [n for n, sp in spaces_for(task, target).items() if sp.sketch.pad]
        if padded:
            configs[task] = Space(task, padded[0], target).default()
    assert configs, "no task of the model has a padded sketch"
    ref = fj.build_model(model, target, threads=1)
    exe = fj.build_model(model, target, threads=1, configs=configs)
    x = np.random.default_rng(0).standard_normal(exe.net.input_shapes[0]).astype(np.float32)
    np.testing.assert_allclose(exe(x), ref(x), rtol=1e-4, atol=1e-4)
    assert any(".pad_" in s.config.sketch for s in exe.schedules)


@pytest.mark.cc
@pytest.mark.parametrize("lanes,registers", [(16, 32), (8, 16), (4, 16)])
def test_masked_tail_reads_and_writes_in_place(lanes, registers):
    """A padded vector axis long enough (``codegen.padding.masked_tail``) runs in place: no data copy, no
    scratch; the register block's vectors past the extent load and store under masks (AVX-512, AVX2 or
    lane by lane), and every config matches numpy, with an epilogue and without, at 1 and 2 threads.
    Short rows (14 pixels in 16 lanes) keep the copy and the cropping scratch."""
    from codegen.build import build
    from codegen.lower import lower
    from codegen.measure import check_output
    from codegen.renderers.c import render
    from codegen.runtime import Kernel

    target = Target(cores=2, simd_lanes=lanes, vector_registers=registers)
    rng = np.random.default_rng(lanes)
    for task in (ops.conv2d(1, 16, 14, 14, out_channels=24, kernel=1),
                 ops.conv2d(1, 16, 14, 14, out_channels=24, kernel=1, bias=True, act="relu", residual=True)):
        sk = next(s for s in sketches_for(task, target) if s.base == "conv_flat" and s.pad)
        sp = Space(task, sk, target)
        assert sp.masked == "data"
        arrays = task.random_inputs(seed=3)
        ref = task.reference(*arrays)
        for i, threads in enumerate((1, 2, 2)):
            cfg = sp.default() if i == 0 else sp.sample(rng)
            plan = lower(sp, cfg)
            assert not plan.data_copy and plan.acc == "out" and "scratch" not in plan.buffers
            src = render(plan)
            assert "FJ_MSTORE" in src and (plan.vec == 1 or f"FJ_MLOAD{plan.vec}(data_p" in src)
            b = build(src)
            assert b.status == "ok", b.error
            kern = Kernel(plan, b.lib_path, threads=threads)
            for _ in range(2):
                ok, msg = check_output(kern(*arrays), ref, plan.con.reduction_size)
                assert ok, f"{task.name} {cfg.dumps()}: {msg}"
    short = ops.conv2d(1, 16, 14, 14, out_channels=24, kernel=1)
    direct = next(s for s in sketches_for(short, target) if s.base == "conv_direct" and s.pad)
    sp = Space(short, direct, target)  # rows of 14 padded to 16: fewer than MASKED_MIN_VECTORS vectors
    plan = lower(sp, sp.default())
    assert sp.masked == "" and plan.data_copy and plan.acc == "scratch"


@pytest.mark.cc
def test_network_build_with_masked_schedules_matches_the_default_build():
    """Masked padded schedules (``codegen.padding.masked_tail``) inside one network library: the mask macros
    and the per-kernel vector types share a translation unit with the other kernels."""
    import felixjax as fj
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, (24, 16, 1, 1), rng.standard_normal(24 * 16).tolist())
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, (32, 24, 1, 1), rng.standard_normal(32 * 24).tolist())
    b2 = helper.make_tensor("b2", TensorProto.FLOAT, (32,), rng.standard_normal(32).tolist())
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"), helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2")], "masked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 14, 14))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 32, 14, 14))], [w1, w2, b2])
    model = fj.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    target = Target.cpu()
    configs = {}
    for task, _ in model.tasks:
        masked = [sp for sp in spaces_for(task, target).values() if sp.masked]
        if masked:
            configs[task] = masked[0].default()
    assert len(configs) == 2, "both 1x1 convs over 196 pixels have a masked padded sketch"
    ref = fj.build_model(model, target, threads=2)
    exe = fj.build_model(model, target, threads=2, configs=configs)
    x = rng.standard_normal(exe.net.input_shapes[0]).astype(np.float32)
    np.testing.assert_allclose(exe(x), ref(x), rtol=1e-4, atol=1e-4)
    assert sum(Space(s.task, s.config.sketch, target).masked != "" for s in exe.schedules) == 2
