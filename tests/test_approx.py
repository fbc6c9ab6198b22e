"""Approximation (issue 17): the JAX executor, channel groups and pruning, quality knobs, the latency
tables, bad input, and one small measured run of fj.approximate."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import felixjax as fj
from felixjax.approx import executor, knobs, objective, quality
from felixjax.approx.digits import _init, to_onnx
from felixjax.graph_passes import run_graph


def _masked(graph, groups, keep):
    """The original graph run in JAX with hard 0/1 channel masks (what pruning must reproduce)."""
    masks = {g: (np.arange(groups.size(g)) < n).astype(np.float32) for g, n in keep.items()}

    def hook(v, val):
        lay = groups.layouts.get(v)
        if lay is None:
            return val
        return val * knobs.mask_vector(groups, lay, masks, jnp).reshape((1, -1) + (1,) * (val.ndim - 2))

    return hook


def _concat_model() -> onnx.ModelProto:
    """conv a, conv b -> concat -> conv c (+ skip from concat) -> relu -> flatten -> gemm."""
    rng = np.random.default_rng(0)
    w = {"wa": rng.standard_normal((6, 3, 3, 3)), "wb": rng.standard_normal((10, 3, 1, 1)),
         "wc": rng.standard_normal((16, 16, 3, 3)) * 0.2, "bc": rng.standard_normal(16),
         "wd": rng.standard_normal((5, 16 * 16)) * 0.1}
    init = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1], name="ca"),
             helper.make_node("Relu", ["a"], ["ra"], name="ra"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="cb"),
             helper.make_node("Concat", ["ra", "b"], ["cat"], axis=1, name="cat"),
             helper.make_node("Conv", ["cat", "wc", "bc"], ["c"], pads=[1, 1, 1, 1], name="cc"),
             helper.make_node("Add", ["c", "cat"], ["s"], name="skip"),
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wd"], ["y"], transB=1, name="fc")]
    g = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


# ---- executor ---------------------------------------------------------------------------------

def test_the_jax_executor_runs_each_op_as_the_numpy_one_does():
    # both executors run the same op functions (op_table.py), so this catches namespace drift (an op that
    # uses numpy where the traced version needs jax.numpy), not a wrong op: that is tested against
    # onnxruntime (below, and tests/test_onnx_exporters.py)
    assert executor.drift_report() == []


@pytest.mark.parametrize("name", ["concat", "digits"])
def test_jax_executor_matches_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    proto = _concat_model() if name == "concat" else to_onnx({k: np.asarray(v) for k, v in _init(4, 1).items()}, 16)
    m = fj.load_onnx(proto)
    x = np.random.default_rng(1).standard_normal(m.graph.shapes[m.graph.inputs[0]]).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {m.graph.inputs[0]: x})[0]
    got = np.asarray(jax.jit(lambda v: executor.run(m.graph, {m.graph.inputs[0]: v})[m.graph.outputs[0]])(x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_op_outside_the_table_is_a_clear_error():
    m = fj.load_onnx(fj.zoo.make_model("transformer_block", seq=8, dim=16, heads=2))
    missing = executor.supported(m.graph)
    if missing:
        with pytest.raises(ValueError, match="does not run"):
            executor.check_supported(m.graph)


# ---- channel groups and pruning -----------------------------------------------------------------

def test_residual_adds_tie_channel_groups():
    m = fj.load_onnx(fj.zoo.make_model("resnet18", dataset="cifar10"))
    g = knobs.analyze(m.graph)
    assert g.find(g.group_of("conv1")) == g.find(g.group_of("conv3")) == g.find(g.group_of("conv5"))
    assert g.group_of("conv2") != g.group_of("conv1")
    assert g.group_of("gemm1") is not None and g.is_frozen(g.group_of("gemm1"))  # the logits keep every class


@pytest.mark.parametrize("name", ["mobilenet_v2", "concat", "digits"])
def test_pruning_equals_masking(name):
    proto = {"concat": _concat_model, "digits": lambda: to_onnx({k: np.asarray(v) for k, v in _init(8, 2).items()},
                                                                 16)}.get(name, lambda: fj.zoo.make_model(name))()
    m = fj.load_onnx(proto)
    g = knobs.analyze(m.graph)
    assert g.prunable()
    rng = np.random.default_rng(3)
    keep = {k: int(rng.integers(1, g.size(k) + 1)) for k in g.prunable()}
    pruned = knobs.prune(m.graph, g, keep)
    x = rng.standard_normal(m.graph.shapes[m.graph.inputs[0]]).astype(np.float32)
    small = run_graph(pruned, {m.graph.inputs[0]: x})[pruned.outputs[0]]
    run = jax.jit(lambda v: executor.run(m.graph, {m.graph.inputs[0]: v},
                                         value_hook=_masked(m.graph, g, keep))[m.graph.outputs[0]])
    full = run(x)
    np.testing.assert_allclose(small, np.asarray(full), rtol=1e-4, atol=1e-5)
    assert sum(n.task.flops for n in pruned.nodes if n.is_anchor) < sum(t.flops * w for t, w in m.tasks)


def test_concat_lays_groups_side_by_side_and_consumers_follow():
    m = fj.load_onnx(_concat_model())
    g = knobs.analyze(m.graph)
    ga, gb = g.group_of("ca"), g.group_of("cb")
    assert ga != gb and g.layouts["cat"].segments == ((ga, 6), (gb, 10))
    pruned = knobs.prune(m.graph, g, {ga: 2, gb: 8})
    cc = next(n for n in pruned.nodes if n.name == "cc")
    assert cc.task.input_shapes()[0][1] == 10 and cc.task.output_shape[1] == 10  # tied by the skip add
    fc = next(n for n in pruned.nodes if n.name == "fc")
    assert fc.task.input_shapes()[0][1] == 10 * 16  # flatten: 16 values per kept channel


def test_ranking_keeps_the_filters_of_largest_l1_norm():
    m = fj.load_onnx(_concat_model())
    g = knobs.analyze(m.graph)
    gb = g.group_of("cb")
    w = m.graph.constants[next(n for n in m.graph.nodes if n.name == "cb").inputs[1]]
    l1 = np.abs(w.reshape(w.shape[0], -1)).sum(1)
    assert set(g.ranking[gb][:3]) == set(np.argsort(-l1)[:3])


def test_bad_keep_counts_are_errors():
    m = fj.load_onnx(_concat_model())
    g = knobs.analyze(m.graph)
    with pytest.raises(ValueError, match="cannot keep"):
        knobs.prune(m.graph, g, {g.group_of("ca"): 0})
    with pytest.raises(ValueError, match="frozen"):
        knobs.prune(m.graph, g, {g.group_of("fc"): 2})


# ---- quality knobs -----------------------------------------------------------------------------

def test_ste_rounds_forward_and_passes_gradients_straight_through():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32))
    q = quality.ste(w, jnp.round(w * 4) / 4)
    np.testing.assert_array_equal(np.asarray(q), np.round(np.asarray(w) * 4) / 4)
    grad = jax.grad(lambda v: jnp.sum(quality.ste(v, jnp.round(v * 4) / 4) * 3.0))(w)
    np.testing.assert_allclose(np.asarray(grad), 3.0)


def test_magnitude_mask():
    w = jnp.asarray(np.arange(1, 11, dtype=np.float32))
    m = quality.magnitude_mask(w, 0.3)
    assert np.asarray(m).tolist() == [0, 0, 0] + [1] * 7
    with pytest.raises(ValueError):
        quality.magnitude_mask(w, 1.0)


def test_soft_mask_is_the_top_n_mask_at_integers_and_differentiable():
    np.testing.assert_allclose(np.asarray(quality.soft_mask(3.0, 6, tau=0.01)), [1, 1, 1, 0, 0, 0], atol=1e-6)
    d = jax.grad(lambda k: jnp.sum(quality.soft_mask(k, 6, tau=0.5)))(2.3)
    assert float(d) > 0


def test_accuracy_of_a_graph_pinned_to_batch_2_scores_each_image():
    # session 73: a graph pinned to batch 2 answers (2, 10) per sample of x; accuracy took one argmax over
    # all 20 scores (an index in [0, 20) against labels in [0, 10)) and labels of shape (N,) passed
    rng = np.random.default_rng(0)
    out = rng.standard_normal((8, 2, 10))
    truth = out.argmax(axis=2)  # (8, 2): every image classified right
    assert quality.metric_value(out, "accuracy", labels=truth) == 1.0
    wrong = truth.copy()
    wrong[:, 1] = (wrong[:, 1] + 1) % 10
    assert quality.metric_value(out, "accuracy", labels=wrong) == 0.5
    # the differentiable stand-in is the mean cross-entropy per image
    ce = -np.mean(jax.nn.log_softmax(out.reshape(16, 10))[np.arange(16), truth.reshape(-1)])
    np.testing.assert_allclose(float(quality.surrogate(jnp.asarray(out), "accuracy", labels=jnp.asarray(truth))),
                               ce, rtol=1e-5)
    x = rng.standard_normal((8, 2, 1, 4, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=r"expected \(8, 2\), one class index per image"):
        quality.check_data(x, truth[:, 0], (2, 1, 4, 4), (2, 10), "accuracy")
    xs, ys = quality.check_data(x, truth, (2, 1, 4, 4), (2, 10), "accuracy")
    assert xs.shape == (8, 2, 1, 4, 4) and ys.shape == (8, 2)
    x1 = x[:, :1]  # (N, 1, 1, 4, 4): samples with the batch axis of 1, as the docstring allows
    assert quality.check_data(x1, truth[:, 0], (1, 1, 4, 4), (1, 10), "accuracy")[0].shape == (8, 1, 1, 4, 4)
    with pytest.raises(ValueError, match=r"data x has shape \(8, 4, 4\)"):  # the shape as given, not reshaped
        quality.check_data(x[:, 0, 0], truth[:, 0], (1, 1, 4, 4), (1, 10), "accuracy")


def test_fidelity_is_an_error_measure_for_outputs_that_are_not_class_scores():
    # session 73: every output of more than one value was scored as a classifier (argmax agreement): a
    # feature map that kept only its largest value scored fidelity 1.0
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((3, 1, 4, 8, 8))
    spiky = np.zeros_like(ref)
    flat = ref.reshape(3, -1)
    spiky.reshape(3, -1)[np.arange(3), flat.argmax(axis=1)] = flat.max(axis=1)
    l2 = 1 - np.linalg.norm(spiky - ref) / np.linalg.norm(ref)
    np.testing.assert_allclose(quality.metric_value(spiky, "fidelity", reference=ref), l2)
    assert quality.metric_value(ref * 0.9, "fidelity", reference=ref) == pytest.approx(0.9)
    rel = float(quality.surrogate(jnp.asarray(spiky), "fidelity", reference=jnp.asarray(ref)))
    np.testing.assert_allclose(rel, np.sum((spiky - ref) ** 2) / np.sum(ref ** 2), rtol=1e-5)
    # class scores, with unit axes or several rows per sample, stay top-1 agreement per row
    scores = rng.standard_normal((5, 2, 10, 1, 1))
    other = scores.copy()
    other[:, 1] = -other[:, 1]  # the second image's top-1 changes
    assert quality.metric_value(other, "fidelity", reference=scores) == 0.5
    assert quality.within(1 - 0.99, 0.01) and not quality.within(0.02, 0.01)


# ---- latency tables ----------------------------------------------------------------------------

def test_latency_slope_comes_from_the_schedules_table_not_flops():
    """A predictor whose latency steps every 8 output channels (one register block of 8 lanes) gives
    d latency / d channels = 0 between 12 and 16 channels (same blocks) and > 0 across a step; the
    FLOPs proxy has a slope everywhere."""
    m = fj.load_onnx(_concat_model())
    g = knobs.analyze(m.graph)

    def stepped(task):
        return 1e-6 * -(-task.output_shape[1] // 8) * task.input_shapes()[0][1]

    tg = fj.Target.cpu(cores=1)
    tab = objective.LatencyTable(m.graph, g, tg, measured={}, predictor=stepped, multiple=4)
    flops = objective.LatencyTable(m.graph, g, tg, measured={}, kind="flops", multiple=4)
    cc = next(lay for lay in tab.layers if lay.node.name == "cc")
    fc = next(lay for lay in flops.layers if lay.node.name == "cc")
    assert list(cc.go) == [4.0, 8.0, 12.0, 16.0]
    slope = jax.grad(lambda co: objective.interp2(cc.table, cc.gi, cc.go, 16.0, co))
    slope_flops = jax.grad(lambda co: objective.interp2(fc.table, fc.gi, fc.go, 16.0, co))
    assert float(slope(14.0)) == 0.0 and float(slope(10.0)) > 0
    assert float(slope_flops(14.0)) > 0


def test_interp2_is_exact_on_the_grid():
    t = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 9.0]])
    gi, go = np.array([8.0, 16.0]), np.array([8.0, 16.0, 32.0])
    for a, i in enumerate(gi):
        for b, o in enumerate(go):
            assert float(objective.interp2(t, gi, go, i, o)) == pytest.approx(t[a, b], rel=1e-5)


# ---- bad input ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    params = {k: np.asarray(v) for k, v in _init(4, 0).items()}
    proto = to_onnx(params, 8)
    x = np.random.default_rng(0).uniform(0, 1, (24, 1, 8, 8)).astype(np.float32)
    y = np.arange(24) % 10
    return proto, x, y


@pytest.mark.parametrize("case,match", [
    ("negative budget", "quality_budget"), ("data not a tuple", "data must be"),
    ("no labels for accuracy", "fidelity"), ("wrong sample shape", "shape"), ("label count", "labels"),
    ("label range", "classes"), ("unknown metric", "metric"), ("unknown output", "not an output"),
    ("budget a bool", "quality_budget"), ("holdout not a tuple", "holdout must be"),
    ("holdout without labels", "holdout: .*fidelity"), ("holdout of another shape", "holdout: .*shape"),
])
def test_bad_input_is_a_clear_error(tiny, case, match):
    proto, x, y = tiny
    kwargs = {"data": (x, y)}
    kwargs.update({"negative budget": {"quality_budget": -0.1}, "data not a tuple": {"data": "x"},
                   "no labels for accuracy": {"data": (x,)}, "wrong sample shape": {"data": (x[:, :, :4], y)},
                   "label count": {"data": (x, y[:5])}, "label range": {"data": (x, y + 5)},
                   "unknown metric": {"metric": "f1"}, "unknown output": {"output": "nope"},
                   "budget a bool": {"quality_budget": True}, "holdout not a tuple": {"holdout": x},
                   "holdout without labels": {"holdout": (x,)}, "holdout of another shape": {"holdout": (x[:, :, :4], y)},
                   }[case])
    with pytest.raises(ValueError, match=match):
        fj.approximate(proto, progress=False, **kwargs)


def test_a_numpy_budget_is_taken_and_one_of_1_or_more_is_a_warning(tiny):
    # session 78 (a review): np.float32(0.01) was refused while np.float64 passed, True was a budget of 1, and a
    # budget of 1 (meant as 1%) allowed any drop without a word; the search error below comes after the budget's
    proto, x, y = tiny
    for budget in (np.float32(0.01), np.int64(0)):
        with pytest.raises(ValueError, match="search must be"):
            fj.approximate(proto, data=(x, y), quality_budget=budget, search="grid", progress=False)
    with pytest.warns(UserWarning, match="allows any drop"), pytest.raises(ValueError, match="search must be"):
        fj.approximate(proto, data=(x, y), quality_budget=1, search="grid", progress=False)


def test_cli_bad_data_is_one_line_and_exit_2(tmp_path, tiny, capsys):
    from felixjax.cli import main

    proto, x, y = tiny
    model = tmp_path / "m.onnx"
    onnx.save(proto, model)
    np.savez(tmp_path / "d.npz", x=x, y=y + 20)
    assert main(["approx", str(model), "--data", str(tmp_path / "d.npz"), "-o", str(tmp_path / "o")]) == 2
    np.savez(tmp_path / "e.npz", z=x)
    assert main(["approx", str(model), "--data", str(tmp_path / "e.npz"), "-o", str(tmp_path / "o")]) == 2
    np.savez(tmp_path / "nolabels.npz", x=x)  # the CLI's words, not the Python API's data=(x, y)
    capsys.readouterr()
    assert main(["approx", str(model), "--data", str(tmp_path / "nolabels.npz"), "-o", str(tmp_path / "o")]) == 2
    assert "--metric fidelity" in capsys.readouterr().err
    # session 72: an .npy (numpy returns an array, no .files: a traceback) and a non-numpy file (numpy's
    # message blamed pickled data)
    np.save(tmp_path / "f.npy", x)
    for wrong in (tmp_path / "f.npy", model):
        assert main(["approx", str(model), "--data", str(wrong), "-o", str(tmp_path / "o")]) == 2



def test_cli_pins_a_dynamic_batch_with_input_shape(tmp_path, tiny, capsys):
    # session 73: the error for a dynamic model said to use --input-shape, which approx did not have
    from felixjax.cli import main

    proto, x, y = tiny
    dyn = onnx.ModelProto()
    dyn.CopyFrom(proto)
    dim = dyn.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "N"
    model = tmp_path / "dyn.onnx"
    onnx.save(dyn, model)
    np.savez(tmp_path / "d.npz", x=x, y=y + 20)  # labels out of range: the error after the model loaded
    argv = ["approx", str(model), "--data", str(tmp_path / "d.npz"), "-o", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "--input-shape" in capsys.readouterr().err
    name = dyn.graph.input[0].name
    assert main(argv + ["--input-shape", f"{name}=1x{'x'.join(map(str, x.shape[1:]))}"]) == 2
    err = capsys.readouterr().err
    assert "labels y range" in err and "--input-shape" not in err


# ---- one small measured run --------------------------------------------------------------------

@pytest.mark.cc
def test_approximate_measures_what_it_reports(tmp_path):
    rng = np.random.default_rng(0)
    params = {k: np.asarray(v) for k, v in _init(8, 0).items()}
    proto = to_onnx(params, 8)
    x = rng.uniform(0, 1, (40, 1, 8, 8)).astype(np.float32)
    held = rng.uniform(0, 1, (16, 1, 8, 8)).astype(np.float32)
    res = fj.approximate(proto, fj.Target.cpu(cores=1), data=(x,), metric="fidelity", quality_budget=0.99,
                         trials=0, rounds=1, steps=3, lam=0.05, multiple=4, latency="flops", progress=False,
                         holdout=(held,))
    assert res.pareto[0].method == "float32" and res.quality_evals == len(res.pareto)
    assert res.baseline_quality == 1.0  # fidelity of the float32 build to itself
    assert res.speedup > 0 and np.isfinite(res.latency_s)
    # the reported quality is the metric of the returned executable's outputs, recomputed here
    ref = np.stack([res.baseline(x[i: i + 1]) for i in range(len(x))])
    out = np.stack([res.executable(x[i: i + 1]) for i in range(len(x))])
    assert quality.metric_value(out, "fidelity", reference=ref) == pytest.approx(res.quality)
    assert res.samples == len(x) and res.heldout_samples == len(held)  # and so is the held-out check (session 78)
    href = np.stack([res.baseline(h[None]) for h in held])
    hout = np.stack([res.executable(h[None]) for h in held])
    assert res.heldout_baseline_quality == 1.0
    assert res.heldout_quality == pytest.approx(quality.metric_value(hout, "fidelity", reference=href))
    assert "held out (16 samples the search never saw)" in res.table()
    # the chosen point is timed again beside the baseline after the choice (its own timing won among several)
    assert (res.retimed is not None) == (res.chosen is not None)
    if res.retimed is not None:
        assert res.latency_s == res.retimed[0] and res.speedup == res.retimed[1] / res.retimed[0]
    m = fj.load_onnx(proto)
    np.testing.assert_allclose(ref[0], m.run_numpy(x[:1]), rtol=1e-4, atol=1e-5)
    assert len(res.layers) == 5 and "float32" in res.table()
    assert (res.export(tmp_path / "out") / "model.c").exists()


@pytest.mark.cc
@pytest.mark.parametrize("again_s", [2e-3, 8e-4])
def test_the_choice_is_timed_again_and_kept_only_where_still_faster(tiny, monkeypatch, again_s):
    # session 78: the chosen point's speedup was its own selection timing (the best of several noisy ones), and
    # (a verification) a chosen point whose re-timing beside the baseline ran slower would have been kept
    from felixjax.approx.search import Approximator

    seen = set()

    def timed(self, exe, base, **kw):  # every point 2x faster when first timed; again_s when timed again
        again = id(exe) in seen
        seen.add(id(exe))
        return (again_s, 1e-3) if again else (5e-4, 1e-3)

    monkeypatch.setattr(Approximator, "latency_pair", timed)
    _, x, _ = tiny
    proto = to_onnx({k: np.asarray(v) for k, v in _init(8, 0).items()}, 8)
    res = fj.approximate(proto, fj.Target.cpu(cores=1), data=(x,), metric="fidelity", quality_budget=0.99,
                         trials=0, rounds=0, multiple=4, seeds=(0.5,), measure=0, progress=False)
    assert len(res.pareto) == 2 and res.pareto[1].speedup == 2.0  # chosen at 2x ...
    if again_s > 1e-3:  # ... slower when timed again: not kept
        assert res.chosen is None and res.executable is res.baseline and res.speedup == 1.0
        assert "timed again beside the baseline ran 2 ms against 1 ms: not faster" in res.table()
    else:  # ... 1.25x when timed again: kept, at that figure
        assert res.chosen is res.pareto[1] and res.retimed == (8e-4, 1e-3) and res.speedup == 1.25
        assert res.latency_s == 8e-4 and "1.25x (timed again beside the baseline after the choice; 2.00x" in res.table()


@pytest.mark.cc
def test_a_zero_budget_or_nothing_to_prune_keeps_the_exact_network(tiny):
    # session 78 (a review): a budget of 0 returned a pruned network (its loss on the data was negative), and a
    # network with no prunable layer failed with a ZeroDivisionError
    from onnx import TensorProto, helper, numpy_helper

    _, x, y = tiny
    proto = to_onnx({k: np.asarray(v) for k, v in _init(8, 0).items()}, 8)  # channels of 8: prunable at multiple=4
    res = fj.approximate(proto, fj.Target.cpu(cores=1), data=(x, y), quality_budget=0, trials=0, rounds=1,
                         multiple=4, progress=False)
    # nothing but the baseline built (with any budget, the front search builds its uniform seeds)
    assert res.chosen is None and res.executable is res.baseline and len(res.pareto) == 1 and res.retimed is None
    assert "in-sample: measured on the 24 samples" in res.table()
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((10, 64)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "W"], ["y"],
                                                                                        transB=1)], "linear",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w])
    linear = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    res = fj.approximate(linear, fj.Target.cpu(cores=1), data=(x, y), quality_budget=np.float32(0.05), trials=0,
                         progress=False)
    assert res.chosen is None and len(res.pareto) == 1 and res.quality_loss == 0.0
    assert res.quality_budget == 0.05  # not float(np.float32(0.05)) = 0.0500000007


# ---- the front search ----------------------------------------------------------------------------

def test_masked_quality_equals_the_pruned_network(tiny):
    from felixjax.approx.search import Approximator, MaskedQuality

    proto, x, y = tiny
    ax = Approximator(proto, data=(x, y))
    q = MaskedQuality(ax)
    keep = {g: max(1, ax.groups.size(g) // 2) for g in ax.groups.prunable()}
    pruned = ax.pruned_model(keep)
    out = np.stack([pruned.run_numpy(x[i: i + 1]) for i in range(len(x))])
    assert q(keep) == pytest.approx(quality.metric_value(out, "accuracy", labels=y))
    assert q.evals == 1 and q(dict(keep)) == q(keep) and q.evals == 1  # cached


def test_local_search_keeps_the_floor_and_lowers_latency():
    from felixjax.approx.search import ladder, local_search

    assert ladder(20, 8) == [8, 16, 20] and ladder(4, 8) == [4]
    ladders = {0: ladder(48, 8), 1: ladder(24, 8)}
    lat = lambda k: 2.0 * k[0] + k[1]                 # group 0 costs more per channel
    qual = lambda k: min(k[0], 32) / 32 + k[1] / 24   # group 0 matters up to 32 channels
    start = {0: 48, 1: 16}
    out = local_search(start, qual(start), latency=lat, quality=qual, ladders=ladders)
    assert qual(out) >= qual(start) and lat(out) < lat(start)
    assert out == {0: 24, 1: 24}  # down 48 -> 32, then a trade: group 0 down, group 1 up
    assert local_search(start, 10.0, latency=lat, quality=qual, ladders=ladders) == start  # nothing holds the floor


def test_pareto_front_and_uniform_keep(tiny):
    from felixjax.approx.search import ParetoPoint, pareto_front, uniform_keep

    pts = [ParetoPoint("a", 1.0, q, 0.0, (), baseline_s=s) for q, s in ((0.9, 2.0), (0.9, 2.0), (0.8, 1.0), (0.95, 1.5))]
    front = pareto_front(pts)
    assert [(p.quality, p.speedup) for p in front] == [(0.95, 1.5), (0.9, 2.0)]
    proto, _, _ = tiny
    g = knobs.analyze(fj.load_onnx(proto).graph)
    assert uniform_keep(g, 0.5, 4) == {r: max(1, round(g.size(r) * 0.5 / 4)) * 4 for r in g.prunable()}
    with pytest.raises(ValueError, match="ratio"):
        uniform_keep(g, 0.0, 4)


@pytest.mark.parametrize("kwargs,match", [({"search": "grid"}, "search"), ({"measure": -1}, "measure"),
                                          ({"seeds": [{99: 4}]}, "groups")])
def test_bad_front_search_arguments_are_errors(tiny, kwargs, match):
    proto, x, y = tiny
    with pytest.raises(ValueError, match=match):
        fj.approximate(proto, data=(x, y), trials=0, rounds=0, progress=False, **kwargs)


@pytest.mark.cc
def test_the_front_dominates_or_equals_every_seed_on_the_search_data():
    rng = np.random.default_rng(1)
    params = {k: np.asarray(v) for k, v in _init(8, 0).items()}
    proto = to_onnx(params, 8)
    x = rng.uniform(0, 1, (40, 1, 8, 8)).astype(np.float32)
    g = knobs.analyze(fj.load_onnx(proto).graph)
    explicit = {r: 4 for r in g.prunable()}
    res = fj.approximate(proto, fj.Target.cpu(cores=1), data=(x,), metric="fidelity", quality_budget=0.2,
                         trials=0, rounds=0, multiple=4, seeds=(0.5, explicit), measure=2, progress=False)
    seeds = [p for p in res.pareto if p.note.startswith("seed")]
    assert len(seeds) == 2 and res.quality_evals == len(res.pareto)
    assert res.search_evals >= 2
    for s in seeds:  # every seed is measured, and the front beats or equals it (speedup, quality)
        assert any(f.speedup >= s.speedup and f.quality >= s.quality for f in res.front)
    assert all(p in res.pareto for p in res.front)
    assert res.chosen is None or res.chosen.quality_loss <= 0.2 + 1e-9


def test_docstring_examples_of_the_fast_modules():
    import doctest

    from felixjax.approx import result, search

    for module in (quality, objective, search, result):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_the_table_says_when_timings_were_taken_on_a_busy_machine():
    # session 75 (users' reviews): the ms column and the paired speedups disagreed without a word on a busy machine,
    # and a baseline that itself read 40 ms (0.012 ms beside the points) went unflagged
    from felixjax.approx.search import ApproxResult, ParetoPoint

    pts = (ParetoPoint("float32", 1e-5, 1.0, 0.0, ()), ParetoPoint("ours", 5e-6, 0.9, 0.1, (), baseline_s=8e-5))
    res = ApproxResult(None, None, "accuracy", 1e-5, 5e-6, 1.0, 0.9, 0.1, (), pts, 2)
    text = res.table()
    assert "base ms" in text and "baseline's own figure" not in text
    assert "note: 1 point(s) were timed on a busy machine (the baseline beside them read up to 8.0x" in text
    inflated = ApproxResult(None, None, "accuracy", 4e-2, 5e-6, 1.0, 0.9, 0.1, (),
                            (pts[0], ParetoPoint("ours", 5e-6, 0.9, 0.1, (), baseline_s=1.2e-5)), 2)
    assert "note: the baseline's own figure (40 ms; 0.012 ms beside a point) was timed on a busy machine" in \
        inflated.table()


@pytest.mark.cc
def test_cli_writes_the_points_plot_and_says_when_nothing_could_be_pruned(tmp_path, tiny, capsys):
    # session 76 (a user's review): approx drew no figure, refused --trials 0 (the API takes it), had no
    # --multiple, and a model too narrow to prune printed "chosen 1.00x" without a reason
    from felixjax.cli import main

    proto, x, y = tiny
    model = tmp_path / "m.onnx"
    onnx.save(proto, model)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    base = ["approx", str(model), "--data", str(tmp_path / "d.npz"), "--trials", "0", "--rounds", "1",
            "--measure", "1", "--budget", "0.99", "--quiet"]
    assert main(base + ["-o", str(tmp_path / "a"), "--multiple", "64"]) == 0
    assert "note: only the float32 baseline was built" in capsys.readouterr().out
    assert (tmp_path / "a" / "approx.png").stat().st_size > 0
    assert main(base + ["-o", str(tmp_path / "b"), "--multiple", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: only the float32 baseline" not in out and (tmp_path / "b" / "approx.png").exists()
    assert main(base + ["-o", str(tmp_path / "c"), "--multiple", "0"]) == 2


def _two_heads() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = (0.3 * rng.standard_normal((16, 3, 3, 3))).astype(np.float32)
    wa, wb = (rng.standard_normal((n, 16)).astype(np.float32) for n in (5, 10))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wa"], ["aux"], transB=1, name="head_a"),
             helper.make_node("Gemm", ["f", "wb"], ["logits"], transB=1, name="head_b")]
    g = helper.make_graph(nodes, "two_heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("aux", TensorProto.FLOAT, [1, 5]),
                           helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (wa, "wa"), (wb, "wb")]])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_the_descent_and_the_finetune_score_the_chosen_output():
    # session 81 review: both read the graph's first output whatever output= said: the fidelity descent crashed
    # on the heads' shapes, the accuracy one was NaN, and the fine-tune trained the other head
    from felixjax.approx.search import Approximator

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 16)
    ax = Approximator(_two_heads().SerializeToString(), data=(x, y), metric="accuracy", output="logits",
                      finetune_steps=2)
    full = {g: ax.groups.size(g) for g in ax.groups.prunable()}
    tuned, base = ax.final_model(full).graph.constants, ax.pruned_model(full).graph.constants
    changed = {k.split("/")[0] for k in tuned if not np.array_equal(tuned[k], base[k])}
    assert "head_b" in changed and "head_a" not in changed
    graph = ax.pruned_model(full).graph
    table = objective.LatencyTable(graph, ax.groups, fj.Target.cpu(cores=1), measured={}, kind="flops", multiple=4)
    for metric, labels, ref in (("accuracy", y, None), ("fidelity", None, rng.standard_normal((16, 10)))):
        _, info = objective.descend(graph, ax.groups, table, x, metric=metric, labels=labels, reference=ref,
                                    lam=1.0, start=full, steps=1, output="logits")
        assert np.isfinite(info["trace"][0]).all()
