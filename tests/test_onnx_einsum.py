"""ONNX Einsum, lowered at import to Transpose / Reshape / Gather / ReduceSum / MatMul
(``felixjax.onnx_einsum``): against onnxruntime, against ``np.einsum`` on random equations, in the C build,
and its errors."""
from __future__ import annotations

import string

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import felixjax as fj
from felixjax.errors import ModelFormatError, UnsupportedModelError
from felixjax.onnx_einsum import EquationError, parse_equation

RNG = np.random.default_rng(0)


def _model(equation, shapes, const=(), opset=17):
    """One Einsum node; operands listed in ``const`` are initializers (weights)."""
    ins, inits, names = [], [], []
    for i, s in enumerate(shapes):
        names.append(f"x{i}")
        if i in const:
            inits.append(numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32), f"x{i}"))
        else:
            ins.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s))
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _feeds(shapes, const=()):
    return {f"x{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes) if i not in const}


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _close(got, ref):
    assert got.shape == ref.shape
    assert float(np.abs(got - ref).max()) <= 1e-5 * max(1.0, float(np.abs(ref).max()))


CASES = [  # (equation, operand shapes, constant operands)
    ("ij->ji", [(3, 4)], ()), ("ij->i", [(3, 4)], ()), ("...ii ->...i", [(3, 5, 5)], ()),
    ("i,i", [(5,), (5,)], ()), ("bij, bjk -> bik", [(5, 2, 3), (5, 3, 4)], ()), ("->", [()], ()),
    ("bsd,df->bsf", [(2, 7, 16), (16, 24)], (1,)), ("bhqd,bhkd->bhqk", [(1, 2, 6, 8), (1, 2, 5, 8)], ()),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 6)], ()), ("i,j->ij", [(3,), (4,)], ()),
    ("bij,bjk", [(5, 2, 3), (5, 3, 4)], ()), ("iij,j->i", [(3, 3, 4), (4,)], ()), ("ab,ab->", [(3, 4), (3, 4)], ()),
    ("bi,bi->b", [(4, 1), (4, 6)], ()), ("ijk->kji", [(2, 3, 4)], ()), ("iii->i", [(3, 3, 3)], ()),
    ("Ab,bC->AC", [(3, 4), (4, 5)], ()), ("bqhd,bkhd->bhqk", [(2, 5, 3, 4), (2, 6, 3, 4)], ()),
]


