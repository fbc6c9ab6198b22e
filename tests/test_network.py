"""Whole networks: the C build of every zoo model against onnxruntime, the standalone export built with
make, every cheap op's generated C against its numpy semantics, the static memory plan, the task
scheduler, a tiny tuning run feeding the build, the CLI's errors, and the ONNX node tests through C."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
import math
import platform
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import felixjax as fj
from codegen import netbuild
from codegen.ops import conv2d, matmul
from felixjax import cli, graph_passes, zoo
from felixjax.testing import ReplayRunner, run_standalone
from felixjax.database import Database, TuningRecord
from codegen.measure import MeasureResult
from codegen.space import default_sketch
from felixjax.errors import UnsupportedModelError
from felixjax.graph_passes import Graph, Node, evaluate
from felixjax.network import (CompiledModel, TaskScheduler, build_model, graph_to_spec, similarity_tag,
                              tune_model)
from felixjax.onnx_import import load_onnx

import onnx_cases

pytestmark = pytest.mark.cc


def _ort(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _close(y: np.ndarray, ref: np.ndarray, rtol: float = 1e-4) -> None:
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=rtol * float(np.abs(ref).max()))


def _no_python_fallback(monkeypatch) -> None:
    """Make every numpy execution path raise: what runs afterwards must be the compiled library."""
    def boom(*a, **k):
        raise AssertionError("a numpy fallback ran")

    monkeypatch.setattr(graph_passes, "evaluate", boom)
    monkeypatch.setattr(graph_passes, "run_graph", boom)
    monkeypatch.setattr(fj.Task, "reference", boom)


# ---- zoo models: the compiled build against onnxruntime --------------------------------------------

@pytest.mark.parametrize("name", zoo.MODELS)
def test_zoo_model_build_matches_onnxruntime(name, monkeypatch):
    proto = zoo.make_model(name, dataset="cifar10", seed=0)
    model = load_onnx(proto)
    exe = build_model(model, threads=2)
    assert isinstance(exe, CompiledModel) and exe.library.lib_path.endswith(".so")
    assert exe.net.kernels == len(model.tasks)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(model.input_shapes[model.input_names[0]]).astype(np.float32)
    ref = _ort(proto, {model.input_names[0]: x})[0]
    _no_python_fallback(monkeypatch)
    y = exe(x)
    _close(y, ref)
    _close(exe({model.input_names[0]: x}), ref)  # dict input, and a second run over the same arena


@pytest.mark.slow  # ResNet-18 at 224: ~16 kernels to compile (cached afterwards), 1.8 GFLOP per run
def test_resnet18_imagenet_build_matches_onnxruntime(monkeypatch):
    proto = zoo.make_model("resnet18", dataset="imagenet", seed=0)
    model = load_onnx(proto)
    exe = build_model(model)
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = _ort(proto, {"input": x})[0]
    _no_python_fallback(monkeypatch)
    _close(exe(x), ref)
    assert exe.net.arena_bytes < 16 * 2**20  # liveness reuse: far below the sum of all activations


def test_build_checks_inputs():
    model = load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    exe = build_model(model)
    with pytest.raises(ValueError, match="expects"):
        exe(np.zeros((1, 8, 15), np.float32))
    with pytest.raises(ValueError, match="unknown inputs"):
        exe({"y": np.zeros((1, 8, 16), np.float32)})
    # session 75 (a user's fuzzing): two arrays for a one-input model were read as one ragged array ("setting an
    # array element with a sequence"); a float dimension was truncated
    x = np.zeros((1, 8, 16), np.float32)
    for call in (lambda: exe(x, x[0]), lambda: exe.run([x, x[0]])):
        with pytest.raises(ValueError, match=r"the model takes 1 inputs \['x'\], got 2"):
            call()
    with pytest.raises(UnsupportedModelError, match=r"input_shapes\['x'\] = \(1.5, 8, 16\): dimensions are whole"):
        load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2), input_shapes={"x": (1.5, 8, 16)})


def test_a_model_without_runtime_inputs_runs_without_arguments():
    # session 75 (a user's fuzzing): exe() and run_numpy() needed an empty list
    from onnx import TensorProto

    g = helper.make_graph([helper.make_node("Relu", ["c"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [onnx.numpy_helper.from_array(np.array([-1.0, 2.0], np.float32), "c")])
    model = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    np.testing.assert_array_equal(model.run_numpy(), [0.0, 2.0])
    np.testing.assert_array_equal(build_model(model)(), [0.0, 2.0])


# ---- standalone export ---------------------------------------------------------------------------

def test_export_builds_with_make_and_matches(tmp_path):
    proto = zoo.make_model("transformer_block", seq=16, dim=32, heads=2)
    model = load_onnx(proto)
    exe = build_model(model)
    out = exe.export(tmp_path / "build")
    assert sorted(p.name for p in out.iterdir()) == ["Makefile", "README.txt", "main.c", "model.c", "model.h",
                                                     "weights.bin"]
    x = np.random.default_rng(3).standard_normal((1, 16, 32)).astype(np.float32)
    y, stdout = run_standalone(out, x, runs=3)
    assert "ms per run" in stdout
    y = y.reshape(1, 16, 32)
    _close(y, _ort(proto, {"x": x})[0])
    np.testing.assert_array_equal(y, exe(x))
    # a wrong-sized weights file is refused, not read past its end
    (out / "short.bin").write_bytes(b"\0" * 16)
    r = subprocess.run(["./demo", "short.bin", "inputs.bin", "o.bin"], cwd=out, capture_output=True, text=True)
    assert r.returncode != 0 and "expected exactly" in r.stderr


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 -march levels")
def test_a_float32_export_builds_for_any_x86_64(tmp_path):
    # session 75: generated for AVX-512, model.c did not compile with -march=x86-64-v3 or lower ("impossible
    # constraint in asm": the register pin of a 64-byte vector); the pin is a no-op without the registers now
    proto = zoo.make_model("transformer_block", seq=16, dim=32, heads=2)
    model = load_onnx(proto)
    exe = build_model(model, fj.Target.cpu(simd_lanes=16, vector_registers=32, avx512_vnni=False))
    out = exe.export(tmp_path / "portable")
    assert "FJ_PIN16(" in (out / "model.c").read_text()  # a pinned 16-lane register block: what failed
    assert "float32 only: it compiles for any -march" in (out / "README.txt").read_text()
    x = np.random.default_rng(4).standard_normal((1, 16, 32)).astype(np.float32)
    y, _ = run_standalone(out, x, cflags="-O2 -march=x86-64")
    np.testing.assert_allclose(y.reshape(1, 16, 32), exe(x), rtol=1e-5, atol=1e-5)


def test_export_builds_without_openmp_and_refuses_another_builds_weights(tmp_path):
    # session 74 (a user's review): the README said "OpenMP optional", but Winograd kernels called omp_* functions
    # unguarded and a build without -fopenmp did not link; and a weights.bin of another export with the same size
    # (layouts follow each build's schedules) ran and computed wrong numbers
    from test_network_select import _two_convs

    proto = _two_convs()
    model = load_onnx(proto)
    exe = build_model(model)
    assert any("winograd" in s.config.sketch for s in exe.schedules)
    out = exe.export(tmp_path / "single")
    x = np.random.default_rng(5).standard_normal((1, 16, 8, 8)).astype(np.float32)
    y, _ = run_standalone(out, x, cflags="-O3 -march=native")  # no -fopenmp
    _close(y.reshape(1, 16, 8, 8), _ort(proto, {"x": x})[0])
    text = (out / "README.txt").read_text()
    assert "Generated for cpu" in text and "only with this model.c" in text and "OMP_NUM_THREADS" in text
    header = (out / "model.h").read_text()
    assert "FJ_MODEL_STEPS" in header and ' *   input 0 "x": ' in header and ' *   output 0 "y": ' in header
    w = np.fromfile(out / "weights.bin", dtype="<f4")
    w[len(w) // 2] += 1.0  # one weight of another build
    w.tofile(out / "other.bin")
    r = subprocess.run(["./demo", "other.bin", "inputs.bin", "o.bin"], cwd=out, capture_output=True, text=True,
                       check=False)
    assert r.returncode == 1 and "not the weights.bin written with this model.c" in r.stderr


# ---- cheap ops: generated C against the numpy semantics ------------------------------------------------

def _graph(nodes: list[Node], inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
           outputs: tuple[str, ...] | None = None) -> Graph:
    """A graph with every shape filled in by evaluating its nodes in numpy."""
    consts = {k: np.asarray(v, np.float32) for k, v in (consts or {}).items()}
    env = {**inputs, **consts}
    for n in nodes:
        out_shapes = None
        if n.op in ("MaxPool", "AveragePool"):  # the output size is the importer's business: compute it here
            a, (nb, c, h, w) = n.attrs, env[n.inputs[0]].shape
            rnd = math.ceil if a["ceil_mode"] else math.floor
            hw = [rnd((size + a["pads"][d] + a["pads"][d + 2] - (a["kernel"][d] - 1) * a["dilations"][d] - 1)
                      / a["strides"][d]) + 1 for d, size in enumerate((h, w))]
            out_shapes = [(nb, c, *hw)]
        outs = evaluate(n, [env[i] if i else None for i in n.inputs], out_shapes)
        env.update((o, v) for o, v in zip(n.outputs, outs) if o)
    outputs = outputs or tuple(o for o in nodes[-1].outputs if o)
    return Graph(tuple(nodes), tuple(inputs), outputs, {k: np.shape(v) for k, v in env.items()}, consts)


def _check_c(graph: Graph, feeds: dict[str, np.ndarray], rtol: float = 1e-5) -> None:
    ref = graph_passes.run_graph(graph, feeds)
    lib = netbuild.load(netbuild.emit(graph_to_spec(graph, {})), threads=2)
    got = lib([feeds[n] for n in graph.inputs])
    for name, y in zip(graph.outputs, got):
        r = ref[name]
        assert y.shape == r.shape, name
        finite = np.abs(r[np.isfinite(r)])
        np.testing.assert_allclose(y, r, rtol=rtol, atol=rtol * max(float(finite.max(initial=0.0)), 1e-30))


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


POOL = {"kernel": (3, 3), "strides": (2, 2), "dilations": (1, 1), "pads": (1, 0, 2, 1), "ceil_mode": 1}
CONV = {"kernel": (3, 2), "strides": (2, 1), "dilations": (1, 2), "pads": (1, 0, 2, 1), "groups": 2}

CHEAP_CASES = {
    "add_broadcast": ([Node("Add", ("a", "b"), ("y",))], {"a": _rand(2, 3, 4, 5), "b": _rand(3, 1, 5, seed=1)}, {}),
    "sub_scalar_const": ([Node("Sub", ("a", "c"), ("y",))], {"a": _rand(4, 33)}, {"c": np.float32(0.5)}),
    "mul_both_broadcast": ([Node("Mul", ("a", "b"), ("y",))], {"a": _rand(4, 1, 6), "b": _rand(5, 1, seed=1)}, {}),
    "div": ([Node("Div", ("a", "b"), ("y",))], {"a": _rand(3, 70000)}, {"b": np.full((70000,), 3.0, np.float32)}),
    "pow_square_and_general": ([Node("Pow", ("a", "two"), ("p",)), Node("Sqrt", ("p",), ("s",)),
                                Node("Pow", ("s", "e"), ("y",))],
        {"a": _rand(5, 7)}, {"two": np.float32(2.0), "e": np.float32(1.5)}),
    "unary_chain": ([Node("Sigmoid", ("a",), ("s",)), Node("Tanh", ("s",), ("t",)), Node("Erf", ("t",), ("e",)),
                     Node("Relu", ("a",), ("r",)), Node("Add", ("e", "r"), ("y",))], {"a": 4 * _rand(3, 50)}, {}),
    "clip_lower_only": ([Node("Clip", ("a", "lo", ""), ("y",))], {"a": _rand(2, 9)}, {"lo": np.float32(-0.25)}),
    "clip_runtime_bounds": ([Node("Clip", ("a", "lo", "hi"), ("y",))],
                            {"a": _rand(2, 9), "lo": np.float32(-0.5), "hi": np.float32(0.3)}, {}),
    "scale_shift": ([Node("ScaleShift", ("a", "s", "t"), ("y",))], {"a": _rand(2, 3, 4, 5)},
                    {"s": _rand(3, seed=1), "t": _rand(3, seed=2)}),
    "batchnorm_runtime_stats": ([Node("BatchNormalization", ("a", "s", "b", "m", "v"), ("y",), {"epsilon": 1e-3})],
                                {"a": _rand(2, 3, 4), "s": _rand(3, seed=1), "b": _rand(3, seed=2),
                                 "m": _rand(3, seed=3), "v": np.abs(_rand(3, seed=4))}, {}),
    "layernorm_axis1_stats": ([Node("LayerNormalization", ("a", "g", "b"), ("y", "mean", "inv"),
                                    {"axis": 1, "epsilon": 1e-5})],
                              {"a": _rand(3, 4, 5)}, {"g": _rand(4, 5, seed=1), "b": _rand(5, seed=2)}),
    "layernorm_no_bias": ([Node("LayerNormalization", ("a", "g"), ("y",), {"axis": 2, "epsilon": 1e-5})],
                          {"a": _rand(2, 3, 8)}, {"g": _rand(8, seed=1)}),
    "reduce_mean_middle": ([Node("ReduceMean", ("a",), ("y",), {"axes": (1, 3), "keepdims": 0})],
                           {"a": _rand(2, 3, 4, 5)}, {}),
    "reduce_mean_global_pool": ([Node("ReduceMean", ("a",), ("y",), {"axes": (2, 3), "keepdims": 1})],
                                {"a": _rand(1, 8, 6, 6)}, {}),
    "maxpool_ceil_asym_pads": ([Node("MaxPool", ("a",), ("y",), POOL)], {"a": _rand(1, 2, 7, 8)}, {}),
    # the row-wise MaxPool: dilation and stride 3, pads wider than some taps reach (empty windows: -inf),
    # NaN inputs (propagated), a ResNet stem's pool big enough to run in parallel
    "maxpool_dilated_stride3_wide_pads": ([Node("MaxPool", ("a",), ("y",), {
        "kernel": (2, 3), "strides": (3, 3), "dilations": (2, 2), "pads": (3, 4, 3, 4), "ceil_mode": 0})],
        {"a": _rand(1, 3, 10, 11)}, {}),
    "maxpool_nan": ([Node("MaxPool", ("a",), ("y",), POOL)],
                    {"a": np.where(_rand(1, 2, 7, 8, seed=5) > 1.2, np.float32("nan"), _rand(1, 2, 7, 8))}, {}),
    "maxpool_resnet_stem": ([Node("MaxPool", ("a",), ("y",), {
        "kernel": (3, 3), "strides": (2, 2), "dilations": (1, 1), "pads": (1, 1, 1, 1), "ceil_mode": 0})],
        {"a": _rand(1, 16, 56, 56)}, {}),
    "avgpool_count_pad": ([Node("AveragePool", ("a",), ("y",), {**POOL, "count_include_pad": 1})],
                          {"a": _rand(1, 2, 7, 8)}, {}),
    "avgpool_exclude_pad_dilated": ([Node("AveragePool", ("a",), ("y",), {**POOL, "dilations": (2, 1), "ceil_mode": 0,
                                                                          "count_include_pad": 0})],
                                    {"a": _rand(2, 3, 9, 8)}, {}),
    "softmax_middle_axis": ([Node("Softmax", ("a",), ("y",), {"axes": (1,)})], {"a": _rand(2, 5, 3)}, {}),
    "softmax_trailing_axes": ([Node("Softmax", ("a",), ("y",), {"axes": (1, 2)})], {"a": _rand(2, 5, 3)}, {}),
    "transpose": ([Node("Transpose", ("a",), ("y",), {"perm": (0, 2, 3, 1)})], {"a": _rand(2, 3, 4, 5)}, {}),
    "concat_with_const": ([Node("Concat", ("a", "c", "a"), ("y",), {"axis": 1})], {"a": _rand(2, 3, 4)},
                          {"c": _rand(2, 1, 4, seed=1)}),
    "pad_negative_and_value": ([Node("Pad", ("a", "v"), ("y",), {"pads": ((0, 0), (1, -1), (-2, 3))})],
                               {"a": _rand(2, 4, 5)}, {"v": np.float32(1.5)}),
    "reshape_copy_and_alias": ([Node("Reshape", ("a",), ("r",), {"shape": (6, 4)}), Node("Relu", ("r",), ("q",)),
                                Node("Reshape", ("q",), ("y",), {"shape": (2, 12)})], {"a": _rand(2, 3, 4)}, {}),
    "conv_generic_groups": ([Node("Conv", ("a", "w", "b"), ("y",), CONV)],
                            {"a": _rand(2, 4, 7, 6), "w": _rand(6, 2, 3, 2, seed=1), "b": _rand(6, seed=2)}, {}),
    "gemm_trans_with_c": ([Node("Gemm", ("a", "b", "c"), ("y",),
                                {"alpha": 0.5, "beta": 2.0, "trans_a": 1, "trans_b": 1})],
                          {"a": _rand(4, 3), "b": _rand(5, 4, seed=1)}, {"c": _rand(3, 1, seed=2)}),
    "gemm_runtime_weights": ([Node("Gemm", ("a", "b"), ("y",), {"alpha": 1.0, "beta": 1.0, "trans_a": 0,
                                                                 "trans_b": 0})],
                             {"a": _rand(3, 4), "b": _rand(4, 6, seed=1)}, {}),
    "matmul_broadcast_batch": ([Node("MatMul", ("a", "b"), ("y",))],
                               {"a": _rand(2, 1, 3, 4), "b": _rand(5, 4, 6, seed=1)}, {}),
    "matmul_vector_operands": ([Node("MatMul", ("a", "b"), ("t",)), Node("MatMul", ("t", "v"), ("y",))],
                               {"a": _rand(4,), "b": _rand(3, 4, 5, seed=1), "v": _rand(5, seed=2)}, {}),
    # rows longer than one register chunk (ROW_IN_REGISTERS = 64): two full chunks and a remainder of 22;
    # the transposed Gemm reads B with a stride per output column
    "matmul_long_rows_chunked": ([Node("MatMul", ("a", "b"), ("y",))],
                                 {"a": _rand(2, 3, 9), "b": _rand(2, 9, 150, seed=1)}, {}),
    "gemm_trans_b_long_rows": ([Node("Gemm", ("a", "b"), ("y",), {"alpha": 1.0, "beta": 1.0, "trans_a": 0,
                                                                   "trans_b": 1})],
                               {"a": _rand(3, 5), "b": _rand(128, 5, seed=1)}, {}),
}


@pytest.mark.parametrize("case", CHEAP_CASES)
def test_cheap_op_c_matches_numpy(case):
    nodes, feeds, consts = CHEAP_CASES[case]
    outputs = ("y", "mean", "inv") if case == "layernorm_axis1_stats" else None
    _check_c(_graph(nodes, feeds, consts, outputs), feeds)


def test_outputs_that_are_inputs_constants_or_repeated():
    feeds = {"a": _rand(3, 4)}
    g = _graph([Node("Relu", ("a",), ("y",))], feeds, {"c": _rand(2, seed=1)})
    g = g.replace(outputs=("y", "a", "c", "y"))
    spec = graph_to_spec(g, {})
    net = netbuild.emit(spec)
    got = netbuild.load(net)([feeds["a"]])
    np.testing.assert_array_equal(got[0], np.maximum(feeds["a"], 0))
    np.testing.assert_array_equal(got[1], feeds["a"])
    np.testing.assert_array_equal(got[2], g.constants["c"])
    np.testing.assert_array_equal(got[3], got[0])


def test_unknown_op_is_a_clear_error():
    g = _graph([Node("Relu", ("a",), ("y",))], {"a": _rand(2)})
    g = g.replace(nodes=(Node("Hardmax", ("a",), ("y",), name="sp7"),))  # (Softplus has a C kernel now)
    with pytest.raises(UnsupportedModelError, match=r"node 'sp7' \(op Hardmax\)"):
        graph_to_spec(g, {})
    spec = netbuild.NetSpec((netbuild.Value((2,), "input"), netbuild.Value((2,), "temp")), (0,), (1,),
                            (netbuild.Step("Hardmax", (0,), (1,)),))
    with pytest.raises(netbuild.NetBuildError, match="Hardmax"):
        netbuild.emit(spec)


def test_generated_c_holds_no_model_names():
    """Node and value names of the model never reach the source (only generated identifiers)."""
    evil = '*/ #include "/etc/passwd" /*'
    feeds = {evil: _rand(2, 3)}
    g = _graph([Node("Relu", (evil,), ("y" + evil,), name=evil)], feeds)
    net = netbuild.emit(graph_to_spec(g, {}))
    assert "passwd" not in net.source and "passwd" not in net.header


# ---- static memory plan ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "transformer_block"])
def test_memory_plan_never_overlaps_live_values(name):
    model = load_onnx(zoo.make_model(name))
    target = fj.Target.cpu()
    from felixjax.network import choose_schedules
    from codegen.lower import lower

    plans = {s.task: lower(fj.Space(s.task, s.config.sketch, target), s.config)
             for s in choose_schedules(model, target)}
    spec = graph_to_spec(model.graph, plans)
    mem = netbuild.plan_memory(spec)
    items = list(mem.placement)
    for i, a in enumerate(items):
        (fa, la), (oa, sa) = mem.lifetimes[a], mem.placement[a]
        assert oa % netbuild.ALIGN == 0
        for b in items[i + 1:]:
            (fb, lb), (ob, sb) = mem.lifetimes[b], mem.placement[b]
            if fa <= lb and fb <= la:  # alive at the same time: disjoint memory
                assert oa + sa <= ob or ob + sb <= oa, (a, b)
    for s, step in enumerate(spec.steps):  # a step's outputs never share memory with its inputs
        ins = {mem.root(i) for i in step.inputs if i is not None and spec.values[i].kind == "temp"}
        for o in step.outputs:
            if o is not None and step.op != "Reshape":
                assert mem.root(o) not in ins
    total = sum(v.size for v in spec.values if v.kind == "temp")
    assert mem.arena_floats < total  # buffers are reused


# ---- task scheduler ------------------------------------------------------------------------------

def test_scheduler_warms_up_round_robin_then_follows_the_gradient():
    tasks = [matmul(64, 64, 64), matmul(512, 512, 512), conv2d(1, 16, 8, 8, out_channels=16)]
    s = TaskScheduler(tasks, [1, 1, 4])
    order = []
    for _ in range(3):
        i = s.next_task()
        order.append(i)
        s.record(i, (1e-5, 1e-3, 1e-4)[i], 8)
    assert order == [1, 2, 0]  # the warm-up: largest weight x FLOPs first (session 76; Ansor: model order)
    # f = 1e-5 + 1e-3 + 4e-4; forward gain of one more round is g/t: task 1 (1e-3) beats 4 x 1e-4 and 1e-5
    assert s.next_task() == 1
    g = s.gradients()
    assert all(v <= 0 for v in g) and g[1] == min(g)
    # after a round that added nothing, a task is dead and never chosen again
    s.record(1, 1e-3, 0)
    assert 1 in s.dead and s.next_task() == 2
    # a task without any correct kernel gets a few rounds, not the whole budget
    s = TaskScheduler(tasks, [1, 1, 1])
    for i, lat in enumerate((None, 1e-3, 1e-4)):
        s.record(i, lat, 8)
    assert s.next_task() == 0
    s.record(0, None, 8)
    s.record(0, None, 8)
    assert 0 in s.dead and s.next_task() == 1
    # counted in trials too: three 1-trial rounds without a kernel are not enough to give up (session 76)
    s = TaskScheduler(tasks, [1, 1, 1])
    for _ in range(3):
        s.record(0, None, 1)
    assert 0 not in s.dead
    s.record(0, None, 5)
    assert 0 in s.dead


def test_a_provisional_price_is_replaced_by_the_first_timing():
    # session 76: a noisy-only task's price is a bound; its first correct timing must replace it, not min() it
    s = TaskScheduler([matmul(64, 64, 64), matmul(128, 128, 128)], [1, 1])
    s.record(0, 1e-7, 4, provisional=True)
    s.record(0, 1e-4, 4)
    assert s.best[0] == 1e-4 and not s.provisional[0]
    s.record(0, 2e-4, 4)  # timings: the best so far stays
    assert s.best[0] == 1e-4


def test_the_backward_window_skips_rounds_before_the_first_kernel():
    # session 76 (a review): Ansor's backward term counts the 1e10 "no kernel yet" of the window's start, so a
    # task that found its first kernel three rounds ago drew every round over a task 100x slower
    fast, slow = matmul(64, 64, 64), matmul(512, 512, 512)
    s = TaskScheduler([fast, slow], [1, 1])
    for lat in (None, None, 1e-5, 1e-5):
        s.record(0, lat, 8)
    for _ in range(4):
        s.record(1, 1e-3, 8)
    g = s.gradients()
    assert abs(g[0]) < 1e-5 and s.next_task() == 1


def test_scheduler_backward_window_and_similarity_groups():
    a, b = matmul(256, 256, 256), matmul(256, 256, 255)
    assert similarity_tag(a) == similarity_tag(b)
    s = TaskScheduler([a, b], [1, 1])
    # equally fast now, same rounds: the one still improving (backward gradient) gets the next round
    for lat in (2e-3, 1.6e-3, 1.3e-3, 1e-3):
        s.record(0, lat, 4)
    for _ in range(4):
        s.record(1, 1e-3, 4)
    assert s.history[0] == [2e-3, 1.6e-3, 1.3e-3, 1e-3] and s.next_task() == 0
    # a slower task has more to gain (forward gradient g / t) even when it stalled
    s.record(0, 2e-4, 4)
    assert s.next_task() == 1
    # b stays > beta times slower than its peer after 5+ more rounds: it leaves the group
    for _ in range(6):
        s.record(1, 1e-3, 4)
    assert s.tags[1] is not None  # 10 rounds against 5: not yet "many more"
    s.record(1, 1e-3, 4)
    assert s.tags[1] is None and s.groups[similarity_tag(a)] == [0]
    with pytest.raises(ValueError):
        TaskScheduler([a], [1, 2])


def test_a_task_timed_only_on_a_busy_machine_stays_in_the_schedule(tmp_path, capsys):
    # session 73: three rounds of `noisy` records (correct kernels, every timing disturbed) dropped a task as
    # "no correct kernel" for the rest of the run and after resuming; its timings are upper bounds, so it stays
    # in, priced at them (not as an infinitely slow task that would take every round)
    from codegen.measure import MeasureResult
    from felixjax.testing import ReplayRunner, SyntheticOracle

    model = load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    victim = model.tasks[0][0].key

    def measurer(task, target):
        oracle = SyntheticOracle(task)

        def timing(cfg):
            t = oracle(cfg)  # seconds
            return MeasureResult("noisy", (2 * t, 3 * t)) if task.key == victim else t
        return ReplayRunner(timing)

    res = fj.tune_model(model, trials=48, strategy="random", db=str(tmp_path / "n.db"), progress=False,
                        measurer=measurer, retime=0, in_network=0)
    by_key = {t.task.key: t for t in res.tasks}
    assert by_key[victim].stop_reason != "no_correct_kernel" and by_key[victim].rounds > 3
    assert by_key[victim].trials <= 36  # nor, priced as infinitely slow, nearly every round (39 of 48)
    from felixjax.network_tune import _round_progress, round_best

    assert round_best([]) is None
    # session 75 (a user's review): its progress line said "no correct kernel yet"
    entry = next(r for r in res.rounds if r["task"].key == victim)
    assert entry["best"] is None and entry["noisy_bound_s"] > 0
    _round_progress(entry)
    assert "correct kernels timed only on a busy machine (noisy): best <= " in capsys.readouterr().err


def test_tune_model_reports_inside_a_long_round(tmp_path, capsys, monkeypatch):
    # session 79 (session 78's list): tune_model printed one line per round and nothing inside it, so a
    # round of 64 slow trials was minutes of silence; a callable progress= still gets round dicts only
    from felixjax import network_tune
    from felixjax.testing import SyntheticOracle

    clock = [0.0]  # time.monotonic as the printer sees it: 4 s a measurement
    monkeypatch.setattr(network_tune, "_clock", lambda: clock[0])

    def measurer(task, target):
        oracle = SyntheticOracle(task)

        def timing(cfg):
            clock[0] += 4.0
            return oracle(cfg)
        return ReplayRunner(timing)

    model = load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    n = len(model.tasks)
    res = fj.tune_model(model, trials=8 * n, trials_per_round=8, strategy="random", db=str(tmp_path / "p.db"),
                        measurer=measurer, retime=2, in_network=0)
    err = capsys.readouterr().err
    inside = [ln for ln in err.splitlines() if "measured in this round" in ln]
    # 8 measurements of 4 s a round: a line from the 3rd on (10 s into the round), then every 3rd (>= 10 s apart)
    assert len(inside) == 2 * n and all(ln.startswith("[felixjax]   task ") for ln in inside), err
    assert {ln.split(": ")[1].split(" measured")[0] for ln in inside} == {"3/8", "6/8"}
    assert err.count("best 2 configs again") == n and len(res.rounds) == n
    seen = []
    fj.tune_model(model, trials=8 * n + 8, trials_per_round=8, strategy="random", db=str(tmp_path / "p.db"),
                  measurer=measurer, retime=0, in_network=0, progress=seen.append)
    assert [r["event"] for r in seen] == ["network_round"] and "measured in this round" not in capsys.readouterr().err


def test_tune_model_without_winograd_never_proposes_it(tmp_path, capsys):
    # session 79 (session 78's list): --no-winograd built without Winograd, but tuning still spent trials on it
    from felixjax.network_build import default_config_for
    from felixjax.testing import SyntheticOracle

    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1, "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "wg",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 16, 16])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 16, 16])], [w])
    model = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    task = model.tasks[0][0]
    # replayed: this project's host, whatever runs it
    zen4 = fj.Target.cpu(cores=2, simd_lanes=16, vector_registers=32, fma=True, avx512_vnni=True, avx512_fp16=False,
                         l1d_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20)
    assert default_config_for(task, zen4).sketch.startswith("conv_winograd")  # else this tests nothing
    db = str(tmp_path / "w.db")
    res = fj.tune_model(model, zen4, trials=24, strategy="genetic", db=db, progress=False, retime=2, in_network=0,
                        measurer=lambda t, tg: ReplayRunner(SyntheticOracle(t, tg)), winograd=False)
    recs = fj.Database(db).records(task)
    assert len(recs) == 24 and not any(r.config.sketch.startswith("conv_winograd") for r in recs)
    assert recs[0].config == default_config_for(task, zen4, winograd=False)  # the opening's first
    settings = fj.Database(db).run_settings(task, res.tasks[0].best.target_key, "genetic:0")
    assert settings["excluded_sketches"] == ["conv_winograd", "conv_winograd4"] and settings["batch"] == 6  # per round
    # Winograd records of another run: the in-network choice's candidates leave them out too (a code review)
    from felixjax.network_select import family_candidates

    fj.tune_model(model, zen4, trials=12, strategy="random", db=db, progress=False, retime=0, in_network=0, run="with",
                  measurer=lambda t, tg: ReplayRunner(SyntheticOracle(t, tg)))
    key = res.tasks[0].best.target_key
    names = [r.sketch for r in family_candidates(fj.Database(db), task, key, 4)]
    assert any(n.startswith("conv_winograd") for n in names), names
    assert not any(r.sketch.startswith("conv_winograd") for r in family_candidates(
        fj.Database(db), task, key, 4, exclude_sketches=("conv_winograd", "conv_winograd4")))
    # on a GPU target the default is the CUDA sketch's (a CPU config was re-timed there, a compile_error each time)
    assert default_config_for(task, fj.Target.cuda_sim("orin")).sketch == "cuda_tiled"
    assert cli.main(["tune", "--op", "conv2d:c=8,h=8,w=8,k=8,r=3,pad=1", "--no-winograd", "--trials", "2"]) == 2


def test_tiny_tune_model_then_build_uses_tuned_records(tmp_path, runner):
    proto = zoo.make_model("transformer_block", seq=8, dim=16, heads=2)
    model = load_onnx(proto)
    db = str(tmp_path / "net.db")
    seen = []
    res = tune_model(model, trials=3 * len(model.tasks), strategy="random", db=db, runner=runner, threads=1,
                     trials_per_round=2, progress=seen.append, retime=0)
    assert res.trials == 3 * len(model.tasks) and len(seen) == len(res.rounds)
    assert {r["event"] for r in seen} == {"network_round"}  # as fj.tune's dicts, an "event" (session 78: none)
    assert all(t.trials >= 2 and t.best is not None for t in res.tasks)  # every task got its warm-up round
    n = len(model.tasks)  # the warm-up: every task once, the largest weight x FLOPs first
    assert sorted(r["index"] for r in seen[:n]) == list(range(n))
    heavy = [model.tasks[r["index"]][1] * model.tasks[r["index"]][0].flops for r in seen[:n]]
    assert heavy == sorted(heavy, reverse=True)
    assert "total (anchors)" in res.table()
    # resuming the same run with a larger budget measures only the difference
    res2 = tune_model(model, trials=3 * len(model.tasks) + 2, strategy="random", db=db, runner=runner, threads=1,
                      trials_per_round=2, progress=False, retime=2)
    assert res2.trials == 3 * len(model.tasks) + 2 and sum(r["new"] for r in res2.rounds) == 2
    target = fj.Target.cpu()
    at1 = target.at_threads(1)  # records are stored per thread count
    with Database(db) as d:  # each task's first trial was its first sketch's default schedule
        for t in res.tasks:
            first = d.records(t.task, at1)[0].config
            assert first == fj.Space(t.task, fj.sketches_for(t.task)[0], target).default()
            if target.cores > 1:
                assert d.records(t.task, target) == []
    with Database(db) as d:  # the end-of-run re-timing: each task's bests and its default, side by side
        for t in res2.tasks:
            rows = d.records(t.task, at1, run="retime:" + res2.run)
            default = fj.Space(t.task, default_sketch(t.task, target), target).default()
            assert default in [r.config for r in rows] and 2 <= len(rows) <= 3
            assert t.best.run == "retime:" + res2.run
            assert t.best.latency_s == min(r.latency_s for r in rows if r.ok)
        lucky = res2.tasks[0]  # a faster single measurement does not displace the re-timed best
        other = next(r.config for r in d.records(lucky.task, at1) if r.config != lucky.best.config)
        d.add(TuningRecord(lucky.task, at1.key, "lucky", 0, other, MeasureResult("ok", (1e-12,))))
    for threads in (1, None):  # built for 1 thread, or for all cores from the 1-thread records (noted)
        exe = build_model(model, db=db, threads=threads)
        with Database(db) as d:
            for sched in exe.schedules:
                assert sched.source == "tuned"
                assert sched.config == d.best(sched.task, at1, retimed=True).config
                assert ("tuned at 1 thread" in sched.note) == (threads is None and target.cores > 1)
    assert "tuned" in exe.summary()
    x = np.random.default_rng(5).standard_normal((1, 8, 16)).astype(np.float32)
    _close(exe(x), _ort(proto, {"x": x})[0])
    _close(res2.build()(x), _ort(proto, {"x": x})[0])


# ---- command line --------------------------------------------------------------------------------

def _bad_models(tmp_path):
    good = zoo.make_model("transformer_block", seq=8, dim=16, heads=2).SerializeToString()
    (tmp_path / "trunc.onnx").write_bytes(good[: len(good) // 2])
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07\x12\xffnot a protobuf")
    g = helper.make_graph([helper.make_node("Bernoulli", ["x"], ["y"], name="hm1")], "t",  # (Hardmax is supported now)
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 5, 5])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 5, 5])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              str(tmp_path / "hardmax.onnx"))
    return {"trunc.onnx": "not a valid ONNX", "junk.onnx": "not a valid ONNX", "hardmax.onnx": "op Bernoulli",
            "missing.onnx": "no such file"}


@pytest.mark.parametrize("cmd", ["tune", "build"])
def test_cli_bad_models_exit_2_with_one_line(cmd, tmp_path, capsys):
    for name, msg in _bad_models(tmp_path).items():
        argv = [cmd, str(tmp_path / name)] + (["--trials", "2", "--db", str(tmp_path / "r.db")] if cmd == "tune"
                                              else ["-o", str(tmp_path / "out")])
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and msg in err and "Traceback" not in err, err
    assert cli.main(["build", str(tmp_path / "junk.onnx"), "--db", str(tmp_path / "none.db"), "-o", "x"]) == 2
    assert "no such" in capsys.readouterr().err


def test_cli_build_writes_a_folder(tmp_path, capsys, monkeypatch):
    # session 73: the zoo command takes the transformer's sizes (it always wrote seq 128, dim 256)
    monkeypatch.chdir(tmp_path)  # no runs.db here: `build` would read one (what `tune` writes by default)
    path = tmp_path / "tb.onnx"
    assert cli.main(["zoo", "transformer_block", "--seq", "8", "--dim", "16", "--heads", "2", "-o", str(path)]) == 0
    assert [d.dim_value for d in onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim] == [1, 8, 16]
    assert cli.main(["zoo", "transformer_block", "--dataset", "imagenet", "-o", str(path)]) == 2  # was ignored
    out_dir = tmp_path / "out dir"  # the printed make command works in a folder with a space
    assert cli.main(["build", str(path), "-o", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "4 tasks (0 tuned, 4 default)" in out and (out_dir / "model.c").exists()
    assert f"make -C '{out_dir}'" in out


def test_cli_build_reads_the_database_tune_wrote_by_default(tmp_path, capsys, monkeypatch):
    # session 74 (a user's review): `felixjax tune m.onnx` writes runs.db by default, while `felixjax build m.onnx`
    # read no database unless given --db, so it silently built default schedules beside a tuned runs.db
    path = tmp_path / "tb.onnx"
    onnx.save(zoo.make_model("transformer_block", seq=8, dim=16, heads=2), str(path))
    monkeypatch.chdir(tmp_path)
    model = load_onnx(path)
    task = model.tasks[0][0]
    target = fj.Target.cpu()
    at = target.at_threads(target.cores)
    cfg = fj.Space(task, default_sketch(task, target), target).default()
    with Database("runs.db") as d:  # one tuned record, as `felixjax tune` leaves it
        d.add(TuningRecord(task, at.key, "random:0", 0, cfg, MeasureResult("ok", (1e-5,)), 0.1, at.to_json()))
    assert cli.main(["build", str(path), "-o", "out"]) == 0
    cap = capsys.readouterr()
    assert "using runs.db" in cap.err and "(1 tuned, 3 default)" in cap.out
    assert cli.main(["build", str(path), "-o", "out2", "--db", "none"]) == 0
    cap = capsys.readouterr()
    assert "using runs.db" not in cap.err and "(0 tuned, 4 default)" in cap.out


@pytest.mark.slow  # a real tuning run through the command line: runner start-up and a few builds
def test_cli_tune_model(tmp_path, capsys):
    path = tmp_path / "tb.onnx"
    onnx.save(zoo.make_model("transformer_block", seq=8, dim=16, heads=2), str(path))
    argv = ["tune", str(path), "--trials", "8", "--strategy", "random", "--db", str(tmp_path / "r.db"),
            "--threads", "1"]
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    assert "total (anchors)" in cap.out and "end to end" in cap.out and "round" in cap.err


# ---- ONNX backend node tests through the C build --------------------------------------------------

def run_case_c(case: onnx_cases.Case, frozen: list[str]) -> tuple[str, str]:
    """Like ``onnx_cases.run_case`` but through ``build_model`` (compiled C) instead of numpy."""
    model, feeds = onnx_cases.prepare(case, frozen)
    try:
        m = load_onnx(model)
        exe = build_model(m, threads=1)
    except UnsupportedModelError as e:
        return "unsupported", str(e)
    except Exception as e:  # a crash on a supported-looking model is a bug
        return "fail", f"build crashed: {type(e).__name__}: {e}"
    try:
        got = exe.run(feeds)
    except Exception as e:
        return "fail", f"run crashed: {type(e).__name__}: {e}"
    if (wrong := onnx_cases.output_mismatch(got, case)) is not None:
        return "fail", wrong
    return "pass", ""


@pytest.mark.slow  # ~220 small builds (cached after the first run) plus ~10-20 s generating the cases
def test_onnx_backend_node_cases_through_c_build():
    manifest = json.loads(onnx_cases.MANIFEST.read_text())
    cases = {c.key: c for c in onnx_cases.collect_cases()}
    counts = {"pass": 0, "unsupported": 0, "fail": 0}
    failed, regressed = [], []
    todo = [(entry, cases[entry["key"]]) for entry in manifest["cases"] if entry["key"] in cases]
    # (a key missing from `cases`: another onnx version generates a different set)
    # two at a time: each build spends most of its time in a gcc subprocess, so the cores overlap
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda ec: run_case_c(ec[1], ec[0]["frozen_inputs"]), todo))
    for (entry, _), (status, detail) in zip(todo, results):
        counts[status] += 1
        if status == "fail":
            failed.append(f"{entry['key']}: {detail}")
        elif entry["status"] == "pass" and status != "pass":
            regressed.append(f"{entry['key']}: {detail}")
    print(f"\nONNX node tests through the C build: {counts['pass']} pass, {counts['unsupported']} unsupported, "
          f"{counts['fail']} fail")
    assert not failed, "wrong answers:\n" + "\n".join(failed)
    assert not regressed, "pass in numpy, not in C:\n" + "\n".join(regressed)
    assert counts["pass"] > 200


@pytest.mark.slow  # a few builds and one re-timing round
def test_a_tuned_record_never_measured_against_the_current_default_is_stale_until_retimed(tmp_path, runner):
    """After an upgrade changes a task's default schedule, the database's best was only ever compared
    with the old default: ``build_model`` warns (the schedule is ``stale``) and
    ``tune_model(..., trials=0)`` re-times the stored best beside the current default, after which the
    build takes the faster of the two, warning-free."""
    import warnings

    model = load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    target = fj.Target.cpu()
    at1 = target.at_threads(1)
    db = str(tmp_path / "old.db")
    task = model.tasks[0][0]
    space = fj.Space(task, default_sketch(task, target), target)
    default = space.default()
    other = next(c for c in (space.sample(np.random.default_rng(s)) for s in range(50)) if c != default)
    with Database(db) as d:  # a record tuned by an older version: its default was some other config
        d.add(TuningRecord(task, at1.key, "random:0", 0, other, MeasureResult("ok", (1e-6,))))
    with pytest.warns(UserWarning, match="never measured against this version's default"):
        exe = build_model(model, target, db=db, threads=1)
    sched = next(s for s in exe.schedules if s.task == task)
    assert sched.stale and sched.config == other and "never measured" in sched.note
    assert not any(s.stale for s in exe.schedules if s.task != task)  # untuned tasks: their defaults
    with pytest.raises(ValueError, match="re-time only"):
        tune_model(model, trials=0, db=db, retime=0, progress=False)
    res = tune_model(model, trials=0, strategy="random", db=db, runner=runner, threads=1, progress=False)
    assert sum(r["new"] for r in res.rounds) == 0  # no search: the one record is the resumed one
    with Database(db) as d:
        rows = d.records(task, at1, run="retime:random:0")
        assert {r.config for r in rows} >= {default, other} and all(r.ok for r in rows)
        best = d.best(task, at1, retimed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no stale schedule left
        exe = build_model(model, target, db=db, threads=1)
    sched = next(s for s in exe.schedules if s.task == task)
    assert not sched.stale and sched.config == best.config


def test_layout_auto_is_chosen_once_by_tune_and_built_again_from_the_database(tmp_path, monkeypatch, capsys):
    # session 73: `--layout auto` timed the layouts again in every command, so `build` could pick a layout whose
    # tasks the tuning run never measured (a ResNet-18 tuned mixed was built plain NCHW, then another mix)
    import argparse

    from felixjax import network_cli

    path = tmp_path / "tb.onnx"
    onnx.save(zoo.make_model("transformer_block", seq=8, dim=16, heads=2), str(path))
    picks = iter([{"conv_a": "nchw", "conv_b": "nchwc"}, "nchwc"])
    calls = []

    def timed(model, target, **kw):
        calls.append(model)
        return next(picks), {"nchw": 1e-3, "nchwc": 2e-3}

    monkeypatch.setattr(network_cli, "choose_layout", timed)
    monkeypatch.setattr(network_cli, "load_onnx", lambda model, layout, **kw: layout)
    db = str(tmp_path / "r.db")
    args = argparse.Namespace(model=str(path), layout="auto", db=db, cmd="tune", input_shape=[], input_value=[])
    first = network_cli._load(args, fj.Target.cpu())
    again = network_cli._load(argparse.Namespace(**{**vars(args), "cmd": "build"}), fj.Target.cpu())
    assert first == again == {"conv_a": "nchw", "conv_b": "nchwc"} and len(calls) == 1
    assert "chosen when" in capsys.readouterr().out
    # another database, or none: chosen by timing
    assert network_cli._load(argparse.Namespace(**{**vars(args), "cmd": "build", "db": None}),
                             fj.Target.cpu()) == "nchwc" and len(calls) == 2


def test_a_seconds_budget_reaches_every_task_before_it_runs_out():
    # session 73's known gap: with --seconds and a large --trials, the first round (64 trials) of the first task
    # could use all the time and the other tasks kept their default schedules, unmeasured
    import time as _time

    from felixjax.testing import ReplayRunner

    model = load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2))

    class Slow(ReplayRunner):  # 40 ms of wall time per trial (the session's seconds are wall time)
        def measure(self, configs, on_result):
            def slow(cfg, res):
                _time.sleep(0.04)
                return on_result(cfg, res)
            super().measure(configs, slow)

    seen, asked = [], []
    from felixjax.session import TuningSession

    step = TuningSession.step

    def recording_step(self, tr, n=None):  # the round sizes asked for: whether a round is cut short is a timing
        asked.append(n)
        return step(self, tr, n)

    t0 = _time.perf_counter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TuningSession, "step", recording_step)
        res = fj.tune_model(model, trials=100_000, seconds=4.0, strategy="random", progress=seen.append, retime=0,
                            in_network=0, measurer=lambda t, tg: Slow(ReplayRunner.from_oracle(t, tg).latency))
    wall = _time.perf_counter() - t0
    assert len(model.tasks) >= 3 and all(t.trials >= 1 for t in res.tasks), [t.trials for t in res.tasks]
    assert seen[0]["new"] == 8 and asked[0] == 8  # the probe
    assert 64 in asked[len(model.tasks):], asked  # then rounds at full size (the last one may be cut short)
    assert wall < 4.0 + 64 * 0.04 + 60  # a hang guard (stops within a round of the budget on a quiet machine)


def _scaled(oracle, factor):
    return lambda cfg: factor * oracle(cfg)


def test_the_result_of_tune_model_names_what_build_model_picks(tmp_path):
    # session 73's known gap: after a second re-timing (here: `trials=0` on a machine now twice as slow), each
    # task's best in the result was the new re-timing's fastest row, while build_model took the fastest
    # re-timing ever written
    from felixjax.network_build import choose_schedules
    from felixjax.testing import ReplayRunner, SyntheticOracle

    model = load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    db = str(tmp_path / "r.db")
    for slow, trials in ((1.0, 24), (2.0, 0)):
        res = fj.tune_model(model, trials=trials, strategy="random", db=db, progress=False, retime=2, in_network=0,
                            measurer=lambda t, tg, f=slow: ReplayRunner(_scaled(SyntheticOracle(t), f)))
    picked = {s.task: s for s in choose_schedules(model, fj.Target.cpu(), db=db)}
    for t in res.tasks:
        assert t.best.run.startswith("retime:")
        assert (t.best.config, t.best.latency_s) == (picked[t.task].config, picked[t.task].latency_s)


def test_calls_from_two_python_threads_return_each_callers_outputs():
    # session 74 (a user's review): the C call releases the GIL and every call shared one arena and one set of
    # pointer arrays, so two Python threads calling one executable got each other's (or mixed) outputs
    import threading

    exe = fj.build_model(load_onnx(zoo.make_model("transformer_block", seq=16, dim=32, heads=2)))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 16, 32)).astype(np.float32) for _ in range(6)]
    want = [exe(x) for x in xs]
    wrong = []

    def work(seed, how):
        r = np.random.default_rng(seed)
        for _ in range(300):
            k = int(r.integers(len(xs)))
            y = {"call": exe, "run": lambda x: exe.run(x)[0], "float64": lambda x: exe(x.astype(np.float64))}[how](xs[k])
            if not np.array_equal(y, want[k]):
                wrong.append((how, k))

    threads = [threading.Thread(target=work, args=(s, how)) for s, how in enumerate(["call", "run", "float64"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} of 900 calls returned another call's outputs"


def test_two_exported_networks_link_into_one_program(tmp_path, capsys):
    # session 74 (a user's review): both exports defined fj_model_run and the others: a duplicate-symbol link error
    from test_network_select import _two_convs

    a = build_model(load_onnx(_two_convs()))
    b = build_model(load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2)))
    da = a.export(tmp_path / "a", prefix="neta_")
    b.export(tmp_path / "b", prefix="netb_")
    assert "int neta_run(" in (da / "model.h").read_text() and "NETA_STEPS" in (da / "model.h").read_text()
    main = tmp_path / "two.c"
    main.write_text(r"""
