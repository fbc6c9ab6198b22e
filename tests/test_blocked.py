"""Channel-blocked convolutions (codegen.blocked) and the network layout pass (felixjax.layout): layout
conversions are exact inverses; every emitted ``conv_nchwc`` kernel matches numpy (1x1, 3x3, strides,
paddings, depthwise, epilogues, default and sampled configs); the relaxation rounds to valid configs and
the features are finite; a network rewritten to NCHW8c computes what the NCHW one does, in numpy and in
its C build, with one reorder at each edge of the blocked region."""
import dataclasses
import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen import blocked
from codegen.build import build
from codegen.lower import lower
from codegen.ops import Task, conv2d
from codegen.render_c import render
from codegen.runtime import Kernel
from codegen.space import Space, default_sketch, sketches_for
from codegen.target import Target

TARGET = Target.cpu()
# the defaults' structure asserted below is that of an AVX2 register file (8 lanes, 16 registers); an
# AVX-512 host (16 lanes, 32 registers) runs the same code with wider blocks
AVX2 = Target.cpu(simd_lanes=8, vector_registers=16)


def test_layout_conversions_are_inverse_and_the_reference_is_the_plain_convs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 5, 7)).astype(np.float32)
    xb = blocked.to_blocked(x)
    assert xb.shape == (4, 5, 7, 8) and xb[3, 3, 4, 5] == x[1, 13, 3, 4]
    np.testing.assert_array_equal(blocked.from_blocked(xb, 2), x)
    for groups, k, nchw_in in ((1, 24, False), (16, 16, False), (1, 8, True)):
        t = blocked.conv2d_nchwc(2, 16, 5, 7, out_channels=k, kernel=3, padding=1, groups=groups, bias=True,
                                 residual=True, act="relu6", plain_data=nchw_in)
        plain = blocked.plain_twin(t)
        wt = rng.standard_normal(plain.input_shapes()[1]).astype(np.float32)
        wb = blocked.weight_to_blocked(wt, t)
        assert wb.shape == t.input_shapes()[1]
        np.testing.assert_array_equal(blocked.weight_from_blocked(wb, t), wt)
        b = rng.standard_normal(k).astype(np.float32)
        res = rng.standard_normal(plain.output_shape).astype(np.float32)
        got = t.reference(x if nchw_in else xb, wb, b, blocked.to_blocked(res))
        np.testing.assert_array_equal(blocked.from_blocked(got, 2), plain.reference(x, wt, b, res))
    assert Task.from_json(json.loads(json.dumps(t.to_json()))) == t and t.key != plain.key


def test_blocked_tasks_reject_what_the_layout_cannot_hold():
    with pytest.raises(ValueError, match="block 8 must divide"):
        blocked.conv2d_nchwc(1, 12, 8, 8, out_channels=16)
    with pytest.raises(ValueError, match="groups must be 1 or the channel count"):
        blocked.conv2d_nchwc(1, 16, 8, 8, out_channels=16, groups=2)
    t = blocked.conv2d_nchwc(1, 16, 8, 8, out_channels=16)
    assert [s.name for s in sketches_for(t, TARGET)] == [blocked.SKETCH] == [default_sketch(t, TARGET).name]


