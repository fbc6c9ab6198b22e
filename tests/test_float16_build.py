"""float16 layers in the C network build (issue 17): ``to_float16`` / ``to_float32`` conversion steps
(F16C, or portable C), float16 kernels with weights converted at load, mixed float16 / float32 networks
against the float16 reference (:func:`felixjax.quantize.fake_quant_run`), the profile, the export.

Tolerances. Against the float16 reference: the built network and the reference round to float16 at the
same points (a float16 layer's data, weights and residual, its output); they differ in how the float32
sums are formed (C: float32 in the kernel's order; the reference: float64), about 1e-6 relative, which
moves a rounding to float16 by one unit in the last place (2**-10 relative) where a value sits next to a
rounding boundary; later layers carry it on. So: atol 2**-8 of the output range (four such units).
Against the float32 network: each rounding to float16 costs up to 2**-11 relative per element (inputs,
weights, outputs of every float16 layer), summed over K-term dot products: atol 2e-2 of the output range.
The observed errors on this network are well inside both (printed by ``-s``).
"""
from __future__ import annotations

import os
import platform
from dataclasses import replace

import numpy as np
import pytest

import felixjax as fj
from codegen import netbuild, ops
from codegen.build import DEFAULT_FLAGS
from codegen.lower import lower
from codegen.space import Space, default_sketch
from felixjax.approx import executor
from felixjax.approx.digits import untrained_model
from felixjax.network_build import graph_to_spec, node_steps
from felixjax.pipeline import build_model
from felixjax.testing import run_standalone
from felixjax.quantize import (BUILD_PRECISIONS, fake_quant_layer, fake_quant_outputs, fake_quant_run, float16_task,
                               precision_of, round_float16, with_precisions)

pytestmark = pytest.mark.cc

REF_TOL = 2.0 ** -8  # x max(1, max |ref|): vs the float16 reference (module docstring)
FP32_TOL = 2e-2  # x max(1, max |ref|): vs the float32 network
F16C = os.path.exists("/proc/cpuinfo") and "f16c" in open("/proc/cpuinfo").read()
needs_f16c = pytest.mark.skipif(not F16C, reason="float16 kernels convert with F16C")


@pytest.fixture(scope="module")
def digits():
    """The digits CNN of tests/test_approx_precision.py: conv1-conv4 (conv4 with a residual add), fc."""
    model, _, x = untrained_model(8, 0, n=8)
    return model, x


@pytest.fixture(scope="module")
def half(digits):
    """conv2, conv4 (residual) and fc (dense) at float16, built for one thread."""
    model, _ = digits
    q = with_precisions(model, {"conv2": "float16", "conv4": "float16", "fc": "float16"})
    return q, build_model(q, fj.Target.cpu(cores=1))


# ---- the conversion steps -------------------------------------------------------------------------

def _special_values() -> np.ndarray:
    """float32 values that exercise float16 rounding: ties between float16 neighbours (normal and
    subnormal), the overflow boundary, subnormals, zeros, infinities, NaN, and random values."""
    rng = np.random.default_rng(1)
    h = rng.integers(0, 0x7bff, 300).astype(np.uint16).view(np.float16)
    nxt = np.nextafter(h, np.float16(np.inf))
    ties = (h.astype(np.float32) + nxt.astype(np.float32)) / 2  # exact in float32
    edge = np.array([0.0, -0.0, 65504, 65519.99, 65520, -65520, 1e6, np.inf, -np.inf, np.nan, 2.0 ** -25,
                     2.0 ** -25 * 1.0000001, 2.0 ** -24, 1.5 * 2.0 ** -24, 6.0e-5, 6.1e-5, 1e-8, -3e-6, 0.1, 1 / 3],
                    np.float32)
    rand = (rng.standard_normal(257) * 10.0 ** rng.integers(-8, 6, 257)).astype(np.float32)
    return np.concatenate([ties, -ties, edge, rand]).astype(np.float32)