#include <stdio.h>
#include <stdlib.h>
#include "a/model.h"
#include "b/model.h"
static float* load(const char* p, long n) {
    float* w = malloc(sizeof(float) * n); FILE* f = fopen(p, "rb");
    if (!f || fread(w, sizeof(float), n, f) != (size_t)n) return NULL;
    fclose(f); return w;
}
int main(void) {
    float* wa = load("a/weights.bin", NETA_WEIGHT_FLOATS);
    float* wb = load("b/weights.bin", NETB_WEIGHT_FLOATS);
    if (!wa || !wb || !neta_weights_match(wa) || !netb_weights_match(wb)) return 3;
    static float xa[16 * 8 * 8], ya[16 * 8 * 8], xb[8 * 16], yb[8 * 16];
    for (int i = 0; i < 16 * 8 * 8; ++i) xa[i] = (float)(i % 7) * 0.25f;
    for (int i = 0; i < 8 * 16; ++i) xb[i] = (float)(i % 5) * 0.5f;
    const float* ia[] = {xa}; float* oa[] = {ya};
    const float* ib[] = {xb}; float* ob[] = {yb};
    if (neta_init(wa) || neta_run(ia, oa) || netb_init(wb) || netb_run(ib, ob)) return 4;
    printf("%.6f %.6f\n", ya[5], yb[7]);
    return 0;
}
""")
    objs = []
    for d in ("a", "b"):
        obj = tmp_path / d / "model.o"
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", "-std=gnu11", "-c", "-o", str(obj),
                        str(tmp_path / d / "model.c")], check=True, capture_output=True)
        objs.append(str(obj))
    subprocess.run(["gcc", "-fopenmp", "-o", str(tmp_path / "two"), str(main), *objs, "-lm"], check=True,
                   capture_output=True, cwd=tmp_path)
    r = subprocess.run([str(tmp_path / "two")], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    ya, yb = map(float, r.stdout.split())
    xa = (np.arange(16 * 8 * 8) % 7 * 0.25).astype(np.float32).reshape(1, 16, 8, 8)
    xb = (np.arange(8 * 16) % 5 * 0.5).astype(np.float32).reshape(1, 8, 16)
    assert abs(ya - float(a(xa).ravel()[5])) < 1e-4 and abs(yb - float(b(xb).ravel()[7])) < 1e-4
    onnx.save(_two_convs(), str(tmp_path / "x.onnx"))
    assert cli.main(["build", str(tmp_path / "x.onnx"), "-o", str(tmp_path / "o"), "--prefix", "1bad"]) == 2
    assert "--prefix must be a C identifier" in capsys.readouterr().err
    # session 76: "_" passed, and "_init" clashed with the C runtime's symbol at link time
    assert cli.main(["build", str(tmp_path / "x.onnx"), "-o", str(tmp_path / "o"), "--prefix", "_"]) == 2
    assert "not starting with '_'" in capsys.readouterr().err


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 -march levels")
def test_an_export_builds_with_a_users_strict_flags_and_checks_its_pointers(tmp_path):
    # session 77 (a user's review of the export): -ffast-math folded fj_exp's rounding shift (a softmax 6% off),
    # -std=c11 hid clock_gettime, -Werror stopped on -Wpsabi (default -march) and on #pragma omp without
    # -fopenmp, the README named fj_model_ functions of a prefixed export, and NULL pointers crashed the API
    b = build_model(load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2)))
    out = b.export(tmp_path / "b", prefix="tb_")
    x = np.random.default_rng(6).standard_normal((1, 8, 16)).astype(np.float32)
    y, _ = run_standalone(out, x, cflags="-O2 -march=x86-64 -std=c11 -ffast-math -Wall -Wextra -Werror")
    np.testing.assert_allclose(y.reshape(1, 8, 16), b(x), rtol=1e-5, atol=1e-5)
    text = (out / "README.txt").read_text()
    assert "tb_weights_match" in text and "tb_set_threads" in text and "fj_model_" not in text
    (tmp_path / "nul.c").write_text(r"""
