"""Comparisons and boolean logic on data tensors (``felixjax.onnx_logic``: masks held as float32 0 / 1), with
``Where`` on a mask and ``Cast`` to and from bool: numpy executor and C build against onnxruntime, NaN included."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import felixjax as fj
from felixjax.errors import UnsupportedModelError

RNG = np.random.default_rng(0)
ZERO = numpy_helper.from_array(np.array(0.0, np.float32), "zero")


def _model(nodes, inputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[ZERO, *inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _check(model, inputs):
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in inputs}
    first = feeds[inputs[0][0]]
    first.flat[0], first.flat[-1] = np.nan, 0.0  # a NaN compares false; an exact 0 for Equal / Not
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    m = fj.load_onnx(model)
    got = fj.build_model(m, threads=1).run(feeds)
    for y in (m.run_numpy(feeds), got[0] if isinstance(got, list) else got):
        np.testing.assert_array_equal(y, ref)  # 0 / 1 masks and selected values: exact
    return m


def test_leaky_relu_written_as_where_of_a_comparison():
    slope = numpy_helper.from_array(np.array(0.1, np.float32), "slope")
    nodes = [helper.make_node("Greater", ["x", "zero"], ["m"]), helper.make_node("Mul", ["x", "slope"], ["xs"]),
             helper.make_node("Where", ["m", "x", "xs"], ["y"])]
    _check(_model(nodes, [("x", (2, 3, 4))], [slope]), [("x", (2, 3, 4))])


@pytest.mark.parametrize("op", ["Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"])
def test_each_comparison_broadcasts_and_casts_back_to_float(op):
    nodes = [helper.make_node(op, ["x", "b"], ["m"]), helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)]
    _check(_model(nodes, [("x", (3, 5)), ("b", (1, 5))]), [("x", (3, 5)), ("b", (1, 5))])


def test_logic_chain_with_a_bool_constant():
    flags = numpy_helper.from_array(np.array([True, False, True, False, True]), "flags")
    nodes = [helper.make_node("Less", ["x", "b"], ["l"]), helper.make_node("Equal", ["x", "x"], ["e"]),
             helper.make_node("GreaterOrEqual", ["b", "zero"], ["g"]), helper.make_node("Or", ["e", "g"], ["o"]),
             helper.make_node("And", ["l", "o"], ["a"]), helper.make_node("Xor", ["a", "flags"], ["xr"]),
             helper.make_node("Not", ["xr"], ["n"]), helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["nf", "x"], ["y"])]
    _check(_model(nodes, [("x", (3, 5)), ("b", (1, 5))], [flags]), [("x", (3, 5)), ("b", (1, 5))])


def test_cast_of_float_data_to_bool_is_a_nonzero_mask():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["r"], ["m"], to=TensorProto.BOOL),
             helper.make_node("Where", ["m", "x", "zero"], ["y"])]
    _check(_model(nodes, [("x", (4, 4))]), [("x", (4, 4))])


def test_a_mask_output_comes_out_as_float_and_other_casts_are_still_refused():
    g = helper.make_graph([helper.make_node("Greater", ["x", "zero"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                          [helper.make_tensor_value_info("y", TensorProto.BOOL, None)], initializer=[ZERO])
    m = fj.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(m.run_numpy({"x": x}), (x > 0).astype(np.float32))
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32), helper.make_node("Cast", ["i"], ["y"],
                                                                                             to=TensorProto.FLOAT)]
    with pytest.raises(UnsupportedModelError, match="a cast of a data tensor to int32 is not supported"):
        fj.load_onnx(_model(nodes, [("x", (2, 3))]))


def test_a_mask_moved_by_reshape_transpose_concat_and_unsqueeze_stays_a_mask():
    # a review: the attention-mask pattern (a mask reshaped / transposed / concatenated, then Where) was refused
    # ("output has dtype bool"); data movement keeps its 0 / 1 values
    shape = numpy_helper.from_array(np.array([4, 3], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("Greater", ["x", "zero"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
             helper.make_node("Concat", ["t", "t"], ["c"], axis=1), helper.make_node("Unsqueeze", ["c", "axes"], ["u"]),
             helper.make_node("Where", ["u", "y0", "zero"], ["y"])]
    _check(_model(nodes, [("x", (2, 6)), ("y0", (1, 3, 8))], [shape, axes]), [("x", (2, 6)), ("y0", (1, 3, 8))])


def test_a_mask_concatenated_with_a_bool_constant_stays_a_mask():
    # the known gap of session 80: a bool constant moved beside a mask was refused ("is a bool constant")
    pad = numpy_helper.from_array(np.array([[True], [False]]), "pad")
    nodes = [helper.make_node("Greater", ["x", "zero"], ["m"]), helper.make_node("Concat", ["m", "pad"], ["c"], axis=1),
             helper.make_node("Concat", ["pad", "c"], ["c2"], axis=1),
             helper.make_node("Where", ["c2", "y0", "zero"], ["y"])]
    _check(_model(nodes, [("x", (2, 3)), ("y0", (2, 5))], [pad]), [("x", (2, 3)), ("y0", (2, 5))])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(1, 1, 0), (-1, 0, 1), (0, 0, 0)])
def test_argmax_and_argmin_follow_onnxruntimes_scan_nan_included(op, axis, keepdims, last):
    # ties and NaNs: onnxruntime keeps a first NaN and passes over later ones (indices come out as float32)
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 4, 5))],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = RNG.integers(-2, 3, (3, 4, 5)).astype(np.float32)
    x.flat[RNG.choice(60, 12, replace=False)] = [np.nan] * 8 + [np.inf] * 4
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = fj.load_onnx(model)
    got = fj.build_model(m, threads=1).run({"x": x})
    for y in (m.run_numpy({"x": x}), got[0] if isinstance(got, list) else got):
        assert y.dtype == np.float32 and y.shape == ref.shape
        np.testing.assert_array_equal(y, ref)


EDGES = (np.array([0, -0., 0, -0., -3, 3, -1, 1, np.inf, -np.inf, 1, 1, np.nan, 1, 5.5, -5.5], np.float32),
         np.array([-2, 2, 2, -2, np.inf, np.inf, -np.inf, -np.inf, 2, 2, 0, -0., 2, np.nan, 2, 2], np.float32))


@pytest.mark.parametrize("fmod", [1, 0])
def test_mod_of_float_data_signs_zeros_and_infinities(fmod):
    # fmod=1 as onnxruntime; fmod=0 (which onnxruntime refuses on floats) as the ONNX spec: numpy's floored mod
    g = helper.make_graph([helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)], "g",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [16]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds = dict(zip("ab", EDGES))
    if fmod:
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            ref = np.mod(*EDGES)
    m = fj.load_onnx(model)
    got = fj.build_model(m, threads=1).run(feeds)
    for y in (m.run_numpy(feeds), got[0] if isinstance(got, list) else got):
        np.testing.assert_array_equal(y, ref)
        np.testing.assert_array_equal(np.signbit(y), np.signbit(ref))


def test_isnan_and_isinf_masks_select_with_where():
    nodes = [helper.make_node("IsNaN", ["x"], ["n"]), helper.make_node("IsInf", ["x"], ["p"], detect_negative=0),
             helper.make_node("Or", ["n", "p"], ["bad"]), helper.make_node("Where", ["bad", "zero", "x"], ["y"])]
    model = _model(nodes, [("x", (16,))])
    x = np.array([1, np.nan, np.inf, -np.inf, -0.0, 3e38, -1, np.nan, 2, np.inf, 0, 5, -7, 1e-40, 8, -np.nan],
                 np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = fj.load_onnx(model)
    got = fj.build_model(m, threads=1).run({"x": x})
    for y in (m.run_numpy({"x": x}), got[0] if isinstance(got, list) else got):
        np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis,outputs", [(1, ("v", "i")), (-1, ("i",)), (0, ("v",))])
def test_topk_orders_nans_ties_and_signed_zeros_as_onnxruntime(largest, axis, outputs):
    # values and indices (held as float32); an unused indices output goes to the C step's scratch
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 4, 5))],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT if o == "v" else TensorProto.INT64, None)
                           for o in outputs], [numpy_helper.from_array(np.array([3], np.int64), "k")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    x = RNG.integers(-2, 3, (3, 4, 5)).astype(np.float32)
    x.flat[RNG.choice(60, 14, replace=False)] = [np.nan] * 8 + [-0.0] * 3 + [np.inf, -np.inf, np.inf]
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    m = fj.load_onnx(model)
    got = fj.build_model(m, threads=1).run({"x": x})
    for ys in (m.run_numpy({"x": x}), got):
        for y, ref in zip(ys if isinstance(ys, list) else [ys], refs):
            assert y.dtype == np.float32 and y.shape == ref.shape
            np.testing.assert_array_equal(y, ref.astype(np.float32))
            np.testing.assert_array_equal(np.signbit(y), np.signbit(ref.astype(np.float32)))


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_hardmax_marks_the_first_largest_a_nan_included(axis):
    # ties: the first (as onnxruntime); a NaN is the largest, as the ONNX reference's np.argmax has it
    # (onnxruntime's vectorized max marks [3, nan, 1, 4] at 3 and [nan, 0, 5, 5] nowhere)
    from onnx.reference import ReferenceEvaluator

    g = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 4, 5))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = RNG.integers(-2, 3, (3, 4, 5)).astype(np.float32)  # ties: the first
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    x2 = x.copy()
    x2.flat[RNG.choice(60, 6, replace=False)] = np.nan
    ref2 = ReferenceEvaluator(model).run(None, {"x": x2})[0]
    m = fj.load_onnx(model)
    got = fj.build_model(m, threads=1).run({"x": x2})
    for y in (m.run_numpy({"x": x2}), got[0] if isinstance(got, list) else got):
        np.testing.assert_array_equal(y, ref2)
    got = fj.build_model(m, threads=1).run({"x": x})
    for y in (m.run_numpy({"x": x}), got[0] if isinstance(got, list) else got):
        np.testing.assert_array_equal(y, ref)


def test_indices_past_2_to_the_24_are_refused_not_rounded():
    # a session-81 code review: ArgMax over 2**24 + 3 elements gave index 16777216 for 16777217 (float32)
    g = helper.make_graph([helper.make_node("ArgMax", ["x"], ["y"], axis=0)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2**24 + 3,))],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    with pytest.raises(UnsupportedModelError, match="not be exact in float32"):
        fj.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))