def _round_trip(flags: tuple[str, ...], x: np.ndarray) -> np.ndarray:
    n = x.size
    spec = netbuild.NetSpec((netbuild.Value((n,), "input"), netbuild.Value((n,), "temp", dtype="float16"),
                             netbuild.Value((n,), "temp")), (0,), (2,),
                            (netbuild.Step("to_float16", (0,), (1,)), netbuild.Step("to_float32", (1,), (2,))))
    net = netbuild.emit(spec)
    assert net.memory.placement[1][1] == -(-n // 2)  # float16: two per 4-byte slot
    return netbuild.load(net, flags=flags, threads=2)([x])[0]


PORTABLE = (*(f for f in DEFAULT_FLAGS if f != "-march=native"), "-mno-f16c")  # x86-64 baseline: no F16C


@pytest.mark.parametrize("flags", [DEFAULT_FLAGS, pytest.param(PORTABLE, marks=pytest.mark.skipif(
    platform.machine() != "x86_64", reason="-mno-f16c is an x86 flag"))], ids=["native", "portable"])
@pytest.mark.parametrize("n", [5, 901, 40003])  # tail only / vectors + tail / parallel (>= PARALLEL_MIN)
def test_conversion_steps_round_to_nearest_even_as_numpy(flags, n):
    x = np.resize(_special_values(), n)
    y = _round_trip(flags, x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(y), nan)
    assert np.array_equal(y[~nan].view(np.uint32), want[~nan].view(np.uint32))  # bit for bit, signed zeros too


def test_conversion_steps_are_validated():
    bad = netbuild.NetSpec((netbuild.Value((4,), "input"), netbuild.Value((4,), "temp")), (0,), (1,),
                           (netbuild.Step("to_float16", (0,), (1,)),))
    with pytest.raises(netbuild.NetBuildError, match="to_float16 step takes one float32 value to a float16"):
        netbuild.emit(bad)
    out16 = netbuild.NetSpec((netbuild.Value((4,), "input"), netbuild.Value((4,), "temp", dtype="float16")), (0,),
                             (1,), (netbuild.Step("to_float16", (0,), (1,)),))
    with pytest.raises(netbuild.NetBuildError, match="graph inputs and outputs are float32"):
        netbuild.emit(out16)


# ---- float16 layers in a network ----------------------------------------------------------------

def test_with_precisions_accepts_float16_and_rejects_what_cannot_be(digits):
    model, x = digits
    assert BUILD_PRECISIONS == ("float32", "float16", "int8")
    q = with_precisions(model, {"conv1": "float16", "conv3": "float32"})  # no ranges needed for float16
    kinds = {n.name: precision_of(n.task) for n in q.graph.nodes if n.is_anchor}
    assert kinds == {"conv1": "float16", "conv2": "float32", "conv3": "float32", "conv4": "float32", "fc": "float32"}
    assert "quant" not in next(n for n in q.graph.nodes if n.name == "conv1").attrs
    with pytest.raises(ValueError, match="precision 'float64'"):
        with_precisions(model, {"conv1": "float64"})
    with pytest.raises(ValueError, match="not a conv / dense / matmul layer"):
        with_precisions(model, {"relu1": "float16"})
    with pytest.raises(ValueError, match="'conv1' cannot be built at float16: .*only a dense float32 layer"):
        with_precisions(q, {"conv1": "float16"})  # already float16
    sparse_fc = ops.dense(1, 256, 10, bias=True, sparsity=0.5)
    sparse = replace(model, graph=model.graph.replace(nodes=tuple(
        replace(n, attrs={**n.attrs, "task": sparse_fc}) if n.name == "fc" else n for n in model.graph.nodes)))
    with pytest.raises(ValueError, match="'fc' cannot be built at float16"):
        with_precisions(sparse, {"fc": "float16"})
    with pytest.raises(ValueError, match="batched matmul has no constant weights"):
        float16_task(ops.matmul(4, 4, 4, batch=2))
    # int8 callers unchanged: ranges positional, the quant attributes kept
    q8 = with_precisions(model, {"conv2": "int8"}, {"conv2": (0.0, 1.0)})
    assert next(n for n in q8.graph.nodes if n.name == "conv2").attrs["quant"]["zero_point"] == 0


@needs_f16c
def test_float16_layers_match_the_float16_reference_and_the_float32_network(digits, half):
    model, x = digits
    q, exe = half
    assert sorted(s.task.name for s in exe.schedules if s.task.dtype == "float16") == sorted(
        n.task.name for n in q.graph.nodes if n.is_anchor and n.task.dtype == "float16")
    g = q.graph
    worst_ref = worst_fp32 = 0.0
    for xi in x:
        xi = xi.reshape(g.shapes[g.inputs[0]])
        out = exe.run(xi)[0]
        ref = fake_quant_run(g, {g.inputs[0]: xi})[g.outputs[0]]
        fp32 = model.run_numpy(xi)
        scale = max(1.0, float(np.abs(ref).max()))
        worst_ref = max(worst_ref, float(np.abs(out - ref).max()) / scale)
        worst_fp32 = max(worst_fp32, float(np.abs(out - fp32).max()) / scale)
        np.testing.assert_allclose(out, ref, rtol=0, atol=REF_TOL * scale)
        np.testing.assert_allclose(out, fp32, rtol=0, atol=FP32_TOL * scale)
    print(f"float16 network: max |C - float16 reference| {worst_ref:.2e}, |C - float32| {worst_fp32:.2e} "
          "(of the output range)")
    # float16 changes the output: the reference is not just the float32 network
    assert worst_fp32 > 1e-6 and worst_ref < worst_fp32


def test_the_jax_hooks_compute_the_numpy_reference(digits):
    """``executor.run`` with ``fake_quant_layer`` and ``fake_quant_outputs`` (what approximation uses),
    eager and under jit, against :func:`fake_quant_run` (float64 sums: flips of one float16 unit)."""
    import jax

    model, x = digits
    q = with_precisions(model, {"conv2": "float16", "conv4": "float16", "fc": "float16"})
    g, name = q.graph, q.graph.inputs[0]
    xi = x[0].reshape(g.shapes[name])
    ref = fake_quant_run(g, {name: xi})[g.outputs[0]]

    def run(v):
        outs = executor.run(g, {name: v}, anchor_inputs=fake_quant_layer, value_hook=fake_quant_outputs(g))
        return outs[g.outputs[0]]

    scale = max(1.0, float(np.abs(ref).max()))
    for y in (run(xi), jax.jit(run)(xi)):
        np.testing.assert_allclose(np.asarray(y), ref, rtol=0, atol=REF_TOL * scale)
    v = np.float32([0.1, 65520.0, 1 / 3, -2.0 ** -25])
    assert np.array_equal(np.asarray(jax.jit(round_float16)(v)), round_float16(v))


def test_spec_converts_data_and_residual_and_packs_float16_weights_once(digits, half):
    model, _ = digits
    q, exe = half
    target = fj.Target.cpu(cores=1)
    spaces = {t: Space(t, default_sketch(t, target), target) for t, _ in q.tasks}
    plans = {t: lower(sp, sp.default()) for t, sp in spaces.items()}
    spec = graph_to_spec(q.graph, plans)
    assert len(spec.steps) == sum(node_steps(n) for n in q.graph.nodes) == exe.net.steps
    labels = [s.label for s in spec.steps]
    i = labels.index("conv4")
    assert labels[i - 2: i + 2] == ["conv4/data_to_float16", "conv4/residual_to_float16", "conv4", "conv4/to_float32"]
    assert labels[labels.index("conv2") - 1] == "conv2/data_to_float16"
    k4 = spec.steps[i]
    # the kernel reads float16 data and residual, the float32 bias as is, writes float16
    assert [spec.values[v].dtype for v in k4.inputs] == ["float16", "float32", "float32", "float16"]
    assert spec.values[k4.outputs[0]].dtype == "float16"
    # activations between layers stay float32: every graph value is float32
    assert all(spec.values[v].dtype == "float32" for s in spec.steps if s.op not in ("kernel", *netbuild.CONVERSIONS)
               for v in s.inputs + s.outputs if v is not None)
    # the weights: converted to float16 and packed once, in the blob (nothing converts them at run time)
    net = netbuild.emit(spec)
    off = net.memory.packed[(k4.inputs[1], i)]
    w4 = np.asarray(spec.values[k4.inputs[1]].data).reshape(k4.plan.space.task.input_shapes()[1])
    packed = k4.plan.pack_weight(w4)
    assert packed.dtype == np.float16
    assert np.array_equal(net.weights.view(np.uint8)[4 * off: 4 * off + packed.nbytes], packed.view(np.uint8))
    f16_weights = {v for (v, s) in net.memory.packed if spec.steps[s].plan.space.task.dtype == "float16"}
    assert len(f16_weights) == 3 and "_mm256_cvtps_ph" in net.source and "fj_f32_to_f16" in net.source


@needs_f16c
def test_profile_counts_the_conversion_steps_in_the_layer(digits, half):
    _, x = digits
    q, exe = half
    rows = exe.profile(number=2)
    assert [r["name"] for r in rows] == [n.name for n in q.graph.nodes] and all(r["ms"] >= 0 for r in rows)
    # with known per-step times: a float16 layer's row is the sum of its conversion steps and its kernel
    steps = exe.net.steps
    fake = np.arange(1, steps + 1, dtype=np.float64)
    real = exe.library.profile
    exe.library.profile = lambda ins, number=1: fake
    try:
        rows = {r["name"]: r["ms"] for r in exe.profile(number=1)}
    finally:
        exe.library.profile = real
    start = 0
    for n in q.graph.nodes:
        k = node_steps(n)
        assert rows[n.name] == pytest.approx(1e3 * fake[start: start + k].sum())
        start += k
    assert start == steps and node_steps(next(n for n in q.graph.nodes if n.name == "conv4")) == 4


@needs_f16c
def test_export_with_float16_layers_builds_with_make_and_matches(digits, half, tmp_path):
    _, x = digits
    _, exe = half
    out = exe.export(tmp_path / "build")
    xi = np.ascontiguousarray(x[0].reshape(exe.net.input_shapes[0]))
    y, _ = run_standalone(out, xi, runs=2)
    np.testing.assert_array_equal(y.reshape(exe.net.output_shapes[0]), exe(xi))


@needs_f16c
def test_conversion_steps_inlined_at_O3_do_not_read_stale_float16_bits():
    """Session 76: the conversion steps stored float16 as ``unsigned short`` and the kernels as ``_Float16``;
    gcc -O3, inlining the steps into one function, let a scalar tail read bytes before the kernel's writes
    (strict aliasing): this network's softmax came out [0, ..., 1.0] against numpy's [0.978, 0.0175, ...].
    Its schedules are a reviewer's random draws (tests/data/fp16_alias_cnn_configs.json; on a host where one
    is not valid, the default stands in)."""
    import json
    from pathlib import Path

    from codegen.space import Config
    from codegen.spaces import spaces_for

    data = Path(__file__).parent / "data"
    model = fj.load_onnx(data / "fp16_alias_cnn.onnx")
    model = with_precisions(model, {n.name: "float16" for n in model.graph.nodes if n.is_anchor})
    stored, target, cfgs = json.loads((data / "fp16_alias_cnn_configs.json").read_text()), fj.Target.cpu(), {}
    for task, _ in model.tasks:
        cfg = Config.from_json(stored[task.name])
        space = spaces_for(task, target).get(cfg.sketch)
        if space is not None and space.is_valid(cfg):
            cfgs[task] = cfg
    exe = build_model(model, target, configs=cfgs, db=None)
    x = np.random.default_rng(4).standard_normal((1, 3, 13, 11)).astype(np.float32)
    y, ref = exe(x).ravel(), model.run_numpy(x).ravel()
    assert np.abs(y - ref).max() < 1e-2, (y.round(4), ref.round(4))


def test_check_compares_a_build_with_the_numpy_reference(half, monkeypatch):
    """``exe.check()`` (what ``felixjax build`` runs before exporting): the largest relative error, or an
    error naming the output past ``rtol`` (session 76: a Python build was never compared)."""
    _, exe = half
    err = exe.check(rtol=REF_TOL)
    assert 0.0 <= err <= REF_TOL
    x = [np.full(s, np.nan, np.float32) for s in exe.net.input_shapes]
    assert exe.check(x) == 0.0  # NaN in, NaN out on both sides: agreed
    run = exe.run
    monkeypatch.setattr(exe, "run", lambda ins: [y + 0.5 * np.abs(y).max() for y in run(ins)])
    with pytest.raises(RuntimeError, match=r"output 0 \(.*\) of the build differs from the numpy reference"):
        exe.check()


def test_check_holds_where_float16_rounding_of_the_outputs_cancels():
    """``Model.run_numpy`` of a model with float16 layers is ``fake_quant_run``: the layers' outputs rounded to
    float16 as the kernels store them (session 82, a review: ``run_numpy`` rounded only their inputs, and
    ``check()`` refused a correct build of two nearly equal float16 layers and their difference, 0.7 of its
    largest value)."""
    from onnx import TensorProto, helper, numpy_helper

    w = (0.3 * np.random.default_rng(0).standard_normal((16, 16))).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "wa"], ["a"], transB=1),
             helper.make_node("Gemm", ["x", "wb"], ["b"], transB=1), helper.make_node("Sub", ["a", "b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                          [numpy_helper.from_array(w, "wa"), numpy_helper.from_array(w * np.float32(1.001), "wb")])
    model = fj.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    q = with_precisions(model, {n.name: "float16" for n in model.graph.nodes if n.is_anchor})
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    ref = fake_quant_run(q.graph, {"x": x})["y"]
    np.testing.assert_array_equal(q.run_numpy(x), ref)
    exe = build_model(q, fj.Target.cpu(cores=1))
    assert exe.check(x, rtol=REF_TOL) <= REF_TOL