#include <stdio.h>
#include "b/model.h"
int main(void) {
    static float w[1], a[1], x[8 * 16], y[8 * 16];
    const float* in[] = {x}; float* out[] = {y}; const float* no_in[] = {NULL}; float* no_out[] = {NULL};
    printf("%d %d %d %d %d %d %d\n", tb_run_with(NULL, a, in, out), tb_run_with(w, NULL, in, out),
           tb_run_with(w, a, NULL, out), tb_run_with(w, a, no_in, out), tb_run_with(w, a, in, no_out),
           tb_run(in, out), tb_weights_match(NULL));
    return 0;
}
""")
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "nul"), str(tmp_path / "nul.c"), str(out / "model.o"), "-lm"],
                   check=True, capture_output=True, cwd=tmp_path)
    r = subprocess.run([str(tmp_path / "nul")], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["1"] * 6 + ["0"]  # every NULL refused, run before init refused, no match


def test_export_replaces_links_in_its_folder_and_never_writes_through_them(tmp_path):
    # session 76 (a security review): a Makefile -> ../victim link in a shared output folder had the export
    # overwrite the victim with the Makefile's text
    from test_network_select import _two_convs

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("Makefile", "weights.bin", "model.c"):
        (out / name).symlink_to(victim)
    build_model(load_onnx(_two_convs())).export(out)
    assert victim.read_text() == "mine"
    assert all((out / n).is_file() and not (out / n).is_symlink() for n in ("Makefile", "weights.bin", "model.c"))
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_disturbed_layer_report_says_so(monkeypatch):
    # session 75 (a user's review): `build --report` on a busy machine showed 0.0016 ms convs at 23 ms without a word;
    # the report applies the tuning timings' disturbance test (here a planted 10 s run-queue delay of one thread)
    from codegen import measure_records

    exe = build_model(load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2)))
    readings = iter([{"1": 0}, {"1": 10 * 10**9}])
    monkeypatch.setattr(measure_records, "run_delays", lambda: next(readings))
    assert "note: these timings were disturbed (another process took the CPU" in exe.layer_report(number=2)


def test_a_budget_short_of_the_tasks_warns_and_its_estimates_say_partial(tmp_path):
    # session 76 (a review): 8 trials for 16 tasks left the end of the network unmeasured without a word, and the
    # "network est." and the table's total were partial sums that did not say so
    model = load_onnx(zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    n = len(model.tasks)
    seen = []
    with pytest.warns(UserWarning, match=f"2 trials for {n} tasks not measured yet at 1 a first round: {n - 2} of them"):
        res = tune_model(model, trials=2, strategy="random", trials_per_round=1, progress=seen.append, retime=0,
                         in_network=0, measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg))
    assert [r["measured_tasks"] for r in seen] == [1, 2]
    assert "task(s) without a timing left out" in res.table()


def test_a_disturbed_timing_prices_its_task_at_most_at_the_others_throughput():
    # session 76 (a review): a kernel timed only on a busy machine was priced at the median of its timings
    # (3400x its re-timed best), and the scheduler gave its task half of the budget
    from types import SimpleNamespace

    from felixjax.network_tune import TaskTuning, _priced, round_best

    noisy = [SimpleNamespace(result=MeasureResult("noisy", (11.8e-3, 9e-3, 14e-3)))]
    assert round_best(noisy) == pytest.approx(9e-3)  # the lowest bound, not the median
    a, b = matmul(64, 64, 64), matmul(32, 32, 32)
    measured = TaskTuning(a, 1)
    measured.best = SimpleNamespace(latency_s=1e-5)
    tr = SimpleNamespace(history=noisy, task=b)
    assert _priced(tr, [measured, TaskTuning(b, 1)]) == pytest.approx(b.flops / (a.flops / 1e-5))
    assert _priced(tr, [TaskTuning(b, 1)]) == pytest.approx(9e-3)  # nothing measured to compare with


def test_a_resumed_tune_model_replays_its_rounds_with_their_trials(tmp_path):
    # session 76 (a code review): resumed rounds were replayed as 1 trial each, so a task that had failed 3 x 16
    # trials came back alive after a resume (dead at 3 rounds and 8 trials) and drew another round
    from test_network_select import _two_convs

    model = load_onnx(_two_convs())
    bad = model.tasks[0][0]

    def measurer(task, target):
        return ReplayRunner(lambda c: MeasureResult("wrong_result")) if task == bad else \
            ReplayRunner.from_oracle(task, target)

    db = str(tmp_path / "r.db")
    kw = {"strategy": "random", "trials_per_round": 4, "progress": False, "retime": 0, "in_network": 0, "db": db,
          "measurer": measurer}
    first = tune_model(model, trials=40, **kw)
    assert first.tasks[0].trials == 12 and first.tasks[0].stop_reason == "no_correct_kernel"
    again = tune_model(model, trials=60, **kw)
    assert again.tasks[0].trials == 12  # still dead: no new round for it
    bigger = tune_model(model, trials=200, **{**kw, "trials_per_round": 16})  # rounds of another size: still dead
    assert bigger.tasks[0].trials == 12 and bigger.tasks[0].stop_reason == "no_correct_kernel"


def test_check_measures_errors_against_the_largest_reference_value():
    # session 76 (a verifier): equal finite values were zeroed before the largest was taken, so a build exact on its
    # largest output and 1e-3 off on a small one failed at 0.0011 "of its largest value" (it is 1.1e-6 of it)
    from types import SimpleNamespace as NS

    from felixjax.network_build import CompiledModel

    def fake(y, r):
        return NS(net=NS(input_shapes=[(1,)]), _inputs=lambda x: x, model=NS(run_numpy=lambda i: [r]),
                  run=lambda i: [y], output_names=("o",))

    x = [np.zeros(1, np.float32)]
    y, r = np.float32([1000, 1.0011]), np.float32([1000, 1.0])
    assert CompiledModel.check(fake(y, r), x) == pytest.approx(1.1e-6, rel=1e-2)
    inf = np.float32([np.inf, 2.0])
    assert CompiledModel.check(fake(inf, inf), x) == 0.0  # the same infinity agrees
    with pytest.raises(RuntimeError, match="differs from the numpy reference"):
        CompiledModel.check(fake(np.float32([-np.inf, 2.0]), inf), x)


@pytest.mark.cc
def test_build_without_winograd_for_inputs_with_outliers(tmp_path):
    # session 77 (a numerical review): one pixel of 1e4 in an N(0, 1) image cost F(4x4) outputs that never read
    # it 5.6e-4 of their max (direct: 4e-7); build_model(winograd=False) / `build --no-winograd` avoid it
    import dataclasses

    from onnx import TensorProto, numpy_helper
    from test_network_select import _two_convs

    from codegen.winograd import VARIANTS as WINOGRAD_VARIANTS
    from felixjax.database import NETWORK_PREFIX
    from felixjax.network_build import choose_schedules, is_winograd
    w = numpy_helper.from_array((0.1 * np.random.default_rng(0).standard_normal((16, 16, 3, 3))).astype(np.float32),
                                "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "one_conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], [w])
    one = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    plain, safe = build_model(one), build_model(one, winograd=False)
    assert [s.config.sketch for s in plain.schedules] == ["conv_winograd4"]  # this 3x3 conv's default
    assert not any(is_winograd(s.config.sketch) for s in safe.schedules)
    x = np.random.default_rng(1).standard_normal((1, 16, 16, 16)).astype(np.float32)
    x[0, 3, 1, 1] = 1e4
    y64 = np.stack([sum(np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))[c, i:i + 16, j:j + 16]
                        * numpy_helper.to_array(w)[:, c, i, j][:, None, None] for i in range(3) for j in range(3))
                    for c in range(16)]).sum(0)
    far = np.ones((16, 16), bool)
    far[:3, :3] = False  # outputs that do not read the spike (3 of its 4x4 tile's rows / columns do)
    err = {k: float(np.abs(exe(x)[0] - y64)[:, far].max() / np.abs(y64[:, far]).max())
           for k, exe in (("winograd", plain), ("direct", safe))}
    assert err["direct"] < 1e-5 < err["winograd"], err
    model = load_onnx(_two_convs())
    # a database whose best records are Winograd: the best record of another sketch instead
    db = fj.Database(str(tmp_path / "w.db"))
    task = model.tasks[0][0]
    target = fj.Target.cpu()
    for k, sketch in enumerate(("conv_winograd4", "conv_spatial_pack", "conv_direct")):
        cfg = fj.Space(task, sketch, target).default()
        db.add(TuningRecord(task, target.key, "random:0", k, cfg, MeasureResult("ok", ((k + 1) * 1e-4,)), 0.0,
                            target.to_json()))
    picked = {s.task: s for s in choose_schedules(model, target, db=db, winograd=False)}
    assert picked[task].config.sketch == "conv_spatial_pack" and picked[task].source == "tuned"
    assert {s.task: s for s in choose_schedules(model, target, db=db)}[task].config.sketch == "conv_winograd4"
    # an in-network choice of Winograd is passed over too, and so is a padded variant's record (by name only:
    # a sketch called conv_winograd4x is another sketch)
    wino = fj.Space(task, "conv_winograd4", target).default()
    db.add(TuningRecord(task, target.key, NETWORK_PREFIX + "random:0", 9, wino, MeasureResult("ok", (1e-6,)), 0.0,
                        target.to_json()))
    for k, name in enumerate(("conv_winograd4.pad8", "conv_winograd4x")):
        db.add(TuningRecord(task, target.key, "random:0", 10 + k, dataclasses.replace(wino, sketch=name),
                            MeasureResult("ok", ((k + 1) * 1e-7,)), 0.0, target.to_json()))
    assert db.best(task, target, exclude_sketches=WINOGRAD_VARIANTS).config.sketch == "conv_winograd4x"
    assert db.network_choice(task, target, exclude_sketches=WINOGRAD_VARIANTS) is None
    assert db.network_choice(task, target).config == wino
    db.close()
    onnx.save(_two_convs(), str(tmp_path / "m.onnx"))
    assert cli.main(["build", str(tmp_path / "m.onnx"), "--db", "none", "--no-winograd", "-o", str(tmp_path / "o")]) == 0
    assert "winograd" not in (tmp_path / "o" / "model.c").read_text().lower()


def test_tune_model_refuses_what_the_cli_refuses_and_keeps_a_runs_round_size(tmp_path):
    # a session-81 review: in_network=-1 / 1.5, seconds=0 and trials_per_round=0 were taken silently; a model with
    # no tunable layer failed inside the scheduler; a resumed run with a bigger budget derived another round size
    # and warned of mixed searches for every task; a second model whose shared layer filled the run's budget left
    # its other layers unmeasured without a word
    import warnings

    from test_network_select import _two_convs

    model = load_onnx(_two_convs())
    replay = {"measurer": lambda t, tg: ReplayRunner.from_oracle(t, tg), "progress": False, "retime": 0,
              "strategy": "random"}
    for bad, match in (({"in_network": -1}, "in_network"), ({"in_network": 1.5}, "in_network"),
                       ({"seconds": 0}, "seconds"), ({"trials_per_round": 0}, "trials_per_round")):
        with pytest.raises(ValueError, match=match):
            tune_model(model, trials=4, **replay, **bad)
    relu = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu", [helper.make_tensor_value_info("x", 1, [1, 4])],
        [helper.make_tensor_value_info("y", 1, [1, 4])]), opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ValueError, match="no op maps to a tunable task"):
        tune_model(load_onnx(relu), trials=4, **replay)
    db = str(tmp_path / "b.db")
    tune_model(model, trials=16, db=db, in_network=0, **replay)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "started with batch=2; this call continues it with batch=4"
        tune_model(model, trials=32, db=db, in_network=0, **replay)
    first = load_onnx(_two_convs()).tasks[0][0]
    one = fj.tune(first, strategy="random", trials=8, db=str(tmp_path / "s.db"), retime=0, progress=False,
                  measurer=replay["measurer"])
    assert len(one.history) == 8
    with pytest.warns(UserWarning, match="another model's records of a shared layer count too"):
        res = tune_model(model, trials=8, db=str(tmp_path / "s.db"), in_network=0, **replay)
    assert [t.trials for t in res.tasks] == [8, 0]


def test_complex_inputs_are_refused_by_a_built_network():
    # a session-81 code review: numpy's cast dropped the imaginary part with only a ComplexWarning
    from test_network_select import _two_convs

    exe = build_model(load_onnx(_two_convs()), threads=1)
    x = np.zeros(exe.net.input_shapes[0], np.complex64)
    for call in (exe, exe.run):
        with pytest.raises(ValueError, match="is complex"):
            call(x)