@st.composite
def _cases(draw):
    dw, plain = draw(st.sampled_from([(True, False), (False, False), (False, True)]))
    k = draw(st.sampled_from([1, 3, 5]))
    stride = draw(st.sampled_from([1, 2]))
    pad = draw(st.integers(0, k // 2))
    h, w = draw(st.integers(k, 13)), draw(st.integers(k, 17))
    c = draw(st.sampled_from([3, 5, 16] if plain else [8, 16, 24]))
    task = blocked.conv2d_nchwc(draw(st.sampled_from([1, 2])), c, h, w, out_channels=c if dw else draw(
        st.sampled_from([8, 16, 32])), kernel=k, stride=stride, padding=pad, groups=c if dw else 1,
        bias=draw(st.booleans()), act=draw(st.sampled_from([None, "relu", "relu6"])), residual=draw(st.booleans()),
        plain_data=plain)
    space = Space(task, draw(st.sampled_from([s.name for s in sketches_for(task, TARGET)])), TARGET)
    cfg = space.default() if draw(st.booleans()) else space.sample(np.random.default_rng(draw(st.integers(0, 99))))
    return space, cfg


@pytest.mark.cc
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_every_blocked_kernel_matches_numpy(case):
    space, cfg = case
    plan = lower(space, cfg)
    b = build(render(plan))
    assert b.status == "ok", b.error
    arrays = space.task.random_inputs(seed=1)
    ref = space.task.reference(*arrays)
    y = Kernel(plan, b.lib_path, threads=2)(*arrays)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.cc
def test_a_scalar_blocked_conv_compiles_quickly_and_matches_numpy():
    """Found by the test above as a 60 s build timeout: a 5x5 blocked conv with scalar accumulators (vec 1)
    and its tap loop rolled inside unrolled channel loops took gcc 90 s at -O3 (predictive commoning);
    such kernels are compiled without it (0.8 s)."""
    from codegen.space import Config

    task = blocked.conv2d_nchwc(2, 16, 5, 12, out_channels=32, kernel=5, padding=2)
    space = Space(task, blocked.SKETCH, TARGET)
    cfg = Config(blocked.SKETCH, ((1, 2, 1, 1), (2, 1, 2, 1), (5, 1, 1, 1), (1, 3, 1, 4), (1, 1, 4, 2), (1, 2), (2, 4),
                                  (1, 5), (1, 5)), 5, 1, 256)
    plan = lower(space, cfg)
    src = render(plan)
    assert 'optimize("no-predictive-commoning")' in src
    assert "no-predictive-commoning" not in render(lower(space, space.default()))  # vectorized: unchanged
    b = build(src, timeout_s=30)
    assert b.status == "ok", b.error
    arrays = task.random_inputs(seed=3)
    ref = task.reference(*arrays)
    np.testing.assert_allclose(Kernel(plan, b.lib_path, threads=2)(*arrays), ref, rtol=1e-4,
                               atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.cc
def test_blocked_depthwise_reads_its_input_in_place_and_matches_numpy_at_every_edge():
    """``dw_nchwc`` (the blocked depthwise default): no padded copy of the input, edge columns peeled at
    compile time; kernels wider than the image, dilation, stride 3, a batch of two, any register block."""
    cases = [(1, 16, 12, 12, 3, 2, 1, 1), (2, 8, 4, 4, 7, 1, 3, 1), (1, 24, 13, 10, 3, 1, 2, 2),
             (1, 8, 3, 9, 3, 3, 0, 1), (1, 8, 9, 7, 5, 2, 2, 1)]  # n, c, h, w, kernel, stride, pad, dilation
    for i, (n, c, h, w, k, s, p, d) in enumerate(cases):
        task = blocked.conv2d_nchwc(n, c, h, w, out_channels=c, kernel=k, stride=s, padding=p, dilation=d, groups=c,
                                    bias=i % 2 == 0, act=(None, "relu", "relu6")[i % 3], residual=i % 2 == 1)
        assert default_sketch(task, TARGET).name == blocked.DW_SKETCH
        space = Space(task, blocked.DW_SKETCH, TARGET)
        arrays = task.random_inputs(seed=i)
        ref = task.reference(*arrays)
        for cfg in [space.default()] + space.sample_many(np.random.default_rng(i), 3):
            plan = lower(space, cfg)
            src = render(plan)
            assert "zrow" in src and "ws" not in src.split("void fj_kernel")[1].split("int main")[0]
            b = build(src)
            assert b.status == "ok", b.error
            y = Kernel(plan, b.lib_path, threads=2)(*arrays)
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def test_default_register_block_reads_one_weight_vector_per_output_block():
    """The default's register block: output pixels x output blocks with the most FMAs per load, at most
    12 accumulators on AVX2 (16 registers), 24 on AVX-512 (32); the lanes axis whole in S3 (one 8-lane
    vector)."""
    avx512 = Target.cpu(simd_lanes=16, vector_registers=32)
    for target, cap in ((AVX2, 12), (avx512, 24)):
        space = Space(blocked.conv2d_nchwc(1, 160, 7, 7, out_channels=960, kernel=1), blocked.SKETCH, target)
        cfg = space.default()
        s3 = {a.name: t[-1] for a, t in zip(space.axes, cfg.tiles)}
        assert s3["v"] == 8 == cfg.vec and s3["k"] * s3["y"] * s3["x"] <= cap and s3["x"] == 7
        space = Space(blocked.conv2d_nchwc(1, 64, 14, 14, out_channels=64, kernel=3, padding=1), blocked.SKETCH, target)
        s3 = {a.name: t[-1] for a, t in zip(space.axes, space.default().tiles)}
        assert s3["k"] * s3["y"] * s3["x"] <= cap
        assert s3["k"] == (2 if target is AVX2 else 4)  # more accumulators: more output blocks per broadcast


def test_relaxation_rounds_to_valid_configs_and_hard_features_equal_the_extractor():
    """The blocked op is an ordinary contraction to the relaxation and the differentiable features: its
    rounded points are valid configs, and hard-mode features equal the independent extractor's (the
    flattened, padded 1x1 sketch too)."""
    import jax
    import jax.numpy as jnp

    from felixjax.extract import extract
    from felixjax.features import batch_features, feature_inputs
    from felixjax.relax import Relaxation
    from felixjax.smooth import Smooth

    cases = ((blocked.conv2d_nchwc(1, 32, 14, 14, out_channels=32, kernel=3, padding=1, groups=32, bias=True),
              blocked.SKETCH),
             (blocked.conv2d_nchwc(1, 16, 9, 9, out_channels=16, kernel=3, stride=2, padding=1, groups=16),
              blocked.DW_SKETCH),
             (blocked.conv2d_nchwc(1, 16, 7, 7, out_channels=24, kernel=1, residual=True), blocked.SKETCH),
             (blocked.conv2d_nchwc(1, 16, 7, 7, out_channels=32, kernel=1, bias=True), "conv_nchwc_flat.pad_x50"),
             (blocked.conv2d_nchwc(1, 16, 13, 13, out_channels=16, kernel=3, padding=1), "conv_nchwc.pad_x14"))
    for i, (task, sketch) in enumerate(cases):
        space = Space(task, sketch, TARGET)
        rel = Relaxation(space)
        rounded = rel.round_x(rel.sample_x(jax.random.PRNGKey(i), 16))
        assert rounded and all(space.is_valid(c) for c in rounded)
        configs = space.sample_many(np.random.default_rng(i), 15) + [space.default()]
        hard = batch_features(feature_inputs(rel), jnp.asarray(np.stack([rel.to_x(c) for c in configs])),
                              Smooth.hard_mode())
        for b, cfg in enumerate(configs):
            ref = extract(space, cfg)
            np.testing.assert_array_equal(np.asarray(hard.mask[b]), ref.mask)
            m = ref.mask[:, None]
            np.testing.assert_allclose(np.asarray(hard.access[b]) * m, ref.access * m, atol=1e-5, rtol=0)
            np.testing.assert_allclose(np.asarray(hard.glob[b]), ref.glob, atol=1e-5, rtol=0)


@pytest.mark.cc
def test_a_network_in_nchwc_computes_what_the_nchw_one_does():
    import felixjax as fj
    from felixjax.network import build_model

    proto = fj.zoo.make_model("mobilenet_v2", dataset="cifar10", seed=0)
    plain, nchwc = fj.load_onnx(proto), fj.load_onnx(proto, layout="nchwc")
    ops = [n.op for n in nchwc.graph.nodes]
    # the 3-channel stem reads the NCHW image and writes NCHW8c; one reorder, out of the region before the pooling
    assert ops.count("Reblock") == 1 and ops[ops.index("Reblock") + 1] == "ReduceMean"
    tasks = [t for t, _ in nchwc.tasks]
    assert blocked.plain_data(tasks[0]) and all(t.op == blocked.OP and not blocked.plain_data(t)
                                                for t in tasks[1:] if t.op != "dense")
    x = np.random.default_rng(0).standard_normal(plain.input_shapes["input"]).astype(np.float32)
    ref = plain.run_numpy(x)
    np.testing.assert_allclose(nchwc.run_numpy(x), ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    exe = build_model(nchwc, TARGET, threads=2)
    np.testing.assert_allclose(exe(x), ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    with pytest.raises(ValueError, match="layout must be one of"):
        fj.load_onnx(proto, layout="nhwc")


def test_only_eligible_convs_are_blocked():
    from felixjax.graph_passes import Graph, Node
    from felixjax.layout import block_channels

    t1 = conv2d(1, 8, 6, 6, out_channels=12, kernel=1)  # 12 out channels: not a multiple of 8
    t2 = conv2d(1, 12, 6, 6, out_channels=16, kernel=1)
    g = Graph((Node("conv2d", ("x", "w1"), ("a",), {"task": t1}, "c1"), Node("conv2d", ("a", "w2"), ("y",),
                                                                              {"task": t2}, "c2")),
              ("x",), ("y",), {"x": (1, 8, 6, 6), "a": (1, 12, 6, 6), "y": (1, 16, 6, 6), "w1": (12, 8, 1, 1),
                               "w2": (16, 12, 1, 1)},
              {"w1": np.ones((12, 8, 1, 1), np.float32), "w2": np.ones((16, 12, 1, 1), np.float32)})
    assert block_channels(g) is g  # nothing eligible (and a graph output is never blocked)


@pytest.mark.cc
def test_reorders_both_ways_in_c_around_a_depthwise_conv_on_the_input():
    """A depthwise conv reading the network's input cannot take NCHW data: a Reblock into NCHW8c before
    it, one back before the NCHW Sigmoid; the C build matches numpy."""
    import onnx
    from onnx import helper

    import felixjax as fj
    from felixjax.network import build_model

    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["h"], group=16, pads=[1, 1, 1, 1]), helper.make_node("Sigmoid", ["h"], ["y"])],
        "dw", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 9, 11])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 9, 11])],
        [onnx.numpy_helper.from_array(w, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = fj.load_onnx(proto, layout="nchwc")
    assert [n.attrs.get("to") for n in model.graph.nodes if n.op == "Reblock"] == ["nchwc", "nchw"]
    x = rng.standard_normal((1, 16, 9, 11)).astype(np.float32)
    ref = fj.load_onnx(proto).run_numpy(x)
    np.testing.assert_allclose(model.run_numpy(x), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(build_model(model, TARGET, threads=2)(x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.cc
def test_vector_operands_are_pinned_only_where_the_block_fits_the_register_file():
    """A register block whose accumulators, distinct vectors and broadcasts fit the 16 AVX2 registers
    keeps its vectors in registers (FJ_PIN: gcc otherwise folds the load into each FMA); a larger block
    (3 out blocks x 2x2 pixels: 12 + 3 + 4) and the 6 x 2 GEMM block (12 + 2 + 6) are left alone."""
    from codegen.ops import matmul
    from codegen.space import Config

    avx2 = Target.cpu(simd_lanes=8, vector_registers=16)
    task = blocked.conv2d_nchwc(1, 16, 6, 6, out_channels=48, kernel=1, bias=True, act="relu6")
    space = Space(task, blocked.SKETCH, avx2)

    def cfg(kb):
        return Config(blocked.SKETCH, ((6 // kb, 1, 1, kb), (3, 1, 1, 2), (3, 1, 1, 2), (1, 1, 1, 8), (1, 2), (1, 8)),
                      1, 8, 1)

    fits, spills = render(lower(space, cfg(2))), render(lower(space, cfg(3)))
    assert "FJ_PIN8(w" in fits and "FJ_PIN8(w" not in spills
    gemm = Space(matmul(48, 64, 32), default_sketch(matmul(48, 64, 32), avx2), avx2)
    assert "FJ_PIN8(" not in render(lower(gemm, gemm.default()))
    b = build(fits)
    assert b.status == "ok", b.error
    arrays = task.random_inputs(seed=4)
    np.testing.assert_allclose(Kernel(lower(space, cfg(2)), b.lib_path, threads=1)(*arrays), task.reference(*arrays),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.cc
def test_blocked_direct_convs_broadcast_from_memory_only_where_the_rule_says():
    """A blocked conv wider than one tap with several pixels per register block (stride 1) broadcasts its
    data from memory (FJ_BCAST8) and leaves the tap loop to gcc (at stride 2 only 5x5 / 7x7 kernels); 3x3s at
    stride 2, 1x1 convs and NCHW kernels keep
    the scalar broadcast. Both spellings of FJ_BCAST8 (AVX and the portable fallback) match numpy, at an
    edge-heavy shape (dilation 2, a row narrower than the block's pixels, batch 2, residual)."""
    def src(task, sketch=blocked.SKETCH):
        space = Space(task, sketch, TARGET)
        return space, render(lower(space, space.default()))

    space, code = src(blocked.conv2d_nchwc(1, 16, 7, 7, out_channels=16, kernel=3, padding=1))
    assert "FJ_BCAST8(&data" in code and "#pragma GCC unroll 1\n" not in code
    assert "FJ_BCAST8" not in src(blocked.conv2d_nchwc(1, 16, 12, 12, out_channels=16, kernel=3, stride=2, padding=1))[1]
    stem = blocked.conv2d_nchwc(1, 3, 32, 32, out_channels=16, kernel=7, stride=2, padding=3, plain_data=True)
    assert "FJ_BCAST8(&data" in src(stem)[1]  # 5x5 / 7x7 at stride 2: yes
    assert "FJ_BCAST8" not in src(blocked.conv2d_nchwc(1, 16, 7, 7, out_channels=32, kernel=1))[1]
    plain = conv2d(1, 16, 14, 14, out_channels=32, kernel=3, padding=1)
    assert "FJ_BCAST8" not in src(plain, default_sketch(plain, TARGET).name)[1]
    task = blocked.conv2d_nchwc(2, 16, 9, 5, out_channels=24, kernel=3, padding=2, dilation=2, bias=True, act="relu",
                                residual=True)
    space = Space(task, blocked.SKETCH, TARGET)
    arrays = task.random_inputs(seed=5)
    ref = task.reference(*arrays)
    d = space.default()  # its block: 3 out blocks x 3 rows x 1 pixel; make blocks of 5 pixels along the row
    cfgs = [dataclasses.replace(d, tiles=tuple({"k": (3, 1, 1, 1), "y": y, "x": (1, 1, 1, 5)}.get(a.name, t)
                                               for a, t in zip(space.axes, d.tiles))) for y in ((9, 1, 1, 1), (3, 1, 3, 1))]
    for cfg in cfgs:
        space.validate(cfg)
        assert "FJ_BCAST8(&data" in render(lower(space, cfg))
        plan = lower(space, cfg)
        for prefix in ("", "#define FJ_BCAST8(p) ((vf){0} + *(p))\n"):  # the AVX spelling, the fallback
            b = build(prefix + render(plan))
            assert b.status == "ok", b.error
            y = Kernel(plan, b.lib_path, threads=2)(*arrays)
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.cc
def test_a_prime_output_width_defaults_to_the_padded_blocked_sketch_and_matches_numpy():
    """A blocked conv whose output width is a prime (13, 17) gets a padded variant ``conv_nchwc.pad_x<W+1>``
    (:func:`codegen.blocked.pad_x`), which is its default (a register block of several pixels per row,
    broadcast from memory); widths with a small divisor, stride-2 outputs of 9 and depthwise convs do
    not. The padded default and sampled configs match numpy (batch 2, residual, 5x5 kernel, 2 threads)."""
    from codegen.padding import PAD_SEP

    t17 = blocked.conv2d_nchwc(1, 16, 17, 17, out_channels=16, kernel=3, padding=1)
    assert [s.name for s in sketches_for(t17, TARGET)] == ["conv_nchwc", "conv_nchwc.pad_x18"]
    assert default_sketch(t17, TARGET).name == "conv_nchwc.pad_x18"
    for other in (blocked.conv2d_nchwc(1, 16, 14, 14, out_channels=16, kernel=3, padding=1),
                  blocked.conv2d_nchwc(1, 16, 17, 17, out_channels=16, kernel=3, stride=2, padding=1),
                  blocked.conv2d_nchwc(1, 16, 13, 13, out_channels=16, kernel=3, padding=1, groups=16)):
        assert not any(PAD_SEP in s.name and s.base == blocked.SKETCH for s in sketches_for(other, TARGET))
    task = blocked.conv2d_nchwc(2, 16, 13, 11, out_channels=24, kernel=5, padding=2, bias=True, act="relu6",
                                residual=True)
    sketch = default_sketch(task, TARGET)
    assert sketch.name == "conv_nchwc.pad_x12"
    space = Space(task, sketch, TARGET)
    arrays = task.random_inputs(seed=7)
    ref = task.reference(*arrays)
    for cfg in [space.default()] + space.sample_many(np.random.default_rng(7), 2):
        plan = lower(space, cfg)
        b = build(render(plan))
        assert b.status == "ok", b.error
        y = Kernel(plan, b.lib_path, threads=2)(*arrays)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))
    assert "FJ_BCAST8" in render(lower(space, space.default()))


@pytest.mark.cc
def test_cli_build_chooses_the_layout_by_measuring_both(tmp_path, capsys, monkeypatch):
    """``felixjax build --layout auto``: both layouts (and a per-conv mix of them, where the per-layer
    profiles differ) built with default schedules and timed; it prints the times and the one it keeps,
    then builds and checks the model in it."""
    import felixjax as fj
    from felixjax.cli import main as cli

    monkeypatch.chdir(tmp_path)  # no runs.db here: `build` would read one (what `tune` writes by default)
    path = tmp_path / "m.onnx"
    fj.zoo.save("mobilenet_v2", str(path), dataset="cifar10")
    assert cli(["build", str(path), "--layout", "auto", "--threads", "1", "-o", str(tmp_path / "out")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("layout:"))
    assert "nchw " in line and "nchwc " in line
    # which layout wins is a timing: each outcome's own wording is checked
    kept = line.split("(default schedules): ", 1)[1].strip()
    assert kept in ("nchw", "nchwc") or ("mixed" in line and re.fullmatch(
        r"per conv \(\d+ NCHW: conv\w+(, conv\w+)*; every other conv NCHW8c\)", kept)), line
    from felixjax.network_cli import _describe
    assert _describe({"c2": "nchw", "c1": "nchw", "c3": "nchwc"}) == "per conv (2 NCHW: c1, c2; every other conv NCHW8c)"
    # a model without a blockable convolution: nchw, nothing built to decide
    assert fj.choose_layout(fj.zoo.make_model("transformer_block", seq=8, dim=16, heads=2)) == ("nchw", {})


def test_a_1x1_conv_on_a_7x7_plane_defaults_to_its_flattened_padded_twin():
    """49 pixels allow only 1 block x 7 pixels; over 50 flattened pixels the default is 4 blocks x 2
    pixels, fewer loads per FMA; planes with an even pixel count keep the 2-D sketch. The register
    block is the AVX2 one (8 lanes, 16 registers); 32-register AVX-512 targets get a wider one."""
    t77 = blocked.conv2d_nchwc(1, 160, 7, 7, out_channels=960, kernel=1, bias=True, act="relu6")
    assert [s.name for s in sketches_for(t77, AVX2)] == [blocked.SKETCH, blocked.FLAT_SKETCH,
                                                       "conv_nchwc_flat.pad_x50"]
    assert default_sketch(t77, AVX2).name == "conv_nchwc_flat.pad_x50"
    s3 = {a.name: t[-1] for a, t in zip(Space(t77, "conv_nchwc_flat.pad_x50", AVX2).axes,
                                        Space(t77, "conv_nchwc_flat.pad_x50", AVX2).default().tiles)}
    assert (s3["k"], s3["x"]) == (4, 2)
    assert default_sketch(blocked.conv2d_nchwc(1, 64, 14, 14, out_channels=384, kernel=1), AVX2).name == blocked.SKETCH
    with pytest.raises(ValueError, match="1x1 convs"):
        blocked.flat_twin(blocked.conv2d_nchwc(1, 16, 7, 7, out_channels=16, kernel=3, padding=1))


def test_the_jax_quality_executor_names_what_it_cannot_run_in_a_blocked_graph():
    import felixjax as fj
    from felixjax.approx import executor

    model = fj.load_onnx(fj.zoo.make_model("mobilenet_v2", dataset="cifar10"), layout="nchwc")
    with pytest.raises(ValueError, match="Reblock.*conv2d_nchwc|conv2d_nchwc.*Reblock"):
        executor.check_supported(model.graph)


def _default_tiles(task, target=TARGET):
    """``(space, default config, {axis: tiles})`` of a blocked task's default sketch on ``target``."""
    space = Space(task, default_sketch(task, target), target)
    d = space.default()
    return space, d, {a.name: t for a, t in zip(space.axes, d.tiles)}


def _default_matches_numpy(task, space, d, *, seed: int) -> None:
    arrays = task.random_inputs(seed=seed)
    ref = task.reference(*arrays)
    plan = lower(space, d)
    b = build(render(plan))
    assert b.status == "ok", b.error
    y = Kernel(plan, b.lib_path, threads=2)(*arrays)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.cc
def test_direct_convs_with_large_weights_default_to_tap_chunks_and_match_numpy():
    """Where one register block's weights exceed 24 KB (:func:`blocked.tap_chunk`), the default puts the
    kernel rows and input-channel chunks in R0 (a chunk's weights for one kernel row fit the budget) and
    unrolls 64; small weights, depthwise and plain-data convs keep the whole reduction in R1 (1x1 convs
    have their own chunks, :func:`blocked._pointwise_schedule`). The
    chunked default matches numpy (batch 2, residual, 5x5, 2 threads)."""
    _, d, t = _default_tiles(blocked.conv2d_nchwc(1, 512, 7, 7, out_channels=512, kernel=3, padding=1), AVX2)
    assert t["ry"] == (3, 1) and t["rx"] == (1, 3) and t["c"] == (2, 32) and d.unroll == 64
    assert blocked.tap_chunk({"c": 64, "u": 8, "v": 8, "ry": 3, "rx": 3}, 1) == 32  # 32 x 8 x 3 x 8 x 4 B = 24 KB
    for small in (blocked.conv2d_nchwc(1, 16, 12, 12, out_channels=16, kernel=3, padding=1),  # 9 KB
                  blocked.conv2d_nchwc(1, 256, 14, 14, out_channels=256, kernel=3, padding=1, groups=256),
                  blocked.conv2d_nchwc(1, 3, 32, 32, out_channels=64, kernel=3, padding=1, plain_data=True)):
        _, _, t = _default_tiles(small)
        assert t.get("ry", (1, 1))[0] == 1 and t.get("c", (1, 1))[0] == 1, small.name
    task = blocked.conv2d_nchwc(2, 128, 9, 9, out_channels=24, kernel=5, padding=2, bias=True, act="relu6",
                                residual=True)
    space, d, t = _default_tiles(task)
    assert t["ry"] == (5, 1) and t["c"][0] > 1
    _default_matches_numpy(task, space, d, seed=11)


@pytest.mark.cc
def test_strided_pointwise_convs_default_to_row_major_and_match_numpy():
    """A blocked 1x1 conv at stride 2 on the generic path (:func:`blocked.strided_rows`) runs output rows
    outermost (S0, parallel, with the out blocks in as few groups as give 4 chunks per core) and every
    out block inside (S1), so each row's input is read once; stride 1 and a single output row keep the
    out blocks outermost (the AVX2 defaults). The row-major default matches numpy (batch 2, residual, 2 threads, odd size)."""
    _, d, t = _default_tiles(blocked.conv2d_nchwc(1, 64, 56, 56, out_channels=128, kernel=1, stride=2), AVX2)
    assert t["k"][0] * t["y"][0] >= 4 * AVX2.cores and t["k"][1] > 1 and t["x"][2] > 1
    assert d.parallel == [a for a in ("k", "y")].index("y") + 1
    _, _, t = _default_tiles(blocked.conv2d_nchwc(1, 256, 14, 14, out_channels=512, kernel=1, stride=2), AVX2)
    assert t["y"][0] == 7 and t["k"][0] * 7 >= 4 * AVX2.cores
    for other in (blocked.conv2d_nchwc(1, 64, 2, 2, out_channels=64, kernel=1, stride=2),  # one output row
                  blocked.conv2d_nchwc(1, 64, 14, 14, out_channels=64, kernel=3, stride=2, padding=1)):
        space = Space(other, "conv_nchwc", AVX2)
        t = {a.name: tl for a, tl in zip(space.axes, space.default().tiles)}
        assert t["k"][1] == 1, other.name
    task = blocked.conv2d_nchwc(2, 48, 17, 17, out_channels=32, kernel=1, stride=2, bias=True, act="relu",
                                residual=True)
    space, d, t = _default_tiles(task, AVX2)
    assert t["y"][0] > 1 and t["k"][1] > 1
    _default_matches_numpy(task, space, d, seed=5)
