"""GatherND with constant indices (a Reshape and one Gather) and CumSum (a scan) against onnxruntime: the numpy
executor for every case, the C build for a chain of them."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import felixjax as fj
from felixjax.errors import UnsupportedModelError

RNG = np.random.default_rng(0)


def _model(nodes, x_shape, inits, opset=14):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _ints(name, value):
    return numpy_helper.from_array(np.asarray(value, np.int64), name)


def _run(model, x_shape, c_build=False):
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    m = fj.load_onnx(model)
    outs = [m.run_numpy(feeds)]
    if c_build:
        got = fj.build_model(m, threads=1).run(feeds)
        outs.append(got[0] if isinstance(got, list) else got)
    for y in outs:
        assert y.shape == ref.shape
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_dims,x_shape,indices", [
    (0, (3, 4, 5), [[0, 1], [2, 3], [1, -1]]), (0, (3, 4, 5), [[[0], [2]]]), (0, (3, 4), [[0, 1], [2, 3]]),
    (1, (2, 3, 4), [[[1], [0]], [[2], [2]]]), (1, (2, 3, 4, 5), [[1, 2], [0, 3]]), (0, (2, 3), [[]])])
def test_gather_nd_matches_onnxruntime(batch_dims, x_shape, indices):
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    _run(_model([node], x_shape, [_ints("i", np.array(indices, np.int64).reshape(np.array(indices).shape))]), x_shape)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_matches_onnxruntime(exclusive, reverse, axis):
    node = helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    _run(_model([node], (3, 4, 5), [_ints("a", axis)]), (3, 4, 5))


def test_gather_nd_and_cumsum_chain_builds_in_c():
    nodes = [helper.make_node("GatherND", ["x", "i"], ["g"], batch_dims=1),
             helper.make_node("CumSum", ["g", "a"], ["c"], exclusive=1),
             helper.make_node("CumSum", ["c", "b"], ["y"], reverse=1)]
    model = _model(nodes, (2, 6, 5), [_ints("i", [[[1], [4], [0]], [[5], [5], [2]]]), _ints("a", 1), _ints("b", -1)])
    _run(model, (2, 6, 5), c_build=True)


@pytest.mark.parametrize("batch_dims,x_shape,indices", [(0, (2, 3), [1, 2]), (1, (2, 3), [[1], [0]])])
def test_gather_nd_scalar_results_feed_other_nodes(batch_dims, x_shape, indices):
    # onnx's inference gives a GatherND with one scalar per batch no shape, nor anything after it: was refused
    nodes = [helper.make_node("GatherND", ["x", "i"], ["g"], batch_dims=batch_dims),
             helper.make_node("Unsqueeze", ["g", "ax"], ["u"]), helper.make_node("Mul", ["x", "u"], ["y"])]
    _run(_model(nodes, x_shape, [_ints("i", indices), _ints("ax", [-1])]), x_shape, c_build=True)


@pytest.mark.parametrize("axis,indices", [(0, [[1, 2, 0], [2, 0, -1]]), (1, [[0], [3], [-2]]), (-1, [[3, 0], [1, 1]])])
def test_gather_elements_with_constant_indices_matches_onnxruntime(axis, indices):
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
    _run(_model([node], (3, 4), [_ints("i", indices)], opset=13), (3, 4), c_build=True)


def test_bad_indices_are_refused_clearly():
    node = helper.make_node("GatherND", ["x", "i"], ["y"])
    with pytest.raises(UnsupportedModelError, match="indices out of range"):
        fj.load_onnx(_model([node], (3, 4), [_ints("i", [[0, 4]])]))


@pytest.mark.parametrize("exclusive", [0, 1])
def test_cumsum_keeps_onnxruntimes_sign_of_zero(exclusive):
    # a review: the C scan started at +0.0 (an inclusive sum of -0.0 came out +0.0) and numpy's exclusive one kept
    # the first element's -0.0 (onnxruntime adds it to +0.0)
    node = helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive)
    model = _model([node], (3,), [_ints("a", 0)])
    feeds = {"x": np.array([-0.0, -0.0, 1.0], np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    m = fj.load_onnx(model)
    got = fj.build_model(m, threads=1).run(feeds)
    for y in (m.run_numpy(feeds), got[0] if isinstance(got, list) else got):
        np.testing.assert_array_equal(np.signbit(y), np.signbit(ref))