@pytest.mark.parametrize("equation,shapes,const", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_onnxruntime(equation, shapes, const):
    model, feeds = _model(equation, shapes, const), _feeds(shapes, const)
    _close(fj.load_onnx(model).run_numpy(feeds), _ort(model, feeds))


def test_einsum_projection_is_a_tunable_matmul_and_builds_in_c():
    """A jax2onnx-style block: an Einsum projection with constant weights (a matmul task), attention
    scores and context as activation x activation Einsums; numpy executor and C build against onnxruntime."""
    d, heads, seq = 16, 2, 6
    wq = numpy_helper.from_array(RNG.standard_normal((d, heads, d // heads)).astype(np.float32), "wq")
    nodes = [helper.make_node("Einsum", ["x", "wq"], ["q"], equation="bsd,dhe->bshe"),
             helper.make_node("Einsum", ["q", "q"], ["s"], equation="bqhe,bkhe->bhqk"),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("Einsum", ["p", "q"], ["y"], equation="bhqk,bkhe->bqhe")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, seq, d))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[wq])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": RNG.standard_normal((1, seq, d)).astype(np.float32)}
    m = fj.load_onnx(model)
    assert [(t.op, w) for t, w in m.tasks] == [("matmul", 1)]
    task = m.tasks[0][0]
    assert task.name == f"matmul_{seq}x{d}x{d}"
    ref = _ort(model, feeds)
    _close(m.run_numpy(feeds), ref)
    got = fj.build_model(m, threads=1).run(feeds)
    _close(got[0] if isinstance(got, list) else got, ref)


def test_einsum_diagonal_sum_and_three_operands_build_in_c():
    """Gather (a diagonal), ReduceSum and a 3-operand chain in the C build, against onnxruntime."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 5)).astype(np.float32), "w")
    v = numpy_helper.from_array(RNG.standard_normal((5, 2)).astype(np.float32), "v")
    nodes = [helper.make_node("Einsum", ["x"], ["d"], equation="bii->bi"),
             helper.make_node("Einsum", ["d", "w", "v"], ["e"], equation="bi,ij,jk->bk"),
             helper.make_node("Einsum", ["e"], ["y"], equation="bk->k")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 4, 4))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w, v])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": RNG.standard_normal((3, 4, 4)).astype(np.float32)}
    ref = _ort(model, feeds)
    m = fj.load_onnx(model)
    _close(m.run_numpy(feeds), ref)
    got = fj.build_model(m, threads=1).run(feeds)
    _close(got[0] if isinstance(got, list) else got, ref)


def test_constant_weights_listed_first_are_still_a_tunable_matmul():
    # a code review: "df,bsd->bsf" (weights first) ran as a cheap MatMul with constant *left* operand
    model = _model("df,bsd->bsf", [(16, 24), (2, 7, 16)], const=(0,))
    feeds = _feeds([(16, 24), (2, 7, 16)], const=(0,))
    m = fj.load_onnx(model)
    assert [t.name for t, _ in m.tasks] == ["matmul_14x24x16"]
    _close(m.run_numpy(feeds), _ort(model, feeds))


@st.composite
def _equations(draw):
    """A random 1-3 operand equation over labels of sizes 1-4 (repeats, broadcast 1s, sums, transposes)."""
    letters = string.ascii_letters[:draw(st.integers(1, 6))]
    size = {c: draw(st.integers(1, 4)) for c in letters}
    terms, shapes = [], []
    for _ in range(draw(st.integers(1, 3))):
        term = draw(st.lists(st.sampled_from(letters), min_size=0, max_size=4))
        terms.append("".join(term))
        shapes.append(tuple(1 if draw(st.integers(0, 5)) == 0 else size[c] for c in term))
    used = sorted({c for t in terms for c in t})
    out = draw(st.permutations(used)).__getitem__(slice(0, draw(st.integers(0, len(used)))))
    explicit = draw(st.booleans())
    equation = ",".join(terms) + ("->" + "".join(out) if explicit else "")
    # a repeated label keeps one size within its operand (a diagonal needs a square)
    shapes = [tuple(size[c] if t.count(c) > 1 else d for c, d in zip(t, s)) for t, s in zip(terms, shapes)]
    return equation, shapes


@settings(max_examples=60, deadline=None)
@given(_equations())
def test_random_equations_match_numpy_einsum(case):
    equation, shapes = case
    args = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    try:
        ref = np.einsum(equation, *[a.astype(np.float64) for a in args])
    except ValueError:
        return  # numpy refuses it too (e.g. an implicit output of a label only broadcast)
    model = _model(equation, shapes)
    try:
        m = fj.load_onnx(model)
    except ModelFormatError:
        return  # ONNX's own shape inference refuses (e.g. sizes 1 vs n it does not broadcast)
    except UnsupportedModelError as e:  # ... or infers the size-1 operand's size (refused, not run on a wrong shape)
        assert "ONNX's shape inference says" in str(e)
        return
    got = m.run_numpy({f"x{i}": a for i, a in enumerate(args)})
    _close(got, np.asarray(ref, np.float32).reshape(np.shape(ref)))


def test_parse_equation():
    assert parse_equation("ij,jk", [2, 2]) == ([["i", "j"], ["j", "k"]], ["i", "k"])
    assert parse_equation("...i,...i->...", [3, 2]) == ([["...0", "...1", "i"], ["...1", "i"]], ["...0", "...1"])
    assert parse_equation("ba", [2]) == ([["b", "a"]], ["a", "b"])


@pytest.mark.parametrize("equation,ranks,message", [
    ("ij,jk->ik", [2], "it has 2 operand terms for 1 inputs"),
    ("i1->i", [2], "'i1' is not letters"),
    ("ij->ik", [2], "output label 'k' names no input axis"),
    ("ij->ii", [2], "names a label twice"),
    ("...ij,jk->ik", [3, 2], "need a '...' in the output"),
    ("ijk->i", [2], "names 3 axes of a rank-2 operand"),
    ("i...j...->i", [4], "at most one '...'"),  # ONNX's shape inference loops forever on these three
    ("i..j->i", [2], "at most one '...'"),
    ("...i...->i", [2], "at most one '...'"),
])
def test_bad_equations_are_refused_clearly(equation, ranks, message):
    with pytest.raises(EquationError, match=message.replace("...", r"\.\.\.")):
        parse_equation(equation, ranks)
    shapes = [(2,) * r for r in ranks]
    with pytest.raises((UnsupportedModelError, ModelFormatError), match="Einsum"):
        fj.load_onnx(_model(equation, shapes))
